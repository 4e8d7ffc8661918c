"""The power monitor against analytic power traces, on a virtual clock (exact sample times)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from edgetune.power.base import PowerReading, RealClock, VirtualClock
from edgetune.power.monitor import (
    PowerMonitor,
    WindowStats,
    energy_j,
    moving_average_max,
    moving_average_mean,
    next_sample_due,
    noise_max_excess_w,
    reading_fault,
    window_stats,
)


class AnalyticSensor:
    """Reads p(t) on the clock: the boundary a real sensor file would be."""

    rails = ("VDD_IN",)
    total_label = "VDD_IN"
    update_period_s = 0.0

    def __init__(self, clock, power, signal_after: int | None = None):
        self.clock = clock
        self.power = power
        self.fail_at: set[int] = set()
        self.reads = 0
        self.signal_after = signal_after
        self.enough = threading.Event()  # set once ``signal_after`` reads were made

    def read(self) -> PowerReading:
        self.reads += 1
        if self.signal_after is not None and self.reads >= self.signal_after:
            self.enough.set()
        if self.reads in self.fail_at:
            raise OSError("rail file vanished")
        t = self.clock.now()
        p = float(self.power(t))
        return PowerReading(t, p, {"VDD_IN": p})

    def energy_j(self):
        return None


def measure(power, start=0.0, duration=10.0, rate_hz=100.0):
    clock = VirtualClock()
    sensor = AnalyticSensor(clock, power)
    with PowerMonitor(sensor, clock, rate_hz=rate_hz) as monitor:
        clock.advance(start)
        monitor.begin_window("w")
        clock.advance(duration)
        stats = monitor.end_window("w")
    return stats


def test_constant_power():
    stats = measure(lambda t: 7.25, start=0.5, duration=10.0)
    assert stats.duration_s == pytest.approx(10.0)
    assert stats.energy_j == pytest.approx(72.5, rel=5e-3)
    assert stats.mean_w == pytest.approx(7.25)
    assert stats.peak_w == 7.25
    assert stats.max_avg_w == pytest.approx(7.25, abs=1e-12)
    assert stats.samples == 1001


def test_step_power():
    # 5 W, then 12 W from t = 4.005 s (between samples): a step the budget window must see fully
    stats = measure(lambda t: 5.0 if t < 4.005 else 12.0, duration=10.0)
    exact_energy = 5.0 * 4.005 + 12.0 * (10.0 - 4.005)
    assert stats.energy_j == pytest.approx(exact_energy, rel=5e-3)
    assert stats.max_avg_w == pytest.approx(12.0, abs=1e-9)
    assert stats.peak_w == 12.0


def test_ramp_power():
    stats = measure(lambda t: 2.0 + 0.5 * t, duration=10.0)
    assert stats.energy_j == pytest.approx(2.0 * 10 + 0.25 * 100, rel=5e-3)
    # the 1-s average of a rising ramp peaks on the last second: p(10 - 0.5)
    assert stats.max_avg_w == pytest.approx(2.0 + 0.5 * 9.5, abs=1e-9)


def test_short_pulse_is_averaged_not_missed():
    # a 0.5 s burst to 20 W over a 5 W floor: the 1-s average peaks at 12.5 W
    stats = measure(lambda t: 20.0 if 3.0 <= t < 3.5 else 5.0, duration=10.0, rate_hz=1000.0)
    assert stats.peak_w == 20.0
    assert stats.max_avg_w == pytest.approx(12.5, rel=2e-3)


def test_moving_average_max_matches_brute_force():
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.uniform(0.005, 0.03, 400))
    p = 5 + np.cumsum(rng.normal(0, 0.3, 400))
    exact = moving_average_max(t, p, 1.0)
    # brute force on a very fine grid of the linear interpolation
    fine = np.linspace(t[0], t[-1], 400_001)
    pf = np.interp(fine, t, p)
    cum = np.concatenate([[0], np.cumsum((pf[1:] + pf[:-1]) / 2 * np.diff(fine))])
    step = fine[1] - fine[0]
    k = round(1.0 / step)
    brute = np.max((cum[k:] - cum[:-k]) / (k * step))
    assert exact == pytest.approx(brute, abs=2e-4)


def _noisy_maxima(signal: np.ndarray, t: np.ndarray, sigma_w: float, draws: int, seed: int) -> np.ndarray:
    """The moving-average maximum of ``signal`` plus white reading noise, over ``draws`` seeded draws."""
    rng = np.random.default_rng(seed)
    return np.array([moving_average_max(t, signal + rng.normal(0, sigma_w, t.size), 1.0)
                     for _ in range(draws)])


def test_noise_max_excess_is_the_bias_of_a_noisy_maximum():
    # a flat 5 W read at 100 Hz with the twin's noise near 5 W (0.04 W + 0.5%): the maximum of the 1-s average
    # over a 2-s window reads high by the expected maximum of the noise's own average, and one record's
    # estimate of that bias is within a third of it
    t = np.arange(0.0, 2.0 + 1e-9, 0.01)
    flat = np.full(t.size, 5.0)
    bias = float(np.mean(_noisy_maxima(flat, t, 0.065, 400, seed=1))) - 5.0
    assert 0.004 < bias < 0.010
    rng = np.random.default_rng(2)
    estimates = [noise_max_excess_w(t, flat + rng.normal(0, 0.065, t.size)) for _ in range(20)]
    assert all(abs(e / bias - 1.0) < 1.0 / 3.0 for e in estimates)
    # the same record gives the same figure (seeded draws)
    record = flat + rng.normal(0, 0.065, t.size)
    assert noise_max_excess_w(t, record) == noise_max_excess_w(t, record)


def test_noise_max_excess_ignores_the_steps_phase_edges_and_bounds_the_bias_of_a_rippled_signal():
    # 0.1-s steps whose last 30% draws 1.3 W more: a fifth of the reading differences are phase edges; the
    # estimate stays that of the noise alone (not inflated by the edges) and is at least the true bias
    t = np.arange(0.0, 2.0 + 1e-9, 0.01)
    rng = np.random.default_rng(3)
    flat_estimate = noise_max_excess_w(t, 5.0 + rng.normal(0, 0.065, t.size))
    ripple = np.where((t % 0.1) > 0.07, 6.0, 4.7)
    estimate = noise_max_excess_w(t, ripple + rng.normal(0, 0.065, t.size))
    bias = float(np.mean(_noisy_maxima(ripple, t, 0.065, 300, seed=4))) - moving_average_max(t, ripple, 1.0)
    assert estimate == pytest.approx(flat_estimate, rel=0.25)
    assert bias <= estimate


def test_noise_max_excess_of_held_readings_and_of_short_or_clean_records():
    # a sensor updating every 0.1 s read at 100 Hz: each reading is held for 10 samples and is one update, so
    # its 1-s average has 10 updates' noise, not 100 samples': the bias is larger
    t = np.arange(0.0, 2.0 + 1e-9, 0.01)
    update = (t // 0.1).astype(int)
    rng = np.random.default_rng(5)
    held = 5.0 + rng.normal(0, 0.065, update.max() + 1)[update]
    fresh = 5.0 + rng.normal(0, 0.065, t.size)
    assert noise_max_excess_w(t, held) > 2.0 * noise_max_excess_w(t, fresh)
    assert noise_max_excess_w(t, np.full(t.size, 5.0)) == 0.0  # no noise, no bias
    short = t[t <= 0.9]
    assert noise_max_excess_w(short, fresh[: short.size]) == 0.0  # judged on its mean: no maximum, no bias


def test_moving_average_mean_is_the_unbiased_mean_of_the_averages_and_never_above_their_maximum():
    t = np.arange(0.0, 3.0 + 1e-9, 0.01)
    rng = np.random.default_rng(6)
    ripple = np.where((t % 0.028) > 0.0093, 5.4, 4.2)  # 28-ms steps: low forward third, high backward
    means = [moving_average_mean(t, ripple + rng.normal(0, 0.065, t.size)) for _ in range(50)]
    assert float(np.mean(means)) == pytest.approx(moving_average_mean(t, ripple), abs=0.003)
    record = ripple + rng.normal(0, 0.065, t.size)
    assert moving_average_mean(t, record) <= moving_average_max(t, record)
    short = t[t <= 0.9]  # no whole window: what the maximum gives, the record's mean
    assert moving_average_mean(short, record[: short.size]) == moving_average_max(short, record[: short.size])


def test_window_shorter_than_average_reports_its_mean():
    t = np.array([0.0, 0.25, 0.5])
    p = np.array([4.0, 8.0, 4.0])
    assert moving_average_max(t, p, 1.0) == pytest.approx(energy_j(t, p) / 0.5)
    s = window_stats(np.array([]), np.array([]))
    assert s.samples == 0 and math.isnan(s.mean_w)


def test_bad_reads_are_dropped_and_counted():
    clock = VirtualClock()
    sensor = AnalyticSensor(clock, lambda t: 6.0)
    sensor.fail_at = {10, 11, 50}
    with PowerMonitor(sensor, clock, rate_hz=100) as monitor:
        monitor.begin_window("w")
        clock.advance(2.0)
        stats = monitor.end_window("w")
    assert stats.dropped == 3
    assert stats.mean_w == pytest.approx(6.0)
    assert monitor.last_error == "rail file vanished"


def test_negative_and_nan_samples_are_dropped():
    clock = VirtualClock()
    values = iter([5.0, -1.0, float("nan")] + [5.0] * 1000)
    sensor = AnalyticSensor(clock, lambda t: next(values))
    with PowerMonitor(sensor, clock, rate_hz=100) as monitor:
        clock.advance(1.0)
    assert monitor.dropped == 2


def test_nested_windows_and_live_average():
    clock = VirtualClock()
    sensor = AnalyticSensor(clock, lambda t: 4.0 if t < 5 else 9.0)
    with PowerMonitor(sensor, clock, rate_hz=50) as monitor:
        monitor.begin_window("outer")
        clock.advance(5.0)
        monitor.begin_window("inner")
        clock.advance(3.0)
        inner = monitor.end_window("inner")
        assert monitor.moving_average() == pytest.approx(9.0)
        clock.advance(2.0)
        outer = monitor.end_window("outer")
    assert inner.mean_w == pytest.approx(9.0, rel=1e-2)
    assert outer.duration_s == pytest.approx(10.0)
    assert outer.energy_j == pytest.approx(4 * 5 + 9 * 5, rel=5e-3)
    with pytest.raises(ValueError):
        monitor.end_window("inner")


def test_records_since_a_time_start_at_the_last_sample_before_it():
    clock = VirtualClock()
    sensor = AnalyticSensor(clock, lambda t: 4.0)
    with PowerMonitor(sensor, clock, rate_hz=50) as monitor:
        clock.advance(2.0)
        t_all, _ = monitor.records()
        t, p = monitor.records(since=1.01)
    assert t[0] <= 1.01 < t[1] and t[-1] == t_all[-1] and t.size == p.size < t_all.size
    assert np.array_equal(t, t_all[t_all >= t[0]])
    assert monitor.records(since=-1.0)[0].size == t_all.size  # before the record: all of it


def test_stale_sensor_detected():
    clock = VirtualClock()
    sensor = AnalyticSensor(clock, lambda t: 5.0 + (0.1 * t if t < 1 else 0.1))
    sensor.update_period_s = 0.01
    with PowerMonitor(sensor, clock, rate_hz=100) as monitor:
        clock.advance(1.5)
        assert not monitor.stale
        clock.advance(3.0)
        assert monitor.stale


def test_virtual_clock_tickers_fire_in_order():
    clock = VirtualClock()
    fired = []
    clock.add_ticker(0.3, lambda: fired.append(("a", round(clock.now(), 6))))
    tid = clock.add_ticker(0.5, lambda: fired.append(("b", round(clock.now(), 6))))
    clock.advance(1.0)
    assert fired == [("a", 0.3), ("b", 0.5), ("a", 0.6), ("a", 0.9), ("b", 1.0)]
    clock.remove_ticker(tid)
    clock.advance(0.5)
    assert fired[-1] == ("a", 1.5)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_a_ticker_can_interrupt_an_advance_and_sleep_goes_on():
    """A ticker's callback may end the advance in progress at its tick (the twin re-times a step whose clocks
    changed there); the caller learns the seconds left. Outside an advance an interrupt does nothing, and a
    sleep sleeps its whole time."""
    clock = VirtualClock()
    ticks = []

    def tick():
        ticks.append(round(clock.now(), 6))
        if len(ticks) == 2:
            clock.interrupt()

    clock.add_ticker(0.1, tick)
    left = clock.advance(1.0)
    assert ticks == [0.1, 0.2] and clock.now() == pytest.approx(0.2) and left == pytest.approx(0.8)
    assert clock.advance(0.25) == 0.0 and clock.now() == pytest.approx(0.45)
    clock.interrupt()  # no advance in progress: nothing to end
    assert clock.advance(0.1) == 0.0 and clock.now() == pytest.approx(0.55)
    ticks.clear()
    ticks.append(0.0)  # the next tick is the second: it interrupts, and the sleep goes on past it
    clock.sleep(0.5)
    assert clock.now() == pytest.approx(1.05) and len(ticks) == 6


def test_listeners_see_every_new_sample_until_removed():
    clock = VirtualClock()
    sensor = AnalyticSensor(clock, lambda t: 2.0 + t)
    seen: list[float] = []
    with PowerMonitor(sensor, clock, rate_hz=100) as monitor:
        handle = monitor.add_listener(lambda reading: seen.append(reading.t))
        clock.advance(0.1)
        monitor.sample()  # the same instant again (a window edge on a tick): not a new sample
        assert seen == pytest.approx([0.01 * k for k in range(1, 11)])
        # a listener may query the monitor (it is called outside the monitor's lock)
        averages: list[float] = []
        monitor.add_listener(lambda reading: averages.append(monitor.moving_average(0.05)))
        monitor.remove_listener(handle)
        clock.advance(0.05)
        monitor.remove_listener(handle)  # unknown now: ignored
    assert len(seen) == 10 and len(averages) == 5
    assert averages[-1] == pytest.approx(2.0 + 0.15 - 0.025)  # the average of a ramp over its last 0.05 s


def test_thread_sampling_on_real_clock():
    """A real clock is sampled by a thread. How fast the OS schedules it is not the monitor's to promise:
    the test waits for the thread's reads (the window edges make two), whenever they come."""
    clock = RealClock()
    sensor = AnalyticSensor(clock, lambda t: 3.0, signal_after=10)
    monitor = PowerMonitor(sensor, clock, rate_hz=200)
    monitor.start()
    assert monitor.running and sensor.reads >= 1  # start samples at once
    monitor.begin_window("w")
    assert sensor.enough.wait(timeout=60.0), "the sampling thread made no reads in a minute"
    stats = monitor.end_window("w")
    thread = monitor._thread
    monitor.stop()
    assert not monitor.running
    thread.join(timeout=60.0)  # stop() waits 2 s for it; a loaded machine may need longer
    assert not thread.is_alive()
    assert stats.samples >= 10 - 1  # every read but the one before the window is in it
    assert stats.mean_w == pytest.approx(3.0) and stats.dropped == 0
    reads = sensor.reads
    monitor.sample()  # sampling by hand still works after the thread is gone
    assert sensor.reads == reads + 1


def test_sampling_thread_due_times_never_drift_and_never_burst():
    period = 0.01
    due, taken = 0.01, []
    for now in (0.0101, 0.0203, 0.0302, 0.0400):  # each sample a little late
        taken.append(due)
        due = next_sample_due(due, now, period)
    assert taken == pytest.approx([0.01, 0.02, 0.03, 0.04])  # due times stay on the grid
    # more than a period behind (a 0.5 s pause): resume one period from now, not 50 samples at once
    assert next_sample_due(0.05, 0.55, period) == pytest.approx(0.56)
    # within a period behind: keep the grid (the next one is due at once)
    assert next_sample_due(0.05, 0.065, period) == pytest.approx(0.06)


def test_a_window_that_measures_nothing_says_why():
    """No valid reading, or an average of zero or less (a dead rail, RAPL counters that never move): the
    search refuses such a window (edgetune.search.trial) instead of taking every setting as holding the budget."""
    t = np.linspace(0.0, 2.0, 201)
    assert reading_fault(window_stats(t, np.full_like(t, 7.5))) is None
    assert reading_fault(window_stats(t, np.zeros_like(t))) == "an average of 0.00 W over 2.0 s"
    dead = window_stats(np.array([]), np.array([]))
    assert reading_fault(WindowStats(**{**dead.__dict__, "dropped": 4})) == "no valid reading (4 dropped)"
