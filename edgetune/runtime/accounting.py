"""Energy, time and power of a training run, per step and per epoch, and budget violations.

The accounting consumes the samples the power monitor takes incrementally, through a :class:`SampleTap`
between the monitor and the sensor (so each sample is handled once, never by copying the monitor's
history), integrates energy (the monitor's trapezoid: :func:`~edgetune.power.monitor.cumulative_energy_j`)
and splits it at the step boundaries the controller marks. Marking a step is O(1) (an append), so the
user's loop pays nothing for the bookkeeping;
the arithmetic runs on the controller's ticker (:meth:`Accounting.update`), vectorised. The same tap gives
the guard its short and 1-s moving averages from a ring of the last two seconds.

A budget violation is an interval in which the 1-s moving average of board power exceeds the budget in
force (budgets can change during the run). For each: start, end, the worst average and the budget.

Time between steps that is no training (an evaluation: :meth:`Accounting.mark_gap`) is left out of every
step; its power still counts against the budget.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgetune.power.base import PowerReading, PowerSensor
from edgetune.power.monitor import cumulative_energy_j
from edgetune.runtime.guard import GuardMove

if TYPE_CHECKING:
    from edgetune.runtime.target import TargetOutcome

__all__ = ["Accounting", "EpochRecord", "RunSummary", "SampleTap", "StepRecord", "Violation"]

#: the batch size of a pending mark that is no step (:meth:`Accounting.mark_gap`)
_GAP = 0
#: s: a 1-s window that starts this close to its run of steps' start still lies inside it (float rounding of
#: device times, far below any sensor's period)
_WINDOW_SLACK_S = 1e-9


class SampleTap:
    """A :class:`~edgetune.power.base.PowerSensor` that passes another through and keeps what was read.

    Give it to the :class:`~edgetune.power.monitor.PowerMonitor` in place of the sensor, or sample it alone
    (:meth:`sample`: the controller's sampling thread does when no measurement window needs the monitor's
    history). Every good
    reading (finite, non-negative, later than the last: the monitor's own rules) is handed once to the
    accounting (:meth:`drain`) and kept for ``keep_s`` with its cumulative energy, so a live average over
    any recent window is two lookups (:meth:`average`), in pure Python: the guard calls it at 20 Hz.

    :meth:`read` only queues the reading (a deque append, safe across threads without a lock): it runs 100
    times a second on the sampling thread, where each line of Python is paid cold. The bookkeeping (order
    check, energy, trimming) runs for the queued readings in one batch when :meth:`average` or :meth:`drain`
    asks, under the tap's lock. Thread-safe: the monitor samples from its thread, the guard reads from its
    own.
    """

    def __init__(self, sensor: PowerSensor, keep_s: float = 2.0) -> None:
        self.sensor = sensor
        self.rails = sensor.rails
        self.total_label = sensor.total_label
        self.update_period_s = sensor.update_period_s
        self.keep_s = keep_s
        self._lock = threading.Lock()
        self._inbox: deque[tuple[float, float]] = deque()
        self._new_t: list[float] = []
        self._new_p: list[float] = []
        # recent samples: time, power, cumulative energy (J) since the first sample
        self._t: list[float] = []
        self._p: list[float] = []
        self._e: list[float] = []
        #: good readings taken so far
        self.total_samples = 0
        #: reads that failed in :meth:`sample` (the monitor counts its own)
        self.dropped = 0

    def read(self) -> PowerReading:
        r = self.sensor.read()
        self._inbox.append((r.t, r.total_w))
        return r

    def sample(self) -> None:
        """Take one reading for the tap alone (no monitor): a failed read is counted in :attr:`dropped`, never
        raised (the monitor's rule)."""
        try:
            r = self.sensor.read()
        except (OSError, ValueError, RuntimeError):
            self.dropped += 1
            return
        self._inbox.append((r.t, r.total_w))

    def _ingest(self) -> None:
        """Move the queued readings into the history (call with the lock held)."""
        inbox, t_, p_, e_ = self._inbox, self._t, self._p, self._e
        while inbox:
            t, p = inbox.popleft()
            if not (math.isfinite(p) and p >= 0) or (t_ and t <= t_[-1]):
                continue
            # one trapezoid, :func:`~edgetune.power.monitor.energy_j` written out for a scalar pair (a numpy call
            # per sample would cost more than all the rest of this loop)
            e_.append(e_[-1] + (t - t_[-1]) * (p + p_[-1]) / 2 if t_ else 0.0)
            t_.append(t)
            p_.append(p)
            self._new_t.append(t)
            self._new_p.append(p)
            self.total_samples += 1
        if len(t_) > 64 and t_[len(t_) // 2] < t_[-1] - self.keep_s:
            cut = bisect.bisect_left(t_, t_[-1] - self.keep_s) - 1
            del t_[:cut], p_[:cut], e_[:cut]

    def energy_j(self) -> float | None:
        return self.sensor.energy_j()

    @property
    def last_t(self) -> float | None:
        """Device time of the latest good reading (None before the first)."""
        with self._lock:
            self._ingest()
            return self._t[-1] if self._t else None

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        """The readings taken since the last drain: times and board power."""
        with self._lock:
            self._ingest()
            t, p = self._new_t, self._new_p
            self._new_t, self._new_p = [], []
        return np.asarray(t, dtype=float), np.asarray(p, dtype=float)

    def _energy_at(self, x: float) -> float:
        """Cumulative energy at time ``x`` for the piecewise-linear power through the samples (exact)."""
        t, p, e = self._t, self._p, self._e
        i = max(0, min(bisect.bisect_right(t, x) - 1, len(t) - 2))
        dt = x - t[i]
        span = t[i + 1] - t[i]
        slope = (p[i + 1] - p[i]) / span if span > 0 else 0.0
        return e[i] + p[i] * dt + 0.5 * slope * dt * dt

    def _average(self, window_s: float) -> float:
        t = self._t
        if not t:
            return math.nan
        end = t[-1]
        start = max(t[0], end - window_s)
        if end <= start or len(t) < 2:
            return self._p[-1]
        return (self._e[-1] - self._energy_at(start)) / (end - start)

    def average(self, window_s: float) -> float:
        """Mean board power over the last ``window_s`` (the window cut at the first kept sample)."""
        with self._lock:
            self._ingest()
            return self._average(window_s)

    def averages(self, *windows_s: float) -> tuple[float, ...]:
        """:meth:`average` over each of several windows, ending at the same sample (one lock, one batch)."""
        with self._lock:
            self._ingest()
            return tuple(self._average(w) for w in windows_s)


@dataclass(frozen=True)
class StepRecord:
    """One training step as the device saw it (device-clock seconds). ``energy_j`` integrates the samples'
    trapezoid over [start, end], apportioning each sample interval it overlaps by time; ``peak_w`` is the highest of
    the samples it is integrated from: those inside, the one at or before the start and the one at or after the
    end (a step shorter than the sensor's period has none inside)."""

    step: int
    epoch: int
    batch_size: int
    #: the samples it trained on: ``batch_size`` but for a framework's smaller last batch of an epoch or a
    #: gradient accumulation cut short (:meth:`edgetune.runtime.Tuner.count_samples`)
    samples: int
    start_s: float
    end_s: float
    time_s: float
    energy_j: float
    mean_w: float
    peak_w: float
    budget_w: float
    setting: str


@dataclass(frozen=True)
class EpochRecord:
    """One epoch: its figures over its steps' own time, one set of samples for all of them.

    ``time_s``, ``energy_j`` and ``mean_w`` sum its steps (an evaluation between them is left out); ``peak_w`` is
    the highest of the samples its steps' energy is integrated from (:class:`StepRecord`); ``max_avg_w`` the highest
    1-s moving average whose window lies inside its steps: never reaching back into the epoch before, nor across
    an evaluation inside it. Where no run of its steps lasts a whole window (an epoch shorter than 1 s) it has
    no 1-s average of its own: NaN (the run's 1-s averages, which the budget judges, straddle epochs:
    :attr:`RunSummary.max_avg_w`, the violations).
    """

    epoch: int
    steps: int
    samples: int
    time_s: float
    energy_j: float
    mean_w: float
    peak_w: float
    max_avg_w: float

    @property
    def energy_per_sample_j(self) -> float:
        return self.energy_j / self.samples if self.samples else math.nan


@dataclass(frozen=True)
class Violation:
    """An interval in which the 1-s moving average exceeded the budget."""

    start_s: float
    end_s: float
    worst_avg_w: float
    budget_w: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def excess_w(self) -> float:
        return self.worst_avg_w - self.budget_w


@dataclass
class RunSummary:
    """What a tuned run did: the figures of :meth:`table`, and the records behind them.

    Attributes:
        device: the device spec; ``simulated`` says whether it is the twin (every report says so).
        measure_only: True where no knob could be set (the guard only reported).
        steps, samples: training steps and samples seen.
        time_s, energy_j: device-clock time and board energy from the first step's start to the end.
        mean_w, peak_w, max_avg_w: mean power, highest sample, highest 1-s moving average over a whole second
            (NaN: the run was shorter).
        violations: budget violations; ``time_over_s`` their total time, ``worst_excess_w`` the largest.
        epochs: per-epoch records.
        events: (device time, text) of everything the controller did: plan applied, exploration, guard moves.
        guard_moves: how many moves of each kind the guard made (the batch-size halvings and doublings too).
        batch_size, setting: what was in force at the end.
        knobs_restored: whether every knob was back at its original value after exit.
        knobs_failed: knobs whose write failed during the run, with the error: left as they were from then on.
        target: steps, time and energy to the training target (``tune(target=...)``); None without one.
    """

    device: str
    simulated: bool
    measure_only: bool
    steps: int
    samples: int
    time_s: float
    energy_j: float
    mean_w: float
    peak_w: float
    max_avg_w: float
    budget_w: float
    violations: list[Violation]
    epochs: list[EpochRecord]
    events: list[tuple[float, str]] = field(default_factory=list)
    batch_size: int = 0
    setting: dict = field(default_factory=dict)
    knobs_restored: bool | None = None
    guard_moves: dict[GuardMove, int] = field(default_factory=dict)
    knobs_failed: dict[str, str] = field(default_factory=dict)
    target: TargetOutcome | None = None
    #: steps that trained after the power sensor's last reading (it failed for good), and their device time:
    #: not in ``steps`` nor any figure (no reading measured them)
    unmeasured_steps: int = 0
    unmeasured_s: float = 0.0

    @property
    def time_over_s(self) -> float:
        return float(sum(v.duration_s for v in self.violations))

    @property
    def worst_excess_w(self) -> float:
        return max((v.excess_w for v in self.violations), default=0.0)

    @property
    def energy_per_sample_j(self) -> float:
        return self.energy_j / self.samples if self.samples else math.nan

    def table(self) -> str:
        """The summary printed on exit: one row per epoch, then the totals and the budget record."""
        kind = "simulated twin" if self.simulated else "measured"
        header = (f"{'epoch':>5} {'steps':>6} {'samples':>8} {'time s':>9} {'energy J':>10} {'mean W':>7} "
                  f"{'peak W':>7} {'max 1s W':>8} {'J/sample':>9}")
        lines = [f"edgetune run on {self.device} ({kind}{', measure-only' if self.measure_only else ''})", header]
        for e in self.epochs:
            max_avg = f"{e.max_avg_w:>8.2f}" if math.isfinite(e.max_avg_w) else f"{'-':>8}"  # shorter than 1 s
            lines.append(f"{e.epoch:>5} {e.steps:>6} {e.samples:>8} {e.time_s:>9.2f} {e.energy_j:>10.1f} "
                         f"{e.mean_w:>7.2f} {e.peak_w:>7.2f} {max_avg} {e.energy_per_sample_j:>9.4f}")
        max_avg = f"{self.max_avg_w:>8.2f}" if math.isfinite(self.max_avg_w) else f"{'-':>8}"  # shorter than 1 s
        lines.append(f"{'all':>5} {self.steps:>6} {self.samples:>8} {self.time_s:>9.2f} {self.energy_j:>10.1f} "
                     f"{self.mean_w:>7.2f} {self.peak_w:>7.2f} {max_avg} "
                     f"{self.energy_per_sample_j:>9.4f}")
        lines.append(f"budget {self.budget_w:g} W (1-s moving average): {len(self.violations)} violation(s), "
                     f"{self.time_over_s:.2f} s over, worst +{self.worst_excess_w:.2f} W")
        if self.unmeasured_steps:
            lines.append(f"not measured: the last {self.unmeasured_steps} step(s) ({self.unmeasured_s:.2f} s) trained "
                         f"after the power sensor's last reading (it stopped answering): not in the figures above")
        texts = [text for _, text in self.events]
        if not self.measure_only:
            moves = self.guard_moves
            lowest = "lowest setting it could set" if self.knobs_failed else "lowest setting"
            batch = (f", batch size halved {moves.get(GuardMove.SHRINK_BATCH, 0)}x and doubled "
                     f"{moves.get(GuardMove.GROW_BATCH, 0)}x ({lowest} over the budget)"
                     if moves.get(GuardMove.SHRINK_BATCH) or moves.get(GuardMove.GROW_BATCH) else "")
            lines.append(f"guard: {moves.get(GuardMove.TRIP, 0)} trip(s), {moves.get(GuardMove.CLIMB, 0)} climb(s), "
                         f"{moves.get(GuardMove.UNDO_CLIMB, 0)} climb(s) undone (clock capped){batch}")
        lines.extend(f"write failed: {why}; {name} left alone from then on" for name, why in self.knobs_failed.items())
        lines.extend(t for t in texts if t.startswith(("online: settled", "online: limit")))
        if self.target is not None:
            lines.append(self.target.line())
        setting = ", ".join(f"{k}={v}" for k, v in self.setting.items())
        lines.append(f"final: batch size {self.batch_size}; {setting or 'no knobs set'}; knobs restored: "
                     f"{'yes' if self.knobs_restored else 'no' if self.knobs_restored is False else 'n/a'}")
        return "\n".join(lines)


class _StepLog:
    """Per-step rows to CSV or JSONL (by the file's suffix); epochs and the target's evaluations go to JSONL as
    ``kind: epoch`` and ``kind: evaluation`` rows."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".jsonl"):
            raise ValueError(f"log file {self.path}: use a .csv or .jsonl name")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # "x": a log written since the Tuner checked (a second run of it, another tuner) is never overwritten
            self._fh: io.TextIOBase = open(self.path, "x", newline="")  # noqa: SIM115 - closed in close()
        except FileExistsError:
            raise ValueError(f"log file {self.path} exists: edgetune never overwrites a log; move it away or name "
                             f"another") from None
        self._jsonl = suffix == ".jsonl"
        self._csv = None if self._jsonl else csv.DictWriter(self._fh, fieldnames=list(StepRecord.__dataclass_fields__))
        if self._csv is not None:
            self._csv.writeheader()

    def step(self, rec: StepRecord) -> None:
        if self._jsonl:
            self._fh.write(json.dumps({"kind": "step", **asdict(rec)}) + "\n")
        else:
            self._csv.writerow(asdict(rec))  # type: ignore[union-attr]

    def epoch(self, rec: EpochRecord) -> None:
        if self._jsonl:
            self._fh.write(json.dumps({"kind": "epoch", **asdict(rec)}) + "\n")
        self._fh.flush()

    def evaluation(self, after_steps: int, metric: str, value: float, t: float) -> None:
        if self._jsonl:
            self._fh.write(json.dumps({"kind": "evaluation", "after_steps": after_steps, "metric": metric,
                                       "value": value, "device_time_s": t}) + "\n")

    def close(self) -> None:
        self._fh.close()


class Accounting:
    """Incremental per-step / per-epoch energy and budget accounting over the samples of a :class:`SampleTap`.

    Args:
        tap: the tap between the power monitor and its sensor.
        budget_at: the budget in force at a device time.
        budgets_at: the same for an array of times at once (None: ``budget_at`` time by time).
        window_s: the moving-average window the budget is judged by.
        log: optional ``.csv`` or ``.jsonl`` path for per-step (and per-epoch) rows.
        keep_trace: keep every sample with its 1-s moving average and budget (benchmarks plot and score it).
    """

    def __init__(self, tap: SampleTap, budget_at: Callable[[float], float], *, window_s: float = 1.0,
                 log: str | Path | None = None, keep_trace: bool = False,
                 budgets_at: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.tap = tap
        self.budget_at = budget_at
        self.budgets_at = budgets_at
        self.window_s = window_s
        self._log = _StepLog(log) if log else None
        self.keep_trace = keep_trace
        self._lock = threading.Lock()
        # samples not yet released: times, power, cumulative energy from the run's first sample
        self._t = np.empty(0)
        self._p = np.empty(0)
        self._e = np.empty(0)
        self._t0: float | None = None
        self._pending: list[tuple[float, int, int, str, int]] = []  # (end time, batch size, samples, setting, epoch)
        self._last_end: float | None = None
        self.steps: list[StepRecord] = []
        self.epochs: list[EpochRecord] = []
        self.violations: list[Violation] = []
        self._open_violation: list | None = None  # [start, worst, budget]
        self._max_avg = -math.inf
        self._peak = -math.inf
        #: per epoch, the highest 1-s average whose window lies inside its steps (:meth:`_epoch_windows`)
        self._epoch_max_avg: dict[int, float] = {}
        #: (start, epoch) of the run of one epoch's steps with no gap between that the last closed step is in
        self._stretch: tuple[float, int] | None = None
        self._epoch_start_step = 0
        #: the last epoch :meth:`end_epoch` was asked to close, and the last one closed: an epoch whose last steps
        #: no sample covers yet (a sensor that failed for a while) closes once they are
        self._due_epoch = -1
        self._closed_epoch = -1
        #: steps that ended after the last sample, and their device time, when the run finished (a sensor that
        #: failed for good): they trained, but no reading measured them (:meth:`finish`)
        self.unmeasured_steps = 0
        self.unmeasured_s = 0.0
        self.trace_t: list[float] = []
        self.trace_p: list[float] = []
        self.trace_avg: list[float] = []
        self.trace_budget: list[float] = []

    # -- input ------------------------------------------------------------------------------------
    def start(self, t: float) -> None:
        """The run starts at device time ``t``: the first step is measured from here."""
        self._last_end = t

    def mark_step(self, end_s: float, batch_size: int, setting: str, epoch: int, samples: int | None = None) -> None:
        """A step at ``batch_size`` (``samples``: what it trained on, where fewer) ended at device time ``end_s``
        (O(1); the arithmetic runs in :meth:`update`)."""
        self._pending.append((end_s, batch_size, batch_size if samples is None else samples, setting, epoch))

    def mark_gap(self, end_s: float) -> None:
        """No step ran from the last step's end to device time ``end_s`` (an evaluation): the next step is
        measured from ``end_s``. Its samples still count against the budget."""
        self._pending.append((end_s, _GAP, 0, "", -1))

    # -- processing ---------------------------------------------------------------------------------
    def _energy_at(self, x: np.ndarray) -> np.ndarray:
        return np.interp(x, self._t, self._e)

    def update(self) -> None:
        """Take the new samples; close every step whose end they cover; track violations."""
        with self._lock:
            tn, pn = self.tap.drain()
            if tn.size == 0:
                self._close_steps()
                return
            if self._t.size:
                # continue the integral from the last kept sample
                tt = np.concatenate([[self._t[-1]], tn])
                pp = np.concatenate([[self._p[-1]], pn])
                en = self._e[-1] + cumulative_energy_j(tt, pp)[1:]
            else:
                self._t0 = float(tn[0])
                en = cumulative_energy_j(tn, pn)
            self._t = np.concatenate([self._t, tn])
            self._p = np.concatenate([self._p, pn])
            self._e = np.concatenate([self._e, en])
            self._peak = max(self._peak, float(pn.max()))
            self._track_budget(tn, pn)
            self._close_steps()
            self._trim()

    def _moving_average(self, x: np.ndarray) -> np.ndarray:
        assert self._t0 is not None
        lo = np.maximum(x - self.window_s, self._t0)
        span = x - lo
        avg = (self._energy_at(x) - self._energy_at(lo)) / np.where(span > 0, span, 1.0)
        return np.where(span > 0, avg, np.interp(x, self._t, self._p))

    def _track_budget(self, tn: np.ndarray, pn: np.ndarray) -> None:
        avg = self._moving_average(tn)
        budget = (self.budgets_at(tn) if self.budgets_at is not None
                  else np.array([self.budget_at(float(x)) for x in tn]))
        # the run's highest 1-s average over whole windows: in its first second the moving average spans less
        # (the budget is still judged on it), and a run shorter than that has none (the total row's "-", as an epoch's)
        whole = tn - self.window_s >= self._t0 - _WINDOW_SLACK_S
        if whole.any():
            self._max_avg = max(self._max_avg, float(avg[whole].max()))
        if self.keep_trace:
            self.trace_t.extend(tn.tolist())
            self.trace_p.extend(pn.tolist())
            self.trace_avg.extend(avg.tolist())
            self.trace_budget.extend(budget.tolist())
        over = avg > budget
        if self._open_violation is None and not over.any():
            return  # nothing over and nothing open: the common case, without a loop over the samples
        for x, a, b, o in zip(tn.tolist(), avg.tolist(), budget.tolist(), over.tolist()):
            v = self._open_violation
            if o and v is None:
                self._open_violation = [x, a, b]
            elif o:
                if a - b > v[1] - v[2]:
                    v[1], v[2] = a, b
            elif v is not None:
                self.violations.append(Violation(v[0], x, v[1], v[2]))
                self._open_violation = None

    def _close_steps(self) -> None:
        """Close every pending step whose end the samples cover: its energy, mean and peak power, in one
        vectorised pass over all of them (a step ends every few tens of milliseconds; one numpy call per step
        and figure cost more CPU than the rest of the controller's bookkeeping)."""
        if not self._t.size:
            return
        covered = self._t[-1]
        ready = 0
        for end, *_ in self._pending:
            if end > covered + 1e-12:
                break
            ready += 1
        if not ready:
            return
        t, p = self._t, self._p
        t0 = float(t[0])
        ends = np.fromiter((e for e, *_ in self._pending[:ready]), float, ready)
        first = self._last_end if self._last_end is not None else t0
        starts = np.maximum(np.concatenate([[first], ends[:-1]]), t0)
        energy = self._energy_at(ends) - self._energy_at(starts)
        dt = ends - starts
        # peak of the samples the step's energy is integrated from: those in [start, end], the one at or before
        # the start and the one at or after the end (the energy apportions the sample intervals it overlaps, so
        # a mean never exceeds it, however long the sensor was silent): a max per segment
        i = np.maximum(np.searchsorted(t, starts, side="right") - 1, 0)
        j = np.minimum(np.searchsorted(t, ends, side="left") + 1, t.size)
        bounds = np.empty(2 * ready, dtype=np.intp)
        bounds[0::2], bounds[1::2] = i, j  # j may be t.size: the sentinel below
        peaks = np.maximum.reduceat(np.append(p, -math.inf), bounds)[0::2]
        budgets = (self.budgets_at(ends) if self.budgets_at is not None
                   else np.array([self.budget_at(float(x)) for x in ends]))
        stretch_start = np.full(ready, math.nan)
        step_epoch = np.zeros(ready, dtype=np.int64)
        for k, (end, batch, samples, setting, epoch) in enumerate(self._pending[:ready]):
            if batch == _GAP:
                self._stretch = None  # a gap ends the run of steps a 1-s window may lie in
                continue
            if self._stretch is None or self._stretch[1] != epoch:
                self._stretch = (float(starts[k]), epoch)
            stretch_start[k], step_epoch[k] = self._stretch[0], epoch
            step_dt, step_e = float(dt[k]), float(energy[k])
            rec = StepRecord(len(self.steps), epoch, batch, samples, float(starts[k]), end, step_dt, step_e,
                             step_e / step_dt if step_dt > 0 else math.nan, float(peaks[k]), float(budgets[k]),
                             setting)
            self.steps.append(rec)
            if self._log is not None:
                self._log.step(rec)
        self._epoch_windows(starts, ends, stretch_start, step_epoch)
        self._last_end = float(ends[-1])
        del self._pending[:ready]
        if self._due_epoch > self._closed_epoch:
            self._close_epochs()

    def _epoch_windows(self, starts: np.ndarray, ends: np.ndarray, stretch_start: np.ndarray,
                       step_epoch: np.ndarray) -> None:
        """Each epoch's highest 1-s average over the steps just closed, the window lying inside the run of the
        epoch's steps each ends in (``stretch_start``: that run's start, NaN for a gap): at every sample inside a
        step where a whole window fits since the run started. These are the run's own moving averages at those
        samples (:meth:`_moving_average`), so no epoch's figure exceeds the run's."""
        t = self._t
        x = t[np.searchsorted(t, starts[0], side="right"):np.searchsorted(t, ends[-1], side="right")]
        k = np.searchsorted(ends, x, side="left")  # the step each sample is in
        fits = np.isfinite(stretch_start[k]) & (x - self.window_s >= stretch_start[k] - _WINDOW_SLACK_S)
        if not fits.any():
            return
        x, k = x[fits], k[fits]
        avg = (self._energy_at(x) - self._energy_at(x - self.window_s)) / self.window_s
        for epoch in np.unique(step_epoch[k]).tolist():
            best = float(avg[step_epoch[k] == epoch].max())
            self._epoch_max_avg[epoch] = max(self._epoch_max_avg.get(epoch, -math.inf), best)

    def _trim(self) -> None:
        # keep what the next moving average and the oldest open step need (its 1-s windows reach back one window)
        keep_from = (self._t[-1] - self.window_s - 0.5) if self._t.size else 0.0
        if self._last_end is not None:
            keep_from = min(keep_from, self._last_end - self.window_s)
        cut = int(np.searchsorted(self._t, keep_from)) - 1
        if cut > 256:
            self._t, self._p, self._e = self._t[cut:], self._p[cut:], self._e[cut:]

    # -- epochs and the end ----------------------------------------------------------------------------
    def end_epoch(self, epoch: int) -> EpochRecord | None:
        """Close epoch ``epoch`` (call after :meth:`update`): totals over its steps. An earlier epoch left
        open (a loop that broke out of its loader) is closed first. Returns None if it had no steps, or if
        steps of it still wait for a sample (the sensor failing for a while): it closes when they are closed
        (:meth:`update`), or at :meth:`finish`, with all its steps in one record."""
        self._due_epoch = max(self._due_epoch, epoch)
        return self._close_epochs()

    def _close_epochs(self, force: bool = False) -> EpochRecord | None:
        """Record each epoch up to the one due whose steps are all closed (``force``: at the end, whatever is
        closed of them); the record of the one due, if it closed."""
        epoch = self._due_epoch
        waiting = next((e for _, batch, _, _, e in self._pending if batch != _GAP), None)
        if not force and waiting is not None and waiting <= epoch:
            epoch = waiting - 1  # steps of ``waiting`` are not closed yet: the epochs before it close now
        pending = self.steps[self._epoch_start_step:]
        pending = pending[:sum(1 for s in pending if s.epoch <= epoch)]  # steps are in epoch order
        self._epoch_start_step += len(pending)
        rec = None
        for e in sorted({s.epoch for s in pending}):
            steps = [s for s in pending if s.epoch == e]
            time_s = sum(s.time_s for s in steps)
            energy = sum(s.energy_j for s in steps)
            rec = EpochRecord(e, len(steps), sum(s.samples for s in steps), time_s, energy,
                              energy / time_s if time_s > 0 else math.nan, max(s.peak_w for s in steps),
                              self._epoch_max_avg.get(e, math.nan))
            self.epochs.append(rec)
            if self._log is not None:
                self._log.epoch(rec)
        for e in [e for e in self._epoch_max_avg if e <= epoch]:
            del self._epoch_max_avg[e]
        if epoch < self._due_epoch:
            return None
        self._closed_epoch = epoch
        self._stretch = None  # the next epoch's windows start with its first step
        return rec if rec is not None and rec.epoch == epoch else None

    def note_evaluation(self, after_steps: int, metric: str, value: float, t: float) -> None:
        """An evaluation of the training target's metric after ``after_steps`` steps, at device time ``t``: a
        ``kind: evaluation`` row in a JSONL log (a CSV log holds steps only)."""
        if self._log is not None:
            self._log.evaluation(after_steps, metric, value, t)

    def finish(self) -> None:
        """Close the open violation, the epochs still waiting for samples, and the log. Steps no sample covers
        (the sensor failed for good) stay out of the figures: :attr:`unmeasured_steps` counts them."""
        with self._lock:
            v = self._open_violation
            if v is not None and self._t.size:
                self.violations.append(Violation(v[0], float(self._t[-1]), v[1], v[2]))
                self._open_violation = None
            steps = [end for end, batch, *_ in self._pending if batch != _GAP]
            if steps:
                self.unmeasured_steps = len(steps)
                self.unmeasured_s = steps[-1] - (self._last_end if self._last_end is not None else steps[0])
            if self._due_epoch > self._closed_epoch:
                self._close_epochs(force=True)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def max_avg_w(self) -> float:
        return self._max_avg if math.isfinite(self._max_avg) else math.nan

    @property
    def peak_w(self) -> float:
        return self._peak if math.isfinite(self._peak) else math.nan

    def totals(self) -> tuple[float, float, int]:
        """(time s, energy J, samples) over the closed steps."""
        return (sum(s.time_s for s in self.steps), sum(s.energy_j for s in self.steps),
                sum(s.samples for s in self.steps))
