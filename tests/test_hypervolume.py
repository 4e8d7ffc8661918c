"""The two-objective hypervolume the pareto objective's acquisition is built on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetune.search.samplers.hypervolume import (
    expected_improvement,
    front,
    hypervolume,
    improvement,
    reference_point,
)

FRONT = np.array([[1.0, 5.0], [2.0, 3.0], [3.0, 1.0]])
REF = np.array([4.0, 6.0])


def test_the_front_keeps_the_non_dominated_points_sorted_by_the_first_objective() -> None:
    pts = np.array([[3.0, 1.0], [2.5, 4.0], [1.0, 5.0], [2.0, 3.0], [2.0, 3.5], [np.nan, 0.0]])
    assert front(pts).tolist() == FRONT.tolist()
    assert front(np.empty((0, 2))).shape == (0, 2)


def test_the_hypervolume_is_the_staircase_area_up_to_the_reference() -> None:
    assert hypervolume(FRONT, REF) == pytest.approx(1.0 * 1.0 + 1.0 * 3.0 + 1.0 * 5.0)
    # a point not better than the reference in both objectives adds nothing
    assert hypervolume(np.vstack([FRONT, [[0.5, 7.0]]]), REF) == pytest.approx(9.0)


def test_a_point_adds_the_area_between_it_the_reference_and_the_staircase() -> None:
    added = improvement(np.array([1.5, 0.0, 5.0, 2.0]), np.array([2.0, 0.0, 0.0, 3.0]), FRONT, REF)
    # (1.5, 2): 0.5 x 3 over [1.5, 2), 1 x 1 over [2, 3); the origin: the whole box less the front's area;
    # beyond the reference or on the front: nothing
    assert added.tolist() == pytest.approx([2.5, 24.0 - 9.0, 0.0, 0.0])
    for x, y in [(1.5, 2.0), (0.2, 5.5)]:  # the same as the hypervolume with the point added
        with_point = hypervolume(np.vstack([FRONT, [[x, y]]]), REF)
        assert improvement(np.array(x), np.array(y), FRONT, REF) == pytest.approx(with_point - 9.0)


def test_the_reference_lets_the_ends_count_and_gives_one_point_an_area() -> None:
    logs = np.log(np.array([[10.0, 100.0], [20.0, 50.0]]))
    ref = reference_point(logs)
    # 1.1 x the nadir, at least 1.25 x the ideal
    assert np.exp(ref).tolist() == pytest.approx([max(1.1 * 20, 1.25 * 10), max(1.1 * 100, 1.25 * 50)])
    one = np.log(np.array([[10.0, 100.0]]))
    assert np.exp(reference_point(one)).tolist() == pytest.approx([12.5, 125.0])
    assert hypervolume(one, reference_point(one)) == pytest.approx(math.log(1.25) ** 2)
    with pytest.raises(ValueError, match="empty front"):
        reference_point(np.empty((0, 2)))


def test_the_expected_improvement_averages_the_draws_that_hold_the_constraint() -> None:
    rng = np.random.default_rng(0)
    x = np.array([[1.5] * 4, [0.0] * 4]) + rng.normal(0.0, 1e-12, (2, 4))
    y = np.array([[2.0] * 4, [0.0] * 4])
    every = np.ones((2, 4), dtype=bool)
    assert expected_improvement(x, y, every, FRONT, REF).tolist() == pytest.approx([2.5, 15.0])
    half = np.array([[True, False, True, False], [False] * 4])
    assert expected_improvement(x, y, half, FRONT, REF).tolist() == pytest.approx([1.25, 0.0])


def test_the_pareto_objective_scores_a_candidate_by_what_it_adds_to_the_measured_front_under_the_budget() -> None:
    from edgetune.search.samplers.acquisition import Aim, Prediction, pareto_gain

    aim = Aim("energy", budget_w=6.0)
    steps = 1200.0

    def predicted(time_s: np.ndarray, power_w: np.ndarray, rel: np.ndarray, power_std_w: np.ndarray) -> Prediction:
        return Prediction(time_s / steps, power_w, rel, power_std_w)

    # two settings on the front (fast and hungry, slow and frugal) and one over the budget: time to target, s,
    # and judged power, W
    measured_s, measured_w = steps * np.array([0.10, 0.05, 0.03]), np.array([2.0, 5.0, 7.0])
    # candidates, as total time (steps x step time, s) and judged power (W): between the two, dominated by the
    # fast one, the same as the first but over the limit, and the first again but certain to fail
    time_s = steps * np.array([0.07, 0.06, 0.07, 0.07])
    power = np.array([3.0, 5.5, 8.0, 3.0])
    rel = np.full(4, 0.01)
    certain = np.array([False, False, False, True])
    gain = pareto_gain(aim, measured_s, measured_w, time_s, predicted(time_s, power, rel, 0.01 * power), certain)
    assert gain[0] > 0.05 and gain[1] == pytest.approx(0.0, abs=1e-6) and gain[2] == 0.0 and gain[3] == 0.0
    # the gain reads as a relative improvement: a point 1% faster than a one-point front at its energy adds 1%
    tiny = np.full(1, 1e-6)
    fast = steps * np.array([0.0495])
    edge = pareto_gain(aim, measured_s[1:2], measured_w[1:2], fast,
                       predicted(fast, np.array([5.0 * 0.05 / 0.0495]), tiny, tiny), np.array([False]))
    assert edge[0] == pytest.approx(0.01, rel=0.05)
    # the aim is the budget less the sensor's accuracy: a faster point drawing 5.5 W adds to the front under a
    # 6 W budget, and nothing where the sensor's accuracy (0.6 W) leaves an aim of 5.4 W
    faster, hungry = steps * np.array([0.04]), np.array([5.5])
    for accuracy_w, adds in ((0.0, True), (0.6, False)):
        gain = pareto_gain(Aim("energy", budget_w=6.0, accuracy_w=accuracy_w), measured_s[:2], measured_w[:2],
                           faster, predicted(faster, hungry, rel[:1], tiny), np.array([False]))
        assert bool(gain[0] > 0.05) is adds and bool(gain[0] == 0.0) is not adds
    # before a measured setting held the budget there is no front: the search looks for one as for time
    assert pareto_gain(aim, measured_s[2:], measured_w[2:], time_s, predicted(time_s, power, rel, 0.01 * power),
                       certain) is None
