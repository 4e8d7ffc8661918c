"""The thermal soak (edgetune/search/thermal.py) and the board temperature each backend reads."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from edgetune.power import open_device
from edgetune.search import records
from edgetune.search.results import best_json, certified, margin_w
from edgetune.search.thermal import ThermalSoak, fit_soak
from edgetune.workloads import load_workload
from tests.test_search import search, small_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


# ---------------------------------------------------------------------------------------------- the fit


def _first_order(t_s: np.ndarray, resolution_k: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """A board from 35 C towards 50 C (time constant 300 s), 0.15 W more per kelvin above 20 W."""
    temp = 50.0 - 15.0 * np.exp(-t_s / 300.0)
    power = 20.0 + 0.15 * (temp - 35.0)
    if resolution_k:
        temp = np.round(temp / resolution_k) * resolution_k
    return temp, power


@pytest.mark.parametrize(("resolution_k", "within_k"), [(0.0, 0.05), (1 / 32, 0.3), (0.5, 2.0)])
def test_the_fit_extrapolates_a_first_order_approach_to_its_steady_state(resolution_k: float,
                                                                         within_k: float) -> None:
    t = np.arange(5.0, 181.0, 5.0)  # a 180-s soak: 0.6 of the time constant
    temp, power = _first_order(t, resolution_k)
    fit = fit_soak(t, power, temp.tolist())
    assert fit.extrapolated and fit.slope_w_per_k == pytest.approx(0.15, rel=0.05)
    assert fit.steady_temperature_c == pytest.approx(50.0, abs=within_k)  # Orin's 1/32 K steps; Xavier's 1/2 K
    assert fit.steady_power_w == pytest.approx(22.25, abs=0.15 * within_k + 0.01)
    assert fit.steady_power_w > power[-1]  # more than the soak saw: the board had minutes more to warm


def test_without_a_temperature_the_soak_keeps_what_it_saw() -> None:
    fit = fit_soak([5.0, 10.0, 15.0, 20.0], [20.0, 20.1, 20.2, 20.25], [None] * 4)
    assert fit.steady_power_w == 20.25 and not fit.extrapolated and fit.steady_temperature_c is None


def test_a_board_at_its_steady_temperature_draws_its_mean_power() -> None:
    fit = fit_soak([5.0, 10.0, 15.0, 20.0], [20.0, 20.2, 19.9, 20.1], [45.0] * 4)
    assert fit.steady_power_w == pytest.approx(20.05) and fit.slope_w_per_k == 0.0 and fit.extrapolated


def test_a_temperature_still_rising_in_a_straight_line_is_extrapolated_no_further_than_the_cap() -> None:
    t = np.arange(5.0, 61.0, 5.0)
    temp = 35.0 + 0.02 * t  # no curvature at all
    fit = fit_soak(t, 20.0 + 0.1 * (temp - 35.0), temp.tolist())
    assert fit.tau_s is not None and fit.tau_s <= 4 * (t[-1] - t[0])
    assert fit.steady_power_w < 20.0 + 0.1 * 0.02 * 10 * t[-1]  # bounded, not a line to infinity


def test_a_soak_fit_needs_one_figure_per_window() -> None:
    with pytest.raises(ValueError, match="one time, power and temperature per window"):
        fit_soak([1.0, 2.0], [20.0], [None, None])


def test_a_soak_round_trips_through_its_dict() -> None:
    s = ThermalSoak(batch_size=32, setting={"gpu_freq": 918000000}, cool_power_w=20.0, duration_s=180.0,
                    t_s=[5.0], power_w=[20.1], temperature_c=[35.0], steady_power_w=21.0, extrapolated=True)
    d = s.to_dict()
    assert d["rise_w"] == pytest.approx(1.0) and ThermalSoak.from_dict(d) == s
    assert ThermalSoak(batch_size=8, setting={}, cool_power_w=20.0, duration_s=0.0).rise_w == 0.0  # nothing run


# ---------------------------------------------------------------------------------------------- readings


def test_the_twin_reports_its_temperature_as_a_thermal_zone_would() -> None:
    device = open_device("sim:orin-nano", compute=False, seed=0)
    reading = device.temperature_c
    exact = device.backend.temperature_c
    step = device.backend.profile.calibration.thermal_resolution_k
    assert step == 1 / 32 and reading is not None and abs(reading - exact) <= step / 2
    assert reading / step == pytest.approx(round(reading / step))


# ---------------------------------------------------------------------------------------------- the search


@pytest.fixture(scope="module")
def cnn():
    return load_workload("cnn")


def test_the_search_soaks_its_pick_and_holds_the_budget_on_the_warm_board(cnn) -> None:
    device = open_device("sim:orin-agx", compute=False, seed=0)
    twin = device.backend
    space = small_space(device, batch_sizes=(16, 32, 64))
    budget = 13.0  # the space (the mode as found, GPU and EMC clocks) draws up to 15 W
    storage = optuna.storages.InMemoryStorage()
    s = search(device, cnn, space, budget, n_trials=16, seed=0, storage=storage, soak_s=120.0)
    result = s.run()
    soak = result.thermal
    assert soak is not None and soak.extrapolated and soak.rise_w > 0.1  # the AGX Orin leaks more warm
    assert soak.duration_s >= 120.0 or soak.stopped_over_budget
    assert result.required_margin_w == pytest.approx(result.accuracy_w + soak.rise_w)
    # the pick holds the budget by the sensor's accuracy plus the rise, and so on the warm board's truth
    assert result.best is not None and certified(result.best, result.limit_w, result.required_margin_w)
    assert margin_w(result.best, result.limit_w) >= soak.rise_w
    steady = twin.steady_state(cnn.cost, result.best.candidate.batch_size, result.best.candidate.knobs)
    assert steady.power_w <= budget
    doc = best_json(result)["thermal_soak"]
    assert doc["rise_w"] == pytest.approx(soak.rise_w) and "thermal soak of batch" in doc["summary"]
    assert doc["batch_size"] in (16, 32, 64) and len(doc["t_s"]) == len(doc["temperature_c"]) > 4
    # the study keeps it: a resume judges with the same rise and does not soak again
    stored = records.read_soaks(optuna.load_study(study_name="test", storage=storage))
    assert max(d["rise_w"] for d in stored) == pytest.approx(soak.rise_w) and len(stored) == len(result.thermal_soaks)
    before = device.clock.now()
    again = search(device, cnn, space, budget, n_trials=16, seed=0, storage=storage, soak_s=120.0).run()
    assert again.thermal is not None and again.thermal.rise_w == pytest.approx(soak.rise_w)
    assert device.clock.now() - before < 60.0


def test_no_soak_without_a_budget_or_when_disabled(cnn) -> None:
    device = open_device("sim:orin-nano", compute=False, seed=0)
    space = small_space(device, batch_sizes=(16, 32))
    assert search(device, cnn, space, None, n_trials=4, seed=0).run().thermal is None
    off = search(device, cnn, space, 6.0, n_trials=4, seed=0, soak_s=0.0).run()
    assert off.thermal is None and off.thermal_rise_w == 0.0 and best_json(off)["thermal_soak"] is None
    assert not math.isnan(off.accuracy_w) and off.required_margin_w == off.accuracy_w


def test_a_negative_soak_is_refused_in_one_line(cnn) -> None:
    from edgetune.search.storage import SearchError

    device = open_device("sim:orin-nano", compute=False, seed=0)
    with pytest.raises(SearchError, match="--soak-s 0"):
        search(device, cnn, small_space(device), 6.0, soak_s=-1.0)


def test_a_soak_that_crosses_the_budget_is_stopped_there_and_keeps_what_it_saw(cnn) -> None:
    from edgetune.power import PowerMonitor
    from edgetune.search.thermal import soak

    device = open_device("sim:orin-agx", compute=False, seed=0)
    setting = {"gpu_freq": max(device.knobs["gpu_freq"].values)}
    cool = device.backend.expected(cnn.cost, 32, setting).power_w
    steady = device.backend.steady_state(cnn.cost, 32, setting).power_w
    limit = cool + 0.3 * (steady - cool)  # held on the cool board, crossed as it warms
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        s = soak(device, cnn, 32, setting, monitor, cool_power_w=cool, limit_w=limit, duration_s=300.0)
    assert s.stopped_over_budget and s.duration_s < 300.0 and s.over_budget_s > 0
    assert s.steady_power_w >= s.power_w[-1] and s.cool_power_w + s.rise_w > limit
