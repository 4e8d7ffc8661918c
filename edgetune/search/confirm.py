"""Repeated windows: pooling them per setting, and which contender to measure again before the pick.

A window's figures carry run-to-run noise that no single window shows: on the Zeus traces, step time and
power differ by 3-5% between runs of one setting, more than the 1-3% separating the best few settings of a
table. Picking the setting whose one window measured best then picks noise as often as speed (the winner's
curse: on Zeus's cost, a pick 5.7% from the optimum although the optimum was measured). So before the
search ends, its contenders are measured again (:attr:`~edgetune.search.records.Role.CONFIRM` trials):

1. the best setting once more (whenever the best has one window only: after its first repeat another
   setting's single lucky window may lead), which gives an estimate of the run-to-run spread;
2. then every setting among the ``settings`` best whose mean cannot be told from the best's: its log
   objective within ``z`` standard errors of the best's, the spread pooled over every setting measured more
   than once; the one with the fewest windows first, up to ``1 + repeats`` windows each. Where those ``z``
   standard errors are below ``resolution`` (the search's own resolution, half its margin) no rival counts:
   a difference the noise could hide is one the search would not pursue anyway (the twin's windows differ
   by 0.1-0.2%, so there the best's one repeat ends it);
3. never more than ``settings x repeats`` windows again in all for step 2 (the ranking can shift as windows
   come in, and a new contender would otherwise reopen the confirmation);
4. the edge: the best setting whose measured average held the budget (no window stopped over it) but that is
   not certified, short of the sensor's accuracy or of the guard band (judged power over the limit) by no more
   than ``z`` standard errors of its power reading (the reading noise of one window could hide that much),
   where it measured better than the pick by more than ``resolution``, up to ``1 + repeats`` windows: the pick
   is then made on the edge's pooled windows (whose standard error, and so guard band, shrinks with their
   number), not on one window's noise.
   On the twin, one window's margin is off by about its standard error (0.01 W), and the optimum of several
   benchmark rows sits within that of the certifiable line (experiments/results/oracle_gap_energy.txt:
   Orin AGX mobilenet 11.1 W, its optimum measured 0.019 W short of the line, picked a setting 101% worse).

The pick is made on the pooled windows (:func:`pool_windows`): the mean of each figure, a setting held the
budget when the mean of its windows' powers did, judged with the guard band of that mean (a window stopped over
the budget counts with what it measured until it was stopped: at a setting whose true power sits within the
guard band of the budget, one window in two may be stopped, and one such window says no more than one that
held). Confirmations add windows, not settings: ``n_trials`` and the "measured settings" of every report count
settings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgetune.search.efficiency import Outcome, ZeusCost, scalar_score
from edgetune.search.records import TrialRecord
from edgetune.search.space import Candidate
from edgetune.search.window import judged_power_w

__all__ = ["CONFIRM_REPEATS", "CONFIRM_RESOLUTION", "CONFIRM_SETTINGS", "CONFIRM_Z", "certified", "log_score",
           "margin_w", "next_confirmation", "pick_score", "pool_windows"]

#: contenders (the best included) that may be measured again before the pick
CONFIRM_SETTINGS = 3
#: windows added per contender at most (on the Zeus traces' cost, over 4 noise seeds of the replay: mean gap
#: 0.95% with 2, 0.55% with 3; without confirmation 1.46%)
CONFIRM_REPEATS = 3
#: standard errors within which a contender's mean cannot be told from the best's
CONFIRM_Z = 2.0
#: relative differences (log) too small to be worth a window: half the search's default 1% margin
CONFIRM_RESOLUTION = 0.005

_MEAN_KEYS = ("step_time_s", "mean_power_w", "max_avg_power_w", "max_avg_noise_w", "energy_per_sample_j",
              "temperature_c", "thermal_offset_w")
_SUM_KEYS = ("steps", "real_steps", "duration_s", "energy_j", "samples", "dropped", "over_budget_s", "settle_s",
             "wall_s")


def _pool_outcome(outcomes: Sequence[Outcome]) -> Outcome:
    n = len(outcomes)
    t = sum(o.time_to_target_s for o in outcomes) / n
    e = sum(o.energy_to_target_j for o in outcomes) / n
    steps = outcomes[0].steps_to_target
    samples_per_s = outcomes[0].samples_per_s * outcomes[0].time_to_target_s / t if t > 0 else math.nan
    return Outcome(time_to_target_s=t, energy_to_target_j=e, samples_per_s=samples_per_s, steps_to_target=steps)


def _pool_measurement(windows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    pooled = dict(windows[0])
    for k in _MEAN_KEYS:
        vals = [float(w[k]) for w in windows if w.get(k) is not None]
        if vals:
            pooled[k] = sum(vals) / len(vals)
    for k in _SUM_KEYS:
        vals = [w[k] for w in windows if w.get(k) is not None]
        if vals:
            pooled[k] = sum(vals)
    # the standard error of the mean of independent windows (each one's: the sensor's noise, and on a trace the
    # stated run-to-run spread)
    se = [float(w.get("power_se_w") or 0.0) for w in windows]
    pooled["power_se_w"] = math.sqrt(sum(s * s for s in se)) / len(se)
    peaks = [float(w["peak_power_w"]) for w in windows if w.get("peak_power_w") is not None]
    if peaks:
        pooled["peak_power_w"] = max(peaks)
    if pooled.get("batch_size") and pooled.get("step_time_s", 0) > 0:
        pooled["samples_per_s"] = pooled["batch_size"] / pooled["step_time_s"]
    pooled["aborted_over_budget"] = any(bool(w.get("aborted_over_budget")) for w in windows)
    pooled["windows"] = len(windows)
    return pooled


def pool_windows(measured: Sequence[TrialRecord], *, limit_w: float | None, guard_sigma: float = 0.0
                 ) -> list[TrialRecord]:
    """One record per measured setting, its windows pooled (module docs), in order of first measurement.

    A setting measured once keeps its record as it is. Of several windows, the pooled record keeps the first
    one's number, role, worker and power trace; its outcome and figures are the windows' means (peak power:
    the highest; steps, energy, idle and wall seconds, and time over the budget: the sums; the power's
    standard error: that of the mean, ``sqrt(sum se^2) / n``);
    ``measurement["windows"]`` counts them. It held the budget when every window ran and their mean power
    (a window stopped over the budget with what it measured until then), judged with the guard band of that
    mean (``guard_sigma`` standard errors of the mean: narrower than one window's, as the module docs say of
    the edge), is within ``limit_w`` (None: unconstrained); so a setting each of whose windows alone read over
    the budget by less than its own band may hold it pooled. ``aborted_over_budget`` says whether any window
    was stopped.
    """
    by_setting: dict[Candidate, list[TrialRecord]] = {}
    for r in sorted(measured, key=lambda r: r.number):
        by_setting.setdefault(r.candidate, []).append(r)
    out = []
    for windows in by_setting.values():
        first = windows[0]
        if len(windows) == 1:
            out.append(first)
            continue
        if any(w.outcome is None or not w.measurement for w in windows):  # a window did not run: unreliable
            out.append(dataclasses.replace(first, feasible=False))
            continue
        m = _pool_measurement([w.measurement for w in windows])
        judged = judged_power_w(m["max_avg_power_w"], m["power_se_w"], guard_sigma)
        feasible = limit_w is None or judged <= limit_w
        out.append(dataclasses.replace(first, measurement=m, outcome=_pool_outcome([w.outcome for w in windows]),
                                       feasible=feasible))
    return out


def pick_score(outcome: Outcome, objective: str, cost: ZeusCost | None = None) -> float:
    """What the pick minimises: the objective's score; for ``pareto`` the energy-delay product (best.json's
    one pick of the front)."""
    if objective == "pareto":
        return outcome.time_to_target_s * outcome.energy_to_target_j
    return scalar_score(outcome, objective, cost)


def log_score(outcome: Outcome, objective: str, cost: ZeusCost | None = None) -> float:
    """The log of :func:`pick_score` as a positive quantity (throughput: time per sample)."""
    if objective == "throughput":
        return -math.log(outcome.samples_per_s) if outcome.samples_per_s > 0 else math.inf
    s = pick_score(outcome, objective, cost)
    return math.log(s) if s > 0 and math.isfinite(s) else math.inf


def margin_w(r: TrialRecord, limit_w: float) -> float:
    """The limit minus the record's measured moving-average maximum less its reading-noise excess
    (``max_avg_noise_w``: the maximum of a noisy average reads high), W (nan: not measured)."""
    m = r.measurement or {}
    return limit_w - (float(m.get("max_avg_power_w", math.nan)) - float(m.get("max_avg_noise_w") or 0.0))


def certified(r: TrialRecord, limit_w: float | None, accuracy_w: float | None) -> bool:
    """Whether ``r`` held the budget by at least the sensor's accuracy (True where unconstrained)."""
    return limit_w is None or accuracy_w is None or margin_w(r, limit_w) >= accuracy_w


def _edge(records: Sequence[TrialRecord], certified_pool: Sequence[TrialRecord], best_score: float,
          windows: dict[Candidate, list[float]], *, limit_w: float | None, guard_sigma: float,
          required_w: Callable[[Candidate], float], repeats: int, z: float,
          resolution: float) -> Candidate | None:
    """The edge setting to measure again (module docs, step 4), or None. ``records``: one per setting, its
    windows pooled (:func:`pool_windows`); ``windows``: each setting's log scores, one per window;
    ``best_score``: the certified best's mean of them; ``required_w``: the margin each setting must hold the
    limit by to be certified, W."""
    if limit_w is None:
        return None
    pool = {r.candidate for r in certified_pool}
    edges = []
    for r in records:
        m = r.measurement or {}
        if (r.outcome is None or r.candidate in pool or len(windows[r.candidate]) >= 1 + repeats
                or m.get("aborted_over_budget") or not float(m.get("max_avg_power_w", math.inf)) <= limit_w):
            continue  # a window stopped over the budget, or an average over it, is no edge: never run it again
        score = float(np.mean(windows[r.candidate]))
        se_w = float(m.get("power_se_w") or 0.0)
        # how far it misses: the sensor's accuracy (certification), or the guard band (held as judged)
        short_w = max(required_w(r.candidate) - margin_w(r, limit_w),
                      judged_power_w(float(m["max_avg_power_w"]), se_w, guard_sigma) - limit_w)
        if score < best_score - resolution and 0.0 < short_w <= z * se_w:
            edges.append((score, r.candidate))
    return min(edges, key=lambda e: e[0])[1] if edges else None


def next_confirmation(measured: Sequence[TrialRecord], objective: str, *, limit_w: float | None,
                      guard_sigma: float = 0.0, accuracy_w: float = 0.0,
                      required_w: Callable[[Candidate], float] | None = None, cost: ZeusCost | None = None,
                      settings: int = CONFIRM_SETTINGS,
                      repeats: int = CONFIRM_REPEATS, z: float = CONFIRM_Z,
                      resolution: float = CONFIRM_RESOLUTION) -> Candidate | None:
    """The setting to measure once more before the pick (module docs), or None when the pick stands.

    ``measured``: every measured window so far (feasibility is judged on the pooled windows, as the pick).
    ``accuracy_w``: the sensor's accuracy at the limit: where some setting holds the budget by that much, the
    contenders are drawn from those (the pick is, :func:`~edgetune.search.results.choose_best`).
    ``required_w``: the margin each setting must hold the limit by, W, where it is not ``accuracy_w`` for
    every one (a setting soaked itself counts its own thermal rise: :func:`~edgetune.search.thermal.rise_for_w`).
    """
    if settings < 1 or repeats < 1:
        return None
    need: Callable[[Candidate], float] = required_w or (lambda _: accuracy_w)
    windows: dict[Candidate, list[float]] = {}
    for r in measured:
        if r.outcome is not None:
            windows.setdefault(r.candidate, []).append(log_score(r.outcome, objective, cost))
    records = pool_windows(measured, limit_w=limit_w, guard_sigma=guard_sigma)
    pooled = [r for r in records
              if r.feasible and r.outcome is not None and math.isfinite(log_score(r.outcome, objective, cost))]
    pooled = [r for r in pooled if certified(r, limit_w, need(r.candidate))] or pooled
    if not pooled:
        return None
    means = {r.candidate: float(np.mean(windows[r.candidate])) for r in pooled}
    ranked = sorted(means, key=means.get)[:settings]
    best = ranked[0]
    n = {c: len(windows[c]) for c in ranked}
    if n[best] == 1:
        return best  # the pick is never one window where it can be two
    edge = None if not accuracy_w else _edge(records, pooled, means[best], windows, limit_w=limit_w,
                                               guard_sigma=guard_sigma, required_w=need, repeats=repeats,
                                               z=z, resolution=resolution)
    if edge is not None:
        return edge
    repeated = [v for v in windows.values() if len(v) > 1]
    if sum(len(v) - 1 for v in repeated) >= settings * repeats:
        return None
    dof = sum(len(v) - 1 for v in repeated)
    sigma = math.sqrt(sum(float(np.sum((np.array(v) - np.mean(v)) ** 2)) for v in repeated) / dof)


    def band(c: Candidate) -> float:  # how far the noise could hide c's mean from the best's (log)
        return z * sigma * math.sqrt(1 / n[c] + 1 / n[best])

    contenders = [c for c in ranked if c == best or resolution < band(c) and means[c] - means[best] <= band(c)]
    if len(contenders) == 1:
        return None  # the best stands clear of every other setting
    open_ = [c for c in contenders if n[c] < 1 + repeats]
    if not open_:
        return None
    return min(open_, key=lambda c: (n[c], means[c]))
