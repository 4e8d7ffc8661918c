"""Progress that works everywhere: a tqdm bar on a terminal, one plain line per trial (or per stretch of
steps) otherwise - logs, CI, ``nohup``, ``ssh`` without a tty - where a bar would print nothing at all.

Lines go to standard error (standard output holds the results), flushed at once, each starting with
``edgetune:`` like every other line the CLI writes there.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from edgetune.search.efficiency import ZeusCost
    from edgetune.search.records import TrialRecord

__all__ = ["RunProgress", "SearchProgress", "is_terminal", "trial_line"]

#: ``edgetune run`` without a terminal: one line each time this share of the steps is done (10 lines a run)
RUN_LINE_FRACTION = 0.1


def is_terminal(stream: IO[str]) -> bool:
    """True where a progress bar can redraw itself (a tty); False for files, pipes, closed streams."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _objective_text(rec: TrialRecord, objective: str) -> str:
    o = rec.outcome
    assert o is not None
    if objective == "throughput":
        return f"{o.samples_per_s:.1f} samples/s"
    if objective == "energy":
        return f"{o.energy_to_target_j:.4g} J to target"
    if objective == "cost":
        return f"{o.time_to_target_s:.4g} s, {o.energy_to_target_j:.4g} J to target"
    return f"{o.time_to_target_s:.4g} s to target"


def _power_span(m: dict) -> str:
    """What a measurement's ``max_avg_power_w`` is: ``max 1-s avg`` (the budget window, or the longer sweep it
    was judged over), or the average of a window shorter than the budget window (``judged_span_s``)."""
    window_s = m.get("avg_window_s") or 1.0
    span_s = m.get("judged_span_s") or window_s
    if span_s >= window_s:
        return f"max {span_s:.3g}-s avg"
    why = "stopped early" if m.get("aborted_over_budget") else f"shorter than the {window_s:g}-s window"
    return f"avg of {span_s:.3g} s ({why})"


def trial_line(rec: TrialRecord, n: int, n_trials: int, units: dict[str, str], objective: str,
               best: TrialRecord | None) -> str:
    """``trial 3/40 #2: batch 32, gpu_freq 510 MHz: step 41.2 ms, 8.71 W max 1-s avg, within budget;
    best so far #2 (120 s to target)``: what one trial measured, for a log."""
    m = rec.measurement or {}
    again = " (measured again before the pick)" if str(rec.role) == "confirm" else ""
    head = f"trial {n}/{n_trials} #{rec.number}: {rec.candidate.describe(units)}{again}: "
    if rec.outcome is None:
        body = "out of memory" if rec.oom else f"failed ({(rec.error or m.get('error') or 'no error text')})"
    else:
        power = m.get("max_avg_power_w")
        step = m.get("step_time_s")
        body = (f"step {step * 1e3:.4g} ms, " if isinstance(step, (int, float)) else "") + (
            f"{power:.2f} W {_power_span(m)}, " if isinstance(power, (int, float)) and math.isfinite(power)
            else "") + ("within budget" if rec.feasible else "over budget")
    tail = (f"; best so far #{best.number} ({_objective_text(best, objective)})" if best is not None
            else "; none within budget yet")
    return head + body + tail


class SearchProgress:
    """``on_trial`` of a search: updates the bar on a terminal, prints :func:`trial_line` elsewhere.

    Args:
        n_trials: the study's trial budget (the bar's total, the ``N`` of ``trial n/N``).
        units: knob units for the settings' text.
        objective: what "best so far" ranks by.
        quiet: neither bar nor lines.
        stream: where both go (standard error).
        measured_before: trials a resumed study holds already (the bar starts there).
        stored: a resumed study's records ("best so far" starts from its best).
        cost: the weights of the ``cost`` objective (the study's ``Search.cost``).
    """

    def __init__(self, n_trials: int, units: dict[str, str], objective: str, *, quiet: bool = False,
                 stream: IO[str] | None = None, measured_before: int = 0,
                 stored: Sequence[TrialRecord] = (), cost: ZeusCost | None = None) -> None:
        from tqdm import tqdm

        from edgetune.search.efficiency import scalar_score

        self._score = functools.partial(scalar_score, cost=cost)
        self.n_trials = n_trials
        self.units = units
        self.objective = objective
        self.stream = stream or sys.stderr
        self.terminal = is_terminal(self.stream)
        self.lines = not quiet and not self.terminal
        self.best: TrialRecord | None = None
        for rec in stored:
            self._consider(rec)
        self.bar = tqdm(total=n_trials, initial=min(measured_before, n_trials), desc="trials", unit="trial",
                        file=self.stream, leave=False, disable=quiet or not self.terminal)

    def __enter__(self) -> SearchProgress:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def _consider(self, rec: TrialRecord) -> None:
        if rec.feasible and rec.outcome is not None and (
                self.best is None or self._score(rec.outcome, self.objective) <
                self._score(self.best.outcome, self.objective)):
            self.best = rec

    def __call__(self, rec: TrialRecord, n: int) -> None:
        self._consider(rec)
        if self.lines:
            line = trial_line(rec, n, self.n_trials, self.units, self.objective, self.best)
            print(f"edgetune: {line}", file=self.stream, flush=True)
            return
        o = rec.outcome
        note = (f"#{rec.number} b={rec.candidate.batch_size} "
                + (f"{o.time_to_target_s:.0f}s {'ok' if rec.feasible else 'over'}" if o else "failed"))
        self.bar.set_postfix_str(note, refresh=False)
        self.bar.update(min(n, self.n_trials) - self.bar.n)  # n: measured so far, this worker's and the fleet's


class RunProgress:
    """``on_step`` of ``edgetune run``: a bar on a terminal, a line per tenth of the steps otherwise."""

    def __init__(self, steps: int, what: str, *, stream: IO[str] | None = None) -> None:
        from tqdm import tqdm

        self.steps = steps
        self.what = what
        self.stream = stream or sys.stderr
        self.terminal = is_terminal(self.stream)
        self.every = max(1, math.ceil(steps * RUN_LINE_FRACTION))
        self._next_line = self.every
        self._past_said = False
        self.bar = tqdm(total=steps, desc=what, unit="step", file=self.stream, leave=False,
                        disable=not self.terminal)

    def __enter__(self) -> RunProgress:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def __call__(self, done: int) -> None:
        if self.terminal:
            self.bar.total = max(self.bar.total, done)  # the window runs on past the steps asked (a sweep)
            self.bar.update(done - self.bar.n)
            return
        if done >= self._next_line or done == self.steps:
            print(f"edgetune: {self.what}: {self._counted(done)}", file=self.stream, flush=True)
            while self._next_line <= done:
                self._next_line += self.every

    def _counted(self, done: int) -> str:
        """``step 8/80``; past the steps asked, why the window runs on (the first time) or how far past."""
        if done <= self.steps:
            return f"step {done}/{self.steps}"
        if not self._past_said:
            self._past_said = True
            return (f"step {done} ({self.steps} asked; measuring on until the power readings have swept the "
                    f"step's phases)")
        return f"step {done} (past the {self.steps} asked)"
