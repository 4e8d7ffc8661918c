"""The physics bases of :class:`~edgetune.predictors.HardwareModel`: few parameters, so they extrapolate.

* :class:`RooflineBase` (``frequency``: DVFS clocks and core counts): a roofline with imperfect overlap for
  step time, and a power law of the clocks, the GPU's fill and the bytes moved for power;
* :class:`PowerCapBase` (``power_cap``: a lone ``power_limit`` knob): the workload's free power capped by
  the limit above the clock floor, and the slowdown the cap costs;
* :class:`GenericBase` (knob names unknown): non-negative linear models on generic features.

Each is fitted in log space by bounded least squares (the roofline in two stages, time then power; the
power-cap base jointly, then its power curve alone) and predicts (time per sample, power). The laws, their
parameters and why each is shaped so are in :mod:`edgetune.predictors.hardware_model`'s notes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, nnls

__all__ = ["MEMORY_KNOBS", "GenericBase", "PowerCapBase", "RooflineBase"]

# ------------------------------------------------------------------------------------------ bases
# Each base is a pair of pure functions: fit(k, b, t_sample, p, scale) -> params; predict(params, k, b)
# -> (time per sample, power). ``k`` holds knob values divided by ``scale`` (their largest fitted value).


def _vector(values: Mapping[enum.IntEnum, float]) -> np.ndarray:
    """A parameter vector from values named by an index enum (every member must have a value)."""
    kind = type(next(iter(values)))
    missing = [m.name for m in kind if m not in values]
    if missing:
        raise ValueError(f"{kind.__name__}: no value for {', '.join(missing)}")
    return np.array([float(values[m]) for m in kind])


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
class GenericBase:
    """Non-negative linear models of time per sample and power on the generic features."""

    time_coef: np.ndarray
    power_coef: np.ndarray

    @staticmethod
    def fit(k: np.ndarray, b: np.ndarray, t: np.ndarray, p: np.ndarray) -> GenericBase:
        At, Ap = _generic_features(k, b)
        return GenericBase(_nnls_relative(At, t), _nnls_relative(Ap, p))

    def predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        At, Ap = _generic_features(k, b)
        tiny = 1e-12  # an all-zero fit (degenerate data) must not give log(0) downstream
        return np.maximum(At @ self.time_coef, tiny), np.maximum(Ap @ self.power_coef, tiny)


MEMORY_KNOBS = ("emc_freq", "mem_freq")
_STARTS = 2  # starts of the nonlinear fits: the first from physical defaults, the rest perturbed


def _roofline_inputs(names: Sequence[str], k: np.ndarray, scale: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Normalised clocks (1 where a knob is absent: its part's constant absorbs it) and raw core counts."""
    n = b.size
    col = {name: k[:, i] for i, name in enumerate(names)}
    memory = next((col[m] for m in MEMORY_KNOBS if m in col), np.ones(n))
    cores = col["cpu_cores"] * scale[list(names).index("cpu_cores")] if "cpu_cores" in col else np.full(n, 2.0)
    return {"gpu": col.get("gpu_freq", np.ones(n)), "mem": memory, "cpu": col.get("cpu_freq", np.ones(n)),
            "cores_norm": col.get("cpu_cores", np.ones(n)), "cores": cores, "b": b}


class _Roofline(enum.IntEnum):
    """Positions of the frequency base's parameters in its vector ``theta`` (see the module docstring)."""

    LOG_A = 0  # GPU compute time per sample at the top clock
    LOG_B_HALF = 1  # batch size at which the GPU is half filled
    LOG_M0 = 2  # memory time per step (weights, optimizer state)
    LOG_M1 = 3  # memory time per sample (activations)
    LOG_L = 4  # host kernel-launch time per step
    LOG_D = 5  # data-loading time per sample on one core
    P = 6  # overlap exponent of the parts (1: they add up; large: the slowest alone)
    LOG_STATIC = 7  # static power
    LOG_G = 8  # GPU dynamic power at the top clock, fully active
    GAMMA = 9  # GPU power's exponent in the clock
    LOG_E = 10  # memory power at the top memory clock
    LOG_C = 11  # power per online core
    LOG_H = 12  # CPU dynamic power at the top CPU clock, per busy core
    GAMMA_C = 13  # CPU power's exponent in the clock
    FILL_FLOOR = 14  # share of the GPU's dynamic power drawn whatever the batch (clock tree): the rest follows fill
    LOG_W = 15  # DRAM power at full use of the bandwidth of the top memory clock


#: the roofline's amplitudes (log scale): the perturbed starts move these; the shapes start at their priors
_ROOFLINE_AMPLITUDES = [_Roofline.LOG_A, _Roofline.LOG_B_HALF, _Roofline.LOG_M0, _Roofline.LOG_M1, _Roofline.LOG_L,
                        _Roofline.LOG_D, _Roofline.LOG_STATIC, _Roofline.LOG_G, _Roofline.LOG_E, _Roofline.LOG_C,
                        _Roofline.LOG_H, _Roofline.LOG_W]
#: the power terms' amplitudes, in the order :meth:`RooflineBase._power` unpacks them
_ROOFLINE_POWER_AMPLITUDES = [_Roofline.LOG_STATIC, _Roofline.LOG_G, _Roofline.LOG_E, _Roofline.LOG_C,
                              _Roofline.LOG_H, _Roofline.LOG_W]
_ROOFLINE_PRIOR_WEIGHT = 0.1  # the shapes' priors weigh a tenth of one row's residual
_ROOFLINE_SHAPE_PRIORS = {  # (centre, width) of the shape parameters' weak priors
    _Roofline.P: (4.0, 3.0),  # parts overlap mostly: between additive (1) and the slowest alone (8)
    _Roofline.GAMMA: (2.5, 1.0),  # dynamic power C V^2 f with V rising with f
    _Roofline.GAMMA_C: (2.5, 1.0),  # the same for the CPU
    _Roofline.FILL_FLOOR: (0.5, 0.5),  # no preference between a clock-tree-bound and a fill-bound GPU
}


#: the time law's parameters (fitted first, on the step times) and the power terms' (fitted with them fixed)
_ROOFLINE_TIME = (_Roofline.LOG_A, _Roofline.LOG_B_HALF, _Roofline.LOG_M0, _Roofline.LOG_M1, _Roofline.LOG_L,
                  _Roofline.LOG_D, _Roofline.P)
_ROOFLINE_POWER = tuple(m for m in _Roofline if m not in _ROOFLINE_TIME)


def _fit_stage(residuals, theta: np.ndarray, free: Sequence[int], lo: np.ndarray, hi: np.ndarray,
               starts: int) -> np.ndarray:
    """``theta`` with the parameters ``free`` fitted by bounded least squares (the rest fixed): the best of
    ``starts`` starts, the first from ``theta``, the others with its amplitudes perturbed (seeded)."""
    free = np.array(free, dtype=int)
    amplitudes = np.isin(free, _ROOFLINE_AMPLITUDES)
    rng = np.random.default_rng(0)
    best_cost, best = math.inf, theta
    for attempt in range(starts):
        x0 = theta[free].copy()
        if attempt:
            x0[amplitudes] += rng.normal(0.0, 1.5, int(amplitudes.sum()))
        x0 = np.clip(x0, lo[free] + 1e-6, hi[free] - 1e-6)

        def at(x: np.ndarray) -> np.ndarray:
            th = theta.copy()
            th[free] = x
            return th

        r = least_squares(lambda x: residuals(at(x)), x0, bounds=(lo[free], hi[free]), max_nfev=300, ftol=1e-6,
                          xtol=1e-6)
        if r.cost < best_cost:
            best_cost, best = r.cost, at(r.x)
    return best


@dataclass(frozen=True)
class RooflineBase:
    """The ``frequency`` base: parameters ``theta`` indexed by :class:`_Roofline`."""

    names: tuple[str, ...]
    scale: np.ndarray
    theta: np.ndarray

    @staticmethod
    def _time(th: np.ndarray, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The step time and the parts the power terms need: ``step``, ``gpu_part`` (GPU busy), ``load_core``
        (loading on one core), ``traffic`` (memory time at the top memory clock: bytes moved) and ``fill``
        (the GPU's filled share, b / (b + b_half))."""
        R = _Roofline
        b = c["b"]
        b_half = np.exp(th[R.LOG_B_HALF])
        gpu = np.exp(th[R.LOG_A]) * (b + b_half) / c["gpu"]
        traffic = np.exp(th[R.LOG_M0]) + np.exp(th[R.LOG_M1]) * b
        mem = traffic / c["mem"]
        launch = np.exp(th[R.LOG_L]) / c["cpu"]
        load_core = np.exp(th[R.LOG_D]) * b / c["cpu"]
        load = load_core / np.maximum(c["cores"] - 1.0, 1.0)
        p = th[R.P]
        gpu_part = (gpu**p + mem**p) ** (1.0 / p)
        step = (gpu_part**p + launch**p + load**p) ** (1.0 / p)
        return {"step": step, "gpu_part": gpu_part, "load_core": load_core, "traffic": traffic,
                "fill": b / (b + b_half)}

    @staticmethod
    def _power(th: np.ndarray, c: dict[str, np.ndarray], parts: dict[str, np.ndarray]) -> np.ndarray:
        static, g, e, cores, h, w = np.exp(th[_ROOFLINE_POWER_AMPLITUDES])
        gamma, gamma_c, floor = th[_Roofline.GAMMA], th[_Roofline.GAMMA_C], th[_Roofline.FILL_FLOOR]
        step = parts["step"]
        activity = parts["gpu_part"] / step * (floor + (1.0 - floor) * parts["fill"])
        busy = 1.0 + parts["load_core"] / step  # the main thread plus the loaders' share
        bandwidth_use = parts["traffic"] / step  # bytes per second, as a share of the top clock's
        return (static + g * c["gpu"] ** gamma * activity + e * c["mem"] + w * bandwidth_use
                + cores * c["cores_norm"] + h * c["cpu"] ** gamma_c * busy)

    @staticmethod
    def fit(names: Sequence[str], k: np.ndarray, scale: np.ndarray, b: np.ndarray, t_step: np.ndarray,
            p: np.ndarray, start: np.ndarray | None = None) -> RooflineBase:
        """Fit in two stages: the time law on the step times alone, then the power terms with it fixed.

        The power terms use the time law's parts (GPU share, bytes moved, fill), so a joint fit lets power
        pull the time law: it traded up to a third of the time accuracy at unmeasured settings for a
        slightly closer power fit (twin Orin Nano mobilenet, 7W mode: 0.0464 s predicted for 0.0351 s).
        ``start``: one start from these parameters (a refit on a subset) instead of the default starts.
        """
        R = _Roofline
        c = _roofline_inputs(names, k, scale, b)
        lt, lp = np.log(t_step), np.log(p)

        def prior(th: np.ndarray, params: Sequence[int]) -> np.ndarray:
            return _ROOFLINE_PRIOR_WEIGHT * np.array([(th[i] - centre) / width for i, (centre, width)
                                                      in _ROOFLINE_SHAPE_PRIORS.items() if i in params])

        def time_residuals(th: np.ndarray) -> np.ndarray:
            return np.concatenate([np.log(RooflineBase._time(th, c)["step"]) - lt, prior(th, _ROOFLINE_TIME)])

        def power_residuals(th: np.ndarray) -> np.ndarray:
            power = RooflineBase._power(th, c, RooflineBase._time(th, c))
            return np.concatenate([np.log(power) - lp, prior(th, _ROOFLINE_POWER)])

        # bounds: amplitudes over many decades (log scale); the shapes within their physical ranges
        lo = _vector({**dict.fromkeys(_ROOFLINE_AMPLITUDES, -30.0), R.LOG_B_HALF: -10.0, R.P: 1.0,
                      R.GAMMA: 0.5, R.GAMMA_C: 0.5, R.FILL_FLOOR: 0.0})
        hi = _vector({**dict.fromkeys(_ROOFLINE_AMPLITUDES, 10.0), R.LOG_B_HALF: 15.0, R.P: 8.0,
                      R.GAMMA: 4.0, R.GAMMA_C: 4.0, R.FILL_FLOOR: 1.0})
        if start is None:
            t0, p0, lb = float(np.median(np.log(t_step))), float(np.median(p)), float(np.median(np.log(b)))
            # the step time split into parts a few e-folds apart; power 40% static, 40% GPU, the rest small
            start = _vector({
                R.LOG_A: t0 - lb, R.LOG_B_HALF: lb, R.LOG_M0: t0 - 1, R.LOG_M1: t0 - lb - 1, R.LOG_L: t0 - 2,
                R.LOG_D: t0 - lb - 2, R.P: _ROOFLINE_SHAPE_PRIORS[R.P][0], R.LOG_STATIC: math.log(p0 * 0.4),
                R.LOG_G: math.log(p0 * 0.4), R.GAMMA: _ROOFLINE_SHAPE_PRIORS[R.GAMMA][0],
                R.LOG_E: math.log(p0 * 0.1), R.LOG_C: math.log(p0 * 0.05), R.LOG_H: math.log(p0 * 0.05),
                R.GAMMA_C: _ROOFLINE_SHAPE_PRIORS[R.GAMMA_C][0],
                R.FILL_FLOOR: _ROOFLINE_SHAPE_PRIORS[R.FILL_FLOOR][0], R.LOG_W: math.log(p0 * 0.05),
            })
            starts = _STARTS
        else:
            starts = 1
        theta = np.clip(np.asarray(start, dtype=float), lo + 1e-6, hi - 1e-6)
        theta = _fit_stage(time_residuals, theta, _ROOFLINE_TIME, lo, hi, starts)
        theta = _fit_stage(power_residuals, theta, _ROOFLINE_POWER, lo, hi, starts)
        return RooflineBase(tuple(names), scale, theta)

    def predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = _roofline_inputs(self.names, k, self.scale, b)
        parts = self._time(self.theta, c)
        return parts["step"] / b, self._power(self.theta, c, parts)


# Per-sample time that rises with batch size (cache and memory pressure, the d b term) is fitted from the
# measured batch sizes and extrapolated at most one octave beyond the largest: a linear term fitted on
# batches up to 512 would otherwise predict 4096 several times too slow (seen on the Zeus CIFAR-100 tables).
_GROWTH_EXTRAPOLATION = 2.0
_SOFTMIN_N = 12.0  # sharpness of the cap: (x^-n + y^-n)^(-1/n) is within 6% of min(x, y) at x = y


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class _Cap(enum.IntEnum):
    """Positions of the power-cap base's parameters in its vector ``theta`` (see the module docstring)."""

    P_LO = 0  # free power of the smallest batches, W
    P_SPAN = 1  # p_hi - p_lo: how much more the largest batches draw, W
    M = 2  # the sigmoid's centre, log2 batch size
    H = 3  # the sigmoid's slope per octave of batch size
    KAPPA = 4  # drawn power under a binding cap, as a fraction of the cap
    ALPHA = 5  # slowdown exponent in the dynamic-power ratio
    LOG_A = 6  # per-step time (launches, optimizer step)
    LOG_C = 7  # per-sample compute time
    LOG_D = 8  # per-sample time growing with the batch (per 1024 samples)
    SIGMA = 9  # static power as a fraction of p_lo
    LOG_RHO = 10  # the clock floor's share of dynamic power
    ETA = 11  # how much of the per-step part slows with the clock
    Q = 12  # overlap exponent of the per-step and per-sample parts


#: the capped power curve (free power under the cap, no clock floor): refitted alone on the power rows
_CAP_POWER_CURVE = [_Cap.P_LO, _Cap.P_SPAN, _Cap.M, _Cap.H, _Cap.KAPPA]
_CAP_TIME_AMPLITUDES = [_Cap.LOG_A, _Cap.LOG_C, _Cap.LOG_D]

# Weak priors of the power-cap base (centre, width): they keep its 13 parameters identifiable from ~10 rows
# and pull the shapes to physical values where the rows say little. Each term weighs 0.05 of one row.
_CAP_PRIORS = {
    _Cap.H: (1.0, 2.0),  # a moderate sigmoid slope of free power in log2 batch size
    _Cap.KAPPA: (0.93, 0.1),  # the mean power sits a little under the nominal limit (averages include slack)
    _Cap.ALPHA: (1.0, 1.0),  # clock roughly tracks dynamic power
    _Cap.SIGMA: (0.3, 0.3),  # static power, a fraction of the smallest free power
    _Cap.LOG_RHO: (math.log(0.1), 1.0),  # the clock floor's share of dynamic power
    _Cap.ETA: (0.5, 0.5),  # how much of the per-step part slows with the clock
    _Cap.Q: (1.5, 1.0),  # overlap of the per-step and per-sample parts
}
_PRIOR_WEIGHT = 0.05


@dataclass(frozen=True)
class PowerCapBase:
    """The ``power_cap`` base: parameters ``theta`` indexed by :class:`_Cap`; ``power_theta``: the capped
    power curve (:data:`_CAP_POWER_CURVE`, in that order) refitted on the power rows alone; ``start_m``:
    the sigmoid centre (log2 batch size) of the start that won the fit."""

    theta: np.ndarray
    limit_scale: float
    b_cap: float = math.inf
    power_theta: np.ndarray | None = None
    start_m: float | None = None

    @staticmethod
    def _power(th: np.ndarray, x: np.ndarray, limit_w: np.ndarray,
               floor: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(free power, drawn power, static power) at log2 batch size ``x`` under ``limit_w``.

        ``th`` is a full ``theta`` or the power curve alone (:data:`_CAP_POWER_CURVE`: no clock floor)."""
        C = _Cap
        free = th[C.P_LO] + th[C.P_SPAN] * _sigmoid(th[C.H] * (x - th[C.M]))
        capped = (free**-_SOFTMIN_N + (th[C.KAPPA] * limit_w) ** -_SOFTMIN_N) ** (-1.0 / _SOFTMIN_N)
        if len(th) <= len(_CAP_POWER_CURVE) or not floor:
            return free, capped, np.zeros_like(free)
        static = th[C.SIGMA] * th[C.P_LO]
        # at its lowest clock the GPU still draws static + rho x the dynamic part: a cap below that is not met
        lowest = static + (free - static) * math.exp(th[C.LOG_RHO])
        return free, (capped**_SOFTMIN_N + lowest**_SOFTMIN_N) ** (1.0 / _SOFTMIN_N), static

    @staticmethod
    def _time(th: np.ndarray, b: np.ndarray, free: np.ndarray, power: np.ndarray, static: np.ndarray,
              b_cap: float = math.inf) -> np.ndarray:
        C = _Cap
        a, c, d = np.exp(th[_CAP_TIME_AMPLITUDES])
        # the cap lowers the clock until dynamic power (above static) fits: f ~ (dynamic power)^(1/gamma)
        slowdown = ((free - static) / np.maximum(power - static, 1e-3 * free)) ** th[C.ALPHA]
        per_step = a / b * slowdown ** th[C.ETA]  # launches, optimizer step: partly memory- or host-bound
        per_sample = (c + d * np.minimum(b, b_cap) / 1024.0) * slowdown  # the GPU's compute
        q = th[C.Q]
        return (per_step**q + per_sample**q) ** (1.0 / q)

    @staticmethod
    def fit(k: np.ndarray, b: np.ndarray, t: np.ndarray, p: np.ndarray, limit_scale: float,
            start_m: float | None = None) -> PowerCapBase:
        """Fit on limits ``k`` (scaled), batch sizes ``b``, time per sample ``t`` (s) and power ``p`` (W).

        Starts from the sigmoid centre at both ends of the batches, or at ``start_m`` alone (a refit on part
        of the rows, started where the full fit's winning start was: the same cost, not its optimum)."""
        C = _Cap
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
            free, power, static = PowerCapBase._power(th, x, limit)
            time = PowerCapBase._time(th, b, free, power, static)
            prior = _PRIOR_WEIGHT * (th[prior_at] - prior_centre) / prior_width
            return np.concatenate([np.log(power) - lp, np.log(time) - lt, prior])

        # bounds: powers within the measured range's scale, the sigmoid's centre within 6 octaves of the
        # batches, the time amplitudes over many decades (log scale), the shapes within physical ranges
        lo = _vector({C.P_LO: 1e-3, C.P_SPAN: 0.0, C.M: x.min() - 6, C.H: 0.05, C.KAPPA: 0.5, C.ALPHA: 0.0,
                      **dict.fromkeys(_CAP_TIME_AMPLITUDES, -30.0), C.SIGMA: 0.0, C.LOG_RHO: math.log(0.01),
                      C.ETA: 0.0, C.Q: 1.0})
        hi = _vector({C.P_LO: p.max() * 1.5, C.P_SPAN: p.max() * 3.0, C.M: x.max() + 6, C.H: 10.0, C.KAPPA: 1.1,
                      C.ALPHA: 4.0, **dict.fromkeys(_CAP_TIME_AMPLITUDES, 10.0), C.SIGMA: 0.95,
                      C.LOG_RHO: math.log(0.9), C.ETA: 1.0, C.Q: 6.0})
        best, best_m = None, None
        # start the time terms from a quick non-negative fit of the uncapped form, the shapes at their priors
        coef = _nnls_relative(np.column_stack([1.0 / b, np.ones_like(b), b / 1024.0]), t / t_scale)
        starts = (x.min(), x.max()) if start_m is None else (start_m,)
        for m0 in starts:  # more starts in between never won on the Zeus tables
            th0 = _vector({C.P_LO: p.min() * 0.9, C.P_SPAN: max(p.max() - p.min(), 1.0) * 1.2, C.M: m0,
                           **dict(zip(_CAP_TIME_AMPLITUDES, np.log(np.maximum(coef, 1e-6)))),
                           **{i: centre for i, (centre, _) in _CAP_PRIORS.items()}})
            th0 = np.clip(th0, lo + 1e-6, hi - 1e-6)
            r = least_squares(residuals, th0, bounds=(lo, hi), method="trf", max_nfev=400)
            if best is None or r.cost < best.cost:
                best, best_m = r, float(m0)
        theta = best.x.copy()

        # The joint fit trades power accuracy for time; the capped power curve alone (5 parameters, no floor:
        # a smooth max with the floor bends the curve near the cap) is pinned down well by the power rows.
        curve_priors = [i for i in _CAP_PRIORS if i in _CAP_POWER_CURVE]
        curve_at = [_CAP_POWER_CURVE.index(i) for i in curve_priors]
        curve_centre = np.array([_CAP_PRIORS[i][0] for i in curve_priors])
        curve_width = np.array([_CAP_PRIORS[i][1] for i in curve_priors])

        def power_residuals(curve: np.ndarray) -> np.ndarray:
            prior = _PRIOR_WEIGHT * (curve[curve_at] - curve_centre) / curve_width
            return np.concatenate([np.log(PowerCapBase._power(curve, x, limit)[1]) - lp, prior])

        power_theta = least_squares(power_residuals, theta[_CAP_POWER_CURVE],
                                    bounds=(lo[_CAP_POWER_CURVE], hi[_CAP_POWER_CURVE]), method="trf",
                                    max_nfev=400).x
        theta[_CAP_TIME_AMPLITUDES] += math.log(t_scale)
        return PowerCapBase(theta, limit_scale, _GROWTH_EXTRAPOLATION * b_max, power_theta, best_m)

    def predict(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, limit = np.log2(b), k[:, 0] * self.limit_scale
        free, power, static = self._power(self.theta, x, limit)
        power_only = power if self.power_theta is None else self._power(self.power_theta, x, limit)[1]
        return self._time(self.theta, b, free, power, static, self.b_cap), power_only
