"""The predictor-guided sampler: measure only where the hardware model says it could pay.

After a small space-filling start, every proposal is made from the whole space at once: the
:class:`~edgetune.predictors.HardwareModel` is fitted on the settings measured so far (step time and the
budget's moving-average power, with uncertainty), predicts every setting of the grid, and the sampler
proposes the unmeasured setting with the largest *constrained expected improvement*: the expected
improvement of the objective (in log space, where the model's errors are relative) times the probability
that the setting holds the budget. So measurements go where the prediction could beat the incumbent, or
where feasibility is uncertain (power near the budget) and the prize is large.

:meth:`GuidedSampler.should_stop` ends the search when no unmeasured setting has a meaningful chance to
improve the best by the margin (optimistic bound at two standard deviations, and at least 5% probability of
holding the budget).

It is an ordinary Optuna sampler: trials, storage, resume and fleets work as with any other; a fleet's
workers see each other's trials and avoid settings another worker is measuring (RUNNING trials).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from edgetune.search.efficiency import TargetModel
from edgetune.search.space import BATCH, LEVEL, SearchSpace

__all__ = ["GuidedSampler"]


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


def _norm_pdf(z: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


class GuidedSampler(BaseSampler):
    """Constrained expected improvement over the whole grid, from the hardware model's predictions.

    Args:
        space: the search space (its grid is scored at every proposal).
        objective: ``time``, ``energy``, ``throughput`` or ``pareto`` (alternates time and energy).
        budget_w: the budget (None: unconstrained); tolerance: allowed overshoot fraction.
        target: steps to target per batch size.
        seed: seed of the space-filling start and of ties.
        n_startup: measured settings (baseline probes included) before the model is used.
        min_group: measured settings a power mode needs before it gets a model of its own.
        stop_kappa: standard deviations of optimism in the stopping rule.
        stop_confirmations: successive fits that must agree there is nothing left before stopping.
        min_feasible_p: settings less likely than this to hold the budget are not worth a measurement.
    """

    def __init__(self, space: SearchSpace, *, objective: str = "time", budget_w: float | None = None,
                 tolerance: float = 0.0, target: TargetModel | None = None, seed: int | None = None,
                 n_startup: int = 6, min_group: int = 4, stop_kappa: float = 2.0, stop_confirmations: int = 2,
                 min_feasible_p: float = 0.05) -> None:
        self.space = space
        self.objective = objective
        self.budget_w = budget_w
        self.tolerance = tolerance
        self.target = target or TargetModel()
        self.n_startup = n_startup
        self.stop_kappa = stop_kappa
        self.min_feasible_p = min_feasible_p
        self._rng = np.random.RandomState(seed)
        self._random = RandomSampler(seed=seed)
        self._names = list(space.param_names())
        self._levels = self._grid_levels()  # (n, dims) int levels, batch first
        self._rows = self._grid_rows()  # numeric features for the hardware model
        self._named = [j for j, (_, v) in enumerate(space.knobs) if isinstance(v[0], str)]
        numeric_names = [n for j, (n, _) in enumerate(space.knobs) if j not in self._named]
        self._num_rows = [dict({k: r[k] for k in numeric_names}, batch_size=r["batch_size"]) for r in self._rows]
        # group id: the combination of named-knob levels (0 for every setting where there are none)
        self._group = np.zeros(self._levels.shape[0], dtype=int)
        for j in self._named:
            self._group = self._group * len(space.knobs[j][1]) + self._levels[:, j + 1]
        self.min_group = min_group
        self._batch = np.array([space.batch_sizes[i] for i in self._levels[:, 0]], dtype=float)
        steps_per_batch = {b: float(self.target.steps(b)) for b in space.batch_sizes}
        self._steps = np.array([steps_per_batch[int(b)] for b in self._batch])
        self._last: dict[str, Any] = {}
        self._cache: dict[str, Any] = {}
        self._stop_streak: list[Any] = []
        self.stop_confirmations = stop_confirmations

    # -- grid ---------------------------------------------------------------------------------------
    def _grid_levels(self) -> np.ndarray:
        sizes = [len(self.space.batch_sizes)] + [len(v) for _, v in self.space.knobs]
        return np.array(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")).reshape(len(sizes), -1).T

    def _numeric(self, name: str, level: int) -> float:
        values = self.space.knob_values[name]
        v = values[level]
        # named values (power modes) are ordered by power: their rank stands in for a number
        return float(v) if not isinstance(v, str) else float(level + 1)

    def _grid_rows(self) -> list[dict[str, float]]:
        names = self.space.knob_names
        tables = [np.array([self._numeric(n, i) for i in range(len(self.space.knob_values[n]))]) for n in names]
        cols = {n: tables[j][self._levels[:, j + 1]] for j, n in enumerate(names)}
        bs = np.array(self.space.batch_sizes, dtype=float)[self._levels[:, 0]]
        return [dict({n: float(cols[n][i]) for n in names}, batch_size=float(bs[i]))
                for i in range(self._levels.shape[0])]

    def _index(self, params: dict[str, Any]) -> int:
        sizes = [len(self.space.batch_sizes)] + [len(v) for _, v in self.space.knobs]
        idx = 0
        for name, size in zip(self._names, sizes):
            idx = idx * size + int(params[name])
        return idx

    # -- Optuna sampler interface -------------------------------------------------------------------
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.space.distributions()

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        scores = self._score(study, trial.number)
        if scores is None:  # the space-filling start
            return self._startup(study)
        acq = scores["acquisition"]
        if not np.any(np.isfinite(acq)):
            return self._startup(study)
        i = int(np.nanargmax(np.where(np.isfinite(acq), acq, -np.inf)))
        return {name: int(self._levels[i, j]) for j, name in enumerate(self._names)}

    # -- scoring ------------------------------------------------------------------------------------
    def _taken(self, study: Study) -> np.ndarray:
        """Grid points measured, being measured, or queued."""
        taken = np.zeros(self._levels.shape[0], dtype=bool)
        for t in study.get_trials(deepcopy=False):
            if t.params and all(n in t.params for n in self._names):
                taken[self._index(t.params)] = True
            elif t.state == TrialState.WAITING and "fixed_params" in t.system_attrs:
                fp = t.system_attrs["fixed_params"]
                if all(n in fp for n in self._names):
                    taken[self._index(fp)] = True
        return taken

    def _startup(self, study: Study) -> dict[str, Any]:
        """Latin-hypercube-style spread over the levels, skipping settings already taken."""
        taken = self._taken(study)
        free = np.flatnonzero(~taken)
        if free.size == 0:
            free = np.arange(self._levels.shape[0])
        # prefer points far (in normalised level space) from everything taken
        sizes = np.array([len(self.space.batch_sizes)] + [len(v) for _, v in self.space.knobs], dtype=float)
        norm = self._levels / np.maximum(sizes - 1, 1)
        pool = free if free.size <= 4096 else self._rng.choice(free, 4096, replace=False)
        if taken.any():
            done = norm[taken]
            d = np.min(np.abs(norm[pool][:, None, :] - done[None, :, :]).sum(axis=2), axis=1)
            best = pool[d >= np.max(d) - 1e-12]
            i = int(self._rng.choice(best))
        else:
            i = int(self._rng.choice(pool))
        return {name: int(self._levels[i, j]) for j, name in enumerate(self._names)}

    def _measured(self, study: Study) -> tuple[list[int], list[float], list[float], list[float], list[int]]:
        idx, times, powers, peaks, oom_batches = [], [], [], [], []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            m = t.user_attrs.get("measurement")
            if not m or not t.user_attrs.get("measured") or not t.params:
                continue
            if m.get("oom"):
                oom_batches.append(int(t.params[BATCH + LEVEL]))
                continue
            if not m.get("ok"):
                continue
            idx.append(self._index(t.params))
            times.append(float(m["step_time_s"]))
            powers.append(float(m["max_avg_power_w"]))
            peaks.append(float(m["peak_power_w"]))
        return idx, times, powers, peaks, oom_batches

    def _fit_predict(self, study: Study):
        """Fit the hardware model on the measured settings and predict the grid; cached per measured set.

        Named knobs (power modes) change what the clocks mean: a mode caps the clocks under it and may gate
        GPU units. So one model is fitted per named-knob combination with enough measurements (its physics
        base then sees clocks only), and a pooled model (modes as ranks) covers the combinations that have
        too few yet.
        """
        idx, times, powers, peaks, oom = self._measured(study)
        if len(idx) < self.n_startup:
            return None
        key = (tuple(idx), tuple(oom))
        if self._cache.get("key") == key:
            return self._cache["value"]
        from edgetune.predictors.hardware_model import HardwareModel

        def fit_predict(rows_fit, t, p, pk, rows_pred):
            model = HardwareModel(random_state=0).fit(rows_fit, t, p, pk)
            pred = model.predict(rows_pred)
            return pred.step_time_s, pred.power_w, pred.step_time_std, pred.power_std

        n = self._levels.shape[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                groups = self._group[np.asarray(idx)]
                counts = {g: int(np.sum(groups == g)) for g in np.unique(self._group)}
                if self._named and min(counts.values()) < self.min_group:
                    # some power mode has too few measurements for a model of its own: the pooled model
                    # covers it (only until every mode has its own; a fit costs about a second)
                    out = [np.asarray(a, dtype=float).copy() for a in fit_predict(
                        [self._rows[i] for i in idx], times, powers, peaks, self._rows)]
                else:
                    out = [np.empty(n) for _ in range(4)]
                for g in np.unique(groups):
                    members = [k for k, gg in enumerate(groups) if gg == g]
                    if len(members) < self.min_group and self._named:
                        continue
                    sel = np.flatnonzero(self._group == g)
                    res = fit_predict([self._num_rows[idx[k]] for k in members], [times[k] for k in members],
                                      [powers[k] for k in members], [peaks[k] for k in members],
                                      [self._num_rows[i] for i in sel])
                    for a, r in zip(out, res):
                        a[sel] = r
            except (ValueError, np.linalg.LinAlgError):
                return None
        value = (idx, times, powers, oom, out)
        self._cache = {"key": key, "value": value}
        return value

    def _score(self, study: Study, number: int) -> dict[str, np.ndarray] | None:
        fitted = self._fit_predict(study)
        if fitted is None:
            return None
        idx, times, powers, oom, (t, p, t_std, p_std) = fitted
        t = np.maximum(t, 1e-9)
        st = np.maximum(t_std / t, 1e-3)  # relative (log-space) std of step time
        sp = np.maximum(p_std, 1e-3 * np.abs(p))
        objective = self.objective
        if objective == "pareto":
            objective = "time" if number % 2 == 0 else "energy"
        if objective == "time":
            log_score = np.log(self._steps * t)
            s_log = st
        elif objective == "energy":
            log_score = np.log(self._steps * t * p)
            s_log = np.sqrt(st ** 2 + (sp / np.maximum(p, 1e-9)) ** 2)
        else:  # throughput: time per sample
            log_score = np.log(t / self._batch)
            s_log = st
        if self.budget_w is not None:
            limit = self.budget_w * (1.0 + self.tolerance)
            p_feas = _norm_cdf((limit - p) / sp)
        else:
            p_feas = np.ones_like(p)
        if oom:  # memory grows with the batch, whatever the clocks: larger batches fail too
            p_feas = np.where(self._levels[:, 0] >= min(oom), 0.0, p_feas)
        # incumbent: the best measured setting that held the budget
        best = math.inf
        for i, tt, pp in zip(idx, times, powers):
            if self.budget_w is None or pp <= self.budget_w * (1.0 + self.tolerance):
                if objective == "time":
                    val = math.log(self._steps[i] * tt)
                elif objective == "energy":
                    val = math.log(self._steps[i] * tt * pp)
                else:
                    val = math.log(tt / self._batch[i])
                best = min(best, val)
        taken = self._taken(study)
        if math.isfinite(best):
            z = (best - log_score) / s_log
            ei = s_log * (z * _norm_cdf(z) + _norm_pdf(z))
        else:  # nothing feasible yet: look for feasibility first
            ei = np.ones_like(log_score)
        acq = np.where(taken, -np.inf, ei * p_feas)
        self._last = {"log_score": log_score, "s_log": s_log, "p_feas": p_feas, "best": best, "taken": taken}
        return {"acquisition": acq, **self._last}

    def should_stop(self, study: Study, margin: float) -> str | None:
        """A reason to stop when no unmeasured setting can plausibly beat the best by ``margin``.

        The condition must hold after ``stop_confirmations`` successive measurements (each one the most
        promising setting left), so one over-confident fit does not end the search.
        """
        objectives = ["time", "energy"] if self.objective == "pareto" else [self.objective]
        for k, _ in enumerate(objectives):
            s = self._score(study, k)  # k's parity picks the pareto objective
            if s is None or not math.isfinite(s["best"]):
                self._stop_streak = []
                return None
            optimistic = s["log_score"] - self.stop_kappa * s["s_log"]
            hope = (~s["taken"]) & (s["p_feas"] >= self.min_feasible_p) & (
                optimistic < s["best"] + math.log(1.0 - margin))
            if hope.any():
                self._stop_streak = []
                return None
        key = self._cache.get("key")
        if key not in self._stop_streak:
            self._stop_streak.append(key)
        if len(self._stop_streak) < self.stop_confirmations:
            return None
        return (f"no unmeasured setting is predicted to beat the best by {margin:.0%} (hardware model, "
                f"{self.stop_kappa:g} std optimism, {self.stop_confirmations} fits in a row)")

    def __repr__(self) -> str:
        return f"GuidedSampler(grid={self._levels.shape[0]}, objective={self.objective!r})"
