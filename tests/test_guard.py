"""The budget guard's control laws (the ladder and the batch size) as pure functions, and in closed loops with
simple seeded plants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetune.power.base import Knob
from edgetune.runtime.batch_law import (
    BatchState,
    Halving,
    batch_floor,
    batch_in_force,
    control_batch,
    grown_power_w,
)
from edgetune.runtime.guard import (
    GuardMove,
    GuardParams,
    GuardState,
    LadderModel,
    Observation,
    build_ladder,
    control,
    frequency_prior,
)
from edgetune.runtime.ladder_guard import LadderGuard

P = GuardParams()
# power per rung of a plant whose dynamic power grows faster than linearly with the clock
FREQS = np.linspace(306e6, 1020e6, 9)
IDLE = 3.0
TRUE_W = tuple(IDLE + 9.0 * (f / FREQS[-1]) ** 1.8 for f in FREQS)


def obs(t: float, fast: float, avg: float | None = None, budget: float = 10.0) -> Observation:
    return Observation(t, fast, fast if avg is None else avg, budget)


def test_trip_jumps_to_the_highest_rung_estimated_under_the_target():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=8, ceiling=8)
    state, d = control(state, obs(5.0, TRUE_W[8]), model, P)
    assert d.moved and d.kind is GuardMove.TRIP and d.reason.startswith("trip: ")
    goal = 10.0 * (1 - P.target_margin)
    assert TRUE_W[d.rung] <= goal < TRUE_W[d.rung + 1]
    assert state.barred(d.rung + 1, 5.0) and not state.barred(d.rung, 5.0)
    assert state.trips == 1


def test_an_additive_load_is_corrected_in_one_move():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=5, ceiling=8, changed_t=0.0)
    state, d = control(state, obs(3.0, TRUE_W[5]), model, P)  # steady: learns rung 5
    assert not d.moved
    state, d = control(state, obs(3.05, TRUE_W[5] + 2.5), model, P)  # +2.5 W from another process
    assert d.kind is GuardMove.TRIP
    assert TRUE_W[d.rung] + 2.5 <= 10.0 * (1 - P.target_margin) < TRUE_W[d.rung + 1] + 2.5


def test_no_move_inside_the_hysteresis_band():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=4, ceiling=8, changed_t=0.0)
    # between budget * (1 - up_margin) and the budget: neither trip nor climb, however long
    for i in range(200):
        state, d = control(state, obs(1.0 + 0.05 * i, 10.0 * (1 - P.up_margin / 2)), model, P)
        assert not d.moved


def test_climb_after_dwell_then_barred_rung_is_not_reentered_until_the_bar_ends():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=8, ceiling=8, changed_t=0.0)
    state, _ = control(state, obs(1.0, TRUE_W[8], budget=12.0), model, P)  # steady at the top rung
    state, d = control(state, obs(1.05, TRUE_W[8] + 3.0, budget=12.0), model, P)  # +3 W load: trip
    low = d.rung
    assert d.kind is GuardMove.TRIP and TRUE_W[low] + 3.0 <= 12.0 * (1 - P.target_margin)
    # the load stays 3 s, then goes away: headroom, but the rungs above the trip stay barred
    t = 1.05
    while t < 1.05 + P.block_s - 0.1:
        t += P.tick_s
        load = 3.0 if t < 4.0 else 0.0
        state, d = control(state, obs(t, TRUE_W[state.rung] + load, budget=12.0), model, P)
        assert state.rung == low
    # after the bar the guard climbs to the highest rung under the band, and stays there
    for _ in range(400):
        t += P.tick_s
        state, d = control(state, obs(t, TRUE_W[state.rung], budget=12.0), model, P)
    assert state.rung == max(r for r in range(9) if TRUE_W[r] <= 12.0 * (1 - P.up_margin))


def test_a_second_trip_on_the_way_down_keeps_the_bar_a_trip_after_it_doubles_it():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=8, ceiling=8)
    state, _ = control(state, obs(0.0, 12.0), model, P)
    first_until = state.blocked_until
    state, d = control(state, obs(0.5, 11.0), model, P)  # same event, still too high: further down
    assert d.kind is GuardMove.TRIP and state.block_len_s == P.block_s and state.blocked_until > first_until
    # the bar ends, the guard climbs back and trips again soon after: now the bar doubles
    state = GuardState(**{**state.__dict__, "rung": 8, "changed_t": state.blocked_until})
    state, _ = control(state, obs(state.blocked_until + 1.0, 12.0), model, P)
    assert state.block_len_s == pytest.approx(2 * P.block_s)


def test_a_climb_that_buys_no_power_is_undone():
    """Anti-windup: a capped clock (thermal throttle) makes higher rungs draw nothing more."""
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=3, ceiling=8, changed_t=0.0)
    capped = TRUE_W[3]
    t, moves = 0.0, []
    while t < 2 * P.up_dwell_s + 2 * P.block_s:
        t += P.tick_s
        state, d = control(state, obs(t, capped), model, P)
        if d.moved:
            moves.append(d.kind)
    assert moves == [GuardMove.CLIMB, GuardMove.UNDO_CLIMB] * 2  # a second try after the first bar, the next bar is twice as long
    assert state.rung == 3 and state.block_len_s == 2 * P.block_s


def test_a_lower_budget_is_followed_and_clears_the_old_bars():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=8, ceiling=8)
    state, _ = control(state, obs(0.0, TRUE_W[8]), model, P)
    assert state.blocked_from is not None
    state, d = control(state, obs(1.0, TRUE_W[state.rung], budget=7.0), model, P)
    assert d.kind is GuardMove.TRIP and TRUE_W[d.rung] <= 7.0 * (1 - P.target_margin)
    assert state.blocked_until == pytest.approx(1.0 + P.block_s)


def test_budget_below_the_lowest_rung_is_reported_infeasible():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state, d = control(GuardState(rung=4, ceiling=8), obs(0.0, TRUE_W[4], budget=2.0), model, P)
    assert d.rung == 0 and d.infeasible
    state, d = control(state, obs(1.0, TRUE_W[0], budget=2.0), model, P)
    assert not d.moved and d.infeasible and d.kind is GuardMove.HOLD and not d.reason


def test_non_finite_power_changes_nothing():
    state = GuardState(rung=2, ceiling=8)
    new, d = control(state, obs(0.0, math.nan), LadderModel(TRUE_W, idle_w=IDLE), P)
    assert new == state and not d.moved


def test_params_are_validated():
    with pytest.raises(ValueError, match="margins"):
        GuardParams(target_margin=0.1, up_margin=0.05)
    with pytest.raises(ValueError, match="positive"):
        GuardParams(tick_s=0)


# ---------------------------------------------------------------------------------------------- closed loop


def _closed_loop(disturbances, budgets, seconds=60.0, seed=0, start_rung=8):
    """Run the law against a plant: rung power + additive offset (+ a clock cap), 100 Hz noisy samples."""
    rng = np.random.default_rng(seed)
    prior = frequency_prior([{"gpu_freq": f} for f in FREQS],
                            {"gpu_freq": Knob("gpu_freq", "Hz", list(FREQS), read=lambda: FREQS[-1])},
                            IDLE, 12.0)
    state = GuardState(rung=start_rung, ceiling=8)
    dt, t = 0.01, 0.0
    ts, ps, moves = [], [], 0
    for k in range(int(seconds / dt)):
        t = k * dt
        offset = sum(w for (t0, w, _cap) in disturbances if t >= t0)
        cap = min([c for (t0, _w, c) in disturbances if t >= t0 and c is not None], default=len(FREQS) - 1)
        rung = min(state.rung, cap)
        ts.append(t)
        ps.append(TRUE_W[rung] + offset + rng.normal(0, 0.15))
        if k % int(P.tick_s / dt) == 0 and t > 0:
            budget = [w for (t0, w) in budgets if t >= t0][-1]
            arr_t, arr_p = np.asarray(ts), np.asarray(ps)
            fast = arr_p[arr_t > t - P.fast_window_s].mean()
            avg = arr_p[arr_t > t - 1.0].mean()
            state, d = control(state, Observation(t, fast, avg, budget), prior, P)
            moves += d.moved
    t_arr, p_arr = np.asarray(ts), np.asarray(ps)
    avg = np.array([p_arr[(t_arr > x - 1.0) & (t_arr <= x)].mean() for x in t_arr])
    budget = np.array([[w for (t0, w) in budgets if x >= t0][-1] for x in t_arr])
    return t_arr, avg, budget, moves


def _last_over_after(t, avg, budget, t0, t1):
    sel = (t >= t0) & (t < t1) & (avg > budget)
    return float(t[sel].max() - t0) if sel.any() else 0.0


def test_closed_loop_settles_within_two_seconds_without_oscillation():
    events = [(10.0, 2.5, None), (30.0, -2.5, None), (40.0, 0.0, 2), (50.0, 0.0, None)]
    # at 40 s the clock is capped at rung 2 (throttle); the cap stays: the guard must not wind up
    t, avg, budget, moves = _closed_loop(events, [(0.0, 10.0), (20.0, 7.0), (25.0, 10.0)])
    assert moves <= 16  # a few moves per event, no limit cycle
    for t0, t1 in [(0.0, 10.0), (10.0, 20.0), (20.0, 25.0), (25.0, 30.0), (30.0, 40.0), (40.0, 60.0)]:
        assert _last_over_after(t, avg, budget, t0, t1) <= 2.0, (t0, t1)
    # the last 20 s (no new event after 40 s) are quiet: the guard sits still
    _, avg2, budget2, _ = _closed_loop([(0.0, 1.0, None)], [(0.0, 10.0)], seconds=40.0, seed=1)
    assert (avg2[t[: avg2.size] > 3.0] <= budget2[t[: avg2.size] > 3.0]).all()


def test_closed_loop_is_deterministic_under_a_seed():
    a = _closed_loop([(5.0, 2.0, None)], [(0.0, 10.0)], seconds=15.0, seed=3)
    b = _closed_loop([(5.0, 2.0, None)], [(0.0, 10.0)], seconds=15.0, seed=3)
    assert np.array_equal(a[1], b[1]) and a[3] == b[3]


# ---------------------------------------------------------------------------------------------- ladders


def _knob(name, unit, values, writable=True):
    return Knob(name, unit, values, read=lambda: values[-1], write=(lambda v: None) if writable else None)


def test_ladder_runs_the_gpu_table_then_steps_memory_down():
    knobs = {"gpu_freq": _knob("gpu_freq", "Hz", [306e6, 612e6, 918e6]),
             "emc_freq": _knob("emc_freq", "Hz", [204e6, 665e6, 2133e6]),
             "power_mode": Knob("power_mode", "", ["7W", "15W"], read=lambda: "15W", write=lambda v: None)}
    ladder = build_ladder(knobs, {"gpu_freq": 918e6, "emc_freq": 2133e6, "power_mode": "15W"})
    assert [r["gpu_freq"] for r in ladder] == [306e6, 306e6, 306e6, 612e6, 918e6]
    assert [r["emc_freq"] for r in ladder] == [204e6, 665e6, 2133e6, 2133e6, 2133e6]
    assert all(r["power_mode"] == "15W" for r in ladder)
    prior = frequency_prior(ladder, knobs, idle_w=2.0, top_w=10.0)
    assert list(prior.prior_w) == sorted(prior.prior_w) and prior.prior_w[-1] == pytest.approx(10.0)


def test_measure_only_has_a_single_rung():
    knobs = {"gpu_freq": _knob("gpu_freq", "Hz", [306e6, 918e6], writable=False)}
    assert build_ladder(knobs, {"gpu_freq": 918e6}) == [{"gpu_freq": 918e6}]


def test_estimate_scales_the_dynamic_part_of_the_nearest_observation():
    model = LadderModel((4.0, 6.0, 10.0), idle_w=2.0)
    assert model.estimate(0, {}) == 4.0
    assert model.estimate(0, {2: 18.0}) == pytest.approx(2.0 + 16.0 * 2.0 / 8.0)
    assert model.estimate(1, {0: 5.0, 2: 18.0}) in (pytest.approx(2.0 + 3.0 * 2.0), pytest.approx(2.0 + 16 * 0.5))


def test_after_the_load_goes_the_guard_climbs_back_without_overshoot_despite_a_wrong_prior():
    """The prior overestimates the low rungs by 1 W: after a trip there, power reads 1 W low when the load
    goes, which is the estimate's error, not less load. The guard climbs back without tripping again."""
    model = LadderModel(TRUE_W, idle_w=IDLE)

    def plant(rung, load):
        return (TRUE_W[rung] if rung == 8 else TRUE_W[rung] - 1.0) + load

    state = GuardState(rung=8, ceiling=8, changed_t=0.0)
    t, budget, trips_after = 0.0, 12.2, 0
    while t < 30.0:
        t += P.tick_s
        load = 3.0 if 1.0 <= t < 3.0 else 0.0
        state, d = control(state, obs(t, plant(state.rung, load), budget=budget), model, P)
        trips_after += t > 3.5 and d.kind is GuardMove.TRIP
    assert trips_after == 0 and state.trips >= 1
    assert state.rung == 8 and 8 in state.measured  # back at the top: 12.0 W fits 12.2 W


# ---------------------------------------------------------------------------------------------- batch size


def _over_at_bottom(state, batch, t0, t1, power, budget=3.8, model=None):
    """Tick the composed law from t0 to t1 at a constant power; returns the states and the moves."""
    model = model or LadderModel(TRUE_W, idle_w=IDLE)
    moves, t = [], t0
    while t < t1 - 1e-9:
        state, batch, d = control_batch(state, batch, obs(t, power, budget=budget), model, P)
        if d.moved:
            moves.append((t, d))
        t += P.tick_s
    return state, batch, moves


def test_the_batch_halves_only_after_the_lowest_rung_is_over_for_the_dwell_and_never_below_the_floor():
    state, batch = GuardState(rung=0, ceiling=8, changed_t=0.0), BatchState(batch_size=128, chosen=128)
    state, batch, moves = _over_at_bottom(state, batch, 0.3, 0.3 + P.batch_dwell_s - 0.01, 4.2)
    assert moves == [] and batch.over_since == pytest.approx(0.3)  # over, not yet for the dwell
    state, batch, moves = _over_at_bottom(state, batch, 0.8, 3.0, 4.2)
    assert len(moves) == 1  # the change is on its way: no second halving before it arrives
    d = moves[0][1]
    assert d.kind is GuardMove.SHRINK_BATCH and d.batch_size == 64 and d.rung == 0 and d.infeasible
    assert d.reason.startswith("shrink batch: 4.20 W > 3.80 W budget at the lowest setting")
    assert batch.pending == 64 and batch.halvings == (Halving(128, 64, 4.2),)
    # the loader delivers it; the ladder restarts at the lowest rung; the first steady reading says what it bought
    batch = batch_in_force(batch, 64)
    state = GuardState(rung=0, ceiling=8, changed_t=3.0)
    state, batch, _ = _over_at_bottom(state, batch, 3.0, 3.2, 3.9)
    assert batch.halvings[-1].saved_w is None  # the fast window still holds the old batch's power
    state, batch, _ = _over_at_bottom(state, batch, 3.3, 3.35, 3.9)
    assert batch.halvings[-1].saved_w == pytest.approx(0.3)
    # a dip under the budget restarts the dwell
    state, batch, moves = _over_at_bottom(state, batch, 3.35, 3.5, 3.9)
    assert batch.over_since is not None
    state, batch, _ = _over_at_bottom(state, batch, 3.5, 3.55, 3.7)
    assert batch.over_since is None
    # halving goes on down to the floor, 128 // batch_max_shrink, and stops there
    for b in (64, 32):
        state, batch, moves = _over_at_bottom(state, batch, 4.0, 6.0, 3.9)
        assert [m[1].batch_size for m in moves] == [b // 2]
        batch = batch_in_force(batch, b // 2)
    state, batch, moves = _over_at_bottom(state, batch, 6.0, 12.0, 3.9)
    assert moves == [] and batch.batch_size == batch_floor(128, P) == 16


def test_the_batch_grows_back_when_the_estimate_at_the_larger_batch_is_under_the_band():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=0, ceiling=8, changed_t=0.0)
    batch = BatchState(batch_size=64, chosen=128, halvings=(Halving(128, 64, 4.03, saved_w=0.2),))
    # at 3.83 W the larger batch is estimated at 4.03 W: over the band of a 4.2 W budget (3.86 W), no growth
    _, _, moves = _over_at_bottom(state, batch, 0.3, 10.0, 3.83, budget=4.2, model=model)
    assert moves == []
    # a budget of 4.5 W: the band is 4.14 W; after up_dwell_s the batch doubles, before any climb
    _, grown, moves = _over_at_bottom(state, batch, 0.3, 10.0, 3.83, budget=4.5, model=model)
    d = moves[0][1]
    assert moves[0][0] >= P.up_dwell_s and d.kind is GuardMove.GROW_BATCH and d.batch_size == 128
    assert d.reason.startswith("grow batch: 3.83 W now, 4.03 W estimated at batch size 128 under 4.14 W")
    assert grown.pending == 128 and grown.halvings == ()


def test_the_growth_estimate_scales_what_a_halving_bought_by_the_rungs_dynamic_power():
    model = LadderModel((4.0, 6.0, 10.0), idle_w=2.0)
    halving = Halving(128, 64, 4.5, saved_w=0.5)
    at_top = GuardState(rung=2, ceiling=2)
    # the top rung's dynamic power is 8 W against 2 W at the lowest: the same extra work draws 4x as much
    assert grown_power_w(at_top, halving, obs(0.0, 9.0), model) == pytest.approx(9.0 + 0.5 * 4)
    assert grown_power_w(GuardState(rung=0, ceiling=2), halving, obs(0.0, 4.0), model) == pytest.approx(4.5)
    # not measured: the dynamic part is taken to double
    assert grown_power_w(at_top, Halving(128, 64, 4.5), obs(0.0, 9.0), model) == pytest.approx(9.0 + 7.0 * 4)


def test_a_halving_soon_after_a_doubling_doubles_the_bar_and_a_pending_change_holds_the_ladder():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state = GuardState(rung=0, ceiling=8, changed_t=0.0)
    batch = BatchState(batch_size=128, chosen=128, bar_len_s=P.block_s, barred_until=-10.0, grown_t=-1.0)
    _, batch, moves = _over_at_bottom(state, batch, 0.3, 1.0, 4.2, model=model)
    assert moves[0][1].kind is GuardMove.SHRINK_BATCH
    assert batch.bar_len_s == 2 * P.block_s and batch.barred_until == pytest.approx(moves[0][0] + 2 * P.block_s)
    # while the halving is on its way, headroom does not make the ladder climb
    quiet = GuardState(rung=2, ceiling=8, changed_t=0.0)
    _, _, moves = _over_at_bottom(quiet, batch, 0.3, 5.0, TRUE_W[2], budget=12.0, model=model)
    assert moves == []


def test_without_permission_the_composed_law_is_the_ladder_law():
    model = LadderModel(TRUE_W, idle_w=IDLE)
    state, batch = GuardState(rung=0, ceiling=8, changed_t=0.0), BatchState(batch_size=128, chosen=128)
    for k in range(100):
        o = obs(0.3 + P.tick_s * k, 4.2, budget=3.8)
        expected = control(state, o, model, P)
        state, batch, d = control_batch(state, batch, o, model, P, allow=False)
        assert (state, d) == expected and not d.moved and batch.pending is None


def test_batch_params_are_validated():
    with pytest.raises(ValueError, match="batch_max_shrink"):
        GuardParams(batch_max_shrink=0)
    with pytest.raises(ValueError, match="batch_max_shrink"):
        GuardParams(batch_max_shrink=2.5)
    with pytest.raises(ValueError, match="positive"):
        GuardParams(batch_dwell_s=0)
    assert batch_floor(6, GuardParams()) == 1 and batch_floor(100, GuardParams()) == 12


def _batch_closed_loop(budgets, loads=(), seconds=60.0, seed=0, step_s=0.06):
    """The guard (LadderGuard: both laws) against a plant whose dynamic power grows with the batch size as
    (b / 128) ** 0.35; a batch change arrives at the next step, and the ladder restarts then (the controller's
    rule). Returns the times, the 1-s averages, the budgets, the batch sizes and the decisions."""
    rng = np.random.default_rng(seed)
    ladder = [{"gpu_freq": f} for f in FREQS]
    model = LadderModel(TRUE_W, idle_w=IDLE)
    guard = LadderGuard(P, reference_budget_w=budgets[0][1])
    guard.anchor, guard.allow_batch = dict(ladder[-1]), True
    guard.batch_arrived(128)
    guard.reset(ladder, model, ladder[-1], budgets[0][1], 0.0)
    batch, arriving, decisions = 128, None, []
    dt = 0.01
    ts, ps, batches = [], [], []
    for k in range(int(seconds / dt)):
        t = k * dt
        if arriving is not None and t >= arriving[0]:
            batch = arriving[1]
            guard.batch_arrived(batch)
            guard.reset(ladder, model, ladder[guard.state.rung], guard.state.budget_w, t)
            arriving = None
        load = sum(w for (t0, t1, w) in loads if t0 <= t < t1)
        power = IDLE + (TRUE_W[guard.state.rung] - IDLE) * (batch / 128) ** 0.35 + load + rng.normal(0, 0.05)
        ts.append(t)
        ps.append(power)
        batches.append(batch)
        if k % int(P.tick_s / dt) == 0 and t > 0:
            budget = [w for (t0, w) in budgets if t >= t0][-1]
            arr_t, arr_p = np.asarray(ts), np.asarray(ps)
            fast = arr_p[arr_t > t - P.fast_window_s].mean()
            avg = arr_p[arr_t > t - 1.0].mean()
            d = guard.tick(Observation(t, fast, avg, budget))
            if d.moved:
                decisions.append((t, d))
            if d.batch_move:
                arriving = (t + step_s, d.batch_size)
    t_arr, p_arr = np.asarray(ts), np.asarray(ps)
    avg = np.array([p_arr[(t_arr > x - 1.0) & (t_arr <= x)].mean() for x in t_arr])
    budget = np.array([[w for (t0, w) in budgets if x >= t0][-1] for x in t_arr])
    return t_arr, avg, budget, np.asarray(batches), decisions


def test_closed_loop_a_budget_under_the_lowest_rung_halves_the_batch_and_a_higher_one_restores_it():
    t, avg, budget, batches, decisions = _batch_closed_loop([(0.0, 10.0), (10.0, 3.8), (30.0, 10.0)])
    kinds = [d.kind for _, d in decisions if d.batch_move]
    assert kinds == [GuardMove.SHRINK_BATCH] * 2 + [GuardMove.GROW_BATCH] * 2  # 128 -> 64 -> 32 -> 64 -> 128
    assert batches[(t > 14.0) & (t < 30.0)].tolist() == [32] * int(((t > 14.0) & (t < 30.0)).sum())
    assert _last_over_after(t, avg, budget, 10.0, 30.0) <= 3.0
    assert batches[-1] == 128 and (avg[t > 45.0] <= 10.0).all()


def test_closed_loop_the_batch_follows_a_load_and_comes_back_when_it_goes_without_oscillating():
    """+0.8 W from 10 s to 20 s under a 4.5 W budget: 128 and 64 do not fit at the lowest rung with the load,
    32 does. The halvings' measured power cancels the load, so the growth estimates are right after it."""
    t, avg, budget, batches, decisions = _batch_closed_loop([(0.0, 4.5)], loads=[(10.0, 20.0, 0.8)], seconds=45.0,
                                                            seed=2)
    kinds = [d.kind for _, d in decisions if d.batch_move]
    assert kinds == [GuardMove.SHRINK_BATCH] * 2 + [GuardMove.GROW_BATCH] * 2
    assert set(batches[(t > 14.0) & (t < 20.0)].tolist()) == {32} and batches[-1] == 128
    assert _last_over_after(t, avg, budget, 10.0, 20.0) <= 3.0 and _last_over_after(t, avg, budget, 20.0, 45.0) <= 0.5


def test_closed_loop_a_budget_between_two_batch_sizes_does_not_oscillate():
    """3.85 W: 64 fits by 0.04 W at the lowest rung (the sensor noise is 0.05 W), 128 does not, and growing
    back needs the band (3.54 W): one halving, then quiet for a minute. The 1-s average, still over the
    budget for a second after the halving, must not cause a second one."""
    t, _, _, batches, decisions = _batch_closed_loop([(0.0, 3.85)], seconds=60.0, seed=4)
    assert [(d.kind, d.batch_size) for _, d in decisions if d.batch_move] == [(GuardMove.SHRINK_BATCH, 64)]
    assert set(batches[t > 2.0].tolist()) == {64} and len(decisions) == 2  # the first trip, one halving


def test_evolve_is_replace_for_the_laws_states_and_refuses_unknown_fields():
    import dataclasses

    from edgetune.runtime.guard import evolve, hold

    states = [GuardState(rung=2, ceiling=8, observed={2: 5.0}), BatchState(batch_size=64, chosen=128),
              Halving(128, 64, 6.5)]
    changes = [{"offset_w": 1.5, "trips": 3}, {"pending": 32, "over_since": 1.0}, {"saved_w": 0.2}]
    for state, change in zip(states, changes):
        new = evolve(state, **change)
        assert new == dataclasses.replace(state, **change) and type(new) is type(state) and new is not state
        assert state == dataclasses.replace(new, **{k: getattr(state, k) for k in change})  # the original intact
        with pytest.raises(TypeError, match="no field"):
            evolve(state, rungs=3)
    assert hold(4) is hold(4) and hold(4) == type(hold(4))(4) and not hold(4).moved
