"""Periodic calls on the device clock: the controller's power sampling and guard tick.

On a :class:`~edgetune.power.base.VirtualClock` (the twin, trace replay) each call is a ticker of the clock
itself, fired at its exact due times while a step advances time, so the guard reacts inside a simulated
step as it would on a board. On a real clock one daemon thread serves both: it samples the sensor at the
monitor's rate and calls the guard every tick.

Why one thread, and why it sleeps
    On a real clock the controller's background cost is almost all wake-ups, not work: a sample is about
    9 us of Python and a guard tick about 15 us, but each wake-up of a Python thread costs 40-90 us of CPU
    (the timer, the scheduler and the GIL hand-over; measured on a 2-core VM while a training step ran).
    Two threads (a monitor at 100 Hz and a guard at 20 Hz) woke 120 times a second; one thread wakes 100
    times, the guard riding on every fifth sample. Short waits use ``time.sleep``, which costs about half
    the CPU of ``threading.Event.wait`` per wake-up (50 vs 90 us measured); waits longer than
    :data:`SLEEP_MAX_S` wait on the stop event so :meth:`Ticker.stop` stays prompt. The experiment
    ``experiments/runtime_guard.py`` measures the result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edgetune.log import get_logger
from edgetune.power.clock import Clock, VirtualClock

__all__ = ["Ticker"]

_log = get_logger(__name__)

#: s: how long :meth:`Ticker.stop` waits for a tick in progress (a tick takes milliseconds; a stuck one
#: must not hold up the exit that restores the knobs).
STOP_TIMEOUT_S = 2.0
#: s: waits up to this long are a plain sleep (cheapest per wake-up); :meth:`Ticker.stop` may wait this long
#: for the thread to notice. Longer waits wait on the stop event.
SLEEP_MAX_S = 0.1
#: s: a call due within this much of another is made at the same wake-up (due times are computed as
#: multiples of the periods, so a tick every fifth sample coincides with it up to rounding)
DUE_TOLERANCE_S = 1e-6
#: a call that keeps failing is logged the first time and then once per this many failures (not 20 times a second)
FAILURE_LOG_EVERY = 100


class Ticker:
    """Calls ``fn`` every ``period_s`` and ``sample`` every ``sample_period_s`` of device time until :meth:`stop`.

    Args:
        clock: the device clock; a :class:`~edgetune.power.base.VirtualClock` gets clock tickers, any
            other clock one thread for both calls.
        period_s: the period of ``fn`` in device-clock seconds.
        fn: the call (the guard's tick); on a thread it runs on the ticker's thread, on a virtual clock on
            whoever advances it. On a thread an exception it raises is logged and the thread goes on (the
            samples must not stop: the accounting and the budget judgement depend on them).
        name: the thread's name.
        sample: a second call at its own period (the power monitor's ``sample``), or None.
        sample_period_s: the period of ``sample`` (needed with it).
    """

    def __init__(self, clock: Clock, period_s: float, fn: Callable[[], object], name: str = "edgetune-guard",
                 sample: Callable[[], object] | None = None, sample_period_s: float | None = None) -> None:
        if not period_s > 0 or (sample is not None and not (sample_period_s or 0) > 0):
            raise ValueError("ticker periods must be positive")
        self._clock = clock
        self._tids: list[int] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if isinstance(clock, VirtualClock):
            if sample is not None:
                assert sample_period_s is not None
                self._tids.append(clock.add_ticker(sample_period_s, sample))
            self._tids.append(clock.add_ticker(period_s, fn))
        else:
            self._thread = threading.Thread(target=self._run, args=(period_s, fn, sample, sample_period_s),
                                            name=name, daemon=True)
            self._thread.start()

    def _run(self, period_s: float, fn: Callable[[], object], sample: Callable[[], object] | None,
             sample_period_s: float | None) -> None:
        # locals throughout: this loop runs 100 times a second and each attribute lookup is paid cold
        now, sleep, stop = self._clock.now, time.sleep, self._stop
        t0 = now()
        n_tick, n_sample = 1, 1  # the next call of each is due at t0 + n * period
        every = sample_period_s if sample is not None and sample_period_s else period_s
        failures = 0
        while True:
            tick_due = t0 + n_tick * period_s
            sample_due = t0 + n_sample * every
            delay = min(tick_due, sample_due) - now()
            if delay > SLEEP_MAX_S:
                if stop.wait(delay):
                    return
            elif delay > 0:
                sleep(delay)
            if stop.is_set():
                return
            t = now()
            if sample is not None and t >= sample_due - DUE_TOLERANCE_S:
                sample()
                # behind by more than a period (a long pause): skip to the next due time, do not burst
                n_sample = max(n_sample + 1, int((t - t0) / every) + 1)
            if t >= tick_due - DUE_TOLERANCE_S:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - logged; the thread must keep sampling
                    failures += 1
                    if failures == 1 or failures % FAILURE_LOG_EVERY == 0:
                        _log.exception("the periodic call %r failed (%d time(s)); it is called again each period",
                                       fn, failures)
                n_tick = max(n_tick + 1, int((t - t0) / period_s) + 1)

    @property
    def virtual(self) -> bool:
        """True when the calls follow a virtual clock (no thread)."""
        return isinstance(self._clock, VirtualClock)

    @property
    def thread(self) -> threading.Thread | None:
        """The ticker's thread on a real clock (None on a virtual clock, or once stopped)."""
        return self._thread

    def stop(self) -> None:
        """No more calls after this returns (a call in progress on the thread is waited for, up to a bound)."""
        if self._tids:
            assert isinstance(self._clock, VirtualClock)
            for tid in self._tids:
                self._clock.remove_ticker(tid)
            self._tids = []
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._thread = None
