"""What one measured setting is: :class:`MeasurementProtocol` (how a setting is measured) and
:class:`Measurement` (what it did on the device).

:func:`~edgetune.search.trial.measure_setting` takes the one and returns the other; the search records
measurements in its study (:mod:`edgetune.search.records`), ``edgetune run`` prints one. Both are plain
dataclasses with no I/O: the window's arithmetic is in :mod:`edgetune.search.window`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from edgetune.power.base import KnobValue
from edgetune.search.window import judged_power_w

__all__ = ["Measurement", "MeasurementProtocol"]


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
        max_avg_power_w: maximum of the moving average over ``judged_span_s``: what a budget is judged by.
        avg_window_s: the budget's averaging window (s).
        judged_span_s: the span (s) of the moving average ``max_avg_power_w`` is the maximum of: the budget
            window, or, where the readings do not sweep a short step's phases within it, one sweep of them
            (:func:`~edgetune.search.window.judged_span_s`; the window then runs that long). The other power
            figures follow it. A window shorter than the budget window (stopped over the budget, or a protocol
            shorter than it) is judged on its mean: its length; a stopped window judged on the live average
            that crossed, where that is the larger, that average's span (a setting already running: up to the
            budget window; stopped in the middle of a step: the setting's own power until then).
        max_avg_noise_w: how far that maximum reads above the power's own from the sensor's reading noise
            alone (:func:`~edgetune.power.monitor.noise_max_excess_w`, at most the maximum over the mean of the
            window's averages, :func:`~edgetune.power.monitor.moving_average_mean`; 0 for a trial stopped over
            the budget): ``max_avg_power_w - max_avg_noise_w`` is what the margin to the budget is certified on.
        power_se_w: standard error of one ``judged_span_s`` average of the sampled power: the sensor's noise and
            the step's ripple seen through its update instants make a measured average miss the true one
            by about this much (the std of the window's readings over the root of the sensor updates in one
            averaging span; for a span longer than ``avg_window_s``, at least that std times the root of
            :func:`~edgetune.search.window.phase_unevenness`: the readings share the step's phases unevenly,
            and their mean holds their bias).
        energy_j: energy over the window.
        energy_per_sample_j: energy / samples.
        samples: power samples in the window; dropped: sensor reads dropped in it.
        loss: the last real step's loss (NaN where none ran).
        aborted_over_budget: the trial was stopped early because the live moving average crossed the budget
            (safe profiling, :mod:`edgetune.search.trial`); the figures then cover the steps since the knobs
            were set.
        stopped_mid_step: of those, stopped in the middle of a step (the mid-step watchdog of
            :mod:`edgetune.search.trial`): that step finished at the rest clocks, so ``step_time_s`` and the
            energy figures include a stretch not at this setting (its step time is then an upper bound of the
            setting's, not a measurement of it).
        over_budget_s: device seconds, from the knobs being set to the trial's end (the idle wait included),
            during which the moving average of board power was above the budget (0 when no budget was given).
        settle_s: device seconds the board idled before the setting was applied, until the recent past could no
            longer take the budget window's average over the limit (safe profiling, :mod:`edgetune.search.trial`);
            for the first setting a monitor sees, also until it held one window of the board's past.
        wall_s: wall-clock seconds the measurement took (warm-up included).
        temperature_c: the board temperature read at the window's end, degC (None: the device reads none):
            the search refers every window's power to one board temperature once a thermal soak measured how
            power follows it (:func:`~edgetune.search.thermal.thermal_offset_w`).
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
    max_avg_noise_w: float = 0.0
    avg_window_s: float = 1.0
    judged_span_s: float = 1.0
    power_se_w: float = 0.0
    energy_j: float = math.nan
    energy_per_sample_j: float = math.nan
    samples: int = 0
    dropped: int = 0
    loss: float = math.nan
    aborted_over_budget: bool = False
    stopped_mid_step: bool = False
    over_budget_s: float = 0.0
    settle_s: float = 0.0
    wall_s: float = 0.0
    temperature_c: float | None = None
    trace_t: list[float] = field(default_factory=list, repr=False)
    trace_w: list[float] = field(default_factory=list, repr=False)

    def judged_power_w(self, guard_sigma: float = 0.0) -> float:
        """The power a budget is judged by (:func:`~edgetune.search.window.judged_power_w`)."""
        return judged_power_w(self.max_avg_power_w, self.power_se_w, guard_sigma)

    def holds(self, budget_w: float | None, tolerance: float = 0.0, guard_sigma: float = 0.0) -> bool:
        """True when the step ran and its judged power stayed within ``budget * (1 + tolerance)``.

        ``guard_sigma`` standard errors of the measured average are added first (a guard band against a
        measurement that reads low); ``budget_w=None`` means unconstrained.
        """
        if not self.ok or self.aborted_over_budget:
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

