"""Where a study lives, and how a fleet of workers notices that one of them died.

:func:`open_storage` opens any SQLAlchemy URL as an :class:`optuna.storages.RDBStorage` (an SQLite file by
default, in WAL mode with write-locking transactions; ``postgresql://`` with whichever psycopg driver is
installed) or ``journal:<file>`` as a :class:`~optuna.storages.JournalStorage` (no server; shared file systems).

Dead workers (``kill -9``, power loss, Ctrl-C mid-measurement) leave a trial RUNNING. Their trials are failed
and retried through Optuna itself, at most :data:`MAX_RETRY` times per setting
(:class:`~optuna.storages.RetryHeartbeatStaleTrialCallback`), so a setting that kills its worker is given up
rather than retried forever:

* another host: the RDB storage's heartbeat. A worker beats every :data:`HEARTBEAT_INTERVAL_S` while it
  measures (:func:`heartbeat`; Optuna beats only inside ``study.optimize``, and the search asks and tells), and
  :func:`recover_dead_workers` calls Optuna's :func:`~optuna.storages.fail_stale_trials`, which fails a trial
  silent for the grace period and hands it to the storage's retry callback. Optuna 5's journal storage has
  no heartbeat, so a journal worker beats through a trial attribute (:data:`BEAT_ATTR`, a counter it bumps
  every :data:`HEARTBEAT_INTERVAL_S`), and another worker fails a trial whose counter it has seen unchanged
  for the grace period on its own clock (no two hosts' clocks are compared). A trial without the counter (an
  older edgetune's) is left RUNNING, as before: nothing says whether its worker lives.
* this host: a dead worker's pid is known at once, so :func:`recover_dead_workers` fails its trials without
  waiting for the grace period (a resume right after ``kill -9``), through the public ``study.tell``, and
  retries them with the same callback. "This host" is this boot of this kernel and pid namespace
  (:func:`worker_kernel`, which each trial records), not the host name: boards flashed from one image share it.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import itertools
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from edgetune.log import get_logger
from edgetune.power.state import pid_alive
from edgetune.search import records

__all__ = ["BEAT_ATTR", "GRACE_PERIOD_S", "HEARTBEAT_INTERVAL_S", "MAX_RETRY", "BeatingJournalStorage", "SearchError",
           "check_sqlite_file", "close_storage", "heartbeat", "in_memory", "live_trials", "open_storage",
           "recover_dead_workers", "redact", "retry_callback", "same_storage", "storage_file", "worker_id",
           "worker_kernel"]

_log = get_logger(__name__)

#: the trial attribute a journal worker bumps at each beat (module docs)
BEAT_ATTR = "edgetune_beat"
#: the clock a journal's beats are judged on (a test's to replace)
_now = time.monotonic
#: seconds between a measuring worker's heartbeats: a few database writes per minute, per worker
HEARTBEAT_INTERVAL_S = 20
#: seconds without a heartbeat before another worker fails the trial: three missed beats, so one slow
#: write (a busy database, a loaded host) is not taken for a death
GRACE_PERIOD_S = 3 * HEARTBEAT_INTERVAL_S
#: retries of a setting whose worker died (so a setting is attempted at most MAX_RETRY + 1 times): enough
#: for a power loss or a preempted job, and a setting that crashes its worker every time is given up
MAX_RETRY = 2
#: seconds an SQLite connection waits for another process's write lock before failing: longer than any
#: single commit of a busy fleet on one file
SQLITE_LOCK_TIMEOUT_S = 60
_MESSAGE_CHARS = 200  # a storage error's first line is cut here: one readable line, not a driver dump
#: Optuna's words for a storage whose tables another Optuna version set up (``RDBStorage``'s schema check), and
#: those of the case an upgrade fixes (an older schema; a newer one needs a newer Optuna)
_SCHEMA_MISMATCH = "is no longer compatible with the table schema"
_SCHEMA_UPGRADE = "optuna storage upgrade"
#: the first bytes of every SQLite 3 database file (the file format's documented header string)
SQLITE_HEADER = b"SQLite format 3\x00"


class SearchError(RuntimeError):
    """A search that cannot start or continue (storage unreachable, study mismatch): one line.

    ``problem``: where the storage is a file that holds no study (empty, damaged, another kind of file), the
    line's problem without its fix, for a caller that reads the file for another purpose (``--prior``);
    ``fix``: where the way out is the same for every caller (a folder this user cannot write), that way out."""

    def __init__(self, message: str, *, problem: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.problem = problem
        self.fix = fix


def redact(url: str) -> str:
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
    rest = url.split("://", 1)[1]
    for module, dialect in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"{dialect}://{rest}"
    raise SearchError("a PostgreSQL storage needs a driver: pip install 'edgetune[postgres]' (psycopg2-binary)")


def close_storage(storage: optuna.storages.BaseStorage) -> None:
    """Close an RDB storage's pooled connections now (a journal file has none to close).

    Closing the last connection to an SQLite file folds its write-ahead log into it. Left to the garbage
    collector, that happens at some later moment, in a process that goes on (a caller running ``edgetune
    search`` twice, the tests): a study file replaced in between could then be written into."""
    engine = getattr(storage, "engine", None)
    if engine is not None:
        engine.dispose()


def open_storage(url: str, *, heartbeat_s: int = HEARTBEAT_INTERVAL_S, grace_s: int | None = None,
                 max_retry: int = MAX_RETRY) -> optuna.storages.BaseStorage:
    """Open an Optuna storage, checking it is reachable now rather than at the first trial.

    An in-memory SQLite URL (``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:``: :func:`in_memory`) is a
    study in this process's memory, :class:`optuna.storages.InMemoryStorage`: each pooled connection of an RDB
    storage would open an empty database of its own.

    Args:
        url: ``journal:<path>`` for a journal file, else an SQLAlchemy URL (SQLite, PostgreSQL, ...).
        heartbeat_s: seconds between heartbeats of a measuring worker (RDB and journal storages).
        grace_s: seconds of silence before a trial is failed as stale (default three beats).
        max_retry: retries of a setting whose worker died before it is given up.

    Raises:
        SearchError: the storage cannot be opened (one line, password redacted).
    """
    given = url
    try:
        if url.startswith("journal:"):
            return _open_journal(url, heartbeat_s, grace_s)
        if in_memory(url):
            return optuna.storages.InMemoryStorage()
        url = _postgres_driver(url)
        if url.startswith("sqlite"):
            check_sqlite_file(url)
            # several processes on one file: wait for the lock instead of failing at once
            engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_LOCK_TIMEOUT_S}}
        else:
            engine_kwargs = {"pool_pre_ping": True}
        with warnings.catch_warnings():  # heartbeats and the retry callback are "experimental" since Optuna 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s,
                grace_period=grace_s or 3 * heartbeat_s,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry),
            )
        if url.startswith("sqlite"):
            _sqlite_wal(storage)
        return storage
    except SearchError:
        raise
    except Exception as exc:  # noqa: BLE001 - sqlalchemy/driver errors vary; the user needs one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if _SCHEMA_MISMATCH in first:  # reachable and whole: its tables are another Optuna version's
            made = first.split("(set up by ", 1)[-1].split(")", 1)[0] if "(set up by " in first else "another version"
            fix = (f"back it up, then upgrade it: optuna storage upgrade --storage '{redact(given)}'"
                   if _SCHEMA_UPGRADE in first else "update Optuna: pip install -U optuna")
            raise SearchError(f"storage {redact(given)}'s tables are in another schema than this Optuna "
                              f"({optuna.__version__}) reads (set up by {made}); {fix}") from None
        raise SearchError(f"cannot open storage {redact(given)}: {first[:_MESSAGE_CHARS]}; check the URL, that "
                          f"the server runs and accepts this user (or use the default SQLite file)") from None


class BeatingJournalStorage(optuna.storages.JournalStorage):
    """A journal storage whose workers beat through :data:`BEAT_ATTR` (module docs).

    Attributes:
        beat_s: seconds between a measuring worker's beats.
        grace_s: seconds a trial's counter may stay unchanged, as another worker sees it, before it is failed.
    """

    def __init__(self, backend: Any, beat_s: int, grace_s: int) -> None:
        super().__init__(backend)
        self.beat_s = int(beat_s)
        self.grace_s = int(grace_s)


def _open_journal(url: str, beat_s: int = HEARTBEAT_INTERVAL_S,
                  grace_s: int | None = None) -> optuna.storages.BaseStorage:
    """The journal file of ``url``: a file that is there but no journal (another file, a study.db) is one line
    that says so, not the decoder's error; one that is not there yet is a new journal."""
    from optuna.storages.journal import JournalFileBackend

    path = url[len("journal:"):].removeprefix("//")
    fix = "give the journal file an edgetune search wrote, or a new file's path for a new study"
    if os.path.isdir(path):
        problem = f"storage {url} is a folder, not a journal file"
        raise SearchError(f"{problem}; {fix}", problem=problem)
    try:
        return BeatingJournalStorage(JournalFileBackend(path), beat_s, grace_s or 3 * beat_s)
    except OSError as exc:
        raise SearchError(f"cannot open storage {url}: {exc.strerror or exc}; {fix}") from None
    except (ValueError, KeyError, TypeError) as exc:  # JSON (or UTF-8) that is not a journal's operations
        detail = str(exc).strip().splitlines()[0][:_MESSAGE_CHARS] if str(exc).strip() else type(exc).__name__
        problem = f"storage {url} is not an Optuna journal file ({detail})"
        raise SearchError(f"{problem}; nothing was written; {fix}", problem=problem) from None


def in_memory(url: str) -> bool:
    """Whether ``url`` is an in-memory SQLite database (``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:``,
    any driver): a study there ends with the process that opened it."""
    if not url.startswith("sqlite"):
        return False
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        database = make_url(url).database
    except ArgumentError:  # not a URL at all: open_storage says so
        return False
    return not database or database == ":memory:"


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL (None: not SQLite, in memory, or not a file URL)."""
    if not url.startswith("sqlite"):
        return None
    path = _sqlite_path(url)
    return Path(path) if path else None


def storage_file(url: str) -> Path | None:
    """The file behind a journal or SQLite URL, resolved (None: a server, or SQLite in memory)."""
    if url.startswith("journal:"):
        return Path(url[len("journal:"):].removeprefix("//")).resolve()
    path = sqlite_file(url)
    return path.resolve() if path is not None else None


def same_storage(a: str, b: str) -> bool:
    """Whether two storage URLs name the same storage: the same file for journal and SQLite URLs (relative
    paths taken from the working directory), else the same URL but for its password, which either may have
    had :func:`redact` take out (best.json and a prior's source keep the URL redacted)."""
    fa, fb = storage_file(a), storage_file(b)
    return fa == fb if fa is not None or fb is not None else redact(a) == redact(b)


def _sqlite_path(url: str) -> str | None:
    """The file of an SQLite URL (None: in memory, or not a file URL)."""
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    return None if not database or database == ":memory:" or database.startswith("file:") else database


def check_sqlite_file(url: str) -> None:
    """Refuse an existing SQLite study file that is empty or damaged, before anything writes to it.

    SQLite takes a zero-byte file for a new, empty database, so the study would silently start again and
    its results be overwritten; a file damaged mid-way fails later, deep inside SQLAlchemy. Both are refused
    here with one line, and nothing is written. A file that does not exist yet is a new study.

    Raises:
        SearchError: the file is empty, not an SQLite database, or fails SQLite's ``quick_check``.
    """
    import sqlite3

    path = _sqlite_path(url)
    if path is None or not os.path.exists(path):
        return
    fix = "nothing was written; move it away to start a new study, or put back a good copy"
    if os.path.isdir(path):
        problem = f"storage {path} is a folder, not a study file"
        raise SearchError(f"{problem}; {fix}", problem=problem)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise SearchError(f"cannot read storage {path}: {exc.strerror or exc}") from None
    if size == 0:
        problem = f"storage {path} is empty (0 bytes), not a study"
        raise SearchError(f"{problem}: {fix}", problem=problem)
    if header != SQLITE_HEADER:
        problem = f"storage {path} is not an SQLite database (damaged or another file)"
        raise SearchError(f"{problem}: {fix}", problem=problem)
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=SQLITE_LOCK_TIMEOUT_S)) as db:
            verdict = [row[0] for row in db.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        if _cannot_open(exc):  # the file is whole: this process cannot open it where it is
            folder = os.path.dirname(os.path.abspath(path))
            problem = (f"SQLite cannot open storage {path} here ({exc}): a study file is read and written with a "
                       f"-wal and a -shm file beside it, so its folder {folder} must be writable by this user")
            fix = "run as a user who may write there, or copy the folder somewhere writable and give that"
            raise SearchError(f"{problem}; nothing was written: {fix}", problem=problem, fix=fix) from None
        verdict = [str(exc)]
    if verdict != ["ok"]:
        detail = " ".join(" ".join(verdict).split())[:_MESSAGE_CHARS]  # quick_check lists problems over lines
        problem = f"storage {path} is damaged ({detail})"
        raise SearchError(f"{problem}: {fix}", problem=problem)


def _cannot_open(exc: Exception) -> bool:
    """SQLite's SQLITE_CANTOPEN (its name on Python >= 3.11, its text before): the file, or the -wal and -shm
    files a write-ahead-logged database needs beside it, cannot be opened here; not damage."""
    return getattr(exc, "sqlite_errorname", None) == "SQLITE_CANTOPEN" or str(exc) == "unable to open database file"


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


def worker_id() -> str:
    """This worker in trial records: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


#: the kernel's random id of this boot: two machines (boards flashed from one image share a host name) never
#: share it, and a reboot changes it
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
#: this process's pid namespace: containers on one kernel (with the host's name, ``--uts=host``) number their
#: processes apart
_PID_NAMESPACE = "/proc/self/ns/pid"


def worker_kernel() -> str:
    """Where this worker's pid means a process: this boot of this kernel and this pid namespace (``boot/ns``);
    "" where unknown (not Linux). Trials record it (:func:`records.write_start`): a host name alone is no proof,
    since identical boards flashed from one image, and containers sharing the host's name, share it."""
    try:
        return f"{_BOOT_ID.read_text().strip()}/{os.readlink(_PID_NAMESPACE)}"
    except OSError:
        return ""


def _pid_here(trial: FrozenTrial, host: str, kernel: str) -> int | None:
    """The pid of ``trial``'s worker where it names a process of this kernel and pid namespace (else None): the
    trial's recorded kernel is ours, or, for a trial that records none (an older edgetune's), its host is."""
    h, _, pid = records.worker_of(trial).rpartition(":")
    recorded = records.kernel_of(trial)
    here = recorded == kernel if recorded else h == host
    return int(pid) if here and pid.isdigit() else None


RetryCallback = Callable[[optuna.Study, FrozenTrial], None]


def retry_callback(storage: optuna.storages.BaseStorage) -> RetryCallback:
    """The callback that retries a dead worker's trial: the storage's own (RDB, :func:`open_storage`), else
    one capped at :data:`MAX_RETRY` (journal and in-memory storages have none)."""
    own = getattr(storage, "get_heartbeat_stale_trial_callback", None)
    callback = own() if own is not None else None
    if callback is not None:
        return callback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def _heartbeat_interval_s(storage: optuna.storages.BaseStorage) -> int | None:
    get = getattr(storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


@contextlib.contextmanager
def heartbeat(storage: optuna.storages.BaseStorage, study: optuna.Study, trial_number: int) -> Iterator[None]:
    """Beat for trial ``trial_number`` from a daemon thread while the block runs (storages with a heartbeat).

    Optuna beats only inside ``study.optimize``; the search asks and tells, so it beats here through the
    storage's public ``record_heartbeat``; on a :class:`BeatingJournalStorage` it bumps the trial's
    :data:`BEAT_ATTR`. A worker killed mid-trial stops beating, and the others fail and retry its trial after
    the grace period (:func:`recover_dead_workers`).
    """
    journal = isinstance(storage, BeatingJournalStorage)
    interval = storage.beat_s if isinstance(storage, BeatingJournalStorage) else _heartbeat_interval_s(storage)
    if not interval:
        yield
        return
    study_id = storage.get_study_id_from_name(study.study_name)
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial_number)
    beats = itertools.count()

    def record() -> None:
        if journal:
            storage.set_trial_user_attr(trial_id, BEAT_ATTR, next(beats))
        else:
            storage.record_heartbeat(trial_id)

    record()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            with contextlib.suppress(Exception):  # a missed beat is harmless; the next one retries
                record()

    thread = threading.Thread(target=beat, daemon=True, name="edgetune-heartbeat")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5 * interval)


def fail_and_retry(study: optuna.Study, trial_number: int, retry: RetryCallback) -> bool:
    """Fail a trial that did not finish (its worker died or was interrupted) and hand it to ``retry``.

    Returns False when the trial had finished meanwhile (another worker failed it first: nothing to do).
    """
    try:
        study.tell(trial_number, state=TrialState.FAIL)
    except (ValueError, optuna.exceptions.UpdateFinishedTrialError):  # finished already, or another worker won
        return False
    failed = next(t for t in study.get_trials(deepcopy=False) if t.number == trial_number)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retry(study, copy.deepcopy(failed))  # the callback extends the trial's retry history in place
    return True


def recover_dead_workers(study: optuna.Study, storage: optuna.storages.BaseStorage, retry: RetryCallback) -> int:
    """Fail and retry RUNNING trials whose worker died; returns how many were found on this host.

    On this host a worker's pid says at once whether it lives; elsewhere Optuna's heartbeat decides
    (:func:`optuna.storages.fail_stale_trials`, which calls the storage's retry callback itself).
    """
    host, kernel = socket.gethostname(), worker_kernel()
    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = _pid_here(t, host, kernel)
        dead = pid is not None and pid != os.getpid() and not pid_alive(pid)
        if dead and fail_and_retry(study, t.number, retry):
            _log.warning("trial %d: worker %s died mid-trial; failed and queued again", t.number, records.worker_of(t))
            n += 1
    if _heartbeat_interval_s(storage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    if isinstance(storage, BeatingJournalStorage):
        for t in _silent(study, storage, host, kernel):
            if fail_and_retry(study, t.number, retry):
                _log.warning("trial %d: worker %s has not beaten for %d s; failed and queued again", t.number,
                             records.worker_of(t), storage.grace_s)
    return n


#: per (storage, study name, trial number) of a RUNNING trial: the beat counter last seen, and when (this
#: process's monotonic clock) it was first seen at that value
_SEEN: dict[tuple[int, str, int], tuple[Any, float]] = {}


def _silent(study: optuna.Study, storage: BeatingJournalStorage, host: str, kernel: str) -> list[FrozenTrial]:
    """The RUNNING trials of other hosts whose beat counter this process has seen unchanged for the grace
    period (trials without one are not judged)."""
    now = _now()
    silent = []
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    keys = {(id(storage), study.study_name, t.number) for t in running}
    for gone in [k for k in _SEEN if k[:2] == (id(storage), study.study_name) and k not in keys]:
        del _SEEN[gone]  # finished: nothing more to judge
    for t in running:
        beat = t.user_attrs.get(BEAT_ATTR)
        if beat is None or _pid_here(t, host, kernel) is not None:
            continue
        key = (id(storage), study.study_name, t.number)
        seen = _SEEN.get(key)
        if seen is None or seen[0] != beat:
            _SEEN[key] = (beat, now)
        elif now - seen[1] >= storage.grace_s:
            silent.append(t)
    return silent


def live_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[FrozenTrial]:
    """The RUNNING trials of other workers known to be alive: on this host, those whose worker's pid lives; from
    another host, every one where the storage has a heartbeat, and on a journal those that beat (a silent one
    is failed after the grace period, :func:`recover_dead_workers`). Trials without a beat from other hosts
    are left out: nothing says whether their worker lives, and one that died would be counted for ever."""
    host, kernel = socket.gethostname(), worker_kernel()
    beats = bool(_heartbeat_interval_s(storage))
    journal = isinstance(storage, BeatingJournalStorage)
    live = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = _pid_here(t, host, kernel)
        if pid == os.getpid():
            continue
        if pid is not None:
            alive = pid_alive(pid)
        elif journal:  # beating, and not silent for the grace period (recover_dead_workers fails those)
            alive = BEAT_ATTR in t.user_attrs
        else:
            alive = beats and bool(records.worker_of(t))
        if alive:
            live.append(t)
    return live
