"""Step time and power for any batch size and knob setting, from a handful of measurements.

The model has two layers, both fitted in log space (errors are relative, as the targets are):

1. A **physics base** with few parameters, so it extrapolates from 5-10 points:

   * ``frequency`` (DVFS knobs ``gpu_freq``, ``emc_freq`` or ``mem_freq``, ``cpu_freq``, ``cpu_cores``):
     a roofline with imperfect overlap. Step time = smax_p(smax_p(t_gpu, t_mem), t_launch, t_load) with
     t_gpu = a (b + b_half) / f_gpu (compute; small batches do not fill the GPU), t_mem = (m0 + m1 b) /
     f_emc (weights and optimizer state once per step, activations per sample), t_launch = l / f_cpu (host
     kernel launches), t_load = d b / (f_cpu (cores - 1)) (data loaders), and smax_p(x, y) = (x^p +
     y^p)^(1/p) with p fitted (p = 1: parts add up; p large: the slowest part alone). Power = static +
     G f_gpu^gamma x GPU activity (the GPU part's share of the step) + E f_emc + C cores + H f_cpu^gamma_c x
     busy cores: dynamic power C V^2 f with V rising with f, so gamma > 1. All amplitudes positive (log
     parameters); one bounded least-squares fit of time and power together, from a few starts.
   * ``power_cap`` (a ``power_limit`` knob, e.g. NVML, the Zeus traces): the workload draws
     P_free(b) = p_lo + (p_hi - p_lo) sigmoid(h (log2 b - m)) when unconstrained; the limit caps it,
     P = softmin(P_free, kappa * limit), but not below the clock floor: at its lowest clock the GPU still
     draws P_s + rho (P_free - P_s), with static power P_s = sigma p_lo (Zeus A40 CIFAR-100 draws 107 W under
     a 100 W limit). Under the cap the clock falls until the dynamic power fits, f ~ (P - P_s)^(1/gamma),
     so the slowdown is s = ((P_free - P_s) / (P - P_s))^alpha: convex in the cap (Zeus A40 Sentiment140:
     1.6x at 150 W, 4x at 100 W, which a power ratio alone cannot give). Time per sample = smax_q(a/b s^eta,
     (c + d b) s): a per-step part (launches, optimizer step; partly memory-bound, so it slows less, eta
     <= 1) and a per-sample compute part, overlapping (q fitted: small batches are per-step bound with a
     sharp knee into the per-sample regime), the d b term extrapolated at most one octave beyond the largest
     measured batch. Fitted by bounded nonlinear least squares on log time and log power jointly (weak
     priors on the shape parameters), from two starts of the sigmoid's centre; then the capped power curve
     alone is refitted on the power rows (the joint fit trades power accuracy for time: Zeus power MAPE
     4.1% -> 3.6%). On the Zeus tables this cut the time MAPE from 7.3% to 5.9% (worst 15.7% -> 10.4%).
   * ``generic`` (knob names unknown): time per sample = c0/b + c1 + c2 b + sum_k (ck/k + ck'/(b k)),
     power = p0 + p1 log b + sum_k (pk k + pk' k log b), non-negative.

2. A **residual Gaussian process** on (log2 b, knobs scaled to [0, 1]) of log(measured / base), with a
   white-noise term: it corrects what the physics misses and gives the uncertainty (its predictive std,
   noise included). ``residual="none"`` keeps the base alone, with the base's residual spread as std.

``experiments/predictor_comparison.py`` compares this against a plain GP, gradient boosting and the bases
alone by cross-validation on the Zeus traces (and the twin where present) and records why this one stays.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, nnls
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

__all__ = ["BASES", "FREQUENCY_KNOBS", "HardwareModel", "Prediction"]

#: Knobs whose value is a clock (or a count of cores): time scales with 1/value.
FREQUENCY_KNOBS = ("gpu_freq", "emc_freq", "cpu_freq", "mem_freq", "cpu_cores")
BASES = ("auto", "frequency", "power_cap", "generic")
BATCH = "batch_size"


@dataclass(frozen=True)
class Prediction:
    """Predicted step time and power, one entry per input row; std = one standard deviation."""

    step_time_s: np.ndarray
    power_w: np.ndarray
    peak_power_w: np.ndarray
    step_time_std: np.ndarray
    power_std: np.ndarray

    def __len__(self) -> int:
        return int(self.step_time_s.size)


# ------------------------------------------------------------------------------------------ input checks


def _as_matrix(X: Sequence[Mapping[str, float]], knobs: Sequence[str] | None = None) -> tuple[list[str], np.ndarray]:
    """(knob names, array of shape (n, len(knobs) + 1) with batch size last); validates."""
    if isinstance(X, Mapping) or not hasattr(X, "__len__"):
        raise ValueError("X must be a sequence of mappings (knob -> value, plus 'batch_size')")
    if len(X) == 0:
        raise ValueError("X is empty")
    first = X[0]
    if not isinstance(first, Mapping) or BATCH not in first:
        raise ValueError("each row of X must be a mapping with a 'batch_size' entry")
    names = sorted(k for k in first if k != BATCH) if knobs is None else list(knobs)
    rows = np.empty((len(X), len(names) + 1))
    for i, row in enumerate(X):
        keys = set(row) - {BATCH}
        if keys != set(names):
            raise ValueError(f"row {i} of X has knobs {sorted(keys)}; the model expects {names}")
        try:
            rows[i, :-1] = [float(row[k]) for k in names]
            rows[i, -1] = float(row[BATCH])
        except (TypeError, ValueError):
            raise ValueError(f"row {i} of X has a non-numeric value") from None
    if not np.all(np.isfinite(rows)) or np.any(rows <= 0):
        raise ValueError("knob values and batch sizes must be positive finite numbers")
    return names, rows


def _as_target(y: Sequence[float] | np.ndarray, n: int, name: str) -> np.ndarray:
    a = np.asarray(y, dtype=float).ravel()
    if a.size != n:
        raise ValueError(f"{name} has {a.size} values for {n} rows of X")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} must hold positive finite numbers")
    return a


# ------------------------------------------------------------------------------------------ bases
# Each base is a pair of pure functions: fit(k, b, t_sample, p, scale) -> params; predict(params, k, b)
# -> (time per sample, power). ``k`` holds knob values divided by ``scale`` (their largest fitted value).


def _nnls_relative(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative error: minimise sum ((A c - y) / y)^2."""
    coef, _ = nnls(A / y[:, None], np.ones_like(y))
    return coef


def _generic_features(k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lb = np.log2(b)[:, None]
    time = np.hstack([1.0 / b[:, None], np.ones_like(lb), b[:, None] / 1024.0, 1.0 / k, 1.0 / (k * b[:, None])])
    power = np.hstack([np.ones_like(lb), lb / 10.0, k, k * lb / 10.0])
    return time, power


@dataclass(frozen=True)
class _GenericBase:
    """Non-negative linear models of time per sample and power on the generic features."""

    time_coef: np.ndarray
    power_coef: np.ndarray

    @staticmethod
    def fit(k: np.ndarray, b: np.ndarray, t: np.ndarray, p: np.ndarray) -> _GenericBase:
        At, Ap = _generic_features(k, b)
        return _GenericBase(_nnls_relative(At, t), _nnls_relative(Ap, p))

    def predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        At, Ap = _generic_features(k, b)
        tiny = 1e-12  # an all-zero fit (degenerate data) must not give log(0) downstream
        return np.maximum(At @ self.time_coef, tiny), np.maximum(Ap @ self.power_coef, tiny)


_MEMORY_KNOBS = ("emc_freq", "mem_freq")
_STARTS = 2  # starts of the nonlinear fits: the first from physical defaults, the rest perturbed


def _roofline_inputs(names: Sequence[str], k: np.ndarray, scale: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Normalised clocks (1 where a knob is absent: its part's constant absorbs it) and raw core counts."""
    n = b.size
    col = {name: k[:, i] for i, name in enumerate(names)}
    memory = next((col[m] for m in _MEMORY_KNOBS if m in col), np.ones(n))
    cores = col["cpu_cores"] * scale[list(names).index("cpu_cores")] if "cpu_cores" in col else np.full(n, 2.0)
    return {"gpu": col.get("gpu_freq", np.ones(n)), "mem": memory, "cpu": col.get("cpu_freq", np.ones(n)),
            "cores_norm": col.get("cpu_cores", np.ones(n)), "cores": cores, "b": b}


@dataclass(frozen=True)
class _RooflineBase:
    """Parameters: log a, log b_half, log m0, log m1, log l, log d, p | log static, log G, gamma, log E,
    log C, log H, gamma_c (see the module docstring)."""

    names: tuple[str, ...]
    scale: np.ndarray
    theta: np.ndarray

    @staticmethod
    def _time(th: np.ndarray, c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        b = c["b"]
        gpu = np.exp(th[0]) * (b + np.exp(th[1])) / c["gpu"]
        mem = (np.exp(th[2]) + np.exp(th[3]) * b) / c["mem"]
        launch = np.exp(th[4]) / c["cpu"]
        load_core = np.exp(th[5]) * b / c["cpu"]
        load = load_core / np.maximum(c["cores"] - 1.0, 1.0)
        p = th[6]
        gpu_part = (gpu**p + mem**p) ** (1.0 / p)
        step = (gpu_part**p + launch**p + load**p) ** (1.0 / p)
        return step, gpu_part, load_core

    @staticmethod
    def _power(th: np.ndarray, c: dict[str, np.ndarray], step: np.ndarray, gpu_part: np.ndarray,
               load_core: np.ndarray) -> np.ndarray:
        static, g, e, cores, h = np.exp(th[[7, 8, 10, 11, 12]])
        gamma, gamma_c = th[9], th[13]
        activity = gpu_part / step
        busy = 1.0 + load_core / step  # the main thread plus the loaders' share
        return (static + g * c["gpu"] ** gamma * activity + e * c["mem"] + cores * c["cores_norm"]
                + h * c["cpu"] ** gamma_c * busy)

    @staticmethod
    def fit(names: Sequence[str], k: np.ndarray, scale: np.ndarray, b: np.ndarray, t_step: np.ndarray,
            p: np.ndarray) -> _RooflineBase:
        c = _roofline_inputs(names, k, scale, b)
        lt, lp = np.log(t_step), np.log(p)

        def residuals(th: np.ndarray) -> np.ndarray:
            step, gpu_part, load_core = _RooflineBase._time(th, c)
            power = _RooflineBase._power(th, c, step, gpu_part, load_core)
            prior = 0.1 * np.array([(th[6] - 4.0) / 3.0, (th[9] - 2.5), (th[13] - 2.5)])
            return np.concatenate([np.log(step) - lt, np.log(power) - lp, prior])

        t0, p0, lb = float(np.median(np.log(t_step))), float(np.median(p)), float(np.median(np.log(b)))
        start = np.array([t0 - lb, lb, t0 - 1, t0 - lb - 1, t0 - 2, t0 - lb - 2, 4.0,
                          math.log(p0 * 0.4), math.log(p0 * 0.4), 2.5, math.log(p0 * 0.1), math.log(p0 * 0.05),
                          math.log(p0 * 0.05), 2.5])
        lo = np.array([-30, -10, -30, -30, -30, -30, 1.0, -30, -30, 0.5, -30, -30, -30, 0.5])
        hi = np.array([10, 15, 10, 10, 10, 10, 8.0, 10, 10, 4.0, 10, 10, 10, 4.0])
        free = [0, 1, 2, 3, 4, 5, 7, 8, 10, 11, 12]  # the amplitudes; shapes start at their priors
        rng = np.random.default_rng(0)
        best = None
        for attempt in range(_STARTS):
            th0 = start.copy()
            if attempt:
                th0[free] += rng.normal(0.0, 1.5, len(free))
            r = least_squares(residuals, np.clip(th0, lo + 1e-6, hi - 1e-6), bounds=(lo, hi), max_nfev=300,
                              ftol=1e-6, xtol=1e-6)
            if best is None or r.cost < best.cost:
                best = r
        return _RooflineBase(tuple(names), scale, best.x)

    def predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = _roofline_inputs(self.names, k, self.scale, b)
        step, gpu_part, load_core = self._time(self.theta, c)
        return step / b, self._power(self.theta, c, step, gpu_part, load_core)


# Per-sample time that rises with batch size (cache and memory pressure, the d b term) is fitted from the
# measured batch sizes and extrapolated at most one octave beyond the largest: a linear term fitted on
# batches up to 512 would otherwise predict 4096 several times too slow (seen on the Zeus CIFAR-100 tables).
_GROWTH_EXTRAPOLATION = 2.0
_SOFTMIN_N = 12.0  # sharpness of the cap: (x^-n + y^-n)^(-1/n) is within 6% of min(x, y) at x = y


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


# Weak priors of the power-cap base (centre, width): they keep its 13 parameters identifiable from ~10 rows
# and pull the shapes to physical values where the rows say little. Each term weighs 0.05 of one row.
_CAP_PRIORS = {
    3: (1.0, 2.0),    # h: a moderate sigmoid slope of free power in log2 batch size
    4: (0.93, 0.1),   # kappa: the mean power sits a little under the nominal limit (averages include slack)
    5: (1.0, 1.0),    # alpha: clock roughly tracks dynamic power
    9: (0.3, 0.3),    # sigma: static power, a fraction of the smallest free power
    10: (math.log(0.1), 1.0),  # log rho: the clock floor's share of dynamic power
    11: (0.5, 0.5),   # eta: how much of the per-step part slows with the clock
    12: (1.5, 1.0),   # q: overlap of the per-step and per-sample parts
}
_PRIOR_WEIGHT = 0.05


@dataclass(frozen=True)
class _PowerCapBase:
    """Parameters (``theta``): p_lo, p_hi - p_lo, m, h, kappa, alpha, log a, log c, log d, sigma, log rho,
    eta, q (see the module docstring); ``power_theta``: the first five refitted on the power rows alone."""

    theta: np.ndarray
    limit_scale: float
    b_cap: float = math.inf
    power_theta: np.ndarray | None = None

    @staticmethod
    def _power(th: np.ndarray, x: np.ndarray, limit_w: np.ndarray,
               floor: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(free power, drawn power, static power) at log2 batch size ``x`` under ``limit_w``."""
        free = th[0] + th[1] * _sigmoid(th[3] * (x - th[2]))
        capped = (free**-_SOFTMIN_N + (th[4] * limit_w) ** -_SOFTMIN_N) ** (-1.0 / _SOFTMIN_N)
        if len(th) <= 5 or not floor:
            return free, capped, np.zeros_like(free)
        static = th[9] * th[0]
        # at its lowest clock the GPU still draws static + rho x the dynamic part: a cap below that is not met
        lowest = static + (free - static) * math.exp(th[10])
        return free, (capped**_SOFTMIN_N + lowest**_SOFTMIN_N) ** (1.0 / _SOFTMIN_N), static

    @staticmethod
    def _time(th: np.ndarray, b: np.ndarray, free: np.ndarray, power: np.ndarray, static: np.ndarray,
              b_cap: float = math.inf) -> np.ndarray:
        a, c, d = np.exp(th[6:9])
        # the cap lowers the clock until dynamic power (above static) fits: f ~ (dynamic power)^(1/gamma)
        slowdown = ((free - static) / np.maximum(power - static, 1e-3 * free)) ** th[5]
        per_step = a / b * slowdown ** th[11]  # launches, optimizer step: partly memory- or host-bound
        per_sample = (c + d * np.minimum(b, b_cap) / 1024.0) * slowdown  # the GPU's compute
        q = th[12]
        return (per_step**q + per_sample**q) ** (1.0 / q)

    @staticmethod
    def fit(k: np.ndarray, b: np.ndarray, t: np.ndarray, p: np.ndarray, limit_scale: float) -> _PowerCapBase:
        limit = k[:, 0] * limit_scale
        x = np.log2(b)
        lt, lp = np.log(t), np.log(p)
        t_scale = float(np.median(t * b))
        lt = lt - math.log(t_scale)
        b_max = float(b.max())
        prior_at = list(_CAP_PRIORS)
        prior_centre = np.array([c for c, _ in _CAP_PRIORS.values()])
        prior_width = np.array([w for _, w in _CAP_PRIORS.values()])

        def residuals(th: np.ndarray) -> np.ndarray:
            free, power, static = _PowerCapBase._power(th, x, limit)
            time = _PowerCapBase._time(th, b, free, power, static)
            prior = _PRIOR_WEIGHT * (th[prior_at] - prior_centre) / prior_width
            return np.concatenate([np.log(power) - lp, np.log(time) - lt, prior])

        lo = np.array([1e-3, 0.0, x.min() - 6, 0.05, 0.5, 0.0, -30, -30, -30, 0.0, math.log(0.01), 0.0, 1.0])
        hi = np.array([p.max() * 1.5, p.max() * 3.0, x.max() + 6, 10.0, 1.1, 4.0, 10, 10, 10, 0.95, math.log(0.9),
                       1.0, 6.0])
        best = None
        # start the time terms from a quick non-negative fit of the uncapped form, the shapes at their priors
        coef = _nnls_relative(np.column_stack([1.0 / b, np.ones_like(b), b / 1024.0]), t / t_scale)
        for m0 in (x.min(), x.max()):  # more starts in between never won on the Zeus tables
            th0 = np.array([p.min() * 0.9, max(p.max() - p.min(), 1.0) * 1.2, m0, 1.0, 0.93, 1.0,
                            *np.log(np.maximum(coef, 1e-6)), 0.0, 0.0, 0.0, 0.0])
            th0[prior_at] = prior_centre
            th0 = np.clip(th0, lo + 1e-6, hi - 1e-6)
            r = least_squares(residuals, th0, bounds=(lo, hi), method="trf", max_nfev=400)
            if best is None or r.cost < best.cost:
                best = r
        theta = best.x.copy()

        # The joint fit trades power accuracy for time; the capped power curve alone (5 parameters, no floor:
        # a smooth max with the floor bends the curve near the cap) is pinned down well by the power rows.
        def power_residuals(th5: np.ndarray) -> np.ndarray:
            prior = _PRIOR_WEIGHT * (th5[[3, 4]] - prior_centre[:2]) / prior_width[:2]
            return np.concatenate([np.log(_PowerCapBase._power(th5, x, limit)[1]) - lp, prior])

        power_theta = least_squares(power_residuals, theta[:5], bounds=(lo[:5], hi[:5]), method="trf",
                                    max_nfev=400).x
        theta[6:9] += math.log(t_scale)
        return _PowerCapBase(theta, limit_scale, _GROWTH_EXTRAPOLATION * b_max, power_theta)

    def predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, limit = np.log2(b), k[:, 0] * self.limit_scale
        free, power, static = self._power(self.theta, x, limit)
        power_only = power if self.power_theta is None else self._power(self.power_theta, x, limit)[1]
        return self._time(self.theta, b, free, power, static, self.b_cap), power_only


# ------------------------------------------------------------------------------------------ the model


def _residual_gp(dims: int, random_state: int | None) -> GaussianProcessRegressor:
    # residuals are small (log ratios of a few %): a small signal variance and a smooth, anisotropic RBF
    kernel = ConstantKernel(0.01, (1e-4, 1.0)) * RBF([2.0] + [1.0] * (dims - 1), (0.5, 100.0)) + WhiteKernel(
        1e-3, (1e-5, 1e-1))
    return GaussianProcessRegressor(kernel, normalize_y=False, random_state=random_state)


class HardwareModel(BaseEstimator):
    """Predicts step time, mean and peak power from measured (setting, batch size) rows.

    Args:
        base: ``auto`` (``power_cap`` for a lone ``power_limit`` knob, ``frequency`` when every knob is a
            clock or core count, else ``generic``), or one of those by name.
        residual: ``gp`` (a Gaussian process corrects the base and gives the uncertainty) or ``none``.
        random_state: seed of the GP optimiser.

    Example::

        model = HardwareModel().fit([{"gpu_freq": 6.1e8, "batch_size": 32}, ...], times, powers)
        pred = model.predict([{"gpu_freq": 9.2e8, "batch_size": 64}])
        pred.step_time_s, pred.power_w, pred.step_time_std
    """

    def __init__(self, base: str = "auto", residual: str = "gp", random_state: int | None = 0) -> None:
        self.base = base
        self.residual = residual
        self.random_state = random_state

    # sklearn convention: fitted attributes end with "_"
    def fit(self, X: Sequence[Mapping[str, float]], step_time_s, power_w, peak_power_w=None) -> HardwareModel:
        """Fit on rows ``X`` (knob values plus ``batch_size``) and their measured time and power."""
        if self.base not in BASES:
            raise ValueError(f"base must be one of {', '.join(BASES)}, got {self.base!r}")
        if self.residual not in ("gp", "none"):
            raise ValueError(f"residual must be 'gp' or 'none', got {self.residual!r}")
        names, M = _as_matrix(X)
        n = M.shape[0]
        if n < 2:
            raise ValueError("need at least 2 measured rows to fit")
        t = _as_target(step_time_s, n, "step_time_s")
        p = _as_target(power_w, n, "power_w")
        b = M[:, -1]
        self.knobs_ = names
        self.scale_ = M[:, :-1].max(axis=0) if names else np.zeros(0)
        span = M[:, :-1].max(axis=0) - M[:, :-1].min(axis=0) if names else np.zeros(0)
        self.gp_span_ = np.where(span > 0, span / self.scale_, 1.0)  # the fitted knob range, scaled
        k = M[:, :-1] / self.scale_ if names else M[:, :0]
        kind = self.base
        if kind == "auto":
            if names == ["power_limit"]:
                kind = "power_cap"
            elif (names and all(nm in FREQUENCY_KNOBS for nm in names)
                  and not all(m in names for m in _MEMORY_KNOBS)):
                kind = "frequency"
            else:
                kind = "generic"
        if kind == "power_cap" and names != ["power_limit"]:
            raise ValueError(f"base 'power_cap' needs exactly one knob, power_limit; got {names}")
        if kind == "frequency" and not names:
            kind = "generic"
        self.base_kind_ = kind
        t_sample = t / b  # the bases model time per sample; step time = b x that
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if kind == "power_cap":
                self.base_model_ = _PowerCapBase.fit(k, b, t_sample, p, float(self.scale_[0]))
            elif kind == "frequency":
                self.base_model_ = _RooflineBase.fit(names, k, self.scale_, b, t, p)
            else:
                self.base_model_ = _GenericBase.fit(k, b, t_sample, p)
        bt, bp = self._base_predict(k, b)
        rt, rp = np.log(t / bt), np.log(p / bp)
        Z = self._gp_inputs(k, b)
        if self.residual == "gp":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                self.time_gp_ = _residual_gp(Z.shape[1], self.random_state).fit(Z, rt)
                self.power_gp_ = _residual_gp(Z.shape[1], self.random_state).fit(Z, rp)
        dof = max(n - 3, 1)
        self.time_spread_ = float(math.sqrt(np.sum(rt**2) / dof))
        self.power_spread_ = float(math.sqrt(np.sum(rp**2) / dof))
        if peak_power_w is not None:
            peak = _as_target(peak_power_w, n, "peak_power_w")
            # the peak-to-mean ratio is a property of the workload's step (bursts), nearly constant
            self.peak_ratio_ = float(np.exp(np.median(np.log(np.maximum(peak / p, 1.0)))))
        else:
            self.peak_ratio_ = 1.0
        self.n_train_ = n
        return self

    def _base_predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ts, p = self.base_model_.predict(k, b)
        return ts * b, p

    def _gp_inputs(self, k: np.ndarray, b: np.ndarray) -> np.ndarray:
        # a length scale of 1 is two octaves of batch size, or half the measured range of a knob
        return np.column_stack([np.log2(b) / 2.0, 2.0 * k / self.gp_span_])

    def predict(self, X: Sequence[Mapping[str, float]]) -> Prediction:
        """Predict every row of ``X`` (same knobs as in :meth:`fit`)."""
        if not hasattr(self, "base_model_"):
            raise ValueError("this HardwareModel is not fitted yet; call fit first")
        _, M = _as_matrix(X, self.knobs_)
        b = M[:, -1]
        k = M[:, :-1] / self.scale_ if self.knobs_ else M[:, :0]
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            t, p = self._base_predict(k, b)
        if self.residual == "gp":
            Z = self._gp_inputs(k, b)
            mt, st = self.time_gp_.predict(Z, return_std=True)
            mp, sp = self.power_gp_.predict(Z, return_std=True)
            t, p = t * np.exp(mt), p * np.exp(mp)
        else:
            st = np.full(b.size, self.time_spread_)
            sp = np.full(b.size, self.power_spread_)
        return Prediction(step_time_s=t, power_w=p, peak_power_w=p * self.peak_ratio_,
                          step_time_std=t * st, power_std=p * sp)
