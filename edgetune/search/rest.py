"""The board at rest between trials (safe profiling): the least-power clocks a stopped trial drops to, and the
idle wait before the next setting while the recent past could still take the budget window over the limit.

:func:`~edgetune.search.trial.measure_setting` calls :func:`go_to_rest` when it stops a trial over the
budget (and from its mid-step watchdog) and :func:`settle` before it applies a setting; its module
documentation (safe profiling) says why and what it cost before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from edgetune.power.base import Device, KnobValue
from edgetune.power.knobs import KNOBS, KnobRole
from edgetune.power.monitor import PowerMonitor
from edgetune.search.window import trailing_average_max_w

__all__ = ["go_to_rest", "rest_setting", "settle", "settle_needed"]

#: step (s, device clock) of the idle wait before a setting is applied while the budget window's average is
#: still over the limit (the previous setting's power): two 100-Hz samples, short against the 1-s window
_SETTLE_STEP_S = 0.02
#: the knobs a stopped trial lowers at once, and the settle wait idles with at their least: clocks and online
#: cores, each a quick write (a power mode switch is slow and a power limit does not lower idle power)
_REST_ROLES = (KnobRole.GPU_CLOCK, KnobRole.MEMORY_CLOCK, KnobRole.CPU_CLOCK, KnobRole.CPU_CORES)


def rest_setting(device: Device, names: Iterable[str]) -> dict[str, KnobValue]:
    """The least-power values of the knobs among ``names`` that are quick to set (:data:`_REST_ROLES`):
    each writable clock at its lowest value, the fewest online cores; only those not there already."""
    out: dict[str, KnobValue] = {}
    for name in names:
        knob, spec = device.knobs.get(name), KNOBS.get(name)
        if knob is None or spec is None or spec.role not in _REST_ROLES or not (knob.writable and knob.numeric):
            continue
        if knob.read() != knob.min:
            out[name] = knob.min
    return out


def go_to_rest(device: Device, setting: Mapping[str, KnobValue]) -> None:
    """Drop the knobs of ``setting`` to their rest values (:func:`rest_setting`) at once."""
    rest = rest_setting(device, setting)
    if rest:
        device.apply(rest)


def settle_needed(monitor: PowerMonitor, clock: Any, limit_w: float | None) -> bool:
    """Whether the recent past could still take the budget window's average over ``limit_w``
    (:func:`settle` would wait)."""
    if limit_w is None:
        return False
    t, p = monitor.records(since=clock.now() - monitor.avg_window_s)
    worst = trailing_average_max_w(t, p, monitor.avg_window_s)
    return bool(math.isfinite(worst) and worst > limit_w)


def settle(monitor: PowerMonitor, clock: Any, limit_w: float | None) -> float:
    """Idle until a next setting drawing at most ``limit_w`` cannot take the budget window's average over
    it, for at most one window; returns the device seconds waited (0 without a limit or when none is needed).
    A monitor that holds less than one window of the board's past first records the board as it is until it
    does (:func:`_fill_window`).

    The moving average over the next window mixes the recent past with the next setting's power, so the wait
    ends when every trailing stretch of the last window (:func:`trailing_average_max_w`) averages at most
    ``limit_w``, not merely the window as a whole: a stopped trial's high stretch would otherwise push the
    average back over the limit once the idle stretch after it is all that is left beside it. Idle power is
    under any budget worth searching, so one window of it always suffices (a budget under idle power ends
    the wait after one window all the same).
    """
    if limit_w is None:
        return 0.0
    filled = _fill_window(monitor, clock)
    waited = 0.0
    while waited < monitor.avg_window_s:
        if not settle_needed(monitor, clock, limit_w):
            break
        clock.sleep(_SETTLE_STEP_S)
        monitor.sample()
        waited += _SETTLE_STEP_S
    return filled + waited


def _fill_window(monitor: PowerMonitor, clock: Any) -> float:
    """Record the board as it is until the monitor holds one budget window of its past; returns the device
    seconds waited (0 once it does: after the first setting of a run).

    The budget is judged on the board's 1-s average, which includes the second before a setting was applied.
    A monitor started just before the first setting has no such second, so its average over a partial window
    is that setting's power alone: the first setting of a run would be stopped before the board's own average
    crossed the budget, and counted over the budget while it was not.
    """
    times, _ = monitor.records()
    oldest = float(times[0]) if times.size else clock.now()
    waited = 0.0
    while clock.now() - oldest < monitor.avg_window_s - 1e-9:
        clock.sleep(_SETTLE_STEP_S)
        monitor.sample()
        waited += _SETTLE_STEP_S
    return waited

