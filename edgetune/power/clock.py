"""Time for measurements: :class:`RealClock` on hardware, :class:`VirtualClock` on the simulated twin.

A :class:`~edgetune.power.base.Device` carries one (:class:`Clock`); the power monitor samples on it and
every measurement window is timed by it. The twin's clock moves only when the twin advances it, firing the
monitor's periodic tickers at their exact due times on the way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Clock", "RealClock", "VirtualClock"]

#: Slack (s) within which a ticker due at the end of an advance still fires (float sums of periods).
_TICK_SLACK_S = 1e-12


class Clock(Protocol):
    """Time for measurements: ``now`` in seconds (monotonic) and ``sleep``."""

    virtual: bool

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall-clock time (``time.monotonic``) for real hardware."""

    virtual = False

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


@dataclass
class _Ticker:
    # due times are start + n * period, not a running sum, so they never drift
    start: float
    period: float
    callback: Callable[[], None]
    count: int = 1

    @property
    def due(self) -> float:
        return self.start + self.count * self.period


class VirtualClock:
    """Simulated time that advances only when the twin says so.

    Periodic tickers (the power monitor's sampling) fire at their exact due times while the clock moves,
    so a ten-minute on-device search is sampled exactly as the real monitor would sample it, in a
    fraction of the wall time.
    """

    virtual = True

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._tickers: dict[int, _Ticker] = {}
        self._next_id = 0
        self._advancing = False
        self._interrupted = False

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        while seconds > 0:  # an interrupted advance (a knob changed at a tick) sleeps on
            seconds = self.advance(seconds)

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds``, firing every ticker due on the way, in time order.

        Returns the seconds *not* advanced: 0, unless a ticker's callback called :meth:`interrupt`, which
        ends the advance at that tick (the twin then re-times the rest of a step whose clocks were changed).
        """
        if seconds < 0:
            raise ValueError("virtual time cannot go backwards")
        end = self._now + seconds
        self._advancing, self._interrupted = True, False
        try:
            while self._tickers:
                ticker = min(self._tickers.values(), key=lambda tk: tk.due)
                if ticker.due > end + _TICK_SLACK_S:
                    break
                self._now = max(self._now, ticker.due)
                ticker.count += 1
                ticker.callback()
                if self._interrupted:
                    return max(0.0, end - self._now)
        finally:
            self._advancing = self._interrupted = False
        self._now = end
        return 0.0

    def interrupt(self) -> None:
        """End the :meth:`advance` in progress at the current tick (called from a ticker's callback); a
        no-op outside an advance, so a stray call never shortens a later one."""
        if self._advancing:
            self._interrupted = True

    def add_ticker(self, period_s: float, callback: Callable[[], None]) -> int:
        """Call ``callback`` every ``period_s`` of virtual time, starting one period from now."""
        if period_s <= 0:
            raise ValueError("ticker period must be positive")
        tid = self._next_id
        self._next_id += 1
        self._tickers[tid] = _Ticker(self._now, period_s, callback)
        return tid

    def remove_ticker(self, tid: int) -> None:
        self._tickers.pop(tid, None)
