"""What the search soaks (:mod:`edgetune.search.thermal`), as pure functions of its results.

A soak trains at one setting for minutes and measures how much more it draws once the board is warm; the
search soaks its pick first (:class:`~edgetune.search.study.Search`). After a soak ran to its end,
:func:`soak_candidate` names the setting the next soak should judge, if any, and :class:`CoolWindows` is what a
soak's rise is counted from: the setting's own search windows, as measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgetune.search.confirm import log_score
from edgetune.search.efficiency import ZeusCost
from edgetune.search.records import TrialRecord
from edgetune.search.results import SearchResult, margin_w
from edgetune.search.thermal import ThermalSoak, hottest_soaked_w, soaked_rise_w
from edgetune.search.window import judged_power_w

__all__ = ["CoolWindows", "soak_candidate"]


@dataclass(frozen=True)
class CoolWindows:
    """A setting's search windows before its soak, as measured, each the mean over the windows
    (:func:`~edgetune.search.thermal.soak`'s ``cool_*``).

    Attributes:
        power_w: mean power, W (NaN: no window read one).
        temperature_c: board temperature, degC (None where a window read none).
        excess_w: how far the judged power read over the mean, W (None: no window).
    """

    power_w: float
    temperature_c: float | None
    excess_w: float | None

    @classmethod
    def of(cls, measurements: Sequence[Mapping[str, Any]], guard_sigma: float) -> CoolWindows:
        """From a setting's measurements (:meth:`~edgetune.search.trial.Measurement.to_dict`, as measured) and
        the guard band's standard errors."""
        power_w = [float(m["mean_power_w"]) for m in measurements if m.get("mean_power_w") is not None]
        temps_c = [float(m["temperature_c"]) for m in measurements if m.get("temperature_c") is not None]
        excess_w = [judged_power_w(float(m["max_avg_power_w"]), float(m.get("power_se_w") or 0.0), guard_sigma)
                    - float(m["mean_power_w"]) for m in measurements
                    if m.get("max_avg_power_w") is not None and m.get("mean_power_w") is not None]
        return cls(power_w=sum(power_w) / len(power_w) if power_w else math.nan,
                   temperature_c=sum(temps_c) / len(temps_c) if temps_c and len(temps_c) == len(measurements)
                   else None,
                   excess_w=sum(excess_w) / len(excess_w) if excess_w else None)


def soak_candidate(result: SearchResult, soaks: Sequence[ThermalSoak], *, objective: str,
                   cost: ZeusCost | None = None, resolution: float = 0.005) -> TrialRecord | None:
    """The setting to soak next once a soak ran to its end, or None.

    The pick where it was not soaked itself and draws more than every setting soaked to its end by more than
    the sensor's accuracy (:func:`~edgetune.search.thermal.hottest_soaked_w`: the rise carried to it per watt
    understates its own; for ``pareto`` the hottest such point of the front, the pick among them: on the
    pareto benchmark's seed 1, Orin Nano mobilenet at 9.9 W, a soak of the 6.8-W pick was carried to the
    front's fast end, which read 9.66 W cool and drew 9.97 W warm); else the best setting that only the
    carried rise rules out: it held the limit by the sensor's accuracy, not by that plus the rise another
    setting measured per watt, it was not soaked itself, and it measured better than the best certified setting
    by more than ``resolution`` (a relative gain; the search's: half its margin), or none is certified. Its own
    soak then judges it (:func:`~edgetune.search.thermal.rise_for_w`). On the oracle benchmark an early soak of
    another setting, its rise per watt carried, left a row's optimum short of the margin by hundredths of a
    watt and the pick 7% worse (experiments/results/oracle_gap_energy.txt, seed 1).
    """
    limit_w, accuracy_w = result.limit_w, result.accuracy_w
    if limit_w is None or accuracy_w is None:
        return None

    def score(r: TrialRecord) -> float:
        assert r.outcome is not None
        return log_score(r.outcome, objective, cost)

    best, hottest_w = result.best, hottest_soaked_w(soaks)
    if hottest_w is not None:
        # the pick, and for pareto every point of the front the user may pick from: one hotter than every
        # full soak has a rise the carried one understates (thermal docs), so the hottest is soaked; the
        # rest then draw less than a soaked setting, where the carried rise is on the safe side
        offered = [best] + (list(result.pareto) if objective == "pareto" else [])
        hot = [r for r in offered if r is not None and soaked_rise_w(soaks, r.candidate) is None
               and limit_w - margin_w(r, limit_w) > hottest_w + accuracy_w]
        if hot:
            return max(hot, key=lambda r: limit_w - margin_w(r, limit_w))
    held = [r for r in result.settings if r.feasible and r.outcome is not None]
    bar = min((score(r) for r in held if result.certified(r)), default=math.inf) - resolution
    ruled_out = [r for r in held if not result.certified(r) and margin_w(r, limit_w) >= accuracy_w
                 and soaked_rise_w(soaks, r.candidate) is None and score(r) < bar]
    return min(ruled_out, key=score, default=None)
