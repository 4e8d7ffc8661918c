"""Hardware-in-the-loop measurement of one setting: batch size plus knob values.

:func:`measure_setting` is the one place where edgetune measures a training step on a device; the search
calls it for each trial and ``edgetune run`` for its plan. It sets the knobs, runs warm-up steps, then runs
the real training step over a measured window on the device clock while the power monitor records, and
returns a :class:`Measurement`: step time, samples/s, mean, peak and moving-average maximum power, energy per
sample. An out-of-memory error or a failed step is returned as an infeasible measurement, never raised, so
a study goes on.

It does not restore the knobs: a search measures many settings in a row and restores once at the end
(``with device.restoring(): ...``), which also covers Ctrl-C and exceptions.

The protocol on the twin
------------------------
On real hardware every step of the window is a real training step: the time and power *are* the
measurement. On the simulated twin the clock is virtual: the twin times each step from the workload's cost
and the knob setting, and the real torch step does not change that time. A window long enough for a
meaningful 1-s moving average spans tens to hundreds of steps, which on a 2-core CPU would take minutes per
trial. So on a virtual clock :attr:`MeasurementProtocol.real_steps` bounds how many steps of the window
execute the real training step (after the warm-up, which always does); the remaining steps of the window
are timed by the twin without re-running the step. Every measurement records how many steps were real
(:attr:`Measurement.real_steps`) so reports can say so.

Readings that keep to a few phases of the step
----------------------------------------------
A step close to the monitor's read rate (or a simple fraction of it) is read in a few of its phases only; where
it is much shorter than the budget window, the window runs on until its readings have swept the step's phases
(:func:`~edgetune.search.window.judged_span_s`; :mod:`edgetune.search.window` says why and by how much).

Safe profiling
--------------
The budget a user sets protects the board, so the search must not run a setting over it for long just to
learn that it is over. Given ``limit_w`` (the budget with its tolerance), :func:`measure_setting` watches the
monitor's live moving average after every step, warm-up included, and stops the trial as soon as the budget
window's average *and* the average since this setting was applied (the previous setting's power is not
this one's fault), each plus the guard band, are above the limit: such a setting would be judged over the
budget anyway (the judged power is the window's moving-average maximum plus the guard band). The setting's
own average must exceed it by one standard error of that average (:data:`_STOP_SIGMA`): an average of a
fraction of a second, checked after every step, is noisier than the window's, and taken at face value it
stopped settings whose whole window holds the budget (on the twin, 13 of 16 repeats of a setting judged
0.01 W under the limit, against 2). A setting
*clearly* over (its own average, after at least 0.05 s of it, less three standard errors of that average, is
above the limit) is stopped at once, without waiting for the budget window's average to cross: that average
is still mostly the power before the setting, and would stay over the limit for a second after the stop.
The sensor and the monitor sample the step's phases at rates close to the step rate, so a few dozen
milliseconds of readings can lie all in its high phase, and their spread says nothing of the low one: on the
simulated Xavier NX (cnn at 9.3 W), 56 ms read 9.41 W where the setting's true 1-s average holds 8.98 W, and
stopped the soak of a setting that held the budget. So the clearly-over rule waits until the readings have
swept every phase of the step (:func:`phase_sweep_s`, from the steps' own mean time: until their phases leave no
gap wider than an eighth of a step, each of the monitor's 100-Hz reads returning the sensor's last update): a
10.4-ms step takes 0.14 s, a step of 0.2 s about one step, and a 13.2-ms step, read from 6.6-ms updates, never
(two phases only: the budget window's rule stops it). Windows that begin a setting that holds the budget by
0.3 W were stopped 2 times in 40 before the rule waited, never after; a setting 2 W over from rest is still
stopped before the budget window's average crosses. A window of a setting already running (a thermal soak's
later windows, ``running_since_s``) reads the setting's own average over the last budget window: its first
steps alone are no measure of it.
The measurement is then flagged :attr:`Measurement.aborted_over_budget`, its figures cover the steps run since the
knobs were set, and it never holds the budget. A stopped trial drops the board to rest at once
(:func:`rest_setting`: its clocks at their lowest, one online core; the power mode stays, a switch is slow),
so the 1-s average falls as fast as the board allows, and nothing idles at the stopped setting's clocks while
the search decides what to measure next. Before the next setting is applied, the board idles at rest while
the recent past could still take the budget window's average over the limit (a stopped trial's power stays
in the 1-s window for a second; the next setting would otherwise carry the previous one's excess,
:func:`settle`): at most one window, :attr:`Measurement.settle_s`. (Idling at rest instead of at the next
setting's clocks: 50.8 -> 41.6 device-seconds over the budget in all over the oracle benchmark's 36 time
searches, 41.2 with the noise-aware stop above; ``experiments/results/oracle_gap.txt``.) A step longer than half
the budget window is also watched in its middle (:class:`_StepWatchdog`): once the budget window's average and
the setting's own, with the guard band, are over the limit, the board drops to rest at once and the step finishes
there (flagged :attr:`Measurement.stopped_mid_step`; its step time is then not the setting's). Shorter steps are
left to the per-step check, so their records stay whole: a watch on every step cut most settings over the budget
inside their first step, and the model fitted on those times lost 8 of the oracle benchmark's 30 rows within 3%.
(The largest over-budget total of one search: 7.5 -> 3.9 device-seconds for time, 8.0 -> 4.3 for energy; the
Xavier NX chartransformer baseline's first probe, one 3.25-s step at 6.74 W against 5.3 W, was 3.24 s of it.)
Every measurement records
:attr:`Measurement.over_budget_s`: the device seconds, from the knobs being set to the trial's end, during
which the moving average of board power was above the limit. The first setting a monitor sees waits until the
monitor holds one window of the board's past (the board as found, part of :attr:`Measurement.settle_s`): the
budget's 1-s average includes the second before the setting, and a monitor started with the search had none,
so the first setting was judged on its own power alone, stopped before the board's average crossed and
counted over the budget while it was not (the energy benchmark's Xavier NX chartransformer at 5.1 W: the
baseline's first probe 1.30 -> 1.01 device-s over the budget).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edgetune.log import get_logger
from edgetune.power.base import Device, KnobValue, PowerReading, SensorError, is_out_of_memory
from edgetune.power.monitor import (
    PowerMonitor,
    moving_average_max,
    moving_average_mean,
    noise_max_excess_w,
    reading_fault,
    window_stats,
)
from edgetune.search.measurement import Measurement, MeasurementProtocol
from edgetune.search.rest import go_to_rest, rest_setting, settle, settle_needed
from edgetune.search.window import (
    judged_span_s,
    over_limit_s,
    phase_sweep_s,
    phase_unevenness,
)

# Measurement and MeasurementProtocol live in edgetune.search.measurement, rest_setting and settle in
# edgetune.search.rest; importing them from here keeps working
__all__ = ["Measurement", "MeasurementProtocol", "measure_setting", "rest_setting", "settle"]

_log = get_logger(__name__)
#: the monitors whose stuck sensor was already reported (once per run: every window after would say it again)
_STALE_SAID: weakref.WeakSet[PowerMonitor] = weakref.WeakSet()

#: shortest span (s, device clock) of this setting's own power before a trial may be stopped over budget: a
#: few sensor updates (INA3221: 6.6 ms) and more than one 100-Hz monitor sample, so one noisy reading cannot
_MIN_ABORT_SPAN_S = 0.05
#: standard errors of a setting's own average by which it must exceed the limit to be clearly over: such a
#: setting is stopped at once, before the budget window's average (still mostly the power before it) crosses
_CLEAR_OVER_SIGMA = 3.0
#: standard errors of a setting's own average by which its judged power (that average plus the guard band)
#: must exceed the limit before the trial is stopped: the average of the readings so far, checked after every
#: step, would otherwise stop settings whose whole window holds the budget on its noise alone
_STOP_SIGMA = 1.0
#: interval (s, device clock) between the watchdog's checks of a setting's power in the middle of a step: two
#: 100-Hz monitor samples, short against the budget window
_WATCH_INTERVAL_S = 0.02
#: share of the budget window a step must have run before the watchdog may stop it in the middle: a shorter
#: step is checked when it ends (its whole record is the setting's); a longer one could hold the board over the
#: budget for most of a window before the per-step check sees it
_WATCH_AFTER_WINDOWS = 0.5


def _downsample(t: np.ndarray, p: np.ndarray, max_points: int = 400) -> tuple[list[float], list[float]]:
    """Keep at most ``max_points`` samples, evenly spaced in index, always keeping the peak."""
    if t.size <= max_points:
        return t.tolist(), p.tolist()
    idx = np.unique(np.concatenate([np.linspace(0, t.size - 1, max_points).astype(int), [int(np.argmax(p))]]))
    return t[idx].tolist(), p[idx].tolist()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _noise_excess_w(t: np.ndarray, p: np.ndarray, span_s: float, max_avg_w: float) -> float:
    """How far ``max_avg_w``, the record's ``span_s`` moving-average maximum, reads high from the reading
    noise, W: :func:`~edgetune.power.monitor.noise_max_excess_w`, but never more than the maximum over the
    mean of those averages (:func:`~edgetune.power.monitor.moving_average_mean`; the maximum less its noise
    is never below it). The noise is estimated from the differences of consecutive readings, and where a
    step's phase edges fall in most of them (steps of tens of milliseconds, their phases a few samples long)
    the estimate holds the step's ripple too, which the average's maximum does not: Orin NX chartransformer at
    batch 8, 28-ms steps, estimated 0.185 W where its windows read 0.049 W high on average, and a setting the
    warm board ran 0.037 W over the budget at was certified on the difference."""
    return min(noise_max_excess_w(t, p, span_s), max(0.0, float(max_avg_w) - moving_average_mean(t, p, span_s)))


def _se_w(watts: np.ndarray, sensor_period_s: float, monitor: PowerMonitor, span_s: float | None = None) -> float:
    """Standard error of one average over ``span_s`` (default ``avg_window_s``) from the readings ``watts``
    (see :class:`Measurement`)."""
    if watts.size < 2:
        return 0.0
    period = max(sensor_period_s, 1.0 / monitor.rate_hz)
    updates_per_average = max(1.0, (monitor.avg_window_s if span_s is None else span_s) / period)
    return float(np.std(watts, ddof=1) / math.sqrt(updates_per_average))


def measure_setting(
    device: Device,
    workload: Any,
    batch_size: int,
    setting: Mapping[str, KnobValue],
    protocol: MeasurementProtocol,
    monitor: PowerMonitor,
    on_step: Callable[[int], None] | None = None,
    *,
    limit_w: float | None = None,
    guard_sigma: float = 0.0,
    running_since_s: float | None = None,
) -> Measurement:
    """Set ``setting`` on ``device`` and measure ``workload``'s training step at ``batch_size``.

    Args:
        device: an open device (knobs are left as set: restore once at the end, see module docs).
        workload: an :class:`edgetune.workloads.Workload` (``train_step(batch_size)`` and ``cost``).
        batch_size: samples per step.
        setting: knob values to apply (a subset of the device's knobs; the others stay as they are).
        protocol: warm-up and window lengths.
        monitor: a started :class:`PowerMonitor` on the device's sensor and clock.
        on_step: called with the number of window steps done after each one (progress display).
        limit_w: the budget with its tolerance, W: the trial stops as soon as the live moving average (plus
            ``guard_sigma`` standard errors) crosses it, and :attr:`Measurement.over_budget_s` is counted
            against it (module docs, safe profiling). None: no budget, no early stop.
        guard_sigma: the guard band of the early stop, in standard errors of one moving average.
        running_since_s: the device time (``device.clock``) since which the board has run ``setting`` already,
            as in a thermal soak's later windows: the early stop then reads the setting's own average over the
            last budget window, not over the few steps since this window began (module docs). None: the
            setting starts with this window.

    Returns:
        A :class:`Measurement`; ``ok=False`` for out-of-memory or a failed step (never raised).
        ``KeyboardInterrupt`` and knob errors (:class:`~edgetune.power.DeviceError` from ``apply``) propagate.
    """
    wall0 = time.perf_counter()
    clock = device.clock
    whole = f"setting-{wall0!r}"  # from the knobs being set: the early stop's and over-budget's record
    monitor.begin_window(whole)
    t_settle = clock.now()
    if settle_needed(monitor, clock, limit_w):
        go_to_rest(device, setting)  # the wait idles at the least power the clocks allow (a stopped trial's rest)
    settle_s = settle(monitor, clock, limit_w)
    device.apply(setting)
    applied = {name: device.knobs[name].read() for name in setting}
    virtual = bool(getattr(clock, "virtual", False))
    cost = getattr(workload, "cost", None)
    real_limit = protocol.real_steps if (virtual and protocol.real_steps is not None) else None
    sensor_period_s = float(getattr(device.sensor, "update_period_s", 0.0) or 0.0)
    ran = [0]  # steps started since the setting was applied (warm-up included)
    last_loss = [math.nan]

    def real_step() -> Any:
        loss = workload.train_step(batch_size)
        last_loss[0] = float(loss)
        return loss

    def timed_only() -> None:  # the twin times the step; the workload is not run again
        return None

    result = Measurement(batch_size=int(batch_size), setting=dict(applied), ok=False,
                         avg_window_s=monitor.avg_window_s, judged_span_s=monitor.avg_window_s, settle_s=settle_s)
    window = f"measure-{id(result)}"
    t_set = clock.now()
    # where the setting's own power began: this window, or earlier for a setting already running
    t_own = t_set if running_since_s is None else min(t_set, float(running_since_s))
    span_s = 0.0  # the span the window's power is judged over (judged_span_s); 0 until it has run one budget window
    window_open = False
    steps = real = warm = 0
    trigger_w = math.nan  # the live average that stopped the trial over the budget (nan: not stopped)
    trigger_span_s = math.nan  # the span (s) that average is over

    def over_limit(clear: bool = True) -> bool:
        """The live average and this setting's own average, plus the guard band, are above the limit (or,
        with ``clear``, the setting's own average is clearly above it)."""
        nonlocal trigger_w, trigger_span_s
        if limit_w is None:
            return False
        own_s = clock.now() - t_own
        if own_s < _MIN_ABORT_SPAN_S:
            return False
        # a setting already running: its last budget window (the monitor keeps only a few seconds of history)
        own_from = t_own if running_since_s is None else max(t_own, clock.now() - monitor.avg_window_s)
        times, watts = monitor.records(since=own_from - 1e-9)
        own = watts[times >= own_from - 1e-9]
        span_s = min(own_s, monitor.avg_window_s)
        own_avg = monitor.moving_average(span_s)
        # the standard error of that average (the readings' spread over the sensor updates it holds; 0 from
        # fewer than two readings)
        own_se = _se_w(own, sensor_period_s, monitor, span_s)
        # clearly over: the setting's own average less _CLEAR_OVER_SIGMA standard errors of it is above the
        # limit; its 1-s average will be. Only once the readings have swept every phase of the step (module
        # docs): before, they may all lie in its hot phase, and their spread says nothing of the cool one
        if (clear and own.size >= 2 and own_avg - _CLEAR_OVER_SIGMA * own_se > limit_w and ran[0] > 0
                and own_s >= phase_sweep_s((clock.now() - t_set) / ran[0], monitor.rate_hz, sensor_period_s)):
            trigger_w, trigger_span_s = own_avg, span_s
            return True
        # the budget window's average and its standard error: once the setting has run one window, its own
        # (computed once: this runs after every step, and on a slow edge CPU the step waits for it)
        full = span_s == monitor.avg_window_s
        guard = guard_sigma * (own_se if full else _se_w(own, sensor_period_s, monitor))
        if (own_avg if full else monitor.moving_average()) + guard <= limit_w:
            return False
        # judged over: its own average plus the guard band, less _STOP_SIGMA standard errors of that average
        # (a short average is noisier than the window's; checked after every step, its noise alone would
        # stop settings the whole window holds)
        if own_avg + guard - _STOP_SIGMA * own_se <= limit_w:
            return False
        trigger_w, trigger_span_s = own_avg, span_s
        return True

    watch_errors: list[Exception] = []

    def run_step(fn: Callable[[], Any]) -> bool:
        """One step, watched in the middle when a budget is set; whether the setting is over the limit."""
        if limit_w is None:
            device.run_step(fn, batch_size, cost)
            return False
        # in the middle of a long step only the budget window's own crossing stops it: a step stopped there
        # finishes at rest clocks, so its time is not the setting's; the clearly-over shortcut, or a watch on
        # every step, cut most settings over the budget inside their first step, and the model fitted on
        # those times lost the search 8 of the oracle benchmark's 30 rows within 3%
        t_step = clock.now()
        ran[0] += 1  # counted as it starts: the watchdog's checks in its middle see it too
        with _StepWatchdog(monitor, lambda: clock.now() - t_step >= _WATCH_AFTER_WINDOWS * monitor.avg_window_s
                           and over_limit(clear=False), lambda: go_to_rest(device, setting)) as watchdog:
            device.run_step(fn, batch_size, cost)
        if watchdog.error is not None:
            # raised after the steps, not here: the failing-step handler below must not turn it into a result
            watch_errors.append(watchdog.error)
        result.stopped_mid_step |= watchdog.fired
        return watchdog.fired or over_limit()

    try:
        for _ in range(protocol.warmup_steps):
            over = run_step(real_step)
            warm += 1
            if over:
                break
        if not math.isfinite(trigger_w):
            monitor.begin_window(window)
            window_open = True
            t0 = clock.now()
            while steps < protocol.max_steps:
                is_real = real_limit is None or real < real_limit
                over = run_step(real_step if is_real else timed_only)
                steps += 1
                real += int(is_real)
                if on_step is not None:
                    on_step(steps)
                if over:
                    break
                long_enough = clock.now() - t0 >= max(protocol.measure_s, monitor.min_measure_s, span_s)
                if steps >= protocol.measure_steps and long_enough:
                    if not span_s and clock.now() - t0 >= monitor.avg_window_s:
                        # once: readings that do not sweep the step's phases within the budget window are
                        # judged over one sweep, and the window runs on until it holds one (module docs)
                        span_s = judged_span_s((clock.now() - t0) / steps, monitor.avg_window_s, monitor.rate_hz,
                                               sensor_period_s)
                        if clock.now() - t0 < span_s:
                            continue
                    break
            t1 = clock.now()
            stats = monitor.end_window(window)
            window_open = False
    except Exception as exc:  # noqa: BLE001 - an OOM or a failing step is a result, not a crash
        if window_open:
            monitor.end_window(window)
        result.oom = is_out_of_memory(exc)
        result.error = (f"out of memory at batch size {batch_size}" if result.oom else _one_line(exc))
        result.over_budget_s = _finish(monitor, whole, t_settle, limit_w)
        result.wall_s = time.perf_counter() - wall0
        return result
    except BaseException:
        if window_open:
            monitor.end_window(window)
        monitor.end_window(whole)
        raise

    if watch_errors:  # the watchdog's check or its knob writes failed: a knob error propagates (docs above)
        monitor.end_window(whole)
        raise watch_errors[0]
    if math.isfinite(trigger_w):
        go_to_rest(device, setting)  # stopped over the budget: the clocks drop at once, not at the next setting
    times, watts = monitor.records()
    result.over_budget_s = _finish(monitor, whole, t_settle, limit_w)
    result.aborted_over_budget = math.isfinite(trigger_w)
    if result.aborted_over_budget:
        # the figures of the steps run since the knobs were set (warm-up included): all there is
        t0, t1 = t_set, clock.now()
        steps, real = warm + steps, warm + real  # warm-up steps are always real
        in_window = (times >= t0 - 1e-9) & (times <= t1 + 1e-9)
        stats = window_stats(times[in_window], watts[in_window], monitor.avg_window_s)
    _check_sensor(device, monitor, stats)
    duration = t1 - t0
    in_window = (times >= t0 - 1e-9) & (times <= t1 + 1e-9)
    result.trace_t, result.trace_w = _downsample(times[in_window] - t0, watts[in_window])
    result.ok = True
    result.steps = steps
    result.real_steps = real
    result.duration_s = float(duration)
    result.step_time_s = duration / steps
    result.samples_per_s = batch_size * steps / duration if duration > 0 else math.nan
    # plain Python numbers: the measurement is stored as JSON in the study
    result.mean_power_w = float(stats.mean_w)
    result.peak_power_w = float(stats.peak_w)
    # an early stop's record is shorter than the budget window: its average then is the live one that crossed
    result.max_avg_power_w = float(max(stats.max_avg_w, trigger_w) if result.aborted_over_budget else stats.max_avg_w)
    # the span that figure is over: a record shorter than the budget window (a trial stopped over the budget, a
    # protocol shorter than the window) is judged on its mean, over the window's length; a stopped trial's live
    # average that crossed, where it is the larger, over its own span (a setting already running: its last window)
    record_span_s = min(monitor.avg_window_s, result.duration_s)
    result.judged_span_s = float(trigger_span_s if result.aborted_over_budget and trigger_w > stats.max_avg_w
                                 else record_span_s)
    if not result.aborted_over_budget:
        result.max_avg_noise_w = _noise_excess_w(times[in_window], watts[in_window], monitor.avg_window_s,
                                                 result.max_avg_power_w)
    result.energy_j = float(stats.energy_j)
    result.energy_per_sample_j = float(stats.energy_j) / (batch_size * steps)
    result.samples = int(stats.samples)
    result.dropped = int(stats.dropped)
    extended = not result.aborted_over_budget and span_s > monitor.avg_window_s
    result.power_se_w = _se_w(watts[in_window], sensor_period_s, monitor, span_s if extended else None)
    if extended:
        # judged over one sweep of the step's phases (judged_span_s): its maximum average, the noise in that
        # maximum and its standard error are over that span, the error at least what the readings' uneven share
        # of the step's phases leaves in their mean
        tw, pw = times[in_window], watts[in_window]
        result.judged_span_s = span_s
        result.max_avg_power_w = moving_average_max(tw, pw, span_s)
        result.max_avg_noise_w = _noise_excess_w(tw, pw, span_s, result.max_avg_power_w)
        if pw.size >= 2:  # the readings' spread stands for the ripple's
            uneven = phase_unevenness(duration / steps, span_s, monitor.rate_hz, sensor_period_s)
            result.power_se_w = max(result.power_se_w, float(np.std(pw, ddof=1)) * math.sqrt(uneven))
    result.loss = last_loss[0]
    temperature_c = device.temperature_c
    result.temperature_c = None if temperature_c is None else float(temperature_c)
    result.wall_s = time.perf_counter() - wall0
    return result


def _check_sensor(device: Device, monitor: PowerMonitor, stats: Any) -> None:
    """Refuse a window whose readings measure nothing (:func:`~edgetune.power.monitor.reading_fault`): every
    setting would hold any budget at 0 W and the search would pick the fastest. A real sensor stuck on one
    value (:attr:`PowerMonitor.stale`) is said once: it reads the same on every setting."""
    label = getattr(device.sensor, "total_label", "the total")
    fault = reading_fault(stats)
    if fault is not None:
        raise SensorError(f"{device.name}: the power sensor's total ({label}) gave {fault} of training: it is "
                          f"not measuring; check it with `edgetune monitor --device {device.name}` (a rail that "
                          f"reads 0, an energy counter that never moves, as RAPL's on many virtual machines)")
    if monitor.stale and not device.simulated and monitor not in _STALE_SAID:
        _STALE_SAID.add(monitor)
        _log.warning("%s: the power sensor's total (%s) has not changed for seconds while training ran: a stuck "
                     "sensor reads the same on every setting, and the search cannot tell them apart; check it "
                     "with `edgetune monitor --device %s`", device.name, label, device.name)


class _StepWatchdog:
    """Stops a setting over the budget in the middle of a step (safe profiling).

    The search checks a setting's power after every step, which cannot stop a long step: a large batch at
    low clocks runs seconds per step (twin Xavier NX, chartransformer at batch 64 and the lowest GPU clock:
    3.25 s at 6.74 W, against a 5.3-W budget). While a step runs, the watchdog checks the same condition on
    the monitor's samples (every :data:`_WATCH_INTERVAL_S`, on the sampling thread) and, once it holds,
    drops the board to rest at once (``stop``): the step finishes at the rest clocks, as a clock write
    takes effect on the board mid-kernel. An error from ``check`` or ``stop`` is kept for the caller to raise
    once the step is done (it cannot be raised on the sampling thread).
    """

    def __init__(self, monitor: PowerMonitor, check: Callable[[], bool], stop: Callable[[], None]) -> None:
        self._monitor, self._check, self._stop = monitor, check, stop
        self._lock = threading.Lock()
        self._handle: int | None = None
        self._last_t = -math.inf
        self.fired = False
        self.error: Exception | None = None

    def __enter__(self) -> _StepWatchdog:  # noqa: PYI034 - Python 3.10 has no typing.Self
        self._handle = self._monitor.add_listener(self._on_sample)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._monitor.remove_listener(self._handle)
        with self._lock:  # a check in flight on the sampling thread finishes first
            self._handle = None

    def _on_sample(self, reading: PowerReading) -> None:
        with self._lock:
            if self._handle is None or self.fired or reading.t - self._last_t < _WATCH_INTERVAL_S:
                return
            self._last_t = reading.t
            try:
                if self._check():
                    self.fired = True
                    self._stop()
            except Exception as exc:  # noqa: BLE001 - raised on the measuring thread, after the step
                self.fired, self.error = True, exc


def _finish(monitor: PowerMonitor, whole: str, t_set: float, limit_w: float | None) -> float:
    """Close the setting's window; the seconds its moving average spent above ``limit_w`` from ``t_set`` on
    (0 without one)."""
    monitor.end_window(whole)
    if limit_w is None:
        return 0.0
    times, watts = monitor.records()
    if times.size == 0:
        return 0.0
    return over_limit_s(times, watts, t_set, float(times[-1]), monitor.avg_window_s, limit_w)
