"""The thermal soak (edgetune/search/thermal.py) and the board temperature each backend reads."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest

from edgetune.power import open_device
from edgetune.power.knobs import Candidate
from edgetune.search import records
from edgetune.search.results import best_json, certified, margin_w
from edgetune.search.space import build_space
from edgetune.search.thermal import SOAK_CHUNK_S, SOAK_S, ThermalSoak, fit_soak, thermal_reference
from edgetune.search.window import judged_power_w
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


@pytest.mark.parametrize(("resolution_k", "within_k"), [(0.0, 0.05), (1 / 32, 0.05), (0.5, 0.3), (1.0, 0.7)])
def test_the_fit_extrapolates_a_first_order_approach_to_its_steady_state(resolution_k: float,
                                                                         within_k: float) -> None:
    t = np.arange(5.0, SOAK_S + 1.0, 5.0)  # a 360-s soak: 1.2 time constants
    temp, power = _first_order(t, resolution_k)
    fit = fit_soak(t, power, temp.tolist())
    assert fit.extrapolated and fit.slope_w_per_k == pytest.approx(0.15, rel=0.05)
    # Orin's 1/32 K steps, Xavier's 1/2 K, NVML's whole kelvins
    assert fit.steady_temperature_c == pytest.approx(50.0, abs=within_k)
    assert fit.steady_power_w == pytest.approx(22.25, abs=0.15 * within_k + 0.01)
    assert fit.steady_power_w > power[-1]  # more than the soak saw: the board had minutes more to warm
    assert not fit.tau_bounded and fit.tau_s == pytest.approx(300.0, rel=0.1)


def test_coarse_readings_are_fitted_where_they_cross_from_one_step_to_the_next() -> None:
    # a board 2.5 K under its steady temperature, read in Xavier's half kelvins: three or four steps in 360 s.
    # Fitted as they read, the plateaus bend the curve (a steady temperature 0.65 K low to 0.84 K high over
    # these five boards); fitted where they cross, within 0.3 K
    t = np.arange(5.0, SOAK_S + 1.0, 5.0)
    for steady_c in (40.0, 40.1, 40.2, 40.3, 40.4):
        temp = steady_c - 2.5 * np.exp(-t / 300.0)
        readings = np.round(temp / 0.5) * 0.5
        fit = fit_soak(t, 20.0 + 0.02 * (temp - 37.7), readings.tolist())
        assert fit.steady_temperature_c == pytest.approx(steady_c, abs=0.3) and not fit.tau_bounded


def test_without_a_temperature_the_soak_keeps_what_it_saw() -> None:
    fit = fit_soak([5.0, 10.0, 15.0, 20.0], [20.0, 20.1, 20.2, 20.25], [None] * 4)
    assert fit.steady_power_w == 20.25 and not fit.extrapolated and fit.steady_temperature_c is None


def test_a_board_at_its_steady_temperature_draws_its_mean_power() -> None:
    fit = fit_soak([5.0, 10.0, 15.0, 20.0], [20.0, 20.2, 19.9, 20.1], [45.0] * 4)
    assert fit.steady_power_w == pytest.approx(20.05) and fit.slope_w_per_k == 0.0 and fit.extrapolated


@pytest.mark.parametrize(("end_s", "cap_s"), [(60.0, 4 * 55.0), (SOAK_S, 720.0)])
def test_a_temperature_still_rising_in_a_straight_line_is_extrapolated_no_further_than_the_cap(
        end_s: float, cap_s: float) -> None:
    t = np.arange(5.0, end_s + 1.0, 5.0)
    temp = 35.0 + 0.02 * t  # no curvature at all
    fit = fit_soak(t, 20.0 + 0.1 * (temp - 35.0), temp.tolist())
    # four times a short soak (one stopped over the budget), twice a developer kit's time constant at most
    assert fit.tau_s is not None and 0.9 * cap_s <= fit.tau_s <= cap_s and fit.tau_bounded
    assert fit.steady_power_w < 20.0 + 0.1 * 0.02 * (t[-1] + cap_s)  # bounded, not a line to infinity


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
    # the rise per watt of the soaked pick, carried to a setting at the edge (the limit less the accuracy)
    rho, edge_w = soak.rise_w / soak.cool_power_w, result.limit_w - result.accuracy_w
    assert result.thermal_rise_w == pytest.approx(rho * edge_w / (1.0 + rho))
    assert result.required_margin_w == pytest.approx(result.accuracy_w + result.thermal_rise_w)
    # the pick holds the budget by the sensor's accuracy plus the rise, and so on the warm board's truth
    assert result.best is not None and certified(result.best, result.limit_w, result.required_margin_w)
    assert margin_w(result.best, result.limit_w) >= result.thermal_rise_w
    steady = twin.steady_state(cnn.cost, result.best.candidate.batch_size, result.best.candidate.knobs)
    assert steady.power_w <= budget
    doc = best_json(result)["thermal_soak"]
    assert doc["rise_w"] == pytest.approx(soak.rise_w) and "thermal soak of batch" in doc["summary"]
    assert doc["batch_size"] in (16, 32, 64) and len(doc["t_s"]) == len(doc["temperature_c"]) > 4
    # it keeps how far the pick's judged power (1-s maximum, guard band) read over its mean in its search windows
    # (the mean over the windows before the soak: the first few of that setting's, in the order measured)
    first = result.thermal_soaks[0]
    windows = sorted((r for r in s.records(as_measured=True) if r.measured and r.measurement
                      and r.candidate == Candidate.of(first.batch_size, first.setting)), key=lambda r: r.number)
    excess = [judged_power_w(r.measurement["max_avg_power_w"], r.measurement["power_se_w"], s.guard_sigma)
              - r.measurement["mean_power_w"] for r in windows]
    before = [float(np.mean(excess[:n])) for n in range(1, len(excess) + 1)]
    assert first.cool_excess_w == pytest.approx(min(before, key=lambda e: abs(e - first.cool_excess_w)))
    assert 0.0 < first.cool_excess_w < 1.0
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
    # the stretch stopped over the budget is not a window of the fit: every fitted window ran its chunk and held
    assert all(b - a >= 0.99 * SOAK_CHUNK_S for a, b in zip([0.0, *s.t_s], s.t_s))
    assert s.duration_s > s.t_s[-1]  # it ran on past the last fitted window, into the stretch that was stopped


def test_a_soak_of_one_time_constant_reads_a_half_kelvin_board_where_half_of_it_cannot(cnn) -> None:
    from edgetune.power import PowerMonitor
    from edgetune.search.thermal import soak

    def soaked(duration_s: float) -> tuple[ThermalSoak, float]:
        # Xavier NX reads half kelvins: a board 1.5 K under the setting's steady temperature warms by two of its
        # steps in 180 s, a straight line to the fit
        device = open_device("sim:xavier-nx", compute=False, seed=0)
        twin = device.backend
        setting = {"gpu_freq": sorted(device.knobs["gpu_freq"].values)[6]}
        steady = twin.steady_state(cnn.cost, 32, setting)
        twin.set_temperature(steady.temperature_c - 1.5)
        cool = twin.expected(cnn.cost, 32, setting).power_w
        with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
            s = soak(device, cnn, 32, setting, monitor, cool_power_w=cool, limit_w=None, duration_s=duration_s)
        return s, steady.power_w - cool

    short, true_rise = soaked(SOAK_S / 2)
    assert short.tau_bounded and short.rise_w > 1.4 * true_rise  # the longest time constant allowed: too far
    assert "the longest the fit allows" in short.describe()
    full, _ = soaked(SOAK_S)
    assert not full.tau_bounded and full.rise_w == pytest.approx(true_rise, rel=0.15)
    assert "the longest" not in full.describe()


@pytest.mark.parametrize(("below_k", "over_w", "ran_half"), [(4.0, 0.12, True), (0.5, 0.15, False)])
def test_a_soak_stopped_by_its_ripple_takes_its_mean_to_the_limit_less_the_ripple_once_it_ran_half_its_length(
        below_k: float, over_w: float, ran_half: bool) -> None:
    from edgetune.power import PowerMonitor
    from edgetune.search.thermal import soak

    # Orin Nano, chartransformer at batch 128: 0.6-s steps whose 1-s average reads about 0.2 W over their mean.
    # The limit is over the warm board's mean power by less than that, so only the ripple crosses it
    workload = load_workload("chartransformer")
    device = open_device("sim:orin-nano", compute=False, seed=0)
    twin = device.backend
    setting = {"gpu_freq": 510000000}
    warm = twin.steady_state(workload.cost, 128, setting)
    twin.set_temperature(warm.temperature_c - below_k)
    cool_w = twin.expected(workload.cost, 128, setting).power_w
    limit = warm.power_w + over_w
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        s = soak(device, workload, 128, setting, monitor, cool_power_w=cool_w, limit_w=limit)
    assert s.stopped_over_budget and (s.duration_s >= SOAK_S / 2) == ran_half
    if ran_half:  # 4 K under: stopped after 243 s, its fit read the rise (0.15 W; the limit: 0.12 W over the warm mean)
        assert s.steady_power_w < limit - 0.1
        assert s.rise_w == pytest.approx(warm.power_w - cool_w, abs=0.03)
    else:  # 0.5 K under: stopped after 15 s, too few windows to trust the fit: the limit stands
        assert s.duration_s < 60.0 and s.steady_power_w == pytest.approx(limit)


# ---------------------------------------------------------------------------------------------- the margin


def _soak(rise_w: float, *, stopped: bool = False, cool_w: float = 20.0, limit_w: float | None = 20.4,
          cool_c: float | None = 35.0, slope: float | None = 0.1) -> ThermalSoak:
    return ThermalSoak(batch_size=32, setting={}, cool_power_w=cool_w, duration_s=45.0 if stopped else 180.0,
                       steady_power_w=cool_w + rise_w, stopped_over_budget=stopped, limit_w=limit_w,
                       cool_temperature_c=cool_c, slope_w_per_k=slope, extrapolated=True)


def test_every_soak_s_rise_is_counted_from_the_coolest_temperature_a_soaked_pick_was_measured_at() -> None:
    from edgetune.search.thermal import governing, thermal_rise_w

    # the benchmark's orin-agx chartransformer 25.3 W pareto row: two soaks stopped over the budget, then one that
    # ran to its end, its pick measured on the board the first two had warmed (36.05 C against 32.4 C)
    first = _soak(0.78, stopped=True, cool_w=24.65, limit_w=25.3, cool_c=32.375, slope=0.274)
    second = _soak(1.67, stopped=True, cool_w=24.30, limit_w=25.3, cool_c=33.125, slope=0.165)
    third = _soak(0.98, cool_w=23.41, limit_w=25.3, cool_c=36.052, slope=0.163)
    first.power_w, second.power_w = [24.80, 24.90], [24.60, 24.75]  # the windows before each stop
    ref = thermal_reference([first, second, third])
    assert ref.temperature_c == 32.375 and ref.slope_w_per_k == 0.163  # the coolest; the complete soak's slope
    # from the reference, the third pick rose by what its own soak saw and what its warm windows read high
    assert thermal_rise_w([third]) == pytest.approx(0.98)  # alone, it is its own reference
    assert thermal_rise_w([first, third]) == pytest.approx(0.98 + 0.163 * (36.052 - 32.375))
    # before the third ran to its end, the second's extrapolation counted; after, what its windows proved (stopped
    # within a minute: its fit is not counted over it)
    assert thermal_rise_w([first, second]) == pytest.approx(1.67 + 0.165 * 0.75)  # no complete soak: its slope
    assert thermal_rise_w([first, second, third]) == pytest.approx(0.98 + 0.163 * (36.052 - 32.375))
    assert governing([first, second]) is second and governing([first, second, third]) is third
    assert thermal_rise_w([]) == 0.0 and governing([]) is None
    assert "by 1.79 W more" in second.describe(thermal_rise_w([first, second]))


def test_a_soaks_rise_is_carried_to_the_edge_of_the_budget_per_watt() -> None:
    from edgetune.search.thermal import thermal_rise_w

    # the rise grows with the power drawn: 1 W at 20 W cool is 5% per watt; a setting that reaches the edge
    # (24 W here) warm draws 24 / 1.05 W cool and rises by 5% of that
    soak = _soak(1.0, cool_w=20.0, limit_w=24.4)
    assert thermal_rise_w([soak], edge_w=24.0) == pytest.approx(0.05 * 24.0 / 1.05)  # more than the soaked 1 W
    hotter = _soak(1.0, cool_w=25.0, limit_w=27.0)  # the same rise at more power: less per watt
    assert thermal_rise_w([hotter], edge_w=24.0) == pytest.approx(0.04 * 24.0 / 1.04)
    assert thermal_rise_w([soak, hotter], edge_w=24.0) == thermal_rise_w([soak], edge_w=24.0)  # the larger share
    assert thermal_rise_w([soak], edge_w=0.0) == 0.0 and thermal_rise_w([], edge_w=24.0) == 0.0


def test_a_stopped_soak_counts_what_it_proved_once_another_ran_to_its_end() -> None:
    from edgetune.search.thermal import thermal_rise_w

    # stopped at its limit (20.4 W, windows of 20.1 and 20.3 W mean) from 20.0 W cool, extrapolated to a 0.9 W
    # rise from the windows before the stop; a later pick's soak ran to its end and measured 0.2 W at 19.6 W
    stopped = _soak(0.9, stopped=True, cool_w=20.0, limit_w=20.4, cool_c=None)
    stopped.power_w = [20.1, 20.3]
    complete = _soak(0.2, cool_w=19.6, cool_c=None)
    assert thermal_rise_w([stopped]) == pytest.approx(0.9)  # alone, its extrapolation is all there is
    assert thermal_rise_w([stopped, complete]) == pytest.approx(0.3)  # it proved 20.3 - 20.0 W of its mean
    # stopped in its first window: its stop proved a 1-s average (with the guard band) at the limit, so a mean at
    # least the limit less how far its judged power read over its mean in the search's windows (0.15 W)
    stopped.power_w, stopped.cool_excess_w = [], 0.15
    assert thermal_rise_w([stopped, complete]) == pytest.approx(20.4 - 0.15 - 20.0)
    assert thermal_rise_w([stopped]) == pytest.approx(0.9)  # with no complete soak, its extrapolation stands
    stopped.cool_excess_w = 0.6  # a ripple and guard band wider than the distance to the limit: nothing proved
    assert thermal_rise_w([stopped, complete]) == pytest.approx(0.2)
    stopped.cool_excess_w = None  # not known (a study stored before it was kept): the extrapolation stands
    assert thermal_rise_w([stopped, complete]) == pytest.approx(0.9)


def test_a_stopped_soak_that_ran_a_minute_counts_its_fit_where_that_is_more_than_it_proved() -> None:
    from edgetune.search.thermal import STOPPED_FIT_S, thermal_rise_w

    # the pareto benchmark's AGX Orin mobilenet at 33.3 W (seed 0): a 30 W-mode pick soaked to its end, 0.29 W
    # from 16.34 W; the front's hottest point soaked after it, stopped over the budget after 186 s with its fit at
    # a 2.56-W rise from 31.89 W (the truth about 3 W), its windows up to 33.3 W proving 1.41 W. Counted as
    # proven, the rise carried to its neighbours was 1.26 W, and three of them drew 34.6-34.8 W warm
    complete = _soak(0.29, cool_w=16.34, limit_w=33.3, cool_c=None)
    hottest = _soak(2.56, stopped=True, cool_w=31.89, limit_w=33.3, cool_c=None)
    hottest.duration_s, hottest.power_w = 186.0, [32.0, 32.6, 33.3]
    edge = 33.3 - 0.59
    rho = 2.56 / 31.89
    assert thermal_rise_w([complete, hottest], edge_w=edge) == pytest.approx(rho * edge / (1.0 + rho))  # 2.43 W
    # stopped after 117 s, as the second soak of seed 1's front: its fit counts too (it was trusted only from 180 s)
    hottest.duration_s = 117.0
    assert thermal_rise_w([complete, hottest], edge_w=edge) == pytest.approx(rho * edge / (1.0 + rho))
    # stopped within a minute, its fit had too few windows: it counts what it proved
    hottest.duration_s = STOPPED_FIT_S - 1.0
    proven = (33.3 - 31.89) / 31.89
    assert thermal_rise_w([complete, hottest], edge_w=edge) == pytest.approx(proven * edge / (1.0 + proven))
    # a fit that proved less than the windows did (its extrapolation below them) counts the windows
    hottest.duration_s, hottest.steady_power_w = 186.0, 33.3 + 0.0
    assert thermal_rise_w([complete, hottest], edge_w=edge) == pytest.approx(proven * edge / (1.0 + proven))


def test_a_soaked_setting_is_judged_by_its_own_rise_and_the_others_by_the_carried_one() -> None:
    from edgetune.search.thermal import rise_for_w, soaked_rise_w, thermal_rise_w

    # an early soak measured 5% per watt on one pick; a later one 1% on the setting at the edge itself
    early = _soak(1.0, cool_w=20.0, cool_c=None)
    own = _soak(0.23, cool_w=23.0, cool_c=None)
    own.batch_size, own.setting = 64, {"gpu_freq": 918_000_000}
    soaks = [early, own]
    soaked, other = Candidate.of(64, {"gpu_freq": 918_000_000}), Candidate.of(16, {"gpu_freq": 918_000_000})
    carried = thermal_rise_w(soaks, edge_w=24.0)
    assert carried == pytest.approx(0.05 * 24.0 / 1.05)  # 1.14 W: the largest per watt, at the edge
    assert soaked_rise_w(soaks, soaked) == pytest.approx(0.23) and rise_for_w(soaks, soaked, 24.0) == pytest.approx(0.23)
    assert soaked_rise_w(soaks, other) is None and rise_for_w(soaks, other, 24.0) == carried
    # a setting whose soak was stopped over the budget crossed it warm: its own full rise counts, not what
    # the stopped soak proved for the others
    stopped = _soak(0.9, stopped=True, cool_w=20.0, limit_w=20.4, cool_c=None)
    stopped.batch_size, stopped.setting, stopped.power_w = 16, {"gpu_freq": 918_000_000}, [20.1, 20.3]
    assert rise_for_w([*soaks, stopped], other, 24.0) == pytest.approx(0.9)
    assert thermal_rise_w([own, stopped]) == pytest.approx(0.3)  # for the others: what it proved
    # the soaked setting's rise is counted from the reference temperature too
    warm = _soak(0.2, cool_w=23.0, cool_c=37.0, slope=0.1)
    warm.batch_size, warm.setting = 64, {"gpu_freq": 918_000_000}
    assert soaked_rise_w([_soak(0.5, cool_c=35.0, slope=0.1), warm], soaked) == pytest.approx(0.2 + 0.1 * 2.0)


def _after_an_earlier_soak(cnn, budget: float, earlier: ThermalSoak, soak_s: float):
    """``(twin, result)`` of a 16-setting AGX Orin search (batch 16-64, GPU and memory clocks) under ``budget``
    whose study already holds ``earlier``, another worker's soak of another setting."""
    device = open_device("sim:orin-agx", compute=False, seed=0)
    space = small_space(device, batch_sizes=(16, 32, 64))
    storage = optuna.storages.InMemoryStorage()
    first = search(device, cnn, space, budget, n_trials=1, seed=0, storage=storage, soak_s=0.0)
    first.run()
    records.write_soaks(first.study, [earlier.to_dict()])
    return device.backend, search(device, cnn, space, budget, n_trials=16, seed=0, storage=storage,
                                  soak_s=soak_s).run()


def test_a_setting_only_the_carried_rise_rules_out_is_soaked_at_the_stop_and_judged_by_its_own(cnn) -> None:
    budget = 13.0
    # an earlier soak (another worker's, of another setting at the budget's edge, so that no pick draws more)
    # measured 3% per watt: carried to the edge that is 0.37 W, more than the AGX Orin's settings under 13 W
    # rise (0.1-0.2 W)
    early = ThermalSoak(batch_size=64, setting={"gpu_freq": 306_000_000, "emc_freq": 204_000_000},
                        cool_power_w=12.9, duration_s=180.0, steady_power_w=12.9 * 1.03, extrapolated=True,
                        after_settings=1)
    twin, result = _after_an_earlier_soak(cnn, budget, early, soak_s=120.0)
    assert result.thermal_rise_w == pytest.approx(0.03 * (budget - result.accuracy_w) / 1.03)
    assert len(result.thermal_soaks) == 2  # the stop soaked the best setting that only the carried rise ruled out
    soaked = result.thermal_soaks[1]
    pick = result.best
    assert pick is not None and (pick.candidate.batch_size, pick.candidate.knobs) == (soaked.batch_size, soaked.setting)
    # held by the sensor's accuracy and its own rise; the carried rise would have ruled it out
    assert result.accuracy_w <= margin_w(pick, budget) < result.required_margin_w
    assert result.rise_for_w(pick.candidate) == pytest.approx(soaked.rise_w)
    assert soaked.rise_w < result.thermal_rise_w
    assert result.certified(pick) and certified(pick, budget, result.accuracy_w + soaked.rise_w)
    # the best setting certified on the carried rise is slower: what the soak at the stop gained
    carried = [r for r in result.settings if r.feasible and r.outcome is not None
               and certified(r, budget, result.required_margin_w)]
    assert carried and min(r.outcome.time_to_target_s for r in carried) > 1.2 * pick.outcome.time_to_target_s
    # and it holds the budget on the warm board's truth
    assert twin.steady_state(cnn.cost, pick.candidate.batch_size, pick.candidate.knobs).power_w <= budget
    doc = best_json(result)["thermal_soak"]
    assert doc["pick_rise_w"] == pytest.approx(soaked.rise_w) and doc["counted_rise_w"] == result.thermal_rise_w
    from edgetune.report import summary_table

    assert f"the pick was soaked itself: its margin counts its own rise, {soaked.rise_w:.2f} W" in summary_table(result)


def test_the_thermal_reference_is_the_coolest_soaked_temperature_and_a_complete_soaks_slope() -> None:
    first = _soak(0.49, stopped=True, cool_c=31.5, slope=0.5)
    second = _soak(0.21, cool_c=38.0, slope=0.17)
    ref = thermal_reference([first, second])
    assert ref is not None and ref.temperature_c == 31.5 and ref.slope_w_per_k == 0.17
    assert ref.offset_w(41.5) == pytest.approx(1.7) and ref.offset_w(30.5) == pytest.approx(-0.17)
    assert ref.offset_w(None) == 0.0
    assert thermal_reference([first]).slope_w_per_k == 0.5  # no complete soak: the last with a slope
    assert thermal_reference([_soak(0.3, cool_c=None)]) is None  # no temperature read
    assert thermal_reference([_soak(0.3, slope=0.0)]) is None and thermal_reference([]) is None


def test_a_measurement_is_referred_to_the_reference_and_keeps_the_offset() -> None:
    from edgetune.search.thermal import ThermalReference

    ref = ThermalReference(temperature_c=32.0, slope_w_per_k=0.2)
    m = {"ok": True, "mean_power_w": 19.0, "max_avg_power_w": 19.5, "energy_j": 40.0, "temperature_c": 42.0}
    out = records.referred(m, ref)
    assert out["max_avg_power_w"] == pytest.approx(17.5) and out["mean_power_w"] == pytest.approx(17.0)
    assert out["thermal_offset_w"] == pytest.approx(2.0) and out["energy_j"] == 40.0  # energy as measured
    assert m["max_avg_power_w"] == 19.5  # the stored figures are not touched
    assert records.referred(m, None) is m and records.referred({**m, "temperature_c": None}, ref)["max_avg_power_w"] == 19.5
    assert records.referred({"ok": False, "error": "out of memory"}, ref) == {"ok": False, "error": "out of memory"}


def test_the_reserve_soaks_after_twenty_settings_or_before_the_last_quarter() -> None:
    from edgetune.search.thermal import soak_reserve

    assert soak_reserve(40) == 20 and soak_reserve(80) == 20  # where the guided sampler may first stop
    assert soak_reserve(16) == 12 and soak_reserve(15) == 11 and soak_reserve(1) == 1  # a quarter left


def test_the_search_soaks_before_its_last_settings_and_refers_the_warm_windows(cnn) -> None:
    device = open_device("sim:orin-agx", compute=False, seed=0)
    space = small_space(device, batch_sizes=(16, 32, 64))
    # the stopping rule may not end it before the reserve: the soak comes at 12 of 16 settings, not at the stop
    s = search(device, cnn, space, 13.0, n_trials=16, seed=0, soak_s=120.0,
               guided_options={"min_trials_to_stop": 16})
    result = s.run()
    first = result.thermal_soaks[0]
    assert first.after_settings == 12 and first.cool_temperature_c is not None
    assert "after 12 settings" in first.describe()
    ref = thermal_reference(result.thermal_soaks)
    assert ref is not None
    raw = {r.number: r for r in s.records(as_measured=True)}
    warm = [r for r in result.records if r.measured and r.ok and r.measurement.get("thermal_offset_w")]
    assert warm, "the windows after the soak are measured on the warm board"
    for r in warm:
        m, m0 = r.measurement, raw[r.number].measurement
        assert m0["temperature_c"] == m["temperature_c"] and m0.get("thermal_offset_w") is None
        assert m["max_avg_power_w"] == pytest.approx(
            m0["max_avg_power_w"] - ref.slope_w_per_k * (m0["temperature_c"] - ref.temperature_c))
    # windows after the soak read warmer than the pick's search windows did
    assert max(r.measurement["temperature_c"] for r in warm) > first.cool_temperature_c
    assert s.study.sampler.thermal == ref


def test_every_window_records_the_board_temperature_at_its_end(cnn) -> None:
    from edgetune.power import PowerMonitor
    from edgetune.search.trial import MeasurementProtocol, measure_setting

    device = open_device("sim:orin-nano", compute=False, seed=0)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=3, measure_s=1.0)
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        m = measure_setting(device, cnn, 32, {}, protocol, monitor)
        assert m.ok and m.temperature_c == device.temperature_c  # no time passed since the window's end
        device.temperature = lambda: None  # a device that reads no temperature
        assert measure_setting(device, cnn, 32, {}, protocol, monitor).temperature_c is None
    assert records.Observation.of(Candidate(32, ()), m, True).temperature_c == m.temperature_c


def test_a_pick_hotter_than_every_soaked_setting_is_soaked_itself_before_the_stop(cnn) -> None:
    budget = 15.0
    # an earlier soak of a cool setting (another worker's) rose 0.2% per watt: carried per watt to the budget's
    # edge, 0.03 W; a setting near 15 W on the AGX Orin rises several times that (its rails run at higher
    # voltages, whose leakage climbs faster with the temperature)
    cool = ThermalSoak(batch_size=64, setting={"gpu_freq": 306_000_000, "emc_freq": 204_000_000},
                       cool_power_w=10.0, duration_s=360.0, steady_power_w=10.02, extrapolated=True,
                       after_settings=1)
    twin, result = _after_an_earlier_soak(cnn, budget, cool, soak_s=360.0)
    pick = result.best
    assert pick is not None
    full = [s for s in result.thermal_soaks if not s.stopped_over_budget]
    hotter = [s for s in full if s.cool_power_w > cool.cool_power_w + result.accuracy_w]
    assert hotter, "the first pick drew more than the one soaked setting: it was soaked itself"
    own = [s for s in full if (s.batch_size, s.setting) == (pick.candidate.batch_size, pick.candidate.knobs)]
    # the final pick was soaked itself or draws no more than a setting soaked to its end
    assert own or budget - margin_w(pick, budget) <= max(s.cool_power_w for s in full) + result.accuracy_w
    carried = 0.002 * (budget - result.accuracy_w) / 1.002
    assert result.thermal_rise_w > 5 * carried  # the hotter soak's rise per watt sets the margin now
    # so the pick holds the budget on the warm board's truth
    assert twin.steady_state(cnn.cost, pick.candidate.batch_size, pick.candidate.knobs).power_w <= budget


def test_a_pareto_front_point_hotter_than_every_soaked_setting_is_soaked_before_the_stop() -> None:
    # the front is what a pareto search offers, so each of its points must hold the budget warm, not the pick alone.
    # Orin Nano mobilenet under 9.9 W: an earlier soak (another worker's) of a 6.8-W setting rose 0.2% per watt;
    # the front's fast end in the 15W mode reads 9.6 W cool and draws 9.97 W warm. Carried per watt, that soak's
    # rise certified it (the pareto benchmark's seed 1 had that violation); soaked itself, it is ruled out
    budget = 9.9
    mobilenet = load_workload("mobilenet")
    device = open_device("sim:orin-nano", compute=False, seed=0)
    knobs = ["power_mode", "gpu_freq", "emc_freq", "cpu_cores"]
    space = build_space(device, 32, (16, 32, 64), knobs)
    cool = ThermalSoak(batch_size=64, setting={k: device.knobs[k].values[0] for k in knobs}, cool_power_w=6.8,
                       duration_s=360.0, steady_power_w=6.8 * 1.002, extrapolated=True, after_settings=1)
    storage = optuna.storages.InMemoryStorage()
    first = search(device, mobilenet, space, budget, objective="pareto", n_trials=1, seed=0, storage=storage,
                   soak_s=0.0)
    first.run()
    records.write_soaks(first.study, [cool.to_dict()])
    result = search(device, mobilenet, space, budget, objective="pareto", n_trials=20, seed=0, storage=storage,
                    soak_s=360.0).run()
    # the front's hot end was soaked (that soak crossed the budget and was stopped: its rise is at least what
    # takes it there, carried per watt to the settings that draw less)
    soaked = result.thermal_soaks[1:]
    assert soaked and max(s.cool_power_w for s in soaked) > cool.cool_power_w + 2.0
    hottest_w = max(s.cool_power_w for s in result.thermal_soaks)
    fast_end = min(result.pareto, key=lambda r: r.outcome.time_to_target_s)
    assert budget - margin_w(fast_end, budget) > cool.cool_power_w + 2.0  # the front reaches far past the first soak
    twin = device.backend
    for point in result.pareto:
        # no hotter than a soaked setting: the rise carried per watt is on the safe side
        assert budget - margin_w(point, budget) <= hottest_w + result.accuracy_w
        # so every point of the front holds the budget on the warm board's truth
        assert twin.steady_state(mobilenet.cost, point.candidate.batch_size, point.candidate.knobs).power_w <= budget


def test_a_soaks_cool_windows_are_the_means_of_the_settings_search_windows_as_measured() -> None:
    from edgetune.search.soaking import CoolWindows

    windows = [{"mean_power_w": 9.0, "max_avg_power_w": 9.4, "power_se_w": 0.05, "temperature_c": 40.0},
               {"mean_power_w": 9.2, "max_avg_power_w": 9.5, "power_se_w": 0.0, "temperature_c": 42.0}]
    cool = CoolWindows.of(windows, guard_sigma=2.0)
    # the judged power (maximum average plus two standard errors) over the mean: 0.5 and 0.3 W
    assert (cool.power_w, cool.temperature_c, cool.excess_w) == pytest.approx((9.1, 41.0, 0.4))
    # a window that read no temperature: no mean temperature (the rise is then not referred), the rest stands
    partial = CoolWindows.of([*windows, {"mean_power_w": 9.1, "max_avg_power_w": 9.3}], guard_sigma=0.0)
    assert partial.temperature_c is None and partial.power_w == pytest.approx(9.1)
    assert partial.excess_w == pytest.approx((0.4 + 0.3 + 0.2) / 3)
    empty = CoolWindows.of([], guard_sigma=2.0)
    assert math.isnan(empty.power_w) and empty.temperature_c is None and empty.excess_w is None
