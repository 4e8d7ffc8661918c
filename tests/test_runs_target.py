"""Steps to target from the user's own runs (``efficiency.steps_to_target``): read, interpolated, searched."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from edgetune.cli import main
from edgetune.search.runs_target import RunsTarget, RunsTargetError

HERE = Path(__file__).resolve().parent
STEPS_CSV = HERE.parent / "experiments" / "data" / "convergence" / "steps.csv"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_repeats_count_by_their_median_and_a_missed_run_as_infinitely_many_steps(tmp_path):
    runs = _write(tmp_path / "runs.csv", "# my runs\nbatch_size,steps,seed\n16,400,0\n16,300,1\n16,,2\n"
                                         "32,200,0\n32,220,1\n64,nan,0\n64,inf,1\n64,150,2\n")
    t = RunsTarget.from_csv(runs)
    assert t.medians == {16: 400.0, 32: 210.0, 64: math.inf}
    assert t.steps(16) == 400.0 and t.steps(32) == 210.0
    assert t.steps(64) == math.inf and t.steps(128) == math.inf  # most runs missed: never picked, nor beyond
    assert t.steps(48) == math.inf  # next to a miss: not trusted to reach the target
    # between two measured batch sizes: a power law between the neighbours
    assert t.steps(24) == pytest.approx(400.0 * (210.0 / 400.0) ** math.log2(24 / 16))
    assert not t.is_law


def test_outside_the_runs_the_law_fitted_to_them_carries_the_nearest_one_on():
    # steps = 100 (1 + 64 / b) exactly: the fit recovers S_min and B_noise
    law = {b: 100.0 * (1 + 64.0 / b) for b in (16, 32, 64)}
    t = RunsTarget.from_runs({b: [s] for b, s in law.items()}, source="law runs")
    assert t.s_min == pytest.approx(100.0) and t.b_noise == pytest.approx(64.0)
    assert t.steps(8) == pytest.approx(100.0 * (1 + 64.0 / 8))
    assert t.steps(256) == pytest.approx(100.0 * (1 + 64.0 / 256))
    # a curve the law cannot follow is followed inside the runs' span, not bent to the law
    t = RunsTarget.from_runs({8: [105.2], 16: [37.6], 32: [26.9]}, source="cnn")
    assert (t.steps(8), t.steps(16)) == (105.2, 37.6)
    assert t.steps(8) / t.steps(16) > 2.5  # more than any S_min (1 + B / b) allows between 8 and 16
    assert t.steps(4) > t.steps(8)


def test_the_measured_convergence_table_serves_as_it_is_one_workload_at_a_time():
    cnn = RunsTarget.from_csv(STEPS_CSV, "cnn")
    chars = RunsTarget.from_csv(STEPS_CSV, "chartransformer")
    assert cnn.medians != chars.medians and {8, 16, 32, 64} <= set(cnn.medians)
    assert all(len(seeds) >= 10 for _, seeds in cnn.runs)  # fifteen seeds per batch size: repeats
    described = cnn.describe()
    assert described["source"] == "measured runs" and described["steps_to_target"]["16"] == cnn.medians[16]


@pytest.mark.parametrize(
    "text, workload, message",
    [
        ("batch_size,seed\n16,0\n", None, "missing column(s) steps"),
        ("batch_size,steps\n16,100\n32,abc\n", None, "line 3: batch_size '32' or steps 'abc' is not a number"),
        ("batch_size,steps\n16,100\n16,120\n", None, "at 1 batch size(s) where most runs reached it"),
        ("batch_size,steps\n16,100\n32,\n", None, "at 1 batch size(s)"),
        ("batch_size,steps\n16,-5\n32,100\n", None, "must be positive"),
        ("batch_size,steps\n0,5\n32,100\n", None, "batch size 0 is not a positive integer"),
        ("workload,batch_size,steps\nbert,16,5\nbert,32,4\n", "cnn", "no run of workload 'cnn' (it has bert)"),
        ("workload,metric,target,batch_size,steps\ncnn,accuracy,0.9,16,50\nbert,loss,2,16,9\ncnn,accuracy,0.99,32,40\n",
         "cnn", "runs of workload 'cnn' to different targets (accuracy 0.9 from line 2; accuracy 0.99 from line 4)"),
    ],
)
def test_a_runs_file_that_cannot_serve_is_refused_saying_why(tmp_path, text, workload, message):
    with pytest.raises(RunsTargetError) as err:
        RunsTarget.from_csv(_write(tmp_path / "runs.csv", text), workload)
    assert message in str(err.value)


SEARCH = ["search", "--device", "sim:orin-nano", "--workload", "cnn", "--batch-sizes", "16,32", "--knobs",
          "gpu_freq", "--budget", "10", "--objective", "energy", "--measure-s", "0.5", "--real-steps", "0",
          "--n-trials", "14", "--confirm", "0", "--soak-s", "0"]


def test_the_runs_decide_the_batch_size_and_best_json_says_where_the_steps_came_from(tmp_path, capsys):
    """The same space searched twice: the runs that make batch 16 four times slower to converge pick 32,
    those that make 32 four times slower pick 16; each pick's energy to target is its measured energy per
    sample x batch x the runs' steps."""
    picks = {}
    for slow in (16, 32):
        runs = _write(tmp_path / f"slow{slow}.csv", "batch_size,steps\n" + "".join(
            f"{b},{400 if b == slow else 100}\n" for b in (16, 32)))
        out = tmp_path / f"out{slow}"
        assert main([*SEARCH, "--steps-to-target", str(runs), "-o", str(out)]) == 0
        assert "steps to target from your runs" in capsys.readouterr().err
        best = json.loads((out / "best.json").read_text())
        assert best["target_model"]["source"] == "measured runs"
        assert best["target_model"]["steps_to_target"] == {"16": 400.0 if slow == 16 else 100.0,
                                                           "32": 400.0 if slow == 32 else 100.0}
        b = best["batch_size"]
        m = best["measured"]
        assert best["predicted"]["energy_to_target_j"] == pytest.approx(
            best["predicted"]["steps_to_target"] * m["energy_per_sample_j"] * b)
        picks[slow] = b
        assert best["batch_size_tie"] is None  # four times the steps: a clear lead
    assert picks == {16: 32, 32: 16}


def test_runs_that_cannot_tell_two_batch_sizes_apart_report_a_tie(tmp_path, capsys):
    """Runs whose seeds spread eightfold at each batch size know the ratio of the two medians to no better
    than about +-100%: whichever batch size wins on the hardware, the other is a tie to train and see."""
    runs = _write(tmp_path / "spread.csv", "batch_size,steps\n16,50\n16,400\n16,100\n32,30\n32,300\n32,100\n")
    out = tmp_path / "out"
    assert main([*SEARCH, "--steps-to-target", str(runs), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    tie = json.loads((out / "best.json").read_text())["batch_size_tie"]
    precision = RunsTarget.from_csv(runs).ratio_precision(16, 32)
    assert precision > 1.0 and tie["steps_from"] == "runs" and "law_ratio_precision_pct" not in tie
    assert tie["ratio_precision_pct"] == pytest.approx(100 * precision) and tie["cost_pct"] < 100 * precision
    assert f"batch size: a tie under your runs: batch {tie['runner_up']['batch_size']} " in text


def test_the_runs_precision_is_their_spread_and_the_laws_where_they_cannot_tell():
    spread = 0.1
    runs = {16: [100.0, 100.0 * math.exp(spread), 100.0 * math.exp(-spread)], 32: [80.0], 64: [50.0, 50.0]}
    t = RunsTarget.from_runs(runs)
    se16 = math.sqrt(math.pi / 2) * spread / math.sqrt(3)
    assert t.log_se(16) == pytest.approx(se16)
    assert t.log_se(32) == pytest.approx(0.05 / math.sqrt(2))  # one run: the law's share
    assert t.log_se(64) == 0.0  # identical runs
    assert t.log_se(24) == pytest.approx(se16)  # between two measured: the larger of theirs
    assert t.log_se(128) == pytest.approx(0.05 / math.sqrt(2))  # beyond the runs
    assert t.ratio_precision(16, 32) == pytest.approx(math.hypot(se16, 0.05 / math.sqrt(2)))


def test_search_with_a_bad_runs_file_is_one_line_and_writes_nothing(tmp_path, capsys):
    runs = _write(tmp_path / "runs.csv", "batch,steps\n16,100\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main([*SEARCH, "--steps-to-target", str(runs), "-o", str(out)]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("edgetune: error: efficiency.steps_to_target: ") and "batch_size" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert not (out / "best.json").exists()


def test_a_study_resumed_with_other_steps_to_target_is_scored_again_from_its_measurements(tmp_path, capsys):
    """The hardware measurements do not depend on the steps to target: a study resumed with other runs (or the
    law) scores every trial again with them, and picks as a study made with them would. Optuna's own samplers
    rank the values the study was told, so with them the resume is refused, naming the prior that starts anew."""
    runs = _write(tmp_path / "runs.csv", "batch_size,steps\n16,400\n32,100\n")
    other = _write(tmp_path / "other.csv", "batch_size,steps\n16,100\n32,400\n")
    out = tmp_path / "out"
    base = [a for a in SEARCH if a not in ("--n-trials", "14")] + ["-o", str(out)]
    short = [*base, "--n-trials", "6"]
    assert main([*short, "--steps-to-target", str(runs)]) == 0
    first = json.loads((out / "best.json").read_text())
    assert first["batch_size"] == 32  # four times fewer steps
    capsys.readouterr()
    assert main([*short, "--steps-to-target", str(other)]) == 0
    err = capsys.readouterr().err
    assert "its 6 measured settings are scored again with your runs' median steps to target (b 16: 100, b 32: 400)" \
        in err and "was scored with your runs' median steps to target (b 16: 400, b 32: 100)" in err
    again = json.loads((out / "best.json").read_text())
    assert again["batch_size"] == 16 and again["target_model"]["runs_file"] == str(other)
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert len(rows) == 6  # nothing measured again: the cap was reached by the settings already measured
    for row in rows:  # every trial's time to target is the new runs' steps x its own step time
        steps = {"16": 100.0, "32": 400.0}[row["batch_size"]]
        assert float(row["time_to_target_s"]) == pytest.approx(steps * float(row["step_time_s"]))
    # Optuna's own samplers rank the told values: other steps are refused, and so is a study scored twice
    assert main([*short, "--steps-to-target", str(other), "--sampler", "tpe"]) == 2
    assert "was scored again with other steps to target" in capsys.readouterr().err
    assert main([*short, "--steps-to-target", str(runs), "--sampler", "tpe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "was made with a different steps_to_target" in err[-1] and len(err[-1].splitlines()) == 1
    prior = err[-1].split("--prior '")[1].split("'")[0]
    assert prior.endswith("#sim:orin-nano-cnn-10W-energy")
    assert main([*short, "-o", str(tmp_path / "anew"), "--prior", prior]) == 0, capsys.readouterr().err


def test_scoring_a_study_again_with_its_own_steps_gives_the_values_it_was_told(tmp_path):
    """read_records computes each outcome from the measurement as told: unchanged steps, the same floats."""
    import optuna

    from edgetune.search import records

    runs = _write(tmp_path / "runs.csv", "batch_size,steps\n16,400\n32,100\n")
    out = tmp_path / "out"
    assert main([*SEARCH, "--n-trials", "6", "--steps-to-target", str(runs), "-o", str(out)]) == 0
    study = optuna.load_study(study_name="sim:orin-nano-cnn-10W-energy", storage=f"sqlite:///{out / 'study.db'}")
    told = records.read_records(study.get_trials(), None)  # the knobs as each trial stored them
    again = records.read_records(study.get_trials(), None, target=RunsTarget.from_csv(runs))
    assert [r.outcome for r in again] == [r.outcome for r in told]
    assert sum(r.outcome is not None for r in told) >= 5


def test_a_study_resumed_with_another_b_noise_is_scored_again_or_refused_by_optunas_samplers(tmp_path, capsys):
    out = tmp_path / "out"
    base = [a for a in SEARCH if a not in ("--n-trials", "14")] + ["-o", str(out), "--n-trials", "5"]
    assert main([*base, "--b-noise", "5"]) == 0
    capsys.readouterr()
    # B_noise measured again (a GPU's last digits differ from run to run): the same law, nothing scored again
    assert main([*base, "--b-noise", "5.000001", "--sampler", "tpe"]) == 0
    assert "scored again" not in capsys.readouterr().err
    assert main([*base, "--b-noise", "500"]) == 0
    assert ("was scored with the noise-scale law's steps to target (B_noise 5); its 5 measured settings are scored "
            "again with the noise-scale law's steps to target (B_noise 500)") in capsys.readouterr().err
    assert json.loads((out / "best.json").read_text())["target_model"]["b_noise"] == 500
    assert main([*base, "--b-noise", "50", "--sampler", "tpe"]) == 2
    assert "was made with a different B_noise, and sampler 'tpe' ranks the values" in capsys.readouterr().err


def test_a_runs_file_saved_with_a_byte_order_mark_reads_as_without(tmp_path):
    """Excel saves CSV as UTF-8 with a byte-order mark: read as part of the first column's name, it made the file
    \"missing column(s) batch_size\"."""
    from edgetune.predictors.convergence import read_convergence_rows

    text = "batch_size,steps,seed\n16,400,0\n32,210,0\n"
    plain = RunsTarget.from_csv(_write(tmp_path / "plain.csv", text))
    (tmp_path / "bom.csv").write_text(text, encoding="utf-8-sig")
    assert RunsTarget.from_csv(tmp_path / "bom.csv").medians == plain.medians == {16: 400.0, 32: 210.0}
    table = STEPS_CSV.read_text()
    (tmp_path / "steps.csv").write_text(table, encoding="utf-8-sig")
    assert read_convergence_rows(tmp_path / "steps.csv") == read_convergence_rows(STEPS_CSV)


@pytest.mark.parametrize(
    "text, message",
    [
        # 1,000 written without quotes: two cells, so the run read as 1 step and the 000 was dropped
        ("batch_size,steps\n16,1,000\n32,600\n64,400\n", "line 2 has 3 cells for the 2 columns"),
        # a line cut short has no steps cell: it read as a run that missed the target, and 32 was never picked
        ("batch_size,steps\n16,1000\n32\n64,400\n", "line 3 has 1 cell for the 2 columns"),
    ],
)
def test_a_line_with_more_or_fewer_cells_than_the_header_is_refused_not_read_shifted(tmp_path, text, message):
    with pytest.raises(RunsTargetError) as err:
        RunsTarget.from_csv(_write(tmp_path / "runs.csv", text))
    assert message in str(err.value)


def test_an_empty_cell_at_the_end_of_a_line_is_no_value(tmp_path):
    # a trailing comma (a spreadsheet's export) adds an empty cell: nothing is lost, the line reads as without
    t = RunsTarget.from_csv(_write(tmp_path / "runs.csv", "batch_size,steps\n16,1000,\n32,600\n"))
    assert t.medians == {16: 1000.0, 32: 600.0}


def test_negative_infinite_steps_are_refused_not_read_as_a_missed_run(tmp_path):
    with pytest.raises(RunsTargetError, match="batch size 32: steps to target must be positive"):
        RunsTarget.from_csv(_write(tmp_path / "runs.csv", "batch_size,steps\n16,1000\n32,-inf\n64,400\n"))
    with pytest.raises(RunsTargetError, match="must be positive"):
        RunsTarget.from_runs({16: [1000.0], 32: [-math.inf], 64: [400.0]})


def test_a_batch_size_written_as_a_whole_float_reads_as_that_integer(tmp_path):
    # pandas writes an integer column as 16.0 once it has held a float: the same batch size
    t = RunsTarget.from_csv(_write(tmp_path / "runs.csv", "batch_size,steps\n16.0,1000\n32.0,600\n"))
    assert t.medians == {16: 1000.0, 32: 600.0}
    with pytest.raises(RunsTargetError, match=r"line 3: batch_size '24\.5' is not a whole number"):
        RunsTarget.from_csv(_write(tmp_path / "runs.csv", "batch_size,steps\n16,1000\n24.5,600\n"))


def test_runs_of_several_workloads_are_not_pooled_when_no_workload_is_named(tmp_path):
    # cnn's and mobilenet's runs to two different targets read as one workload's: the medians mixed both
    text = "workload,batch_size,steps\ncnn,16,1000\ncnn,32,600\nmobilenet,16,5000\nmobilenet,64,100\n"
    with pytest.raises(RunsTargetError, match="runs of several workloads .cnn, mobilenet.; name the workload"):
        RunsTarget.from_csv(_write(tmp_path / "runs.csv", text))
    assert RunsTarget.from_csv(tmp_path / "runs.csv", "cnn").medians == {16: 1000.0, 32: 600.0}
    one = _write(tmp_path / "one.csv", "workload,batch_size,steps\ncnn,16,1000\ncnn,32,600\n")
    assert RunsTarget.from_csv(one).medians == {16: 1000.0, 32: 600.0}  # one workload: nothing to choose


def test_spaces_around_the_header_names_are_not_part_of_them(tmp_path):
    # "batch_size, steps" (a space after the comma) was refused as missing the steps column it shows
    t = RunsTarget.from_csv(_write(tmp_path / "runs.csv", "batch_size, steps\n16, 1000\n32, 600\n"))
    assert t.medians == {16: 1000.0, 32: 600.0}
