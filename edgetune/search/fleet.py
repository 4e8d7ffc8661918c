"""One setting, one measurement, however many workers share the study.

Workers of a fleet (and one worker resuming its own study) ask Optuna for settings independently, so two may
be handed the same one, and the guided sampler may propose a setting measured before. Before a trial measures,
:func:`find_same` looks for a trial of the same setting (:func:`same_setting`) that was measured, given up,
or is being measured by another worker: the search then tells the new trial that one's result instead of
measuring again. :func:`queued_or_running` keeps the search from queueing a setting (a baseline probe, a
confirmation) that waits in the queue or is being measured already.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from edgetune.search import records
from edgetune.search.space import Candidate, SearchSpace

__all__ = ["PENDING_WAIT_S", "find_same", "queued_or_running", "same_setting"]

#: longest wait, in seconds, for another worker's trial to get its parameters (a dead worker's never do)
PENDING_WAIT_S = 2.0
_PENDING_POLL_S = 0.02  # seconds between looks at that trial: a few storage reads per wait


def same_setting(space: SearchSpace, params: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether other params name the same setting of ``space`` as ``params``: equal params, or (a rows space,
    where levels that name no row map to the nearest row) the same row."""
    if space.rows is None:
        return lambda other: other == params
    cand = space.candidate(params)
    names = set(space.param_names())
    return lambda other: other == params or (set(other) >= names and space.candidate(other) == cand)


def find_same(study: optuna.Study, trial: optuna.Trial, space: SearchSpace,
              wait_s: float | None = None) -> FrozenTrial | None:
    """A trial with ``trial``'s setting that was measured, given up, or is being measured by another worker.

    Ties between workers go to the lower trial number. A lower-numbered RUNNING trial whose parameters are not
    all written yet (another worker is between creating it and suggesting its values) is waited for, up to
    ``wait_s`` seconds (None: :data:`PENDING_WAIT_S`): deciding before its values land would let both workers
    measure the same setting.
    """
    params = trial.params
    same = same_setting(space, params)
    deadline = time.monotonic() + (PENDING_WAIT_S if wait_s is None else wait_s)
    while True:
        trials = study.get_trials(deepcopy=False)
        dead_ends = records.given_up(trials)
        best: FrozenTrial | None = None
        pending = False
        for t in trials:
            if t.number == trial.number:
                continue
            if t.state == TrialState.RUNNING and t.number < trial.number and len(t.params) < len(params):
                pending = True
                continue
            if not same(t.params):
                continue
            if records.is_measured(t) or t.number in dead_ends:
                return t
            if t.state == TrialState.RUNNING and t.number < trial.number and best is None:
                best = t
        if best is not None or not pending or time.monotonic() > deadline:
            return best
        time.sleep(_PENDING_POLL_S)


def queued_or_running(study: optuna.Study, space: SearchSpace, cand: Candidate) -> bool:
    """A trial of ``cand`` waits in the queue or is being measured."""
    params = space.params(cand)
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        if t.params == params:
            return True
        obs = records.read_observation(t) if not t.params else None
        if obs is not None and obs.candidate == cand:
            return True
    return False
