"""Measurement tables: the CSV format, its validation (one clear line per problem) and round trips."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from edgetune.cli import main
from edgetune.power.knobs import KnobRole
from edgetune.tables import (
    DEFAULT_POWER_CV,
    DEFAULT_TIME_CV,
    Table,
    TableError,
    check_train_size,
    load_table,
    save_table,
)

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
    (lambda s: s.replace("9.2e8,64,0.118,12.4,13.9,inf", "6.1e8,64,0.118,12.4,13.9,12"),
     "epochs_to_target differs between the repeats of gpu_freq=6.1e\\+08, batch_size=64"),
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


SWEEP_WITH_OOM = """gpu_freq_mhz,batch_size,step_time_s,power_w
306,16,0.10,5.0
624,16,0.06,7.0
306,32,0.18,5.5
624,32,OOM,
306,64,CUDA OOM,OOM
624,64,0.31,
624,64,out of memory,
624,32,0.11,8.0
"""


def test_a_sweep_that_ran_out_of_memory_keeps_its_measured_rows_and_records_the_rest(tmp_path, caplog):
    # sweep scripts write OOM where a batch did not fit: those settings are no rows (nothing was measured)
    # but the table remembers them; a setting with a repeat that ran is measured
    text = SWEEP_WITH_OOM.replace("624,64,0.31,\n", "")
    with caplog.at_level("INFO", logger="edgetune.tables.csvio"):
        t = load_table(write(tmp_path, text))
    assert len(t) == 4 and t.batch_sizes == [16, 32]
    assert t.out_of_memory == ((306e6, 64.0), (624e6, 64.0))
    assert t.ran_out_of_memory({"gpu_freq": 624e6}, 64) and not t.ran_out_of_memory({"gpu_freq": 624e6}, 32)
    assert t.find({"gpu_freq": 624e6}, 32) is not None and t.power_w[t.find({"gpu_freq": 624e6}, 32)] == 8.0
    assert "line 5 records out of memory where a repeat of the setting ran" in caplog.text
    out = tmp_path / "copy.csv"
    save_table(t, out)
    assert out.read_text().splitlines()[-1] == "624000000,64,OOM,OOM"
    assert load_table(out).out_of_memory == t.out_of_memory
    # a missing power that is not marked is still a missing value; a table of nothing but OOM is refused
    with pytest.raises(TableError, match="line 7: missing value in column power_w"):
        load_table(write(tmp_path, SWEEP_WITH_OOM))
    with pytest.raises(TableError, match="every row records out of memory: nothing was measured"):
        load_table(write(tmp_path, "gpu_freq_mhz,batch_size,step_time_s,power_w\n306,64,OOM,\n"))
    with pytest.raises(TableError, match="'n/a' is not a number; fix it, or drop the row .* may say OOM"):
        load_table(write(tmp_path, text.replace("CUDA OOM,OOM", "n/a,5.9")))


def test_train_size_must_leave_rows_to_evaluate(tmp_path):
    t = load_table(write(tmp_path, GOOD))
    check_train_size(t, 5)
    with pytest.raises(TableError, match="too few for a train size of 6"):
        check_train_size(t, 6)


def test_predict_eval_cli_prints_the_summary_line(tmp_path, capsys):
    table = os.path.join(ZEUS, "tables", "v100_squad_bert_base_uncased.csv")
    assert main(["predict-eval", table, "--train-size", "10", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    last = lines[-1]
    # the doubt, as shares of the held-out rows: the refits' spread never narrows it
    doubt = lines[-2]
    assert doubt.startswith("held-out rows within 2 predicted std"), doubt
    gp, spread = (int(v.rstrip("%,")) for v in (doubt.split("time ")[1].split()[0], doubt.split("time ")[2].split()[0]))
    assert 0 <= gp <= spread <= 100
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


@pytest.mark.parametrize("value", ["0", "-100"])
def test_predict_eval_on_a_knob_the_model_cannot_take_is_one_line(tmp_path, capsys, value):
    # a table holds any finite knob value (a fan level 0, a clock offset -100 MHz); the hardware model takes
    # positive ones only, and its ValueError went out as a traceback
    rows = "\n".join(f"{k},{b},{0.01 * (2 + i) * b / 8:.4f},{5 + i + b / 16:.3f}"
                      for i, k in enumerate((value, "1", "2")) for b in (8, 16, 32))
    path = write(tmp_path, f"fan_level,batch_size,step_time_s,power_w\n{rows}\n")
    assert_exit_2(capsys, ["predict-eval", path, "--train-size", "6"],
                  f"line 2: fan_level = {value}; the hardware model takes positive knob values only")


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
    by_batch = {int(b): (e, r, f) for b, e, r, f in zip(t.batch_size, t.epochs_to_target, t.convergence_runs,
                                                         t.convergence_failures)}
    assert by_batch[8] == (5.0, 3, 1)  # 2 of 3 reached (a majority): the median of their 4 and 6 epochs
    assert math.isinf(by_batch[16][0]) and by_batch[16][1:] == (3, 2)  # only 1 of 3 reached: not a majority
    assert all(math.isnan(v) for v in by_batch[32])  # no runs at all
    assert t.default_batch_size is None  # toy is no Zeus workload: no default to declare
    assert "batch size 8: 1 of 3 runs never reached 0.5 (median 5 epochs over the 2 that did)" in text
    assert "batch size 16: 2 of 3 runs never reached 0.5 (epochs_to_target = inf: at most half reached it)" in text
    assert "batch size(s) 32: measured for power but no convergence runs" in text
    assert "optimizer adam: hardware-only table" in text
    assert load_table(out / "x1_toy_net_adam.csv").epochs_to_target is None


def test_import_zeus_reads_summaries_saved_with_a_byte_order_mark(tmp_path, capsys):
    """Excel saves CSV with a BOM: it made the first column \ufeffdataset and the file \"not a Zeus summary\"."""
    for name, text in (("summary_power_x1.csv", ZEUS_POWER), ("train.csv", ZEUS_TRAIN)):
        (tmp_path / name).write_text(text, encoding="utf-8-sig")
    out = tmp_path / "tables"
    assert main(["trace", "import-zeus", str(tmp_path / "summary_power_x1.csv"), str(tmp_path / "train.csv"),
                 "--out", str(out), "--target", "toy=0.5"]) == 0
    assert len(load_table(out / "x1_toy_net.csv")) == 6


def test_import_zeus_never_overwrites_a_table_unless_forced(tmp_path, capsys):
    power, train = write(tmp_path, ZEUS_POWER, "summary_power_x1.csv"), write(tmp_path, ZEUS_TRAIN, "train.csv")
    out = tmp_path / "tables"
    out.mkdir()
    (out / "x1_toy_net_adam.csv").write_text("an earlier table\n")
    args = ["trace", "import-zeus", power, train, "--out", str(out), "--target", "toy=0.5"]
    assert_exit_2(capsys, args, f"{out / 'x1_toy_net_adam.csv'} exists")
    assert sorted(os.listdir(out)) == ["x1_toy_net_adam.csv"]  # all or none: the other table is not written
    assert (out / "x1_toy_net_adam.csv").read_text() == "an earlier table\n"
    assert main([*args, "--force"]) == 0
    capsys.readouterr()
    assert load_table(out / "x1_toy_net_adam.csv").epochs_to_target is None
    assert main(args) == 2  # both there now
    assert "(and 1 more of the 2 tables)" in capsys.readouterr().err


def test_import_zeus_bad_input(tmp_path, capsys):
    power, train = write(tmp_path, ZEUS_POWER, "summary_power_x1.csv"), write(tmp_path, ZEUS_TRAIN, "train.csv")
    out = str(tmp_path / "o")
    assert_exit_2(capsys, ["trace", "import-zeus", power, train, "--out", out], "no target for dataset 'toy'")
    assert_exit_2(capsys, ["trace", "import-zeus", power, train, "--out", out, "--target", "toy=0.9"],
                  "no run records target 0.9; targets in the data: 0.5, 0.7")
    assert_exit_2(capsys, ["trace", "import-zeus", power, train, "--out", out, "--target", "toy"],
                  "expected DATASET=VALUE")
    assert_exit_2(capsys, ["trace", "import-zeus", train, train, "--out", out], "not a Zeus power summary")


@pytest.mark.parametrize("size", ["0", "-5"])
def test_import_zeus_refuses_a_size_below_one_in_one_line(tmp_path, capsys, size):
    power, train = write(tmp_path, ZEUS_POWER, "summary_power_x1.csv"), write(tmp_path, ZEUS_TRAIN, "train.csv")
    out = tmp_path / "o"
    args = ["trace", "import-zeus", power, train, "--out", str(out), "--target", "toy=0.5"]
    assert_exit_2(capsys, [*args, "--samples-per-epoch", f"toy={size}"],
                  f"--samples-per-epoch toy={size}: a training-set size must be a whole number of samples, at least 1")
    assert not out.exists()  # nothing written


def test_import_zeus_pair_errors_show_a_valid_example(tmp_path, capsys):
    power, train = write(tmp_path, ZEUS_POWER, "summary_power_x1.csv"), write(tmp_path, ZEUS_TRAIN, "train.csv")
    args = ["trace", "import-zeus", power, train, "--out", str(tmp_path / "o")]
    assert_exit_2(capsys, [*args, "--samples-per-epoch", "toy=abc"], "e.g. --samples-per-epoch squad=87599")
    assert_exit_2(capsys, [*args, "--target", "toy"], "e.g. --target cifar100=0.6")
    for value in ("nan", "inf"):  # a target no run can match is refused at the flag, not later
        assert_exit_2(capsys, [*args, "--target", f"toy={value}"], "a quality target must be a finite number")
    assert not (tmp_path / "o").exists()
    example = "squad=87599"
    assert main([*args, "--target", "toy=0.5", "--samples-per-epoch", example.replace("squad", "toy")]) == 0
    assert load_table(tmp_path / "o" / "x1_toy_net.csv").samples_per_epoch[0] == 87599  # the example is valid


def test_real_zeus_tables_load():
    names = sorted(os.listdir(os.path.join(ZEUS, "tables")))
    assert len([n for n in names if n.endswith(".csv")]) == 13
    t = load_table(os.path.join(ZEUS, "tables", "v100_imagenet_resnet50.csv"))
    assert t.knob_values("power_limit") == [100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0]
    assert t.roles == {"power_limit": KnobRole.POWER_LIMIT}
    assert math.isinf(t.epochs_to_target[t.batch_size == 64][0])
    assert t.convergence_failures[t.batch_size == 64][0] == t.convergence_runs[t.batch_size == 64][0] == 4


@pytest.mark.parametrize("gpu", ["v100", "a40"])
def test_shipped_zeus_tables_declare_zeus_defaults_and_the_finite_median(gpu):
    defaults = {}
    for name in sorted(os.listdir(os.path.join(ZEUS, "tables"))):
        if name.startswith(gpu) and not name.endswith("_adam.csv"):
            t = load_table(os.path.join(ZEUS, "tables", name))
            defaults[name.split("_")[1]] = t.default_batch_size
            assert t.default_batch_size in t.batch_sizes
    # Zeus's run_alibaba.py defaults, LibriSpeech's 256 capped at the traces' largest batch (192)
    assert defaults == {"cifar100": 1024, "imagenet": 256, "librispeech": 192, "movielens-1m": 1024,
                        "squad": 32, "sentiment140": 128}
    t = load_table(os.path.join(ZEUS, "tables", f"{gpu}_cifar100_shufflenetv2.csv"))
    at_4096 = t.batch_size == 4096
    # 4 of 5 seeds reached 0.6 (a median of 477 epochs); counting the failure as infinite gave 498
    assert t.epochs_to_target[at_4096][0] == 477.0
    assert (t.convergence_runs[at_4096][0], t.convergence_failures[at_4096][0]) == (5, 1)


def test_shipped_zeus_tables_are_what_import_zeus_makes_now(tmp_path, capsys):
    for gpu in ("v100", "a40"):
        assert main(["trace", "import-zeus", os.path.join(ZEUS, f"summary_power_{gpu}.csv"),
                     os.path.join(ZEUS, "summary_train.csv"), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    for name in sorted(os.listdir(tmp_path)):
        with open(tmp_path / name) as made, open(os.path.join(ZEUS, "tables", name)) as shipped:
            assert made.read() == shipped.read(), name


# ------------------------------------------------------------------------------------- table format v2

SWEEP = os.path.join(os.path.dirname(__file__), "data", "orin_nano_clock_sweep.csv")

REPEATED = """# a fixed-batch clock sweep, two passes
gpu_clock_mhz,emc_freq_mhz,cpu_freq_khz,online_cores,step_time_s,power_w
306,2133,1497600,6,0.100,6.0
624.75,2133,1497600,6,0.060,9.0
306,2133,1497600,6,0.104,6.2
624.75,2133,1497600,6,0.060,9.0
306,2133,1497600,6,0.102,6.4
"""


def test_knob_columns_map_to_registry_roles_in_registry_units(tmp_path):
    t = load_table(write(tmp_path, REPEATED))
    assert t.knobs == ("gpu_freq", "emc_freq", "cpu_freq", "cpu_cores")
    assert t.roles == {"gpu_freq": KnobRole.GPU_CLOCK, "emc_freq": KnobRole.MEMORY_CLOCK,
                       "cpu_freq": KnobRole.CPU_CLOCK, "cpu_cores": KnobRole.CPU_CORES}
    assert t.knob_values("gpu_freq") == [306e6, 624.75e6]  # MHz -> Hz, whole Hz
    assert t.knob_values("emc_freq") == [2133e6] and t.knob_values("cpu_freq") == [1497600.0]  # kHz stays
    text = "power_limit_mw,vendor_knob,batch_size,step_time_s,power_w\n150000,1,8,0.2,140\n225500,2,8,0.15,199\n"
    u = load_table(write(tmp_path, text, "pl.csv"))
    assert u.knobs == ("power_limit", "vendor_knob") and u.roles == {"power_limit": KnobRole.POWER_LIMIT}
    assert u.knob_values("power_limit") == [150.0, 225.5]  # mW -> W; a knob with no role stays as it is


@pytest.mark.parametrize("header", ["\ufeffgpu_freq_mhz,power_limit_w", "gpu_freq (MHz),power_limit (W)",
                                    "gpu_freq [MHz],Power_Limit [mW]", "\ufeffGPU_Clock ( MHz ),power_limit(W)",
                                    "gpu (MHz),power_limit [W]"])
def test_a_byte_order_mark_or_a_unit_in_brackets_reads_as_the_suffix_does(tmp_path, header):
    """Excel's CSV starts with a byte-order mark, and spreadsheets write units in brackets: both used to turn
    the column into a knob with no role, its values unconverted."""
    per_w = 1000 if "mW" in header else 1  # the same limits, 150 and 225.5 W, in the column's unit
    t = load_table(write(tmp_path, f"{header},batch_size,step_time_s,power_w\n306,{150 * per_w},8,0.1,6\n"
                                   f"624.75,{225.5 * per_w:g},8,0.06,9\n"))
    assert t.knobs == ("gpu_freq", "power_limit")
    assert t.roles == {"gpu_freq": KnobRole.GPU_CLOCK, "power_limit": KnobRole.POWER_LIMIT}
    assert t.knob_values("gpu_freq") == [306e6, 624.75e6]  # MHz -> Hz
    assert t.knob_values("power_limit") == pytest.approx([150, 225.5])


def test_knob_headers_written_with_spaces_as_jtop_and_spreadsheets_do_map_to_their_roles(tmp_path):
    """``GPU freq (MHz)`` (jtop's and most spreadsheets' spelling) used to be a knob with no role, named
    'GPU freq (MHz)', its MHz values unconverted: the search lost the clock's physics and its baseline."""
    t = load_table(write(tmp_path, "GPU freq (MHz),EMC Freq (MHz),CPU-clock [kHz],batch_size,step_time_s,power_w\n"
                                   "522.75,2133,1497600,16,0.114,19.5\n1300.5,3199,1497600,16,0.052,53.5\n"))
    assert t.knobs == ("gpu_freq", "emc_freq", "cpu_freq")
    assert t.roles == {"gpu_freq": KnobRole.GPU_CLOCK, "emc_freq": KnobRole.MEMORY_CLOCK,
                       "cpu_freq": KnobRole.CPU_CLOCK}
    assert t.knob_values("gpu_freq") == [522.75e6, 1300.5e6] and t.knob_values("emc_freq") == [2133e6, 3199e6]


# Orin AGX, ResNet-50 at 1300.5 MHz GPU / 3199 MHz EMC (published_measurements.md), the GPU clock swept
ORIN_ROWS = [(522.75, 16, 0.1138, 19.48), (1300.5, 16, 0.0516, 53.5), (522.75, 64, 0.4225, 21.3),
             (1300.5, 64, 0.1916, 55.4)]


def orin_table(header: str, cell=lambda g, b, t, p: (g, b, t, p)) -> str:
    return header + "\n" + "".join(",".join(map(str, cell(*r))) + "\n" for r in ORIN_ROWS)


@pytest.mark.parametrize("name", ["bs", "BS", "batch", "Batch Size", "Batch_Size", "batchsize", "batch-size "])
def test_a_batch_size_column_spelled_as_people_write_it_is_the_batch_size(tmp_path, name):
    """``bs`` used to be a knob with no role: the table became a fixed-batch sweep whose search reported
    'batch 128, ..., bs=1' and a 16.85x speedup over a baseline at 'batch 128, bs=64'."""
    t = load_table(write(tmp_path, orin_table(f"gpu_freq_mhz,{name},step_time_s,power_w")))
    assert t.knobs == ("gpu_freq",) and t.batch_sizes == [16, 64]
    assert list(t.batch_size) == [16, 16, 64, 64]


@pytest.mark.parametrize("header, cell", [
    ("gpu_freq_mhz,batch_size,step_time_s,power (mW)", lambda g, b, t, p: (g, b, t, round(p * 1000))),
    ("gpu_freq_mhz,batch_size,step_time_s,power_mw", lambda g, b, t, p: (g, b, t, round(p * 1000))),
    ("gpu_freq_mhz,batch_size,step_time_s,Power [W]", lambda g, b, t, p: (g, b, t, p)),
    ("gpu_freq_mhz,batch_size,Step_Time_S,Power_W", lambda g, b, t, p: (g, b, t, p)),
    ("gpu_freq_mhz,batch_size,step_time_ms,avg_power_w", lambda g, b, t, p: (g, b, round(t * 1000, 1), p)),
    ("GPU freq (MHz),bs,Step time (ms),Power (W)", lambda g, b, t, p: (g, b, round(t * 1000, 1), p)),
    ("# edgetune: column VDD_IN=power_mw, column time_ms=step_time_ms\ngpu_freq_mhz,batch_size,time_ms,VDD_IN",
     lambda g, b, t, p: (g, b, round(t * 1000, 1), round(p * 1000))),
])
def test_a_measured_column_with_its_unit_is_converted(tmp_path, header, cell):
    """A power in mW or a step time in ms named with its unit used to be refused as 'not a power limit' or
    become a knob with no role; declaring ``column VDD_IN=power_w`` on tegrastats' mW read 14687 W."""
    t = load_table(write(tmp_path, orin_table(header, cell)))
    assert t.knobs == ("gpu_freq",) and t.batch_sizes == [16, 64]
    np.testing.assert_allclose(t.power_w, [r[3] for r in ORIN_ROWS], rtol=1e-12)
    np.testing.assert_allclose(t.step_time(), [r[2] for r in ORIN_ROWS], rtol=1e-12)


def test_an_epoch_time_in_minutes_is_converted_to_seconds(tmp_path):
    t = load_table(write(tmp_path, "power_limit_w,batch_size,time_per_epoch (min),power_w\n100,32,50,99.8\n"
                                   "250,32,26.5,225.9\n"))
    np.testing.assert_allclose(t.time_per_epoch_s, [3000.0, 1590.0])


@pytest.mark.parametrize("header, message", [
    ("gpu_freq_mhz,batch_size,step_time_s,power", ("column 'power' gives no unit; name it power_<unit> or "
                                                   "'power (<unit>)' with a unit of w, mw, kw (it is converted into "
                                                   "power_w)")),
    ("gpu_freq_mhz,batch_size,step_time,power_w", "column 'step_time' gives no unit; name it step_time_<unit>"),
    ("gpu_freq_mhz,batch_size,step_time (W),power_w", ("column 'step_time (W)' gives unit 'w', which edgetune "
                                                       "does not read there")),
])
def test_a_measured_column_without_a_unit_it_can_read_is_one_line(tmp_path, header, message):
    with pytest.raises(TableError, match=re.escape(message)) as info:
        load_table(write(tmp_path, orin_table(header)))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name, cell, message", [
    ("throughput", lambda g, b, t, p: round(b / t, 1), ("column 'throughput' reads as a measurement (throughput), "
     "not a knob you set: the step time goes in step_time_s (= batch_size / throughput in samples/s); drop it "
     "with '# edgetune: column throughput=ignore'")),
    ("samples/s", lambda g, b, t, p: round(b / t, 1), "column 'samples/s' reads as a measurement"),
    ("Temp GPU", lambda g, b, t, p: 48.5, "column 'Temp GPU' reads as a measurement (temp)"),
    ("GPU util (%)", lambda g, b, t, p: 99, "column 'GPU util (%)' reads as a measurement (util)"),
    ("run", lambda g, b, t, p: 1, ("column 'run' reads as a measurement (run), not a knob you set: an index of "
     "the measurement is not a setting (repeated rows of one setting are aggregated without it)")),
    ("Power TOT", lambda g, b, t, p: round(p * 1000), ("the mean power goes in power_w or power_mw (or declare "
     "'# edgetune: column Power TOT=power_mw')")),
    ("GPU", lambda g, b, t, p: 99, ("column 'GPU' names no knob: a clock? name it with its unit (gpu_freq_mhz, "
     "...); a load? drop it with '# edgetune: column GPU=ignore'")),
])
def test_a_measured_column_is_refused_as_a_knob_in_one_line(tmp_path, capsys, name, cell, message):
    """A throughput, a temperature, a utilization or a run index beside step_time_s used to be a knob with no
    role: each row a setting of its own (repeats never aggregated), the hardware model fitted on the measured
    throughput itself (predict-eval: 5.26% time MAPE, as good as the table without it), best.json's plan
    setting 'throughput'."""
    path = write(tmp_path, orin_table(f"gpu_freq_mhz,batch_size,step_time_s,power_w,{name}",
                                      lambda *r: (*r, cell(*r))))
    with pytest.raises(TableError, match=re.escape(message)) as info:
        load_table(path)
    assert "\n" not in str(info.value)
    assert_exit_2(capsys, ["predict-eval", path, "--train-size", "2"], message)
    declared = write(tmp_path, f"# edgetune: column {name}=ignore\n" + (tmp_path / "t.csv").read_text(), "ignored.csv")
    assert load_table(declared).knobs == ("gpu_freq",)


@pytest.mark.parametrize("header, cell, message", [
    ("GR3D_FREQ,batch_size,step_time_s,power_w", lambda g, b, t, p: (g, b, t, p),
     ("line 2: GR3D_FREQ reads as 522.75 Hz, no gpu clock runs at that: give the column its unit: name it "
     "gpu_freq_mhz (or _ghz, _khz, _hz), or declare '# edgetune: column GR3D_FREQ=gpu_freq_mhz'")),
    ("gpu_freq_khz,batch_size,step_time_s,power_w", lambda g, b, t, p: (g * 1e6, b, t, p),
     ("line 2: gpu_freq_khz reads as 5.2275e+11 Hz, no gpu clock runs at that: its values are not in the unit the "
      "header gives; name the column with the unit they are in (gpu_freq_mhz, _ghz, _khz or _hz)")),
    ("cpu_freq,batch_size,step_time_s,power_w", lambda g, b, t, p: (2201.6, b, t, p),
     "line 2: cpu_freq reads as 2201.6 kHz (2.2016e+06 Hz)"),
    ("# edgetune: column VDD_IN=power_w\ngpu_freq_mhz,batch_size,step_time_s,VDD_IN",
     lambda g, b, t, p: (g, b, t, round(p * 1000)), ("line 3: VDD_IN = 19480 W, more than a board draws (2000 W): "
     "a power in milliwatts? name the column power_mw (or declare '# edgetune: column VDD_IN=power_mw')")),
    ("gpu_freq_mhz,batch_size,step_time_s,power_w,peak_power_w", lambda g, b, t, p: (g, b, t, p, p * 1300),
     ("line 2: peak_power_w = 25324 W, more than a board draws (2000 W): a power in milliwatts? name the column "
     "peak_power_mw")),
    ("gpu_freq_mhz,batch_size,step_time_s,power_w,power_limit_w", lambda g, b, t, p: (g, b, t, p, 60000),
     ("line 2: power_limit_w = 60000 W, more than a board draws (2000 W): a limit in milliwatts? name the column "
     "power_limit_mw")),
])
def test_a_clock_or_power_in_another_unit_than_its_column_says_is_one_line(tmp_path, capsys, header, cell,
                                                                           message):
    """tegrastats' GR3D_FREQ in MHz (an alias of gpu_freq, in Hz) used to load as a 522.75 Hz GPU clock, and a
    declared 'column VDD_IN=power_w' over its milliwatts as 19480 W: silently, into the search and its plan."""
    path = write(tmp_path, orin_table(header, cell))
    with pytest.raises(TableError, match=re.escape(message)) as info:
        load_table(path)
    assert "\n" not in str(info.value)
    assert_exit_2(capsys, ["search", "--device", f"trace:{path}", "--budget", "30", "--output",
                           str(tmp_path / "o")], message)
    assert not (tmp_path / "o").exists()


def test_a_power_over_what_a_board_draws_loads_where_its_column_is_in_kilowatts(tmp_path):
    """The milliwatts check must leave a way for a machine that truly draws more than 2 kW (a node of eight
    GPUs): its power in kilowatts."""
    t = load_table(write(tmp_path, orin_table("gpu_freq_mhz,batch_size,step_time_s,power_kw,peak_power_kw",
                                              lambda g, b, t, p: (g, b, t, p / 5.0, p / 4.0))))
    watts = [p * 1000.0 / 5.0 for *_, p in ORIN_ROWS]
    assert sorted(t.power_w) == pytest.approx(sorted(watts)) and min(watts) > 2000.0
    assert all(t.peak_power_w > t.power_w)


@pytest.mark.parametrize("sep, decimal, eol", [(";", ",", "\r\n"), (";", ".", "\n"), ("\t", ".", "\r\n"),
                                             ("\t", ",", "\n")])
def test_a_table_saved_with_semicolons_or_tabs_and_decimal_commas_reads_the_same(tmp_path, sep, decimal, eol):
    """A spreadsheet in a locale with a decimal comma saves 'gpu_freq_mhz;...' and '0,1138': the whole header
    used to be one column name, refused as 'holds a power (unit suffix _w) but is not a power limit'."""
    text = orin_table(sep.join(["# Orin AGX;ResNet-50\ngpu_freq_mhz", "batch_size", "step_time_s", "power_w"]))
    text = text.replace(",", sep).replace(".", decimal).replace("\n", eol)
    t = load_table(write(tmp_path, text))
    assert t.knob_values("gpu_freq") == [522.75e6, 1300.5e6] and t.batch_sizes == [16, 64]
    np.testing.assert_allclose(t.step_time_s, [r[2] for r in ORIN_ROWS], rtol=1e-12)
    np.testing.assert_allclose(t.power_w, [r[3] for r in ORIN_ROWS], rtol=1e-12)


def test_a_dot_in_a_table_with_decimal_commas_is_refused_as_ambiguous(tmp_path):
    text = "gpu_freq_mhz;batch_size;step_time_s;power_w\n1.300;16;0,0516;53,5\n522,75;16;0,1138;19,48\n"
    with pytest.raises(TableError, match=re.escape("line 2: gpu_freq_mhz = '1.300' in a table written with decimal "
                                                   "commas: a '.' there may be a thousands separator; write the "
                                                   "number without it")):
        load_table(write(tmp_path, text))


@pytest.mark.parametrize("cells, message", [
    ("failed,", ("line 4: step_time_s = 'failed' is not a number; fix it, or drop the row (a setting that failed "
     "has no row; one that ran out of memory may say OOM)")),
    ("NaN,", "line 4: step_time_s = 'NaN' is not a finite number; fix it or drop the row"),
    (",", "line 4: missing value in column step_time_s; fill it in or drop the row"),
])
def test_a_row_that_did_not_run_names_its_line_and_the_fix(tmp_path, capsys, cells, message):
    text = "gpu_freq_mhz,batch_size,step_time_s,power_w\n522.75,16,0.1138,19.48\n1300.5,16,0.0516,53.5\n" \
           f"1300.5,128,{cells}\n"
    assert_exit_2(capsys, ["predict-eval", write(tmp_path, text), "--train-size", "2"], message)


def test_a_column_name_twice_in_the_header_is_named(tmp_path):
    with pytest.raises(TableError, match=re.escape("column 'power_w' appears twice in the header; keep one, or "
                                                   "rename the other")):
        load_table(write(tmp_path, "gpu_freq_mhz,batch_size,step_time_s,power_w,power_w \n522.75,16,0.11,19,21\n"))


@pytest.mark.parametrize("rows", [1, 2])
def test_predict_eval_on_a_table_too_small_to_evaluate_says_so(tmp_path, capsys, rows):
    """A one-row table was told 'use --train-size 2 or less', which cannot work either."""
    path = write(tmp_path, orin_table("gpu_freq_mhz,batch_size,step_time_s,power_w").rsplit("\n", 5 - rows)[0])
    assert len(load_table(path)) == rows
    assert_exit_2(capsys, ["predict-eval", path, "--train-size", "2"],
                  f"has {rows} row{'s' if rows > 1 else ''}, too few to evaluate a model on: it needs at least 3 "
                  f"(2 to fit, 1 held out); measure more settings")


def test_a_unit_in_brackets_on_a_knob_with_no_role_stays_its_name(tmp_path):
    t = load_table(write(tmp_path, "fan (rpm),cpu_cores (cores),step_time_s,power_w\n700,4,0.1,6\n900,6,0.1,7\n"))
    assert t.knobs == ("fan (rpm)", "cpu_cores") and t.roles == {"cpu_cores": KnobRole.CPU_CORES}


def test_repeats_are_aggregated_with_their_spread_and_survive_a_round_trip(tmp_path):
    t = load_table(write(tmp_path, REPEATED))
    assert len(t) == 2 and t.batch_size is None and t.batch_sizes == []
    slow = t.find({"gpu_freq": 306e6, "emc_freq": 2133e6, "cpu_freq": 1497600, "cpu_cores": 6}, None)
    assert slow == 0  # rows keep the order of first appearance
    assert t.step_time_s[0] == 0.102 and t.power_w[0] == pytest.approx(6.2)  # medians of the three passes
    assert list(t.repeats) == [3, 2]
    assert t.time_cv[0] == pytest.approx(np.std([0.100, 0.104, 0.102], ddof=1) / 0.102, rel=1e-3)
    assert t.power_cv[0] == pytest.approx(0.2 / 6.2, rel=1e-3) and t.power_cv[1] == 0.0
    out = tmp_path / "saved.csv"
    save_table(t, out)
    assert out.read_text().splitlines()[1] == "gpu_freq,emc_freq,cpu_freq,cpu_cores,step_time_s,power_w,repeats," \
                                              "time_cv,power_cv"
    u = load_table(out)
    for name in ("settings", "step_time_s", "power_w", "repeats", "time_cv", "power_cv"):
        np.testing.assert_array_equal(getattr(u, name), getattr(t, name))
    assert u.batch_size is None and u.notes == t.notes


def test_a_sweep_without_batch_size_needs_a_declared_one_only_where_the_batch_matters(tmp_path):
    t = load_table(write(tmp_path, REPEATED))
    np.testing.assert_array_equal(t.step_time(), t.step_time_s)  # step times need no batch size
    with pytest.raises(TableError, match="no batch_size column; declare the batch the sweep ran at with "
                                         "'# edgetune: default_batch_size=<B>'") as info:
        t.features()
    assert "\n" not in str(info.value)
    d = load_table(write(tmp_path, "# edgetune: default_batch_size=64\n" + REPEATED, "d.csv"))
    assert d.default_batch_size == 64 and d.batch_sizes == [64]
    assert d.features()[1]["batch_size"] == 64.0


def test_declarations_map_rename_and_drop_columns_and_set_the_spread(tmp_path):
    text = ("# from a colleague's board\n"
            "# edgetune: column clk=gpu_clock_mhz, column avg_w=power_w, column temp_c=ignore\n"
            "# edgetune: default_batch_size=32, sensor_period_s=0.1\n"
            "# edgetune: default_time_cv=0.05\n"
            "clk,batch_size,step_time_s,avg_w,temp_c\n"
            "500,32,0.2,7.0,51\n"
            "800,32,0.15,9.0,55\n")
    t = load_table(write(tmp_path, text))
    assert t.knobs == ("gpu_freq",) and t.knob_values("gpu_freq") == [500e6, 800e6]
    np.testing.assert_array_equal(t.power_w, [7.0, 9.0])
    assert t.notes == ("from a colleague's board",)
    assert (t.default_batch_size, t.declared.sensor_period_s, t.declared.default_time_cv) == (32, 0.1, 0.05)
    s = t.spread()  # no repeats: time from the declaration, power from the Zeus-derived default
    np.testing.assert_array_equal(s.time_cv, [0.05, 0.05])
    np.testing.assert_array_equal(s.power_cv, [DEFAULT_POWER_CV] * 2)
    out = tmp_path / "saved.csv"
    save_table(t, out)
    assert load_table(out).declared == t.declared


def test_rows_without_repeats_take_the_tables_repeated_spread(tmp_path):
    text = REPEATED + "408,2133,1497600,6,0.08,7.5\n"
    s = load_table(write(tmp_path, text)).spread()
    own = load_table(write(tmp_path, REPEATED, "r.csv")).time_cv
    assert s.time_cv[2] == pytest.approx(np.median(own))  # the single row: the median of the repeated ones
    assert "2 of 3 rows from their repeats" in s.source
    plain = load_table(write(tmp_path, GOOD, "g.csv")).spread()
    assert set(plain.time_cv) == {DEFAULT_TIME_CV} and set(plain.power_cv) == {DEFAULT_POWER_CV}


def test_default_spread_is_the_zeus_traces_non_binding_power_limits():
    """DEFAULT_TIME_CV / DEFAULT_POWER_CV, recomputed: rows whose power limit is >= 1.5x their measured
    power are repeats of one unconstrained setting; the median CV over groups of >= 3 such rows."""
    import csv

    time_cv, power_cv = [], []
    for gpu in ("v100", "a40"):
        groups: dict[tuple, list[tuple[float, float]]] = {}
        with open(os.path.join(ZEUS, f"summary_power_{gpu}.csv")) as f:
            for r in csv.DictReader(f):
                if float(r["power_limit"]) >= 1.5 * float(r["average_power"]):
                    key = (r["dataset"], r["optimizer"], r["batch_size"])
                    groups.setdefault(key, []).append((float(r["time_per_epoch"]), float(r["average_power"])))
        for rows in groups.values():
            if len(rows) >= 3:
                t, p = np.array(rows).T
                time_cv.append(np.std(t, ddof=1) / np.median(t))
                power_cv.append(np.std(p, ddof=1) / np.median(p))
    assert len(time_cv) == 44
    assert DEFAULT_TIME_CV == round(float(np.median(time_cv)), 3)
    assert DEFAULT_POWER_CV == round(float(np.median(power_cv)), 3)


def test_the_twin_clock_sweep_fixture_loads_as_a_sparse_repeated_fixed_batch_table():
    t = load_table(SWEEP)
    assert len(t) == 60 and set(t.repeats) == {3} and t.batch_size is None
    assert t.knobs == ("cpu_cores", "cpu_freq", "gpu_freq", "emc_freq") and len(t.roles) == 4
    assert t.declared.sensor_period_s == 0.0066
    # sparse: 60 of the 6 x 19 x 5 x 3 = 1,710 settings of the Orin Nano
    assert [len(t.knob_values(k)) for k in t.knobs] == [6, 19, 5, 3] and len(t) < 1710
    assert np.all(np.isfinite(t.time_cv)) and np.all(t.time_cv > 0) and np.all(t.power_cv > 0)


def test_predict_eval_on_a_sweep_without_batch_size_says_what_to_declare(tmp_path, capsys):
    assert_exit_2(capsys, ["predict-eval", SWEEP, "--train-size", "10"], "declare the batch the sweep ran at")
    declared = tmp_path / "sweep.csv"
    with open(SWEEP) as f:
        declared.write_text("# edgetune: default_batch_size=64\n" + f.read())
    assert main(["predict-eval", str(declared), "--train-size", "20", "--seed", "0"]) == 0
    last = capsys.readouterr().out.strip().splitlines()
    assert any("base model: frequency" in ln for ln in last)  # the roles reach the physics: not the generic model
    assert last[-1].startswith("time MAPE: ")


@pytest.mark.parametrize("text, message", [
    ("# edgetune: colour=blue\n" + GOOD, "line 1: unknown declaration 'colour'; known: default_batch_size"),
    ("# edgetune: default_batch_size\n" + GOOD, "declaration 'default_batch_size' is not key=value"),
    ("# edgetune: default_batch_size=0\n" + GOOD, "default_batch_size = '0' is not a positive whole number"),
    ("# edgetune: default_batch_size=12.5\n" + GOOD, "default_batch_size = '12.5' is not a positive whole"),
    ("# edgetune: sensor_period_s=fast\n" + GOOD, "sensor_period_s = 'fast' is not a number"),
    ("# edgetune: sensor_period_s=0\n" + GOOD, "sensor_period_s must be a positive number of seconds"),
    ("# edgetune: default_power_cv=-0.1\n" + GOOD, "default_power_cv must be a relative spread >= 0"),
    ("# edgetune: default_batch_size=8\n# edgetune: default_batch_size=16\n" + GOOD,
     "line 2: default_batch_size is declared twice"),
    ("# edgetune: column gpu=gpu_clock\n" + GOOD, "declares column gpu, which the header lacks"),
    ("# edgetune: column gpu_freq=fan_speed\n" + GOOD, "column gpu_freq=fan_speed: 'fan_speed' names no knob"),
    ("emc_freq_hz,mem_clock_mhz,step_time_s,power_w\n1e8,100,0.1,5\n", ("columns emc_freq_hz and mem_clock_mhz "
     "both hold the memory clock role; keep one, or drop the other with '# edgetune: column mem_clock_mhz=ignore'")),
    ("gpu_freq_hz,gpu_clk_mhz,step_time_s,power_w\n1e8,100,0.1,5\n", "two columns give 'gpu_freq'"),
    ("gpu_freq_w,step_time_s,power_w\n1,0.1,5\n", "a power suffix (_w) on gpu_freq (gpu_clock, unit Hz)"),
    ("cpu_cores_mhz,step_time_s,power_w\n1,0.1,5\n", "a frequency suffix (_mhz) on cpu_cores"),
    ("gpu_freq (rpm),step_time_s,power_w\n1,0.1,5\n", ("column 'gpu_freq (rpm)': edgetune reads no unit 'rpm' on "
     "gpu_freq; name the column 'gpu_freq (<unit>)' or gpu_freq_<unit> with a unit of ghz, mhz, khz, hz, or "
     "gpu_freq in Hz")),
    ("gpu_freq [W],step_time_s,power_w\n1,0.1,5\n", "a power suffix (_w) on gpu_freq (gpu_clock, unit Hz)"),
    ("cores (count),step_time_s,power_w\n1,0.1,5\n", ("edgetune reads no unit 'count' on cpu_cores; name the "
     "column cpu_cores")),
    ("vdd_in_mw,step_time_s,power_w\n5000,0.1,5\n", ("column 'vdd_in_mw' holds a power (unit suffix _mw) but is "
     "not a power limit")),
    ("power_mode,step_time_s,power_w\nMAXN,0.1,5\n", "power_mode = 'MAXN' is not a number"),
    ("gpu_freq,step_time_s,power_w,repeats\n1e8,0.1,5,2\n1e8,0.1,5,2\n", ("repeated rows for gpu_freq=1e+08 in a "
     "table with a repeats column (already aggregated)")),
    ("gpu_freq,step_time_s,power_w,repeats\n1e8,0.1,5,1.5\n", "line 2: repeats must hold whole numbers, got 1.5"),
    ("gpu_freq,step_time_s,power_w,power_cv\n1e8,0.1,5,-0.2\n", "line 2: power_cv must be >= 0 (or empty), got -0.2"),
    ("# a note\n\ngpu_freq,step_time_s,power_w\n1e8,0.1,5\n\n2e8,0.1,-5\n", ("line 6: power_w must be a positive "
     "finite number, got -5; fix or drop the row")),
    ("gpu_freq,step_time_s,power_w\n1e8,0.1,5\n1e8,0.1,5\n2e8,0.1,-5\n2e8,0.1,-5\n", ("line 4: power_w must be "
     "a positive finite number, got -5")),  # repeats aggregated: the line the setting is first given on
    ("gpu_freq,batch_size,step_time_s,power_w\n1e8,8,0.1,5\n1e8,8,0.1,5\n2e8,8.5,0.1,5\n", ("line 4: batch_size "
     "must hold whole numbers, got 8.5")),
    ("gpu_freq,step_time_s,power_w,epochs_to_target\n1e8,0.1,5,-3\n", ("line 2: epochs_to_target must be "
     "positive (or inf), got -3")),
    (("gpu_freq,batch_size,step_time_s,power_w,epochs_to_target,convergence_runs,convergence_failures\n"
      "1e8,8,0.1,5,3,2,3\n"), "line 2: convergence_failures exceeds convergence_runs"),
    ("gpu_freq,step_time_s,power_w,epochs_to_target\n1e8,0.1,5,3\n2e8,0.1,5,4\n",
     "epochs_to_target differs between every row"),
    ("gpu_freq,step_time_s,power_w\n,0.1,5\n", "line 2: missing value in column gpu_freq"),
    ("gpu_mhz,step_time_s\n100,0.1\n", "no 'power_w' column; the header has gpu_mhz, step_time_s"),
])
def test_malformed_v2_tables_give_one_clear_line(tmp_path, text, message):
    with pytest.raises(TableError, match=re.escape(message)) as info:
        load_table(write(tmp_path, text))
    assert "\n" not in str(info.value) and str(info.value).startswith(str(tmp_path))


def test_a_table_built_in_code_counts_its_rows_and_a_loaded_one_keeps_its_lines_through_a_subset(tmp_path):
    with pytest.raises(TableError, match=re.escape("<table>: row 2: power_w must be a positive finite number, "
                                                   "got -5; fix or drop the row")):
        Table(knobs=("gpu_freq",), settings=np.array([[1e8], [2e8]]), batch_size=None,
              power_w=np.array([5.0, -5.0]), step_time_s=np.array([0.1, 0.1]))
    t = load_table(write(tmp_path, REPEATED))
    assert t.lines == (3, 4) and t.subset([1]).lines == (4,)
