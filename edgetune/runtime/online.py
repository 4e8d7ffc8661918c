"""Online tuning: without a plan, try a few (batch size, GPU frequency) settings on the real training run,
then settle on the one that reaches the target fastest under the budget.

Every step of the exploration is a real training step of the user's loop: nothing is thrown away, the
model trains throughout. Each candidate runs ``steps_per_candidate`` steps (the first ``warmup_steps`` are
not measured: a batch-size change has its own first-step costs); its window of the power monitor gives the
measured step time and power, hardware in the loop.

Which candidates
    An initial design spreads over the space: the corners of (log batch size, GPU frequency) and its centre.
    Once three are measured, the predictors' :class:`~edgetune.predictors.HardwareModel` is fitted and
    predicts the whole grid; the next candidate is the best predicted one not yet measured whose predicted
    power (plus one standard deviation) stays under the budget. At most ``max_candidates`` are measured.

What "best" means
    Time to target = steps(b) x step time, with steps(b) = S_min (1 + B_noise / b) (McCandlish et al. 2018;
    S_min is the same for every setting, so it drops out). ``B_noise`` is measured on the real gradients:
    at each explored step an optimizer pre-step hook reads the squared norm of the gradient |G_b|^2 at that
    batch size (E|G_b|^2 = |G|^2 + tr(Sigma) / b); every pair of explored batch sizes gives McCandlish et
    al.'s two-point estimates of |G|^2 and tr(Sigma) (appendix A), averaged by the predictors'
    :class:`~edgetune.predictors.GradientNoiseScale`; B_noise = tr(Sigma) / |G|^2. The explored batch
    sizes come from different steps, so this is the noise scale of the exploration's stretch of training.
    A given ``b_noise`` overrides it.

Safety
    The budget guard stays on during the exploration. A candidate whose power trips the guard is recorded
    as over budget and left at once; a candidate whose batch does not fit in device memory is recorded as
    such. The settled setting is the best measured one that held the budget with the guard's margin.

The contract with the controller
    The online tuner applies nothing and reads no controller state. The controller calls it with plain
    values (a :class:`RunState`: device time, batch size, budget, the knob setting in force; the power the
    guard saw at a trip) and gets an :class:`OnlineDecision` back: its :class:`OnlineMove` kind says
    whether to run the next candidate (``MOVE``), settle on the best one (``SETTLE``), keep the setting
    in force because nothing could be measured (``STOP``) or do nothing (``NONE``); the controller records
    the decision's notes as events and applies its :class:`~edgetune.power.knobs.Candidate`. The tuner's
    only direct reads are the monitor's measurement windows and the optimizer's gradients.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from edgetune.power.base import Knob, KnobValue, format_value
from edgetune.power.knobs import Candidate, check_batch_size
from edgetune.power.monitor import WindowStats
from edgetune.runtime.guard import PRIMARY_KNOBS, LadderModel, frequency_prior, primary_steps

__all__ = [
    "Measurement",
    "MeasurementStatus",
    "OnlineDecision",
    "OnlineMove",
    "OnlineOptions",
    "OnlineTuner",
    "RunState",
    "noise_scale_from_norms",
]

#: the batch size exploration centres on when neither a batch size nor a plan gives one
DEFAULT_START_BATCH_SIZE = 32
#: the default candidate batch sizes are powers of two from start / BATCH_SPAN to start x BATCH_SPAN
BATCH_SPAN = 4
#: the largest power of two considered (2 ** 15 samples: beyond any edge device's training memory)
MAX_BATCH_EXPONENT = 15
#: a default candidate batch is at most 1 / DATASET_FRACTION of the dataset (an epoch holds several steps)
DATASET_FRACTION = 4
#: the hardware model is fitted once this many distinct points are measured (fewer: the initial design)
MIN_FIT_POINTS = 3
#: EMA factor of the gradient-noise-scale estimator: near 1, with its bias correction a plain mean over
#: the few batch-size pairs of an exploration
NOISE_SCALE_BETA = 0.999
#: fraction of the margin: a candidate whose window mean power is above budget x (1 - this x margin) did
#: not hold the budget (half the guard's target margin: the guard would soon have tripped)
OVER_BUDGET_MARGIN_FRACTION = 0.5
#: W: the least a rung's prior power stands above idle (every rung keeps a dynamic part to scale)
MIN_RUNG_ABOVE_IDLE_W = 1e-3
#: W: a dynamic range below this counts as none when the rung priors are rescaled
ZERO_RANGE_W = 1e-9
#: every candidate of online tuning's space draws under this fraction of the budget (measured and predicted):
#: the knobs it leaves as found (the power mode's caps) keep the run from the budget's speed, which it says
LIMIT_HEADROOM = 0.8
#: what the notes on online tuning's limits advise
SEARCH_ADVICE = ("`edgetune search` also searches the power mode, online cores and the CPU and memory clocks: "
                 "run it and pass its best.json as tune(plan=...)")
#: ms per s (step times in the events are in ms)
_MS_PER_S = 1e3


class MeasurementStatus(str, enum.Enum):
    """How a candidate's measurement ended (a str enum: compares equal to its value)."""

    OK = "ok"
    #: its window mean was over the budget (less the margin), or the guard tripped during it
    OVER_BUDGET = "over budget"
    #: its batch did not fit in device memory
    OUT_OF_MEMORY = "out of memory"


@dataclass
class Measurement:
    """One explored candidate: what its window measured, or why it has none."""

    candidate: Candidate
    steps: int = 0
    step_time_s: float = math.nan
    power_w: float = math.nan
    peak_power_w: float = math.nan
    status: MeasurementStatus = MeasurementStatus.OK

    def time_to_target(self, b_noise: float) -> float:
        """Relative time to target: step time x (1 + B_noise / b) (S_min drops out)."""
        return self.step_time_s * (1.0 + b_noise / self.candidate.batch_size)

    @property
    def usable(self) -> bool:
        """Whether its step time and power can inform the hardware model (even if over budget)."""
        return math.isfinite(self.step_time_s) and math.isfinite(self.power_w) and self.step_time_s > 0


@dataclass(frozen=True)
class OnlineOptions:
    """How the online tuner explores (``online=`` of :func:`edgetune.tune` takes these as a mapping).

    Attributes:
        batch_sizes: candidate batch sizes (default: powers of two from a quarter to four times the start,
            at most a quarter of the dataset).
        steps_per_candidate: training steps per candidate (all of them train the model).
        warmup_steps: of those, the first ones not measured (a batch-size change has first-step costs).
        max_candidates: most candidates measured.
        b_noise: the gradient noise scale in samples, instead of measuring it.
        margin: a candidate holds the budget when its mean power is this fraction under it (default: the
            guard's ``target_margin``).
    """

    batch_sizes: Sequence[int] | None = None
    steps_per_candidate: int = 20
    warmup_steps: int = 3
    max_candidates: int = 6
    b_noise: float | None = None
    margin: float | None = None

    def __post_init__(self) -> None:
        if self.steps_per_candidate <= self.warmup_steps:
            raise ValueError("steps_per_candidate must exceed warmup_steps")
        if self.max_candidates < 1:
            raise ValueError("max_candidates must be at least 1")


@dataclass(frozen=True)
class RunState:
    """The values in force when the controller calls the online tuner.

    Attributes:
        t: device-clock time (s).
        batch_size: the batch size of the step that just ran.
        budget_w: the budget in force (W).
        setting: knob name -> value in force (the next candidates are built around it).
    """

    t: float
    batch_size: int
    budget_w: float
    setting: Mapping[str, KnobValue]


class OnlineMove(enum.Enum):
    """What the controller is to do after a call to the online tuner."""

    #: nothing: the candidate in force keeps running
    NONE = "none"
    #: run :attr:`OnlineDecision.candidate` next (exploration goes on)
    MOVE = "move"
    #: exploration is over: run :attr:`OnlineDecision.candidate` from now on
    SETTLE = "settle"
    #: exploration is over without a usable measurement: keep the setting in force
    STOP = "stop"


@dataclass(frozen=True)
class OnlineDecision:
    """The online tuner's answer: the kind of move, the candidate to apply, notes for the run's events and
    warnings (events the user sees without logging set up: where online tuning's space shows its limit)."""

    kind: OnlineMove = OnlineMove.NONE
    candidate: Candidate | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


_NOTHING = OnlineDecision()


class PowerWindows(Protocol):
    """Named measurement windows over board power (a :class:`~edgetune.power.monitor.PowerMonitor`)."""

    def begin_window(self, name: str) -> None: ...

    def end_window(self, name: str) -> WindowStats: ...


def noise_scale_from_norms(norms: dict[int, list[float]]) -> tuple[float, float, float] | None:
    """(|G|^2, tr(Sigma), B_noise) from squared gradient norms per batch size; None if not estimable.

    Every pair of batch sizes b_small < b_big gives McCandlish et al.'s unbiased two-point estimates from the
    mean |G_b|^2 at each; :class:`~edgetune.predictors.GradientNoiseScale` averages them (its EMA with
    beta near 1 and bias correction is a plain mean over these few pairs) and takes the ratio. Needs at least
    two batch sizes, and positive averages.
    """
    from edgetune.predictors import GradientNoiseScale

    sizes = sorted(b for b, v in norms.items() if v)
    if len(sizes) < 2:
        return None
    means = {b: float(np.mean(norms[b])) for b in sizes}
    gns = GradientNoiseScale(beta=NOISE_SCALE_BETA)
    for i, small in enumerate(sizes):
        for big in sizes[i + 1:]:
            gns.update(means[small], means[big], small, big)
    if not math.isfinite(gns.noise_scale):
        return None
    return gns.grad_sq, gns.trace_cov, gns.noise_scale


def _grad_norm_sq(optimizer: torch.optim.Optimizer) -> float:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return math.nan
    return float(sum(n.item() ** 2 for n in torch._foreach_norm(grads)))


@dataclass
class _Window:
    candidate: Candidate
    steps: int = 0
    open: bool = False
    first_t: float = math.nan  # end of the candidate's first step
    last_t: float = math.nan
    paused: bool = False  # the run left training (an evaluation) with the window open
    resuming: bool = False  # training resumed: the window goes on from the end of the next step
    counted: int = 0  # steps inside the window
    #: the window's closed segments (before each pause): seconds, joules, the highest power read
    done_s: float = 0.0
    done_j: float = 0.0
    done_peak_w: float = 0.0
    #: the candidate's knob could not be written (:meth:`OnlineTuner.knob_failed`): its steps measure another
    #: setting, so the window ends at the next step without a measurement
    void: bool = False

    def step_time(self) -> float:
        return (self.last_t - self.first_t) / (self.steps - 1) if self.steps >= 2 else math.nan


class OnlineTuner:
    """Explores a bounded number of settings during the real run, then settles (see the module docs).

    Args:
        knobs: the device's writable knobs; the candidates vary the first of
            :data:`~edgetune.runtime.guard.PRIMARY_KNOBS` among them with numeric values (the GPU clock).
        windows: the power monitor; each candidate is measured over one of its named windows.
        start_batch_size: the batch size to explore around (None: :data:`DEFAULT_START_BATCH_SIZE`).
        dataset_size: samples in the dataset, where known (caps the default batch sizes).
        options: how to explore.
        guard_margin: the guard's ``target_margin``, the default of ``options.margin``.
        seed: seeds the hardware model's fit.
    """

    def __init__(self, knobs: Mapping[str, Knob], windows: PowerWindows, *, start_batch_size: int | None = None,
                 dataset_size: int | None = None, options: OnlineOptions | None = None, guard_margin: float,
                 seed: int = 0) -> None:
        options = options or OnlineOptions()
        self.options = options
        self.steps_per_candidate = options.steps_per_candidate
        self.warmup_steps = options.warmup_steps
        self.max_candidates = options.max_candidates
        self.fixed_b_noise = options.b_noise
        self.margin = guard_margin if options.margin is None else options.margin
        self.seed = seed
        self._knobs = dict(knobs)
        self._windows = windows
        self.measurements: list[Measurement] = []
        self.norms: dict[int, list[float]] = {}
        self.model: Any = None
        self.chosen: Measurement | None = None
        self._window: _Window | None = None
        self._queue: list[Candidate] = []
        self._t_open = 0.0
        self.sizes, self.primary, self.values = self._space(start_batch_size or DEFAULT_START_BATCH_SIZE,
                                                            dataset_size)

    # -- the space ---------------------------------------------------------------------------------
    def _space(self, start: int, dataset_size: int | None) -> tuple[list[int], str | None, list[KnobValue]]:
        if self.options.batch_sizes:
            sizes = sorted({check_batch_size(b, "an online batch size") for b in self.options.batch_sizes})
        else:
            sizes = [2 ** k for k in range(MAX_BATCH_EXPONENT + 1) if start / BATCH_SPAN <= 2 ** k <= start * BATCH_SPAN]
            if dataset_size is not None:
                cap = max(1, dataset_size // DATASET_FRACTION)
                sizes = [b for b in sizes if b <= cap] or [min(start, cap)]
        knobs = self._knobs
        primary = next((k for k in PRIMARY_KNOBS if k in knobs and knobs[k].numeric), None)
        values = list(knobs[primary].values) if primary else []
        return sizes, primary, values

    def _candidate(self, b: int, value: KnobValue | None, setting: Mapping[str, KnobValue]) -> Candidate:
        """Batch size ``b`` with the primary knob at ``value``, the other writable knobs as in ``setting``."""
        base = {k: v for k, v in setting.items() if k in self._knobs}
        if self.primary is not None and value is not None:
            base[self.primary] = value
        return Candidate(b, tuple(sorted(base.items())))

    def _grid(self, setting: Mapping[str, KnobValue]) -> list[Candidate]:
        return [self._candidate(b, v, setting) for b in self.sizes for v in (self.values or [None])]

    def start(self, setting: Mapping[str, KnobValue]) -> OnlineDecision:
        """The initial design around ``setting`` (the knobs in force); a ``MOVE`` to its first candidate."""
        lo, hi = self.sizes[0], self.sizes[-1]
        mid = self.sizes[len(self.sizes) // 2]
        vals = self.values or [None]
        f_lo, f_hi, f_mid = vals[0], vals[-1], vals[len(vals) // 2]
        design = [(mid, f_mid), (hi, f_lo), (lo, f_hi), (hi, f_hi), (lo, f_lo)]
        seen: set[Candidate] = set()
        for b, f in design:
            c = self._candidate(b, f, setting)
            if c not in seen:
                seen.add(c)
                self._queue.append(c)
        first = self._queue.pop(0)
        self._window = _Window(first)
        note = (f"online tuning: batch sizes {self.sizes}"
                + (f", {self.primary} {len(self.values)} values" if self.primary else "")
                + f"; up to {self.max_candidates} candidates x {self.steps_per_candidate} steps")
        return OnlineDecision(OnlineMove.MOVE, first, (note,))

    @property
    def exploring(self) -> bool:
        """True until the tuner settles (or stops)."""
        return self._window is not None

    @property
    def b_noise(self) -> float | None:
        """The gradient noise scale in samples: the given one, else the one measured so far (None: too few)."""
        if self.fixed_b_noise is not None:
            return self.fixed_b_noise
        est = noise_scale_from_norms(self.norms)
        return est[2] if est else None

    # -- what the controller reports -----------------------------------------------------------------
    def before_step(self, batch_size: int, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer pre-step hook: the gradient of this step at this batch size (exploration only)."""
        w = self._window
        if w is not None and batch_size == w.candidate.batch_size:
            g = _grad_norm_sq(optimizer)
            if math.isfinite(g):
                self.norms.setdefault(w.candidate.batch_size, []).append(g)

    def after_step(self, now: RunState) -> OnlineDecision:
        """A step ended at ``now.t``: count it in the candidate's window; measure when the window is full."""
        w = self._window
        if w is not None and w.void:
            self._close_window(w)
            note = (f"online: candidate batch size {w.candidate.batch_size}, {self._describe(w.candidate)}: not "
                    f"measured ({self.primary} could not be set)")
            return self._advance(now, (note,))
        if w is None or now.batch_size != w.candidate.batch_size:
            return _NOTHING  # the new batch size reaches the loop with the next batch
        t = now.t
        w.steps += 1
        if w.steps == 1:
            w.first_t = t
        w.last_t = t
        if w.steps == self.warmup_steps:
            self._windows.begin_window("online")
            w.open = True
            self._t_open = t
        elif w.open and w.resuming:
            self._windows.begin_window("online")
            self._t_open = t
            w.resuming = False
        elif w.open and not w.paused:
            w.counted += 1
        if w.steps >= self.steps_per_candidate and w.open and not (w.paused or w.resuming) and w.counted:
            stats = self._windows.end_window("online")
            w.open = False
            n = w.counted
            span = max(t - self._t_open, 0.0)
            total_s = w.done_s + span  # the window's time in training, its pauses left out
            mean_w = (w.done_j + stats.mean_w * span) / total_s if total_s > 0 else stats.mean_w
            m = Measurement(w.candidate, n, total_s / n, mean_w, max(stats.peak_w, w.done_peak_w))
            if mean_w > now.budget_w * (1 - OVER_BUDGET_MARGIN_FRACTION * self.margin):
                m.status = MeasurementStatus.OVER_BUDGET
            return self._record(m, now)
        return _NOTHING

    def on_guard_trip(self, now: RunState, power_w: float) -> OnlineDecision:
        """The guard tripped (drawing ``power_w`` on its fast average): the candidate does not hold the
        budget. What it drew until then and its step time still inform the hardware model."""
        w = self._window
        if w is None or w.void:  # a void window measures nothing: the next step ends it
            return _NOTHING
        self._close_window(w)
        return self._record(Measurement(w.candidate, w.steps, w.step_time(), power_w, power_w,
                                        status=MeasurementStatus.OVER_BUDGET), now)

    def pause(self, t: float) -> None:
        """The run leaves training at device time ``t`` (an evaluation: ``tuner.between_steps``): the open
        window's segment closes here, so the evaluation's time and power are no candidate's."""
        w = self._window
        if w is None or not w.open or w.paused:
            return
        w.paused = True
        if w.resuming:  # left again before a step: no segment is open
            return
        stats = self._windows.end_window("online")
        span = max(t - self._t_open, 0.0)
        w.done_s += span
        w.done_j += stats.mean_w * span
        w.done_peak_w = max(w.done_peak_w, stats.peak_w)

    def resume(self, t: float) -> None:
        """Training resumes at device time ``t``: the candidate's window goes on from the end of the next
        step, so that the segment starts, as the window did, at a step's end and not in the evaluation's
        trailing power."""
        w = self._window
        if w is not None and w.paused:
            w.paused, w.resuming = False, True

    def on_out_of_memory(self, now: RunState) -> OnlineDecision:
        """The candidate's batch does not fit in device memory (only while exploring)."""
        w = self._window
        if w is None:
            raise RuntimeError("out of memory outside exploration")
        self._close_window(w)
        return self._record(Measurement(w.candidate, 0, status=MeasurementStatus.OUT_OF_MEMORY), now)

    def knob_failed(self, name: str, value: KnobValue) -> None:
        """Knob ``name`` could not be written and stays at ``value`` for the rest of the run. Where it is the
        knob the exploration varies, the candidates left are those at ``value`` (the ones measured at other
        values still inform the hardware model, but cannot be settled on), and the candidate in force, if it
        asked for another value, ends at the next step without a measurement (:meth:`after_step`). Any other
        knob the candidates take as found (the controller writes none of them)."""
        if name != self.primary or self._window is None:
            return
        self.values = [value]
        self._queue = [c for c in self._queue if c.knobs.get(name) == value]
        if self._window.candidate.knobs.get(name) != value:
            self._window.void = True

    def _close_window(self, w: _Window) -> None:
        if w.open and not (w.paused or w.resuming):
            self._windows.end_window("online")
        w.open = w.paused = w.resuming = False

    # -- choosing ---------------------------------------------------------------------------------
    def _record(self, m: Measurement, now: RunState) -> OnlineDecision:
        self.measurements.append(m)
        figures = f"{m.step_time_s * _MS_PER_S:.2f} ms/step, {m.power_w:.2f} W"
        status = m.status.value
        what = figures if m.status is MeasurementStatus.OK else (f"{status} ({figures})" if m.usable else status)
        note = f"online: candidate batch size {m.candidate.batch_size}, {self._describe(m.candidate)}: {what}"
        return self._advance(now, (note,))

    def _advance(self, now: RunState, notes: tuple[str, ...]) -> OnlineDecision:
        """The next candidate (``MOVE``), or the end of the exploration; ``notes`` first among its notes."""
        nxt = self._next_candidate(now)
        if nxt is None:
            settled = self._settle(now)
            return OnlineDecision(settled.kind, settled.candidate, (*notes, *settled.notes), settled.warnings)
        self._window = _Window(nxt)
        return OnlineDecision(OnlineMove.MOVE, nxt, notes)

    def _describe(self, c: Candidate) -> str:
        if self.primary is None:
            return "knobs as found"
        return f"{self.primary}={format_value(c.knobs[self.primary], self._knobs[self.primary].unit)}"

    def _ok(self) -> list[Measurement]:
        """The measurements that held nothing wrong and can still be run (at a value of the primary knob that
        can be set: :meth:`knob_failed`)."""
        return [m for m in self.measurements if m.status is MeasurementStatus.OK
                and (self.primary is None or m.candidate.knobs.get(self.primary) in self.values)]

    def _features(self, c: Candidate) -> dict[str, float]:
        names = [self.primary] if self.primary else []
        return {**{k: float(c.knobs[k]) for k in names}, "batch_size": c.batch_size}

    def _fit(self) -> None:
        from edgetune.predictors import HardwareModel

        ok = [m for m in self.measurements if m.usable]
        X = [self._features(m.candidate) for m in ok]
        if len(ok) < MIN_FIT_POINTS or len({tuple(x.values()) for x in X}) < MIN_FIT_POINTS:
            self.model = None
            return
        self.model = HardwareModel(random_state=self.seed).fit(
            X, [m.step_time_s for m in ok], [m.power_w for m in ok], [m.peak_power_w for m in ok])

    def _assumed_b_noise(self) -> float:
        """B_noise measured (or given), else the median candidate batch size (a neutral guess)."""
        b_noise = self.b_noise
        return b_noise if b_noise is not None else float(np.median(self.sizes))

    def _next_candidate(self, now: RunState) -> Candidate | None:
        done = {m.candidate for m in self.measurements}
        if len(self.measurements) >= self.max_candidates:
            return None
        grid_all = self._grid(now.setting)
        # over budget or out of memory rules out what is surely worse: power rises with the clock and with
        # the batch size (the GPU is busier), memory with the batch size
        blocked = set()
        for m in self.measurements:
            if m.status is MeasurementStatus.OVER_BUDGET:
                v = m.candidate.knobs.get(self.primary) if self.primary else None
                blocked |= {c for c in grid_all if c.batch_size >= m.candidate.batch_size
                            and (v is None or c.knobs[self.primary] >= v)}
            elif m.status is MeasurementStatus.OUT_OF_MEMORY:
                blocked |= {c for c in grid_all if c.batch_size >= m.candidate.batch_size}
        self._fit()
        if self.model is None:
            while self._queue:
                c = self._queue.pop(0)
                if c not in done and c not in blocked:
                    return c
            # too few measurements to fit (the design was mostly over budget): the fastest-looking of the
            # rest, highest clock first, then the largest batch
            rest = [c for c in grid_all if c not in done and c not in blocked]
            key = (lambda c: (-float(c.knobs[self.primary]), -c.batch_size)) if self.primary else \
                (lambda c: -c.batch_size)
            return min(rest, key=key) if rest else None
        grid = [c for c in grid_all if c not in done and c not in blocked]
        if not grid:
            return None
        pred = self.model.predict([self._features(c) for c in grid])
        b_noise = self._assumed_b_noise()
        budget = now.budget_w * (1 - self.margin)
        best_known = min((m.time_to_target(b_noise) for m in self._ok()
                          if m.power_w <= budget), default=math.inf)
        scored = []
        for c, t, p, ps in zip(grid, pred.step_time_s, pred.power_w, pred.power_std):
            if p + ps <= budget:
                scored.append((t * (1 + b_noise / c.batch_size), c))
        scored.sort(key=lambda x: x[0])
        if not scored or scored[0][0] >= best_known:
            return None  # nothing predicted to beat the best measured: stop exploring
        return scored[0][1]

    def _settle(self, now: RunState) -> OnlineDecision:
        self._window = None
        b_noise = self._assumed_b_noise()
        budget = now.budget_w * (1 - self.margin)
        ok = [m for m in self._ok() if m.power_w <= budget]
        source = "measured" if self.fixed_b_noise is None and noise_scale_from_norms(self.norms) else "assumed"
        if ok:
            best = min(ok, key=lambda m: m.time_to_target(b_noise))
        elif self._ok():
            # nothing held the budget: the lowest-power measurement, and the guard takes it from there
            best = min(self._ok(), key=lambda m: m.power_w)
        elif any(m.status is MeasurementStatus.OVER_BUDGET for m in self.measurements):
            return OnlineDecision(OnlineMove.STOP, None, (
                "online: no candidate held the budget; keeping the current setting, which the guard lowers",),
                (self._limit_note(None, now),))
        else:
            return OnlineDecision(OnlineMove.STOP, None,
                                  ("online: no candidate could be measured; keeping the current setting",))
        self.chosen = best
        note = (f"online: settled on batch size {best.candidate.batch_size}, {self._describe(best.candidate)} "
                f"after {len(self.measurements)} candidates (B_noise {b_noise:.0f} samples, {source})")
        limit = self._limit_note(best if ok else None, now)
        return OnlineDecision(OnlineMove.SETTLE, best.candidate, (note,), (limit,) if limit else ())

    def _limit_note(self, best: Measurement | None, now: RunState) -> str:
        """Where the space online tuning explores (batch size x the primary knob, the other knobs as found)
        shows its limit: nothing in it held the budget (``best`` None), or none was over it and every candidate
        draws under :data:`LIMIT_HEADROOM` of it (:meth:`_space_top_w`). Empty otherwise."""
        fixed = ", ".join(f"{k}={format_value(v, self._knobs[k].unit)}" for k, v in sorted(now.setting.items())
                          if k != self.primary and k in self._knobs)
        what = f"batch size and {self.primary}" if self.primary else "batch size"
        if best is None:
            return (f"online: limit: no {what} with the other knobs as found ({fixed or 'none writable'}) held the "
                    f"{now.budget_w:g} W budget; the guard lowers the clocks and the batch size as far as they go, "
                    f"and the run may still draw over it. {SEARCH_ADVICE}")
        top_w = self._space_top_w(now)
        if any(m.status is MeasurementStatus.OVER_BUDGET for m in self.measurements) \
                or not top_w < LIMIT_HEADROOM * now.budget_w:
            return ""
        return (f"online: limit: every {what} online tuning can choose draws at most {top_w:.1f} W (measured and "
                f"predicted) of the {now.budget_w:g} W budget: the knobs as found ({fixed}) keep the run from "
                f"using the rest. {SEARCH_ADVICE}")

    def _space_top_w(self, now: RunState) -> float:
        """The most power any candidate of the space draws, W: the highest measured, and the hardware model's
        highest prediction over the grid where it is fitted (nan: nothing measured)."""
        top = max((m.power_w for m in self.measurements if m.usable), default=math.nan)
        if self.model is not None:
            predicted = self.model.predict([self._features(c) for c in self._grid(now.setting)]).power_w
            top = max(top, float(np.max(predicted)))
        return top

    # -- the guard's prior -----------------------------------------------------------------------------
    def ladder_prior(self, ladder: Sequence[Mapping[str, KnobValue]], batch_size: int, knobs: Mapping[str, Knob],
                     idle_w: float) -> LadderModel | None:
        """Rung powers the fitted hardware model predicts at ``batch_size``; None before it is fitted.

        Rungs below the primary knob's lowest value (CPU, EMC clocks down) keep the frequency prior's
        shape (over ``knobs``, the device's), anchored at the model's prediction for the lowest primary rung.
        """
        if self.model is None or self.primary is None or len({r.get(self.primary) for r in ladder}) < 2:
            return None  # the model knows the primary knob and the batch size: a ladder that leaves it gets none
        try:
            pred = self.model.predict([{self.primary: float(r[self.primary]), "batch_size": batch_size}
                                       for r in ladder])
        except (ValueError, KeyError):
            return None
        shape = frequency_prior(ladder, knobs, idle_w, float(np.max(pred.power_w))).prior_w
        lowest = ladder[0][self.primary]
        first_main = max(i for i, r in enumerate(ladder) if r[self.primary] == lowest)
        prior = np.array(pred.power_w, dtype=float)
        for i in range(first_main):
            prior[i] = idle_w + (prior[first_main] - idle_w) * (shape[i] - idle_w) / max(shape[first_main] - idle_w,
                                                                                         ZERO_RANGE_W)
        prior = np.maximum.accumulate(np.maximum(prior, idle_w + MIN_RUNG_ABOVE_IDLE_W))  # rungs ascend in power
        return LadderModel(tuple(float(p) for p in prior), idle_w=float(idle_w),
                           primary_steps=primary_steps(ladder))
