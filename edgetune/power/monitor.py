"""Background sampling of a power sensor, with measurement windows.

The monitor samples a :class:`~edgetune.power.base.PowerSensor` at a fixed rate on the device's clock: a
daemon thread on real hardware, a ticker on the twin's virtual clock (so simulated minutes are sampled
exactly as a real monitor would sample them). Measurements are taken over explicit windows, Zeus-style::

    monitor.begin_window("trial-3")
    ...                                    # run the steps
    stats = monitor.end_window("trial-3")  # WindowStats: energy, duration, mean/peak, 1-s average max

Energy is the trapezoid integral of the sampled power. A power budget is judged by the maximum of the
moving average over ``avg_window_s`` (1 s by default), computed exactly for the piecewise-linear signal
through the samples. A sensor that updates slowly (the jtop service: once a second) widens that window to
:data:`MIN_UPDATES_PER_WINDOW` of its updates (:func:`min_avg_window_s`); ``avg_window_s`` and every
:class:`WindowStats` say which window was used.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgetune.log import get_logger
from edgetune.power.base import PowerReading, PowerSensor
from edgetune.power.clock import Clock, VirtualClock

__all__ = [
    "MIN_UPDATES_PER_WINDOW",
    "PowerMonitor",
    "WindowStats",
    "cumulative_energy_j",
    "energy_j",
    "min_avg_window_s",
    "moving_average_max",
    "moving_average_mean",
    "next_sample_due",
    "noise_max_excess_w",
    "reading_fault",
    "window_stats",
]

_log = get_logger(__name__)

#: Default sampling rate: resolves a training step's phases (tens of ms) at little cost.
DEFAULT_RATE_HZ = 100.0
#: The default rate never goes below this, even for slower sensors: window edges stay within 20 ms.
MIN_DEFAULT_RATE_HZ = 50.0
#: How long stop() waits for the sampling thread (a daemon: it cannot keep the process alive).
_THREAD_JOIN_S = 2.0
#: History is trimmed only past this many samples, in halves, so trimming costs O(1) per sample.
_TRIM_MIN_SAMPLES = 4096
#: Two reads closer than this (s) are the same instant (a window edge on a tick): one is kept.
_SAME_INSTANT_S = 1e-9
#: A sensor whose total has not changed for this many update periods, and at least _STALE_MIN_S, is
#: stale: noise alone changes a live INA3221 reading every few updates.
_STALE_PERIODS = 50
_STALE_MIN_S = 2.0
#: A budget's moving average spans at least this many sensor updates: over fewer, the average of a held
#: (staircase) signal is one or two readings, not an average. Binds only slow sensors (jtop's 1 s
#: updates give a 4-s window); INA3221 sysfs, NVML and RAPL update every 1-20 ms.
MIN_UPDATES_PER_WINDOW = 4


def min_avg_window_s(update_period_s: float) -> float:
    """The shortest budget window (s) a sensor updating every ``update_period_s`` can judge."""
    return MIN_UPDATES_PER_WINDOW * max(0.0, float(update_period_s))


# ---------------------------------------------------------------------------------------------- pure maths


def energy_j(t: np.ndarray, p: np.ndarray) -> float:
    """Trapezoid integral of power ``p`` (W) over times ``t`` (s)."""
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size < 2:
        return 0.0
    return float(np.sum(np.diff(t) * (p[1:] + p[:-1]) / 2.0))


def cumulative_energy_j(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Trapezoid energy (J) from ``t[0]`` to each of the times ``t`` (s) for power ``p`` (W); ``p`` may hold
    several records of the same times, samples on its last axis."""
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    e = np.zeros(np.broadcast_shapes(t.shape, p.shape))
    e[..., 1:] = np.cumsum(np.diff(t) * (p[..., 1:] + p[..., :-1]) / 2.0, axis=-1)
    return e


def _interp_energy(x: np.ndarray, t: np.ndarray, p: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Energy from t[0] to each x for the piecewise-linear power through (t, p): exact quadratic."""
    i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, t.size - 2)
    dt = x - t[i]
    span = t[i + 1] - t[i]
    slope = np.where(span > 0, (p[i + 1] - p[i]) / np.where(span > 0, span, 1.0), 0.0)
    return e[i] + p[i] * dt + 0.5 * slope * dt * dt


def moving_average_max(t: np.ndarray, p: np.ndarray, window_s: float = 1.0) -> float:
    """Maximum over time of the ``window_s`` moving average of power, exact for linear interpolation.

    The moving average A(x) = (E(x) - E(x - w)) / w of the piecewise-linear power is piecewise quadratic
    with breakpoints at the sample times and the sample times shifted by w. Between breakpoints A' is
    linear, so the maximum lies at a breakpoint or at the one root of A' inside the piece; all are checked.
    When the record is shorter than the window, the mean over the record is returned (the budget is then
    judged on what was seen).
    """
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size == 0:
        return math.nan
    if t.size == 1:
        return float(p[0])
    duration = t[-1] - t[0]
    if duration <= window_s:
        return energy_j(t, p) / duration if duration > 0 else float(np.max(p))
    e = cumulative_energy_j(t, p)
    lo, hi = t[0] + window_s, t[-1]
    xs = np.concatenate([t, t + window_s, [lo, hi]])
    xs = np.unique(xs[(xs >= lo) & (xs <= hi)])

    def power_at(x: np.ndarray) -> np.ndarray:
        return np.interp(x, t, p)

    # roots of A'(x) = (p(x) - p(x - w)) / w inside each piece, where it crosses from + to -
    a, b = xs[:-1], xs[1:]
    da = power_at(a) - power_at(a - window_s)
    # derivative just before b, from the slope of the piece
    mid = (a + b) / 2
    dm = power_at(mid) - power_at(mid - window_s)
    slope = np.where(b > a, (dm - da) / np.where(b > a, (b - a) / 2, 1.0), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = a - da / slope
    ok = (slope < 0) & (da > 0) & (root > a) & (root < b)
    candidates = np.concatenate([xs, root[ok]])
    avg = (_interp_energy(candidates, t, p, e) - _interp_energy(candidates - window_s, t, p, e)) / window_s
    return float(np.max(avg))


#: Seeded draws of the reading noise behind :func:`noise_max_excess_w` (a record always gives one figure).
NOISE_DRAWS = 64
#: The MAD of a normal sample over its standard deviation.
_MAD_PER_SIGMA = 0.6744897501960817
#: The reading differences are clipped at this many standard deviations, this many times, before their spread
#: is taken: a step's phase edges are large differences that no median alone ignores when they are a fifth of
#: the differences (0.1-s steps sampled at 100 Hz: the spread read 1.3x the noise's).
_CLIP_SIGMA = 3.0
_CLIP_ROUNDS = 3
#: The standard deviation of a normal sample clipped at +-3 standard deviations, over the unclipped one.
_CLIPPED_STD = 0.9865


def noise_max_excess_w(t: np.ndarray, p: np.ndarray, window_s: float = 1.0,
                       draws: int = NOISE_DRAWS) -> float:
    """How far the record's :func:`moving_average_max` reads above its signal's from reading noise alone, W.

    The maximum of a noisy moving average is biased high: it picks the stretch where the noise ran high (on
    the twin's Orin NX near 5 W, about +0.005 W over a 2-s window), so a setting whose true maximum sits a
    few milliwatts inside a line reads outside it. This is the expected maximum of the noise's own
    ``window_s`` moving average on the record's sample times: the reading noise is estimated from the
    record (the spread of the differences between consecutive distinct readings, clipped at
    :data:`_CLIP_SIGMA` so a step's phase edges do not count; a reading held over several samples is one
    update, and is drawn once), and the expectation is over ``draws`` seeded draws of it. Subtracted from the
    maximum it gives an unbiased estimate where the signal's own average is flat (steady training in steps
    short against the window) and one at most this much low where it is not (its maximum then sits on a
    high phase and picks up less of the noise). Records no longer than the window (judged on their mean)
    and records with fewer than 8 distinct readings give 0.
    """
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size < 8 or not t[-1] - t[0] > window_s or draws < 1:
        return 0.0
    group = np.concatenate([[0], np.cumsum(np.diff(p) != 0)])
    distinct = p[np.flatnonzero(np.diff(group, prepend=-1))]
    if distinct.size < 8:
        return 0.0
    d = np.diff(distinct)
    spread = float(np.median(np.abs(d - np.median(d)))) / _MAD_PER_SIGMA
    for _ in range(_CLIP_ROUNDS):  # then the spread of the differences within the clip: phase edges out
        inside = d[np.abs(d - np.median(d)) <= _CLIP_SIGMA * spread]
        if inside.size < 8:
            break
        spread = float(np.std(inside)) / _CLIPPED_STD
    sigma = spread / math.sqrt(2.0)  # a difference of two readings has twice a reading's variance
    if not sigma > 0:
        return 0.0
    noise = np.random.default_rng(0).standard_normal((draws, distinct.size))[:, group] * sigma
    return max(0.0, float(np.mean(np.max(_sample_averages(t, noise, window_s), axis=1))))


def _sample_averages(t: np.ndarray, p: np.ndarray, window_s: float) -> np.ndarray:
    """The ``window_s`` moving average of each row of ``p`` at each sample time a whole window after the
    start: the cumulative energy there less the cumulative energy a window before (interpolated linearly
    between samples). ``t`` must span more than the window."""
    e = cumulative_energy_j(t, p)
    ends = np.flatnonzero(t >= t[0] + window_s)
    starts = t[ends] - window_s
    i = np.clip(np.searchsorted(t, starts, side="right") - 1, 0, t.size - 2)
    frac = (starts - t[i]) / np.where(t[i + 1] > t[i], t[i + 1] - t[i], 1.0)
    e_start = e[..., i] + (e[..., i + 1] - e[..., i]) * frac
    return (e[..., ends] - e_start) / window_s


def moving_average_mean(t: np.ndarray, p: np.ndarray, window_s: float = 1.0) -> float:
    """The mean of the record's ``window_s`` moving average over the sample times a whole window after its
    start, W: at most its :func:`moving_average_max`, so a maximum corrected for its noise is never taken
    below it (the signal's own maximum is at least the mean of its averages, and this reads that mean without
    the maximum's bias). A record no longer than the window gives what :func:`moving_average_max` does."""
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size < 2 or not t[-1] - t[0] > window_s:
        return moving_average_max(t, p, window_s)
    return float(np.mean(_sample_averages(t, p, window_s)))


def next_sample_due(due: float, now: float, period: float) -> float:
    """When the sampling thread takes its next sample, after the one due at ``due`` was taken at ``now``.

    Due times step by whole periods, so sampling never drifts; a thread more than a period behind (a long
    GC pause, a loaded machine) resumes one period from now rather than bursting to catch up.
    """
    due += period
    if due < now - period:
        due = now + period
    return due


@dataclass(frozen=True)
class WindowStats:
    """What a measurement window saw.

    Attributes:
        energy_j: trapezoid integral of board power over the window.
        duration_s: window length on the device clock.
        mean_w: energy / duration.
        peak_w: highest single sample.
        max_avg_w: maximum of the moving average over ``avg_window_s`` (the figure a budget is judged by).
        avg_window_s: that moving-average window.
        samples: samples in the window.
        dropped: samples lost to bad sensor reads during the window.
        rail_energy_j: per-rail energy over the window.
        hardware_energy_j: energy from the hardware counter over the window, where one exists.
    """

    energy_j: float
    duration_s: float
    mean_w: float
    peak_w: float
    max_avg_w: float
    avg_window_s: float
    samples: int
    dropped: int = 0
    rail_energy_j: dict[str, float] = field(default_factory=dict)
    hardware_energy_j: float | None = None


def reading_fault(stats: WindowStats) -> str | None:
    """Why a window's readings measure nothing, or None: no valid reading in it (every read dropped), or an
    average of zero or less (a board drawing power reads more: a dead rail, or an energy counter that never
    moves, as RAPL's on many virtual machines)."""
    if stats.samples == 0 or not math.isfinite(stats.mean_w):
        return f"no valid reading ({stats.dropped} dropped)"
    if stats.mean_w <= 0.0:
        return f"an average of {stats.mean_w:.2f} W over {stats.duration_s:.1f} s"
    return None


def window_stats(t: np.ndarray, p: np.ndarray, avg_window_s: float = 1.0) -> WindowStats:
    """Statistics of one power record (pure function: the monitor's windows use it)."""
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size == 0:
        return WindowStats(0.0, 0.0, math.nan, math.nan, math.nan, avg_window_s, 0)
    duration = float(t[-1] - t[0])
    energy = energy_j(t, p)
    mean = energy / duration if duration > 0 else float(p[0])
    return WindowStats(
        energy_j=energy,
        duration_s=duration,
        mean_w=mean,
        peak_w=float(np.max(p)),
        max_avg_w=moving_average_max(t, p, avg_window_s),
        avg_window_s=avg_window_s,
        samples=int(t.size),
    )


# ---------------------------------------------------------------------------------------------- monitor


@dataclass
class _Window:
    start: float
    dropped_at_start: int
    hw_energy_at_start: float | None


class PowerMonitor:
    """Samples ``sensor`` every ``1 / rate_hz`` seconds of ``clock`` time.

    Args:
        sensor: the power sensor.
        clock: the device clock; a virtual clock is sampled with a ticker, a real one with a thread.
        rate_hz: sampling rate. Default 100 Hz, or the sensor's own update rate where that is slower
            (sampling faster only repeats values), but never below 50 Hz.
        avg_window_s: moving-average window a budget is judged by; widened to
            :func:`min_avg_window_s` of the sensor's update period where shorter (logged as a warning).
        keep_s: how much history to keep when no window is open (the live moving average needs it).

    Bad reads (OSError, ValueError, non-finite or negative power) are dropped and counted, never stored.
    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        sensor: PowerSensor,
        clock: Clock,
        rate_hz: float | None = None,
        avg_window_s: float = 1.0,
        keep_s: float = 5.0,
    ) -> None:
        if rate_hz is None:
            rate_hz = DEFAULT_RATE_HZ
            period = sensor.update_period_s
            if period > 0:
                rate_hz = max(MIN_DEFAULT_RATE_HZ, min(DEFAULT_RATE_HZ, 1.0 / period))
        if not rate_hz > 0:
            raise ValueError(f"sampling rate must be positive, got {rate_hz}")
        #: the shortest measurement that judges the budget: the window where it was widened for a slow
        #: sensor (a trial then runs at least that long), else 0 (a shorter record is judged on its mean)
        self.min_measure_s = 0.0
        shortest = min_avg_window_s(sensor.update_period_s or 0.0)
        if avg_window_s < shortest:
            _log.warning("budget window widened from %g s to %g s: the power sensor updates only every %g s "
                         "(%d updates per window); each measurement spans at least that", avg_window_s,
                         shortest, shortest / MIN_UPDATES_PER_WINDOW, MIN_UPDATES_PER_WINDOW)
            avg_window_s = self.min_measure_s = shortest
        self.sensor = sensor
        self.clock = clock
        self.rate_hz = float(rate_hz)
        self.avg_window_s = float(avg_window_s)
        self.keep_s = float(keep_s)
        self._lock = threading.Lock()
        self._t: list[float] = []
        self._p: list[float] = []
        self._rails: list[dict[str, float]] = []
        self._windows: dict[str, _Window] = {}
        self.dropped = 0
        self.total_samples = 0
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ticker: int | None = None
        # last time the total changed; a sensor stuck on one value is flagged stale
        self._last_value: float | None = None
        self._last_change_t: float | None = None
        self._listeners: dict[int, Callable[[PowerReading], None]] = {}
        self._next_listener = 0

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None or self._ticker is not None

    def start(self) -> PowerMonitor:
        if self.running:
            return self
        self.sample()
        if isinstance(self.clock, VirtualClock):
            self._ticker = self.clock.add_ticker(1.0 / self.rate_hz, self.sample)
        else:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="edgetune-power-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._ticker is not None:
            assert isinstance(self.clock, VirtualClock)  # tickers exist only on virtual clocks
            self.clock.remove_ticker(self._ticker)
            self._ticker = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=_THREAD_JOIN_S)
            self._thread = None

    def __enter__(self) -> PowerMonitor:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        next_due = self.clock.now() + period
        while not self._stop.is_set():
            delay = next_due - self.clock.now()
            if delay > 0 and self._stop.wait(delay):
                break
            self.sample()
            next_due = next_sample_due(next_due, self.clock.now(), period)

    # -- sampling --------------------------------------------------------------------------------
    def sample(self) -> PowerReading | None:
        """Take one sample now (also used at window edges). Returns None for a dropped read."""
        try:
            reading = self.sensor.read()
            ok = math.isfinite(reading.total_w) and reading.total_w >= 0
        except (OSError, ValueError, RuntimeError) as exc:
            reading, ok = None, False
            self.last_error = str(exc)
        with self._lock:
            if not ok or reading is None:
                self.dropped += 1
                return None
            if self._t and reading.t <= self._t[-1] + _SAME_INSTANT_S:
                return reading  # same instant sampled twice (window edge on a tick): keep one
            self._t.append(reading.t)
            self._p.append(reading.total_w)
            self._rails.append(dict(reading.rails))
            self.total_samples += 1
            if self._last_value != reading.total_w:
                self._last_value = reading.total_w
                self._last_change_t = reading.t
            self._trim(reading.t)
            listeners = tuple(self._listeners.values())
        for listener in listeners:  # outside the lock: a listener may query the monitor
            listener(reading)
        return reading

    def add_listener(self, callback: Callable[[PowerReading], None]) -> int:
        """Call ``callback`` with every new sample, on the sampling thread (the virtual clock's tick on the
        twin), after it is recorded; returns a handle for :meth:`remove_listener`. The callback must be
        quick (it delays the next sample) and must not raise on the sampling thread."""
        with self._lock:
            handle = self._next_listener
            self._next_listener += 1
            self._listeners[handle] = callback
        return handle

    def remove_listener(self, handle: int) -> None:
        """Stop calling the listener ``handle`` (unknown handles are ignored)."""
        with self._lock:
            self._listeners.pop(handle, None)

    def _trim(self, now: float) -> None:
        keep_from = now - max(self.keep_s, self.avg_window_s)
        if self._windows:
            keep_from = min(keep_from, min(w.start for w in self._windows.values()))
        # trim in chunks so the hot path stays O(1) amortised
        if len(self._t) > _TRIM_MIN_SAMPLES and self._t[len(self._t) // 2] < keep_from:
            cut = int(np.searchsorted(np.asarray(self._t), keep_from)) - 1
            if cut > 0:
                del self._t[:cut], self._p[:cut], self._rails[:cut]

    # -- queries ---------------------------------------------------------------------------------
    @property
    def stale(self) -> bool:
        """True when the sensor has repeated one value for much longer than its update period."""
        if self._last_change_t is None or not self._t:
            return False
        period = self.sensor.update_period_s
        return self._t[-1] - self._last_change_t > max(_STALE_MIN_S, _STALE_PERIODS * period)

    def latest(self) -> PowerReading | None:
        with self._lock:
            if not self._t:
                return None
            return PowerReading(self._t[-1], self._p[-1], self._rails[-1])

    def moving_average(self, window_s: float | None = None) -> float:
        """The moving average of board power over the last ``window_s`` (default: the budget window)."""
        w = self.avg_window_s if window_s is None else window_s
        with self._lock:
            if not self._t:
                return math.nan
            # the samples from the last one at or before the window's start: no copy of the whole record
            i = max(0, bisect.bisect_left(self._t, self._t[-1] - w) - 1)
            t = np.asarray(self._t[i:])
            p = np.asarray(self._p[i:])
        end = t[-1]
        start = max(t[0], end - w)
        i = max(0, int(np.searchsorted(t, start)) - 1)
        tt, pp = t[i:], p[i:]
        if tt[0] < start:  # cut the first piece at the window's start
            p0 = float(np.interp(start, tt, pp))
            tt = np.concatenate([[start], tt[1:]])
            pp = np.concatenate([[p0], pp[1:]])
        span = end - start
        return energy_j(tt, pp) / span if span > 0 else float(pp[-1])

    def begin_window(self, name: str) -> None:
        """Open a named window now. Names are unique among open windows."""
        if name in self._windows:
            raise ValueError(f"measurement window {name!r} is already open")
        self.sample()
        with self._lock:
            start = self._t[-1] if self._t else self.clock.now()
            self._windows[name] = _Window(start, self.dropped, self.sensor.energy_j())

    def end_window(self, name: str) -> WindowStats:
        """Close a named window and return what it saw."""
        if name not in self._windows:
            raise ValueError(f"no open measurement window {name!r}")
        self.sample()
        with self._lock:
            w = self._windows.pop(name)
            t = np.asarray(self._t)
            i = int(np.searchsorted(t, w.start))
            tt, pp = t[i:], np.asarray(self._p[i:])
            rails = self._rails[i:]
        stats = window_stats(tt, pp, self.avg_window_s)
        rail_energy = {}
        if rails and tt.size > 1:
            for rail in rails[0]:
                rail_energy[rail] = energy_j(tt, np.array([r.get(rail, math.nan) for r in rails]))
        hw_end = self.sensor.energy_j()
        hw = None if hw_end is None or w.hw_energy_at_start is None else hw_end - w.hw_energy_at_start
        return WindowStats(
            energy_j=stats.energy_j,
            duration_s=stats.duration_s,
            mean_w=stats.mean_w,
            peak_w=stats.peak_w,
            max_avg_w=stats.max_avg_w,
            avg_window_s=stats.avg_window_s,
            samples=stats.samples,
            dropped=self.dropped - w.dropped_at_start,
            rail_energy_j=rail_energy,
            hardware_energy_j=hw,
        )

    def records(self, since: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A copy of the kept samples: times and board power (from the last sample at or before ``since``
        on, where given: a recent stretch without copying the whole record)."""
        with self._lock:
            i = 0 if since is None else max(0, bisect.bisect_right(self._t, since) - 1)
            return np.asarray(self._t[i:]), np.asarray(self._p[i:])
