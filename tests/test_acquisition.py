"""The guided sampler's scores as pure functions (edgetune.search.samplers.acquisition)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetune.search.samplers.acquisition import Aim, Prediction, best_measured, norm_cdf, score

STEPS = np.full(4, 1000.0)
BATCH = np.full(4, 32)


def prediction(step_time_s, power_w, time_rel_std=0.05, power_std_w=0.1) -> Prediction:
    t = np.asarray(step_time_s, dtype=float)
    return Prediction(t, np.asarray(power_w, dtype=float), np.full(t.size, time_rel_std), np.full(t.size, power_std_w))


def scored(aim: Aim, pred: Prediction, best: float, **kw):
    n = pred.step_time_s.size
    kw.setdefault("certain", np.zeros(n, dtype=bool))
    kw.setdefault("free", np.ones(n, dtype=bool))
    return score(aim, np.arange(n), pred, STEPS[:n], BATCH[:n], best=best, **kw)


def test_a_prediction_is_kept_within_the_measured_bounds_and_its_power_doubt_widened() -> None:
    pred = Prediction.of(np.array([0.1, np.nan]), np.array([5.0, 9.0]), np.array([0.01, np.nan]),
                         np.array([0.1, np.nan]), np.array([5.5, -np.inf]), np.array([np.inf, 8.0]))
    assert pred.power_w.tolist() == [5.5, 8.0]  # raised to the measured floor, lowered to the measured ceiling
    assert pred.step_time_s[1] == math.inf and pred.time_rel_std.tolist() == pytest.approx([0.1, 1.0])
    assert pred.power_std_w.tolist() == [pytest.approx(0.2), math.inf]  # twice the fit's; none given: unbounded
    same = Prediction.of(np.array([0.1]), np.array([5.0]), np.array([0.01]), np.array([0.1]), np.array([-np.inf]),
                         np.array([np.inf]), power_std_scale=1.0)
    assert same.power_std_w.tolist() == pytest.approx([0.1])


def test_the_constrained_expected_improvement_weighs_the_gain_by_the_chance_of_holding_the_aim() -> None:
    aim = Aim("time", budget_w=10.0, accuracy_w=0.5)
    best = math.log(1000 * 0.1)
    # faster and well under the aim, faster and at the aim (half likely), slower, faster but certain to fail
    s = scored(aim, prediction([0.09, 0.09, 0.12, 0.09], [8.0, 9.5, 8.0, 8.0]), best,
               certain=np.array([False, False, False, True]))
    assert s.p_feas[0] == pytest.approx(1.0) and s.p_feas[1] == pytest.approx(0.5) and s.p_feas[3] == 0.0
    assert s.acquisition[1] == pytest.approx(0.5 * s.acquisition[0])
    assert 0 < s.acquisition[2] < 0.01 * s.acquisition[0]
    assert s.acquisition[3] == -np.inf and not s.possible[3] and s.best == best
    # the aim is the budget less the sensor's accuracy: without it, the second is as good as the first
    loose = scored(Aim("time", budget_w=10.0), prediction([0.09, 0.09], [8.0, 9.5]), best)
    assert loose.acquisition[1] == pytest.approx(loose.acquisition[0], rel=1e-6)


def test_a_setting_certain_to_fail_is_never_proposed_without_a_budget_either() -> None:
    """Out of memory in an unconstrained search: its gain was 0, a proposal once every other's underflowed."""
    best = math.log(1000 * 0.001)  # far faster than either: both gains underflow to 0
    s = scored(Aim("time", budget_w=None), prediction([0.1, 0.1], [8.0, 8.0]), best,
               certain=np.array([False, True]))
    assert s.acquisition[0] == 0.0 and s.acquisition[1] == -np.inf and s.possible.tolist() == [True, False]


def test_safe_profiling_rules_out_the_unlikely_and_the_long_steps_likely_clearly_over() -> None:
    aim = Aim("time", budget_w=10.0, min_feasible_p=0.05, over_budget_allowance_s=0.1)
    # as likely over as not: a 1-s step would run about 0.5 s clearly over, a 10-ms one 5 ms; far over: unlikely
    s = scored(aim, prediction([1.0, 0.01, 0.01], [10.2, 10.2, 11.0], power_std_w=0.2), math.log(1000 * 2.0))
    assert s.expected_over_s[:2].tolist() == pytest.approx([0.5, 0.005])
    assert s.plausible.tolist() == [False, True, False]
    assert s.acquisition[0] == -np.inf and np.isfinite(s.acquisition[1]) and s.acquisition[2] == -np.inf
    # unconstrained: everything is plausible and nothing is over
    free = scored(Aim("time", budget_w=None), prediction([1.0, 0.01, 0.01], [10.2, 10.2, 11.0]), math.log(2000.0))
    assert free.plausible.all() and not free.expected_over_s.any() and (free.p_feas == 1.0).all()


def test_before_an_incumbent_the_search_looks_for_feasibility_and_a_prior_for_the_likely_best() -> None:
    aim = Aim("time", budget_w=10.0)
    pred = prediction([0.05, 0.1, 0.2], [10.05, 8.0, 8.0])
    s = scored(aim, pred, math.inf)
    assert s.acquisition.tolist() == pytest.approx(s.p_feas.tolist())  # improvement 1, times the chance to hold
    # with a prior the model knows where to look: the best setting likely to hold is the reference, and only
    # such settings are proposable
    warm = scored(aim, pred, math.inf, prior=True)
    assert warm.acquisition[0] == -np.inf and warm.acquisition[1] > warm.acquisition[2] > 0


def test_each_objective_scores_its_own_log_value_and_doubt() -> None:
    pred = prediction([0.1], [5.0], time_rel_std=0.03, power_std_w=0.2)
    one = (np.array([1000.0]), np.array([32]))
    assert Aim("time", None).predicted_log(*one, pred)[0][0] == pytest.approx(math.log(100.0))
    log_e, s_e = Aim("energy", None).predicted_log(*one, pred)
    assert log_e[0] == pytest.approx(math.log(500.0)) and s_e[0] == pytest.approx(math.hypot(0.03, 0.04))
    assert Aim("throughput", None).predicted_log(*one, pred)[0][0] == pytest.approx(math.log(0.1 / 32))
    with pytest.raises(AssertionError):
        Aim("cost", None).predicted_log(*one, pred)  # the cost objective needs its weights


def test_the_incumbent_is_the_best_setting_held_by_the_sensors_accuracy_and_the_edge_one_held_by_less() -> None:
    aim = Aim("time", budget_w=10.0, accuracy_w=0.3)
    # steps, batch, step time (s), judged power (W): the fastest is over, the next held but not by 0.3 W
    rows = [(1000.0, 32, 0.08, 10.2), (1000.0, 32, 0.09, 9.9), (1000.0, 32, 0.1, 9.5), (1000.0, 32, 0.2, 5.0)]
    assert best_measured(aim, rows) == (2, pytest.approx(math.log(100.0)))
    assert best_measured(aim, rows, held_only=True) == (1, pytest.approx(math.log(90.0)))
    assert best_measured(aim, rows[:2]) == (None, math.inf)
    assert best_measured(Aim("time", None), rows)[0] == 0


def test_the_normal_cdf_is_the_erf_form() -> None:
    assert norm_cdf(np.array([0.0, 1.0, -1.0])).tolist() == pytest.approx([0.5, 0.841344746, 0.158655254])
