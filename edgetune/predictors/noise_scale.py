"""Batch efficiency from the gradient noise scale (McCandlish, Kaplan, Amodei et al. 2018, arXiv:1812.06162).

The noise scale B_noise = tr(Sigma) / |G|^2 (per-sample gradient covariance over squared true gradient) says
how much a larger batch helps: steps to a target fall as S(b) = S_min (1 + B_noise / b), so samples rise as
E(b) = E_min (1 + b / B_noise). Below B_noise larger batches cut steps almost linearly; far above, they
only add samples.

Estimation (their Appendix A): with squared gradient norms measured at two batch sizes, B_small < B_big,

    |G|^2  ~  (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(S)  ~  (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

are unbiased. Each is noisy per step, so numerator and denominator get separate exponential moving averages
(with Adam-style bias correction) and only their ratio is taken. The cheap source of the two norms is
gradient accumulation: each micro-batch gradient is a small-batch gradient, their mean the big-batch one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

__all__ = [
    "LR_RULES",
    "GradientNoiseScale",
    "MicroBatchProbe",
    "StepsFit",
    "adascale_gain",
    "epochs_to_target",
    "fit_steps_to_target",
    "measure_noise_scale_parts",
    "measure_noise_scale_step",
    "scale_lr",
    "steps_to_target",
]

#: a micro-batch, in whatever form the loss takes it
T = TypeVar("T")


def _grad_sq_norm(params: Sequence[torch.Tensor]) -> float:
    total = 0.0
    for p in params:
        if p.grad is not None:
            total += float(p.grad.detach().double().pow(2).sum())
    return total


class GradientNoiseScale:
    """Online estimate of the simple noise scale B_simple = tr(Sigma) / |G|^2.

    Args:
        beta: EMA decay of the two estimates (0.99: an effective window of ~100 steps). Small models and
            short runs want less (0.9).

    Feed it squared gradient norms with :meth:`update`, or let :meth:`probe` take them from a model during
    gradient accumulation. ``noise_scale`` is ``nan`` until both averages are positive.
    """

    def __init__(self, beta: float = 0.99) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError("beta must lie in [0, 1)")
        self.beta = beta
        self._g2 = 0.0  # EMA of the |G|^2 estimate
        self._s = 0.0  # EMA of the tr(Sigma) estimate
        self._weight = 0.0  # 1 - beta^t, the bias correction
        self.updates = 0

    def update(self, small_grad_sq: float, big_grad_sq: float, b_small: float, b_big: float) -> float:
        """Add one measurement; returns the current noise scale.

        Args:
            small_grad_sq: |G_small|^2, squared norm of a gradient over ``b_small`` samples (the mean over
                several such small gradients is better, and still unbiased).
            big_grad_sq: |G_big|^2 over ``b_big`` samples.
        """
        if not b_big > b_small > 0:
            raise ValueError(f"need b_big > b_small > 0, got b_small={b_small}, b_big={b_big}")
        if not (math.isfinite(small_grad_sq) and math.isfinite(big_grad_sq)):
            raise ValueError("gradient norms must be finite (a diverged step?)")
        g2 = (b_big * big_grad_sq - b_small * small_grad_sq) / (b_big - b_small)
        s = (small_grad_sq - big_grad_sq) / (1.0 / b_small - 1.0 / b_big)
        self._g2 = self.beta * self._g2 + (1 - self.beta) * g2
        self._s = self.beta * self._s + (1 - self.beta) * s
        self._weight = self.beta * self._weight + (1 - self.beta)
        self.updates += 1
        return self.noise_scale

    @property
    def grad_sq(self) -> float:
        """Bias-corrected average estimate of |G|^2."""
        return self._g2 / self._weight if self._weight else math.nan

    @property
    def trace_cov(self) -> float:
        """Bias-corrected average estimate of tr(Sigma), the per-sample gradient variance."""
        return self._s / self._weight if self._weight else math.nan

    @property
    def noise_scale(self) -> float:
        """B_simple; ``nan`` while an average is still non-positive (too few steps to tell)."""
        g2, s = self.grad_sq, self.trace_cov
        if not (g2 > 0 and s > 0):
            return math.nan
        return s / g2

    def probe(self, model: torch.nn.Module | Iterable[torch.Tensor]) -> MicroBatchProbe:
        """A light hook on a model trained with gradient accumulation (see :class:`MicroBatchProbe`)."""
        return MicroBatchProbe(self, model)


class MicroBatchProbe:
    """Measures |G_small|^2 and |G_big|^2 from ``.grad`` during gradient accumulation.

    Usage, inside a training step split into micro-batches (each loss the mean over its micro-batch)::

        probe = gns.probe(model)
        optimizer.zero_grad()
        for x, y in micro_batches:
            (loss_fn(model(x), y) / len(micro_batches)).backward()
            probe.micro_batch_done(len(x))
        probe.step_done()     # updates gns; then optimizer.step()

    Costs one copy of the gradients and a squared norm per micro-batch; nothing in the forward pass.
    The loss must be divided by the number of micro-batches (the usual accumulation), so the accumulated
    ``.grad`` is the big-batch mean gradient; micro-batches must have equal size.
    """

    def __init__(self, gns: GradientNoiseScale, model: torch.nn.Module | Iterable[torch.Tensor]) -> None:
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        self.gns = gns
        self.params = [p for p in params if p.requires_grad]
        self._reset()

    def _reset(self) -> None:
        self._previous: list[torch.Tensor | None] = [None] * len(self.params)
        self._small_sq: list[float] = []
        self._sizes: list[int] = []

    def micro_batch_done(self, batch_size: int) -> None:
        """Record the gradient the last micro-batch added to ``.grad``."""
        total = 0.0
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad.detach()
            prev = self._previous[i]
            delta = g if prev is None else g - prev
            total += float(delta.double().pow(2).sum())
            self._previous[i] = g.clone()
        self._small_sq.append(total)
        self._sizes.append(int(batch_size))

    def step_done(self) -> float:
        """Turn the step's micro-batches into one update of the estimator; returns the noise scale."""
        n = len(self._small_sq)
        try:
            if n < 2:
                raise ValueError("the noise scale needs at least 2 micro-batches per step")
            if len(set(self._sizes)) != 1:
                raise ValueError(f"micro-batches must have equal sizes, got {sorted(set(self._sizes))}")
            b_small = self._sizes[0]
            # each micro-batch gradient was scaled by 1/n by the accumulation: undo it for |G_small|^2
            small = float(np.mean(self._small_sq)) * n * n
            big = _grad_sq_norm(self.params)
            return self.gns.update(small, big, b_small, b_small * n)
        finally:
            self._reset()


def measure_noise_scale_step(
    gns: GradientNoiseScale,
    model: torch.nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    micro_batches: int,
) -> float:
    """One accumulation step over ``inputs`` split into ``micro_batches`` parts; leaves ``.grad`` set."""
    if inputs.shape[0] % micro_batches:
        raise ValueError(f"batch of {inputs.shape[0]} does not split into {micro_batches} equal micro-batches")
    parts = list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))
    return measure_noise_scale_parts(gns, model, parts, lambda part: loss_fn(model(part[0]), part[1]),
                                     inputs.shape[0] // micro_batches)


def measure_noise_scale_parts(gns: GradientNoiseScale, model: torch.nn.Module, parts: Sequence[T],
                              loss: Callable[[T], torch.Tensor], part_size: int) -> float:
    """One accumulation step over ``parts``, the equal micro-batches of one batch (``part_size`` samples
    each, in any form ``loss`` takes: a tokenizer's dict, a tuple of tensors); ``loss(part)`` is a part's mean
    loss. Leaves ``.grad`` set to the batch's mean gradient; returns the noise scale."""
    model.zero_grad(set_to_none=True)
    probe = gns.probe(model)
    for part in parts:
        (loss(part) / len(parts)).backward()
        probe.micro_batch_done(part_size)
    return probe.step_done()


# ------------------------------------------------------------------------------------------ steps to target


def steps_to_target(batch_size: float | np.ndarray, s_min: float, b_noise: float) -> float | np.ndarray:
    """S(b) = S_min (1 + B_noise / b): optimizer steps to reach a target at batch size ``b``."""
    return s_min * (1.0 + b_noise / np.asarray(batch_size, dtype=float))


def epochs_to_target(batch_size: float | np.ndarray, s_min: float, b_noise: float,
                     samples_per_epoch: float) -> float | np.ndarray:
    """E(b) = S(b) b / N: epochs to target; grows as b exceeds B_noise."""
    return steps_to_target(batch_size, s_min, b_noise) * np.asarray(batch_size, dtype=float) / samples_per_epoch


@dataclass(frozen=True)
class StepsFit:
    """A fitted S(b) = S_min (1 + B_noise / b) = S_min + E_min / b.

    ``e_min`` = S_min B_noise is the fewest samples that reach the target (tiny batches); ``s_min`` the
    fewest steps (huge batches), in the units of the steps given. When the data show no floor of steps
    (``s_min`` = 0), ``b_noise`` is ``inf`` and S(b) = E_min / b.
    """

    s_min: float
    b_noise: float
    e_min: float

    def steps(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        return self.s_min + self.e_min / np.asarray(batch_size, dtype=float)


def fit_steps_to_target(batch_sizes: Sequence[float], steps: Sequence[float]) -> StepsFit:
    """Fit (S_min, B_noise) to observed steps to target per batch size.

    S = S_min + (S_min B_noise) / b is linear in 1/b with non-negative coefficients, so this is a
    non-negative least squares on relative error (the data span orders of magnitude). Epochs to target
    convert as steps = epochs x N / b; N only scales S_min, so ``N = 1`` gives the same B_noise.
    """
    from scipy.optimize import nnls

    b = np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    if b.shape != s.shape or b.size < 2:
        raise ValueError("need steps for at least 2 batch sizes, one value each")
    if np.unique(b).size < 2:
        raise ValueError("need at least 2 distinct batch sizes")
    if not (np.all(np.isfinite(s)) and np.all(s > 0) and np.all(np.isfinite(b)) and np.all(b > 0)):
        raise ValueError("steps and batch sizes must be positive finite numbers (leave out runs that never "
                         "reached the target)")
    A = np.column_stack([np.ones_like(b), 1.0 / b]) / s[:, None]
    (alpha, beta), _ = nnls(A, np.ones_like(s))
    if alpha <= 1e-9 * beta / b.min():  # the constant term is round-off next to the 1/b term
        # steps keep falling as 1/b all the way: B_noise lies beyond the data
        return StepsFit(s_min=0.0, b_noise=math.inf, e_min=float(beta))
    return StepsFit(s_min=float(alpha), b_noise=float(beta / alpha), e_min=float(beta))


# ------------------------------------------------------------------------------------------ learning rates

LR_RULES = ("linear", "sqrt", "none", "adascale")


def adascale_gain(scale: float, b_noise: float, base_batch: float) -> float:
    """AdaScale gain r = (sigma^2 + |G|^2) / (sigma^2 / s + |G|^2) for a batch ``scale`` times larger.

    With sigma^2 = tr(Sigma) / base_batch this is (1 + B/b0) / (1 + B/(s b0)), B = B_noise: it lies in
    [1, s], near s when gradients are noise-dominated (B >> b0) and near 1 when they are not (Johnson et
    al. 2020, "AdaScale SGD").
    """
    if scale <= 0 or base_batch <= 0:
        raise ValueError("scale and base_batch must be positive")
    if not b_noise >= 0:
        raise ValueError("b_noise must be a non-negative number")
    if math.isinf(b_noise):
        return float(scale)
    k = b_noise / base_batch
    return (1.0 + k) / (1.0 + k / scale)


def scale_lr(lr: float, old_batch: float, new_batch: float, rule: str = "linear",
             b_noise: float | None = None) -> float:
    """Learning rate for ``new_batch`` given one tuned at ``old_batch``.

    Rules: ``linear`` (Goyal et al. 2017: lr x k, for SGD), ``sqrt`` (lr x sqrt(k), for Adam-type
    optimizers), ``none``, ``adascale`` (lr x AdaScale gain; needs ``b_noise``). k = new / old.
    """
    if rule not in LR_RULES:
        raise ValueError(f"unknown learning-rate rule {rule!r}; use one of {', '.join(LR_RULES)}")
    if not (0 < old_batch < math.inf and 0 < new_batch < math.inf):  # nan too: a nan rate trains into nan
        raise ValueError(f"batch sizes must be positive finite numbers, got {old_batch!r} and {new_batch!r}")
    k = new_batch / old_batch
    if rule == "linear":
        return lr * k
    if rule == "sqrt":
        return lr * math.sqrt(k)
    if rule == "none":
        return lr
    if b_noise is None:
        raise ValueError("the adascale rule needs b_noise (from GradientNoiseScale.noise_scale)")
    return lr * adascale_gain(k, b_noise, old_batch)
