"""The oracle benchmark's pure scoring functions (experiments/benchlib.py); the benchmark itself is run by
experiments/oracle_gap.py, not here. One case of experiments/online_gap.py runs end to end (seconds)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

from benchlib import (
    INA3221_ACCURACY,
    Case,
    Point,
    Row,
    benchmark_batch_sizes,
    choose_budgets,
    hv_reference,
    hypervolume_2d,
    max_window_average_w,
    pareto_points,
    split_runs,
    steady_mean_w,
    steps_at,
)

from edgetune.power.base import WorkloadCost
from edgetune.power.sim import Twin
from edgetune.power.sim.physics import FORWARD_SHARE
from edgetune.predictors.convergence import MeasuredCurve, read_convergence_rows

CONVERGENCE = Path(__file__).resolve().parents[1] / "experiments" / "data" / "convergence" / "steps.csv"

# ---------------------------------------------------------------------------------------------- steps


def test_steps_exact_at_measured_batch_sizes_and_power_law_between() -> None:
    b, s = (8, 32), (1000.0, 250.0)  # steps halve per doubling of b: a power law with exponent -1
    assert steps_at(b, s, 8) == 1000.0 and steps_at(b, s, 32) == 250.0
    assert steps_at(b, s, 16) == pytest.approx(500.0)  # the geometric, not the arithmetic (625), midpoint


def test_steps_outside_the_measured_range_are_refused() -> None:
    with pytest.raises(ValueError, match="outside the measured range 8..32"):
        steps_at((8, 32), (1000.0, 250.0), 64)
    with pytest.raises(ValueError, match="outside"):
        steps_at((8, 32), (1000.0, 250.0), 4)


def test_steps_next_to_a_batch_size_that_never_reached_the_target_are_nan() -> None:
    assert math.isnan(steps_at((8, 16, 32), (900.0, 500.0, math.nan), 24))
    assert steps_at((8, 16, 32), (900.0, 500.0, math.nan), 16) == 500.0


def test_steps_reject_a_malformed_curve() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        steps_at((16, 8), (1.0, 2.0), 10)


def _curve(sizes, steps) -> MeasuredCurve:
    return MeasuredCurve("cnn", "accuracy", 0.9, tuple(sizes), tuple(steps), tuple(steps), tuple(steps), (0,))


def test_held_out_runs_share_no_run_with_the_scorers_truth(tmp_path) -> None:
    """--held-out-runs K: each workload's first K seeds go to the search, the rest make the scorer's table."""
    scorer = tmp_path / "scorer.csv"
    given = split_runs(CONVERGENCE, 3, scorer)
    every = read_convergence_rows(CONVERGENCE)
    kept = read_convergence_rows(scorer)
    for name in ("cnn", "chartransformer", "mobilenet"):
        seeds = sorted({r.seed for r in every if r.workload == name})
        assert {r.seed for r in kept if r.workload == name} == set(seeds[3:])
        mine = [r for r in every if r.workload == name and r.seed in seeds[:3]]
        assert sum(len(v) for v in given[name].values()) == len(mine)
        for b, steps in given[name].items():
            assert sorted(steps, key=str) == sorted((r.steps for r in mine if r.batch_size == b), key=str)
    assert len(kept) + sum(len(v) for g in given.values() for v in g.values()) == len(every)
    with pytest.raises(ValueError, match="hold out fewer"):
        split_runs(CONVERGENCE, 99, tmp_path / "none.csv")


def test_benchmark_batch_sizes_are_the_default_space_inside_the_measured_range() -> None:
    curve = _curve((8, 16, 32, 64, 128, 256), (900, 500, 300, 200, 150, math.nan))
    # default space of 128 is 16..1024; 256 is measured but never reached the target
    assert benchmark_batch_sizes(128, curve) == (16, 32, 64, 128)


def test_benchmark_batch_sizes_need_the_default_batch_size() -> None:
    with pytest.raises(ValueError, match="default batch size 512"):
        benchmark_batch_sizes(512, _curve((8, 16, 32), (3.0, 2.0, 1.0)))


# ---------------------------------------------------------------------------------------------- power


def test_short_steps_average_to_their_mean_over_the_window() -> None:
    # 100 whole steps in the window: the ripple averages out exactly
    assert max_window_average_w(0.01, 10.0, 12.0) == pytest.approx(10.0)


def test_a_step_as_long_as_the_window_peaks_at_its_backward_phase() -> None:
    # the window is 1 s; a 1.5 s step's backward phase (2/3 of it) lasts 1 s: the window sees only it
    assert max_window_average_w(1.5, 10.0, 12.0) == pytest.approx(12.0)


def test_window_average_mixes_the_phases_for_a_partial_step() -> None:
    # step 0.6 s: one whole step (0.6 s at the mean) plus the best 0.4 s = the backward phase (0.4 s)
    assert max_window_average_w(0.6, 10.0, 12.0, forward_share=1 / 3) == pytest.approx(
        (0.6 * 10.0 + 0.4 * 12.0) / 1.0)
    # step 0.8 s: one whole step, then the best 0.2 s (backward, 12 W)
    assert max_window_average_w(0.8, 10.0, 12.0, forward_share=1 / 3) == pytest.approx(0.8 * 10.0 + 0.2 * 12.0)
    # step 1.2 s: no whole step; the 0.8 s backward phase, then 0.2 s of the forward one at
    # (10 - 2/3 x 12) / (1/3) = 6 W
    assert max_window_average_w(1.2, 10.0, 12.0, forward_share=1 / 3) == pytest.approx(0.8 * 12.0 + 0.2 * 6.0)


def test_window_average_is_vectorised_and_bounded_by_mean_and_peak() -> None:
    t = np.array([0.05, 0.3, 0.7, 2.0])
    out = max_window_average_w(t, np.full(4, 8.0), np.full(4, 9.0))
    assert out.shape == (4,) and np.all(out >= 8.0 - 1e-12) and np.all(out <= 9.0 + 1e-12)


@pytest.mark.parametrize("step_s", [0.07, 0.37, 0.55, 0.8, 1.2, 2.5])
def test_window_average_matches_a_brute_force_moving_average(step_s: float) -> None:
    # a step shaped as the twin shapes it: its mean and peak from Twin.expected, the forward share low
    twin = Twin("orin-nano", compute=False)
    cost = WorkloadCost(flops_per_sample=2e9, param_bytes=4e7, activation_bytes_per_sample=8e6,
                        input_bytes_per_sample=1024, optimizer_state_bytes=8e7)
    e = twin.expected(cost, 64, {"power_mode": "7W"})
    assert e.peak_power_w > e.power_w  # the step ripples
    low = (e.power_w - (1 - FORWARD_SHARE) * e.peak_power_w) / FORWARD_SHARE
    dt = 1e-4
    t = np.arange(0.0, 5 * max(step_s, 1.0), dt)
    signal = np.where((t % step_s) < FORWARD_SHARE * step_s, low, e.peak_power_w)
    n = round(1.0 / dt)
    moving = np.convolve(signal, np.ones(n) / n, mode="valid")
    got = max_window_average_w(step_s, e.power_w, e.peak_power_w)
    assert got == pytest.approx(moving.max(), abs=2e-3 * e.peak_power_w)


# ---------------------------------------------------------------------------------------------- sensor


def test_ina3221_accuracy_from_the_data_sheet_maxima() -> None:
    # 80 uV / 5 mOhm x 5 V = 0.08 W per channel; 0.25 % + 0.25 % + 16 mV / 5 V = 0.82 %
    assert INA3221_ACCURACY.offset_w == pytest.approx(0.08)
    assert INA3221_ACCURACY.relative == pytest.approx(0.0082)
    assert INA3221_ACCURACY.bound_w(10.0) == pytest.approx(0.162)
    assert INA3221_ACCURACY.bound_w(30.0, channels=4) == pytest.approx(0.32 + 0.246)


# ---------------------------------------------------------------------------------------------- budgets


def test_budgets_bind_and_the_lowest_sits_near_the_floor() -> None:
    budgets = choose_budgets(5.0, 15.0)
    assert budgets == (5.5, 9.0, 12.5)
    assert all(5.0 <= b < 15.0 for b in budgets)


def test_budgets_keep_the_exact_figure_when_rounding_leaves_the_range() -> None:
    budgets = choose_budgets(5.01, 5.05)  # rounding to 0.1 W would give 5.0 (below the floor) or 5.1
    assert all(5.01 <= b < 5.05 for b in budgets)
    assert budgets[0] == pytest.approx(5.01 + 0.05 * 0.04)


def test_no_budget_binds_when_the_optimum_sits_at_the_floor() -> None:
    assert choose_budgets(7.0, 7.0) == ()


# ---------------------------------------------------------------------------------------------- pareto


def test_pareto_points_drop_dominated_ones() -> None:
    pts = [(1.0, 5.0), (2.0, 3.0), (2.5, 4.0), (3.0, 1.0), (3.0, 2.0)]
    assert pareto_points(pts) == [(1.0, 5.0), (2.0, 3.0), (3.0, 1.0)]


def test_hypervolume_of_a_staircase() -> None:
    # reference (4, 6): (1,5) adds 3x1, (2,3) adds 2x2, (3,1) adds 1x2
    assert hypervolume_2d([(1.0, 5.0), (2.0, 3.0), (3.0, 1.0)], (4.0, 6.0)) == pytest.approx(3 + 4 + 2)
    assert hypervolume_2d([(5.0, 1.0)], (4.0, 6.0)) == 0.0  # beyond the reference: nothing
    assert hypervolume_2d([], (4.0, 6.0)) == 0.0


def test_hypervolume_reference_of_a_one_point_front_still_spans_an_area() -> None:
    ref = hv_reference([(10.0, 100.0)])
    assert ref == (pytest.approx(12.5), pytest.approx(125.0))
    assert hypervolume_2d([(10.0, 100.0)], ref) > 0
    wide = hv_reference([(10.0, 300.0), (40.0, 100.0)])
    assert wide == (pytest.approx(44.0), pytest.approx(330.0))


# ---------------------------------------------------------------------------------------------- thermal


@pytest.mark.parametrize("profile", ["orin-agx", "orin-nano"])
def test_the_grids_steady_state_power_is_the_twins_own_steady_state(profile: str) -> None:
    twin = Twin(profile, compute=False)
    cost = WorkloadCost(flops_per_sample=2e9, param_bytes=4e6, activation_bytes_per_sample=2e6)
    settings = [{"gpu_freq": f} for f in sorted(twin.knob_grid()["gpu_freq"])[::3]]
    t0 = twin.temperature_c
    warm = t0 + twin.profile.calibration.leak_doubling_k
    idle = np.array([twin.expected(cost, 16, s).power_w for s in settings])
    leak = np.array([twin.expected(cost, 16, s, temperature_c=warm).power_w for s in settings]) - idle
    steady = steady_mean_w(twin.profile, idle, leak, t0)
    exact = np.array([twin.steady_state(cost, 16, s).power_w for s in settings])
    assert steady == pytest.approx(exact, rel=1e-8)
    assert np.all(steady > idle) and twin.temperature_c == t0  # a warm board leaks more; the twin never ran


# ---------------------------------------------------------------------------------------------- rows


def _row(chosen: Point | None, honest: Point | None, budget: float = 10.0, objective: str = "time") -> Row:
    common = Point(20.0, 200.0, 9.0, 9.0, True)
    return Row(case=Case("orin-nano", "cnn", budget, objective, 0), floor_w=5.0, common=common,
               default_best=Point(12.0, 110.0, 9.5, 9.5, True), oracle=honest, honest=honest, chosen=chosen,
               chosen_batch=64, law=honest, measured=30, stop="", wall_s=1.0, cpu_s=1.0)


def test_gap_speedups_and_violation_of_a_row() -> None:
    honest = Point(10.0, 100.0, 9.8, 9.8, True)
    r = _row(Point(10.5, 90.0, 10.2, 10.1, True), honest)
    assert r.gap_pct == pytest.approx(5.0)
    assert r.ratio(r.common) == pytest.approx(20.0 / 10.5) and r.ratio(r.default_best) == pytest.approx(12 / 10.5)
    assert r.violation  # 10.2 W true 1-s average over a 10 W budget
    e = _row(Point(10.5, 90.0, 9.0, 9.0, True), honest, objective="energy")
    assert e.gap_pct == pytest.approx(-10.0) and not e.violation  # inside the sensor band: beats the honest
    assert e.ratio(e.common) == pytest.approx(200 / 90)


def test_a_reported_knife_edge_is_scored_as_a_user_who_takes_it_gets_it() -> None:
    honest = Point(10.0, 100.0, 9.8, 9.8, True)
    r = _row(Point(10.5, 90.0, 9.5, 9.5, True), honest)
    assert math.isnan(r.edge_gap_pct) and not r.edge_over  # none reported
    r.edge_point = Point(9.9, 95.0, 9.95, 9.9, True)  # faster, inside the sensor's band, under the budget
    assert r.edge_gap_pct == pytest.approx(-1.0) and not r.edge_over
    r.edge_point = Point(9.7, 95.0, 10.05, 10.0, True)  # its true 1-s average is over the 10-W budget
    assert r.edge_over and math.isinf(r.edge_gap_pct) and not r.violation  # the pick itself holds


def test_law_gap_and_when_the_pick_was_found() -> None:
    honest = Point(10.0, 100.0, 9.8, 9.8, True)
    r = _row(Point(10.5, 90.0, 9.0, 9.0, True), honest)
    assert r.law_gap_pct == 0.0
    r.law = Point(11.0, 100.0, 9.0, 9.0, True)  # the search's S(b) law ranks a 10% slower setting first
    assert r.law_gap_pct == pytest.approx(10.0)
    # the incumbent's truth after each measured setting: inf until one held, then 12, then 10.5 from the 3rd on
    r.trajectory = [(math.inf, math.inf), (5.0, 12.0), (4.0, 10.5), (4.0, 10.5)]
    assert r.pick_at == 3
    r.trajectory = [(math.inf, math.inf)]
    assert r.pick_at == 0


def test_a_missing_pick_is_a_miss_not_a_zero() -> None:
    r = _row(None, Point(10.0, 100.0, 9.8, 9.8, True))
    assert math.isinf(r.gap_pct) and not r.violation and math.isnan(r.ratio(r.common))


# ---------------------------------------------------------------------------------------------- truth spread


def test_a_pick_rescored_with_other_steps_to_target_moves_with_its_batch_sizes_steps(tmp_path) -> None:
    from benchlib import GridTruth, seed_steps

    from edgetune.power import open_device
    from edgetune.search.space import build_space

    curve = MeasuredCurve("cnn", "accuracy", 0.9, (16, 32, 64), (40.0, 25.0, 20.0), (30.0, 20.0, 15.0),
                          (50.0, 30.0, 25.0), (0, 1))
    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 32, (16, 32, 64), ["gpu_freq"])
    device.close()
    truth = GridTruth.build("orin-nano", space, WorkloadCost(2e9, 4e6, 2e6), curve)
    budget = float(np.median(truth.max_avg_w))
    honest = truth.feasible(budget, honest=True)
    i = int(np.flatnonzero(honest & (truth.batch_size == 32))[0])  # a setting that holds it, not the best
    b, setting = int(truth.batch_size[i]), truth.settings[i]
    best = truth.best("time", honest)
    same = truth.rescored_gap_pct(curve.median_steps, "time", budget, b, setting)
    assert same == pytest.approx((truth.point(b, setting).time_s / best.time_s - 1) * 100, rel=1e-6)
    # batch 32 ten times cheaper to converge: the batch-32 pick gains on every setting of another batch size
    cheap = truth.rescored_gap_pct((40.0, 2.5, 20.0), "time", budget, b, setting)
    assert cheap < same
    # each seed's own curve, from a table in the format convergence_truth.py writes
    table = tmp_path / "steps.csv"
    table.write_text("workload,metric,target,batch_size,seed,lr,steps,evaluations,wall_s\n"
                     + "".join(f"cnn,accuracy,0.9,{bb},{seed},0.1,{st},5,1.0\n"
                               for seed, row in ((0, (30.0, 20.0, "nan")), (1, (50.0, 30.0, 25.0)))
                               for bb, st in zip((16, 32, 64), row)))
    per_seed = seed_steps(table, curve)
    assert list(per_seed) == [0, 1] and per_seed[1] == (50.0, 30.0, 25.0) and math.isnan(per_seed[0][2])


def test_convergence_truth_replay_predicts_from_the_median_warmup(tmp_path, capsys):
    # the stored table's format, three warm-ups: the prediction uses their median and each is shown alone
    import convergence_truth

    from edgetune.predictors.convergence import NoiseScaleRow, save_b_noise_rows

    (tmp_path / "steps.csv").write_text(
        "workload,metric,target,batch_size,seed,lr,steps,evaluations,wall_s\n"
        + "".join(f"cnn,accuracy,0.9,{b},{seed},0.1,{steps * (1 + seed / 10)},5,1.0\n"
                  for seed in (0, 1, 2) for b, steps in ((32, 60.0), (64, 40.0), (128, 30.0))))
    save_b_noise_rows(tmp_path / "b_noise.csv", [
        NoiseScaleRow("cnn", value, 0.99, 128, 4, seed, 50.0, 0.9, 2 * value, 20, value / 2)
        for seed, value in ((100, 64.0), (101, 8.0), (102, 32.0))])
    assert convergence_truth.main(["--replay", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "B_noise 32.0, the median of 3 warm-up(s)" in out
    assert "warm-ups (seed: B_noise): 100: 64.0, 101: 8.0, 102: 32.0" in out
    assert "seed 101 alone: B_noise 8.0" in out
    # S_min from the median steps at the warm-ups' batch: 33 / (1 + 32 / 128) = 26.4; at b 64 26.4 x 1.5
    assert "S_min 26.4" in out and "39.6" in out
    assert out.rstrip().splitlines()[-1].startswith("steps error: ")


def test_convergence_truth_refuses_warmup_seeds_as_measured_seeds_and_keep_with_warmup_only(capsys):
    import convergence_truth

    with pytest.raises(SystemExit) as exit_:
        convergence_truth.main(["--seeds", "3,104", "--replay"])
    assert exit_.value.code == 2
    assert "none of the warm-ups' 100-108" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        convergence_truth.main(["--warmup-only", "--keep-warmup"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- online tuning


def test_online_batch_sizes_are_its_default_span_inside_the_measured_range() -> None:
    from online_gap import online_batch_sizes

    assert online_batch_sizes(32, (8, 16, 32, 64, 128, 256)) == [8, 16, 32, 64, 128]
    assert online_batch_sizes(16, (16, 32, 64, 128, 256)) == [16, 32, 64]


def test_online_gap_scores_what_the_run_trained_at_against_the_whole_space() -> None:
    """One case of experiments/online_gap.py end to end: an Orin NX at the middle cnn budget. Online tuning's
    own space (batch size x GPU clock, the rest as found) is part of the whole, so its best is no better than the
    honest oracle, and the run ends at a setting that holds the budget."""
    import online_gap
    from benchlib import CONVERGENCE_TABLE, Bench, make_cases

    bench = Bench.load(["orin-nx"], ["cnn"], CONVERGENCE_TABLE, seed=0)
    case = make_cases(bench.truths, "time")[0][1]
    row = online_gap.run_online(bench, case, seed=0, steps=150)
    assert row.settled is not None and row.final is not None and row.honest is not None
    # here the guard left the settled setting alone, and it is the best its space holds
    assert row.final == row.settled and row.gap_pct == pytest.approx(row.reach_gap_pct) and row.reach_gap_pct > 3.0
    assert not row.violation and row.final.max_avg_w <= case.budget_w
    assert 1 <= row.candidates <= 6 and 0 < row.explore_steps <= 6 * 20 and row.explore_s > 0
    lines = online_gap.summary([row])
    assert lines[-1].startswith(f"online: worst gap {row.gap_pct:.2f}% | median gap {row.gap_pct:.2f}% | within 3%: "
                                f"0 of 1")
