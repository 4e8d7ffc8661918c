"""The Optuna study: ask a setting, measure it on the device, tell the result; the budget as a constraint.

One search is one Optuna study in a storage (an SQLite file in the output folder by default; PostgreSQL or
any RDB URL, or a ``journal:<file>`` for a fleet). Everything a trial measured is kept in the trial's user
attributes, so the results can be rebuilt from the storage alone: after a resume, and by every worker of a
fleet sharing one study.

Flow of :meth:`Search.run`:

1. Recover trials left RUNNING by a dead worker (killed with ``kill -9``, power loss): they are marked
   failed and their settings put back in the queue, so nothing measured is lost and nothing is measured
   twice (a worker on this host is checked by pid; elsewhere by the storage's heartbeat).
2. Find the baseline of common practice (and of the published work): the workload's default batch size at
   the highest GPU frequency whose power fits the budget, the other knobs as found. Its probes are enqueued
   first (highest GPU frequency first, then bisection over the GPU frequencies), so every result states
   its speedup over it.
3. Ask-and-tell until ``n_trials`` settings are measured in the study, the sampler or the patience rule
   says no further trial can improve the best by the margin, or the time limit passes. A setting already
   measured is never measured again: the trial is told the recorded values.

The budget constraint is ``max moving-average power - budget * (1 + tolerance)`` through
``trial.set_constraint("power_w", ...)`` (Optuna >= 5; <= 0 means held). An out-of-memory or failed step is
a FAIL trial with the reason recorded; the study goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from edgetune.power.base import Device
from edgetune.power.monitor import PowerMonitor
from edgetune.power.state import pid_alive
from edgetune.search.efficiency import DIRECTIONS, Outcome, TargetModel, objective_values, scalar_score
from edgetune.search.space import Candidate, SearchSpace
from edgetune.search.trial import Measurement, MeasurementProtocol, measure_setting

__all__ = ["Search", "SearchError", "SearchResult", "TrialRecord", "make_sampler", "open_storage"]

CONSTRAINT = "power_w"
#: sampler used by ``sampler = "auto"``: chosen by experiments/sampler_comparison.py
AUTO_SAMPLER = "guided"
_PENDING_WAIT_S = 2.0  # longest wait for another worker's trial to get its values (a dead worker's never do)
_DUPLICATE_STALL = 30  # consecutive duplicate proposals before a random unmeasured setting is enqueued


class SearchError(RuntimeError):
    """A search that cannot start or continue (storage unreachable, study mismatch): one line."""


# ---------------------------------------------------------------------------------------------- storage


def _redact(url: str) -> str:
    """The URL without its password, for messages."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in creds else url
    return url


def _postgres_driver(url: str) -> str:
    """``postgresql://`` names SQLAlchemy's default driver (psycopg 3 since SQLAlchemy 2.1); the project
    depends on psycopg2 (``edgetune[postgres]``): use whichever is installed."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    import importlib.util

    rest = url.split("://", 1)[1]
    for module, dialect in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"{dialect}://{rest}"
    raise SearchError("a PostgreSQL storage needs a driver: pip install 'edgetune[postgres]' (psycopg2-binary)")


def open_storage(url: str, *, heartbeat_s: int = 20) -> optuna.storages.BaseStorage:
    """Open an Optuna storage, checking it is reachable now rather than at the first trial.

    ``journal:<path>`` opens a journal file (no database server needed; works on shared file systems);
    anything else is an SQLAlchemy URL for :class:`optuna.storages.RDBStorage` with a heartbeat, so that a
    trial whose worker died is detected by the others.
    """
    given = url
    try:
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            path = url[len("journal:"):]
            path = path.removeprefix("//")
            return JournalStorage(JournalFileBackend(path))
        url = _postgres_driver(url)
        engine_kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            # several processes on one file: wait for the lock instead of failing at once
            engine_kwargs = {"connect_args": {"timeout": 60}}
        else:
            engine_kwargs = {"pool_pre_ping": True}
        with warnings.catch_warnings():  # heartbeat_interval is "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s, grace_period=3 * heartbeat_s,
            )
        if url.startswith("sqlite"):
            _sqlite_wal(storage)
        return storage
    except SearchError:
        raise
    except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors vary; the user needs one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SearchError(f"cannot open storage {_redact(given)}: {first[:200]}; check the URL, that the "
                          f"server runs and accepts this user (or use the default SQLite file)") from None


def _sqlite_wal(storage: optuna.storages.RDBStorage) -> None:
    """Write-ahead log with ``synchronous=NORMAL`` and write-locking transactions on an SQLite storage.

    The default rollback journal syncs the disk at every commit (about 10 ms each, hundreds per search).
    WAL with NORMAL keeps every committed trial through a crash or ``kill -9`` of the process (only a
    power loss may drop the last commits) and lets readers run beside a writer (fleet workers on one host).

    SQLite ignores ``SELECT ... FOR UPDATE``, so Optuna's pop of an enqueued trial (read WAITING, then
    write RUNNING) can hand the same trial to two workers. Starting every transaction with
    ``BEGIN IMMEDIATE`` takes the write lock up front and makes that read-then-write atomic.
    """
    from sqlalchemy import event

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # transactions are begun below, not by the driver
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    def on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(storage.engine, "connect", on_connect)
    event.listen(storage.engine, "begin", on_begin)
    storage.engine.dispose()  # connections made before the listener reconnect with it


class _Heartbeat:
    """Records the storage heartbeat of one trial every ``interval`` seconds from a daemon thread.

    Optuna beats only inside ``study.optimize``; ask-and-tell needs its own. A worker killed with ``kill -9``
    stops beating, and the others fail its trial after the grace period (``fail_stale_trials``).
    """

    def __init__(self, storage: optuna.storages.BaseStorage, trial_id: int) -> None:
        self.storage = storage
        self.trial_id = trial_id
        self.interval = getattr(storage, "heartbeat_interval", None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Heartbeat:  # noqa: PYI034 - private helper
        if self.interval and hasattr(self.storage, "record_heartbeat"):
            self.storage.record_heartbeat(self.trial_id)
            self._thread = threading.Thread(target=self._run, daemon=True, name="edgetune-heartbeat")
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a missed beat is harmless; the next one retries
                self.storage.record_heartbeat(self.trial_id)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# ---------------------------------------------------------------------------------------------- records


@dataclass
class TrialRecord:
    """One trial as the results see it (rebuilt from the trial's user attributes)."""

    number: int
    state: str
    candidate: Candidate
    role: str  # "baseline" (a baseline probe) or "search"
    measured: bool  # False for a trial told a recorded result (duplicate)
    measurement: dict[str, Any] | None
    outcome: Outcome | None
    feasible: bool  # ran and held the budget
    error: str | None = None
    worker: str = ""
    trace_t: list[float] = field(default_factory=list, repr=False)
    trace_w: list[float] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return bool(self.measurement and self.measurement.get("ok"))


def _record(t: FrozenTrial, space: SearchSpace) -> TrialRecord | None:
    ua = t.user_attrs
    if "batch_size" not in ua or "setting" not in ua:
        return None
    cand = Candidate(int(ua["batch_size"]), tuple((k, ua["setting"][k]) for k in space.knob_names
                                                    if k in ua["setting"]))
    m = ua.get("measurement")
    out = ua.get("outcome")
    return TrialRecord(
        number=t.number, state=t.state.name, candidate=cand, role=ua.get("role", "search"),
        measured=bool(ua.get("measured", False)), measurement=m,
        outcome=Outcome(**out) if out else None, feasible=bool(ua.get("feasible", False)),
        error=(m or {}).get("error"), worker=ua.get("worker", ""),
        trace_t=ua.get("trace_t", []), trace_w=ua.get("trace_w", []),
    )


@dataclass
class SearchResult:
    """What a search found: every trial, the best, the baseline, and why it stopped."""

    study_name: str
    storage_url: str
    objective: str
    budget_w: float | None  # the budget asked for
    constrained: bool  # False when the budget is above the device's maximum power
    tolerance: float
    space: SearchSpace
    target: TargetModel
    records: list[TrialRecord]
    best: TrialRecord | None
    baseline: TrialRecord | None
    pareto: list[TrialRecord]
    stop_reason: str
    protocol: str
    device_name: str
    device_description: str
    simulated: bool
    workload: str

    @property
    def measured(self) -> list[TrialRecord]:
        return [r for r in self.records if r.measured]

    @property
    def speedup(self) -> float | None:
        if self.best is None or self.baseline is None or not self.best.outcome or not self.baseline.outcome:
            return None
        b, c = self.baseline.outcome, self.best.outcome
        if self.objective == "energy":
            return b.energy_to_target_j / c.energy_to_target_j
        if self.objective == "throughput":
            return c.samples_per_s / b.samples_per_s
        return b.time_to_target_s / c.time_to_target_s


# ---------------------------------------------------------------------------------------------- samplers


def make_sampler(name: str, *, seed: int, n_trials: int, objective: str, space: SearchSpace,
                 guided_options: Mapping[str, Any] | None = None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler named in the config (``auto``: the measured winner, :data:`AUTO_SAMPLER`)."""
    name = AUTO_SAMPLER if name == "auto" else name
    startup = max(3, min(10, n_trials // 4))
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
                                          constant_liar=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, deterministic_objective=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "guided":
        from edgetune.search.guided import GuidedSampler
        from edgetune.search.powercap import PowerCapSampler, is_power_cap_space

        cls = PowerCapSampler if is_power_cap_space(space) else GuidedSampler  # a power cap: its own design
        return cls(space, objective=objective, seed=seed, **dict(guided_options or {}))
    raise SearchError(f"unknown sampler {name!r}; use auto, guided, tpe, gp or random")


# ---------------------------------------------------------------------------------------------- search


class Search:
    """A budget-constrained search of ``space`` on ``device`` for ``workload``.

    Args:
        device, workload: open device and loaded workload.
        space: the search space.
        budget_w: the power budget (None: unconstrained); judged by the moving average over
            ``window_s`` with ``tolerance`` (fraction) allowed overshoot; the measured maximum plus
            ``guard_sigma`` standard errors of the measured average must hold it (a reading that happens
            to be low does not pass a setting whose true power is over the budget).
        objective: ``time``, ``energy``, ``throughput`` or ``pareto``.
        target: steps to target (S_min, B_noise).
        protocol: the measurement protocol.
        storage_url, study_name: where the study lives; the same pair resumes it.
        sampler: ``auto``, ``guided``, ``tpe``, ``gp`` or ``random``.
        n_trials: settings to measure in the study in all (baseline probes included; a resume or a fleet
            counts the trials already measured).
        patience, margin: stop after ``patience`` measured trials without an improvement larger than
            ``margin`` (a fraction of the best); 0 disables.
        timeout_s: stop starting trials after this much wall time (0: none).
        seed: sampler seed.
        on_trial: called after each trial with ``(record, measured_so_far)`` (progress display).
        on_step: passed to :func:`measure_setting` (progress within a trial).
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
        guided_options: Mapping[str, Any] | None = None,
        on_trial: Callable[[TrialRecord, int], None] | None = None,
        on_step: Callable[[int], None] | None = None,
        storage: optuna.storages.BaseStorage | None = None,
    ) -> None:
        if objective not in DIRECTIONS:
            raise SearchError(f"unknown objective {objective!r}; use {', '.join(DIRECTIONS)}")
        self.device = device
        self.workload = workload
        self.space = space
        self.budget_w = budget_w
        self.objective = objective
        self.target = target or TargetModel()
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
        self.on_trial = on_trial
        self.on_step = on_step
        self.worker = _worker_id()
        self._found_settings = dict(device.settings())  # the baseline's other knobs: as found
        default_b = baseline_batch_size or getattr(workload, "default_batch_size", space.batch_sizes[0])
        # the baseline uses the space's batch size nearest the workload's default
        self.baseline_batch_size = min(space.batch_sizes, key=lambda b: (abs(math.log(b / default_b)), -b))
        # a budget above what the device can draw binds nothing: run unconstrained, say so
        max_w = device.max_power_w
        self.constrained = budget_w is not None and not (max_w is not None and budget_w >= max_w)
        self._storage = storage
        self.study: optuna.Study | None = None

    # -- study --------------------------------------------------------------------------------------
    def _open_study(self) -> optuna.Study:
        storage = self._storage or open_storage(self.storage_url)
        self._storage = storage
        n_existing = 0
        with contextlib.suppress(KeyError):
            n_existing = len(optuna.load_study(study_name=self.study_name, storage=storage).trials)
        guided = {"budget_w": self.budget_w if self.constrained else None, "tolerance": self.tolerance,
                  "target": self.target, "guard_sigma": self.guard_sigma, **dict(self.guided_options or {})}
        sampler = make_sampler(self.sampler_name, seed=self.seed + n_existing, n_trials=self.n_trials,
                               objective=self.objective, space=self.space, guided_options=guided)
        study = optuna.create_study(storage=storage, study_name=self.study_name, sampler=sampler,
                                    directions=DIRECTIONS[self.objective], load_if_exists=True)
        identity = {
            "space": self.space.to_dict(), "objective": self.objective, "budget_w": self.budget_w,
            "workload": getattr(self.workload, "name", str(self.workload)), "device": self.device.name,
        }
        stored = study.user_attrs.get("identity")
        if stored is None:
            study.set_user_attr("identity", identity)
            study.set_user_attr("tolerance", self.tolerance)
            study.set_user_attr("window_s", self.window_s)
            study.set_user_attr("target", {"s_min": self.target.s_min, "b_noise": self.target.b_noise})
        elif stored != identity:
            diff = sorted(k for k in identity if stored.get(k) != identity[k])
            raise SearchError(f"study {self.study_name!r} in {_redact(self.storage_url)} was made with a "
                              f"different {', '.join(diff)}; use another --study-name or --output to start anew")
        return study

    def _recover_stale(self, study: optuna.Study) -> int:
        """Fail RUNNING trials whose worker is dead and enqueue their settings again. Returns how many."""
        storage = study._storage  # the storage object this study was opened with
        host = socket.gethostname()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            w = t.user_attrs.get("worker", "")
            h, _, pid = w.rpartition(":")
            if h == host and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                # FrozenTrial's id is the storage's key; the public API has no other handle on it
                storage.set_trial_user_attr(t._trial_id, "stale", f"worker {w} died mid-trial")
                storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        if isinstance(storage, optuna.storages.RDBStorage):
            optuna.storages.fail_stale_trials(study)  # other hosts: by heartbeat
        retried = {t.user_attrs.get("retry_of") for t in study.get_trials(deepcopy=False)}
        n = 0
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
            if "measurement" in t.user_attrs or "duplicate_of" in t.user_attrs or t.number in retried:
                continue  # a real result (OOM) or a duplicate: nothing lost
            if not t.params:
                continue
            attrs = {"retry_of": t.number, "role": t.user_attrs.get("role", "search")}
            study.enqueue_trial(dict(t.params), user_attrs=attrs)
            n += 1
        return n

    # -- baseline -----------------------------------------------------------------------------------
    @property
    def _baseline_knob(self) -> str | None:
        """The knob common practice lowers until power fits: the GPU clock, else the power limit."""
        return next((k for k in ("gpu_freq", "power_limit") if k in self.space.knob_values), None)

    def _baseline_candidate(self, lowered_value: Any) -> Candidate:
        current = self._found_settings  # as the device was found, not as the last trial left it
        values = self.space.knob_values
        lowered = self._baseline_knob
        setting = []
        for name, allowed in self.space.knobs:
            if name == lowered:
                setting.append((name, lowered_value))
                continue
            now = current.get(name)
            if now in allowed:
                setting.append((name, now))
            elif isinstance(now, (int, float)) and not isinstance(allowed[0], str):
                setting.append((name, min(allowed, key=lambda v: abs(float(v) - float(now)))))
            else:
                setting.append((name, values[name][-1]))
        return Candidate(self.baseline_batch_size, tuple(setting))

    def _baseline_state(self, records: list[TrialRecord]) -> tuple[Candidate | None, TrialRecord | None]:
        """(next probe to measure, or None) and the baseline found so far (or None).

        Probes the highest GPU frequency (power limit, where the device has no GPU clock knob) first, then
        bisects between the highest value that held the budget and the lowest that did not. A baseline
        that never holds the budget is no baseline: no speedup is claimed over an infeasible setting.
        """
        probes = [r for r in records if r.role == "baseline" and r.measurement is not None]
        lowered = self._baseline_knob
        if lowered is None:
            cand = self._baseline_candidate(None)
            done = [r for r in probes if r.candidate == cand]
            if not done:
                return cand, None
            return None, (done[0] if done[0].feasible else None)
        freqs = list(self.space.knob_values[lowered])
        ok = [freqs.index(r.candidate.knobs[lowered]) for r in probes if r.feasible]
        bad = [freqs.index(r.candidate.knobs[lowered]) for r in probes if not r.feasible]
        if any(r.measurement and r.measurement.get("oom") for r in probes):
            return None, None  # the default batch size does not fit in memory: no baseline
        lo = max(ok, default=-1)
        hi = min([i for i in bad if i > lo], default=len(freqs))
        found = None
        if lo >= 0:
            found = next(r for r in probes if r.feasible and freqs.index(r.candidate.knobs[lowered]) == lo)
        if hi - lo <= 1:
            return None, found
        nxt = len(freqs) - 1 if not probes else (lo + hi) // 2
        return self._baseline_candidate(freqs[nxt]), None

    # -- one trial ----------------------------------------------------------------------------------
    def _measure(self, study: optuna.Study, trial: optuna.Trial, cand: Candidate, role: str) -> TrialRecord:
        m = measure_setting(self.device, self.workload, cand.batch_size, cand.knobs, self.protocol,
                            self._monitor, on_step=self.on_step)
        return self._tell(study, trial, cand, role, m)

    def _tell(self, study: optuna.Study, trial: optuna.Trial, cand: Candidate, role: str,
              m: Measurement) -> TrialRecord:
        trial.set_user_attr("measurement", m.to_dict())
        trial.set_user_attr("trace_t", [round(x, 4) for x in m.trace_t])
        trial.set_user_attr("trace_w", [round(x, 3) for x in m.trace_w])
        trial.set_user_attr("measured", True)
        if not m.ok:
            trial.set_user_attr("feasible", False)
            study.tell(trial, state=TrialState.FAIL)
            return TrialRecord(trial.number, "FAIL", cand, role, True, m.to_dict(), None, False, m.error,
                               self.worker)
        outcome = Outcome.of(cand.batch_size, m.step_time_s, m.energy_per_sample_j, self.target)
        feasible = m.holds(self.budget_w if self.constrained else None, self.tolerance, self.guard_sigma)
        trial.set_user_attr("outcome", outcome.__dict__)
        trial.set_user_attr("feasible", feasible)
        if self.constrained:
            assert self.budget_w is not None
            trial.set_constraint(CONSTRAINT, m.judged_power_w(self.guard_sigma)
                                 - self.budget_w * (1.0 + self.tolerance))
        study.tell(trial, objective_values(outcome, self.objective))
        return TrialRecord(trial.number, "COMPLETE", cand, role, True, m.to_dict(), outcome, feasible, None,
                           self.worker, m.trace_t, m.trace_w)

    def _tell_duplicate(self, study: optuna.Study, trial: optuna.Trial, source: FrozenTrial) -> None:
        """Tell ``trial`` the result recorded by ``source`` (same setting): no second measurement."""
        trial.set_user_attr("duplicate_of", source.number)
        trial.set_user_attr("measured", False)
        if source.state == TrialState.COMPLETE:
            for key in ("outcome", "feasible"):
                if key in source.user_attrs:
                    trial.set_user_attr(key, source.user_attrs[key])
            for key, value in source.constraints.items():
                trial.set_constraint(key, value)
            study.tell(trial, source.values)
        else:  # out of memory, failed, or still being measured by another worker
            study.tell(trial, state=TrialState.FAIL)

    # -- the loop -----------------------------------------------------------------------------------
    def records(self, study: optuna.Study | None = None) -> list[TrialRecord]:
        study = study or self.study
        assert study is not None
        out = [_record(t, self.space) for t in study.get_trials(deepcopy=False)]
        return [r for r in out if r is not None]

    def _measured_count(self, study: optuna.Study) -> int:
        return sum(1 for t in study.get_trials(deepcopy=False)
                   if t.user_attrs.get("measured") and t.state in (TrialState.COMPLETE, TrialState.FAIL))

    def _should_stop_patience(self, records: list[TrialRecord]) -> bool:
        if self.patience <= 0:
            return False
        measured = sorted((r for r in records if r.measured), key=lambda r: r.number)
        best = math.inf
        since = 0
        for r in measured:
            score = scalar_score(r.outcome, self.objective) if r.feasible and r.outcome else math.inf
            if score < best - self.margin * abs(best) if math.isfinite(best) else score < best:
                best = score
                since = 0
            else:
                since += 1
        return math.isfinite(best) and since >= self.patience

    def run(self) -> SearchResult:
        """Measure until done; knobs restored on the way out, whatever the exit."""
        study = self._open_study()
        self.study = study
        self._recover_stale(study)
        t_start = time.monotonic()
        stop_reason = f"{self.n_trials} settings measured"
        dup_streak = 0
        rng = random.Random(self.seed)
        dists = self.space.distributions()
        self._monitor = PowerMonitor(self.device.sensor, self.device.clock, avg_window_s=self.window_s)
        with self.device.restoring(), self._monitor:
            while True:
                records = self.records(study)
                n_measured = self._measured_count(study)
                if n_measured >= self.n_trials:
                    break
                if self.timeout_s and time.monotonic() - t_start > self.timeout_s:
                    stop_reason = f"time limit of {self.timeout_s:g} s reached"
                    break
                probe, _found = self._baseline_state(records)
                baseline_done = probe is None
                if probe is not None and not self._waiting_or_running(study, probe):
                    study.enqueue_trial(self.space.params(probe), user_attrs={"role": "baseline"},
                                        skip_if_exists=True)
                if baseline_done:
                    reason = self._sampler_stop_reason(study)
                    if reason:
                        stop_reason = reason
                        break
                    if reason is None and not hasattr(study.sampler, "should_stop") and \
                            self._should_stop_patience(records):
                        stop_reason = (f"no improvement over {self.margin:.0%} in the last {self.patience} "
                                       f"measured settings")
                        break
                if dup_streak >= _DUPLICATE_STALL:
                    measured = {r.candidate for r in records}
                    left = [c for c in self.space.grid() if c not in measured] if self.space.size <= 200_000 else []
                    if not left:
                        stop_reason = "every setting of the space measured"
                        break
                    study.enqueue_trial(self.space.params(rng.choice(left)))
                    dup_streak = 0
                with warnings.catch_warnings():
                    # ask-and-tell with a heartbeat: we beat ourselves (_Heartbeat), Optuna warns anyway
                    warnings.filterwarnings("ignore", message="Heartbeat of storage")
                    trial = study.ask(dists)
                role = trial.user_attrs.get("role", "search") if hasattr(trial, "user_attrs") else "search"
                cand = self.space.candidate(trial.params)
                trial.set_user_attr("batch_size", cand.batch_size)
                trial.set_user_attr("setting", cand.knobs)
                trial.set_user_attr("worker", self.worker)
                trial.set_user_attr("role", role)
                source = self._find_same(study, trial)
                if source is not None:
                    self._tell_duplicate(study, trial, source)
                    dup_streak += 1
                    continue
                dup_streak = 0
                with _Heartbeat(study._storage, trial._trial_id):
                    try:
                        rec = self._measure(study, trial, cand, role)
                    except BaseException:
                        # Ctrl-C or a device error: the trial did not finish; leave no RUNNING trial behind
                        with contextlib.suppress(Exception):
                            study.tell(trial, state=TrialState.FAIL)
                        raise
                if self.on_trial is not None:
                    self.on_trial(rec, self._measured_count(study))
        return self.result(stop_reason)

    def _sampler_stop_reason(self, study: optuna.Study) -> str | None:
        should_stop = getattr(study.sampler, "should_stop", None)
        if should_stop is None:
            return None
        return should_stop(study, self.margin)

    def _waiting_or_running(self, study: optuna.Study, cand: Candidate) -> bool:
        params = self.space.params(cand)
        return any(t.params == params for t in study.get_trials(
            deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)))

    def _find_same(self, study: optuna.Study, trial: optuna.Trial) -> FrozenTrial | None:
        """A trial with the same setting that was measured (or is being measured by another worker).

        Ties between workers go to the lower trial number. A lower-numbered RUNNING trial whose
        parameters are not all written yet (another worker is between creating it and suggesting its
        values) is waited for, briefly: deciding before its values land would let both workers measure
        the same setting.
        """
        params = trial.params
        deadline = time.monotonic() + _PENDING_WAIT_S
        while True:
            best: FrozenTrial | None = None
            pending = False
            for t in study.get_trials(deepcopy=False):
                if t.number == trial.number:
                    continue
                if (t.state == TrialState.RUNNING and t.number < trial.number
                        and len(t.params) < len(params)):
                    pending = True
                    continue
                if t.params != params:
                    continue
                if t.user_attrs.get("measured") and t.state in (TrialState.COMPLETE, TrialState.FAIL):
                    return t
                if t.state == TrialState.RUNNING and t.number < trial.number and best is None:
                    best = t
            if best is not None or not pending or time.monotonic() > deadline:
                return best
            time.sleep(0.02)

    # -- results ------------------------------------------------------------------------------------
    def result(self, stop_reason: str = "") -> SearchResult:
        study = self.study
        assert study is not None
        records = self.records(study)
        measured = [r for r in records if r.measured]
        feasible = [r for r in measured if r.feasible and r.outcome is not None]
        _, baseline = self._baseline_state(records)
        pareto = _pareto(feasible)
        best: TrialRecord | None = None
        if feasible:
            if self.objective == "pareto":
                # one pick for best.json: the front's point with the lowest energy-delay product
                best = min(pareto, key=lambda r: r.outcome.time_to_target_s * r.outcome.energy_to_target_j)
            else:
                best = min(feasible, key=lambda r: scalar_score(r.outcome, self.objective))
        return SearchResult(
            study_name=self.study_name, storage_url=_redact(self.storage_url), objective=self.objective,
            budget_w=self.budget_w, constrained=self.constrained, tolerance=self.tolerance, space=self.space,
            target=self.target, records=records, best=best, baseline=baseline, pareto=pareto,
            stop_reason=stop_reason, protocol=self.protocol.describe(
                bool(getattr(self.device.clock, "virtual", False)),
                runs_step=bool(getattr(self.device.backend, "compute", True))),
            device_name=self.device.name, device_description=self.device.description,
            simulated=self.device.simulated, workload=getattr(self.workload, "name", str(self.workload)),
        )


def _pareto(records: list[TrialRecord]) -> list[TrialRecord]:
    """Feasible records not dominated in (time to target, energy to target), by time."""
    pts = sorted(records, key=lambda r: (r.outcome.time_to_target_s, r.outcome.energy_to_target_j))
    front: list[TrialRecord] = []
    best_e = math.inf
    for r in pts:
        if r.outcome.energy_to_target_j < best_e:
            front.append(r)
            best_e = r.outcome.energy_to_target_j
    return front


def iter_grid_chunks(space: SearchSpace, size: int = 4096) -> Iterator[list[Candidate]]:
    """The grid in chunks (for predictors that score the whole space)."""
    chunk: list[Candidate] = []
    for c in space.grid():
        chunk.append(c)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
