"""Steps to a training target, measured in the user's own loop: ``tune(target=..., runs_file=...)``.

The search ranks batch sizes by the time (or energy) to reach a target, steps to target x step time. The
steps come from the noise-scale law unless the user gives the runs they trained
(``edgetune search --steps-to-target runs.csv``, :mod:`edgetune.search.runs_target`). This module records
those runs where they happen, in the training loop itself::

    with edgetune.tune(model, optimizer, dataset=train_set, plan="out/best.json",
                       target=edgetune.Target("accuracy", 0.9), runs_file="runs.csv") as tuner:
        for epoch in range(20):
            for x, y in tuner.loader:
                ...
            if tuner.report(evaluate(model)):   # True once the target is reached
                break

* :class:`Target` - the metric's name, the value to reach and its direction.
* :class:`TargetTracker` - the evaluations reported, against the optimizer steps taken when each was made;
  the steps to the target are the first crossing, interpolated between the evaluations either side
  (:func:`edgetune.predictors.convergence.crossing_step`, as ``experiments/convergence_truth.py`` measures
  the built-in workloads), so they do not depend on how often the loop evaluates.
* :func:`outcome` - at the end of the run: the steps, the device time and energy of the training steps up to
  the crossing (the search's own objectives, evaluation time left out), and whether the run can stand as one
  run at one batch size.
* :func:`record_run` - the row it adds to ``runs_file`` (:func:`~edgetune.predictors.convergence.append_convergence_row`).

Which runs are recorded: a run that reached the target, with its steps; a run that ended (normally) without
reaching it, as a run that missed it (empty steps: the search counts it as infinitely many, and never picks a
batch size most of whose runs missed); nothing for a run that ended on an exception or Ctrl-C (cut short: it
says nothing about the target), for a run whose batch size changed before the target (its steps belong to no
one batch size: the guard halves it only when the lowest clocks still draw over the budget), for a run that
reached the target before its first step, or one in which nothing was reported.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from edgetune.log import get_logger
from edgetune.predictors.convergence import (
    ConvergenceError,
    ConvergenceRow,
    append_convergence_row,
    check_appendable,
    crossing_step,
    read_convergence_rows,
)

__all__ = ["StepLike", "Target", "TargetOutcome", "TargetTracker", "finish", "outcome", "record_run", "runs_workload"]

if TYPE_CHECKING:
    from collections.abc import Callable

_log = get_logger(__name__)


class StepLike(Protocol):
    """What :func:`outcome` reads of a training step (:class:`~edgetune.runtime.accounting.StepRecord`)."""

    batch_size: int
    samples: int
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class Target:
    """The validation target a run trains to.

    Attributes:
        metric: the metric's name as the runs table records it (``accuracy``, ``val_loss`` ...).
        value: the value to reach.
        higher_is_better: True for an accuracy (reached at ``value`` or above), False for a loss (at or below).
    """

    metric: str
    value: float
    higher_is_better: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric.strip() or any(c in self.metric for c in "\r\n"):
            raise ValueError(f"Target.metric must be a name on one line (accuracy, val_loss ...), got {self.metric!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ValueError(f"Target.value must be a finite number, got {self.value!r}")
        if not isinstance(self.higher_is_better, bool):
            raise TypeError(f"Target.higher_is_better must be True (accuracy) or False (a loss), got "
                             f"{self.higher_is_better!r}")

    def describe(self) -> str:
        """``accuracy >= 0.9`` / ``val_loss <= 1.2``."""
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.value:g}"


class TargetTracker:
    """The evaluations of one run against the optimizer steps taken when each was made.

    Attributes:
        target: the :class:`Target`.
        steps, values: the evaluations, in step order (a second report at the same step replaces the first).
    """

    def __init__(self, target: Target) -> None:
        self.target = target
        self.steps: list[int] = []
        self.values: list[float] = []

    def report(self, step: int, value: float) -> bool:
        """Record ``value`` evaluated after ``step`` optimizer steps; True once the target is reached.

        ``nan`` (a diverged loss) counts as short of the target.

        Raises:
            TypeError: a value that is not a number.
            ValueError: a step before the last one reported.
        """
        if isinstance(value, bool):
            raise TypeError(f"tuner.report() takes the metric's value, got {value!r}")
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"tuner.report() takes the metric's value as a number, got {value!r}") from None
        if self.steps and step < self.steps[-1]:
            raise ValueError(f"evaluation at step {step} reported after one at step {self.steps[-1]}")
        if self.steps and step == self.steps[-1]:
            self.values[-1] = value
        else:
            self.steps.append(step)
            self.values.append(value)
        return self.reached

    @property
    def crossing(self) -> float:
        """Optimizer steps to the target (interpolated between evaluations); ``nan`` while not reached."""
        t = self.target
        return crossing_step(self.steps, self.values, t.value, higher_is_better=t.higher_is_better)

    @property
    def reached(self) -> bool:
        return not math.isnan(self.crossing)


@dataclass(frozen=True)
class TargetOutcome:
    """What a run did against its target (``tuner.summary.target``).

    Attributes:
        target: the :class:`Target`.
        steps: optimizer steps to the target, interpolated between evaluations (``nan``: not reached).
        evaluations: the evaluations reported.
        steps_run: the optimizer steps the run took in all.
        batch_size: the one batch size of every step up to the target (of the whole run, if missed); 0 when
            it changed.
        time_s, energy_j: device time and energy of the training steps up to the target (``nan``: not
            reached; on the twin, simulated figures).
        recordable: whether the run stands as one run at one batch size (the module's list); ``why`` says
            why not.
        recorded_in: the runs file the row went to ("" when none was written).
    """

    target: Target
    steps: float
    evaluations: int
    steps_run: int
    batch_size: int
    time_s: float
    energy_j: float
    recordable: bool
    why: str = ""
    recorded_in: str = ""

    @property
    def reached(self) -> bool:
        return not math.isnan(self.steps)

    def line(self) -> str:
        """The summary's line about the target."""
        t = self.target.describe()
        if self.evaluations == 0:
            head = f"target {t}: never reported (call tuner.report(value) after each evaluation)"
        elif self.reached:
            at = f" at batch size {self.batch_size}" if self.batch_size else ""
            head = (f"target {t}: reached after {self.steps:.1f} steps{at} ({self.evaluations} evaluation(s)): "
                    f"{self.time_s:.2f} s, {self.energy_j:.1f} J of training steps")
        else:
            head = f"target {t}: not reached in {self.steps_run} steps ({self.evaluations} evaluation(s))"
        if self.recorded_in:
            kind = "" if self.reached else " as a run that missed the target"
            return f"{head}; recorded in {self.recorded_in}{kind}"
        return f"{head}; {self.why}" if self.why else head


def _to_step(records: Sequence[StepLike], steps: float) -> tuple[float, float]:
    """Device time and energy of the training steps up to ``steps`` (a fraction of the step it ends in)."""
    whole = min(math.floor(steps), len(records))
    time_s = sum(r.time_s for r in records[:whole])
    energy_j = sum(r.energy_j for r in records[:whole])
    if whole < len(records):
        part = steps - whole
        time_s += part * records[whole].time_s
        energy_j += part * records[whole].energy_j
    return time_s, energy_j


def outcome(tracker: TargetTracker, records: Sequence[StepLike], *, ended_normally: bool,
            recording: bool = True) -> TargetOutcome:
    """The run's :class:`TargetOutcome` from its evaluations and the accounting's step records.

    Args:
        tracker: the run's evaluations.
        records: the accounting's closed steps (``StepRecord``), in order.
        ended_normally: False when the run ended on an exception or Ctrl-C.
        recording: whether a runs file was given (only then does ``why`` explain a run not recorded).
    """
    crossing = tracker.crossing
    reached = not math.isnan(crossing)
    upto = records[:math.ceil(crossing)] if reached else records
    sizes = list(dict.fromkeys(r.batch_size for r in upto))
    time_s, energy_j = _to_step(records, crossing) if reached else (math.nan, math.nan)
    if not tracker.steps:
        why = "no run recorded"
    elif reached and crossing <= 0:
        why = "reached before the first step: no run recorded (a target that easy tells no batch size apart)"
    elif not reached and not ended_normally:
        why = "the run was cut short (an exception or Ctrl-C) before the target: no run recorded"
    elif not upto:
        why = "no training step was taken: no run recorded"
    elif len(sizes) > 1:
        why = (f"the batch size changed before the target ({' -> '.join(map(str, sizes))}): its steps belong to "
               f"no one batch size, no run recorded")
    else:
        why = ""
    # the batch an optimizer step trains on: the batch size in force, or with gradient accumulation the samples
    # of its full steps (an epoch's last step may hold fewer)
    batch = max(sizes[0], max(r.samples for r in upto)) if len(sizes) == 1 else 0
    return TargetOutcome(target=tracker.target, steps=crossing, evaluations=len(tracker.steps),
                         steps_run=len(records), batch_size=batch, time_s=time_s,
                         energy_j=energy_j, recordable=not why, why=why if recording else "")


def record_run(result: TargetOutcome, path: str | os.PathLike, *, workload: str, seed: int, lr: float,
               wall_s: float, device: str) -> TargetOutcome:
    """Append ``result`` to the runs table at ``path`` (checked before the run by
    :func:`~edgetune.predictors.convergence.check_appendable`) and return it with ``recorded_in`` set.

    The row's ``wall_s`` is the run's wall-clock time on the host; a new file's first lines say what wrote it.
    """
    row = ConvergenceRow(workload=workload, metric=result.target.metric, target=float(result.target.value),
                         batch_size=result.batch_size, seed=seed, lr=lr, steps=result.steps,
                         evaluations=result.evaluations, wall_s=wall_s)
    if os.path.exists(path) and any((r.workload, r.metric, r.target, r.batch_size, r.seed) ==
                                    (row.workload, row.metric, row.target, row.batch_size, row.seed)
                                    for r in read_convergence_rows(path)):
        _log.warning("%s already has a run of %s at batch size %d with loader seed %d; this one is added too, but "
                     "the search takes repeats as independent runs: pass another seed= to tune() for the next",
                     os.fspath(path), workload, row.batch_size, seed)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    append_convergence_row(path, row, comment=[
        (f"steps to a validation target per workload, batch size and seed (nan: not reached); first row written "
         f"by edgetune.tune on {device}, {now}"),
        "read by: edgetune search --steps-to-target THIS_FILE (the rows of the searched workload)"])
    return replace(result, recorded_in=os.fspath(path))


def runs_workload(runs_file: str | os.PathLike | None, workload: str | None, *, online: bool,
                  plan_workload: str | None) -> str | None:
    """The workload name a run recorded to ``runs_file`` carries (``workload``, else the plan's; None: no runs
    file); refuses, before any training, a runs file that cannot take the row, a run without a workload name,
    and online tuning (it changes the batch size).

    Raises:
        ValueError: one line, with the fix (``ConvergenceError`` for the file).
    """
    if runs_file is None:
        return None
    if online:
        raise ValueError("runs_file= records steps to the target at one batch size, and online tuning changes "
                         "it: pass a plan, or online=False")
    workload = workload or plan_workload
    if not workload:
        raise ValueError("runs_file= needs workload= (the name edgetune search gives the workload: its "
                         "--steps-to-target keeps that workload's rows), or a plan that names it")
    check_appendable(runs_file)
    return workload


def finish(tracker: TargetTracker, records: Sequence[StepLike], runs_file: str | os.PathLike | None,
           workload: str | None, *, ended_normally: bool, seed: int, lr: float, wall_s: float, device: str,
           on_unwritten: Callable[[str], None]) -> TargetOutcome:
    """The run against its target at its end (:func:`outcome`), its row appended to ``runs_file`` where it
    stands as one run (:func:`record_run`; ``workload`` from :func:`runs_workload`). A file that cannot be
    written then is said through ``on_unwritten`` and in the outcome's ``why``: the run is done, its figures
    stay."""
    result = outcome(tracker, records, ended_normally=ended_normally, recording=runs_file is not None)
    if runs_file is None or not result.recordable:
        return result
    assert workload is not None, "runs_workload checked it before the run"
    try:
        return record_run(result, runs_file, workload=workload, seed=seed, lr=lr, wall_s=wall_s, device=device)
    except (OSError, ConvergenceError) as exc:
        why = f"could not write {runs_file}: {getattr(exc, 'strerror', None) or exc}; the row was not recorded"
        on_unwritten(why)
        return replace(result, why=why)
