"""The NVML backend against a fake pynvml with real names, units, clock tables and error codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes.nvml_gpus import (
    ARCH_UNKNOWN,
    FAKE_NVML_DIR,
    a100,
    h100,
    p100,
    read_gpus,
    rtx_2080_ti,
    rtx_a6000,
    write_gpus,
)

from edgetune.power import DeviceError, KnobWriteError, open_device
from edgetune.power.base import Capability

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_NVML_DIR))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    path = tmp_path / "nvml.json"

    def make(gpus, **kw):
        env = write_gpus(path, gpus, **kw)
        monkeypatch.setenv("FAKE_NVML_STATE", env["FAKE_NVML_STATE"])
        return path

    yield make
    sys.modules.pop("pynvml", None)  # never leak the fake to other tests


def test_a100_tables_power_energy(fake_nvml):
    fake_nvml([a100()])
    from edgetune.power import nvml

    device = open_device("nvml")
    assert device.name == "nvml:0" and "A100-SXM4-40GB" in device.description
    gpu = device.knobs["gpu_freq"]
    assert gpu.unit == "Hz" and gpu.min == 210_000_000 and gpu.max == 1_410_000_000 and len(gpu.values) == 81
    assert "mem_freq" not in device.knobs  # one memory clock: nothing to choose
    limit = device.knobs["power_limit"]
    assert limit.unit == "W" and limit.min == 100.0 and limit.max == 400.0 and limit.read() == 400.0
    reading = device.sensor.read()
    assert reading.total_w == pytest.approx(310.0) and reading.rails == {"GPU0": reading.total_w}
    assert device.sensor.energy_j() > 123_456  # mJ counter -> J
    assert isinstance(device.sensor, nvml.NvmlPowerSensor)
    assert any("nvmlDeviceGetTotalEnergyConsumption" in n for n in device.notes)
    device.close()


def test_energy_counter_capability_where_the_gpu_keeps_one(fake_nvml, monkeypatch):
    fake_nvml([a100(), p100()])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # unlike GPUs: numbered as NVML lists them
    volta_and_newer, pascal = open_device("nvml:0"), open_device("nvml:1")
    assert volta_and_newer.capabilities == {Capability.ENERGY_COUNTER}
    assert volta_and_newer.sensor.energy_j() is not None
    assert pascal.capabilities == frozenset() and pascal.sensor.energy_j() is None
    assert not pascal.has(Capability.VIRTUAL_CLOCK) and pascal.idle_power_w is None
    volta_and_newer.close()
    pascal.close()


def test_lock_and_reset_clocks_and_limit(fake_nvml):
    path = fake_nvml([a100()])
    device = open_device("nvml:0")
    with device.restoring():
        device.apply({"gpu_freq": "1005MHz", "power_limit": 250})
        (gpu,) = read_gpus(path)
        assert gpu["locked_gpu_mhz"] == 1005 and gpu["limit_mw"] == 250_000
        assert device.knobs["gpu_freq"].read() == 1_005_000_000
        assert device.sensor.read().total_w < 250  # the fake draws less at a lower clock
    (gpu,) = read_gpus(path)
    assert gpu["locked_gpu_mhz"] == 0 and gpu["limit_mw"] == 400_000
    device.close()


def test_memory_clock_knob_where_there_are_several(fake_nvml):
    path = fake_nvml([rtx_a6000()])
    device = open_device("nvml")
    mem = device.knobs["mem_freq"]
    assert mem.values == (405_000_000, 810_000_000, 7_001_000_000, 8_001_000_000)
    with device.restoring():
        mem.set("7001MHz")
        assert read_gpus(path)[0]["locked_mem_mhz"] == 7001
    assert read_gpus(path)[0]["locked_mem_mhz"] == 0
    device.close()


def test_several_gpus_and_cuda_visible_devices(fake_nvml, monkeypatch):
    fake_nvml([a100(), h100(), rtx_a6000()])
    from edgetune.power import nvml

    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [p.spec for p in nvml.probe()] == ["nvml:0", "nvml:1", "nvml:2"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert [p.summary.split(" (")[0] for p in nvml.probe()] == ["NVIDIA RTX A6000", "NVIDIA A100-SXM4-40GB"]
    device = open_device("nvml:1")
    assert "A100" in device.description and device.sensor.rails == ("GPU1",)
    device.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9d1c")  # a UUID prefix, as CUDA accepts
    device = open_device("nvml:0")
    assert "H100" in device.description
    device.close()
    with pytest.raises(DeviceError, match=r"only 1 GPU\(s\) visible"):
        open_device("nvml:1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError, match="no NVIDIA GPU visible"):
        open_device("nvml")
    device = open_device("nvml:GPU-4e0a7f1c-2b9d-4c63-8f1e-a100a100a100")  # by UUID, whatever is visible
    assert "A100" in device.description
    device.close()


def test_not_supported_is_one_line_and_nothing_left_changed(fake_nvml):
    path = fake_nvml([dict(p100(), arch=ARCH_UNKNOWN)])  # a driver that cannot name the architecture
    device = open_device("nvml")
    assert device.sensor.energy_j() is None
    assert any("no hardware energy counter" in n for n in device.notes)
    with pytest.raises(KnobWriteError) as err:
        device.knobs["gpu_freq"].set(device.knobs["gpu_freq"].max)
    assert str(err.value).startswith("gpu_freq: not supported on this GPU") and "\n" not in str(err.value)
    assert "back at its original" in str(err.value)
    assert read_gpus(path)[0]["locked_gpu_mhz"] == 0
    assert not list((path.parent / "state").glob("*.json"))
    device.close()


def test_no_permission_names_the_fix(fake_nvml):
    path = fake_nvml([a100()], privileged=False)
    device = open_device("nvml")
    with pytest.raises(KnobWriteError, match=r"power_limit: not permitted: run edgetune as root"):
        device.knobs["power_limit"].set(300)
    assert read_gpus(path)[0]["limit_mw"] == 400_000
    device.close()


def test_unknown_error_on_power_read_raises_for_the_monitor(fake_nvml):
    path = fake_nvml([a100()])
    device = open_device("nvml")
    write_gpus(path, [dict(a100(), fail={"field:186": 999})])  # the instantaneous field's own return code
    with pytest.raises(DeviceError, match=r"unknown error \(code 999\)"):
        device.sensor.read()
    write_gpus(path, [dict(a100(), fail={"nvmlDeviceGetFieldValues": 999, "nvmlDeviceGetPowerUsage": 999})])
    with pytest.raises(DeviceError, match=r"unknown error \(code 999\)"):
        device.sensor.read()
    device.close()


def test_power_is_the_instantaneous_reading_where_the_driver_gives_one(fake_nvml):
    """nvmlDeviceGetPowerUsage averages over 1 s on Ampere (except GA100) and newer; the instantaneous field
    is read where the GPU and driver give it, the average only where they do not, and the notes say which."""
    path = fake_nvml([a100()])
    device = open_device("nvml")
    assert device.sensor.instant and any("instantaneous reading" in n for n in device.notes)
    write_gpus(path, [dict(a100(), fail={"nvmlDeviceGetPowerUsage": 999})])  # never asked
    assert device.sensor.read().total_w == pytest.approx(310.0)
    device.close()
    write_gpus(path, [dict(a100(), fail={"field:186": 3})])  # a driver without the field: NotSupported
    device = open_device("nvml")
    assert not device.sensor.instant
    assert any("nvmlDeviceGetPowerUsage" in n and "average over 1 s" in n for n in device.notes)
    assert device.sensor.read().total_w == pytest.approx(310.0)
    device.close()


def test_no_driver(fake_nvml, monkeypatch):
    fake_nvml([a100()])
    monkeypatch.delenv("FAKE_NVML_STATE")
    from edgetune.power import nvml

    (found,) = nvml.probe()
    assert not found.found and "no NVIDIA driver" in found.summary
    with pytest.raises(DeviceError, match="no NVIDIA driver"):
        open_device("nvml")


def test_kill_9_then_restore_resets_the_gpu(fake_nvml, tmp_path):
    path = fake_nvml([a100(), h100()])
    env = dict(os.environ, EDGETUNE_STATE_DIR=str(tmp_path / "state"), CUDA_VISIBLE_DEVICES="1",
               CUDA_DEVICE_ORDER="PCI_BUS_ID",
               **write_gpus(path, [a100(), h100()]))
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)])
    code = ("import time; from edgetune.power import open_device; d = open_device('nvml:0'); "
            "d.apply({'gpu_freq': '900MHz', 'power_limit': 450}); print('changed', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "changed"
    proc.kill()
    proc.wait(timeout=10)
    assert read_gpus(path)[1]["locked_gpu_mhz"] == 900 and read_gpus(path)[1]["limit_mw"] == 450_000
    env["CUDA_VISIBLE_DEVICES"] = "0"  # recovery finds the GPU by UUID, not by what is visible now
    done = subprocess.run([sys.executable, "-m", "edgetune", "restore"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "restored" in done.stdout and "H100" in done.stdout
    h = read_gpus(path)[1]
    assert h["locked_gpu_mhz"] == 0 and h["limit_mw"] == 700_000


def test_the_gpu_temperature_in_whole_degrees_and_none_where_it_fails(fake_nvml, monkeypatch):
    unsupported_gpu = h100()
    unsupported_gpu["fail"] = {"nvmlDeviceGetTemperature": 3}  # NVML_ERROR_NOT_SUPPORTED
    fake_nvml([a100(), unsupported_gpu])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    readable, unsupported = open_device("nvml:0"), open_device("nvml:1")
    assert readable.temperature_c == 38.0
    assert unsupported.temperature_c is None
    readable.close()
    unsupported.close()


def test_cuda_numbers_unlike_gpus_its_own_way_so_an_index_is_refused_not_guessed(fake_nvml, monkeypatch):
    # a workstation: a compute GPU and a display GPU. CUDA numbers them fastest first by default, NVML by PCI
    # bus, so which one `cuda:0` is cannot be known from NVML: an index is refused in one line
    fake_nvml([rtx_a6000(), h100()])
    from edgetune.power import nvml

    with pytest.raises(DeviceError) as err:
        open_device("nvml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("nvml:0: which GPU CUDA numbers 0 is unknown here")
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in message and "CUDA_VISIBLE_DEVICES" in message
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # an index means CUDA's number: still unknown
    with pytest.raises(DeviceError, match="unknown here"):
        open_device("nvml:0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # `edgetune devices` lists them by UUID; opened so, the GPU is measured but its CUDA number is unknown
    assert [p.spec for p in nvml.probe()] == [f"nvml:{rtx_a6000()['uuid']}", f"nvml:{h100()['uuid']}"]
    device = open_device(f"nvml:{h100()['uuid']}")
    assert device.compute.torch_device is None and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in device.compute.why_unknown
    assert device.compute.why_unknown in device.notes
    device.close()
    # either fix gives CUDA's number, and the device trains on cuda:<that number>
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", h100()["uuid"][:12])  # a UUID prefix, as CUDA accepts
    device = open_device("nvml")
    assert "H100" in device.description and device.compute.torch_device == "cuda:0" and device.name == "nvml:0"
    device.close()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    device = open_device("nvml:1")
    assert "H100" in device.description and device.compute.torch_device == "cuda:1"
    assert not device.compute.measures_cpu  # NVML reads the GPU alone
    device.close()


def test_like_gpus_are_numbered_in_pci_order(fake_nvml, monkeypatch):
    # two of one model: fastest first ties, and CUDA keeps PCI order, whatever order NVML lists them in
    first, second = a100(uuid="GPU-aaaaaaaa-0000-4000-8000-000000000001"), a100(uuid="GPU-bbbbbbbb-0000-4000-8000-000000000002")
    fake_nvml([dict(first, pci_bus_id="00000000:B1:00.0"), dict(second, pci_bus_id="00000000:1A:00.0")])
    device = open_device("nvml:0")
    assert second["uuid"] in device.description and device.compute.torch_device == "cuda:0"
    device.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    device = open_device("nvml")
    assert first["uuid"] in device.description and device.compute.torch_device == "cuda:0"
    assert device.sensor.rails == ("GPU0",)
    device.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    device = open_device(f"nvml:{first['uuid']}")  # hidden from CUDA: measurable, not trainable
    assert device.compute.torch_device is None and "hidden from CUDA" in device.compute.why_unknown
    device.close()


def test_clocks_nvml_cannot_lock_on_this_architecture_are_read_only_and_say_why(fake_nvml, monkeypatch):
    # NVML locks GPU clocks on Volta and newer, memory clocks on Ampere and newer: a Turing card lists four
    # memory clocks it cannot lock, a Pascal card graphics clocks. Offered as knobs, the search's first trial
    # would end on NotSupported; read-only, the search leaves them and tunes the rest.
    from edgetune.search.space import build_space

    path = fake_nvml([rtx_2080_ti(), p100()])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # unlike GPUs: numbered as NVML lists them
    turing, pascal = open_device("nvml:0"), open_device("nvml:1")
    mem = turing.knobs["mem_freq"]
    assert turing.knobs["gpu_freq"].writable and not mem.writable and len(mem.values) == 4
    assert mem.why_read_only == "NVML locks memory clocks on Ampere and newer GPUs; this one is Turing"
    assert not pascal.knobs["gpu_freq"].writable and pascal.knobs["power_limit"].writable
    assert pascal.knobs["gpu_freq"].why_read_only == "NVML locks GPU clocks on Volta and newer GPUs; this one is Pascal"
    assert [name for name, _ in build_space(turing, 32, [16, 32]).knobs] == ["gpu_freq", "power_limit"]
    assert [name for name, _ in build_space(pascal, 32, [16, 32]).knobs] == ["power_limit"]
    with pytest.raises(KnobWriteError, match="mem_freq is read-only here: NVML locks memory clocks on Ampere"):
        mem.set(mem.max)
    assert read_gpus(path)[0]["locked_mem_mhz"] == 0
    turing.close()
    pascal.close()


def test_a_failing_pci_read_is_one_line(fake_nvml):
    fake_nvml([a100()], fail={"nvmlDeviceGetPciInfo": 999})
    with pytest.raises(DeviceError) as err:
        open_device("nvml")
    assert str(err.value) == ("GPU names and PCI bus ids: NVML reported an unknown error (code 999); check "
                              "`nvidia-smi` and the kernel log (dmesg)")


def test_a_mig_instance_is_refused_in_one_line(fake_nvml, monkeypatch):
    # a MIG slice trains on part of a GPU whose power NVML reads, and whose clocks it sets, for the whole GPU
    fake_nvml([a100()])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4e0a7f1c-2b9d-4c63-8f1e-a100a100a1f0")
    with pytest.raises(DeviceError) as err:
        open_device("nvml")
    assert "\n" not in str(err.value) and "names a MIG instance (MIG-4e0a7f1c" in str(err.value)
    assert str(err.value).endswith("give edgetune a whole GPU (its index or GPU- UUID)")


def test_auto_and_nvml_open_the_gpu_the_model_trains_on(fake_nvml, monkeypatch):
    """``device="nvml"``, and ``auto`` where it picks an NVIDIA GPU, follow the model: a process training on
    cuda:1 (one of several GPUs, a DDP rank) measures and tunes nvml:1, not the first GPU. A GPU the user
    numbered, a UUID (CUDA's numbering unknown) and other platforms are opened as given."""
    import torch

    from edgetune.runtime.board import device_spec, model_gpu_spec

    fake_nvml([a100(), h100(), rtx_a6000()])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    cuda1 = torch.device("cuda", 1)
    assert device_spec("auto", cuda1) == ("nvml:1", True)
    assert device_spec("nvml", cuda1) == ("nvml:1", True)
    assert device_spec("auto", torch.device("cpu")) == ("nvml:0", False)  # as auto picks it
    assert device_spec("nvml", None) == ("nvml", False)
    assert device_spec("nvml:2", cuda1) == ("nvml:2", False)  # the user's number
    assert device_spec("sim:orin-nano", cuda1) == ("sim:orin-nano", False)
    device = open_device(device_spec("auto", cuda1)[0])
    assert "H100" in device.description and device.compute.torch_device == "cuda:1"
    device.close()
    assert model_gpu_spec(f"nvml:{h100()['uuid']}", cuda1) is None
    assert model_gpu_spec("jetson", torch.device("cuda", 0)) is None
    monkeypatch.delenv("CUDA_DEVICE_ORDER")  # unlike GPUs, CUDA's own order: auto names them by UUID
    fake_nvml([rtx_a6000(), h100()])
    assert device_spec("auto", cuda1) == (f"nvml:{rtx_a6000()['uuid']}", False)
