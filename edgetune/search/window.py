"""A measured window's power record: what the budget is judged by, how long it was over, and how long its
readings must run to see a step whole (pure functions; :mod:`edgetune.search.trial` measures the windows).

* :func:`judged_power_w`: the power a budget is judged by, the window's moving-average maximum plus a guard band.
* :func:`over_limit_s`: the seconds a record's moving average spent above a limit.
* :func:`trailing_average_max_w`: the most the moving average can read on from the record's end, if the power
  then stays low (what the settle wait before the next setting waits out).
* :func:`phase_sweep_s`, :func:`phase_unevenness`, :func:`judged_span_s`: the readings' coverage of a step's
  phases (below).

Readings that keep to a few phases of the step
----------------------------------------------
The monitor reads the sensor's last update (INA3221: every 6.6 ms) at 100 Hz, and a small model's step takes
a few to a few dozen milliseconds, so the readings may drift through the step's phases slowly instead of
landing on them at random: a 13.2-ms step read from 6.6-ms updates shows two phases only. A 1-s average of
such readings errs by the phases it held, and the readings' spread does not show it (on the twins, 4% of
settings; their 1-s windows erred by 1.52x their standard error, median, 3.85x at the 90th percentile, 44 of
137 by more than 2x; ``experiments/results/sensor_aliasing.txt``). Where the step is at least
:data:`_FLAT_STEPS_PER_WINDOW` times shorter than the budget window, its true moving average is flat, so once
the window has run one budget window, :func:`judged_span_s` checks whether the readings swept the step's
phases (:func:`phase_sweep_s`); where they did not, the window runs on for one sweep (at most
:data:`SWEEP_WINDOW_CAP_S`) and its power figures are over that span (:attr:`~edgetune.search.trial.Measurement.judged_span_s`). A
sweep reaches every phase but not evenly, so the standard error of such a window is at least the readings'
spread times the root of :func:`phase_unevenness`. Then 0.79x (median), 1.60x (90th percentile), 2 of 137
beyond 2x. A window of a step whose readings sweep within the budget window is unchanged.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from edgetune.power.monitor import cumulative_energy_j

__all__ = ["SWEEP_WINDOW_CAP_S", "judged_power_w", "judged_span_s", "over_limit_s", "phase_sweep_s",
           "phase_unevenness", "trailing_average_max_w"]


def judged_power_w(max_avg_power_w: float, power_se_w: float, guard_sigma: float = 0.0) -> float:
    """The power a budget is judged by: the measured maximum of the moving average plus ``guard_sigma``
    standard errors of one average (a guard band against a measurement that happens to read low)."""
    return max_avg_power_w + guard_sigma * power_se_w


def over_limit_s(t: np.ndarray, p: np.ndarray, t_from: float, t_to: float, window_s: float,
                 limit_w: float) -> float:
    """Seconds within ``[t_from, t_to]`` during which the ``window_s`` moving average of the power record
    ``(t, p)`` was above ``limit_w`` (pure function; samples before ``t_from`` feed the first averages).

    The average at each sample time is over the window ending there (over the record, where it is shorter);
    it holds until the next sample.
    """
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size < 2 or t_to <= t_from:
        return 0.0
    e = cumulative_energy_j(t, p)
    start = np.maximum(t - window_s, t[0])
    span = t - start
    with np.errstate(divide="ignore", invalid="ignore"):
        avg = np.where(span > 0, (e - np.interp(start, t, e)) / np.where(span > 0, span, 1.0), p)
    # np.interp of the cumulative energy is exact at samples and linear between (the trapezoid's error is
    # second order within one sample period: negligible against a 1-s window)
    ends = np.append(t[1:], t[-1])
    lo = np.clip(t, t_from, t_to)
    hi = np.clip(ends, t_from, t_to)
    return float(np.sum(np.where(avg > limit_w, hi - lo, 0.0)))


#: the readings have swept a step's phases once no gap between their phases is wider than this share of a step
_PHASE_GAP = 1.0 / 8.0
#: the longest sweep computed (s); a longer one is inf (the readings keep to a few phases of the step)
_SWEEP_HORIZON_S = 10.0
#: a step at least this many times shorter than the budget window draws a flat average over it: only then may
#: a window's power be judged over a longer span than the budget window (:func:`judged_span_s`); a longer step's
#: own ripple moves the budget's average, and that is real
_FLAT_STEPS_PER_WINDOW = 10
#: the longest span (s) a window is extended to so that its readings sweep the step's phases: past it they keep
#: to a few phases, and the window's standard error counts how unevenly they share them (:func:`phase_unevenness`)
SWEEP_WINDOW_CAP_S = 6.0
#: offsets of the sensor's update instants against the monitor's reads tried (shares of an update period):
#: the two clocks run apart, so their relative phase is unknown; the slowest sweep counts
_SENSOR_OFFSETS = (0.0, 0.25, 0.5, 0.75)


def _swept(phase: np.ndarray) -> bool:
    """Whether phases (shares of a step) leave no gap, round the step, wider than :data:`_PHASE_GAP`."""
    p = np.sort(phase)
    return max(float(np.max(np.diff(p), initial=0.0)), 1.0 - p[-1] + p[0]) <= _PHASE_GAP


def _read_phases(step_s: float, monitor_rate_hz: float, sensor_period_s: float, n: int) -> list[np.ndarray]:
    """The phases (shares of a step) of the values ``n`` reads return, one array per sensor offset tried."""
    t = np.arange(n) / monitor_rate_hz
    out = []
    for offset in _SENSOR_OFFSETS if sensor_period_s > 0 else (0.0,):
        # the instant of the value each read returns: the sensor's last update (a read returns it until the next)
        u = t if sensor_period_s <= 0 else (np.floor(t / sensor_period_s - offset) + offset) * sensor_period_s
        out.append(np.mod(u / step_s, 1.0))
    return out


@functools.lru_cache(maxsize=512)
def _sweep_s(step_s: float, monitor_rate_hz: float, sensor_period_s: float) -> float:
    n = int(_SWEEP_HORIZON_S * monitor_rate_hz) + 1
    longest = 0
    for phase in _read_phases(step_s, monitor_rate_hz, sensor_period_s, n):
        if not _swept(phase):
            return math.inf
        lo, hi = 1, n  # the fewest reads that sweep: adding reads never widens a gap
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if _swept(phase[:mid]) else (mid + 1, hi)
        longest = max(longest, lo)
    return (longest - 1) / monitor_rate_hz


def phase_sweep_s(step_s: float, monitor_rate_hz: float, sensor_period_s: float = 0.0) -> float:
    """Seconds of readings that sweep every phase of a periodic step of ``step_s``: read at
    ``monitor_rate_hz``, each read returning the sensor's last update (every ``sensor_period_s``; 0: a read
    is its own sample), until no gap between the phases read exceeds :data:`_PHASE_GAP` of a step (inf past
    :data:`_SWEEP_HORIZON_S`). A step much longer than the reading interval is swept within about one step;
    a step close to the reading rate, or to a simple fraction of it, is not: its readings keep to a few phases
    of it and drift through the others slowly (a 13.2-ms step read from 6.6-ms updates alternates between two
    phases). Step jitter is left out, so this is the slow side."""
    if not step_s > 0 or not monitor_rate_hz > 0:
        return math.inf
    return _sweep_s(round(float(step_s), 7), float(monitor_rate_hz), float(sensor_period_s))


def phase_unevenness(step_s: float, span_s: float, monitor_rate_hz: float, sensor_period_s: float = 0.0) -> float:
    """How unevenly ``span_s`` of readings share a step's phases: the sum over the step's shares of
    :data:`_PHASE_GAP` of (the share of readings in it - its share of the step)^2, the most over the sensor offsets
    tried (:func:`phase_sweep_s`'s reads). 0: every phase read equally; 0.375: two phases only (a 13.2-ms step
    read from 6.6-ms updates). Where the step's power differs between its phases by a spread of ``sd``, a mean of
    such readings misses the step's by about ``sd * sqrt(unevenness)``."""
    if not step_s > 0 or not monitor_rate_hz > 0:
        return 1.0
    n = max(1, int(span_s * monitor_rate_hz) + 1)
    bins = round(1.0 / _PHASE_GAP)
    worst = 0.0
    for p in _read_phases(float(step_s), float(monitor_rate_hz), float(sensor_period_s), n):
        # a phase a rounding error short of a share's edge is at the edge (13.2-ms steps, 6.6-ms updates: 0, 0.5)
        share = np.bincount(np.minimum(np.floor(np.mod(p + 1e-6, 1.0) / _PHASE_GAP).astype(int), bins - 1),
                            minlength=bins) / n
        worst = max(worst, float(np.sum((share - 1.0 / bins) ** 2)))
    return worst


def judged_span_s(step_s: float, avg_window_s: float, monitor_rate_hz: float, sensor_period_s: float = 0.0) -> float:
    """The span (s) over which a window's budget power is averaged: the budget window ``avg_window_s``, or one
    sweep of the step's phases (:func:`phase_sweep_s`, at most :data:`SWEEP_WINDOW_CAP_S`) for a step at least
    :data:`_FLAT_STEPS_PER_WINDOW` times shorter than the window whose readings do not sweep within it.

    Such a step's true moving average is flat (ten steps or more per window), but a measured one holds the few
    phases its readings kept to, so it errs by the step's ripple: on the twins, 4% of settings, their 1-s
    windows erring by 1.5x their standard error (median; 3.9x at the 90th percentile), by up to 0.6 W
    (``experiments/results/sensor_aliasing.txt``). Averaged over one sweep, it reads every phase."""
    if not step_s > 0 or step_s * _FLAT_STEPS_PER_WINDOW > avg_window_s:
        return float(avg_window_s)
    sweep_s = phase_sweep_s(step_s, monitor_rate_hz, sensor_period_s)
    return float(avg_window_s) if sweep_s <= avg_window_s else min(sweep_s, SWEEP_WINDOW_CAP_S)


def trailing_average_max_w(t: np.ndarray, p: np.ndarray, window_s: float) -> float:
    """The highest average power over ``[u, t_end]`` for any ``u`` within the last ``window_s`` of the record
    (pure function): if the power from ``t_end`` on stays at or under ``x``, the ``window_s`` moving average
    stays at or under ``max(x, this)`` for the next window, because each of its values averages such a
    trailing stretch of the past with the future."""
    t = np.asarray(t, dtype=float)
    p = np.asarray(p, dtype=float)
    if t.size < 2:
        return float(p[-1]) if p.size else math.nan
    e = cumulative_energy_j(t, p)
    end = t[-1]
    start = max(t[0], end - window_s)
    k = int(np.searchsorted(t, start))
    u = np.concatenate([[start], t[k:-1]])
    span = end - u
    eu = np.interp(u, t, e)
    keep = span > 0
    if not keep.any():
        return float(p[-1])
    return float(np.max((e[-1] - eu[keep]) / span[keep]))
