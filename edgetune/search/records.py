"""What the study stores about each trial: the one module that writes and reads trial and study attributes.

A search keeps everything it measured in the Optuna storage, so results can be rebuilt from the storage
alone (after a resume, by every worker of a fleet, by ``optuna-dashboard``). This module is the only one that
spells the attribute keys; the rest of the search talks in types:

* writers: :func:`enqueue` (a setting queued with its role), :func:`write_start` (the trial's setting, role and
  worker, as soon as it is asked), :func:`write_measurement` (the measurement, outcome, feasibility and the
  budget constraint), :func:`write_duplicate` (a setting already measured: the recorded result),
  :func:`write_out_of_memory` (a batch size known to run out of memory, :mod:`edgetune.search.memory`: not
  measured, told FAIL like a duplicate of the trial that ran out);
* readers: :func:`read_records` (:class:`TrialRecord` per trial, for results and the search's own rules),
  :func:`read_observation` (:class:`Observation`: what a sampler learns from a trial; the default
  ``observations_func`` of :class:`~edgetune.search.samplers.GuidedSampler`), :func:`is_measured`,
  :func:`role_of`, :func:`worker_of`, :func:`retry_history`;
* the study's identity (space, objective, budget, workload, device, measurement protocol): :func:`write_identity`,
  :func:`update_identity` (a field an older study lacks), :func:`read_identity`, :func:`read_target`; the steps to target it was scored with before a resume with others:
  :func:`write_rescored`, :func:`read_rescored`.

A trial whose worker died (``kill -9``, power loss, Ctrl-C mid-measurement) is failed and retried through
Optuna's :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback`; its retry history is the callback's
(:func:`retry_history`), and a setting whose last attempt died without a retry is *given up*
(:attr:`TrialRecord.given_up`): no worker measures it again.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from edgetune.power.knobs import Candidate
from edgetune.search.efficiency import Outcome, TargetModel
from edgetune.search.measurement import Measurement
from edgetune.search.space import SearchSpace
from edgetune.search.thermal import ThermalReference
from edgetune.search.window import judged_power_w

__all__ = [
    "CONSTRAINT",
    "Observation",
    "Role",
    "TrialRecord",
    "enqueue",
    "is_measured",
    "kernel_of",
    "measured_count",
    "read_budget_rule",
    "read_identity",
    "read_observation",
    "read_records",
    "retry_history",
    "role_of",
    "update_identity",
    "worker_of",
    "write_duplicate",
    "write_identity",
    "write_interrupted",
    "write_measurement",
    "write_out_of_memory",
    "write_start",
]

#: the budget's constraint name (``trial.set_constraint``): judged power minus the budget, W; <= 0 held
CONSTRAINT = "power_w"

# trial user attributes
_BATCH_SIZE = "batch_size"
_SETTING = "setting"  # knob -> value
_ROLE = "role"
_WORKER = "worker"  # host:pid
_KERNEL = "worker_kernel"  # where that pid means a process: boot id / pid namespace (storage.worker_kernel)
_MEASURED = "measured"  # True: this trial ran the measurement; False: told another trial's result
_MEASUREMENT = "measurement"  # Measurement.to_dict()
_OUTCOME = "outcome"  # Outcome fields
_FEASIBLE = "feasible"
_SOAKS = "thermal_soaks"
_DUPLICATE_OF = "duplicate_of"  # number of the trial whose result this one was told
_NOT_MEASURED = "not_measured"  # why a trial told another's result was not measured (a known out of memory)
_INTERRUPTED = "interrupted"  # True: Ctrl-C stopped the trial mid-measurement (no death: queued again afresh)
_TRACE_T = "trace_t"  # the window's power record, s from the window start
_TRACE_W = "trace_w"  # W
# study user attributes
_IDENTITY = "identity"
_TOLERANCE = "tolerance"
_WINDOW_S = "window_s"
_GUARD_SIGMA = "guard_sigma"
#: the study attributes of its budget rule (:func:`read_budget_rule`)
BUDGET_RULE_KEYS = (_TOLERANCE, _WINDOW_S, _GUARD_SIGMA)
_TARGET = "target"
_RESCORED = "rescored"  # the steps to target a study was scored with before (runs' medians, or {"law": ...})

_TRACE_T_DECIMALS = 4  # 0.1 ms: finer than any power sensor's update period
_TRACE_W_DECIMALS = 3  # 1 mW: below every sensor's resolution
_FINISHED = (TrialState.COMPLETE, TrialState.FAIL)
_PENDING = (TrialState.WAITING, TrialState.RUNNING)


class Role(str, enum.Enum):
    """Why a setting was measured (a str enum that works on Python 3.10, JetPack 6's Python)."""

    BASELINE = "baseline"  # a probe of the baseline of common practice
    SEARCH = "search"  # proposed by the sampler (or queued by the search itself)
    CONFIRM = "confirm"  # a measured setting measured again before the pick (edgetune.search.confirm)

    def __str__(self) -> str:
        return self.value


@dataclass
class TrialRecord:
    """One trial as the results see it (rebuilt from the trial's user attributes)."""

    number: int
    state: str
    candidate: Candidate
    role: Role
    measured: bool  # False for a trial told a recorded result (duplicate)
    measurement: dict[str, Any] | None
    outcome: Outcome | None
    feasible: bool  # ran and held the budget
    error: str | None = None
    worker: str = ""
    trace_t: list[float] = field(default_factory=list, repr=False)
    trace_w: list[float] = field(default_factory=list, repr=False)
    given_up: bool = False  # its worker died on it and no retry is left: never measured again
    #: not measured: the trial that ran out of memory at a batch size no larger (:mod:`edgetune.search.memory`;
    #: ``error`` says so); None for every other trial
    oom_of: int | None = None

    @property
    def ok(self) -> bool:
        return bool(self.measurement and self.measurement.get("ok"))

    @property
    def oom(self) -> bool:
        """The batch did not fit in device memory: it ran out here, or is known to (:attr:`oom_of`)."""
        return bool(self.measurement and self.measurement.get("oom")) or self.oom_of is not None

    @property
    def aborted_over_budget(self) -> bool:
        """The trial was stopped early, its live moving average over the budget (safe profiling)."""
        return bool(self.measurement and self.measurement.get("aborted_over_budget"))

    @property
    def over_budget_s(self) -> float:
        """Device seconds the board's moving average spent above the budget during this trial (0: none,
        or not measured here)."""
        if not self.measured or not self.measurement:
            return 0.0
        return float(self.measurement.get("over_budget_s") or 0.0)


@dataclass(frozen=True)
class Observation:
    """What a sampler learns from one trial: its setting and, once measured, what the device did.

    Attributes:
        candidate: the batch size and knob setting.
        measured: False while the trial is queued or being measured (only ``candidate`` is known).
        ok: the steps ran (False: out of memory or another failure).
        oom: the batch did not fit in device memory.
        step_time_s: mean time per step.
        max_avg_power_w: maximum of the budget's moving average of power.
        power_se_w: standard error of one moving average (see :class:`~edgetune.search.trial.Measurement`).
        peak_power_w: peak sampled power.
        feasible: the measurement held the budget as the search judged it.
        temperature_c: the board temperature at the window's end, degC (None: not read): a sampler refers
            the power to the study's thermal reference with it (:class:`~edgetune.search.thermal.ThermalReference`).
    """

    candidate: Candidate
    measured: bool = False
    ok: bool = False
    oom: bool = False
    step_time_s: float = math.nan
    max_avg_power_w: float = math.nan
    power_se_w: float = 0.0
    peak_power_w: float = math.nan
    feasible: bool = False
    temperature_c: float | None = None

    def judged_power_w(self, guard_sigma: float = 0.0) -> float:
        """The power the budget is judged by (:func:`~edgetune.search.window.judged_power_w`)."""
        return judged_power_w(self.max_avg_power_w, self.power_se_w, guard_sigma)

    @classmethod
    def of(cls, candidate: Candidate, measurement: Measurement, feasible: bool) -> Observation:
        """The observation of a finished measurement."""
        return cls._from_dict(candidate, measurement.to_dict(), feasible)

    @classmethod
    def _from_dict(cls, candidate: Candidate, m: Mapping[str, Any], feasible: bool) -> Observation:
        return cls(candidate, measured=True, ok=bool(m.get("ok")), oom=bool(m.get("oom")),
                   step_time_s=float(m.get("step_time_s", math.nan)),
                   max_avg_power_w=float(m.get("max_avg_power_w", math.nan)),
                   power_se_w=float(m.get("power_se_w", 0.0)), peak_power_w=float(m.get("peak_power_w", math.nan)),
                   feasible=feasible,
                   temperature_c=None if m.get("temperature_c") is None else float(m["temperature_c"]))


# ---------------------------------------------------------------------------------------------- writers


def _candidate_attrs(candidate: Candidate) -> dict[str, Any]:
    return {_BATCH_SIZE: candidate.batch_size, _SETTING: candidate.knobs}


def enqueue(study: optuna.Study, space: SearchSpace, candidate: Candidate, role: Role = Role.SEARCH, *,
            skip_if_exists: bool = False) -> None:
    """Queue ``candidate`` for the next ask, with its role (its setting readable while it waits)."""
    study.enqueue_trial(space.params(candidate), user_attrs={_ROLE: str(role), **_candidate_attrs(candidate)},
                        skip_if_exists=skip_if_exists)


def write_start(trial: optuna.Trial, candidate: Candidate, role: str, worker: str, kernel: str = "") -> None:
    """What a trial is about, written as soon as it is asked (a dead worker's trial still says it); ``kernel``:
    where the worker's pid means a process (:func:`~edgetune.search.storage.worker_kernel`; "" unknown)."""
    for key, value in (*_candidate_attrs(candidate).items(), (_WORKER, worker), (_ROLE, str(role))):
        trial.set_user_attr(key, value)
    if kernel:
        trial.set_user_attr(_KERNEL, kernel)


def write_measurement(trial: optuna.Trial, m: Measurement, outcome: Outcome | None, feasible: bool,
                      constraint_w: float | None) -> None:
    """A measurement and what it means; ``constraint_w`` (judged power minus the budget) when constrained."""
    trial.set_user_attr(_MEASUREMENT, m.to_dict())
    trial.set_user_attr(_TRACE_T, [round(x, _TRACE_T_DECIMALS) for x in m.trace_t])
    trial.set_user_attr(_TRACE_W, [round(x, _TRACE_W_DECIMALS) for x in m.trace_w])
    trial.set_user_attr(_MEASURED, True)
    if outcome is not None:
        trial.set_user_attr(_OUTCOME, outcome.__dict__)
    trial.set_user_attr(_FEASIBLE, feasible)
    if constraint_w is not None:
        trial.set_constraint(CONSTRAINT, constraint_w)


def write_duplicate(trial: optuna.Trial, source: FrozenTrial) -> None:
    """Mark ``trial`` as told ``source``'s recorded result (same setting, not measured again)."""
    trial.set_user_attr(_DUPLICATE_OF, source.number)
    trial.set_user_attr(_MEASURED, False)
    if source.state == TrialState.COMPLETE:
        for key in (_OUTCOME, _FEASIBLE):
            if key in source.user_attrs:
                trial.set_user_attr(key, source.user_attrs[key])
        for key, value in source.constraints.items():
            trial.set_constraint(key, value)


def write_out_of_memory(trial: optuna.Trial, source_number: int, reason: str) -> None:
    """Mark ``trial`` as not measured because trial ``source_number`` ran out of memory at a batch size no larger
    (:mod:`edgetune.search.memory`), with ``reason``: recorded as a duplicate of it (told its FAIL, never
    counted as measured, never taken for a dead worker's trial)."""
    trial.set_user_attr(_DUPLICATE_OF, source_number)
    trial.set_user_attr(_MEASURED, False)
    trial.set_user_attr(_NOT_MEASURED, reason)


def write_interrupted(trial: optuna.Trial) -> None:
    """Mark ``trial`` as stopped by Ctrl-C before it finished: the user's stop, not a worker's death, so it
    counts towards no retry cap (:func:`given_up`); the search queues its setting again afresh."""
    trial.set_user_attr(_INTERRUPTED, True)


def write_identity(study: optuna.Study, identity: Mapping[str, Any], *, tolerance: float, window_s: float,
                   guard_sigma: float, target: Mapping[str, Any]) -> None:
    """What a study was made for (a resume with anything else is refused) and how it judges the budget."""
    study.set_user_attr(_IDENTITY, dict(identity))
    study.set_user_attr(_TOLERANCE, tolerance)
    study.set_user_attr(_WINDOW_S, window_s)
    study.set_user_attr(_GUARD_SIGMA, guard_sigma)
    study.set_user_attr(_TARGET, dict(target))


def update_identity(study: optuna.Study, identity: Mapping[str, Any]) -> None:
    """Rewrite a resumed study's identity alone (its budget rule and law stay as :func:`write_identity` stored
    them): a study made before a field was kept records it."""
    study.set_user_attr(_IDENTITY, dict(identity))


def read_budget_rule(study: optuna.Study) -> dict[str, float]:
    """How the study judged its trials against the budget: ``tolerance``, ``window_s``, ``guard_sigma``, those
    :func:`write_identity` stored (a study older than the guard band's record lacks ``guard_sigma``)."""
    return {k: float(study.user_attrs[k]) for k in BUDGET_RULE_KEYS if k in study.user_attrs}


def write_rescored(study: optuna.Study, previous_steps: Any) -> None:
    """Add ``previous_steps`` (an identity's ``steps_to_target``, or ``{"law": {"s_min": ..., "b_noise": ...}}``)
    to the steps to target the study was scored with before it was resumed with others: its told values mix
    them (:func:`read_rescored`)."""
    study.set_user_attr(_RESCORED, [*read_rescored(study), previous_steps])


def read_rescored(study: optuna.Study) -> list[Any]:
    """The steps to target a study was scored with before the present ones (empty: never scored again)."""
    return list(study.user_attrs.get(_RESCORED, []))


# ---------------------------------------------------------------------------------------------- readers


def write_soaks(study: optuna.Study, soaks: Iterable[Mapping[str, Any]]) -> None:
    """The thermal soaks of the study's picks, in order (:class:`~edgetune.search.thermal.ThermalSoak` as
    dicts): a resume, and every worker of a fleet, judge the budget with their rise."""
    study.set_user_attr(_SOAKS, [dict(s) for s in soaks])


def read_soaks(study: optuna.Study) -> list[dict[str, Any]]:
    """What :func:`write_soaks` stored (empty before the first soak)."""
    return list(study.user_attrs.get(_SOAKS, []))


def read_target(study: optuna.Study) -> dict[str, Any] | None:
    """The law's parameters :func:`write_identity` stored (``s_min``, ``b_noise``), or None for a new study."""
    return study.user_attrs.get(_TARGET)


def read_identity(study: optuna.Study) -> dict[str, Any] | None:
    """The identity :func:`write_identity` stored, or None for a new study."""
    return study.user_attrs.get(_IDENTITY)


def role_of(trial: optuna.Trial | FrozenTrial) -> Role:
    """The role a trial was queued with (a sampler's proposal: :attr:`Role.SEARCH`)."""
    return Role(trial.user_attrs.get(_ROLE, Role.SEARCH))


def worker_of(trial: FrozenTrial) -> str:
    """``host:pid`` of the worker that asked the trial ("" before it said)."""
    return trial.user_attrs.get(_WORKER, "")


def kernel_of(trial: FrozenTrial) -> str:
    """Where the pid of the trial's worker means a process (:func:`write_start`'s ``kernel``; "" unrecorded)."""
    return trial.user_attrs.get(_KERNEL, "")


def is_measured(trial: FrozenTrial) -> bool:
    """The trial ran its measurement to the end (ok or not)."""
    return bool(trial.user_attrs.get(_MEASURED)) and trial.state in _FINISHED


def is_repeat(trial: FrozenTrial) -> bool:
    """The trial measures a setting again (:attr:`Role.CONFIRM`): a window, not a new setting."""
    return trial.user_attrs.get(_ROLE) == Role.CONFIRM.value


def measured_count(trials: Iterable[FrozenTrial]) -> int:
    """Settings measured among ``trials`` (a window measuring a setting again is not a new one)."""
    return sum(1 for t in trials if is_measured(t) and not is_repeat(t))


def is_duplicate(trial: FrozenTrial) -> bool:
    """The trial was told another trial's result."""
    return _DUPLICATE_OF in trial.user_attrs


def retry_history(trial: FrozenTrial) -> list[int]:
    """Numbers of the earlier attempts of the same setting whose worker died (oldest first; [] for none)."""
    with warnings.catch_warnings():  # the retry callback's readers are "experimental" since Optuna 2.8
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return list(optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(trial))


def _died(trial: FrozenTrial) -> bool:
    """Failed without a measurement and not as a duplicate: its worker died or gave up mid-trial."""
    return (trial.state == TrialState.FAIL and _BATCH_SIZE in trial.user_attrs and _MEASUREMENT not in trial.user_attrs
            and not is_duplicate(trial) and not trial.user_attrs.get(_INTERRUPTED))


def given_up(trials: Iterable[FrozenTrial]) -> set[int]:
    """Numbers of the trials whose worker died and that no retry follows (the retry cap was reached)."""
    trials = list(trials)
    retried = {n for t in trials for n in retry_history(t)}
    return {t.number for t in trials if _died(t) and t.number not in retried}


def _candidate(trial: FrozenTrial, space: SearchSpace | None = None) -> Candidate | None:
    ua = trial.user_attrs
    if _BATCH_SIZE not in ua or _SETTING not in ua:
        return None
    setting = ua[_SETTING]
    names = space.knob_names if space is not None else tuple(setting)
    return Candidate(int(ua[_BATCH_SIZE]), tuple((k, setting[k]) for k in names if k in setting))


def referred(m: Mapping[str, Any] | None, thermal: ThermalReference | None) -> Mapping[str, Any] | None:
    """A measurement's figures with its power referred to the thermal reference (:mod:`~edgetune.search.thermal`):
    the offset its board temperature causes subtracted from ``mean_power_w`` and ``max_avg_power_w``, and kept
    as ``thermal_offset_w``. ``m`` itself where there is nothing to refer (no reference, no temperature)."""
    if not m or thermal is None or not m.get("ok"):
        return m
    offset_w = thermal.offset_w(m.get("temperature_c"))
    if offset_w == 0.0:
        return m
    out = dict(m)
    for key in ("mean_power_w", "max_avg_power_w"):
        if out.get(key) is not None:
            out[key] = float(out[key]) - offset_w
    out["thermal_offset_w"] = offset_w
    return out


def read_records(trials: Iterable[FrozenTrial], space: SearchSpace | None, thermal: ThermalReference | None = None,
                 target: TargetModel | None = None) -> list[TrialRecord]:
    """A :class:`TrialRecord` for every asked trial that says its setting (queued trials are left out).

    ``space``: orders each setting's knobs as the space does (None: as the trial stored them).
    ``thermal``: the study's thermal reference (:func:`~edgetune.search.thermal.thermal_reference`): each
    measurement's power is then referred to it (:func:`referred`); None: as measured.
    ``target``: the steps to target the search scores with now: a measured trial's outcome is computed from
    its measurement (as measured) with them, the way it was when the trial was told (the same floats), so a
    study resumed with other steps to target ranks every trial by the same steps; None: as recorded."""
    trials = [t for t in trials if t.state != TrialState.WAITING]
    dead_ends = given_up(trials)
    out = []
    for t in trials:
        cand = _candidate(t, space)
        if cand is None:
            continue
        ua = t.user_attrs
        raw = ua.get(_MEASUREMENT)
        m = referred(raw, thermal)
        out_ = ua.get(_OUTCOME)
        if target is not None and out_ and raw:
            out_ = Outcome.of(cand.batch_size, raw["step_time_s"], raw["energy_per_sample_j"], target).__dict__
        known_oom = _NOT_MEASURED in ua  # write_out_of_memory
        out.append(TrialRecord(
            number=t.number, state=t.state.name, candidate=cand, role=Role(ua.get(_ROLE, Role.SEARCH)),
            measured=bool(ua.get(_MEASURED, False)), measurement=m, outcome=Outcome(**out_) if out_ else None,
            feasible=bool(ua.get(_FEASIBLE, False)), error=ua[_NOT_MEASURED] if known_oom else (m or {}).get("error"),
            worker=ua.get(_WORKER, ""), trace_t=ua.get(_TRACE_T, []), trace_w=ua.get(_TRACE_W, []),
            given_up=t.number in dead_ends, oom_of=int(ua[_DUPLICATE_OF]) if known_oom else None,
        ))
    return out


def read_observation(trial: FrozenTrial) -> Observation | None:
    """What the search recorded about ``trial`` for a sampler: None when it says nothing (a duplicate, a dead
    worker's trial, a trial of another program)."""
    cand = _candidate(trial)
    if cand is None:
        return None
    ua = trial.user_attrs
    m = ua.get(_MEASUREMENT)
    if m and ua.get(_MEASURED):
        return Observation._from_dict(cand, m, bool(ua.get(_FEASIBLE, False)))
    if trial.state in _PENDING and not is_duplicate(trial):
        return Observation(cand)
    return None
