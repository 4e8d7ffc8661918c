"""The trace:<table.csv> device: replays a table's time and power on a virtual clock."""

from __future__ import annotations

import os

import pytest

from edgetune.power import DeviceError, PowerMonitor, open_device

ZEUS_TABLES = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23", "tables")
V100_SQUAD = os.path.join(ZEUS_TABLES, "v100_squad_bert_base_uncased.csv")


def test_knobs_are_the_table_columns():
    dev = open_device(f"trace:{V100_SQUAD}")
    assert dev.simulated and set(dev.knobs) == {"power_limit"}
    knob = dev.knobs["power_limit"]
    assert knob.unit == "W" and knob.values == (100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0)
    assert knob.read() == 250.0  # starts at the highest value, as a GPU's default limit


def test_step_replays_table_time_and_power():
    dev = open_device(f"trace:{V100_SQUAD}")
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


def test_oracle_is_the_best_row_under_the_budget():
    dev = open_device(f"trace:{V100_SQUAD}", compute=False)
    table = dev.backend.table
    best = dev.backend.oracle(150.0)
    ttt = table.time_to_target_s()
    ok = table.power_w <= 150.0
    assert best.power_w <= 150.0 and best.time_to_target_s == pytest.approx(ttt[ok].min())
    assert dev.backend.oracle(10.0) is None
    assert dev.backend.epochs_to_target(best.batch_size) == table.epochs_to_target[
        table.find(best.setting, best.batch_size)]


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
