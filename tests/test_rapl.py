"""The RAPL backend against a fake powercap tree: wrap-around, power from deltas, cpufreq knob, restore."""

from __future__ import annotations

import shutil

import pytest
from fakes.rapl_tree import MAX_RANGE_UJ, build_rapl

from edgetune.power import PowerMonitor, VirtualClock, open_device, rapl
from edgetune.power.base import Capability


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))


def _sensor(fake, clock):
    return rapl.RaplSensor(rapl.find_zones(fake.root), clock=clock)


def test_zones_skip_core_uncore_and_psys(tmp_path):
    fake = build_rapl(tmp_path / "root", packages=2)
    assert [z.name for z in rapl.find_zones(fake.root)] == ["package-0", "dram-0", "package-1", "dram-1"]
    device = rapl.open(root=fake.root)
    assert device.sensor.total_label == "derived: package-0 + dram-0 + package-1 + dram-1"
    assert "Xeon" in device.description and "2 package(s)" in device.description
    device.close()


def test_dies_of_one_package_each_count_with_their_own_dram(tmp_path):
    # two packages of two dies: a zone per die, package-<P>-die-<D>, each with its DRAM. Named by the last
    # number alone, two DRAM rails were both dram-0 and dram-1, and the total counted one of each pair.
    fake = build_rapl(tmp_path / "root", packages=2, dies=2)
    names = [z.name for z in rapl.find_zones(fake.root)]
    assert names == ["package-0-die-0", "dram-0-die-0", "package-0-die-1", "dram-0-die-1",
                     "package-1-die-0", "dram-1-die-0", "package-1-die-1", "dram-1-die-1"]
    clock = VirtualClock()
    sensor = _sensor(fake, clock)
    clock.advance(1.0)
    for name in names:
        fake.add_energy(name, 10.0 if name.startswith("package") else 2.0)
    reading = sensor.read()
    assert len(reading.rails) == 8 and reading.total_w == pytest.approx(4 * 10.0 + 4 * 2.0)
    device = rapl.open(root=fake.root)
    assert "(2 package(s), 4 dies, RAPL)" in device.description
    device.close()


def test_capabilities_energy_counter_and_nothing_simulated(tmp_path):
    fake = build_rapl(tmp_path / "root")
    device = rapl.open(root=fake.root)
    assert device.capabilities == {Capability.ENERGY_COUNTER, Capability.WHOLE_MACHINE} and device.sensor.energy_j() is not None
    assert not device.has(Capability.VIRTUAL_CLOCK) and device.idle_power_w is None
    device.close()


def test_power_from_energy_deltas(tmp_path):
    fake = build_rapl(tmp_path / "root")
    clock = VirtualClock()
    sensor = _sensor(fake, clock)
    clock.advance(0.5)
    fake.add_energy("package-0", 20.0)  # 40 W for 0.5 s
    fake.add_energy("dram-0", 2.5)  # 5 W
    reading = sensor.read()
    assert reading.rails == {"package-0": pytest.approx(40.0), "dram-0": pytest.approx(5.0)}
    assert reading.total_w == pytest.approx(45.0)
    assert sensor.energy_j() == pytest.approx(22.5)


def test_counter_wrap_around(tmp_path):
    fake = build_rapl(tmp_path / "root", start_uj=MAX_RANGE_UJ - 3_000_000)  # 3 J before the wrap
    clock = VirtualClock()
    sensor = _sensor(fake, clock)
    for _ in range(4):  # 4 x 2.5 J per 0.1 s: crosses max_energy_range_uj once
        clock.advance(0.1)
        fake.add_energy("package-0", 2.5)
        fake.add_energy("dram-0", 0.5)
        reading = sensor.read()
        assert reading.rails["package-0"] == pytest.approx(25.0)
        assert reading.rails["dram-0"] == pytest.approx(5.0)
    assert int(fake.counters["package-0"].read_text()) < 10_000_000  # it did wrap
    assert sensor.energy_j() == pytest.approx(12.0)


def test_monitor_energy_matches_counter(tmp_path):
    fake = build_rapl(tmp_path / "root")
    clock = VirtualClock()
    sensor = _sensor(fake, clock)
    monitor = PowerMonitor(sensor, clock, rate_hz=100)
    monitor.start()
    monitor.begin_window("w")
    for _ in range(200):  # 2 s at 30 W package + 4 W DRAM, counters moving every 10 ms
        clock.advance(0.01)
        fake.add_energy("package-0", 0.30)
        fake.add_energy("dram-0", 0.04)
    stats = monitor.end_window("w")
    monitor.stop()
    assert stats.hardware_energy_j == pytest.approx(68.0)
    assert stats.energy_j == pytest.approx(68.0, rel=0.02)
    assert stats.mean_w == pytest.approx(34.0, rel=0.02)


def test_garbage_counter_raises(tmp_path):
    fake = build_rapl(tmp_path / "root")
    sensor = _sensor(fake, VirtualClock())
    fake.counters["dram-0"].chmod(0o644)
    fake.counters["dram-0"].write_text("oops\n")
    with pytest.raises(ValueError, match="energy_uj"):
        sensor.read()


def test_cpu_freq_knob_on_intel_pstate(tmp_path):
    fake = build_rapl(tmp_path / "root")
    before = fake.knob_state()
    device = open_device("rapl", root=fake.root)
    knob = device.knobs["cpu_freq"]
    assert knob.unit == "kHz" and knob.min == 800_000 and knob.max == 3_200_000 and 100_000 in {
        b - a for a, b in zip(knob.values, knob.values[1:])}
    assert any("intel_pstate" in n for n in device.notes)
    with device.restoring():
        device.apply({"cpu_freq": "1.5GHz"})
        assert {v for k, v in fake.knob_state().items()} == {"1500000\n"}
    assert fake.knob_state() == before
    device.close()


def test_a_machine_without_cpufreq_leaves_cpu_freq_out_with_its_note(tmp_path):
    fake = build_rapl(tmp_path / "root")
    shutil.rmtree(fake.root / "sys/devices/system/cpu/cpufreq")
    device = open_device("rapl", root=fake.root)
    assert "cpu_freq" not in device.knobs and device.measure_only
    assert device.missing_knobs == {"cpu_freq": "no cpufreq policies: cpu_freq cannot be tuned"}
    assert device.missing_knobs["cpu_freq"] in device.notes
    device.close()


def test_no_rapl_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(rapl.DeviceError, match="no RAPL package zones") as err:
        rapl.open(root=tmp_path / "empty")
    assert "\n" not in str(err.value)
    assert not rapl.probe(root=tmp_path / "empty")[0].found


def test_a_run_on_counters_that_never_move_is_refused_in_one_line_and_restores(tmp_path, monkeypatch, capsys):
    """RAPL counters that never move (many virtual machines) read 0 W: every setting would hold any budget and
    a search would pick the fastest. The measurement refuses the window instead, and the knobs are restored."""
    from edgetune.cli import main

    fake = build_rapl(tmp_path / "rapl", cpus=2)
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    args = ["--device", "rapl", "--workload", "cnn", "--batch-size", "8"]
    assert main(["run", *args, "--set", "cpu_freq=1GHz", "--warmup", "1", "--steps", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("edgetune: error: rapl: the power sensor's total (derived: package-0 + dram-0) gave "
                              "an average of 0.00 W over ") and "edgetune monitor --device rapl" in err[-1]
    assert not list((tmp_path / "state").glob("*"))  # nothing left to restore
    assert main(["search", *args, "--budget", "5", "--n-trials", "2", "--soak-s", "0", "--warmup-steps", "1",
                 "--measure-steps", "3", "-o", str(tmp_path / "o")]) == 2
    assert "gave an average of 0.00 W" in capsys.readouterr().err
    assert not (tmp_path / "o" / "best.json").exists()


@pytest.mark.parametrize("name", ["max_energy_range_uj", "energy_uj"])
@pytest.mark.parametrize("how", ["missing", "directory", "N/A", ""])
def test_a_counter_file_broken_at_open_is_one_line_naming_it(tmp_path, monkeypatch, capsys, name, how):
    """A package's counter or its range gone, a directory or reading nonsense when the device is opened: one
    line naming the zone, the file and the fix (exit 2 from the CLI), not a traceback, nor a permission hint
    for a file that is not there; `edgetune devices` lists RAPL as not found, with the same line."""
    from fakes.jetson_tree import break_file

    from edgetune.cli import main
    from edgetune.power.base import DeviceError

    fake = build_rapl(tmp_path / "rapl", cpus=2)
    path = fake.root / "sys/class/powercap/intel-rapl:0" / name
    break_file(path, how)
    with pytest.raises(DeviceError) as err:
        rapl.open(root=fake.root)
    line = str(err.value)
    assert "\n" not in line and line.startswith("RAPL package-0: ") and str(path) in line
    assert "modprobe intel_rapl_msr" in line and "root-only" not in line
    probe = rapl.probe(root=fake.root)[0]
    assert not probe.found and probe.summary == line
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    assert main(["monitor", "--device", "rapl", "--duration", "0.1"]) == 2
    assert capsys.readouterr().err.strip() == f"edgetune: error: {line}"
