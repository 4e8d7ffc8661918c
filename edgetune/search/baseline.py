"""The baseline of common practice (and of the published work) every result states its speedup over.

Common practice trains at the workload's default batch size and, under a power budget, lowers the GPU clock
until the power fits (on a GPU with a power limit instead of a clock knob: lowers the limit), leaving the
other knobs as the device was found; on a real board a clock as found runs as its governor runs it under load,
at the top of its range (:func:`governed_clocks`), not at the frequency it read when the search began.
:class:`Baseline` finds that setting with few measurements, and safely (the budget protects the board: a probe
far over it draws that power for a whole trial).

A clock is probed from its *lowest* value up (if that does not hold the budget, nothing does), and never above
the cap the power mode as found sets on it (:meth:`Baseline.lowered_values`). Once two
probes are measured, the next is the highest value whose power, interpolated linearly in the knob's value
between the probes that bracket the budget (extrapolated from the two highest that held it, before one did
not), holds it: power is convex in the clock, so the chord overestimates it and these probes mostly hold.
With one probe, or without the budget, it bisects.

A power limit is probed as common practice lowers it, the highest first, then bisection: the device enforces
the limit, so a limit over the budget is over it only until the trial is stopped, and the top probe shows the
workload's own draw (on the 10-trial trace benchmark, power limits probed from the bottom left 2 more of 36
searches over 3%).

The probes are measured by the search like any other trial (role
:attr:`~edgetune.search.records.Role.BASELINE`), so they also teach the sampler.

In a rows space (a table replay) the probes are rows: the lowered knob takes the values it has in rows at
the baseline's batch size, and each probe is the row with that value whose other knobs are nearest the
found setting.

A baseline that never holds the budget is no baseline: no speedup is claimed over an infeasible setting.
Nor is one whose default batch size does not fit in memory, whether its probe ran out of memory or was known to
(a batch size no larger ran out at another setting, :mod:`edgetune.search.memory`: the probe is not measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgetune.power.base import KnobValue, ModeCaps
from edgetune.power.knobs import KNOBS, Candidate, KnobRole, governed_value, knob_of_role, reads_running_clock
from edgetune.search.records import Role, TrialRecord
from edgetune.search.space import LEVEL, SearchSpace

__all__ = ["LOWERED_ROLES", "Baseline", "BaselineState", "governed_clocks", "nearest_batch_size"]

#: the knob common practice lowers until the power fits, by role, first present wins
LOWERED_ROLES = (KnobRole.GPU_CLOCK, KnobRole.POWER_LIMIT)


def nearest_batch_size(batch_sizes: Sequence[int], default: int) -> int:
    """The batch size nearest ``default`` in ratio (a tie goes to the larger)."""
    return min(batch_sizes, key=lambda b: (abs(math.log(b / default)), -b))


@dataclass(frozen=True)
class BaselineState:
    """Where the baseline stands: the next probe to measure (None when done) and the baseline found."""

    next_probe: Candidate | None
    found: TrialRecord | None

    @property
    def done(self) -> bool:
        return self.next_probe is None


def _power_w(record: TrialRecord) -> float:
    """A probe's measured moving-average maximum (nan where none was measured)."""
    value = (record.measurement or {}).get("max_avg_power_w")
    return float(value) if isinstance(value, (int, float)) else math.nan


def governed_clocks(space: SearchSpace, found: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
    """``found`` as common practice runs it on a real board: each clock at its highest value under the power
    mode as found (its cap there, where the space knows it), the other knobs as read.

    A real clock reads the frequency running now (:func:`~edgetune.power.knobs.reads_running_clock`), which
    the governor moves: an idle CPU read at the start of a search may run at its lowest step. Left to its
    governor under training load, a clock runs at the top of its range, so the baseline takes that, not the
    reading (which would lock it there and slow the baseline by the governor's idle choice). A simulated
    device reads the values set (the twin finds its clocks at the mode's caps): callers pass its reading.
    """
    out = dict(found)
    mode = knob_of_role(space.knob_names, KnobRole.POWER_MODE)
    caps = dict(space.mode_caps).get(found.get(mode)) if mode is not None else space.found_caps
    for name, allowed in space.knobs:
        if reads_running_clock(name) and not isinstance(allowed[0], str):
            out[name] = governed_value(allowed, caps.cap(name) if caps is not None else None)
    return out


class Baseline:
    """The baseline's probes and its result, read from the search's trial records.

    Args:
        space: the search space (the probes are points of it).
        batch_size: the baseline's batch size (the space's nearest to the workload's default,
            :func:`nearest_batch_size`).
        found_settings: the knob values as the device was found (the knobs common practice leaves alone).
        limit_w: the budget with its tolerance, W, for the interpolated probes (None: bisection only).
    """

    def __init__(self, space: SearchSpace, batch_size: int, found_settings: Mapping[str, KnobValue],
                 limit_w: float | None = None) -> None:
        self.space = space
        self.batch_size = batch_size
        self.found_settings = dict(found_settings)
        self.limit_w = limit_w
        self.knob = next((k for role in LOWERED_ROLES if (k := knob_of_role(space.knob_names, role)) is not None),
                         None)

    def lowered_values(self) -> list[KnobValue]:
        """The values the lowered knob takes, ascending (a rows space: in rows at the baseline batch size).

        Under the power mode as found, where it caps the lowered knob (:attr:`SearchSpace.mode_caps`), the
        values up to the first at or above the cap: every higher one runs at it (nvpmodel clamps the clock), so
        common practice cannot set them, and probing them measures the same setting again. On the Orin NX,
        found in its 15W mode (GPU capped at 612 MHz), a b-128 baseline under a 10-W budget probed 816 and
        918 MHz after 612 MHz and read the same 8.8 W: two of a warm start's 15 settings."""
        assert self.knob is not None
        if self.space.rows is not None:
            return sorted({r.knobs[self.knob] for r in self.space.rows if r.batch_size == self.batch_size})
        values = list(self.space.knob_values[self.knob])
        found = self._found_caps()
        first = None if found is None or isinstance(values[0], str) else found.capped_from(self.knob, values)
        return values if first is None else values[:first + 1]

    def _found_caps(self) -> ModeCaps | None:
        """What the power mode as found caps (None: unknown). A mode not tuned: the mode in force's
        (:attr:`SearchSpace.found_caps`)."""
        caps = dict(self.space.mode_caps)
        mode = knob_of_role(self.space.knob_names, KnobRole.POWER_MODE)
        if mode is None:
            return self.space.found_caps
        if not caps:
            return None
        return caps.get(self._grid_candidate(None).knobs[mode])  # as found (the nearest allowed value: class docs)

    def candidate(self, lowered_value: KnobValue | None) -> Candidate:
        """The baseline's batch size with the lowered knob at ``lowered_value``, the others as found (the
        nearest allowed value; a knob found outside a named space: its highest). In a rows space: the row
        with that batch size and lowered value nearest that setting."""
        cand = self._grid_candidate(lowered_value)
        if self.space.rows is None or self.space.contains(cand):
            return cand
        rows = [r for r in self.space.rows if r.batch_size == self.batch_size
                and (self.knob is None or r.knobs[self.knob] == lowered_value)]
        if not rows:
            return self.space.rows[self.space.nearest_row(self.space.params(cand))]
        want = self.space.params(cand)
        scale = {n: max(len(v) - 1, 1) for n, v in self.space.knobs}
        return min(rows, key=lambda r: sum(abs(self.space.params(r)[n + LEVEL] - want[n + LEVEL]) / scale[n]
                                           for n in scale))

    def _grid_candidate(self, lowered_value: KnobValue | None) -> Candidate:
        setting = []
        for name, allowed in self.space.knobs:
            if name == self.knob:
                setting.append((name, lowered_value))
                continue
            now = self.found_settings.get(name)
            if now in allowed:
                setting.append((name, now))
            elif isinstance(now, (int, float)) and not isinstance(allowed[0], str):
                setting.append((name, min(allowed, key=lambda v: abs(float(v) - float(now)))))
            else:
                setting.append((name, allowed[-1]))
        return Candidate(self.batch_size, tuple(setting))

    def state(self, records: Sequence[TrialRecord]) -> BaselineState:
        """The next probe and the baseline found so far, from the records of the probes measured.

        A probe whose worker died on it every time it was tried (given up) counts as not holding the budget; one
        known to run out of memory (not measured, :attr:`TrialRecord.oom_of`) as one that ran out.
        """
        probes = [r for r in records if r.role == Role.BASELINE
                  and (r.measurement is not None or r.given_up or r.oom_of is not None)]
        if self.knob is None:  # nothing to lower: the setting as found is the one probe
            cand = self.candidate(None)
            done = [r for r in probes if r.candidate == cand]
            if not done:
                return BaselineState(cand, None)
            return BaselineState(None, done[0] if done[0].feasible else None)
        values = self.lowered_values()
        if not values:  # a rows space without rows at the baseline batch size: no baseline there
            return BaselineState(None, None)

        def level(r: TrialRecord) -> int:
            return values.index(r.candidate.knobs[self.knob])

        if any(r.oom for r in probes):
            return BaselineState(None, None)  # the default batch size does not fit in memory: no baseline
        held = [level(r) for r in probes if r.feasible]
        over = [level(r) for r in probes if not r.feasible]
        lo = max(held, default=-1)
        hi = min([i for i in over if i > lo], default=len(values))
        found = next((r for r in probes if r.feasible and level(r) == lo), None) if lo >= 0 else None
        if self._is_power_limit():  # the top first, then bisection (class docs)
            if hi - lo <= 1:
                return BaselineState(None, found)
            nxt = len(values) - 1 if not probes else (lo + hi) // 2
            return BaselineState(self.candidate(values[nxt]), None)
        if not probes:
            return BaselineState(self.candidate(values[0]), None)
        if hi - lo <= 1 or lo < 0:  # bracketed, or the lowest value does not hold: done
            return BaselineState(None, found)
        nxt = self._interpolated(values, probes, level, lo, hi)
        return BaselineState(self.candidate(values[nxt]), None)

    def _is_power_limit(self) -> bool:
        spec = KNOBS.get(self.knob) if self.knob is not None else None
        return spec is not None and spec.role is KnobRole.POWER_LIMIT

    def _interpolated(self, values: list[KnobValue], probes: Sequence[TrialRecord], level, lo: int,
                      hi: int) -> int:
        """The next probe's level, strictly between ``lo`` (held) and ``hi`` (did not, or one past the top):
        the highest whose linearly interpolated power holds the limit (class docs), else the bisection."""
        bisect = (lo + hi) // 2
        power = {level(r): _power_w(r) for r in probes}
        below = sorted(i for i in power if i <= lo and math.isfinite(power[i]))
        if self.limit_w is None or not below:
            return bisect
        if hi < len(values) and math.isfinite(power.get(hi, math.nan)):
            (i0, p0), (i1, p1) = (lo, power[lo]), (hi, power[hi])
        elif len(below) >= 2:
            (i0, p0), (i1, p1) = (below[-2], power[below[-2]]), (lo, power[lo])
        else:
            return bisect
        x0, x1 = float(values[i0]), float(values[i1])
        if not (p1 > p0 and x1 > x0):  # no slope to go by
            return bisect if hi < len(values) else hi - 1
        x_star = x0 + (self.limit_w - p0) * (x1 - x0) / (p1 - p0)
        fitting = [i for i in range(lo + 1, hi) if float(values[i]) <= x_star]
        return max(fitting) if fitting else lo + 1
