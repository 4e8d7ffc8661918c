"""The budget guard: a feedback controller that keeps board power under a budget by moving down and up a
ladder of knob settings.

The control law is a pure function, :func:`control`, of the guard's state, one observation of power and
the ladder's power model; it returns the next state and a :class:`Decision`. The controller
(:mod:`edgetune.runtime.controller`) calls it on a ticker of the device clock and applies the rung it picks.

The ladder
    Rungs are complete knob settings ordered by power, lowest first (:func:`build_ladder`): the GPU
    frequency table from its lowest value up, with the other knobs at the plan's values; below the lowest
    GPU frequency, the CPU and then the memory (EMC) frequencies step down (a lower CPU clock costs a
    GPU-bound step little time; the lowest EMC clocks cost much). A guard on one ladder never has to
    reason about several knobs at once.

The law, in words
    *Trip.* When the short (``fast_window_s``) average exceeds the budget, the guard jumps down at once to
    the highest rung whose estimated power is ``target_margin`` under the budget, estimating every rung from
    what is being drawn now (so an added load of +2 W is accounted for in one move). After a trip the
    tripped rung and everything above it are barred for ``block_s``, doubling on each repeat trip: a rung
    that overshoots cannot be re-entered at once, so the guard cannot cycle (no limit cycle, the usual
    anti-oscillation device of DVFS governors).
    *Climb.* After ``up_dwell_s`` at one rung with both averages at least ``up_margin`` under the budget
    and steady, the guard climbs to the highest unbarred rung estimated ``up_margin`` under the budget (a
    rung already measured: ``target_margin``, its power is known). The band between ``target_margin`` and
    ``up_margin`` is the hysteresis; the bars and the dwell keep it from cycling.
    *Anti-windup.* A climb that does not raise power by at least a quarter of the estimate (the clock is
    capped: a thermal throttle) is undone and the rung barred, so the guard does not wind up to the top
    rung while throttled and then overshoot when the throttle lifts.
    *Settle time.* A trip acts within one tick of the fast average crossing the budget; the 1-s moving
    average then holds at most one second of the excess, so it is back under the budget within
    ``fast_window_s + tick + 1 s`` (about 1.3 s) of the disturbance.
    *The batch size.* When the lowest rung is still over the budget, the ladder is exhausted: the outer loop
    of :mod:`edgetune.runtime.batch_law` halves the batch size (:attr:`GuardMove.SHRINK_BATCH`) and doubles
    it back (:attr:`GuardMove.GROW_BATCH`) when the budget allows; the controller applies it through the
    loader, with the learning-rate rule.

Rung power estimates
    Each rung has a prior power (from the predictors' hardware model where one is fitted, else from the
    frequency ratio: dynamic power grows at least linearly with the clock). Observations at a rung replace
    its prior; a change seen at a rung already observed is taken as additive (another load, a warmer board)
    and applies to every rung alike. Estimates for unobserved rungs scale the dynamic part (above idle) of
    the nearest observed rung by the ratio of priors, then add the offset. The first power seen at a new
    rung is that rung's own after a climb, but the offset's after a trip (a trip means something changed;
    its transient must not become a rung's base). A negative offset read at a rung whose power is only
    estimated may be the estimate's error: climbs from there count it as zero.
"""

from __future__ import annotations

import enum
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from edgetune.power.base import Knob, KnobValue

__all__ = [
    "Decision",
    "GuardMove",
    "GuardParams",
    "GuardState",
    "LadderModel",
    "Observation",
    "build_ladder",
    "control",
    "evolve",
    "frequency_prior",
    "hold",
]

# knobs the ladder is built on, in order of preference for the main rungs
PRIMARY_KNOBS = ("gpu_freq", "power_limit", "cpu_freq")
# knobs that extend the ladder below the primary knob's lowest value, in order
SECONDARY_KNOBS = ("cpu_freq", "emc_freq", "mem_freq")
#: fraction of board power a CPU or memory clock carries in the frequency prior (the GPU clock: all of the
#: dynamic part); on Jetson modules the GPU dominates a training step's dynamic power
SECONDARY_POWER_SHARE = 0.15
#: a bar after a repeat trip lasts this many times the last one (up to ``block_max_s``): exponential back-off
BAR_GROWTH = 2.0
#: fraction of ``target_margin``: with the 1-s average already over the budget, a trip needs the fast average
#: only within this much of the margin under it (the 1-s average lags; waiting for the fast one to cross
#: again would prolong the violation)
LAGGING_TRIP_FRACTION = 0.5


_T = TypeVar("_T")


def evolve(state: _T, **changes: Any) -> _T:
    """:func:`dataclasses.replace` for the laws' frozen states, without running ``__init__`` again.

    The laws run 20 times a second on hardware, and ``replace`` on a 13-field frozen dataclass costs about
    16 us of CPU (it re-checks and re-sets every field) against 3 us for copying the instance's fields. Only
    for the states whose ``__init__`` does nothing but set fields (no ``__post_init__``): :class:`GuardState`,
    :class:`~edgetune.runtime.batch_law.BatchState`, :class:`~edgetune.runtime.batch_law.Halving`.
    """
    unknown = changes.keys() - state.__dataclass_fields__.keys()  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{type(state).__name__} has no field(s) {', '.join(sorted(unknown))}")
    new = object.__new__(type(state))
    fields = new.__dict__
    fields.update(state.__dict__)
    fields.update(changes)
    return new


@dataclass(frozen=True)
class GuardParams:
    """Tuning of the control law (device-clock seconds; margins are fractions of the budget).

    Attributes:
        target_margin: after a trip, aim this far under the budget.
        up_margin: climb only when power now and the estimate for the new rung are this far under the budget
            (a rung measured before: ``target_margin``); the band between the margins is the hysteresis.
        fast_window_s: the short average a trip acts on. Short enough to act fast, long enough to average
            out sensor noise (20 samples at 100 Hz).
        down_dwell_s: after any move, the time before the next trip may act (the fast window must refill with
            the new rung's power, else one overshoot is counted twice).
        up_dwell_s: time at one rung with headroom before a climb.
        block_s: how long a tripped rung (and those above it) stays barred; doubles on a repeat trip within
            ``block_s`` of the last bar ending, up to ``block_max_s``.
        block_max_s: the longest bar.
        windup_fraction: a climb that raises power by less than this fraction of its estimate is undone.
        steady_fraction: climb only while power is flat: the fast and the 1-s average within this fraction
            of the budget of each other (a climb during a transient would misjudge the climb's effect).
        tick_s: how often the controller calls :func:`control` (device clock).
        batch_max_shrink: the batch size may fall to the chosen one divided by this (never below 1): 8 is
            three halvings. Each halving buys less power than the one before (the step's fixed costs stay
            while its work shrinks: on the twin's Orin Nano at the lowest clocks, a batch of 256 loses 0.53 W
            over three halvings and 0.2 W over the next two) and costs more throughput, and the
            learning-rate rules are approximations that hold near the batch size a run was tuned at. 1: the
            guard never changes the batch size.
        batch_dwell_s: the lowest rung over the budget this long (device time, steady readings) before a
            halving: a batch change alters the training, so a transient must not cause one.
        blind_s: no good power reading for this long (device time; for a sensor slower than a third of it,
            three of its updates) and the guard holds the lowest rung until one comes (:attr:`GuardMove.BLIND`):
            blind, it cannot tell a load rising over the budget, so it takes the safe side.
    """

    target_margin: float = 0.04
    up_margin: float = 0.08
    fast_window_s: float = 0.2
    down_dwell_s: float = 0.25
    up_dwell_s: float = 2.0
    block_s: float = 5.0
    block_max_s: float = 120.0
    windup_fraction: float = 0.25
    steady_fraction: float = 0.03
    tick_s: float = 0.05
    batch_max_shrink: int = 8
    batch_dwell_s: float = 0.5
    blind_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 <= self.target_margin < self.up_margin < 1:
            raise ValueError("guard margins must satisfy 0 <= target_margin < up_margin < 1")
        if min(self.fast_window_s, self.down_dwell_s, self.up_dwell_s, self.block_s, self.tick_s,
               self.batch_dwell_s, self.blind_s) <= 0:
            raise ValueError("guard times must be positive")
        if isinstance(self.batch_max_shrink, bool) or not isinstance(self.batch_max_shrink, int) \
                or self.batch_max_shrink < 1:
            raise ValueError(f"batch_max_shrink must be a whole number >= 1 (1: never change the batch size), "
                             f"got {self.batch_max_shrink!r}")


@dataclass(frozen=True)
class Observation:
    """What the guard sees at one tick.

    Attributes:
        t: device-clock time (s).
        fast_w: average board power over the last ``fast_window_s``.
        avg_w: the 1-s moving average (the figure the budget is judged by).
        budget_w: the budget in force now.
    """

    t: float
    fast_w: float
    avg_w: float
    budget_w: float


@dataclass(frozen=True)
class LadderModel:
    """Prior power estimates of each rung (ascending) and the device's idle power.

    ``prior_w`` need only be right in shape: observations calibrate it (see the module docstring).
    ``primary_steps[i]`` says that rung ``i`` differs from rung ``i - 1`` in the primary knob (GPU clock):
    only climbs over such steps can be capped by a thermal throttle, so only they get the anti-windup check
    (empty: every climb does).
    """

    prior_w: tuple[float, ...]
    idle_w: float = 0.0
    primary_steps: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.prior_w:
            raise ValueError("the ladder has no rungs")
        if self.primary_steps and len(self.primary_steps) != len(self.prior_w):
            raise ValueError("primary_steps needs one flag per rung")

    def moves_primary(self, lo: int, hi: int) -> bool:
        """Whether going from rung ``lo`` up to ``hi`` changes the primary knob (the one a throttle caps)."""
        if not self.primary_steps:
            return True
        return any(self.primary_steps[lo + 1: hi + 1])

    def __len__(self) -> int:
        return len(self.prior_w)

    def estimate(self, rung: int, observed: Mapping[int, float]) -> float:
        """Estimated power at ``rung`` from the observations (rung -> W) and the priors."""
        if rung in observed:
            return observed[rung]
        if not observed:
            return self.prior_w[rung]
        nearest = min(observed, key=lambda k: (abs(k - rung), -k))
        dyn_prior = self.prior_w[nearest] - self.idle_w
        ratio = (self.prior_w[rung] - self.idle_w) / dyn_prior if dyn_prior > 0 else 1.0
        return self.idle_w + (observed[nearest] - self.idle_w) * ratio


@dataclass(frozen=True)
class GuardState:
    """Everything the law remembers between ticks.

    Attributes:
        rung: the rung applied now.
        ceiling: the highest rung the guard may climb to (the plan's rung, or the top when the budget is
            raised above the plan's).
        changed_t: device time of the last move (or of the start).
        blocked_from: rungs at or above this are barred until ``blocked_until``.
        blocked_until: end of the bar.
        block_len_s: length of the current bar (doubles on repeat trips).
        observed: steady power seen per rung (rung -> W), without the additive offset.
        offset_w: the additive change seen since (another load, a warmer board): on every rung alike.
        learn_base: whether the first power seen at a new rung is taken as that rung's own (after a climb)
            or as a change of the offset (after a trip).
        measured: rungs whose power was seen there (the others in ``observed`` are estimates).
        climb_from: (rung, power before the climb, estimated rise) while a climb awaits its check.
        budget_w: the budget the state was built for (a change resets the bars).
        trips: trips so far.
    """

    rung: int
    ceiling: int
    changed_t: float = -math.inf
    blocked_from: int | None = None
    blocked_until: float = -math.inf
    block_len_s: float = 0.0
    observed: Mapping[int, float] = field(default_factory=dict)
    offset_w: float = 0.0
    learn_base: bool = True
    measured: frozenset[int] = frozenset()
    climb_from: tuple[int, float, float] | None = None
    budget_w: float | None = None
    trips: int = 0

    def barred(self, rung: int, t: float) -> bool:
        return self.blocked_from is not None and rung >= self.blocked_from and t < self.blocked_until


class GuardMove(enum.Enum):
    """What one tick of the law decided."""

    #: stay at the rung applied now
    HOLD = "hold"
    #: the fast average is over the budget: down to the highest rung estimated ``target_margin`` under it
    TRIP = "trip"
    #: headroom for ``up_dwell_s``: up to the highest unbarred rung estimated under the band
    CLIMB = "climb"
    #: anti-windup: the last climb raised power too little (the clock is capped); back to the rung before it
    UNDO_CLIMB = "undo climb"
    #: the lowest rung is over the budget for ``batch_dwell_s``: halve the batch size (down to the floor)
    SHRINK_BATCH = "shrink batch"
    #: the budget allows the batch size the guard last shrank from: back to it (one halving undone)
    GROW_BATCH = "grow batch"
    #: no power reading for ``blind_s``: the lowest rung until the sensor reads again (the controller decides it,
    #: :meth:`~edgetune.runtime.ladder_guard.LadderGuard.blind`; the law cannot judge what it does not see)
    BLIND = "blind"


@dataclass(frozen=True)
class Decision:
    """The law's output: the rung to apply, the kind of move and, for a move, why (one line for the events).

    Attributes:
        rung: the rung to apply (the current one for :attr:`GuardMove.HOLD` and the batch moves).
        kind: what the law decided.
        reason: the figures behind a move (empty for a hold).
        infeasible: no rung is estimated under the target: the lowest is the best the guard can do.
        batch_size: the batch size to apply for :attr:`GuardMove.SHRINK_BATCH` and
            :attr:`GuardMove.GROW_BATCH` (None for the rung moves).
    """

    rung: int
    kind: GuardMove = GuardMove.HOLD
    reason: str = ""
    infeasible: bool = False
    batch_size: int | None = None

    @property
    def moved(self) -> bool:
        """True when something is to be applied: a rung or a batch size (any kind but :attr:`GuardMove.HOLD`)."""
        return self.kind is not GuardMove.HOLD

    @property
    def batch_move(self) -> bool:
        """True for a change of the batch size (the rung stays)."""
        return self.kind in (GuardMove.SHRINK_BATCH, GuardMove.GROW_BATCH)


@functools.cache
def hold(rung: int) -> Decision:
    """The decision to stay at ``rung`` (decisions are immutable: one shared per rung, not one built per tick)."""
    return Decision(rung)


def _observe(observed: Mapping[int, float], offset_w: float, rung: int, now_w: float, model: LadderModel,
             learn_base: bool) -> tuple[Mapping[int, float], float]:
    """Take ``now_w`` seen at ``rung``; returns the observations (bases) and the additive offset.

    At a rung seen before, a change is an additive offset on every rung (another load, a warmer board). At
    a new rung the difference from its estimate is either the rung's own (``learn_base``: the guard climbed
    there, nothing suggests a disturbance) or the offset's (the guard tripped there: something changed, and
    the power seen in the transient cannot tell a base from an offset). Attributing a trip's transient to
    the new rung's base would carry the error into every later estimate.
    """
    if rung in observed:
        return observed, now_w - observed[rung]  # never mutated: the mapping is shared, not copied
    if learn_base or not observed:
        return dict(observed) | {rung: now_w - offset_w}, offset_w
    base = model.estimate(rung, observed)
    return dict(observed) | {rung: base}, now_w - base


def _bar_length(state: GuardState, t: float, params: GuardParams) -> float:
    """How long a new bar lasts.

    While a bar is in force the guard is still answering the same event (a second trip on the way down):
    the bar keeps its length. A trip within ``block_s`` after a bar ended means the guard climbed back into
    trouble: the bar doubles, up to ``block_max_s``. Otherwise ``block_s``.
    """
    if state.blocked_from is None or not state.block_len_s:
        return params.block_s
    if t < state.blocked_until:
        return state.block_len_s
    if t < state.blocked_until + params.block_s:
        return min(params.block_max_s, BAR_GROWTH * state.block_len_s)
    return params.block_s


def control(state: GuardState, obs: Observation, model: LadderModel, params: GuardParams) -> tuple[GuardState, Decision]:
    """One tick of the budget guard (pure): the next state and the rung to apply.

    >>> model = LadderModel((4.0, 6.0, 8.0, 10.0), idle_w=2.0)
    >>> s = GuardState(rung=3, ceiling=3)
    >>> s, d = control(s, Observation(t=0.0, fast_w=12.0, avg_w=11.0, budget_w=10.0), model, GuardParams())
    >>> d.rung, d.kind
    (2, <GuardMove.TRIP: 'trip'>)
    """
    t, budget = obs.t, obs.budget_w
    n = len(model)
    if not (math.isfinite(obs.fast_w) and math.isfinite(obs.avg_w)):
        return state, Decision(state.rung)
    # (a copy of the state only where something changed: the law runs 20 times a second on hardware, where
    # each copy is a noticeable share of its CPU time)
    if state.budget_w != budget:
        if state.budget_w is not None:
            # a new budget: bars earned under the old one no longer say anything
            state = evolve(state, blocked_from=None, blocked_until=-math.inf, block_len_s=0.0, climb_from=None)
        state = evolve(state, budget_w=budget)
    since = t - state.changed_t
    steady = since >= params.fast_window_s + params.tick_s
    if steady:
        new_rung = state.rung not in state.observed
        observed, offset = _observe(state.observed, state.offset_w, state.rung, obs.fast_w, model, state.learn_base)
        measured = state.measured | {state.rung} if new_rung and (state.learn_base or not state.observed) \
            else state.measured
        if observed is not state.observed or measured is not state.measured:
            state = evolve(state, observed=observed, offset_w=offset, measured=measured)
        elif offset != state.offset_w:
            state = evolve(state, offset_w=offset)

    def estimate(rung: int, observed: Mapping[int, float], offset: float) -> float:
        return model.estimate(rung, observed) + offset

    # --- trip: act on the fast average, once the fast window holds only the current rung's power
    over = obs.fast_w > budget or (obs.avg_w > budget and obs.fast_w > budget * (1 - LAGGING_TRIP_FRACTION * params.target_margin))
    if over and since >= params.down_dwell_s:
        now, offset = _observe(state.observed, state.offset_w, state.rung, obs.fast_w, model, state.learn_base)
        goal = budget * (1 - params.target_margin)
        below = [r for r in range(state.rung - 1, -1, -1) if estimate(r, now, offset) <= goal]
        target = below[0] if below else 0
        infeasible = not below
        if target == state.rung:  # already at the bottom: nothing left to give
            return evolve(state, observed=now, offset_w=offset), Decision(state.rung, infeasible=True)
        block = _bar_length(state, t, params)
        new = evolve(
            state, rung=target, changed_t=t, observed=now, offset_w=offset, climb_from=None, trips=state.trips + 1,
            learn_base=False,
            blocked_from=target + 1, blocked_until=t + block, block_len_s=block,
        )
        reason = f"trip: {obs.fast_w:.2f} W > {budget:.2f} W budget, down {state.rung - target} rung(s)"
        if infeasible:
            reason += " (the lowest rung: no rung is estimated under the target)"
        return new, Decision(target, GuardMove.TRIP, reason, infeasible)

    # --- anti-windup: a climb of the GPU clock that bought no power is undone
    if state.climb_from is not None and steady:
        prev, before_w, rise = state.climb_from
        state = evolve(state, climb_from=None)
        if model.moves_primary(prev, state.rung) and obs.fast_w - before_w < params.windup_fraction * rise:
            block = _bar_length(state, t, params)
            new = evolve(
                state, rung=prev, changed_t=t, blocked_from=prev + 1, blocked_until=t + block,
                block_len_s=block, observed={k: v for k, v in state.observed.items() if k <= prev},
            )
            return new, Decision(prev, GuardMove.UNDO_CLIMB,
                                 f"no response: +{obs.fast_w - before_w:.2f} W for an expected "
                                 f"+{rise:.2f} W (clock capped?), back {state.rung - prev} rung(s)")

    # --- climb: after a dwell with headroom, to the highest unbarred rung estimated under the band
    if since >= params.up_dwell_s and state.rung < min(state.ceiling, n - 1):
        band = budget * (1 - params.up_margin)
        flat = abs(obs.fast_w - obs.avg_w) <= params.steady_fraction * budget
        if obs.fast_w <= band and obs.avg_w <= band and flat:
            target = state.rung
            # a rung measured before is known to within the noise: it may be re-entered up to the trip
            # target; an estimated one only up to the band (its estimate may be off)
            known = budget * (1 - params.target_margin)
            # an offset below zero read at a rung whose power is only estimated may be the estimate's error,
            # not less load: climbing on it could overshoot, so it counts as zero there
            offset = state.offset_w if state.rung in state.measured else max(state.offset_w, 0.0)
            for r in range(state.rung + 1, min(state.ceiling, n - 1) + 1):
                limit = known if r in state.measured else band
                if state.barred(r, t) or estimate(r, state.observed, offset) > limit:
                    break
                target = r
            if target > state.rung:
                rise = model.estimate(target, state.observed) - model.estimate(state.rung, state.observed)
                new = evolve(state, rung=target, changed_t=t, climb_from=(state.rung, obs.fast_w, rise),
                              learn_base=True)
                return new, Decision(target, GuardMove.CLIMB, f"climb: {obs.avg_w:.2f} W under {band:.2f} W, "
                                                                f"up {target - state.rung} rung(s)")
    return state, hold(state.rung)


# ---------------------------------------------------------------------------------------------- ladders


def build_ladder(knobs: Mapping[str, Knob], setting: Mapping[str, KnobValue]) -> list[dict[str, KnobValue]]:
    """Rungs (complete settings, ascending power) around ``setting`` over the writable knobs.

    The main rungs run the primary knob (GPU frequency, else power limit, else CPU frequency) over its
    whole table with the other knobs as in ``setting``; below its lowest value the secondary knobs (CPU,
    EMC, memory frequency) step down one at a time, so a budget under the lowest GPU clock's power still
    has somewhere to go. Returns ``[dict(setting)]`` when no knob is writable (measure-only).
    """
    writable = {k: v for k, v in knobs.items() if v.writable and v.numeric}
    base = {k: v for k, v in setting.items()}
    primary = next((k for k in PRIMARY_KNOBS if k in writable), None)
    if primary is None:
        return [base]
    rungs = [dict(base, **{primary: v}) for v in writable[primary].values]
    floor = dict(rungs[0])
    extension: list[dict[str, KnobValue]] = []
    for name in SECONDARY_KNOBS:
        if name == primary or name not in writable:
            continue
        current = floor.get(name, writable[name].max)
        for v in reversed(writable[name].values):
            if v < current:
                floor = dict(floor, **{name: v})
                extension.append(floor)
    return list(reversed(extension)) + rungs


def frequency_prior(ladder: Sequence[Mapping[str, KnobValue]], knobs: Mapping[str, Knob], idle_w: float,
                    top_w: float) -> LadderModel:
    """A prior in shape only: dynamic power proportional to the product of each knob's value over its maximum.

    Linear in each clock is the least the dynamic power falls with frequency (it falls faster above the
    voltage knee), so the prior errs towards estimating too much power for low rungs: a trip then goes one
    rung too low rather than not low enough. Observations correct it.
    """
    primary = next((k for k in PRIMARY_KNOBS if any(k in rung for rung in ladder)
                    and len({rung.get(k) for rung in ladder}) > 1), None)
    scales = []
    for rung in ladder:
        s = 1.0
        for name, value in rung.items():
            knob = knobs.get(name)
            if knob is None or not knob.numeric or isinstance(value, str) or not float(knob.max) > 0:
                continue
            if name in PRIMARY_KNOBS or name in SECONDARY_KNOBS:
                # memory and CPU clocks carry a smaller share of board power than the GPU clock
                share = 1.0 if name == primary else SECONDARY_POWER_SHARE
                s *= (1 - share) + share * float(value) / float(knob.max)
        scales.append(s)
    top = max(scales) or 1.0
    return LadderModel(tuple(idle_w + (top_w - idle_w) * s / top for s in scales), idle_w=idle_w,
                       primary_steps=primary_steps(ladder))


def primary_steps(ladder: Sequence[Mapping[str, KnobValue]]) -> tuple[bool, ...]:
    """Per rung: does it differ from the rung below in the primary knob (see :class:`LadderModel`)."""
    primary = next((k for k in PRIMARY_KNOBS if any(k in rung for rung in ladder)
                    and len({rung.get(k) for rung in ladder}) > 1), None)
    if primary is None:
        return (False,) * len(ladder)
    return (False,) + tuple(a.get(primary) != b.get(primary) for a, b in itertools.pairwise(ladder))
