"""Measurement tables: the CSV format, its validation (one clear line per problem) and round trips."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from edgetune.cli import main
from edgetune.tables import TableError, check_train_size, load_table, save_table

ZEUS = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23")

GOOD = """# measured on a test bench
gpu_freq,batch_size,step_time_s,power_w,peak_power_w,epochs_to_target
6.1e8,16,0.050,8.0,9.5,12
9.2e8,16,0.036,10.5,12.0,12
6.1e8,32,0.090,8.6,10.1,
9.2e8,32,0.064,11.9,13.0,
6.1e8,64,0.170,9.1,10.3,inf
9.2e8,64,0.118,12.4,13.9,inf
"""


def write(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_load_reads_knobs_columns_and_notes(tmp_path):
    t = load_table(write(tmp_path, GOOD))
    assert t.knobs == ("gpu_freq",)
    assert len(t) == 6 and t.batch_sizes == [16, 32, 64]
    assert t.knob_values("gpu_freq") == [6.1e8, 9.2e8]
    assert t.notes == ("measured on a test bench",)
    assert t.features()[1] == {"gpu_freq": 9.2e8, "batch_size": 16.0}
    assert np.isnan(t.epochs_to_target[2]) and math.isinf(t.epochs_to_target[4])
    assert t.find({"gpu_freq": 9.2e8}, 32) == 3 and t.find({"gpu_freq": 7e8}, 32) is None


def test_round_trip_keeps_every_value(tmp_path):
    t = load_table(write(tmp_path, GOOD))
    out = tmp_path / "copy.csv"
    save_table(t, out)
    u = load_table(out)
    assert u.knobs == t.knobs and u.notes == t.notes
    for name in ("settings", "batch_size", "step_time_s", "power_w", "peak_power_w"):
        np.testing.assert_array_equal(getattr(u, name), getattr(t, name))
    np.testing.assert_array_equal(np.isnan(u.epochs_to_target), np.isnan(t.epochs_to_target))


def test_oracle_respects_budget_and_skips_unknown_or_unreached(tmp_path):
    t = load_table(write(tmp_path, GOOD))
    # time to target needs time per epoch: with step times only, samples_per_epoch is required
    with pytest.raises(TableError, match="samples_per_epoch"):
        t.oracle(100.0)
    text = GOOD.replace("epochs_to_target\n", "epochs_to_target,samples_per_epoch\n")
    text = "\n".join(line + ",1000" if line and line[0].isdigit() else line for line in text.splitlines())
    t = load_table(write(tmp_path, text + "\n"))
    assert t.oracle(None) == 1  # fastest with known, finite epochs: 9.2e8 at batch 16
    assert t.oracle(9.0) == 0
    assert t.oracle(5.0) is None


@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace("0.036", ""), "line 4: missing value in column step_time_s"),
    (lambda s: s.replace("10.5", "ten"), "power_w = 'ten' is not a number"),
    (lambda s: s.replace("9.2e8,64", "6.1e8,64"), "duplicate setting gpu_freq=6.1e\\+08, batch_size=64"),
    (lambda s: s.replace(",12.4,", ",-1,"), "power_w must be a positive finite number"),
    (lambda s: s.replace("9.2e8,16,0.036,10.5,12.0,12", "9.2e8,16,0.036,10.5,12.0,13"), "differs between rows"),
    (lambda s: s.replace("power_w,", "watts,"), "no 'power_w' column"),
    (lambda s: s.replace("step_time_s", "seconds"), "needs a step_time_s or a time_per_epoch_s column"),
    (lambda s: s.replace(",0.118,", ",inf,"), "is not a finite number"),
    (lambda s: s.split("gpu_freq")[0] + "gpu_freq,batch_size,step_time_s,power_w\n", "no rows"),
])
def test_bad_tables_give_one_clear_line(tmp_path, change, message):
    with pytest.raises(TableError, match=message) as info:
        load_table(write(tmp_path, change(GOOD)))
    assert "\n" not in str(info.value)


def test_train_size_must_leave_rows_to_evaluate(tmp_path):
    t = load_table(write(tmp_path, GOOD))
    check_train_size(t, 5)
    with pytest.raises(TableError, match="too few for a train size of 6"):
        check_train_size(t, 6)


def test_predict_eval_cli_prints_the_summary_line(tmp_path, capsys):
    table = os.path.join(ZEUS, "tables", "v100_squad_bert_base_uncased.csv")
    assert main(["predict-eval", table, "--train-size", "10", "--seed", "3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("time MAPE: ") and " | power MAPE: " in last and last.endswith("%")
    # a squad table is smooth: 10 rows must predict the other 39 within a few percent
    time_mape = float(last.split("time MAPE: ")[1].split("%")[0])
    power_mape = float(last.split("power MAPE: ")[1].rstrip("%"))
    assert time_mape < 15 and power_mape < 8


@pytest.mark.parametrize("args, message", [
    (["--train-size", "49"], "too few for a train size of 49"),
    (["--train-size", "0"], "must be at least 1"),
])
def test_predict_eval_bad_input_exit_2(capsys, args, message):
    table = os.path.join(ZEUS, "tables", "v100_squad_bert_base_uncased.csv")
    assert_exit_2(capsys, ["predict-eval", table, *args], message)


def assert_exit_2(capsys, argv, message):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit from the parser
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_predict_eval_bad_table_exit_2(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("10.5", ""))
    assert_exit_2(capsys, ["predict-eval", path, "--train-size", "3"], "missing value in column power_w")


ZEUS_POWER = """dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power
toy,net,8,sgd,100,20.0,90
toy,net,8,sgd,150,15.0,120
toy,net,16,sgd,100,12.0,95
toy,net,16,sgd,150,9.0,130
toy,net,32,sgd,100,8.0,99
toy,net,32,sgd,150,6.0,140
toy,net,8,adam,100,21.0,91
"""
ZEUS_TRAIN = """dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch
toy,net,8,sgd,0.1,1,0.5,4
toy,net,8,sgd,0.1,2,0.5,6
toy,net,8,sgd,0.1,3,0.5,nan
toy,net,16,sgd,0.1,1,0.5,nan
toy,net,16,sgd,0.1,2,0.5,nan
toy,net,16,sgd,0.1,3,0.5,7
toy,net,16,sgd,0.1,1,0.7,nan
"""


def test_import_zeus_writes_tables_and_reports_unreached(tmp_path, capsys):
    power, train = write(tmp_path, ZEUS_POWER, "summary_power_x1.csv"), write(tmp_path, ZEUS_TRAIN, "train.csv")
    out = tmp_path / "tables"
    assert main(["trace", "import-zeus", power, train, "--out", str(out), "--target", "toy=0.5"]) == 0
    text = capsys.readouterr().out
    t = load_table(out / "x1_toy_net.csv")
    assert t.knobs == ("power_limit",) and len(t) == 6
    by_batch = {int(b): e for b, e in zip(t.batch_size, t.epochs_to_target)}
    assert by_batch[8] == 6.0  # median of 4, 6, never
    assert math.isinf(by_batch[16])  # 2 of 3 never reached
    assert math.isnan(by_batch[32])  # no runs at all
    assert "batch size 8: 1 of 3 runs never reached 0.5 (median 6 epochs)" in text
    assert "batch size 16: 2 of 3 runs never reached 0.5 (epochs_to_target = inf)" in text
    assert "batch size(s) 32: measured for power but no convergence runs" in text
    assert "optimizer adam: hardware-only table" in text
    assert load_table(out / "x1_toy_net_adam.csv").epochs_to_target is None


def test_import_zeus_bad_input(tmp_path, capsys):
    power, train = write(tmp_path, ZEUS_POWER, "summary_power_x1.csv"), write(tmp_path, ZEUS_TRAIN, "train.csv")
    out = str(tmp_path / "o")
    assert_exit_2(capsys, ["trace", "import-zeus", power, train, "--out", out], "no target for dataset 'toy'")
    assert_exit_2(capsys, ["trace", "import-zeus", power, train, "--out", out, "--target", "toy=0.9"],
                  "no run records target 0.9; targets in the data: 0.5, 0.7")
    assert_exit_2(capsys, ["trace", "import-zeus", power, train, "--out", out, "--target", "toy"],
                  "expected DATASET=VALUE")
    assert_exit_2(capsys, ["trace", "import-zeus", train, train, "--out", out], "not a Zeus power summary")


def test_real_zeus_tables_load():
    names = sorted(os.listdir(os.path.join(ZEUS, "tables")))
    assert len([n for n in names if n.endswith(".csv")]) == 13
    t = load_table(os.path.join(ZEUS, "tables", "v100_imagenet_resnet50.csv"))
    assert t.knob_values("power_limit") == [100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0]
    assert math.isinf(t.epochs_to_target[t.batch_size == 64][0])
