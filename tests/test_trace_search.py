"""`edgetune search --device trace:<table.csv>`: epochs to target from the table, gap to the table's oracle."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re

import numpy as np
import pytest

from edgetune.cli import main
from edgetune.power import open_device
from edgetune.search.oracle import TableTarget, prepare_trace
from edgetune.tables import load_table, save_table

ZEUS_TABLES = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23", "tables")
V100_SENTIMENT = os.path.join(ZEUS_TABLES, "v100_sentiment140_bert_base_uncased.csv")


@pytest.fixture
def small_table(tmp_path):
    """12 real rows of the Zeus V100 sentiment140 trace: batch 8, 32, 128 x power limit 100..250 W."""
    table = load_table(V100_SENTIMENT)
    keep = np.isin(table.batch_size, [8, 32, 128]) & np.isin(table.settings[:, 0], [100, 150, 200, 250])
    path = tmp_path / "small.csv"
    save_table(table.subset(np.flatnonzero(keep)), path)
    return str(path)


def test_time_to_target_is_the_tables_epochs_times_time_per_epoch_with_known_convergence(small_table):
    dev = open_device(f"trace:{small_table}", known_convergence=True)
    plan = prepare_trace(dev)
    table = dev.backend.table
    assert plan.batch_sizes == (8, 32, 128) and isinstance(plan.target, TableTarget)
    assert dev.backend.compute is False  # the table is the training run: the workload's step is not run
    step = table.step_time()
    for i in range(len(table)):
        b = int(table.batch_size[i])
        assert plan.target.steps(b) * step[i] == pytest.approx(table.time_to_target_s()[i], rel=1e-9)


def test_unknown_convergence_is_estimated_until_the_batch_size_is_measured(small_table):
    dev = open_device(f"trace:{small_table}")
    plan = prepare_trace(dev)
    table, target = dev.backend.table, plan.target
    epochs = {b: float(table.epochs_to_target[table.batch_size == b][0]) for b in (8, 32, 128)}
    assert target.known_epochs() == {} and target.epochs(32) == 1.0  # nothing measured: nothing known
    dev.apply({"power_limit": 150.0})
    dev.run_step(lambda: None, 32)
    assert target.known_epochs() == {32: epochs[32]}
    assert target.epochs(8) == epochs[32] and target.epochs(128) == epochs[32]  # the nearest measured one's
    assert "seen only for the batch sizes measured" in target.describe()["convergence"]
    assert target.describe()["epochs_estimated_for"] == [8, 128]


def test_estimate_epochs_from_the_nearest_measured_batch_size():
    from edgetune.search.oracle import estimate_epochs

    assert estimate_epochs(64, {}) == 1.0
    assert estimate_epochs(64, {32: 5.0, 256: 9.0}) == 5.0
    assert estimate_epochs(128, {32: 5.0, 256: 9.0}) == 9.0  # nearer in ratio
    assert estimate_epochs(512, {32: 5.0, 256: float("inf")}) == float("inf")  # beyond one never reached
    assert estimate_epochs(128, {32: 5.0, 256: float("inf")}) == 5.0  # below it: may still reach


def test_cli_search_reports_gap_to_the_table_oracle_and_holds_the_budget(small_table, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["search", "--device", f"trace:{small_table}", "--budget", "150", "--n-trials", "6",
               "--output", str(out), "--quiet", "--seed", "0"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "table oracle (time to target, 12 rows)" in text and "gap to the oracle" in text
    doc = json.loads((out / "best.json").read_text())
    gap = doc["oracle_gap"]
    table = load_table(small_table)
    ttt = table.time_to_target_s()
    ok = table.power_w <= 150.0
    oracle = ttt[ok].min()
    chosen = table.find({k: v["value"] for k, v in doc["setting"].items()}, doc["batch_size"])
    assert table.power_w[chosen] <= 150.0 and gap["chosen_holds_budget"] is True
    assert gap["oracle"]["time_to_target_s"] == pytest.approx(oracle)
    assert gap["gap_pct"] == pytest.approx(100.0 * (ttt[chosen] / oracle - 1.0))
    assert gap["gap_pct"] >= 0.0 and gap["measured_settings"] <= 6
    assert doc["target_model"]["source"] == "table"
    # measured on a noisy window: within a few of the table's stated 3.1% time spread of its median
    assert doc["predicted"]["time_to_target_s"] == pytest.approx(ttt[chosen], rel=0.1)


def test_cli_cost_search_labels_its_gain_a_cost_and_ranks_the_oracle_by_cost(small_table, tmp_path, capsys):
    from edgetune.search.efficiency import ZeusCost

    out = tmp_path / "out"
    assert main(["search", "--device", f"trace:{small_table}", "--objective", "cost", "--eta", "0.5",
                 "--budget", "200", "--n-trials", "6", "--output", str(out), "--quiet", "--seed", "0"]) == 0
    text = capsys.readouterr().out
    doc = json.loads((out / "best.json").read_text())
    chosen_t, base_t = doc["predicted"]["time_to_target_s"], doc["baseline"]["predicted"]["time_to_target_s"]
    time_speedup, cost_ratio = base_t / chosen_t, doc["speedup_over_baseline"]
    assert doc["speedup_measure"] == "Zeus cost to target (baseline / chosen)"  # best.json says which ratio it is
    assert f"{time_speedup:.2f}" != f"{cost_ratio:.2f}"  # the case tells the two figures apart
    # the cost ratio is labelled a cost; the time speedup, shown beside it, is the time ratio
    assert f"(baseline / chosen = {cost_ratio:.2f}x; Zeus's cost, eta 0.5 x energy" in text
    assert f"speedup over baseline (time to target): {time_speedup:.2f}x" in text
    assert f"speedup over baseline (time to target): {cost_ratio:.2f}x" not in text
    # the oracle is the table's least-cost row under the budget (32 at 150 W here), not its fastest (32 at 200 W)
    table = load_table(small_table)
    cost = ZeusCost(0.5, doc["cost"]["max_power_w"]).of(table.time_to_target_s(), table.energy_to_target_j())
    gap = doc["oracle_gap"]
    assert gap["objective"] == "cost to target" and "table oracle (cost to target, 12 rows)" in text
    assert gap["oracle"]["cost_j"] == pytest.approx(cost.min())
    assert (gap["oracle"]["batch_size"], gap["oracle"]["setting"]) == (32, {"power_limit": 150.0})
    assert gap["gap_pct"] == pytest.approx(100.0 * (gap["chosen"]["cost_j"] / cost.min() - 1.0))


def test_cli_batch_size_the_table_lacks_is_one_line_exit_2(small_table, tmp_path, capsys):
    rc = main(["search", "--device", f"trace:{small_table}", "--budget", "150", "--batch-sizes", "8,16",
               "--output", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "small.csv has no rows for batch size 16; it has 8, 32, 128" in err[-1]


def test_cli_known_convergence_refuses_a_batch_size_that_never_reaches_the_target(small_table, tmp_path, capsys):
    table = load_table(small_table)
    e = table.epochs_to_target.copy()
    e[table.batch_size == 128] = np.inf
    path = tmp_path / "never.csv"
    save_table(dataclasses.replace(table, epochs_to_target=e), path)
    args = ["search", "--device", f"trace:{path}", "--budget", "150", "--batch-sizes", "8,128", "--output",
            str(tmp_path / "o"), "--quiet"]
    assert main([*args, "--known-convergence"]) == 2
    assert "batch size 128 has no epochs to target in never.csv; use some of 8, 32" in capsys.readouterr().err


def test_power_cap_design_starts_at_the_cap_below_the_budget_across_batch_sizes(small_table):
    from edgetune.search.samplers import PowerCapSampler
    from edgetune.search.space import build_space

    dev = open_device(f"trace:{small_table}")
    plan = prepare_trace(dev)
    space = build_space(dev, 32, plan.batch_sizes)
    design = PowerCapSampler(space, budget_w=180.0, target=plan.target, seed=0).design()
    picked = [space.candidate(p) for p in design]
    assert [c.batch_size for c in picked] == [8, 32, 128]
    assert {c.knobs["power_limit"] for c in picked} == {150.0}  # the highest cap at or below 180 W
    with pytest.raises(ValueError, match="only knob is a power limit"):
        PowerCapSampler(build_space(open_device("sim:orin-nano", compute=False), 32, (16, 32)))


SWEEP = os.path.join(os.path.dirname(__file__), "data", "orin_nano_clock_sweep.csv")


def test_a_sparse_table_searches_its_rows_only():
    from edgetune.search.space import build_space

    dev = open_device(f"trace:{SWEEP}")
    plan = prepare_trace(dev, None, 32)
    space = build_space(dev, 32, plan.batch_sizes)
    table = dev.backend.table
    assert space.rows is not None and space.size == len(table) < space.grid_size
    assert all(table.find(c.knobs, None) is not None for c in space.grid())
    # levels that name no row map to the nearest row: every sampler measures real rows
    far = {n: 0 for n in space.param_names()}
    assert space.contains(space.candidate(far))


def test_cli_search_on_a_sparse_clock_sweep_lands_every_trial_on_a_row(tmp_path, capsys):
    """The issue's end-to-end case: a sparse, repeated, batch-size-free sweep with role-suffixed columns."""
    out = tmp_path / "sweep"
    rc = main(["search", "--device", f"trace:{SWEEP}", "--budget", "10", "--n-trials", "20", "--output",
               str(out), "--quiet", "--seed", "0"])
    assert rc == 0
    table = load_table(SWEEP)
    import csv

    with open(out / "trials.csv") as f:
        trials = list(csv.DictReader(f))
    assert trials
    for row in trials:
        setting = {k: float(row[k]) for k in table.knobs}
        assert table.find(setting, None) is not None, row
    doc = json.loads((out / "best.json").read_text())
    gap = doc["oracle_gap"]
    assert gap is not None
    assert gap["chosen_holds_budget"] is True and gap["gap_pct"] <= 5.0
    assert "noise-scale model" in gap["convergence"]


def test_the_guard_band_on_a_trace_covers_the_tables_stated_power_spread(small_table):
    dev = open_device(f"trace:{small_table}")
    plan = prepare_trace(dev)
    assert plan.power_cv == pytest.approx(float(dev.backend.table.spread().power_cv.max()))
    quiet = open_device(f"trace:{small_table}", noise=False)
    assert prepare_trace(quiet).power_cv == 0.0


def test_the_certifiable_oracle_leaves_out_rows_within_the_noise_of_the_budget(tmp_path, capsys):
    """A40 sentiment140 at 150 W: the table's oracle (batch 64 at a 150 W limit) draws 149.5 W, closer to
    the budget than the table's stated spread lets one window tell; the certifiable oracle is the best row
    whose median plus the guard band holds the budget, and the pick is scored against both."""
    table_path = os.path.join(ZEUS_TABLES, "a40_sentiment140_bert_base_uncased.csv")
    out = tmp_path / "o"
    assert main(["search", "--device", f"trace:{table_path}", "--budget", "150", "--n-trials", "6",
                 "-o", str(out)]) == 0
    text = capsys.readouterr().out
    report = json.loads((out / "best.json").read_text())["oracle_gap"]
    oracle, sure = report["oracle"], report["certifiable_oracle"]
    assert oracle["power_w"] <= 150.0 and sure != oracle
    assert sure["power_w"] < oracle["power_w"] and sure["time_to_target_s"] > oracle["time_to_target_s"]
    chosen = report["chosen"]["time_to_target_s"]
    assert report["certifiable_gap_pct"] == pytest.approx(100 * (chosen / sure["time_to_target_s"] - 1))
    assert "certifiable oracle (under the budget by the guard band at its median)" in text


def test_a_power_cap_search_with_a_safe_spread_measures_past_its_design(small_table):
    """The power-cap design is the start's spread; a spread asked for on top of it runs like the guided one."""
    import optuna

    from edgetune.search.space import build_space
    from edgetune.search.study import Search
    from edgetune.workloads import load_workload

    dev = open_device(f"trace:{small_table}", seed=0)
    plan = prepare_trace(dev, None, 32)
    space = build_space(dev, 32, plan.batch_sizes)
    search = Search(dev, load_workload("cnn", seed=0), space, budget_w=150.0, target=plan.target, n_trials=10,
                    sampler="guided", seed=0, storage=optuna.storages.InMemoryStorage(),
                    guided_options={"n_spread": 3}, baseline_batch_size=plan.baseline_batch_size,
                    power_cv=plan.power_cv)
    result = search.run()
    assert len(result.measured) > 6 and result.best is not None and result.best.feasible


@pytest.mark.parametrize("rows", [["700,8,0.12,8.1", "700,16,0.23,8.6", "700,32,0.46,9.2", "700,64,0.9,10.1"],
                                  ["700,8,0.12,8.1"]])
def test_cli_a_table_whose_knob_holds_one_value_searches_and_writes_its_results(tmp_path, capsys, rows):
    """A knob with one value is not tuned (not in the space); the report still finds each searched row, with
    that knob where the replay held it, and writes best.json and trials.csv (it used to raise KeyError after
    every trial had run, leaving only study.db)."""
    path = tmp_path / "const.csv"
    path.write_text("\n".join(["gpu_freq_mhz,batch_size,step_time_s,power_w", *rows]) + "\n")
    out = tmp_path / "o"
    rc = main(["search", "--device", f"trace:{path}", "--budget", "9.5", "--n-trials", "6", "--output", str(out),
               "--quiet", "--seed", "0"])
    assert rc == 0
    assert "gap to the oracle +0.00%" in capsys.readouterr().out
    gap = json.loads((out / "best.json").read_text())["oracle_gap"]
    assert gap["chosen"] == gap["oracle"] and gap["oracle"]["setting"] == {"gpu_freq": 7e8}
    assert gap["table_rows"] == len(rows) and (out / "trials.csv").stat().st_size > 0


def test_a_table_knob_the_hardware_model_cannot_take_is_said_once_not_searched_on_without_a_word(tmp_path, capsys):
    """A fan level of 0 (a knob with no role, at 0) is no value the hardware model takes: every fit failed and
    the guided search ran to --n-trials without a model, saying nothing. It still runs, and says why once."""
    rows = [f"{g},{fan},{b},{0.12 * b / 8 * 700 / g:.4f},{7.0 + g / 700 + b / 32 + fan * 0.2:.2f}"
            for g in (300, 500, 700) for fan in (0, 1) for b in (8, 16, 32)]
    path = tmp_path / "fan.csv"
    path.write_text("\n".join(["gpu_freq_mhz,fan_level,batch_size,step_time_s,power_w", *rows]) + "\n")
    assert main(["search", "--device", f"trace:{path}", "--budget", "9.5", "--n-trials", "12", "--output",
                 str(tmp_path / "o"), "--quiet", "--seed", "0"]) == 0
    said = [ln for ln in capsys.readouterr().err.splitlines() if "could not fit its hardware model" in ln]
    assert len(said) == 1 and re.fullmatch(
        r"edgetune: the guided sampler could not fit its hardware model \(row \d+ of X: fan_level = 0; knob values "
        r"and batch sizes must be positive finite numbers\); it proposes without one, space-filling, until a fit "
        r"succeeds", said[0]), said


def test_cli_a_table_without_knobs_searches_its_batch_sizes_and_says_so_plainly(tmp_path, capsys):
    path = tmp_path / "batch_only.csv"
    path.write_text("batch_size,step_time_s,power_w\n8,0.12,8.1\n16,0.23,8.6\n32,0.46,9.2\n64,0.9,10.1\n")
    assert main(["search", "--device", f"trace:{path}", "--budget", "9.5", "--n-trials", "4", "--output",
                 str(tmp_path / "o"), "--quiet", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "table oracle (time to target, 4 rows): batch 8: 318 s at 8.1 W" in out
    assert "chosen: batch 8: 318 s at 8.1 W; gap to the oracle +0.00%" in out


def test_cli_a_table_whose_batch_size_column_is_named_bs_searches_its_batch_sizes(tmp_path, capsys):
    """``bs`` (and ``Batch Size``) used to be a knob with no role: the table a fixed-batch sweep at an invented
    batch size, the search reporting 'batch 128, ..., bs=1' and a speedup over 'batch 128, bs=64'."""
    path = tmp_path / "bs.csv"
    path.write_text("GPU freq (MHz),bs,step_time (ms),power (mW)\n522.75,16,113.8,19480\n1300.5,16,51.6,53500\n"
                    "522.75,64,422.5,21300\n1300.5,64,191.6,55400\n")
    out = tmp_path / "o"
    assert main(["search", "--device", f"trace:{path}", "--budget", "30", "--n-trials", "4", "--output", str(out),
                 "--quiet", "--seed", "0"]) == 0
    gap = json.loads((out / "best.json").read_text())["oracle_gap"]
    assert gap["oracle"]["batch_size"] in (16, 64) and set(gap["oracle"]["setting"]) == {"gpu_freq"}
    assert gap["oracle"]["setting"]["gpu_freq"] == 522.75e6 and gap["oracle"]["power_w"] < 30


def test_cli_a_search_of_some_of_a_tables_knobs_scores_the_rows_it_ran(tmp_path, capsys):
    """--knobs names a subset: the untuned knobs stay where the replay starts (each at its largest value)."""
    out = tmp_path / "o"
    rc = main(["search", "--device", f"trace:{SWEEP}", "--budget", "10", "--knobs", "emc_freq", "--n-trials", "4",
               "--output", str(out), "--quiet", "--seed", "0"])
    assert rc in (0, 1)
    gap = json.loads((out / "best.json").read_text())["oracle_gap"]
    table = load_table(SWEEP)
    top = {k: max(table.knob_values(k)) for k in table.knobs if k != "emc_freq"}
    assert gap["table_rows"] == int(np.all(table.settings[:, [table.knobs.index(k) for k in top]]
                                            == list(top.values()), axis=1).sum()) > 0


@pytest.mark.parametrize("batch_sizes", [[], ["--batch-sizes", "128"]])
def test_cli_a_budget_below_a_traces_idle_power_is_one_line_with_the_lowest_row(small_table, tmp_path, capsys,
                                                                                  batch_sizes):
    """A trace knows its lowest feasible budget: the least power of the rows searched (it used to raise
    TypeError dividing the twin-only hint's None)."""
    table = load_table(small_table)
    searched = table.batch_size == 128 if batch_sizes else np.ones(len(table), dtype=bool)
    lowest_w = math.ceil(float(table.power_w[searched].min()) / 0.1) * 0.1
    out = tmp_path / "o"
    rc = main(["search", "--device", f"trace:{small_table}", "--budget", "50", *batch_sizes, "--output", str(out),
               "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith("edgetune: error: --budget 50 W is at or below the idle power of trace:") and "infeasible" in err[0]
    assert f"the lowest feasible budget is about {lowest_w:g} W (the least power of the table's rows searched)" in err[0]
    if not batch_sizes:  # a budget at the idle power, the least row's: the hint names one above it, not itself
        idle_w = float(table.power_w.min())
        assert main(["search", "--device", f"trace:{small_table}", "--budget", repr(idle_w), "--output", str(out),
                     "--quiet"]) == 2
        line = capsys.readouterr().err.strip()
        hint_w = float(line.split("the lowest feasible budget is about ")[1].split(" W")[0])
        assert "is at or below the idle power" in line and hint_w > idle_w


@pytest.mark.parametrize(("extra", "given"), [(["--steps-to-target", "RUNS"], "--steps-to-target"),
                                              (["--b-noise", "measure"], "--b-noise"),
                                              (["--s-min", "10"], "--s-min")])
def test_cli_a_steps_to_target_option_the_tables_convergence_overrides_is_refused(small_table, tmp_path, capsys,
                                                                                 extra, given):
    """The table's epochs_to_target decide the steps to target on a trace; these options were silently ignored."""
    runs = tmp_path / "runs.csv"
    runs.write_text("batch_size,steps\n8,1000\n32,400\n")
    out = tmp_path / "o"
    rc = main(["search", "--device", f"trace:{small_table}", "--budget", "150", "--output", str(out), "--quiet",
               *[str(runs) if a == "RUNS" else a for a in extra]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and not out.exists()
    assert err[0] == (f"edgetune: error: {given}: on a trace the table's epochs_to_target column decides the steps "
                      f"to target (time to target = its epochs to target x time per epoch), so it would be ignored; "
                      f"drop it, or search a table without an epochs_to_target column")


CONST_ROWS = "gpu_freq_mhz,batch_size,step_time_s,power_w\n700,8,0.12,8.1\n700,16,0.23,8.6\n"


def test_cli_a_workload_named_on_a_trace_says_what_of_it_is_used(small_table, tmp_path, capsys):
    """--workload on a trace: a note says the table is the training run and what the search still takes from
    the workload (it used to pass without a word); a table without convergence still takes --steps-to-target."""
    args = ["search", "--budget", "150", "--n-trials", "1", "--quiet", "--workload", "mobilenet"]
    assert main([*args, "--device", f"trace:{small_table}", "--output", str(tmp_path / "a")]) in (0, 1)
    assert ("note: --workload mobilenet is not used: on a trace the table is the training run, the workload's step "
            "is not run") in capsys.readouterr().err.splitlines()
    bare = tmp_path / "bare.csv"
    bare.write_text(CONST_ROWS)
    assert main([*args, "--device", f"trace:{bare}", "--output", str(tmp_path / "b")]) in (0, 1)
    note = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: --workload")]
    assert note == [("note: --workload mobilenet: on a trace the table is the training run, the workload's step is "
                    "not run; the search takes only its default batch size 128 for the baseline (the table declares "
                    "none; the baseline runs the nearest batch size searched) and its B_noise for the steps to target "
                    "(the table has no convergence data) from it")]
    runs = tmp_path / "runs.csv"
    runs.write_text("batch_size,steps\n8,1000\n16,600\n")
    assert main(["search", "--budget", "150", "--n-trials", "1", "--quiet", "--device", f"trace:{bare}",
                 "--steps-to-target", str(runs), "--output", str(tmp_path / "c")]) in (0, 1)
    assert f"steps to target from your runs ({runs}" in capsys.readouterr().err
