"""The power budget over a run: set through the API, read from a watched file, re-read on SIGUSR1.

:class:`BudgetSource` keeps the budget in force as a schedule over device time (so the accounting judges
every sample by the budget of its moment) and watches an optional file holding the budget in watts
(``7.5``, ``7.5 W``): the file is re-read when its modification time changes, and on SIGUSR1 whatever its
modification time (an edit within the file system's time resolution). The controller polls the file on
its guard tick and applies what it reads; this module only reads and parses.
"""

from __future__ import annotations

import bisect
import math
import numbers
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BudgetSource", "FileReading", "check_watts", "parse_watts"]

#: characters of an unreadable budget file quoted back in the event (enough to recognise it)
QUOTED_CHARS = 20


def check_watts(value: Any, what: str = "budget") -> float:
    """``value`` as watts when it is a positive finite number; ``ValueError`` (one line) if not."""
    # numbers.Real: numpy's scalars too (np.float32 is no float), as a budget computed with numpy is
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be a positive number of watts, got {value!r}")
    return float(value)


def parse_watts(text: str) -> float:
    """Watts from a budget file's text: a positive finite number, optionally followed by ``W``.

    >>> parse_watts("7.5 W\\n")
    7.5
    """
    w = float(text.strip().lower().removesuffix("w").strip())
    if not (w > 0 and math.isfinite(w)):
        raise ValueError(f"not a positive number of watts: {text.strip()!r}")
    return w


@dataclass(frozen=True)
class FileReading:
    """What the budget file held when it was re-read.

    Attributes:
        path: the file.
        watts: the budget it names; None when it could not be read as watts.
        text: its text; None when the file could not be read at all.
    """

    path: Path
    watts: float | None
    text: str | None

    def problem(self, current_w: float) -> str:
        """One line on why the reading is unusable and what stays in force (for a reading without watts)."""
        if self.text is None:
            return f"budget file {self.path}: unreadable; the budget stays {current_w:g} W"
        return (f"budget file {self.path}: cannot read {self.text.strip()[:QUOTED_CHARS]!r} as watts; write a "
                f"number such as 7.5 (the budget stays {current_w:g} W)")


class BudgetSource:
    """The budget in force over device time, and the file that may change it.

    Args:
        initial_w: the budget at the start (W).
        path: a file holding the budget in watts, watched while :meth:`watch` is in effect (None: none).
    """

    def __init__(self, initial_w: float, path: str | os.PathLike | None = None) -> None:
        self.initial_w = float(initial_w)
        self.path = Path(path) if path is not None else None
        self._schedule: list[tuple[float, float]] = []  # (device time, W), ascending
        self._mtime_ns: int | None = None
        self._signalled = False
        self._old_handler: Any = None

    # -- the schedule ------------------------------------------------------------------------------------
    @property
    def current_w(self) -> float:
        """The budget in force now (the initial one before anything was set)."""
        return self._schedule[-1][1] if self._schedule else self.initial_w

    def at(self, t: float) -> float:
        """The budget that was in force at device time ``t``."""
        i = bisect.bisect_right(self._schedule, (t, math.inf)) - 1
        return self._schedule[max(i, 0)][1] if self._schedule else self.initial_w

    def at_times(self, t: np.ndarray) -> np.ndarray:
        """:meth:`at` for an array of device times at once."""
        if not self._schedule:
            return np.full(np.shape(t), self.initial_w)
        starts = np.fromiter((s for s, _ in self._schedule), float, len(self._schedule))
        watts = np.fromiter((w for _, w in self._schedule), float, len(self._schedule))
        return watts[np.maximum(np.searchsorted(starts, t, side="right") - 1, 0)]

    def restart(self, t0: float) -> None:
        """Begin the schedule at device time ``t0`` with the initial budget (the run starts)."""
        self._schedule = [(t0, self.initial_w)]

    def set(self, t: float, watts: float) -> bool:
        """Put ``watts`` in force from device time ``t``; False when it is the budget in force already."""
        watts = check_watts(watts)
        if self._schedule and self._schedule[-1][1] == watts:
            return False
        self._schedule.append((t, watts))
        return True

    # -- the file and the signal ---------------------------------------------------------------------------
    def watch(self) -> None:
        """Re-read the file on SIGUSR1 from now on (where the platform has it, from the main thread only)."""
        if self.path is None or not hasattr(signal, "SIGUSR1"):
            return
        if threading.current_thread() is not threading.main_thread():
            return

        def on_usr1(signum: int, frame: Any) -> None:
            self._signalled = True

        self._old_handler = signal.signal(signal.SIGUSR1, on_usr1)

    def unwatch(self) -> None:
        """Put back the SIGUSR1 handler :meth:`watch` replaced."""
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR1, self._old_handler)
            self._old_handler = None

    def poll(self) -> FileReading | None:
        """The file's content when it changed (or SIGUSR1 came) since the last poll; None otherwise.

        A file not written yet is no change: the budget given at the start holds.
        """
        path = self.path
        if path is None:
            return None
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return None
        if mtime == self._mtime_ns and not self._signalled:
            return None
        self._mtime_ns, self._signalled = mtime, False
        try:
            text = path.read_text()
        except (OSError, ValueError):
            return FileReading(path, None, None)
        try:
            return FileReading(path, parse_watts(text), text)
        except ValueError:
            return FileReading(path, None, text)
