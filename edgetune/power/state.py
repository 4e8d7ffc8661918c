"""Safe restore: every knob edgetune changes goes back to the value it had, whatever ends the run.

Three layers, each covering what the one before cannot:

1. Before a knob's first write, its original state is written to a state file (atomic rename, fsync).
   The original is the knob's raw *snapshot* - for a devfreq GPU both ``min_freq`` and ``max_freq``,
   for cpufreq every policy's limits, for NVML whether clocks were locked - not just one value, so a
   restore returns the governor's range rather than pinning the frequency that happened to be current.
2. While any knob is changed, SIGINT, SIGTERM and SIGHUP handlers (chained to the ones found) and an
   ``atexit`` hook restore the originals; ``Device.restore()`` (normal exit, exceptions through
   ``with device.restoring()``) does the same and removes the entries. A restore that fails is said once:
   by the handler for SIGTERM and SIGHUP, which nothing else reports; for SIGINT, which Python turns into a
   KeyboardInterrupt that unwinds the run, by the run's own restore (or, if the run restores nothing, by
   the exit hook).
3. After ``kill -9`` (or a power cut) nothing in-process can run: the state file stays behind, and the
   next ``edgetune`` start - or ``edgetune restore`` - reads it, reopens the same device (platform spec and
   sysfs root are in the file) and writes the originals back, saying so.

A state file that does not parse, fails its checksum, or names values the device does not accept is
reported and set aside (``*.corrupt``), never applied blindly. Paths never come from the file: it holds
knob names and values; each backend maps them to the files it discovered itself.

State directory: ``$EDGETUNE_STATE_DIR``, else ``$XDG_STATE_HOME/edgetune``, else
``~/.local/state/edgetune``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgetune.log import get_logger
from edgetune.power.base import (
    DeviceError,
    Knob,
    KnobValue,
    KnobWriteError,
    RestoreError,
    format_value,
    restore_order,
)

__all__ = [
    "STATE_ENV",
    "DeviceIdentity",
    "RecoveryAction",
    "RestorableKnob",
    "StateFileError",
    "StateTracker",
    "recover",
    "recover_actions",
    "restore_defaults",
    "state_dir",
]

STATE_ENV = "EDGETUNE_STATE_DIR"
STATE_VERSION = 1
#: Hex digits of the identity hash in a state file's name: unique per device, short enough to read.
_KEY_DIGEST_CHARS = 12
_SIGNALS = tuple(s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))

Snapshot = dict[str, Any]

_log = get_logger(__name__)


class StateFileError(DeviceError):
    """A state file that cannot be trusted (unparseable, checksum mismatch, unknown values)."""


def state_dir() -> Path:
    """Where state files live (created on first write)."""
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "edgetune"


def _boot_id(root: str | None) -> str | None:
    """The kernel's boot id (a reboot resets every clock, so a state file from before it is moot)."""
    path = Path(root or "/") / "proc/sys/kernel/random/boot_id"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """True while a process with this id runs on this host (also one we may not signal)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class DeviceIdentity:
    """Which device a state file belongs to: enough to reopen it and to check it is the same one.

    Attributes:
        spec: the device spec that opens it (``jetson``, ``nvml:0``, ``rapl``).
        description: the hardware found (``NVIDIA Jetson AGX Orin Developer Kit``); checked on recovery.
        root: the sysfs root for sysfs platforms (None for NVML).
        serial: a hardware identity where the platform has one (a GPU UUID), checked on recovery.
    """

    spec: str
    description: str
    root: str | None = None
    serial: str = ""

    def key(self) -> str:
        digest = hashlib.sha1(f"{self.spec}|{self.root}|{self.serial}".encode()).hexdigest()[:_KEY_DIGEST_CHARS]
        return f"{self.spec.replace(':', '-')}-{digest}"

    def open_options(self) -> dict[str, Any]:
        return {"root": self.root} if self.root is not None else {}


# ---------------------------------------------------------------------------------------------- knob


class RestorableKnob(Knob):
    """A hardware knob whose original is a raw snapshot, kept in a state file while it is changed.

    Args (beyond :class:`~edgetune.power.base.Knob`'s):
        snapshot: returns the knob's full original state as JSON-able data.
        restore_snapshot: writes such a snapshot back; validates it first and raises ValueError for
            values the hardware would not accept (a snapshot may come from a file after a crash).
        tracker: the device's :class:`StateTracker`, which records snapshots before the first write.
        default_snapshot: returns the platform's documented default state as a snapshot that
            ``restore_snapshot`` accepts (the full devfreq/cpufreq range, every core online, the default
            nvpmodel mode, NVML clocks unlocked and the default power limit); None where the platform
            documents none. ``edgetune restore --defaults`` applies it (:func:`restore_defaults`).
        describe_snapshot: says what a snapshot puts back, for the user (``gpu_freq 306 MHz..624.75 MHz
            (the governor's range)``); None: the knob and the value it read before the first change.
    """

    def __init__(
        self,
        name: str,
        unit: str,
        values: Sequence[KnobValue],
        *,
        snapshot: Callable[[], Snapshot],
        restore_snapshot: Callable[[Snapshot], None],
        tracker: StateTracker | None = None,
        default_snapshot: Callable[[], Snapshot] | None = None,
        describe_snapshot: Callable[[Snapshot], str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, unit, values, **kwargs)
        self.default_snapshot = default_snapshot
        self.describe_snapshot = describe_snapshot
        self.snapshot = snapshot
        self.restore_snapshot = restore_snapshot
        self.tracker = tracker
        self._saved: Snapshot | None = None
        if tracker is not None and self.on_first_change is None:
            self.on_first_change = tracker.record

    def set(self, value: KnobValue) -> None:
        """Set ``value``; a write the platform rejects leaves the original in place and says so."""
        try:
            super().set(value)
        except DeviceError as exc:  # a refused write, or a knob file that cannot be read on the way
            if not self._changed:
                raise
            try:
                untouched = self._saved is not None and self.snapshot() == self._saved
            except (DeviceError, OSError, ValueError):
                untouched = False
            try:
                if untouched:  # refused before anything changed (no permission, not supported)
                    self._forget()
                else:
                    self.restore()
                tail = f"; {self.name} is back at its original value"
            except RestoreError as again:  # says where the original is kept and how to finish
                self.shown(again)
                tail = f"; restoring the original failed too: {again}"
            except (DeviceError, OSError, ValueError) as again:
                tail = f"; restoring the original failed too ({again}); run `edgetune restore`"
            raise KnobWriteError(f"{exc}{tail}") from None

    def restore(self) -> bool:
        """Write the original back; a :class:`RestoreError` (one line: the knob, its problem, the state file
        that keeps the original) where that fails, the knob then still counted as changed."""
        if not self._changed:
            return False
        try:
            if self._saved is not None:
                self.restore_snapshot(self._saved)
            elif self._original is not None:  # no tracker: fall back to the single remembered value
                assert self._write is not None
                self._write(self._original)
        except (DeviceError, OSError, ValueError, TypeError, KeyError) as exc:
            tracker = self.tracker
            kept = str(tracker.path) if tracker is not None and tracker.keeps(self) else None
            raise RestoreError([(self.name, str(exc))], kept, tracker.identity.spec if tracker else "") from None
        self._forget()
        return True

    def shown(self, error: RestoreError) -> None:
        """``error`` went to the user (the run's own restore raised it to its caller): the exit's retry, which
        finds the same failure, does not say it again. The signal handler's restore, which nothing else
        reports, says it (:func:`_restore_all_active`)."""
        if self.tracker is not None:
            self.tracker.raised(error)

    def _forget(self) -> None:
        self._changed = False
        self._original = None
        self._saved = None
        if self.tracker is not None:
            self.tracker.forget(self)


# ---------------------------------------------------------------------------------------------- tracker

_active: list[StateTracker] = []
_previous_handlers: dict[int, Any] = {}
_lock = threading.RLock()
_atexit_registered = False


def _say(line: str) -> None:
    """Tell the user about knobs restored (or not) on their behalf: a warning, as knobs were left changed
    by a run that did not finish normally. The CLI's log handler prints it; without one, Python's
    last-resort handler writes it to standard error."""
    _log.warning(line)


def _restore_all_active(why: str, *, say_failures: bool = True) -> None:
    """Restore every tracked device's changed knobs now, saying what was restored. ``say_failures``: say a
    restore that failed (the state file stays for recovery either way); False where the program's own restore
    will raise the same failure to the user (a KeyboardInterrupt unwinding it), so that it is said once."""
    with _lock:
        trackers = list(_active)
    for tracker in trackers:
        try:
            names = tracker.restore_all()
        except RestoreError as exc:  # the file stays for recovery; the line says so
            if say_failures and not tracker.told(exc):  # told: the run's own restore raised it to the user
                _say(f"{why}: {exc}")
                tracker.raised(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - a handler must never raise; the file stays for recovery
            _say(f"restoring knobs on {tracker.identity.spec} after {why} failed: {exc}; "
                 f"run `edgetune restore`")
            continue
        if names:
            _say(f"{why}: restored {', '.join(names)} on {tracker.identity.spec}")


def _handler(signum: int, frame: Any) -> None:
    previous = _previous_handlers.get(signum, signal.SIG_DFL)  # before restoring: that uninstalls
    # Python's SIGINT handler raises KeyboardInterrupt: the program unwinds through its own restore, which
    # retries a failed knob and raises the failure to the user (and the exit hook says it if nothing does)
    _restore_all_active(signal.Signals(signum).name, say_failures=previous is not signal.default_int_handler)
    _uninstall_handlers()
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        # die of the same signal, as the process would have without us (exit status 128 + signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_restore_all_active, "exit")
        _atexit_registered = True
    if _previous_handlers or threading.current_thread() is not threading.main_thread():
        return  # installed already, or not allowed here (atexit still covers normal exit)
    for name in _SIGNALS:
        signum = getattr(signal, name)
        previous = signal.getsignal(signum)
        if previous == signal.SIG_IGN:
            continue  # ignored (nohup, a background job): the signal will not end the run
        _previous_handlers[signum] = previous
        signal.signal(signum, _handler)


def _uninstall_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous_handlers.items()):
        if signal.getsignal(signum) is _handler:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    _previous_handlers.clear()


class StateTracker:
    """Keeps one device's changed knobs in its state file, and the signal handlers in place meanwhile.

    Backends create one per opened device and pass it to their :class:`RestorableKnob` s.
    """

    def __init__(self, identity: DeviceIdentity, directory: Path | None = None) -> None:
        self.identity = identity
        self.directory = directory
        self._knobs: dict[str, RestorableKnob] = {}
        self._entries: dict[str, dict[str, Any]] = {}
        #: knob -> the problem its failed restore last raised (so the exit's retry does not say it again)
        self._raised: dict[str, str] = {}

    @property
    def path(self) -> Path:
        return (self.directory or state_dir()) / f"{self.identity.key()}.json"

    @property
    def changed(self) -> list[str]:
        return list(self._knobs)

    def record(self, knob: Knob, original: KnobValue) -> None:
        """Before ``knob``'s first write: save its snapshot to the state file (the Knob hook)."""
        assert isinstance(knob, RestorableKnob)
        with _lock:
            if not self._entries:
                self._take_over_leftover()
            snap = knob.snapshot()
            knob._saved = snap
            self._knobs[knob.name] = knob
            self._entries[knob.name] = {"original": original, "unit": knob.unit, "snapshot": snap}
            self._save()
            if self not in _active:
                _active.append(self)
            _install_handlers()

    def forget(self, knob: Knob) -> None:
        """``knob`` is back at its original: drop it; with nothing left, remove the file and handlers."""
        with _lock:
            self._knobs.pop(knob.name, None)
            if self._entries.pop(knob.name, None) is None:
                return
            if self._entries:
                self._save()
                return
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            if self in _active:
                _active.remove(self)
            if not _active:
                _uninstall_handlers()

    def keeps(self, knob: Knob) -> bool:
        """Whether the state file holds ``knob``'s original."""
        return knob.name in self._entries

    def raised(self, error: RestoreError) -> None:
        """``error`` went to a caller (or the user): remember what it said of each knob."""
        self._raised.update(error.failures)

    def told(self, error: RestoreError) -> bool:
        """Whether every knob's problem in ``error`` was raised before, word for word."""
        return all(self._raised.get(name) == why for name, why in error.failures)

    def restore_all(self) -> list[str]:
        """Restore every changed knob, most recently changed first; names restored. Every knob is attempted;
        then one :class:`RestoreError` names those not restored (their originals stay in the state file)."""
        restored: list[str] = []
        failed: list[RestoreError] = []
        first_error: BaseException | None = None
        for knob in reversed(list(self._knobs.values())):
            try:
                if knob.restore():
                    restored.append(knob.name)
            except RestoreError as exc:
                failed.append(exc)
            except Exception as exc:  # noqa: BLE001 - restore the rest, then report the first failure
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        if failed:
            raise RestoreError.combine(failed, self.identity.spec)
        return restored

    def _take_over_leftover(self) -> None:
        """A file for this device from another process: refuse if it is alive, else restore it first."""
        if not self.path.exists():
            return
        try:
            state = load_state(self.path)
        except StateFileError:
            return  # corrupt: recovery reports it; our fresh record replaces it
        pid = int(state.get("pid", 0))
        if pid != os.getpid() and pid_alive(pid) and state.get("boot_id") == _boot_id(self.identity.root):
            raise KnobWriteError(
                f"another edgetune run (pid {pid}) has changed knobs on {self.identity.spec}; "
                f"wait for it to finish, or stop it and run `edgetune restore`"
            )
        recover(paths=[self.path])

    def _save(self) -> None:
        body = {
            "version": STATE_VERSION,
            "pid": os.getpid(),
            "boot_id": _boot_id(self.identity.root),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "device": asdict(self.identity),
            "knobs": self._entries,
        }
        _atomic_write_json(self.path, body)


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _atomic_write_json(path: Path, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dict(body, sha256=_checksum(body))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable too
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def load_state(path: Path) -> dict[str, Any]:
    """Parse and check a state file; :class:`StateFileError` (one line) when it cannot be trusted."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFileError(f"state file {path} is unreadable ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise StateFileError(f"state file {path} does not hold a JSON object")
    claimed = data.pop("sha256", None)
    if claimed != _checksum(data):
        raise StateFileError(f"state file {path} fails its checksum (edited or partly written)")
    if data.get("version") != STATE_VERSION:
        raise StateFileError(f"state file {path} has version {data.get('version')!r}, expected {STATE_VERSION}")
    device, knobs = data.get("device"), data.get("knobs")
    if not isinstance(device, dict) or not isinstance(device.get("spec"), str) or not isinstance(knobs, dict):
        raise StateFileError(f"state file {path} lacks its device or knobs")
    for name, entry in knobs.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("snapshot"), dict):
            raise StateFileError(f"state file {path}: knob {name!r} has no snapshot")
    return data


# ---------------------------------------------------------------------------------------------- recovery


def _set_aside(path: Path) -> Path:
    """Move an untrusted state file to ``<name>.corrupt-<time>[-<n>]``, never over an earlier one.

    The name holds the second it happened; files set aside in the same second get ``-1``, ``-2`` ...
    (``os.link`` fails rather than replace an existing name, so two processes cannot both take one).
    """
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in itertools.count():
        target = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n else ""))
        try:
            os.link(path, target)
        except FileExistsError:
            continue
        except OSError:  # no hard links here (some file systems): a rename, checked first
            if target.exists():
                continue
            with contextlib.suppress(OSError):
                os.replace(path, target)
            return target
        with contextlib.suppress(OSError):
            os.unlink(path)
        return target
    raise AssertionError("unreachable")  # pragma: no cover - itertools.count never ends


@dataclass(frozen=True)
class RecoveryAction:
    """One thing recovery did, or could not do, with one state file.

    Attributes:
        message: the line for the user.
        settled: no knob of this file may still be changed (restored, or reset by a reboot).
        spec: the device the file was for ("" where the file does not say).
        knobs: the knobs that may still be changed (empty when settled, or when an unreadable file does
            not say which).
    """

    message: str
    settled: bool
    spec: str = ""
    knobs: tuple[str, ...] = ()


def _named_in(path: Path) -> tuple[str, tuple[str, ...]]:
    """The device spec and knob names an untrusted state file claims (best effort, for the message only:
    nothing is applied from it)."""
    try:
        data = json.loads(path.read_text(errors="replace"))
        spec = data.get("device", {}).get("spec", "")
        return (spec if isinstance(spec, str) else ""), tuple(str(k) for k in data.get("knobs", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        return "", ()


def recover_actions(
    *,
    paths: Sequence[Path] | None = None,
    open_device: Callable[..., Any] | None = None,
) -> list[RecoveryAction]:
    """Restore the knobs that state files left behind by runs that could not restore them (kill -9).

    Safe to call at every start: files of live runs are left alone, files from before a reboot are
    dropped (the reboot reset the clocks), corrupt files are set aside (never applied) and reported with
    the knobs they name, which may still be changed. One :class:`RecoveryAction` per file acted on.
    """
    if open_device is None:
        from edgetune.power.registry import open_device  # late: registry imports the platforms

    if paths is None:
        directory = state_dir()
        paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    actions: list[RecoveryAction] = []

    for path in paths:
        try:
            state = load_state(path)
        except StateFileError as exc:
            if not path.exists():
                continue
            spec, names = _named_in(path)
            moved = _set_aside(path)
            left = (f"{', '.join(names)} on {spec} may still be changed" if names and spec else
                    "the knobs it held may still be changed")
            actions.append(RecoveryAction(f"{exc}; not used, moved to {moved.name}; {left}", False, spec, names))
            continue
        device_info = state["device"]
        identity = DeviceIdentity(
            spec=device_info["spec"],
            description=str(device_info.get("description", "")),
            root=device_info.get("root"),
            serial=str(device_info.get("serial", "")),
        )
        knobs_state: dict[str, dict[str, Any]] = state["knobs"]
        names = tuple(knobs_state)
        pid = int(state.get("pid", 0) or 0)
        boot = _boot_id(identity.root)
        if state.get("boot_id") and boot and state["boot_id"] != boot:
            path.unlink(missing_ok=True)
            actions.append(RecoveryAction(f"dropped the state file of {identity.spec} from before the last reboot "
                                          f"(the reboot reset its clocks)", True, identity.spec))
            continue
        if pid != os.getpid() and pid_alive(pid):
            continue  # a live run owns it and restores it itself
        try:
            device = open_device(identity.spec, **identity.open_options())
        except DeviceError as exc:
            actions.append(RecoveryAction(f"cannot restore knobs left changed on {identity.spec} (root "
                                          f"{identity.root}): {exc}; state file kept at {path}", False,
                                          identity.spec, names))
            continue
        try:
            if identity.description and device.description != identity.description:
                moved = _set_aside(path)
                actions.append(RecoveryAction(
                    f"state file {path.name} is for {identity.description!r} but {identity.spec} is now "
                    f"{device.description!r}; not used, moved to {moved.name}", False, identity.spec, names))
                continue
            done, failed, failed_names = [], [], []
            for name in restore_order(knobs_state):  # the power mode first: it resets the clocks under it
                entry = knobs_state[name]
                knob = device.knobs.get(name)
                if not isinstance(knob, RestorableKnob):  # its original stays in the file for a later restore
                    failed.append(f"{name} ({_not_here(device, name)})")
                    failed_names.append(name)
                    continue
                try:
                    knob.restore_snapshot(entry["snapshot"])
                    original = entry.get("original")
                    if knob.describe_snapshot is not None:  # what was put back: a range, not the clock it ran at
                        done.append(knob.describe_snapshot(entry["snapshot"]))
                    else:
                        done.append(f"{name}={format_value(original, knob.unit)}" if original is not None else name)
                except (ValueError, TypeError, KeyError) as exc:
                    failed.append(f"{name} (state file value not accepted: {exc})")
                    failed_names.append(name)
                except (DeviceError, OSError) as exc:
                    failed.append(f"{name} ({exc})")
                    failed_names.append(name)
            if failed:
                actions.append(RecoveryAction(f"restore on {identity.spec} incomplete: {'; '.join(failed)}; state "
                                              f"file kept at {path}", False, identity.spec, tuple(failed_names)))
                if done:
                    actions.append(RecoveryAction(f"restored {', '.join(done)} on {identity.spec}", True,
                                                  identity.spec))
                continue
            path.unlink(missing_ok=True)
            actions.append(RecoveryAction(f"restored {', '.join(done)} on {identity.spec} ({device.description}), "
                                          f"left changed by an interrupted edgetune run (pid {pid})", True,
                                          identity.spec))
        finally:
            with contextlib.suppress(Exception):
                device.close()
    return actions


def _not_here(device: Any, name: str) -> str:
    """Why ``device`` as opened now has no knob ``name`` to write a state file's original to: the device's note
    on the knob it left out (``Device.missing_knobs``: the file that is gone and what to do), then `edgetune
    restore` again; else that it was not found."""
    note = getattr(device, "missing_knobs", {}).get(name)
    if note:
        return f"{note}; then run `edgetune restore` again"
    return (f"{device.name} has no such knob now; `edgetune devices` shows what it found, and `edgetune restore` "
            f"writes it back once it is there")


def recover(
    report: Callable[[str], None] = _say,
    *,
    paths: Sequence[Path] | None = None,
    open_device: Callable[..., Any] | None = None,
) -> list[str]:
    """:func:`recover_actions`, each message passed to ``report``; returns the messages."""
    lines = [a.message for a in recover_actions(paths=paths, open_device=open_device)]
    for line in lines:
        report(line)
    return lines


def restore_defaults(device: Any, changed: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """Put every knob of ``device`` that has a documented default back to it (``edgetune restore --defaults``).

    The power mode goes first (nvpmodel sets clock caps and online cores itself), then the rest. Nothing
    is recorded in a state file: this is a reset, not a change to undo. Returns (knobs reset, problems:
    a knob whose reset failed, a writable knob without a documented default, or one of ``changed``, the knobs
    a state file says may still be changed, that the device as opened lacks, with why: :func:`_not_here`).
    """
    knobs = [device.knobs[name] for name in restore_order(device.knobs)]
    done: list[str] = []
    problems = [f"{name} ({_not_here(device, name)})" for name in dict.fromkeys(changed) if name not in device.knobs]
    for knob in knobs:
        default = getattr(knob, "default_snapshot", None)
        if default is None:
            if knob.writable:
                problems.append(f"{knob.name} (no documented default on {device.name})")
            continue
        try:
            knob.restore_snapshot(default())
        except (ValueError, TypeError, KeyError, DeviceError, OSError) as exc:
            problems.append(f"{knob.name} ({exc})")
        else:
            done.append(knob.name)
    return done, problems


def pending() -> list[Path]:
    """State files present now (for ``edgetune restore`` to say there is nothing to do)."""
    directory = state_dir()
    return sorted(directory.glob("*.json")) if directory.is_dir() else []

