"""The budget guard's outer loop: the batch size, once the ladder of knob settings is exhausted.

The ladder (:mod:`edgetune.runtime.guard`) trades clock speed for power at the batch size in force. When
its lowest rung is still over the budget (a budget under what the lowest clocks draw at this batch size,
another load on the board), only less work per step can lower power further: the guard halves the batch
size, and the controller applies it through :class:`~edgetune.runtime.loader.BatchLoader`, which scales
the learning rate by the run's rule. :func:`control_batch` is that law, a pure function composed with the
ladder's :func:`~edgetune.runtime.guard.control`.

The law, in words
    *Shrink.* The ladder's law reports its lowest rung over the budget with nothing left below (an
    infeasible hold). After ``batch_dwell_s`` of that, the batch size halves (the 1-s average counts only once
    its window holds the batch in force alone: for a second after a halving it still holds the larger
    batch's power, and only the fast average counts), down to the floor
    ``max(1, chosen // batch_max_shrink)`` (:attr:`~edgetune.runtime.guard.GuardParams.batch_max_shrink`
    says why 8). The power the halving bought is measured at the lowest rung: the power before it minus the
    first steady power after it (both at the same rung, so an additive load cancels). Another
    ``batch_dwell_s`` over the budget halves again.
    *Grow.* The guard undoes its moves in reverse order, the batch size first: the chosen batch size at a
    lower clock is closer to the plan than a smaller batch at a higher clock. After ``up_dwell_s`` at one
    rung with both averages under the hysteresis band (``budget * (1 - up_margin)``) and steady, the batch
    size goes back to the one it was last shrunk from when the power estimated there is under the band too:
    the power now plus what that halving bought at the lowest rung, scaled to the current rung by the
    ladder model's ratio of dynamic power (a higher clock draws more for the same extra work). Never above
    the chosen batch size.
    *No oscillation.* A halving happens over the budget, a doubling only with its estimate under the band:
    the gap is the hysteresis. After a halving, growing is barred for ``block_s``; a halving soon after a
    doubling (within ``block_s``: the guard grew back into trouble) doubles the bar, up to
    ``block_max_s``. While a batch change is on its way (the loader applies it with the next batch it draws)
    the law makes no other batch move and the ladder does not climb (the ladder restarts, at the rung in
    force, when the new batch size arrives). A new budget clears the bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgetune.runtime.guard import (
    BAR_GROWTH,
    Decision,
    GuardMove,
    GuardParams,
    GuardState,
    LadderModel,
    Observation,
    control,
    evolve,
    hold,
)

__all__ = ["BatchState", "Halving", "batch_floor", "batch_in_force", "control_batch", "grown_power_w"]

#: s: the window of :attr:`~edgetune.runtime.guard.Observation.avg_w`, the moving average the budget is judged by
AVG_WINDOW_S = 1.0


@dataclass(frozen=True)
class Halving:
    """One halving of the batch size the guard made.

    Attributes:
        larger: the batch size before it (where a doubling goes back to).
        smaller: the batch size after it.
        before_w: the fast average at the lowest rung when the guard decided it.
        saved_w: the power it bought at the lowest rung (None until a steady reading at the new batch size).
    """

    larger: int
    smaller: int
    before_w: float
    saved_w: float | None = None


@dataclass(frozen=True)
class BatchState:
    """What the batch-size law remembers; it outlives the ladder's state (the batch is the outer loop).

    Attributes:
        batch_size: the batch size in force.
        chosen: the batch size the run chose (plan, online tuner, user); the guard never grows above it.
        pending: a batch size the guard decided and the loader has not yet delivered.
        over_since: device time since which the lowest rung has been over the budget (None: it is not).
        halvings: the halvings not yet undone, the last one last.
        barred_until: no doubling before this device time.
        bar_len_s: the length of the last bar (it doubles when the guard grew back into trouble).
        grown_t: device time of the last doubling.
        budget_w: the budget the bar was earned under (a change clears it).
    """

    batch_size: int
    chosen: int
    pending: int | None = None
    over_since: float | None = None
    halvings: tuple[Halving, ...] = ()
    barred_until: float = -math.inf
    bar_len_s: float = 0.0
    grown_t: float = -math.inf
    budget_w: float | None = None


def batch_floor(chosen: int, params: GuardParams) -> int:
    """The smallest batch size the guard goes to: the chosen one over ``batch_max_shrink``, never below 1."""
    return max(1, chosen // params.batch_max_shrink)


def batch_in_force(state: BatchState | None, batch_size: int) -> BatchState:
    """The batch size ``batch_size`` arrived: the guard's pending change, or the run's own new choice (then
    the guard's record starts afresh at it)."""
    if state is not None and state.pending == batch_size:
        return evolve(state, batch_size=batch_size, pending=None, over_since=None)
    if state is not None and state.pending is None and state.batch_size == batch_size:
        return state
    return BatchState(batch_size=batch_size, chosen=batch_size)


def grown_power_w(state: GuardState, halving: Halving, obs: Observation, model: LadderModel) -> float:
    """Estimated power at the current rung after undoing ``halving``.

    The power now plus what the halving bought at the lowest rung, scaled by the ladder model's ratio of
    dynamic power (above idle) at the current rung to the lowest one. Not yet measured (the run moved on
    before a steady reading): the dynamic part is taken to double, which errs towards not growing.
    """
    saved = halving.saved_w
    if saved is None:
        saved = max(0.0, obs.fast_w - model.idle_w)
    dyn_low = model.estimate(0, state.observed) - model.idle_w
    dyn_now = model.estimate(state.rung, state.observed) - model.idle_w
    scale = max(1.0, dyn_now / dyn_low) if dyn_low > 0 else 1.0
    return obs.fast_w + saved * scale


def _not_over(state: BatchState) -> BatchState:
    """``state`` with no over-budget time running (the same object when there was none: no copy per tick)."""
    return state if state.over_since is None else evolve(state, over_since=None)


def _bar_length(state: BatchState, t: float, params: GuardParams) -> float:
    """How long growing stays barred after a halving at ``t`` (the rung bars' rule, on doublings)."""
    if t < state.barred_until:
        return state.bar_len_s  # the same event: a further halving on the way down
    if t - state.grown_t < params.block_s and state.bar_len_s:
        return min(params.block_max_s, BAR_GROWTH * state.bar_len_s)  # grew back into trouble
    return params.block_s


def control_batch(state: GuardState, batch: BatchState, obs: Observation, model: LadderModel, params: GuardParams,
                  allow: bool = True) -> tuple[GuardState, BatchState, Decision]:
    """One tick of the guard with its batch-size loop (pure): the next ladder and batch states, the decision.

    ``allow=False`` (the batches do not come from the controller's loader, or online tuning is exploring)
    leaves the batch size alone: this is then the ladder's :func:`~edgetune.runtime.guard.control`.

    >>> from edgetune.runtime.guard import GuardParams, GuardState, LadderModel, Observation
    >>> model, p = LadderModel((6.0, 8.0), idle_w=4.0), GuardParams()
    >>> g, b = GuardState(rung=0, ceiling=1, changed_t=0.0), BatchState(batch_size=128, chosen=128)
    >>> for k in range(12):  # 6.5 W at the lowest rung, budget 6 W
    ...     g, b, d = control_batch(g, b, Observation(0.5 + 0.05 * k, 6.5, 6.5, 6.0), model, p)
    ...     if d.moved:
    ...         break
    >>> d.kind, d.batch_size
    (<GuardMove.SHRINK_BATCH: 'shrink batch'>, 64)
    """
    t, budget = obs.t, obs.budget_w
    if not allow or not (math.isfinite(obs.fast_w) and math.isfinite(obs.avg_w)):
        new, d = control(state, obs, model, params)
        return new, _not_over(batch), d
    if batch.budget_w != budget:
        if batch.budget_w is not None:
            batch = evolve(batch, barred_until=-math.inf, bar_len_s=0.0)  # earned under another budget
        batch = evolve(batch, budget_w=budget)
    since = t - state.changed_t
    steady = since >= params.fast_window_s + params.tick_s

    # --- the power the last halving bought: the first steady reading at the lowest rung after it
    last = batch.halvings[-1] if batch.halvings else None
    if last is not None and last.saved_w is None and batch.pending is None and state.rung == 0 and steady:
        last = evolve(last, saved_w=max(0.0, last.before_w - obs.fast_w))
        batch = evolve(batch, halvings=(*batch.halvings[:-1], last))

    # --- grow: the last halving undone, before the ladder climbs
    if last is not None and batch.pending is None and t >= batch.barred_until and since >= params.up_dwell_s:
        band = budget * (1 - params.up_margin)
        flat = abs(obs.fast_w - obs.avg_w) <= params.steady_fraction * budget
        if obs.fast_w <= band and obs.avg_w <= band and flat:
            grown = grown_power_w(state, last, obs, model)
            if grown <= band:
                batch = evolve(batch, pending=last.larger, halvings=batch.halvings[:-1], over_since=None, grown_t=t)
                reason = (f"grow batch: {obs.avg_w:.2f} W now, {grown:.2f} W estimated at batch size {last.larger} "
                          f"under {band:.2f} W: batch size {batch.batch_size} -> {last.larger}")
                return state, batch, Decision(state.rung, GuardMove.GROW_BATCH, reason, batch_size=last.larger)

    new, d = control(state, obs, model, params)
    if batch.pending is not None:
        if d.kind is GuardMove.CLIMB:
            # a batch change is on its way: the ladder restarts with it, a climb now would judge the wrong batch
            return state, batch, hold(state.rung)
        return new, batch, d

    # --- shrink: the lowest rung over the budget with nothing below, for batch_dwell_s. The ladder's trip
    # also acts on a lagging 1-s average; a halving does so only once that window holds this batch's power
    # alone (else the larger batch's power, in it for a second after a halving, would halve again)
    judged = obs.fast_w > budget or since >= AVG_WINDOW_S + params.tick_s
    if not (d.kind is GuardMove.HOLD and d.infeasible and judged):
        return new, _not_over(batch), d
    over_since = batch.over_since if batch.over_since is not None else t
    if batch.over_since is None:
        batch = evolve(batch, over_since=over_since)
    target = max(batch_floor(batch.chosen, params), batch.batch_size // 2)
    if target >= batch.batch_size or t - over_since < params.batch_dwell_s:
        return new, batch, d  # at the floor, or not yet sustained: the lowest rung is the best there is
    bar = _bar_length(batch, t, params)
    halving = Halving(batch.batch_size, target, obs.fast_w)
    batch = evolve(batch, pending=target, over_since=None, halvings=(*batch.halvings, halving),
                    barred_until=t + bar, bar_len_s=bar)
    reason = (f"shrink batch: {obs.fast_w:.2f} W > {budget:.2f} W budget at the lowest setting for "
              f"{t - over_since:.2f} s: batch size {halving.larger} -> {target}")
    return new, batch, Decision(new.rung, GuardMove.SHRINK_BATCH, reason, infeasible=True, batch_size=target)
