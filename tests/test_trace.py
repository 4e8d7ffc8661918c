"""The trace:<table.csv> device: replays a table's time and power on a virtual clock."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from edgetune.power import DeviceError, PowerMonitor, open_device
from edgetune.power.knobs import Candidate
from edgetune.power.trace import DEFAULT_SENSOR_PERIOD_S
from edgetune.tables import DEFAULT_POWER_CV, DEFAULT_TIME_CV

ZEUS_TABLES = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23", "tables")
V100_SQUAD = os.path.join(ZEUS_TABLES, "v100_squad_bert_base_uncased.csv")


def test_knobs_are_the_table_columns():
    dev = open_device(f"trace:{V100_SQUAD}")
    assert dev.simulated and set(dev.knobs) == {"power_limit"}
    knob = dev.knobs["power_limit"]
    assert knob.unit == "W" and knob.values == (100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0)
    assert knob.read() == 250.0  # starts at the highest value, as a GPU's default limit


def test_step_replays_table_time_and_power():
    dev = open_device(f"trace:{V100_SQUAD}", noise=False)
    replay = dev.backend
    dev.apply({"power_limit": 150})
    row = replay.table.find({"power_limit": 150.0}, 32)
    step_s = replay.table.time_per_epoch_s[row] * 32 / replay.table.samples_per_epoch[row]
    calls = []
    with PowerMonitor(dev.sensor, dev.clock, rate_hz=100) as mon:
        mon.begin_window("w")
        for _ in range(3):
            assert dev.run_step(lambda: calls.append(1) or 0.5, 32, None) == 0.5
        stats = mon.end_window("w")
    assert len(calls) == 3
    assert stats.duration_s == pytest.approx(3 * step_s, rel=0.02)
    assert stats.mean_w == pytest.approx(replay.table.power_w[row], rel=0.01)
    assert dev.sensor.energy_j() == pytest.approx(3 * step_s * replay.table.power_w[row], rel=1e-9)
    dev.restore()
    assert dev.knobs["power_limit"].read() == 250.0


def test_setting_or_batch_not_in_table_is_a_clear_error():
    dev = open_device(f"trace:{V100_SQUAD}")
    with pytest.raises(DeviceError, match="no rows for batch size 20; measured batch sizes: 8, 12, 16"):
        dev.run_step(lambda: None, 20, None)
    with pytest.raises(DeviceError, match="130 W is not an allowed value"):
        dev.apply({"power_limit": 130})


def test_a_setting_the_table_records_out_of_memory_runs_out_of_memory(tmp_path):
    from edgetune.power.base import is_out_of_memory

    path = tmp_path / "sweep.csv"
    path.write_text("gpu_freq_mhz,batch_size,step_time_s,power_w\n306,16,0.10,5.0\n624,16,0.06,7.0\n"
                    "306,32,0.18,5.5\n624,32,OOM,\n")
    dev = open_device(f"trace:{path}", compute=False)
    assert Candidate.of(32, {"gpu_freq": 624e6}) not in dev.backend.candidates()  # nothing to measure there
    dev.apply({"gpu_freq": 624e6})
    with pytest.raises(DeviceError, match="out of memory: trace .* records gpu_freq=6.24e\\+08 at batch size 32 "
                                          "as out of memory") as info:
        dev.run_step(lambda: None, 32, None)
    assert is_out_of_memory(info.value)
    with pytest.raises(DeviceError, match="no rows for batch size 64") as info:
        dev.run_step(lambda: None, 64, None)
    assert not is_out_of_memory(info.value)
    dev.run_step(lambda: None, 16, None)  # what was measured runs


def test_oracle_is_the_best_row_under_the_budget():
    dev = open_device(f"trace:{V100_SQUAD}", compute=False)
    table = dev.backend.table
    best = dev.backend.oracle(150.0)
    ttt = table.time_to_target_s()
    ok = table.power_w <= 150.0
    assert best.power_w <= 150.0 and best.time_to_target_s == pytest.approx(ttt[ok].min())
    assert dev.backend.oracle(10.0) is None


def test_bad_trace_specs(tmp_path):
    with pytest.raises(DeviceError, match="trace needs a table"):
        open_device("trace:")
    with pytest.raises(DeviceError, match="cannot read table"):
        open_device(f"trace:{tmp_path / 'missing.csv'}")
    bad = tmp_path / "bad.csv"
    bad.write_text("power_limit,batch_size,time_per_epoch_s,power_w\n100,8,10,\n")
    with pytest.raises(DeviceError, match="missing value in column power_w"):
        open_device(f"trace:{bad}")
    no_size = tmp_path / "nosize.csv"
    no_size.write_text("power_limit,batch_size,time_per_epoch_s,power_w\n100,8,10,90\n")
    with pytest.raises(DeviceError, match="add a samples_per_epoch column"):
        open_device(f"trace:{no_size}")


# ------------------------------------------------------------------------- replays that behave like measurements

SWEEP = os.path.join(os.path.dirname(__file__), "data", "orin_nano_clock_sweep.csv")


def window(dev, batch_size, steps=20):
    """Run ``steps`` steps; the window's step time and its mean power from the exact energy counter (a
    monitor's first samples may still hold the previous window's reading: the sensor's update period)."""
    t0, e0 = dev.clock.now(), dev.sensor.energy_j()
    for _ in range(steps):
        dev.run_step(lambda: None, batch_size, None)
    duration = dev.clock.now() - t0
    return duration / steps, (dev.sensor.energy_j() - e0) / duration


def test_each_window_draws_time_and_power_from_the_rows_spread():
    dev = open_device(f"trace:{V100_SQUAD}", compute=False, seed=3)
    table = dev.backend.table
    row = table.find({"power_limit": 200.0}, 16)
    times, powers = [], []
    for _ in range(300):
        dev.apply({"power_limit": 200})  # every trial applies its setting: a new window
        t, p = window(dev, 16, steps=3)
        times.append(t)
        powers.append(p)
    log_t = np.log(np.array(times) / table.step_time()[row])
    log_p = np.log(np.array(powers) / table.power_w[row])
    # the Zeus tables have no repeats: the Zeus-derived default spread, log-normal around the table's median
    assert np.std(log_t) == pytest.approx(DEFAULT_TIME_CV, rel=0.15)
    assert np.std(log_p) == pytest.approx(DEFAULT_POWER_CV, rel=0.15)
    assert abs(np.median(log_t)) < 0.2 * DEFAULT_TIME_CV and abs(np.median(log_p)) < 0.2 * DEFAULT_POWER_CV
    assert len(set(times)) == 300
    # within one window (no knob written) the figures hold: steps are back to back at one drawn time
    first, second = window(dev, 16), window(dev, 16)
    assert first == pytest.approx(second, rel=1e-9)


def test_noise_is_seeded_per_row_and_visit():
    def kth_window_at(seed, detour):
        dev = open_device(f"trace:{V100_SQUAD}", compute=False, seed=seed)
        out = []
        for k in range(3):
            if detour:  # another row measured in between must not change what this row gives
                dev.apply({"power_limit": 100})
                window(dev, 8, steps=2)
            dev.apply({"power_limit": 175})
            out.append(window(dev, 32, steps=2))
        return out

    np.testing.assert_allclose(kth_window_at(1, False), kth_window_at(1, True), rtol=1e-12)
    assert not np.allclose(kth_window_at(1, False), kth_window_at(2, False), rtol=1e-3)


def test_repeated_rows_set_the_replays_spread(tmp_path):
    text = ("gpu_freq_mhz,step_time_s,power_w\n" + "".join(
        f"{f},{t},{p}\n" for _ in range(2) for f, t, p in ((500, 0.2, 7.0), (800, 0.15, 9.0))) +
        "500,0.22,7.7\n800,0.15,9.0\n")
    path = tmp_path / "sweep.csv"
    path.write_text(text)
    dev = open_device(f"trace:{path}", compute=False)
    spread = dev.backend.table.spread()
    assert spread.time_cv[1] == 0.0 and spread.power_cv[1] == 0.0  # 800 MHz measured the same three times
    dev.apply({"gpu_freq": 800e6})
    assert window(dev, 64) == pytest.approx((0.15, 9.0), rel=1e-9)
    assert any("trace noise: each window draws time and power from the rows' spread" in n for n in dev.notes)


def test_the_sensor_holds_each_reading_for_its_update_period(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("# edgetune: sensor_period_s=0.1\ngpu_freq,step_time_s,power_w\n1e8,0.06,5\n2e8,0.06,8\n")
    dev = open_device(f"trace:{path}", noise=False)
    assert dev.sensor.update_period_s == 0.1
    with PowerMonitor(dev.sensor, dev.clock, rate_hz=1000) as mon:
        for f in (1e8, 2e8, 1e8, 1e8, 2e8):  # 60-ms steps at 5, 8, 5, 5, 8 W
            dev.apply({"gpu_freq": f})
            dev.run_step(lambda: None, 1, None)
        times, watts = mon.records()
    # each reading is the power at the last 100-ms update instant: 0 s (5 W), 0.1 s (8 W), 0.2 s (5 W);
    # the 8 W steps from 0.06 s and 0.24 s show only from the next update on
    expected = np.where(times < 0.1 - 1e-9, 5.0, np.where(times < 0.2 - 1e-9, 8.0, 5.0))
    assert times.size > 250 and times.max() > 0.29
    np.testing.assert_array_equal(watts, expected)
    assert open_device(f"trace:{path}", sensor_period_s=0.02).sensor.update_period_s == 0.02
    assert open_device(f"trace:{V100_SQUAD}").sensor.update_period_s == DEFAULT_SENSOR_PERIOD_S


def test_epochs_to_target_is_seen_only_for_batch_sizes_measured():
    dev = open_device(f"trace:{V100_SQUAD}", compute=False)
    replay, table = dev.backend, dev.backend.table
    assert replay.epochs_to_target(32) is None and replay.measured_batch_sizes == frozenset()
    assert "seen only once it has been measured" in replay.convergence_note()
    dev.run_step(lambda: None, 32, None)
    assert replay.measured_batch_sizes == {32}
    assert replay.epochs_to_target(32) == table.epochs_to_target[table.batch_size == 32][0]
    assert replay.epochs_to_target(16) is None
    known = open_device(f"trace:{V100_SQUAD}", known_convergence=True).backend
    assert all(known.epochs_to_target(b) == table.epochs_to_target[table.batch_size == b][0]
               for b in table.batch_sizes)
    assert "known from the start" in known.convergence_note()
    assert any("known from the start" in n for n in known.device("t").notes)
    with pytest.raises(DeviceError, match="no rows for batch size 20"):
        known.epochs_to_target(20)


def test_batch_sizes_without_convergence_data_or_that_never_reach_it():
    imagenet = os.path.join(ZEUS_TABLES, "v100_imagenet_resnet50.csv")
    replay = open_device(f"trace:{imagenet}", known_convergence=True).backend
    assert replay.epochs_to_target(8) is None  # measured for power only: no convergence runs
    assert math.isinf(replay.epochs_to_target(64))  # all 4 runs missed the target
    adam = open_device(f"trace:{os.path.join(ZEUS_TABLES, 'v100_cifar100_shufflenetv2_adam.csv')}",
                       known_convergence=True).backend
    assert adam.epochs_to_target(1024) is None and "no epochs_to_target column" in adam.convergence_note()


def test_the_replay_lists_its_rows_as_candidates_and_its_default_batch_size():
    replay = open_device(f"trace:{V100_SQUAD}").backend
    table = replay.table
    cands = replay.candidates()
    assert len(cands) == len(table) == 49 and cands[0] == Candidate.of(int(table.batch_size[0]), table.setting(0))
    assert {c.batch_size for c in replay.candidates(32)} == {32} and len(replay.candidates(32)) == 7
    assert replay.default_batch_size == 32  # Zeus's default for SQuAD, declared by import-zeus


def test_the_twin_clock_sweep_replays_as_a_fixed_batch_device():
    dev = open_device(f"trace:{SWEEP}", compute=False, seed=5)
    replay, table = dev.backend, dev.backend.table
    assert set(dev.knobs) == {"cpu_cores", "cpu_freq", "gpu_freq", "emc_freq"}
    assert dev.knobs["gpu_freq"].unit == "Hz" and dev.knobs["cpu_freq"].unit == "kHz"
    assert dev.sensor.update_period_s == 0.0066
    with pytest.raises(DeviceError, match="fixed-batch sweep with no declared batch size"):
        replay.candidates()
    cands = replay.candidates(64)
    assert len(cands) == 60 and {c.batch_size for c in cands} == {64}
    assert "fixed batch (not declared)" in dev.description
    measured = []
    for c in cands[:8]:
        dev.apply(c.knobs)
        measured.append(window(dev, 64))
    i = [table.find(c.knobs, None) for c in cands[:8]]
    t_rel = np.array([m[0] for m in measured]) / table.step_time()[i] - 1.0
    p_rel = np.array([m[1] for m in measured]) / table.power_w[i] - 1.0
    # draws from the sweep's own repeats (a twin measures within about 0.1-0.4%): close, never identical
    assert np.all(np.abs(t_rel) < 5 * table.time_cv[i]) and np.all(np.abs(p_rel) < 0.02)
    assert np.all(t_rel != 0.0)
    assert replay.candidates() == cands  # the first batch size run is the sweep's from then on
    with pytest.raises(DeviceError, match="fixed-batch sweep at batch size 64; it cannot replay batch size 32"):
        dev.run_step(lambda: None, 32, None)
    absent = next(s for s in ({**cands[0].knobs, "gpu_freq": g} for g in table.knob_values("gpu_freq"))
                  if table.find(s, None) is None)
    dev.apply(absent)
    with pytest.raises(DeviceError, match=f"has no row for cpu_cores={absent['cpu_cores']:g}, .*; measured: "):
        dev.run_step(lambda: None, 64, None)


def test_a_declared_batch_size_is_the_fixed_sweeps(tmp_path):
    path = tmp_path / "declared.csv"
    with open(SWEEP) as f:
        path.write_text("# edgetune: default_batch_size=128\n" + f.read())
    replay = open_device(f"trace:{path}").backend
    assert replay.default_batch_size == 128 and {c.batch_size for c in replay.candidates()} == {128}
    with pytest.raises(DeviceError, match="no rows for batch size 64"):
        replay.epochs_to_target(64)


def test_a_search_on_a_trace_takes_its_baseline_at_the_tables_declared_batch_size(tmp_path, capsys):
    import json

    from edgetune.cli import main
    from edgetune.tables import load_table, save_table

    # Zeus's SQuAD default is 32; the cnn workload the CLI loads by default would have put it at 64 (nearest 128)
    table = load_table(V100_SQUAD)
    keep = np.isin(table.batch_size, [16, 32, 56]) & np.isin(table.settings[:, 0], [150, 250])
    path = tmp_path / "squad.csv"
    save_table(table.subset(np.flatnonzero(keep)), path)
    out = tmp_path / "out"
    assert main(["search", "--device", f"trace:{path}", "--budget", "200", "--n-trials", "2", "--output",
                 str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert json.loads((out / "best.json").read_text())["baseline"]["batch_size"] == 32
