"""Small helpers for the sysfs platforms (Jetson, RAPL): a configurable root, fast reads, checked writes.

Every path a backend touches is found under one root, ``EDGETUNE_SYSFS_ROOT`` (default ``/``) or the
``root=`` option, so the whole stack runs against a copy of a board's tree (the tests' fake trees, or a
user's tree captured for a bug report). Paths are always discovered by listing the tree; none is built
from user input.

:class:`FastReader` keeps a file open and re-reads it with ``os.pread`` (one syscall, no open/close per
sample): sysfs regenerates an attribute's text on every read at offset 0, so one open handle serves a
whole run, fast enough for >= 1 kHz sampling of a dozen rails from Python.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetune.power.base import DeviceError, KnobWriteError
from edgetune.power.knobs import knob_unit
from edgetune.power.state import RestorableKnob, StateTracker

__all__ = [
    "ROOT_ENV",
    "CpufreqPolicy",
    "FastReader",
    "cpu_freq_knob",
    "find_cpufreq_policies",
    "is_root",
    "knob_read_error",
    "open_reader",
    "read_int",
    "read_knob",
    "read_knob_text",
    "read_text",
    "sysfs_root",
    "writable",
    "write_checked",
]

ROOT_ENV = "EDGETUNE_SYSFS_ROOT"

#: the fix for a permission problem, in one line
ROOT_FIX = "run edgetune as root (sudo edgetune ...)"
#: the fix for a knob file that is gone or reads nonsense (an unloaded driver, a removed device, a changed tree)
BOARD_FIX = "check that the board's driver for it is loaded (`edgetune devices` lists the knob files it finds)"

#: Bytes read from a sysfs attribute: its text is one number or a short word (a rail reads "5072\n").
_ATTRIBUTE_BYTES = 64
#: Characters of a malformed attribute shown in an error: enough to recognise it, one line.
_SHOWN_CHARS = 40
#: errnos of a write to a path that is no knob file (any more): gone, a directory, a path through a non-directory
_NOT_A_KNOB_FILE = (errno.ENOENT, errno.EISDIR, errno.ENOTDIR)
#: Step (kHz) of the cpu_freq table offered where the driver publishes none (intel_pstate, amd-pstate).
_PSTATE_STEP_KHZ = 100_000


def sysfs_root(root: str | os.PathLike | None = None) -> Path:
    """The root the sysfs backends read: ``root`` if given, else ``$EDGETUNE_SYSFS_ROOT``, else ``/``."""
    value = os.fspath(root) if root is not None else os.environ.get(ROOT_ENV, "") or "/"
    path = Path(value)
    if not path.is_dir():
        raise DeviceError(f"sysfs root {value!r} is not a directory; set {ROOT_ENV} to a board's tree or unset it")
    return path


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def read_text(path: Path) -> str:
    """The stripped text of a sysfs attribute (device-tree strings end in NUL: stripped too)."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace").strip().strip("\x00").strip()


def parse_int(text: str, path: Path | str) -> int:
    """An attribute's integer value; a ValueError naming the file for empty or non-numeric text."""
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        raise ValueError(f"{path}: expected a number, read {text[:_SHOWN_CHARS]!r}") from None


def read_int(path: Path) -> int:
    return parse_int(read_text(path), path)


def _os_reason(exc: OSError) -> str:
    """``ENOENT: No such file or directory``: the errno's name and the kernel's words."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return f"{errno.errorcode.get(exc.errno or 0, 'error')}: {reason}"


def read_knob(path: Path, what: str, fix: str = BOARD_FIX) -> int:
    """A knob file's integer value, as :func:`read_int`; a :class:`DeviceError` with one line naming the knob,
    the file and the fix where it cannot be read (missing, a directory, no permission, EIO) or reads no number.

    ``what`` names the knob in the user's words (``gpu_freq``); ``fix`` is the way out of a file that is gone
    or reads nonsense (a permission problem always gets :data:`ROOT_FIX`).
    """
    try:
        return parse_int(read_knob_text(path, what, fix), path)
    except ValueError as exc:
        raise knob_read_error(path, what, exc, fix) from None


def read_knob_text(path: Path, what: str, fix: str = BOARD_FIX) -> str:
    """A board file's text, as :func:`read_text`; where it cannot be read, the one-line :class:`DeviceError`
    of :func:`read_knob` (for files that hold more than one number: a frequency table, nvpmodel's files, a
    rail's label). ``what`` names what the file is for in the user's words (``power_mode``, ``power rail
    VDD_IN``)."""
    try:
        return read_text(path)
    except OSError as exc:
        raise knob_read_error(path, what, exc, fix) from None


def knob_read_error(path: Path, what: str, exc: OSError | ValueError, fix: str = BOARD_FIX) -> DeviceError:
    """The one-line error for a board file that :func:`read_int` (or a :class:`FastReader`) could not read
    (``exc``), with ``fix`` for a file that is gone or reads nonsense."""
    if isinstance(exc, PermissionError):
        return DeviceError(f"{what}: no permission to read {path}; {ROOT_FIX}")
    if isinstance(exc, OSError):
        return DeviceError(f"{what}: cannot read {path} ({_os_reason(exc)}); {fix}")
    return DeviceError(f"{what}: {exc}; {fix}")  # parse_int's line names the file and the text


def writable(path: Path) -> bool:
    """Whether this process may write ``path``.

    The mode bits count even for root: the kernel exposes attributes that cannot be stored as 0444, and
    refuses writes to them whoever asks. Without root, the owner and group decide (``os.access``).
    """
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    effective = os.access in os.supports_effective_ids  # the euid decides a write, as for open(2)
    return bool(mode & 0o222) and os.access(path, os.W_OK, effective_ids=effective)


def write_checked(path: Path, value: int | str, what: str) -> None:
    """Write ``value`` to a sysfs attribute; a :class:`KnobWriteError` with one line on refusal.

    ``what`` names the knob in the user's words (``gpu_freq``).
    """
    text = f"{value}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # as `echo v > file`; never O_CREAT
        try:
            os.write(fd, text)
        finally:
            os.close(fd)
    except PermissionError:
        raise KnobWriteError(f"{what}: no permission to write {path}; {ROOT_FIX}") from None
    except OSError as exc:
        if exc.errno in _NOT_A_KNOB_FILE:  # the file is gone or is not a file: nothing the kernel said
            raise KnobWriteError(f"{what}: cannot write {value} to {path} ({_os_reason(exc)}); {BOARD_FIX}") from None
        raise KnobWriteError(f"{what}: the kernel rejected {value} for {path} ({_os_reason(exc)})") from None


class FastReader:
    """One sysfs attribute kept open and read with ``os.pread``.

    A read raises OSError when the file has gone (unbound driver, removed device) and ValueError for
    text that is not a non-negative integer (empty, negative, garbage), so a monitor can drop and count
    the sample. A file replaced by rename (how a test's fake board updates values atomically) is reopened.
    """

    __slots__ = ("_fd", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1  # closed, should the open fail: __del__ then has nothing to close
        self._fd = os.open(path, os.O_RDONLY)

    def _raw(self) -> bytes:
        if self._fd < 0:  # gone at the last read: it may be back (driver rebound)
            self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, _ATTRIBUTE_BYTES, 0)
        # st_nlink is 0 once the file is unlinked (sysfs files are never unlinked while open on a
        # live board; in a fake tree this is how a vanished or replaced file shows): reopen by path.
        if os.fstat(self._fd).st_nlink == 0:
            self.close()
            self._fd = os.open(self.path, os.O_RDONLY)  # FileNotFoundError if it is gone for good
            data = os.pread(self._fd, _ATTRIBUTE_BYTES, 0)
        return data

    def read_int(self) -> int:
        text = self._raw().decode("ascii", "replace").strip()
        value = parse_int(text, self.path)
        if value < 0:
            raise ValueError(f"{self.path}: negative reading {value}")
        return value

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            finally:
                self._fd = -1

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter teardown
        with contextlib.suppress(OSError):
            self.close()


# ---------------------------------------------------------------------------------------------- cpufreq


@dataclass
class CpufreqPolicy:
    """One cpufreq policy (a cluster of CPUs sharing a clock): its directory and frequency table (kHz)."""

    path: Path
    frequencies_khz: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.path.name

    def limits(self) -> tuple[int, int] | None:
        """The (min, max) limits (kHz), or None while every CPU of the policy is offline (the kernel then
        answers its attributes with EBUSY)."""
        limits = []
        for path in (self.path / "scaling_min_freq", self.path / "scaling_max_freq"):
            try:
                limits.append(read_int(path))
            except (OSError, ValueError) as exc:
                if _offline(exc):
                    return None
                raise knob_read_error(path, "cpu_freq", exc) from None
        return limits[0], limits[1]

    def writable(self) -> bool:
        return writable(self.path / "scaling_min_freq") and writable(self.path / "scaling_max_freq")


def _policy_table(path: Path) -> tuple[int, ...]:
    avail = path / "scaling_available_frequencies"
    if avail.exists():
        values = sorted({int(v) for v in read_text(avail).split() if v.isdigit()})
        if values:
            return tuple(values)
    # intel_pstate and amd-pstate publish no table: offer 100 MHz steps between the hardware limits
    lo, hi = read_int(path / "cpuinfo_min_freq"), read_int(path / "cpuinfo_max_freq")
    step = _PSTATE_STEP_KHZ
    values = list(range(-(-lo // step) * step, hi + 1, step))
    return tuple(sorted({lo, *values, hi}))


def _offline(exc: BaseException) -> bool:
    """Whether ``exc`` is the kernel's answer for a cpufreq policy whose CPUs are all offline (an inactive
    policy: every attribute's read and write returns EBUSY; drivers/cpufreq/cpufreq.c, show() and store())."""
    return isinstance(exc, OSError) and exc.errno == errno.EBUSY


def find_cpufreq_policies(root: Path) -> list[CpufreqPolicy]:
    """The cpufreq policies under ``root`` (``sys/devices/system/cpu/cpufreq/policy<N>``), by number.

    A policy whose CPUs are all offline now (a cluster the power mode or ``cpu_cores`` took down) reads
    nothing; it is kept, with the table of the first policy that reads one (the clusters of a Jetson or an
    x86 package share theirs), so its clock is locked as soon as its CPUs are back online.
    """
    base = root / "sys/devices/system/cpu/cpufreq"
    found: list[tuple[Path, tuple[int, ...] | None]] = []
    for path in sorted(base.glob("policy[0-9]*"), key=lambda p: int(p.name[6:] or 0)):
        try:
            found.append((path, _policy_table(path)))
        except OSError as exc:
            if _offline(exc):
                found.append((path, None))
        except ValueError:
            continue  # an unreadable table: not a policy edgetune can lock
    table = next((t for _, t in found if t), None)
    return [] if table is None else [CpufreqPolicy(path, t or table) for path, t in found]


def lock_range(files: tuple[Path, Path], current: tuple[int, int], target: tuple[int, int], what: str) -> None:
    """Set a (min, max) pair of limit files in the order the kernel accepts.

    A write that would make min > max is rejected, so when the range moves up ``max`` goes first, and
    when it moves down ``min`` goes first.
    """
    min_file, max_file = files
    lo, hi = target
    if lo > current[1]:  # moving up past the current max: raise max first
        write_checked(max_file, hi, what)
        write_checked(min_file, lo, what)
    else:
        write_checked(min_file, lo, what)
        write_checked(max_file, hi, what)


def read_only_reason(files: list[Path]) -> str:
    if not is_root():
        return f"knob files are root-only; {ROOT_FIX}"
    bad = next((f for f in files if not writable(f)), files[0])
    return f"the kernel exposes {bad} read-only"


def cpu_freq_knob(policies: list[CpufreqPolicy], tracker: StateTracker) -> RestorableKnob:
    """One ``cpu_freq`` knob (kHz) locking every cpufreq policy (cluster) to the same step.

    Values are the first policy's table; a policy whose table lacks a step gets its nearest step at or
    below it. One knob rather than one per cluster: clusters of Jetsons and x86 packages share a table,
    and a per-cluster search space would multiply the trials for little gain. The snapshot is every
    policy's (min, max) pair, so restore returns the governor's range.

    A cluster whose CPUs are all offline (fewer ``cpu_cores``: on an Orin Nano, 4 cores or fewer leave
    CPUs 4-5 and their policy down) refuses every read and write with EBUSY: it is skipped, and locked at
    the next write once a setting brings its CPUs back (``cpu_cores`` is applied and restored before
    ``cpu_freq``). Its snapshot is None; restored while its CPUs are online, such a cluster gets its full
    range back. One it cannot reach is left as the kernel holds it: a cluster that was offline when the
    run began and that the run brought online and locked keeps that lock once its CPUs go offline again,
    until nvpmodel or a reboot resets it.
    """
    table = policies[0].frequencies_khz

    def step_for(policy: CpufreqPolicy, khz: int) -> int:
        below = [f for f in policy.frequencies_khz if f <= khz]
        return below[-1] if below else policy.frequencies_khz[0]

    def files(p: CpufreqPolicy) -> tuple[Path, Path]:
        return p.path / "scaling_min_freq", p.path / "scaling_max_freq"

    def read() -> int:
        return read_knob(policies[0].path / "scaling_cur_freq", "cpu_freq")

    def write(value: int) -> None:
        for p in policies:
            current = p.limits()
            if current is not None:  # None: its CPUs are offline (docstring)
                f = step_for(p, int(value))
                lock_range(files(p), current, (f, f), "cpu_freq")

    def snapshot() -> dict[str, Any]:
        return {p.name: None if (lim := p.limits()) is None else list(lim) for p in policies}

    def restore(snap: dict[str, Any]) -> None:
        for p in policies:
            saved = snap.get(p.name)
            lo, hi = (p.frequencies_khz[0], p.frequencies_khz[-1]) if saved is None else (int(v) for v in saved)
            if not (0 < lo <= hi):
                raise ValueError(f"cpu_freq: saved range {lo}..{hi} kHz for {p.name} is not a valid range")
            current = p.limits()
            if current is not None:
                lock_range(files(p), current, (lo, hi), "cpu_freq")

    all_files = [f for p in policies for f in files(p)]
    ok = all(writable(f) for f in all_files)
    names = ", ".join(p.name for p in policies)
    return RestorableKnob("cpu_freq", knob_unit("cpu_freq"), table, read=read, write=write, writable=ok,
                          why_read_only="" if ok else read_only_reason(all_files), snapshot=snapshot,
                          restore_snapshot=restore, tracker=tracker,
                          description=f"CPU clock of every cluster ({names})",
                          # every policy's full table: the governor scales freely again
                          default_snapshot=lambda: {p.name: [p.frequencies_khz[0], p.frequencies_khz[-1]]
                                                    for p in policies})



def first_existing(paths: Iterable[Path]) -> Path | None:
    for p in paths:
        if p.exists():
            return p
    return None


def open_reader(path: Path, what: str, fix: str = BOARD_FIX) -> FastReader:
    """``path`` kept open as a :class:`FastReader` and read once: a file that is gone, a directory, unreadable
    or not a number when the device is opened is a one-line :class:`DeviceError` naming ``what`` it is for,
    the file and ``fix`` (:func:`knob_read_error`), where a sensor would otherwise drop every sample, or a
    channel left out change a total without a word."""
    reader = None
    try:
        reader = FastReader(path)
        reader.read_int()
    except (OSError, ValueError) as exc:
        if reader is not None:
            reader.close()
        raise knob_read_error(path, what, exc, fix) from None
    return reader
