"""Step time and power for any batch size and knob setting, from a handful of measurements.

The model has two layers, both fitted in log space (errors are relative, as the targets are):

1. A **physics base** with few parameters, so it extrapolates from 5-10 points (:mod:`edgetune.predictors.bases`):

   * ``frequency`` (DVFS knobs ``gpu_freq``, ``emc_freq`` or ``mem_freq``, ``cpu_freq``, ``cpu_cores``):
     a roofline with imperfect overlap. Step time = smax_p(smax_p(t_gpu, t_mem), t_launch, t_load) with
     t_gpu = a (b + b_half) / f_gpu (compute; small batches do not fill the GPU), t_mem = (m0 + m1 b) /
     f_emc (weights and optimizer state once per step, activations per sample), t_launch = l / f_cpu (host
     kernel launches), t_load = d b / (f_cpu (cores - 1)) (data loaders), and smax_p(x, y) = (x^p +
     y^p)^(1/p) with p fitted (p = 1: parts add up; p large: the slowest part alone). Power = static +
     G f_gpu^gamma x GPU activity x (u + (1 - u) b / (b + b_half)) + E f_emc + W x bytes per second + C
     cores + H f_cpu^gamma_c x busy cores: dynamic power C V^2 f with V rising with f, so gamma > 1; the GPU
     part follows its busy share of the step and, but for a share u drawn whatever the batch (clock tree),
     how full it is (power rises with the batch until the GPU saturates: Orin AGX at its top clocks draws
     about twice as much at the saturating batch as at batch 1, shared/data/jetson/published_measurements.md);
     DRAM power follows the bytes moved per second, (m0 + m1 b) / step at the top memory clock's scale, on
     top of the controller's clock-linear E f_emc. All amplitudes positive (log parameters), u in [0, 1].
     Fitted in two bounded least-squares stages, each from a few starts: the time law on the step times
     alone, then the power terms with the time law fixed (fitted jointly, power pulled the time law a third
     off at unmeasured settings).
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

   Knob names are read by role (:func:`edgetune.tables.resolve_knob_name`): ``gpu_freq_hz``, ``gpu_clk``,
   ``emc_freq_mhz``, ``online_cores`` ... are clock and core knobs like the registry's names, so the roofline
   serves any table whose columns map to roles; a knob with no role is left to the residual GP.

2. A **residual Gaussian process** on (log2 b, knobs scaled to [0, 1]) of log(measured / base), with a
   white-noise term: it corrects what the physics misses and gives the uncertainty (its predictive std,
   noise included). Its signal variance (the doubt far from the rows) is at least the base's
   **cross-validated** error: :data:`CV_FOLDS` refits of the base, each without one fold of the rows,
   predicting the fold (mean squared log error, capped at :data:`CV_VARIANCE_CAP`); a refit starts where the
   full fit did (the roofline from its parameters, the power-cap base from its winning start alone, which
   cut zeus_cost's CPU time by a quarter with every pick unchanged). Fitted on its own
   residuals, which a base of 16 parameters makes small, the GP was sure of settings it had never seen
   (twin Orin Nano mobilenet: 6.13 +- 0.10 W predicted for 5.44 W, so the optimum was never measured). Its length
   scales are at most :data:`GP_MAX_LENGTH_SCALE`, so that doubt grows away from the rows.
   ``residual="none"`` keeps the base alone, with the base's residual spread as std.

3. **Extrapolation doubt**: a prediction outside the fitted range (batch sizes beyond the measured ones,
   knob values beyond the measured span) gets a relative std that grows with the distance
   (:data:`EXTRAPOLATION_STD_PER_OCTAVE` per octave of batch size, :data:`EXTRAPOLATION_STD_PER_SPAN` per
   measured span of a knob), added in quadrature. The GP's own std saturates at its small signal variance
   far from the data, so without this a batch size several octaves out (mispredicted by 198% on a Zeus
   trace of a GPU not in the repository) would be reported as sure as one in range; with it the guided
   sampler's expected improvement and stopping rule send a measurement there before trusting it.

4. **Refit spread** (``predict(..., refit_spread=True)``): the spread of the :data:`CV_FOLDS` refits' predictions
   (a grouped jackknife, (K - 1) / K x the sum of squared deviations of their log predictions, capped at the
   square root of :data:`CV_VARIANCE_CAP`), added in quadrature. The GP's std is local: small next to the rows,
   however the base splits what they show among its parts. Where the rows leave that split open, the refits
   disagree (twin Orin AGX chartransformer, 30W mode: from a 192 MHz one-core row and a 115.2 MHz three-core row
   the base read data loading where the twin has none, and put 115.2 MHz on one core 28% slower than the first,
   for about 5%). On held-out rows (``experiments/predictor_comparison.py``: 10 training rows, 10 seeds) the
   GP's std alone puts 77% (time) and 82% (power) of the truths within 2 std on the Zeus tables, 83% and 89%
   on the twin's; with the refit spread 92% and 93%, 95% and 98%, about the 95.4% two std of a normal error
   hold. Off by default, and the guided search does not use it: its expected gains and stopping rule weigh the
   GP's std, and with the spread they measured 36.8 and 32.3 settings per search on the first 13 time and 15
   energy rows of the oracle benchmark, against 28.5 and 27.2 (experiments/results/predictor_comparison.txt).
   :meth:`Prediction.within_std` counts the truths a doubt covers.

``experiments/predictor_comparison.py`` compares this against a plain GP, gradient boosting and the bases
alone by cross-validation on the Zeus traces (and the twin where present) and records why this one stays.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from edgetune.predictors.bases import MEMORY_KNOBS, GenericBase, PowerCapBase, RooflineBase

__all__ = ["BASES", "CV_FOLDS", "CV_VARIANCE_CAP", "EXTRAPOLATION_STD_PER_OCTAVE", "EXTRAPOLATION_STD_PER_SPAN", "FREQUENCY_KNOBS",
           "GP_MAX_LENGTH_SCALE", "HardwareModel", "Prediction", "role_name"]

#: Knobs whose value is a clock (or a count of cores): time scales with 1/value.
FREQUENCY_KNOBS = ("gpu_freq", "emc_freq", "cpu_freq", "mem_freq", "cpu_cores")
BASES = ("auto", "frequency", "power_cap", "generic")
BATCH = "batch_size"
#: relative std added per octave of batch size outside the measured ones (time, power): one octave out is
#: trusted to no better than 20% in time (per-sample time bends with the batch: the GPU fills, caches spill)
#: and 10% in power (power saturates with the batch, so it strays less)
EXTRAPOLATION_STD_PER_OCTAVE = (0.20, 0.10)
#: folds of the cross-validation that floors the residual GP's signal variance (module docs): each refit of
#: the base costs about a tenth of the GP fits
CV_FOLDS = 4
#: the floor's cap, a mean squared log error (0.04: a relative std of 20%): a base refitted on three quarters
#: of a handful of rows can be wrong by any amount, and a floor without a cap would make every prediction a
#: coin toss
CV_VARIANCE_CAP = 0.04
#: relative std added per measured span of a knob beyond that span (time, power): a clock twice as far out
#: as the measured range is wide may cross a roofline knee the rows never showed
EXTRAPOLATION_STD_PER_SPAN = (0.20, 0.10)


def role_name(name: str) -> str:
    """The registry name of a knob column by its role (``gpu_freq_hz`` -> ``gpu_freq``); the name itself
    when it maps to no role."""
    from edgetune.tables import resolve_knob_name

    try:
        column = resolve_knob_name(name)
    except ValueError:
        return name
    return column.name if column.role is not None else name


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

    def within_std(self, step_time_s, power_w, n_std: float = 2.0) -> tuple[float, float]:
        """The shares of the true ``step_time_s`` and ``power_w`` (one per row) whose log error lies within
        ``n_std`` predicted relative std: about 95% at 2 std for a doubt that is honest."""
        def share(truth, mean: np.ndarray, std: np.ndarray, name: str) -> float:
            truth = np.asarray(truth, dtype=float).ravel()
            if truth.size != mean.size:  # one value would be broadcast against every prediction
                raise ValueError(f"{truth.size} {name} value(s) for {mean.size} predictions; give one per row")
            return float(np.mean(np.abs(np.log(truth / mean)) <= n_std * std / mean))

        return (share(step_time_s, self.step_time_s, self.step_time_std, "step_time_s"),
                share(power_w, self.power_w, self.power_std, "power_w"))



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
        if not isinstance(row, Mapping):
            raise ValueError(f"row {i} of X is not a mapping (knob -> value, plus 'batch_size')")  # noqa: TRY004
        if BATCH not in row:
            raise ValueError(f"row {i} of X has no 'batch_size' entry")
        keys = set(row) - {BATCH}
        if keys != set(names):
            raise ValueError(f"row {i} of X has knobs {sorted(keys)}; the model expects {names}")
        try:
            rows[i, :-1] = [float(row[k]) for k in names]
            rows[i, -1] = float(row[BATCH])
        except (TypeError, ValueError):
            raise ValueError(f"row {i} of X has a non-numeric value") from None
    bad = ~np.isfinite(rows) | (rows <= 0)
    if np.any(bad):
        i, j = (int(v[0]) for v in np.nonzero(bad))
        raise ValueError(f"row {i} of X: {[*names, BATCH][j]} = {rows[i, j]:g}; knob values and batch sizes must be "
                         f"positive finite numbers")
    return names, rows


def _check_cv_folds(cv_folds: object) -> int:
    """``cv_folds`` as an int: 0 (no cross-validation) or at least 2 (one fold would refit on no rows)."""
    if isinstance(cv_folds, bool) or not isinstance(cv_folds, (int, np.integer)) or cv_folds == 1 or cv_folds < 0:
        raise ValueError(f"cv_folds must be 0 (no cross-validation) or a whole number >= 2, got {cv_folds!r}")
    return int(cv_folds)


def _as_target(y: Sequence[float] | np.ndarray, n: int, name: str) -> np.ndarray:
    a = np.asarray(y, dtype=float)
    if a.ndim > 2 or (a.ndim == 2 and a.shape[1] != 1):  # a column (n, 1) is one value per row
        raise ValueError(f"{name} must be one value per row of X, got shape {a.shape}")
    a = a.ravel()
    if a.size != n:
        raise ValueError(f"{name} has {a.size} values for {n} rows of X")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} must hold positive finite numbers")
    return a


# ------------------------------------------------------------------------------------------ the model


#: the residual GP's longest length scale (inputs: 1 is two octaves of batch size or half a knob's measured range):
#: 2 is four octaves or the whole measured range. At the old bound (100) the fit ran every length scale to it and
#: the GP became a constant offset: sure of every setting, so the cross-validated floor on its signal variance added
#: no doubt away from the rows (twin Orin AGX cnn, MAXN, batch 32: 0.0089 +- 0.0001 s predicted for 0.0079 s, and
#: the optimum was never measured). On the oracle benchmark (time, seeds 0 and 1) the bound of 2 put 28 and 28 of
#: 36 rows within 3% against 24 and 26, at about the same CPU.
GP_MAX_LENGTH_SCALE = 2.0


def _residual_gp(dims: int, random_state: int | None, floor: float = 0.0) -> GaussianProcessRegressor:
    """The residual GP; ``floor``: the least signal variance it may fit (the base's cross-validated error)."""
    # residuals are small (log ratios of a few %): a small signal variance and a smooth, anisotropic RBF
    lo = max(1e-4, floor)
    kernel = ConstantKernel(max(0.01, lo), (lo, 1.0)) * RBF(
        [2.0] + [1.0] * (dims - 1), (0.5, GP_MAX_LENGTH_SCALE)) + WhiteKernel(1e-3, (1e-5, 1e-1))
    return GaussianProcessRegressor(kernel, normalize_y=False, random_state=random_state)


class HardwareModel(BaseEstimator):
    """Predicts step time, mean and peak power from measured (setting, batch size) rows.

    Args:
        base: ``auto`` (``power_cap`` for a lone ``power_limit`` knob, ``frequency`` when every knob is a
            clock or core count, else ``generic``), or one of those by name.
        residual: ``gp`` (a Gaussian process corrects the base and gives the uncertainty) or ``none``.
        random_state: seed of the GP optimiser.
        cv_folds: folds of the cross-validation whose error floors the residual GP's signal variance (module
            docs, 4); 0: no floor; else at least 2 (``ValueError``). With no more rows than folds, no floor.

    Fitted attributes: ``base_kind_``, ``base_model_``, ``time_gp_`` and ``power_gp_`` (``residual="gp"``),
    ``cv_var_`` (the base's cross-validated mean squared log error, time and power, capped at
    :data:`CV_VARIANCE_CAP`; 0 where not cross-validated), ``refits_`` (the cross-validation's refits of the
    base, one per fold; empty where not cross-validated), ``time_spread_``, ``power_spread_``,
    ``peak_ratio_``, ``n_train_``.

    Example::

        model = HardwareModel().fit([{"gpu_freq": 6.1e8, "batch_size": 32}, ...], times, powers)
        pred = model.predict([{"gpu_freq": 9.2e8, "batch_size": 64}])
        pred.step_time_s, pred.power_w, pred.step_time_std
    """

    def __init__(self, base: str = "auto", residual: str = "gp", random_state: int | None = 0,
                 cv_folds: int = CV_FOLDS) -> None:
        self.base = base
        self.residual = residual
        self.random_state = random_state
        self.cv_folds = cv_folds

    # sklearn convention: fitted attributes end with "_"
    def fit(self, X: Sequence[Mapping[str, float]], step_time_s, power_w, peak_power_w=None) -> HardwareModel:
        """Fit on rows ``X`` (knob values plus ``batch_size``) and their measured time and power."""
        if self.base not in BASES:
            raise ValueError(f"base must be one of {', '.join(BASES)}, got {self.base!r}")
        if self.residual not in ("gp", "none"):
            raise ValueError(f"residual must be 'gp' or 'none', got {self.residual!r}")
        cv_folds = _check_cv_folds(self.cv_folds)
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
        self.k_min_ = k.min(axis=0) if names else np.zeros(0)
        self.k_max_ = k.max(axis=0) if names else np.zeros(0)
        self.b_range_ = (float(M[:, -1].min()), float(M[:, -1].max()))
        roles = [role_name(nm) for nm in names]  # registry names by role: gpu_freq_hz -> gpu_freq
        clocks = [r for r in roles if r in FREQUENCY_KNOBS]
        kind = self.base
        if kind == "auto":
            if roles == ["power_limit"]:
                kind = "power_cap"
            elif (clocks and len(set(clocks)) == len(clocks) and not all(m in roles for m in MEMORY_KNOBS)
                  and not {"power_limit", "power_mode"} & set(roles)):
                kind = "frequency"  # knobs with no role ride along: the residual GP sees them
            else:
                kind = "generic"
        if kind == "power_cap" and roles != ["power_limit"]:
            raise ValueError(f"base 'power_cap' needs exactly one knob, power_limit; got {names}")
        if kind == "frequency" and not names:
            kind = "generic"
        self.base_kind_ = kind
        def fit_base(sel: np.ndarray, full=None):
            """The base on rows ``sel``; a refit (``full``: the fit on all rows) starts where that one did."""
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                if kind == "power_cap":
                    return PowerCapBase.fit(k[sel], b[sel], t[sel] / b[sel], p[sel], float(self.scale_[0]),
                                             None if full is None else full.start_m)
                if kind == "frequency":
                    return RooflineBase.fit(roles, k[sel], self.scale_, b[sel], t[sel], p[sel],
                                             None if full is None else full.theta)
                return GenericBase.fit(k[sel], b[sel], t[sel] / b[sel], p[sel])

        self.base_model_ = fit_base(np.arange(n))
        bt, bp = self._base_predict(k, b)
        rt, rp = np.log(t / bt), np.log(p / bp)
        self.cv_var_ = (0.0, 0.0)
        self.refits_ = []
        if self.residual == "gp" and cv_folds and n > cv_folds:
            # how wrong the base is where it was not fitted: each fold predicted by a refit on the others
            # (the roofline started from the full fit; the power-cap base from its winning start, not its
            # optimum), as log ratios
            et, ep = np.zeros(n), np.zeros(n)
            fold = np.arange(n) % cv_folds
            for f in range(cv_folds):
                held = fold == f
                refit = fit_base(np.flatnonzero(~held), self.base_model_)
                self.refits_.append(refit)
                with np.errstate(all="ignore"):
                    ts, ps = refit.predict(k[held], b[held])
                et[held], ep[held] = np.log(t[held] / (ts * b[held])), np.log(p[held] / ps)
            self.cv_var_ = tuple(float(min(np.nanmean(e**2), CV_VARIANCE_CAP)) if np.isfinite(np.nanmean(e**2))
                                 else CV_VARIANCE_CAP for e in (et, ep))
        if self.residual == "gp":
            Z = self._gp_inputs(k, b)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                self.time_gp_ = _residual_gp(Z.shape[1], self.random_state, self.cv_var_[0]).fit(Z, rt)
                self.power_gp_ = _residual_gp(Z.shape[1], self.random_state, self.cv_var_[1]).fit(Z, rp)
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

    def _extrapolation_std(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Relative std (time, power) for the distance of each row outside the fitted range (module docs)."""
        lo, hi = self.b_range_
        octaves = np.maximum(0.0, np.maximum(np.log2(lo / b), np.log2(b / hi)))
        spans = np.zeros(b.size)
        if self.knobs_:
            width = np.where(self.k_max_ > self.k_min_, self.k_max_ - self.k_min_, np.maximum(self.k_max_, 1e-12))
            out = np.maximum(0.0, np.maximum(self.k_min_ - k, k - self.k_max_)) / width
            spans = out.sum(axis=1)
        (ot, op), (kt, kp) = EXTRAPOLATION_STD_PER_OCTAVE, EXTRAPOLATION_STD_PER_SPAN
        return ot * octaves + kt * spans, op * octaves + kp * spans

    def _refits_std(self, k: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Relative std (time, power) of the refits' predictions: their grouped-jackknife spread in log
        space, capped at the square root of :data:`CV_VARIANCE_CAP` (a refit that predicts nothing finite
        counts as the cap)."""
        K = len(self.refits_)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            lt, lp = zip(*((np.log(ts * b), np.log(ps)) for ts, ps in (r.predict(k, b) for r in self.refits_)))
        cap = math.sqrt(CV_VARIANCE_CAP)
        out = []
        for logs in (np.array(lt), np.array(lp)):
            spread = np.sqrt((K - 1) / K * np.sum((logs - logs.mean(axis=0)) ** 2, axis=0))
            out.append(np.minimum(np.nan_to_num(spread, nan=cap), cap))
        return out[0], out[1]

    def predict(self, X: Sequence[Mapping[str, float]], refit_spread: bool = False) -> Prediction:
        """Predict every row of ``X`` (same knobs as in :meth:`fit`).

        ``refit_spread``: add the spread of the cross-validation's refits to the std (module docs, 4): a doubt
        that covers held-out rows as a std should, where the GP's alone is too sure between rows. No effect
        on the means, nor where the fit was not cross-validated (``cv_folds=0``, ``residual="none"``, or no
        more rows than folds)."""
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
        xt, xp = self._extrapolation_std(k, b)
        st, sp = np.hypot(st, xt), np.hypot(sp, xp)
        if refit_spread and self.refits_:
            jt, jp = self._refits_std(k, b)
            st, sp = np.hypot(st, jt), np.hypot(sp, jp)
        return Prediction(step_time_s=t, power_w=p, peak_power_w=p * self.peak_ratio_,
                          step_time_std=t * st, power_std=p * sp)
