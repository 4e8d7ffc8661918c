"""The search loop: ask a setting, measure it on the device, tell the result; the budget as a constraint.

One search is one Optuna study in a storage (:mod:`edgetune.search.storage`: an SQLite file in the output
folder by default; PostgreSQL or any RDB URL, or a ``journal:<file>`` for a fleet). Everything a trial
measured is kept in the trial's attributes (:mod:`edgetune.search.records`), so the results can be rebuilt
from the storage alone: after a resume, and by every worker of a fleet sharing one study.

Each turn of :meth:`Search.run`:

1. Fail and queue again the trials of workers that died mid-trial (``kill -9``, power loss), at most
   :data:`~edgetune.search.storage.MAX_RETRY` times per setting: nothing measured is lost and nothing is
   measured twice.
2. Stop when ``n_trials`` settings are measured in the study or the time limit passed.
3. Queue the next probe of the baseline of common practice (:mod:`edgetune.search.baseline`), so every result
   states its speedup over it; once the baseline is found, stop when the sampler (or, for samplers without a
   rule of their own, the patience rule) says no further trial can improve the best by the margin.
4. Ask a setting and measure it. A setting already measured is not measured again: the trial is told the
   recorded values. Nor is one whose batch size is known to run out of memory (a batch size no larger ran out at
   a setting that differs only in knobs that leave memory alone, :mod:`edgetune.search.memory`): the trial is
   told FAIL, its reason naming that trial.
5. Before stopping (for any reason but the time limit), measure the contenders for the pick again
   (:mod:`edgetune.search.confirm`): a window's run-to-run noise can exceed the gaps between the best few
   settings. These windows add no settings; the pick is made on each setting's pooled windows.
6. Then soak the pick (:mod:`edgetune.search.thermal`): train at it for minutes and extrapolate the power
   it draws on the warm board. From then on every setting must hold the budget by the sensor's accuracy
   plus the thermal rise (a setting soaked itself: its own; every other: the largest a soak measured per
   watt, carried to the budget's edge), and the loop goes on (the sampler may now see more to measure, the
   pick may move) until it stops again. A soak stopped over the budget (the pick does not hold it warm) saw
   too little to extrapolate from: the next pick is soaked too, on the board the first one warmed. Once a
   soak ran to its end, the stop soaks the pick itself where it draws more than every setting soaked to its
   end (a rise carried upward per watt understates it), else the best setting that only the carried rise
   rules out, so that its own rise judges it (:meth:`Search._soak_target`); :data:`MAX_SOAKS` in all. A
   search that has measured 20 settings, or all but the last quarter of ``n_trials``, unsoaked soaks its
   pick then (:func:`~edgetune.search.thermal.soak_reserve`), so that settings remain to re-aim with; and from
   the first soak on, every window's power is referred to the soaked pick's board temperature
   (:class:`~edgetune.search.thermal.ThermalReference`): the board stays warm after a soak, and its windows
   would otherwise pay the rise twice.

The budget constraint is ``judged power - budget * (1 + tolerance)`` through ``trial.set_constraint`` (Optuna
>= 5; <= 0 means held). An out-of-memory or failed step is a FAIL trial with the reason recorded; the study
goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from edgetune.log import get_logger
from edgetune.power.base import Capability, Device, summed_channels
from edgetune.power.knobs import reads_running_clock
from edgetune.power.monitor import PowerMonitor
from edgetune.search import records
from edgetune.search.baseline import Baseline, governed_clocks, nearest_batch_size
from edgetune.search.confirm import (
    CONFIRM_REPEATS,
    CONFIRM_SETTINGS,
    next_confirmation,
)
from edgetune.search.efficiency import (
    DEFAULT_ETA,
    DIRECTIONS,
    Outcome,
    TargetModel,
    ZeusCost,
    cost_max_power_w,
    objective_values,
    scalar_score,
)
from edgetune.search.fleet import find_same, queued_or_running
from edgetune.search.identity import START_ANEW, StudyIdentity
from edgetune.search.measurement import Measurement, MeasurementProtocol
from edgetune.search.memory import OutOfMemory, known_out_of_memory, memory_knobs, ran_out_of_memory
from edgetune.search.records import CONSTRAINT, Observation, Role, TrialRecord
from edgetune.search.results import (
    SearchResult,
    choose_best,
    margin_w,
    pareto_front,
    sensor_accuracy_w,
)
from edgetune.search.samplers import AUTO_SAMPLER, make_sampler
from edgetune.search.soaking import CoolWindows, soak_candidate
from edgetune.search.space import Candidate, SearchSpace
from edgetune.search.storage import (
    RetryCallback,
    SearchError,
    fail_and_retry,
    heartbeat,
    live_trials,
    open_storage,
    recover_dead_workers,
    redact,
    retry_callback,
    worker_id,
    worker_kernel,
)
from edgetune.search.thermal import (
    MAX_SOAKS,
    SOAK_S,
    ThermalSoak,
    required_margin_w,
    soak,
    soak_reserve,
    soaked_rise_w,
    thermal_reference,
    thermal_rise_w,
)
from edgetune.search.trial import measure_setting

__all__ = ["AUTO_SAMPLER", "CONSTRAINT", "Search", "SearchError", "SearchResult", "TrialRecord", "make_sampler",
           "open_storage"]

#: consecutive proposals that measured nothing (a setting measured before, or one known to run out of memory)
#: before the search queues a random unmeasured setting itself (a sampler that keeps proposing them has
#: converged or is stuck; either way it spends no measurement)
DUPLICATE_STALL = 30
#: largest grid whose unmeasured settings are listed to pick from after a stall (settings; listing a bigger
#: one costs seconds per stall, and a stall on such a grid is no sign it is exhausted)
MAX_LISTED_GRID = 200_000
_log = get_logger(__name__)


#: the least constraint violation (W) told for a trial stopped over the budget: positive, so Optuna counts it
#: infeasible, even where its short record's judged power fell a hair under the limit
_ABORTED_CONSTRAINT_W = 1e-6


class Search:
    """A budget-constrained search of ``space`` on ``device`` for ``workload``.

    Args:
        device, workload: open device and loaded workload.
        space: the search space.
        budget_w: the power budget (None: unconstrained); judged by the moving average over
            ``window_s`` with ``tolerance`` (fraction) allowed overshoot; the measured maximum plus
            ``guard_sigma`` standard errors of the measured average must hold it (a reading that happens
            to be low does not pass a setting whose true power is over the budget).
        objective: ``time``, ``energy``, ``throughput``, ``pareto`` or ``cost`` (Zeus's
            ``eta x energy + (1 - eta) x max power x time``, :class:`~edgetune.search.efficiency.ZeusCost`).
        eta: the cost objective's weight of energy, in [0, 1].
        prior: observations of an earlier study mapped to this space (:mod:`edgetune.search.prior`): they
            shape where the guided sampler looks, never count as measurements.
        target: steps to target (S_min, B_noise).
        protocol: the measurement protocol.
        storage_url, study_name: where the study lives; the same pair resumes it.
        sampler: ``auto``, ``guided``, ``tpe``, ``gp`` or ``random``.
        n_trials: settings to measure in the study in all (baseline probes included; a resume or a fleet
            counts the settings already measured; windows measuring a setting again do not count).
        patience, margin: stop after ``patience`` measured trials without an improvement larger than
            ``margin`` (a fraction of the best); 0 disables.
        timeout_s: stop starting trials after this much wall time (0: none).
        seed: sampler seed.
        baseline_batch_size: the baseline's batch size (default: the workload's default batch size).
        power_cv: relative run-to-run spread of a window's mean power that one window cannot show (a table
            replay draws one power per window, so its readings are constant): the standard error of a
            measured average is at least this fraction of it, and the guard band covers that spread.
        guided_options: keyword arguments of the guided sampler.
        confirm_settings, confirm_repeats: before the pick, up to ``confirm_settings`` contenders are
            measured up to ``confirm_repeats`` more times each (:mod:`edgetune.search.confirm`); 0 disables.
        on_trial: called after each trial with ``(record, measured_so_far)`` (progress display).
        on_step: passed to :func:`measure_setting` (progress within a trial).
        soak_s: device seconds the pick is trained at before the search stops, to measure how much more it
            draws once the board is warm (:mod:`edgetune.search.thermal`); 0 disables. Only under a budget,
            and never on a table replay (the table holds no temperature).
        storage: an open Optuna storage (default: :func:`open_storage` of ``storage_url``).
        start_anew: the flags that start a new study instead of this one, named where a resume is refused
            (:meth:`~edgetune.search.identity.StudyIdentity.check`).
    """

    def __init__(
        self,
        device: Device,
        workload: Any,
        space: SearchSpace,
        *,
        budget_w: float | None,
        objective: str = "time",
        target: TargetModel | None = None,
        protocol: MeasurementProtocol | None = None,
        storage_url: str = "sqlite:///:memory:",
        study_name: str = "edgetune",
        sampler: str = "auto",
        n_trials: int = 40,
        window_s: float = 1.0,
        tolerance: float = 0.0,
        guard_sigma: float = 2.0,
        patience: int = 12,
        margin: float = 0.01,
        timeout_s: float = 0.0,
        seed: int = 0,
        baseline_batch_size: int | None = None,
        power_cv: float = 0.0,
        guided_options: Mapping[str, Any] | None = None,
        on_trial: Callable[[TrialRecord, int], None] | None = None,
        on_step: Callable[[int], None] | None = None,
        storage: optuna.storages.BaseStorage | None = None,
        eta: float = DEFAULT_ETA,
        prior: Sequence[Observation] = (),
        confirm_settings: int = CONFIRM_SETTINGS,
        confirm_repeats: int = CONFIRM_REPEATS,
        soak_s: float = SOAK_S,
        start_anew: str = START_ANEW,
    ) -> None:
        if objective not in DIRECTIONS:
            raise SearchError(f"unknown objective {objective!r}; use {', '.join(DIRECTIONS)}")
        self.cost: ZeusCost | None = None
        if objective == "cost":
            max_power_w = cost_max_power_w(device)
            if max_power_w is None:
                raise SearchError(f"the cost objective needs the device's maximum power, which {device.name} "
                                  f"does not state; use --objective energy or time")
            try:
                self.cost = ZeusCost(eta, max_power_w)
            except ValueError as exc:
                raise SearchError(f"{exc}; pass --eta between 0 and 1") from None
        self.prior = tuple(prior)
        self.device = device
        self.workload = workload
        self.space = space
        self.budget_w = budget_w
        self.objective = objective
        self.target = target or TargetModel.for_workload(workload)
        self.protocol = protocol or MeasurementProtocol()
        self.storage_url = storage_url
        self.study_name = study_name
        self.sampler_name = sampler
        self.n_trials = n_trials
        self.window_s = window_s
        self.tolerance = tolerance
        self.guard_sigma = guard_sigma
        self.patience = patience
        self.margin = margin
        self.timeout_s = timeout_s
        self.seed = seed
        self.guided_options = guided_options
        self.power_cv = float(power_cv)
        self.confirm_settings = int(confirm_settings)
        self.confirm_repeats = int(confirm_repeats)
        if not soak_s >= 0:
            raise SearchError(f"the thermal soak must last 0 s or more, got {soak_s}; pass --soak-s 0 to skip it")
        self.soak_s = float(soak_s)
        self.start_anew = start_anew
        self.soaks: list[ThermalSoak] = []  # the study's soaks, in order (read back on a resume)
        self.on_trial = on_trial
        self.on_step = on_step
        self.worker = worker_id()
        self.kernel = worker_kernel()  # where that pid means this process: another worker judges its death by it
        default_b = baseline_batch_size or getattr(workload, "default_batch_size", space.batch_sizes[0])
        # the baseline: the space's batch size nearest the workload's default, the other knobs as found (not
        # as the last trial left them)
        self.baseline_batch_size = nearest_batch_size(space.batch_sizes, default_b)
        # a budget above what the device can draw binds nothing: run unconstrained, say so
        max_w = device.max_power_w
        self.constrained = budget_w is not None and not (max_w is not None and budget_w >= max_w)
        found = device.settings()
        # a real board's clocks read the running frequency: the baseline takes them as their governor runs them
        self.baseline = Baseline(space, self.baseline_batch_size,
                                 found if device.simulated else governed_clocks(space, found),
                                 limit_w=self._limit_w())
        #: the knobs the search does not tune, as found: the state its measurements hold in (best.json). Clocks
        #: aside: they read the running frequency, which a governor moves from one read to the next, not a state
        self.untuned_knobs = {name: value for name, value in found.items()
                              if name not in space.knob_names and not reads_running_clock(name)}
        #: channels the sensor's total sums: each adds its offset to the sensor's accuracy
        self.sensor_channels = summed_channels(getattr(device.sensor, "total_label", ""))
        self._storage = storage
        self.study: optuna.Study | None = None
        self._monitor: PowerMonitor | None = None
        self._retry: RetryCallback | None = None  # set with the storage, by _open_study
        self._duplicate_streak = 0  # consecutive proposals that measured nothing (DUPLICATE_STALL)
        self._oom_said: set[int] = set()  # trials whose out of memory a log line named (once each)
        self._reserve_asked_at = -1  # the measured count at which the reserve soak was last asked for
        self._rng = random.Random(seed)
        self._started_s = 0.0

    # -- the study --------------------------------------------------------------------------------------
    def _open_study(self) -> optuna.Study:
        storage = self._storage or open_storage(self.storage_url)
        self._storage = storage
        self._retry = retry_callback(storage)
        n_existing = 0
        try:
            existing = optuna.load_study(study_name=self.study_name, storage=storage)
            n_existing = len(existing.trials)
            self.soaks = [ThermalSoak.from_dict(d) for d in records.read_soaks(existing)]
        except KeyError:  # a new study
            pass
        guided = {"budget_w": self.budget_w if self.constrained else None, "tolerance": self.tolerance,
                  "target": self.target, "guard_sigma": self.guard_sigma,
                  # the pick holds the budget by the sensor's accuracy: the sampler aims there
                  "accuracy_w": self._accuracy_w(), **dict(self.guided_options or {})}
        if self.cost is not None:
            guided["cost"] = self.cost
        if self.prior:
            guided["prior"] = self.prior
        try:  # a resumed study draws new random numbers: the seed moves on by the trials it holds
            sampler = make_sampler(self.sampler_name, seed=self.seed + n_existing, n_trials=self.n_trials,
                                   objective=self.objective, space=self.space, guided_options=guided)
        except ValueError as exc:
            raise SearchError(str(exc)) from None
        study = optuna.create_study(storage=storage, study_name=self.study_name, sampler=sampler,
                                    directions=DIRECTIONS[self.objective], load_if_exists=True)
        # a resumed study must be for the same; with other steps to target, a guided search scores it again
        identity = StudyIdentity.of(space=self.space, objective=self.objective, budget_w=self.budget_w,
                                    workload=getattr(self.workload, "name", str(self.workload)),
                                    device=self.device.name, target=self.target, cost=self.cost,
                                    torch_device=self._torch_device, protocol=self.protocol)
        identity.check(study, storage_url=self.storage_url, sampler=self.sampler_name, tolerance=self.tolerance,
                       window_s=self.window_s, guard_sigma=self.guard_sigma, start_anew=self.start_anew)
        self._aim_sampler(study)
        return study

    def records(self, study: optuna.Study | None = None, *, as_measured: bool = False) -> list[TrialRecord]:
        """Every asked trial of the study as a :class:`TrialRecord`, its power referred to the soaks' board
        temperature (:func:`~edgetune.search.thermal.thermal_reference`; ``as_measured``: as read)."""
        study = study or self.study
        assert study is not None
        thermal = None if as_measured else thermal_reference(self.soaks)
        return records.read_records(study.get_trials(deepcopy=False), self.space, thermal, self.target)

    def _measured_count(self, study: optuna.Study) -> int:
        """Settings measured so far (a window measuring a setting again is not a new one)."""
        return records.measured_count(study.get_trials(deepcopy=False))

    # -- the loop ---------------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        """Measure until done; knobs restored on the way out, whatever the exit."""
        study = self.study = self._open_study()
        self._started_s = time.monotonic()
        self._duplicate_streak = 0
        self._reserve_asked_at = -1
        self._rng = random.Random(self.seed)
        self._monitor = PowerMonitor(self.device.sensor, self.device.clock, avg_window_s=self.window_s)
        with self.device.restoring(), self._monitor:
            while (reason := self._turn(study)) is None:
                pass
        return self.result(reason)

    def _turn(self, study: optuna.Study) -> str | None:
        """One turn of the loop (module docs): a reason to stop, or None after one trial."""
        assert self._storage is not None and self._retry is not None
        recover_dead_workers(study, self._storage, self._retry)
        reason = self._next(study)
        if reason is not None:
            if self._timed_out() or (self._limit_reached(study) is not None and self._new_waiting(study)):
                # at the limit, a queued new setting (a retry, a resumed Ctrl-C) would be asked before a
                # confirmation or a soak queued after it, and measured past n_trials: the search ends here
                return reason
            again = self._confirmation(study)
            if again is None:
                target = self._soak_target(study)
                if target is not None and self._soak(study, target):
                    return None  # the margin moved: the sampler, the confirmations and the pick look again
                return reason
            records.enqueue(study, self.space, again, Role.CONFIRM)
        elif self._reserve_soak_due(study) and self._soak(study, self.result().best):
            return None  # soaked before the last settings (module docs): they can re-aim with the margin
        self._trial(study)
        return None

    def _next(self, study: optuna.Study) -> str | None:
        """Queue what the next trial needs (a baseline probe, a setting after a stall), or say why to stop."""
        reason = self._limit_reached(study)
        if reason is not None:
            return reason
        recs = self.records(study)
        reason = self._nothing_fits(recs)
        if reason is not None:
            return reason
        probe = self.baseline.state(recs).next_probe
        if probe is not None:
            # a trial already waits (a retry, a resumed Ctrl-C): it is asked first, the probe on a later turn
            if not queued_or_running(study, self.space, probe) and not self._new_waiting(study):
                records.enqueue(study, self.space, probe, Role.BASELINE, skip_if_exists=True)
        else:
            reason = self._converged(study, recs)
            if reason is not None:
                return reason
        if self._duplicate_streak >= DUPLICATE_STALL:
            return self._unstall(study, recs)
        return None

    @staticmethod
    def _new_waiting(study: optuna.Study) -> bool:
        """A trial of a new setting waits in the queue (not a confirmation): the next ask takes the oldest."""
        return any(not records.is_repeat(t) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _nothing_fits(self, recs: list[TrialRecord]) -> str | None:
        """A reason to stop when every setting of the space is known to run out of memory: the smallest batch
        size ran out at a setting whose knobs all leave memory alone (:mod:`edgetune.search.memory`); else None.
        (A space with a knob that may change memory ends by :meth:`_unstall` once its proposals stall.)"""
        smallest = min(self.space.batch_sizes)
        for oom in ran_out_of_memory(recs):
            if oom.candidate.batch_size == smallest and not memory_knobs(oom.candidate):
                return f"every batch size runs out of memory: the smallest, {smallest}, ran out at trial {oom.trial}"
        return None

    def _timed_out(self) -> bool:
        return bool(self.timeout_s) and time.monotonic() - self._started_s > self.timeout_s

    def _can_soak(self) -> bool:
        """Soaks are on: under a budget, on a device that runs steps (not a table replay)."""
        return self.soak_s > 0 and self._limit_w() is not None and not self.device.has(Capability.TABLE_REPLAY)

    def _soak_due(self, study: optuna.Study) -> bool:
        """The pick is to be soaked: no soak of any worker of the study ran to its end yet (none ran, or each
        was stopped over the budget), and fewer than :data:`MAX_SOAKS` ran."""
        if not self._can_soak():
            return False
        soaks = self._stored_soaks(study)
        return len(soaks) < MAX_SOAKS and all(s.stopped_over_budget for s in soaks)

    def _soak_target(self, study: optuna.Study) -> TrialRecord | None:
        """The setting to soak at the stop (module docs, step 6), or None: the pick while no soak ran to its
        end (:meth:`_soak_due`); after one did, :func:`~edgetune.search.soaking.soak_candidate` (the pick, or for
        ``pareto`` the hottest point of the front, where it was not soaked itself and draws more than every
        setting soaked to its end by more than the sensor's accuracy; else the best setting that only the
        carried rise rules out), with half the search's margin as the gain worth a soak."""
        if self._soak_due(study):
            return self.result().best
        if not self._can_soak() or len(self.soaks) >= MAX_SOAKS:  # _soak_due read the stored ones
            return None
        return soak_candidate(self.result(), self.soaks, objective=self.objective, cost=self.cost,
                              resolution=self.margin / 2)

    def _reserve_soak_due(self, study: optuna.Study) -> bool:
        """No soak ran yet and the search has measured 20 settings or all but its last share of them
        (:func:`~edgetune.search.thermal.soak_reserve`): the pick is soaked now, not at the stop, so that the
        settings left can re-aim with the margin it sets. Asked once per measured count (a search with no
        pick yet asks again after its next setting)."""
        if self.soaks:
            return False
        count = self._measured_count(study)
        if count < soak_reserve(self.n_trials) or count == self._reserve_asked_at:
            return False
        self._reserve_asked_at = count
        return self._soak_due(study) and not self.soaks

    def _soak(self, study: optuna.Study, target: TrialRecord | None) -> bool:
        """Soak ``target`` (:func:`~edgetune.search.thermal.soak`), keep the rise in the study, and move the
        sampler's aim by it; False where there is nothing to soak (no pick held the budget) or ``target``
        was soaked already (stopped over the budget: nothing new to learn from it)."""
        assert self._monitor is not None
        if target is None or not target.feasible or target.measurement is None:
            return False
        cand = target.candidate
        if soaked_rise_w(self.soaks, cand) is not None:
            return False
        cool = self._cool(study, cand)
        real_steps = 0 if self.device.has(Capability.VIRTUAL_CLOCK) else None
        new = soak(self.device, self.workload, cand.batch_size, cand.knobs, self._monitor,
                   cool_power_w=cool.power_w, cool_temperature_c=cool.temperature_c,
                   cool_excess_w=cool.excess_w, limit_w=self._limit_w(), guard_sigma=self.guard_sigma,
                   duration_s=self.soak_s, real_steps=real_steps)
        new.after_settings = self._measured_count(study)
        self.soaks.append(new)
        records.write_soaks(study, [s.to_dict() for s in self.soaks])
        _log.info("%s", new.describe(self._rise_w()))
        self._aim_sampler(study)
        return True

    def _cool(self, study: optuna.Study, cand: Candidate) -> CoolWindows:
        """``cand``'s search windows, as measured: what a soak's rise is counted from."""
        return CoolWindows.of([r.measurement for r in self.records(study, as_measured=True)
                               if r.measured and r.ok and r.candidate == cand and r.measurement], self.guard_sigma)

    def _aim_sampler(self, study: optuna.Study) -> None:
        """Tell a sampler that reads them the margin and the thermal reference the soaks set."""
        if hasattr(study.sampler, "accuracy_w"):
            study.sampler.accuracy_w = self._accuracy_w()
        if hasattr(study.sampler, "thermal"):
            study.sampler.thermal = thermal_reference(self.soaks)

    def _confirmation(self, study: optuna.Study) -> Candidate | None:
        """The contender to measure again before the pick (:func:`~edgetune.search.confirm.next_confirmation`),
        or None; never one already queued or being measured (another worker of a fleet may be at it)."""
        measured = [r for r in self.records(study) if r.measured]
        cand = next_confirmation(measured, self.objective, limit_w=self._limit_w(), guard_sigma=self.guard_sigma,
                                 accuracy_w=self._accuracy_w(), required_w=self._required_w,
                                 cost=self.cost, settings=self.confirm_settings, repeats=self.confirm_repeats,
                                 resolution=self.margin / 2)
        if cand is None or queued_or_running(study, self.space, cand):
            return None
        return cand

    def _limit_reached(self, study: optuna.Study) -> str | None:
        count = self._measured_count(study)
        # a fleet: the new settings other live workers are measuring now count too, or each would start one more
        assert self._storage is not None
        running = sum(1 for t in live_trials(study, self._storage) if not records.is_repeat(t))
        if count + running >= self.n_trials:
            # a study resumed with a smaller cap (or a fleet) measured more than it: the count, and the cap apart
            measured = f"{count} setting{'' if count == 1 else 's'} measured"
            if running:
                measured += f" and {running} being measured by other workers"
            total = count + running
            return measured if total == self.n_trials else f"{measured} (the limit, n_trials, is {self.n_trials})"
        if self._timed_out():
            return f"time limit of {self.timeout_s:g} s reached"
        return None

    def _converged(self, study: optuna.Study, recs: list[TrialRecord]) -> str | None:
        """The sampler's stopping rule; for samplers without one, the patience rule."""
        should_stop = getattr(study.sampler, "should_stop", None)
        if should_stop is not None:
            return should_stop(study, self.margin)
        if self._patience_spent(recs):
            return f"no improvement over {self.margin:.0%} in the last {self.patience} measured settings"
        return None

    def _patience_spent(self, recs: list[TrialRecord]) -> bool:
        if self.patience <= 0:
            return False
        measured = sorted((r for r in recs if r.measured), key=lambda r: r.number)
        best = math.inf
        since = 0
        for r in measured:
            score = scalar_score(r.outcome, self.objective, self.cost) if r.feasible and r.outcome else math.inf
            if score < best - self.margin * abs(best) if math.isfinite(best) else score < best:
                best = score
                since = 0
            else:
                since += 1
        return math.isfinite(best) and since >= self.patience

    def _unstall(self, study: optuna.Study, recs: list[TrialRecord]) -> str | None:
        """Queue a random unmeasured setting not known to run out of memory after a streak of proposals that
        measured nothing (None), or stop when none is left."""
        seen = {r.candidate for r in recs}
        unseen = [c for c in self.space.grid() if c not in seen] if self.space.size <= MAX_LISTED_GRID else []
        ooms = ran_out_of_memory(recs)
        left = [c for c in unseen if not any(o.covers(c) for o in ooms)]
        if not left:
            known = len(left) < len(unseen) or any(r.oom_of is not None for r in recs)
            return "every setting of the space measured" + (" or known to run out of memory" if known else "")
        records.enqueue(study, self.space, self._rng.choice(left))
        self._duplicate_streak = 0
        return None

    # -- one trial --------------------------------------------------------------------------------------
    def _ask(self, study: optuna.Study) -> optuna.Trial:
        with warnings.catch_warnings():
            # ask-and-tell with a heartbeat: the search beats itself (storage.heartbeat), Optuna warns anyway
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            return study.ask(self.space.distributions())

    def _trial(self, study: optuna.Study) -> None:
        """Ask a setting and measure it (or tell it the result recorded for the same setting)."""
        trial = self._ask(study)
        role = records.role_of(trial)
        cand = self.space.candidate(trial.params)
        records.write_start(trial, cand, role, self.worker, self.kernel)
        source = None if role == Role.CONFIRM else find_same(study, trial, self.space)
        if source is not None:
            self._tell_duplicate(study, trial, source)
            self._duplicate_streak += 1
            return
        oom = None if role == Role.CONFIRM else known_out_of_memory(
            records.read_records(study.get_trials(deepcopy=False), self.space), cand)
        if oom is not None:
            self._tell_out_of_memory(study, trial, cand, oom)
            self._duplicate_streak += 1
            return
        self._duplicate_streak = 0
        assert self._storage is not None and self._retry is not None
        with heartbeat(self._storage, study, trial.number):
            try:
                rec = self._measure(study, trial, cand, role)
            except Exception:
                if not self._finished_elsewhere(study, trial.number):
                    with contextlib.suppress(Exception):
                        fail_and_retry(study, trial.number, self._retry)
                    raise
                # another worker failed it meanwhile, taking this one for dead (no heartbeat for the grace period:
                # a board paused, the database out of reach) and queued it again: its retry measures the setting
                _log.warning("trial %d (%s): another worker failed it as stale while this one measured it, and "
                             "queued it again; this measurement is dropped, the retry measures it", trial.number,
                             cand.describe(self.space.unit_of))
                return
            except KeyboardInterrupt:
                # Ctrl-C: the user's stop, no death of the worker; counted as one, three of them on one setting
                # gave it up for good. Failed, and its setting queued again afresh (the resume measures it)
                with contextlib.suppress(Exception):
                    records.write_interrupted(trial)
                    study.tell(trial, state=TrialState.FAIL)
                    records.enqueue(study, self.space, cand, role)
                raise
            except BaseException:
                # a device error: the trial did not finish; fail it and queue it again (no RUNNING trial left
                # behind; the resume measures it). The original error is the one to report.
                with contextlib.suppress(Exception):
                    fail_and_retry(study, trial.number, self._retry)
                raise
        if self.on_trial is not None:
            self.on_trial(rec, self._measured_count(study))

    @staticmethod
    def _finished_elsewhere(study: optuna.Study, number: int) -> bool:
        """Trial ``number`` is finished in the storage though this worker never told it: another worker failed it."""
        trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
        return trial is not None and trial.state.is_finished()

    def _limit_w(self) -> float | None:
        """The budget with its tolerance (None: unconstrained)."""
        return self.budget_w * (1.0 + self.tolerance) if self.constrained and self.budget_w is not None else None

    def _accuracy_w(self) -> float:
        """The margin a pick must hold the limit by, W (0: unconstrained), as
        :attr:`SearchResult.required_margin_w`: the sensor's accuracy plus the soak's thermal rise."""
        limit_w = self._limit_w()
        if limit_w is None:
            return 0.0
        return sensor_accuracy_w(limit_w, self.sensor_channels) + self._rise_w()

    def _required_w(self, cand: Candidate) -> float:
        """The margin ``cand`` must hold the limit by, W (:meth:`SearchResult.required_margin_for`): as
        :meth:`_accuracy_w`, but with its own soak's rise where it was soaked."""
        limit_w = self._limit_w()
        if limit_w is None:
            return 0.0
        accuracy_w = sensor_accuracy_w(limit_w, self.sensor_channels)
        return required_margin_w(self.soaks, cand, accuracy_w, limit_w - accuracy_w)

    def _rise_w(self) -> float:
        """The soaks' thermal rise as the margin counts it, W, at the edge of the budget (the limit less the
        sensor's accuracy: :func:`~edgetune.search.thermal.thermal_rise_w`; 0: unconstrained or not soaked)."""
        limit_w = self._limit_w()
        if limit_w is None:
            return 0.0
        return thermal_rise_w(self.soaks, limit_w - sensor_accuracy_w(limit_w, self.sensor_channels))

    def _measure(self, study: optuna.Study, trial: optuna.Trial, cand: Candidate, role: Role) -> TrialRecord:
        assert self._monitor is not None
        limit_w = self._limit_w()
        m = measure_setting(self.device, self.workload, cand.batch_size, cand.knobs, self.protocol,
                            self._monitor, on_step=self.on_step, limit_w=limit_w, guard_sigma=self.guard_sigma)
        if m.ok and self.power_cv > 0 and m.power_se_w < self.power_cv * m.max_avg_power_w:
            m = dataclasses.replace(m, power_se_w=self.power_cv * m.max_avg_power_w)
        return self._tell(study, trial, cand, role, m)

    def _tell(self, study: optuna.Study, trial: optuna.Trial, cand: Candidate, role: Role,
              m: Measurement) -> TrialRecord:
        if not m.ok:
            records.write_measurement(trial, m, None, False, None)
            study.tell(trial, state=TrialState.FAIL)
            return TrialRecord(trial.number, "FAIL", cand, role, True, m.to_dict(), None, False, m.error,
                               self.worker)
        outcome = Outcome.of(cand.batch_size, m.step_time_s, m.energy_per_sample_j, self.target)
        feasible = m.holds(self.budget_w if self.constrained else None, self.tolerance, self.guard_sigma)
        constraint_w = None
        if self.constrained:
            assert self.budget_w is not None
            constraint_w = m.judged_power_w(self.guard_sigma) - self.budget_w * (1.0 + self.tolerance)
            if m.aborted_over_budget:  # stopped over the budget: violated, however short its record
                constraint_w = max(constraint_w, _ABORTED_CONSTRAINT_W)
        records.write_measurement(trial, m, outcome, feasible, constraint_w)
        study.tell(trial, objective_values(outcome, self.objective, self.cost))
        return TrialRecord(trial.number, "COMPLETE", cand, role, True, m.to_dict(), outcome, feasible, None,
                           self.worker, m.trace_t, m.trace_w)

    def _tell_duplicate(self, study: optuna.Study, trial: optuna.Trial, source: FrozenTrial) -> None:
        """Tell ``trial`` the result recorded by ``source`` (same setting): no second measurement."""
        records.write_duplicate(trial, source)
        if source.state == TrialState.COMPLETE:
            study.tell(trial, source.values)
        else:  # out of memory, failed, given up, or still being measured by another worker
            study.tell(trial, state=TrialState.FAIL)

    def _tell_out_of_memory(self, study: optuna.Study, trial: optuna.Trial, cand: Candidate,
                            oom: OutOfMemory) -> None:
        """Tell ``trial`` FAIL without measuring it: ``oom`` ran out of memory at a batch size no larger
        (:mod:`edgetune.search.memory`). The first such trial of each ``oom`` is logged, the rest at debug level."""
        records.write_out_of_memory(trial, oom.trial, oom.reason)
        study.tell(trial, state=TrialState.FAIL)
        level = logging.DEBUG if oom.trial in self._oom_said else logging.INFO
        self._oom_said.add(oom.trial)
        _log.log(level, "trial #%d, %s: %s", trial.number, cand.describe(self.space.unit_of), oom.reason)

    @property
    def _torch_device(self) -> str:
        """Where the search trains: the workload's device (a trace's workload stays on the CPU)."""
        return str(getattr(self.workload, "device", "cpu"))

    def _stored_soaks(self, study: optuna.Study) -> list[ThermalSoak]:
        """The study's soaks (this worker's, or another's of a fleet)."""
        stored = records.read_soaks(study)
        if len(stored) > len(self.soaks):
            self.soaks = [ThermalSoak.from_dict(d) for d in stored]
            self._aim_sampler(study)
        return self.soaks

    # -- results ----------------------------------------------------------------------------------------
    def result(self, stop_reason: str = "") -> SearchResult:
        """The search's result as the storage holds it now."""
        study = self.study
        assert study is not None
        soaks = list(self._stored_soaks(study))
        recs = self.records(study)
        result = SearchResult(
            study_name=self.study_name, storage_url=redact(self.storage_url), objective=self.objective,
            budget_w=self.budget_w, constrained=self.constrained, tolerance=self.tolerance, space=self.space,
            target=self.target, records=recs, best=None, baseline=None, pareto=[],
            stop_reason=stop_reason, protocol=self.protocol.describe(
                bool(getattr(self.device.clock, "virtual", False)),
                runs_step=bool(getattr(self.device.backend, "compute", True))),
            device_name=self.device.name, device_description=self.device.description,
            simulated=self.device.simulated, workload=getattr(self.workload, "name", str(self.workload)),
            cost=self.cost, guard_sigma=self.guard_sigma, power_cv=self.power_cv,
            sensor_channels=self.sensor_channels, thermal_soaks=soaks, untuned_knobs=dict(self.untuned_knobs),
            torch_device=self._torch_device,
        )
        settings = result.settings  # one record per setting, its windows pooled
        feasible = [r for r in settings if r.feasible and r.outcome is not None]
        found = self.baseline.state(recs).found
        if found is not None:  # its pooled windows, where it was measured again
            result.baseline = next((r for r in settings if r.candidate == found.candidate), found)
        # the front the pick is made from (the safe side): the settings that hold the limit by the sensor's
        # accuracy plus their thermal rise; where none does, those that held it by the rise (on the warm board)
        limit_w = result.limit_w
        safe = [r for r in feasible if result.certified(r)]
        warm = [r for r in feasible if limit_w is None or margin_w(r, limit_w) >= result.rise_for_w(r.candidate)]
        result.pareto = pareto_front(safe or warm)
        # the safe side: the best that held the budget by the sensor's accuracy (pareto: the front's point with
        # the lowest energy-delay product), best.json's knife_edge names a better one held by less
        result.best = choose_best(result)
        return result
