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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgetune.power.base import Device, KnobValue, is_out_of_memory
from edgetune.power.monitor import PowerMonitor

__all__ = ["Measurement", "MeasurementProtocol", "judged_power_w", "measure_setting"]


def judged_power_w(max_avg_power_w: float, power_se_w: float, guard_sigma: float = 0.0) -> float:
    """The power a budget is judged by: the measured maximum of the moving average plus ``guard_sigma``
    standard errors of one average (a guard band against a measurement that happens to read low)."""
    return max_avg_power_w + guard_sigma * power_se_w


@dataclass(frozen=True)
class MeasurementProtocol:
    """How one setting is measured.

    Attributes:
        warmup_steps: steps run after the knobs are set and before the window opens (caches, allocator,
            clock ramp-up). Always real training steps.
        measure_steps: the window holds at least this many steps.
        measure_s: ... and spans at least this many seconds of device-clock time, so that the budget's
            moving average (1 s by default) is computed over a full window at least once. Where the monitor
            widened that window for a slow sensor (jtop), the window spans at least the widened one.
        real_steps: on a virtual clock (the twin), how many of the window's steps execute the real training
            step; the rest are timed by the twin only. ``None``: all of them. Ignored on real hardware,
            where every step is real.
        max_steps: safety cap on the window's steps (a very fast step with a long ``measure_s``).
    """

    warmup_steps: int = 1
    measure_steps: int = 5
    measure_s: float = 2.0
    real_steps: int | None = 1
    max_steps: int = 100_000

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.measure_steps < 1:
            raise ValueError(f"measure_steps must be >= 1, got {self.measure_steps}")
        if not self.measure_s >= 0:
            raise ValueError(f"measure_s must be >= 0, got {self.measure_s}")
        if self.real_steps is not None and self.real_steps < 0:
            raise ValueError(f"real_steps must be >= 0 or None, got {self.real_steps}")
        if self.max_steps < self.measure_steps:
            raise ValueError("max_steps must be >= measure_steps")

    def describe(self, virtual_clock: bool, runs_step: bool = True) -> str:
        """One line for reports: what was run for real and what was timed.

        ``runs_step`` is False where the device does not execute the training step at all (a trace replay:
        the table is the training run).
        """
        window = f"window of >= {self.measure_steps} steps and >= {self.measure_s:g} s on the device clock"
        if not runs_step:
            return (f"{self.warmup_steps} warm-up step(s), then a {window} (virtual time); the device replays "
                    f"measured step times and power, the training step itself is not executed")
        if not virtual_clock or self.real_steps is None:
            return f"{self.warmup_steps} warm-up step(s), then a {window}; every step a real training step"
        return (f"{self.warmup_steps} real warm-up step(s), then a {window} (virtual time); the first "
                f"{self.real_steps} step(s) of the window run the real training step, the twin times the rest")


@dataclass
class Measurement:
    """What one setting did on the device.

    ``ok`` is False when the step could not run (out of memory or another failure, see ``error``); then
    the timing and power fields are NaN. Power figures are board power over the measured window.

    Attributes:
        batch_size: samples per step.
        setting: knob name -> value as applied.
        ok: the steps ran.
        oom: the batch did not fit in device memory.
        error: one line on why the steps did not run, else None.
        steps: steps in the measured window.
        real_steps: of those, how many executed the real training step (== steps on hardware).
        duration_s: window length on the device clock.
        step_time_s: mean time per step.
        samples_per_s: throughput.
        mean_power_w, peak_power_w: mean and peak of the sampled board power.
        max_avg_power_w: maximum of the moving average (window ``avg_window_s``): what a budget is judged by.
        power_se_w: standard error of one ``avg_window_s`` average of the sampled power: the sensor's noise and
            the step's ripple seen through its update instants make a measured average miss the true one
            by about this much (the std of the window's readings over the root of the sensor updates in one
            averaging window).
        energy_j: energy over the window.
        energy_per_sample_j: energy / samples.
        samples: power samples in the window; dropped: sensor reads dropped in it.
        loss: the last real step's loss (NaN where none ran).
        wall_s: wall-clock seconds the measurement took (warm-up included).
        trace_t, trace_w: the window's power record (times relative to the window start), for plots.
    """

    batch_size: int
    setting: dict[str, KnobValue]
    ok: bool
    oom: bool = False
    error: str | None = None
    steps: int = 0
    real_steps: int = 0
    duration_s: float = math.nan
    step_time_s: float = math.nan
    samples_per_s: float = math.nan
    mean_power_w: float = math.nan
    peak_power_w: float = math.nan
    max_avg_power_w: float = math.nan
    avg_window_s: float = 1.0
    power_se_w: float = 0.0
    energy_j: float = math.nan
    energy_per_sample_j: float = math.nan
    samples: int = 0
    dropped: int = 0
    loss: float = math.nan
    wall_s: float = 0.0
    trace_t: list[float] = field(default_factory=list, repr=False)
    trace_w: list[float] = field(default_factory=list, repr=False)

    def judged_power_w(self, guard_sigma: float = 0.0) -> float:
        """The power a budget is judged by (:func:`judged_power_w`)."""
        return judged_power_w(self.max_avg_power_w, self.power_se_w, guard_sigma)

    def holds(self, budget_w: float | None, tolerance: float = 0.0, guard_sigma: float = 0.0) -> bool:
        """True when the step ran and its judged power stayed within ``budget * (1 + tolerance)``.

        ``guard_sigma`` standard errors of the measured average are added first (a guard band against a
        measurement that reads low); ``budget_w=None`` means unconstrained.
        """
        if not self.ok:
            return False
        if budget_w is None:
            return True
        return bool(self.judged_power_w(guard_sigma) <= budget_w * (1.0 + tolerance))

    def to_dict(self, *, trace: bool = False) -> dict[str, Any]:
        """Plain dict (JSON-ready); the power trace only when asked."""
        d = asdict(self)
        if not trace:
            d.pop("trace_t")
            d.pop("trace_w")
        return d


def _downsample(t: np.ndarray, p: np.ndarray, max_points: int = 400) -> tuple[list[float], list[float]]:
    """Keep at most ``max_points`` samples, evenly spaced in index, always keeping the peak."""
    if t.size <= max_points:
        return t.tolist(), p.tolist()
    idx = np.unique(np.concatenate([np.linspace(0, t.size - 1, max_points).astype(int), [int(np.argmax(p))]]))
    return t[idx].tolist(), p[idx].tolist()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def measure_setting(
    device: Device,
    workload: Any,
    batch_size: int,
    setting: Mapping[str, KnobValue],
    protocol: MeasurementProtocol,
    monitor: PowerMonitor,
    on_step: Callable[[int], None] | None = None,
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

    Returns:
        A :class:`Measurement`; ``ok=False`` for out-of-memory or a failed step (never raised).
        ``KeyboardInterrupt`` and knob errors (:class:`~edgetune.power.DeviceError` from ``apply``) propagate.
    """
    wall0 = time.perf_counter()
    device.apply(setting)
    applied = {name: device.knobs[name].read() for name in setting}
    clock = device.clock
    virtual = bool(getattr(clock, "virtual", False))
    cost = getattr(workload, "cost", None)
    real_limit = protocol.real_steps if (virtual and protocol.real_steps is not None) else None
    last_loss = [math.nan]

    def real_step() -> Any:
        loss = workload.train_step(batch_size)
        last_loss[0] = float(loss)
        return loss

    def timed_only() -> None:  # the twin times the step; the workload is not run again
        return None

    result = Measurement(batch_size=int(batch_size), setting=dict(applied), ok=False,
                         avg_window_s=monitor.avg_window_s)
    window = f"measure-{id(result)}"
    window_open = False
    try:
        for _ in range(protocol.warmup_steps):
            device.run_step(real_step, batch_size, cost)
        monitor.begin_window(window)
        window_open = True
        t0 = clock.now()
        steps = real = 0
        while steps < protocol.max_steps:
            is_real = real_limit is None or real < real_limit
            device.run_step(real_step if is_real else timed_only, batch_size, cost)
            steps += 1
            real += int(is_real)
            if on_step is not None:
                on_step(steps)
            long_enough = clock.now() - t0 >= max(protocol.measure_s, monitor.min_measure_s)
            if steps >= protocol.measure_steps and long_enough:
                break
        t1 = clock.now()
        stats = monitor.end_window(window)
        window_open = False
        times, watts = monitor.records()
    except Exception as exc:  # noqa: BLE001 - an OOM or a failing step is a result, not a crash
        if window_open:
            monitor.end_window(window)
        result.oom = is_out_of_memory(exc)
        result.error = (f"out of memory at batch size {batch_size}" if result.oom else _one_line(exc))
        result.wall_s = time.perf_counter() - wall0
        return result
    except BaseException:
        if window_open:
            monitor.end_window(window)
        raise

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
    result.max_avg_power_w = float(stats.max_avg_w)
    result.energy_j = float(stats.energy_j)
    result.energy_per_sample_j = float(stats.energy_j) / (batch_size * steps)
    result.samples = int(stats.samples)
    result.dropped = int(stats.dropped)
    w = watts[in_window]
    if w.size > 1:
        period = max(float(getattr(device.sensor, "update_period_s", 0.0) or 0.0), 1.0 / monitor.rate_hz)
        updates_per_average = max(1.0, monitor.avg_window_s / period)
        result.power_se_w = float(np.std(w, ddof=1) / math.sqrt(updates_per_average))
    result.loss = last_loss[0]
    result.wall_s = time.perf_counter() - wall0
    return result
