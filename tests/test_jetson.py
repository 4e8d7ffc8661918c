"""The Jetson backend against fake sysfs trees of five boards (JetPack 4, 5 and 6 layouts)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest
from fakes.jetson_tree import BOARDS, CPU_KHZ, GPU_HZ, break_file, build_jetson

from edgetune.power import PowerMonitor, VirtualClock, jetson, open_device, probe_platforms, sysfs
from edgetune.power.base import Capability, DeviceError, KnobValueError, KnobWriteError, RestoreError


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))


def _open(fake, **kw):
    return jetson.open(root=fake.root, detect_period_s=kw.pop("detect_period_s", 0.0), **kw)


EXPECTED = {  # board -> (module, jetpack, total label, rails)
    "agx-orin-jp5": ("AGX Orin 64GB", "JetPack 5",
                     "derived: VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + VDDQ_VDD2_1V8AO",
                     ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")),
    "agx-orin-jp6": ("AGX Orin 64GB", "JetPack 6",
                     "derived: VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + VDDQ_VDD2_1V8AO",
                     ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO")),
    "orin-nano": ("Orin Nano 8GB", "JetPack 6", "VDD_IN", ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")),
    "xavier-nx": ("Xavier NX 16GB", "JetPack 5", "VDD_IN", ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")),
    "nano": ("Nano 4GB", "JetPack 4", "POM_5V_IN", ("POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU")),
}


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_detects_board_rails_and_total(tmp_path, board):
    fake = build_jetson(tmp_path / "root", board)
    device = _open(fake)
    module, jetpack, total, rails = EXPECTED[board]
    info = device.backend.board
    assert info.module == module and info.jetpack == jetpack
    assert BOARDS[board].model in device.description
    assert device.sensor.rails == rails  # NC channels and the sum channel are skipped
    assert device.sensor.total_label == total
    reading = device.sensor.read()
    for rail, files in fake.rail_files.items():
        raw = [int(f.read_text()) for f in files]
        watts = raw[0] / 1e3 if len(raw) == 1 else raw[0] * raw[1] / 1e6  # mW, or mV * mA
        assert reading.rails[rail] == pytest.approx(watts)
    if total.startswith("derived"):
        assert reading.total_w == pytest.approx(sum(reading.rails.values()))
        assert any("sum of the monitored rails" in n for n in device.notes)
    else:
        assert reading.total_w == reading.rails[total]
    assert device.sensor.energy_j() is None
    # real clock, real steps, no energy counter on the INA3221; its rails measure every process on the board
    assert device.capabilities == {Capability.WHOLE_MACHINE}
    assert not device.has(Capability.ENERGY_COUNTER) and device.idle_power_w is None
    device.close()


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_knob_tables_and_units(tmp_path, board):
    fake = build_jetson(tmp_path / "root", board)
    device = _open(fake)
    assert device.knobs["gpu_freq"].values == tuple(GPU_HZ[board])
    assert device.knobs["gpu_freq"].unit == "Hz"
    assert device.knobs["cpu_freq"].values == tuple(sorted(set(CPU_KHZ[board])))
    assert device.knobs["cpu_freq"].unit == "kHz"
    assert device.knobs["cpu_cores"].values == tuple(range(1, BOARDS[board].cpus + 1))
    assert ("emc_freq" in device.knobs) == (board != "nano")  # BPMP debugfs on Orin and Xavier only
    assert device.knobs["power_mode"].read() in device.knobs["power_mode"].values
    assert device.backend.gpu_devfreq.name == BOARDS[board].gpu_node  # found by of_node, not the VIC node
    assert not device.measure_only
    device.close()


def test_power_mode_caps_are_read_from_nvpmodel_conf(tmp_path):
    """Each mode's POWER_MODEL block gives the largest value each knob runs at (on the knob's own table),
    the gated TPCs; the PARAM section's MAX_FREQ paths are not taken for caps."""
    from edgetune.power.jetson.nvpmodel import mode_caps

    fake = build_jetson(tmp_path / "root", "orin-nano")
    device = _open(fake)
    knobs = device.knobs
    assert set(knobs["power_mode"].caps) == {"15W"}  # the knob's own modes: 7W needs a reboot (below)
    caps = mode_caps((fake.root / "etc/nvpmodel.conf").read_text(), knobs)
    assert set(caps) == {"15W", "7W"}
    seven, fifteen = caps["7W"], caps["15W"]
    assert seven.cap("cpu_cores") == 4 and fifteen.cap("cpu_cores") == 6
    assert seven.cap("gpu_freq") == max(v for v in knobs["gpu_freq"].values if v <= 408_000_000)
    assert fifteen.cap("gpu_freq") == knobs["gpu_freq"].max  # MAX_FREQ -1: not capped below the table's top
    assert seven.cap("cpu_freq") == max(v for v in knobs["cpu_freq"].values if v <= 960_000)
    assert seven.cap("emc_freq") == max(v for v in knobs["emc_freq"].values if v <= 2_133_000_000)
    assert dict(seven.fixed)["TPC_PG_MASK"] == "252" and dict(fifteen.fixed)["TPC_PG_MASK"] == "240"
    assert not seven.within(fifteen, list(knobs))  # other TPCs gated: never the same settings
    device.close()


def test_mode_caps_parse_real_blocks_only():
    from edgetune.power.base import Knob
    from edgetune.power.jetson.nvpmodel import mode_caps

    gpu = Knob("gpu_freq", "Hz", [306_000_000, 612_000_000, 918_000_000], read=lambda: 918_000_000)
    conf = ("< PARAM TYPE=CLOCK NAME=GPU >\nMAX_FREQ /sys/devices/gpu.0/devfreq/max_freq\n\n"
            "< POWER_MODEL ID=0 NAME=LOW >\nGPU MAX_FREQ 700000000\nGPU MIN_FREQ 0\nTPC_POWER_GATING TPC_PG_MASK 0\n"
            "< POWER_MODEL ID=1 NAME=HIGH >\nGPU MAX_FREQ -1\nTPC_POWER_GATING TPC_PG_MASK 0\n"
            "< POWER_MODEL ID=2 NAME=PINNED >\nGPU MIN_FREQ 612000000\nGPU MAX_FREQ 612000000\n"
            "TPC_POWER_GATING TPC_PG_MASK 0\n< PM_CONFIG DEFAULT=1 >\n")
    caps = mode_caps(conf, {"gpu_freq": gpu})
    assert caps["LOW"].cap("gpu_freq") == 612_000_000 and caps["HIGH"].cap("gpu_freq") == 918_000_000
    assert caps["LOW"].within(caps["HIGH"], ["gpu_freq"]) and not caps["HIGH"].within(caps["LOW"], ["gpu_freq"])
    assert not caps["LOW"].within(caps["HIGH"], [])  # gpu_freq untuned: it runs at each mode's own cap
    assert not caps["PINNED"].within(caps["HIGH"], ["gpu_freq"])  # a raised MIN_FREQ is a state of its own
    assert "cpu_freq" not in dict(caps["HIGH"].max_values)  # a knob the board lacks is not capped
    cores = Knob("cpu_cores", "cores", [1, 2, 3, 4], read=lambda: 4)
    silent = conf + "< POWER_MODEL ID=3 NAME=SILENT >\nCPU_ONLINE CORE_0 1\n"
    caps = mode_caps(silent, {"gpu_freq": gpu, "cpu_cores": cores})
    assert "SILENT" not in caps and "HIGH" not in caps  # no GPU limit, or no online cores, stated: unknown


def test_a_board_whose_nvpmodel_conf_states_no_limits_has_no_mode_caps(tmp_path):
    device = _open(build_jetson(tmp_path / "root", "nano"))  # the fake Nano's blocks list online cores only
    assert device.knobs["power_mode"].caps == {}
    device.close()


def test_combined_rail_is_labelled(tmp_path):
    device = _open(build_jetson(tmp_path / "root", "orin-nano"))
    assert any("VDD_CPU_GPU_CV" in n and "not the GPU alone" in n for n in device.notes)
    device.close()


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_every_knob_set_then_restored_exactly(tmp_path, board):
    fake = build_jetson(tmp_path / "root", board)
    before = fake.knob_state()
    device = _open(fake)
    setting = {"gpu_freq": device.knobs["gpu_freq"].values[1], "cpu_freq": device.knobs["cpu_freq"].values[3],
               "cpu_cores": 2, "power_mode": device.knobs["power_mode"].values[-1]}
    if "emc_freq" in device.knobs:
        setting["emc_freq"] = device.knobs["emc_freq"].min
    with device.restoring():
        device.apply(setting)
        fake.settle()
        after = fake.knob_state()
        gpu = fake.gpu
        assert int((gpu / "min_freq").read_text()) == int((gpu / "max_freq").read_text()) == setting["gpu_freq"]
        assert device.knobs["gpu_freq"].read() == setting["gpu_freq"]
        assert device.knobs["cpu_freq"].read() == setting["cpu_freq"]
        assert device.knobs["cpu_cores"].read() == 2
        assert device.knobs["power_mode"].read() == setting["power_mode"]
        assert after != before
    assert fake.knob_state() == before
    assert not list((tmp_path / "state").glob("*.json"))  # nothing left to recover
    device.close()


def test_lock_writes_never_cross_min_over_max(tmp_path, monkeypatch):
    """The kernel rejects min > max: play that rule on every write, in both directions."""
    fake = build_jetson(tmp_path / "root", "agx-orin-jp6")
    real_write = sysfs.write_checked

    def kernel_write(path, value, what):
        if path.name in ("min_freq", "max_freq"):
            other = path.with_name("max_freq" if path.name == "min_freq" else "min_freq")
            lo, hi = (int(value), int(other.read_text())) if path.name == "min_freq" else (
                int(other.read_text()), int(value))
            if lo > hi:
                raise KnobWriteError(f"{what}: the kernel rejected {value} for {path} (EINVAL)")
        real_write(path, value, what)

    monkeypatch.setattr(sysfs, "write_checked", kernel_write)
    device = _open(fake)
    gpu = device.knobs["gpu_freq"]
    with device.restoring():
        gpu.set(gpu.max)  # raising from the table's bottom: max first
        gpu.set(gpu.min)  # lowering: min first
        gpu.set(918_000_000)
        assert int((fake.gpu / "min_freq").read_text()) == 918_000_000
    device.close()


def _offline_clusters_answer_ebusy(fake, monkeypatch):
    """The kernel's rule for a cpufreq policy whose CPUs are all offline: every read and write of its
    attributes fails with EBUSY (drivers/cpufreq/cpufreq.c, show() and store()). Played on the fake tree."""
    import errno

    firsts = list(BOARDS[fake.board].clusters) + [BOARDS[fake.board].cpus]
    cpus = {f"policy{a}": range(a, b) for a, b in itertools.pairwise(firsts)}

    def offline(path) -> bool:
        policy = next((part for part in Path(path).parts if part in cpus), None)
        online = [fake.root / f"sys/devices/system/cpu/cpu{c}/online" for c in cpus.get(policy, ())]
        return bool(online) and all(f.exists() and f.read_text().strip() == "0" for f in online)

    real_read, real_write = sysfs.read_text, sysfs.write_checked

    def kernel_read(path):
        if offline(path):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        return real_read(path)

    def kernel_write(path, value, what):
        if offline(path):
            raise KnobWriteError(f"{what}: the kernel rejected {value} for {path} (EBUSY: Device or resource busy)")
        real_write(path, value, what)

    monkeypatch.setattr(sysfs, "read_text", kernel_read)
    monkeypatch.setattr(sysfs, "write_checked", kernel_write)


def test_cpu_freq_skips_a_cluster_whose_cores_are_offline_and_locks_it_when_they_return(tmp_path, monkeypatch):
    """Four cores or fewer on an Orin Nano take CPUs 4-5 and their cpufreq policy down; the kernel then
    refuses that policy's files (EBUSY). cpu_freq locks the clusters that run, locks the other once a
    setting brings its cores back, and restore puts every cluster and core back as found."""
    fake = build_jetson(tmp_path / "root", "orin-nano")
    _offline_clusters_answer_ebusy(fake, monkeypatch)
    policy0, policy4 = fake.policies
    before = fake.knob_state()
    device = _open(fake)
    with device.restoring():
        device.apply({"cpu_cores": 4, "cpu_freq": 729_600})
        assert (policy0 / "scaling_max_freq").read_text() == "729600\n"
        assert (policy4 / "scaling_max_freq").read_text() == f"{CPU_KHZ['orin-nano'][-1]}\n"  # down: untouched
        device.apply({"cpu_cores": 6, "cpu_freq": 1_036_800})
        assert all((p / f).read_text() == "1036800\n" for p in fake.policies
                   for f in ("scaling_min_freq", "scaling_max_freq"))
        device.apply({"cpu_cores": 2, "cpu_freq": 115_200})
    assert fake.knob_state() == before
    device.close()

    # a board found with its second cluster down (its policy unreadable when the device opens)
    for c in (4, 5):
        (fake.root / f"sys/devices/system/cpu/cpu{c}/online").write_text("0\n")
    before = fake.knob_state()
    device = _open(fake)
    assert device.knobs["cpu_freq"].values == tuple(sorted(set(CPU_KHZ["orin-nano"])))
    with device.restoring():
        device.apply({"cpu_cores": 6, "cpu_freq": 729_600})
        assert (policy4 / "scaling_min_freq").read_text() == "729600\n"  # its cores back: locked too
    after = fake.knob_state()
    assert {k: v for k, v in after.items() if "policy4" not in k} == {k: v for k, v in before.items()
                                                                       if "policy4" not in k}
    device.close()


def test_read_only_tree_is_measure_only_with_reason(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano", nvpmodel=False)
    fake.make_read_only()
    device = _open(fake)
    assert device.measure_only
    gpu = device.knobs["gpu_freq"]
    assert not gpu.writable and "read-only" in gpu.why_read_only
    assert any(n.startswith("measure-only:") and "batch size alone" in n for n in device.notes)
    with pytest.raises(KnobWriteError, match="read-only"):
        gpu.set(gpu.max)
    device.close()


def test_rejected_mode_change_is_one_line_and_original_kept(tmp_path):
    fake = build_jetson(tmp_path / "root", "xavier-nx")  # one GPU power-gating mask: every mode switches live
    (fake.root / "etc/nvpmodel.refuse").write_text("0\n")
    before = fake.knob_state()
    device = _open(fake)
    with pytest.raises(KnobWriteError) as err:
        device.knobs["power_mode"].set("MODE_15W_2CORE")
    message = str(err.value)
    assert "\n" not in message and "failed to set power mode 0" in message and "back at its original" in message
    assert fake.knob_state() == before
    assert not list((tmp_path / "state").glob("*.json"))
    device.close()


def test_modes_needing_a_reboot_are_held_back_with_the_way_to_reach_them(tmp_path):
    """A mode with another GPU TPC power-gating mask than the board booted with does not switch live (nvpmodel
    asks to reboot): the knob offers the others, names the held-back ones in the notes, and refuses one in
    a line that says how to get there; a plan asking for it changes nothing."""
    fake = build_jetson(tmp_path / "root", "orin-nano")  # booted in 15W (mask 240); 7W gates 252
    before = fake.knob_state()
    device = _open(fake)
    mode = device.knobs["power_mode"]
    assert mode.values == ("15W",) and set(mode.unavailable) == {"7W"}
    assert any(n.startswith("power_mode 7W not offered: switching to it needs a reboot") for n in device.notes)
    with pytest.raises(KnobValueError) as err:
        device.apply({"gpu_freq": 408_000_000, "power_mode": "7W"})
    message = str(err.value)
    assert "\n" not in message and "7W needs a reboot" in message and "TPC_PG_MASK 252" in message
    assert "`sudo nvpmodel -m 1`" in message
    assert fake.knob_state() == before
    device.close()

    fake = build_jetson(tmp_path / "agx", "agx-orin-jp6", boot_mode=0)  # MAXN (mask 0): MODE_50W shares it
    before = fake.knob_state()
    device = _open(fake)
    assert device.knobs["power_mode"].values == ("MAXN", "MODE_50W")
    assert set(device.knobs["power_mode"].unavailable) == {"MODE_15W", "MODE_30W"}
    with device.restoring():
        device.apply({"power_mode": "MODE_50W"})
        assert device.knobs["power_mode"].read() == "MODE_50W"
    assert fake.knob_state() == before
    device.close()


def test_a_mode_switch_nvpmodel_refuses_for_a_reboot_is_one_line(tmp_path):
    """Where nvpmodel asks for a reboot all the same (here the GPU's mask reads 0, which no mode of the conf
    gates: the board cannot even re-enter its own mode live), the write says so in one line, whatever
    nvpmodel's exit status, and nothing changes; stdin is closed, so it never waits for the answer."""
    fake = build_jetson(tmp_path / "root", "orin-nano")
    (fake.root / "sys/devices/platform/bus@0/17000000.gpu/tpc_pg_mask").chmod(0o644)
    (fake.root / "sys/devices/platform/bus@0/17000000.gpu/tpc_pg_mask").write_text("0\n")
    before = fake.knob_state()
    device = _open(fake)
    assert device.knobs["power_mode"].values == ("15W",)  # the mode in force stays, to read and restore
    with pytest.raises(KnobWriteError) as err:
        device.knobs["power_mode"].set("15W")
    message = str(err.value)
    assert "\n" not in message and "power_mode: 15W needs a reboot" in message and "unchanged" in message
    assert fake.knob_state() == before
    device.close()


def test_write_refused_by_kernel_names_knob_file_and_errno(tmp_path):
    from fakes.jetson_tree import reject_writes

    target = tmp_path / "max_freq"
    target.write_text("1\n")
    reject_writes(target)
    with pytest.raises(KnobWriteError, match=r"gpu_freq: the kernel rejected 5 for .*max_freq \(ENOSPC"):
        sysfs.write_checked(target, 5, "gpu_freq")


def test_state_is_written_before_the_first_write(tmp_path, monkeypatch):
    """If the original cannot be recorded, nothing is changed."""
    fake = build_jetson(tmp_path / "root", "orin-nano")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(blocker / "state"))
    before = fake.knob_state()
    device = _open(fake)
    with pytest.raises(OSError):
        device.knobs["gpu_freq"].set(408_000_000)
    assert fake.knob_state() == before


# ------------------------------------------------------------------------------------------ faults


def test_vanished_and_garbage_rails_raise_and_monitor_counts_them(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    clock = VirtualClock()
    device = _open(fake)
    sensor = jetson.JetsonPowerSensor(jetson.find_rails(fake.root), fake.root, clock=clock, detect_s=0)
    monitor = PowerMonitor(sensor, clock, rate_hz=100)
    monitor.start()
    clock.advance(0.5)
    good = monitor.total_samples
    for text in ("", "-5\n", "12a7\n"):
        fake.set_rail_text("VDD_IN", text)
        with pytest.raises(ValueError, match="VDD_IN|in1_input|curr1_input"):
            sensor.read()
        clock.advance(0.1)
    fake.set_rail("VDD_IN", 5080, 1500)
    fake.remove_rail("VDD_SOC")
    with pytest.raises(OSError):
        sensor.read()
    clock.advance(0.1)
    dropped = monitor.dropped
    assert dropped >= 35  # ~10 samples per bad 0.1 s, all dropped, none stored
    build_jetson(tmp_path / "fresh", "orin-nano")  # restore the vanished rail's files from a fresh tree
    for f in fake.rail_files["VDD_SOC"]:
        f.write_text((tmp_path / "fresh" / f.relative_to(fake.root)).read_text())
    clock.advance(0.5)
    monitor.stop()
    assert monitor.dropped == dropped and monitor.total_samples > good  # the run went on
    assert monitor.latest().total_w == pytest.approx(5.080 * 1.5)
    device.close()


def test_stale_sensor_is_detected(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    clock = VirtualClock()
    sensor = jetson.JetsonPowerSensor(jetson.find_rails(fake.root), fake.root, clock=clock, detect_s=0)
    with PowerMonitor(sensor, clock, rate_hz=100) as monitor:
        clock.advance(1.0)
        fake.set_rail("VDD_IN", 5080, 950)
        clock.advance(1.0)
        assert not monitor.stale
        clock.advance(3.0)  # no new value for 3 s, far beyond the 8 ms update period
        assert monitor.stale
        fake.set_rail("VDD_IN", 5080, 990)
        clock.advance(0.1)
        assert not monitor.stale


def test_update_period_measured_from_changing_values(tmp_path):
    """The monitor chip converts every 20 ms of the sensor's clock (a virtual one: exact instants); the
    detector polls the real rail files on that clock and finds the period."""
    fake = build_jetson(tmp_path / "root", "nano")  # iio: no update_interval attribute
    clock = VirtualClock()
    current = {"ma": 400}

    def convert():  # a new conversion: a new value in the rail file
        current["ma"] = 400 + (current["ma"] - 399) % 50
        fake.set_rail("POM_5V_IN", 5072, current["ma"])

    clock.add_ticker(0.020, convert)
    sensor = jetson.JetsonPowerSensor(jetson.find_rails(fake.root), fake.root, clock=clock, detect_s=0.4)
    assert sensor.update_period_s == pytest.approx(0.020, abs=0.0002 + 1e-9)  # within one poll
    assert sensor.period_source == "measured"
    assert clock.now() < 0.4  # stopped after eight changes, not at the budget


def test_update_period_is_the_median_gap_between_changes():
    assert jetson.median_change_gap([0.0, 0.01, 0.02, 0.031, 0.04]) == pytest.approx(0.01)
    # a missed conversion (a doubled gap) and a late one barely move the median
    assert jetson.median_change_gap([0.0, 0.01, 0.03, 0.04, 0.05, 0.062]) == pytest.approx(0.01)
    assert jetson.median_change_gap([0.0, 0.01]) is None  # one gap is no measurement
    assert jetson.measure_update_period(lambda: 1, budget_s=0.0) is None


def test_update_period_measurement_survives_a_bad_read():
    clock = VirtualClock()

    def read_raw():
        if clock.now() > 0.05:
            raise OSError("rail file vanished")
        return round(clock.now(), 2)

    assert jetson.measure_update_period(read_raw, 1.0, clock=clock.now, sleep=clock.sleep) is None


def test_static_tree_falls_back_to_interval_then_default(tmp_path):
    orin = jetson.JetsonPowerSensor(jetson.find_rails(build_jetson(tmp_path / "a", "orin-nano").root),
                                    tmp_path / "a", detect_s=0.02)
    assert orin.update_period_s == pytest.approx(0.008) and orin.period_source == "hwmon update_interval"
    nano = jetson.JetsonPowerSensor(jetson.find_rails(build_jetson(tmp_path / "b", "nano").root),
                                    tmp_path / "b", detect_s=0.02)
    assert nano.update_period_s == jetson.DEFAULT_UPDATE_PERIOD_S and nano.period_source.startswith("default")


# ------------------------------------------------------------------------------------------ root & registry


def test_root_from_environment_and_registry(tmp_path, monkeypatch):
    fake = build_jetson(tmp_path / "root", "xavier-nx")
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    found = [p for p in jetson.probe() if p.found]
    assert found and found[0].spec == "jetson" and "Xavier NX" in found[0].summary
    device = open_device("jetson", detect_period_s=0)
    assert device.name == "jetson" and not device.simulated
    assert device.compute.torch_device == "cuda:0"  # the module's GPU: training runs there
    device.close()
    assert any(p.platform == "jetson" and p.found for p in probe_platforms())


def test_not_a_jetson_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DeviceError, match="no Jetson board under") as err:
        jetson.open(root=tmp_path / "empty")
    assert "\n" not in str(err.value)
    assert not jetson.probe(root=tmp_path / "empty")[0].found
    with pytest.raises(DeviceError, match="not a directory"):
        jetson.open(root=tmp_path / "missing")


def test_paths_are_discovered_not_built_from_input(tmp_path):
    fake = build_jetson(tmp_path / "root", "agx-orin-jp5")
    device = _open(fake)
    assert Path(device.backend.paths["gpu_freq"]).resolve() == fake.gpu.resolve()
    with pytest.raises(DeviceError):
        device.knobs["gpu_freq"].set("../../etc/passwd")
    device.close()


# ------------------------------------------------------------------------------------------ fake board


def test_fake_board_power_is_measured_through_sysfs(tmp_path):
    """The twin plays the board: knob files the backend writes set the load, rail files show it."""
    from fakes.board import FakeJetsonBoard

    from edgetune.power.base import WorkloadCost, is_out_of_memory
    from edgetune.power.sim import Twin

    fake = build_jetson(tmp_path / "root", "orin-nano")
    twin = Twin("orin-nano", seed=0, compute=False)
    cost = WorkloadCost(flops_per_sample=1.2e9, param_bytes=4.5e6, activation_bytes_per_sample=2.5e6,
                        input_bytes_per_sample=12_288, optimizer_state_bytes=9.0e6)
    step_s = twin.expected(cost, 32).step_time_s
    board = FakeJetsonBoard(fake, twin, time_scale=0.03 / step_s)  # ~30 ms of real time per step
    device = board.drive(_open(fake))
    measured = {}
    with device.restoring():
        for gpu in (306_000_000, 624_750_000):
            device.apply({"gpu_freq": gpu, "emc_freq": 2_133_000_000})
            device.run_step(lambda: None, 32, cost)  # warm-up: the rails show this setting's load from now
            with PowerMonitor(device.sensor, device.clock, rate_hz=200) as monitor:
                # the rails hold one value through the window, so the figure does not depend on how
                # often the OS lets the sampling thread run
                monitor.begin_window("steps")
                for i in range(12):
                    assert device.run_step(lambda i=i: i, 32, cost) == i
                stats = monitor.end_window("steps")
            truth = twin.expected(cost, 32, {"gpu_freq": gpu, "emc_freq": 2_133_000_000})
            assert board.steps[-1].clocks.gpu_hz == gpu  # the twin ran at what the backend wrote
            assert stats.mean_w == pytest.approx(truth.power_w, rel=0.05)
            assert stats.rail_energy_j["VDD_CPU_GPU_CV"] > 0
            measured[gpu] = stats.mean_w
        with pytest.raises(Exception) as err:
            device.run_step(lambda: None, 10**6, cost)
        assert is_out_of_memory(err.value)
    assert measured[624_750_000] > measured[306_000_000] * 1.05
    assert int((fake.gpu / "max_freq").read_text()) == 624_750_000  # restored: the governor's range again
    board.idle()
    device.close()


@pytest.mark.parametrize(("board", "zone"), [("orin-nano", "tj-thermal"), ("xavier-nx", "GPU-therm")])
def test_the_board_temperature_is_the_junction_zone_else_the_gpus(tmp_path, board, zone):
    fake = build_jetson(tmp_path / "root", board)
    device = _open(fake)
    expected = {"tj-thermal": 43.531, "GPU-therm": 41.5}[zone]  # millidegrees in the fake's files
    assert device.temperature_c == pytest.approx(expected)
    fake.set_temperature(zone, "48218\n")
    assert device.temperature_c == pytest.approx(48.218)
    fake.set_temperature(zone, "-25600\n")  # a gated sensor's reading is no temperature
    assert device.temperature_c is None
    fake.set_temperature(zone, "garbage\n")
    assert device.temperature_c is None
    device.close()


def test_a_board_without_thermal_zones_reads_no_temperature_and_says_so(tmp_path):
    import shutil

    fake = build_jetson(tmp_path / "root", "orin-nano")
    shutil.rmtree(fake.root / "sys/devices/virtual/thermal")
    device = _open(fake)
    assert device.temperature_c is None
    assert any("no tj or GPU thermal zone" in n for n in device.notes)
    device.close()


def test_a_knob_file_that_vanishes_is_one_line_and_its_original_kept_until_the_file_is_back(tmp_path):
    from edgetune.power import state

    fake = build_jetson(tmp_path / "root", "orin-nano")
    before = fake.knob_state()
    device = _open(fake)
    device.apply({"gpu_freq": 510_000_000, "cpu_cores": 4})
    (path,) = (tmp_path / "state").glob("*.json")
    kept = (fake.gpu / "min_freq").read_bytes()
    (fake.gpu / "min_freq").unlink()  # the devfreq node went (driver unbound) while the knob is changed
    with pytest.raises(DeviceError, match=r"^gpu_freq: cannot read .*min_freq \(ENOENT"):
        device.knobs["gpu_freq"].snapshot()
    with pytest.raises(RestoreError) as raised:
        device.restore()
    line = str(raised.value)
    assert "\n" not in line and raised.value.knobs == ("gpu_freq",)
    assert line.startswith("not restored on jetson: gpu_freq: cannot read ") and "min_freq (ENOENT" in line
    assert f"the state file {path} keeps the original of gpu_freq: run `edgetune restore` once the board is back" \
        in line
    assert path.exists() and list(state.load_state(path)["knobs"]) == ["gpu_freq"]  # cpu_cores went back
    with pytest.raises(RestoreError, match="not restored on jetson: gpu_freq"):
        device.close()  # the close's restore says the same, and closes the sensor all the same
    (fake.gpu / "min_freq").write_bytes(kept)  # the board is back
    (line,) = state.recover(report=lambda line: None)
    assert line.startswith("restored gpu_freq") and not path.exists()
    assert fake.knob_state() == before
    device.restore()  # this process lets go of the knob too: nothing left for its exit to restore
    assert not state._active


def test_a_knob_file_reading_garbage_changes_nothing_and_is_one_line(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    (fake.gpu / "max_freq").write_text("garbage\n")
    before = fake.knob_state()
    device = _open(fake)
    with pytest.raises(DeviceError, match=r"^gpu_freq: .*max_freq: expected a number, read 'garbage'; "
                                                 r"check that the board's driver"):
        device.apply({"gpu_freq": "max"})
    assert fake.knob_state() == before and not list((tmp_path / "state").glob("*.json"))
    device.close()


def test_a_knob_file_turned_directory_mid_search_is_one_line_and_restored_once_back(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    before = fake.knob_state()
    device = _open(fake)
    device.apply({"gpu_freq": 510_000_000})
    kept = (fake.gpu / "min_freq").read_bytes()
    (fake.gpu / "min_freq").unlink()
    (fake.gpu / "min_freq").mkdir()
    with pytest.raises(KnobWriteError) as raised:
        device.apply({"gpu_freq": 408_000_000})  # the next trial's setting
    assert "\n" not in str(raised.value) and "min_freq (EISDIR: Is a directory)" in str(raised.value)
    assert "run `edgetune restore` once the board is back" in str(raised.value)
    with pytest.raises(RestoreError, match=r"min_freq \(EISDIR"):
        device.restore()
    (fake.gpu / "min_freq").rmdir()
    (fake.gpu / "min_freq").write_bytes(kept)
    assert device.restore() == ["gpu_freq"] and fake.knob_state() == before
    assert not list((tmp_path / "state").glob("*.json"))
    device.close()


def test_a_write_to_a_vanished_knob_file_says_so_not_that_the_kernel_rejected_it(tmp_path):
    with pytest.raises(KnobWriteError, match=r"^gpu_freq: cannot write 5 to .*max_freq \(ENOENT: .*\); check that"):
        sysfs.write_checked(tmp_path / "max_freq", 5, "gpu_freq")


# ---------------------------------------------------------------------------------- files read at open


def test_an_nvpmodel_conf_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    fake = build_jetson(tmp_path / "root", "xavier-nx")
    conf = fake.root / "etc/nvpmodel.conf"
    break_file(conf, "directory")
    with pytest.raises(DeviceError) as raised:
        _open(fake)
    assert str(raised.value) == (f"power_mode: cannot read {conf} (EISDIR: Is a directory); reinstall L4T's "
                                 f"nvpmodel (`sudo apt install --reinstall nvidia-l4t-nvpmodel`)")


@pytest.mark.parametrize(("how", "said"), [
    ("missing", "usr/sbin/nvpmodel found but no /etc/nvpmodel.conf"),
    ("N/A\n", "etc/nvpmodel.conf has no < POWER_MODEL ID=n NAME=... > block")])
def test_an_nvpmodel_conf_gone_or_without_modes_says_why_power_mode_is_not_tunable(tmp_path, how, said):
    fake = build_jetson(tmp_path / "root", "xavier-nx")
    break_file(fake.root / "etc/nvpmodel.conf", how)
    device = _open(fake)
    assert "power_mode" not in device.knobs  # the other knobs and the rails are all there
    assert set(device.knobs) == {"gpu_freq", "cpu_freq", "cpu_cores", "emc_freq"}
    (note,) = [n for n in device.notes if n.startswith("power_mode not tunable: ")]
    assert said in note and note.endswith("; reinstall L4T's nvpmodel (`sudo apt install --reinstall "
                                          "nvidia-l4t-nvpmodel`)")
    assert device.missing_knobs == {"power_mode": note}  # what `edgetune restore` says of a power mode it kept
    device.close()


def test_knobs_left_out_at_open_carry_their_note_for_restore(tmp_path):
    """The GPU's devfreq node and the BPMP debugfs gone: their knobs are left out, each with the note that
    says why (``Device.missing_knobs``), which a restore of a state file's original for them names."""
    fake = build_jetson(tmp_path / "root", "orin-nano")
    device = _open(fake)
    assert device.missing_knobs == {}
    device.close()
    shutil.rmtree(fake.root / "sys/kernel/debug/bpmp")
    (fake.gpu / "available_frequencies").unlink()  # no GPU devfreq node is found without its table
    device = _open(fake)
    assert set(device.missing_knobs) == {"gpu_freq", "emc_freq"} and not {"gpu_freq", "emc_freq"} & set(device.knobs)
    assert all(note in device.notes for note in device.missing_knobs.values())
    assert "sudo mount -t debugfs" in device.missing_knobs["emc_freq"]
    device.close()


def test_an_nvpmodel_status_file_that_cannot_be_read_is_one_line_and_no_knob_changes(tmp_path):
    fake = build_jetson(tmp_path / "root", "xavier-nx")
    status = fake.root / "var/lib/nvpmodel/status"
    before, kept = fake.knob_state(), status.read_bytes()
    break_file(status, "directory")
    device = _open(fake)  # the monitor needs no power mode: the board opens
    said = (f"power_mode: cannot read {status} (EISDIR: Is a directory); nvpmodel keeps the board's mode "
            f"there; check it with `sudo nvpmodel -q`")
    with pytest.raises(DeviceError) as raised:
        device.knobs["power_mode"].read()
    assert str(raised.value) == said
    with pytest.raises(DeviceError) as raised:  # its original cannot be kept: no knob is written
        device.apply({"power_mode": "MODE_15W_2CORE", "gpu_freq": "min"})
    assert str(raised.value) == said
    device.close()
    status.rmdir()
    status.write_bytes(kept)
    assert fake.knob_state() == before


RAIL_FILES = {  # what breaks -> (board, the file under the root, the rail the error names)
    "hwmon voltage": ("orin-nano", "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/in1_input", "VDD_IN"),
    "hwmon current": ("xavier-nx", "sys/bus/i2c/devices/7-0040/hwmon/hwmon1/curr3_input", "VDD_SOC"),
    "hwmon module rail": ("agx-orin-jp6", "sys/bus/i2c/devices/1-0041/hwmon/hwmon2/in2_input",
                          "VDDQ_VDD2_1V8AO"),
    "iio power": ("nano", "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power1_input", "POM_5V_GPU"),
}


@pytest.mark.parametrize(("rail", "how"), [
    (rail, how) for rail in sorted(RAIL_FILES) for how in ("missing", "directory", "N/A\n", "")
    if (rail, how) != ("iio power", "missing")])  # JetPack 4 without in_power files: voltage times current
def test_a_rail_file_that_is_gone_or_reads_nonsense_at_open_is_one_line_naming_it(tmp_path, rail, how):
    # a missing file used to leave its rail out without a word (VDD_IN gone: a "derived" total of the module
    # rails, less than half the board's power), a directory or garbage to drop every sample of the run
    board, rel, name = RAIL_FILES[rail]
    fake = build_jetson(tmp_path / "root", board)
    before = fake.knob_state()
    break_file(fake.root / rel, how)
    with pytest.raises(DeviceError) as raised:
        _open(fake)
    line = str(raised.value)
    assert "\n" not in line and line.startswith(f"power rail {name}: ") and str(fake.root / rel) in line
    assert line.endswith("; check that the ina3221 driver is loaded (the board's power monitor)")
    reason = {"missing": "(ENOENT: No such file or directory)", "directory": "(EISDIR: Is a directory)"}
    assert reason.get(how, "expected a number") in line
    assert fake.knob_state() == before


def test_a_rail_label_turned_directory_is_one_line_naming_it(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    label = fake.root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/in2_label"
    break_file(label, "directory")
    with pytest.raises(DeviceError, match=rf"^power rail in2: cannot read {label} \(EISDIR: Is a dir"):
        _open(fake)


UNLABELLED = {  # which label reads no name -> (board, its label file, the channel's name, total label, rails)
    "input rail": ("orin-nano", "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/in1_label", "in1@1-0040",
                   "derived: in1@1-0040 + VDD_CPU_GPU_CV + VDD_SOC", ("in1@1-0040", "VDD_CPU_GPU_CV", "VDD_SOC")),
    "module rail": ("xavier-nx", "sys/bus/i2c/devices/7-0040/hwmon/hwmon1/in3_label", "in3@7-0040", "VDD_IN",
                    ("VDD_IN", "VDD_CPU_GPU_CV", "in3@7-0040")),
    "second monitor": ("agx-orin-jp6", "sys/bus/i2c/devices/1-0041/hwmon/hwmon2/in2_label", "in2@1-0041",
                       "derived: VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + in2@1-0041",
                       ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "in2@1-0041")),
    "iio input rail": ("nano", "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/rail_name_0", "channel0@6-0040",
                       "derived: channel0@6-0040 + POM_5V_GPU + POM_5V_CPU",
                       ("channel0@6-0040", "POM_5V_GPU", "POM_5V_CPU")),
}


@pytest.mark.parametrize(("which", "how"), [(w, h) for w in sorted(UNLABELLED) for h in ("N/A\n", "")])
def test_a_rail_label_that_names_no_rail_is_an_unlabelled_channel_said_in_the_notes(tmp_path, which, how):
    """A label reading "N/A" (or nothing) on a channel whose files read is no rail name and no unconnected
    channel: before, "N/A" became a rail named "N/A" (and on the input rail a derived total with no word why) and
    an empty label was passed over as unconnected (VDD_IN's: a total of the module rails, under half the board's
    power). Now the channel is named by its channel and monitor, never a guessed rail, counted in a derived total
    (high, never low, if it is the input) and said once in the notes, naming the file."""
    board, rel, name, total, rails = UNLABELLED[which]
    fake = build_jetson(tmp_path / "root", board)
    break_file(fake.root / rel, how)
    device = _open(fake)
    try:
        assert device.sensor.rails == rails and device.sensor.total_label == total
        reading = device.sensor.read()
        assert reading.total_w == pytest.approx(sum(reading.rails.values()) if total.startswith("derived")
                                                else reading.rails[total])
        (note,) = [n for n in device.notes if str(fake.root / rel) in n]
        read = "reads 'N/A'" if how else "is empty"
        assert note.startswith(f"power rail {name} has no name ({fake.root / rel} {read}): ")
        assert note.endswith("; check the ina3221 driver and its device-tree labels")
        assert ("the total is derived" in note) == total.startswith("derived")
        # "no board input rail on this module" is not said where the input rail may be the unlabelled channel
        assert not any("no board input rail on this module" in n for n in device.notes)
    finally:
        device.close()


def test_an_unlabelled_channel_without_reading_files_is_unconnected(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    hw = fake.root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon1"
    break_file(hw / "in3_label", "N/A\n")
    (hw / "in3_input").unlink()
    (hw / "curr3_input").unlink()
    device = _open(fake)
    assert device.sensor.rails == ("VDD_IN", "VDD_CPU_GPU_CV") and device.sensor.total_label == "VDD_IN"
    assert not any("in3" in n for n in device.notes)
    device.close()


@pytest.mark.parametrize("how", ["directory", "N/A\n", "306000000 N/A\n", ""])
def test_a_gpu_frequency_table_that_cannot_be_read_is_one_line_naming_it(tmp_path, how):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    table = fake.gpu / "available_frequencies"
    break_file(table, how)
    with pytest.raises(DeviceError) as raised:
        _open(fake)
    line = str(raised.value)
    assert "\n" not in line and line.startswith("gpu_freq: ") and "available_frequencies" in line
    assert ("(EISDIR" if how == "directory" else "expected a number") in line


def test_a_junction_zone_that_cannot_be_read_at_open_is_said_once_and_the_gpus_is_read(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    tj = fake.thermal["tj-thermal"]
    break_file(tj, "missing")
    device = _open(fake)
    assert device.temperature_c == pytest.approx(42.937)  # gpu-thermal's, the next zone in preference
    notes = [n for n in device.notes if "thermal" in n]
    assert notes == [(f"thermal zone tj-thermal: cannot read {tj} (ENOENT: No such file or directory); the "
                      f"board temperature is gpu-thermal's")]
    device.close()


def test_thermal_zones_that_cannot_be_read_at_open_leave_the_run_without_temperature_and_say_so(tmp_path):
    # the temperature is optional (the thermal soak then sees power only): a note, never an error
    fake = build_jetson(tmp_path / "root", "xavier-nx")  # CPU-therm, GPU-therm, AUX-therm: no junction zone
    break_file(fake.thermal["GPU-therm"], "garbage\n")
    device = _open(fake)
    assert device.temperature_c is None
    notes = [n for n in device.notes if "thermal" in n]
    gpu = fake.thermal["GPU-therm"]
    assert notes == [(f"thermal zone gpu-therm: {gpu}: expected a number, read 'garbage'; no board "
                      f"temperature: the thermal soak sees power only (a lower bound of the warm board's)")]
    device.close()
