"""A periodic call on the device clock: the controller's guard tick.

On a :class:`~edgetune.power.base.VirtualClock` (the twin, trace replay) the call is a ticker of the clock
itself, fired at its exact due times while a step advances time, so the guard reacts inside a simulated
step as it would on a board. On a real clock it is a daemon thread waking every period.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from edgetune.power.base import Clock, VirtualClock

__all__ = ["Ticker"]

#: s: how long :meth:`Ticker.stop` waits for a tick in progress (a tick takes milliseconds; a stuck one
#: must not hold up the exit that restores the knobs).
STOP_TIMEOUT_S = 2.0


class Ticker:
    """Calls ``fn`` every ``period_s`` of device time until :meth:`stop`.

    Args:
        clock: the device clock; a :class:`~edgetune.power.base.VirtualClock` gets a clock ticker, any
            other clock a thread.
        period_s: the period in device-clock seconds.
        fn: the call; on a thread it runs on the ticker's thread, on a virtual clock on whoever advances it.
        name: the thread's name.
    """

    def __init__(self, clock: Clock, period_s: float, fn: Callable[[], None], name: str = "edgetune-guard") -> None:
        self._clock = clock
        self._tid: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if isinstance(clock, VirtualClock):
            self._tid = clock.add_ticker(period_s, fn)
        else:
            def run() -> None:
                while not self._stop.wait(period_s):
                    fn()
            self._thread = threading.Thread(target=run, name=name, daemon=True)
            self._thread.start()

    @property
    def virtual(self) -> bool:
        """True when the ticks follow a virtual clock (no thread)."""
        return isinstance(self._clock, VirtualClock)

    @property
    def thread(self) -> threading.Thread | None:
        """The ticker's thread on a real clock (None on a virtual clock, or once stopped)."""
        return self._thread

    def stop(self) -> None:
        """No more calls after this returns (a thread's tick in progress is waited for, up to a bound)."""
        if self._tid is not None:
            assert isinstance(self._clock, VirtualClock)
            self._clock.remove_ticker(self._tid)
            self._tid = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._thread = None
