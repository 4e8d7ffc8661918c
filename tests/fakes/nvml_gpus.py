"""GPU descriptions for the fake pynvml (``fakes/nvml/pynvml.py``): tables and limits of real parts.

Clock tables as ``nvidia-smi -q -d SUPPORTED_CLOCKS`` lists them (graphics clocks in 15 MHz steps);
power-limit constraints and defaults as ``nvidia-smi -q -d POWER`` reports them for each part.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FAKE_NVML_DIR = Path(__file__).resolve().parent / "nvml"
#: nvmlDeviceArchitecture_t values (nvml.h)
PASCAL, VOLTA, TURING, AMPERE, HOPPER = 4, 5, 6, 7, 9
ARCH_UNKNOWN = 0xFFFFFFFF
#: PCI bus numbers given to the GPUs of a machine in list order where a GPU names none (NVML lists GPUs in
#: PCI order on the machines seen, though nvml.h does not promise it)
_FIRST_BUS, _BUS_STRIDE = 0x17, 0x20


def _gpu(name, uuid, graphics, memory, boost, limits, idle_w, busy_w, arch, fail=None):
    lo, hi, default = limits
    return {"name": name, "uuid": uuid, "arch": arch, "pci_bus_id": None,
            "graphics_mhz": graphics, "memory_mhz": memory, "boost_mhz": boost,
            "limit_min_mw": lo, "limit_max_mw": hi, "limit_default_mw": default, "limit_mw": default,
            "locked_gpu_mhz": 0, "locked_mem_mhz": 0, "idle_mw": idle_w * 1000, "busy_mw": busy_w * 1000,
            "energy_mj": 123_456_789, "energy_t": 0.0, "temperature_c": 38, "fail": fail or {}}


def a100(uuid="GPU-4e0a7f1c-2b9d-4c63-8f1e-a100a100a100"):
    return _gpu("NVIDIA A100-SXM4-40GB", uuid, list(range(210, 1411, 15)), [1215], 1410,
                (100_000, 400_000, 400_000), 55, 310, AMPERE)


def h100(uuid="GPU-9d1c2e3f-5a6b-4c7d-8e9f-h100h100h100"):
    return _gpu("NVIDIA H100 80GB HBM3", uuid, list(range(345, 1981, 15)), [2619], 1980,
                (200_000, 700_000, 700_000), 70, 560, HOPPER)


def rtx_a6000(uuid="GPU-1f2e3d4c-5b6a-4978-8695-a6000a6000a6"):
    """A workstation GPU with several memory clocks (mem_freq is a knob there)."""
    return _gpu("NVIDIA RTX A6000", uuid, list(range(210, 2101, 15)), [405, 810, 7001, 8001], 1800,
                (100_000, 300_000, 300_000), 22, 280, AMPERE)


def rtx_2080_ti(uuid="GPU-6a7b8c9d-0e1f-4a2b-8c3d-2080ti2080ti"):
    """Turing: locked GPU clocks, several memory clocks but no memory locking (NVML answers NotSupported)."""
    return _gpu("NVIDIA GeForce RTX 2080 Ti", uuid, list(range(300, 2101, 15)), [405, 810, 5800, 7000], 1545,
                (100_000, 280_000, 250_000), 18, 250, TURING,
                fail={"nvmlDeviceSetMemoryLockedClocks": 3, "nvmlDeviceResetMemoryLockedClocks": 3})


def p100(uuid="GPU-0b1c2d3e-4f50-4617-8293-p100p100p100"):
    """Pascal: no energy counter, no locked clocks (NVML answers NotSupported)."""
    return _gpu("Tesla P100-PCIE-16GB", uuid, list(range(544, 1329, 13)), [715], 1328, (125_000, 250_000, 250_000),
                30, 240, PASCAL, fail={"nvmlDeviceGetTotalEnergyConsumption": 3, "nvmlDeviceSetGpuLockedClocks": 3,
                               "nvmlDeviceResetGpuLockedClocks": 3})


def write_gpus(path: Path, gpus: list[dict], *, privileged: bool = True, fail: dict | None = None) -> dict[str, str]:
    """Write the fake driver's state; returns the environment a process needs to load the fake."""
    path = Path(path)
    gpus = [dict(g, pci_bus_id=g.get("pci_bus_id") or f"00000000:{_FIRST_BUS + _BUS_STRIDE * i:02X}:00.0")
            for i, g in enumerate(gpus)]
    path.write_text(json.dumps({"gpus": gpus, "privileged": privileged, "fail": fail or {}}))
    path.chmod(0o666)
    return {"FAKE_NVML_STATE": str(path),
            "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), os.environ.get("PYTHONPATH", "")])}


def read_gpus(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["gpus"]
