"""From a measured step to what the user wants: time and energy to reach the training target.

A bigger batch makes each step slower but needs fewer steps. McCandlish et al. (2018, "An Empirical Model
of Large-Batch Training") model the steps to a target loss as

    steps(b) = S_min * (1 + B_noise / b)

with ``B_noise`` the gradient noise scale (in samples) and ``S_min`` the steps at an infinite batch. So

    time to target   = steps(b) * step time(b, knobs)
    energy to target = steps(b) * energy per step(b, knobs)

Users coming from Zeus (You et al., NSDI'23) weigh energy against time with one knob ``eta`` in [0, 1]:

    cost = eta x energy to target + (1 - eta) x max power x time to target

with max power the device's maximum power (Zeus: the GPU's largest power limit), so both terms are joules
(:class:`ZeusCost`, objective ``cost``). Its optimum lies on the time-energy Pareto front.

``S_min`` scales every setting alike: it changes the absolute figures reported, never which setting wins.
``B_noise`` does decide the winner. By default (``efficiency.b_noise = "workload"``) it is the workload's
own, :attr:`edgetune.workloads.Workload.b_noise`: the built-in workloads carry one measured on real data by
``experiments/convergence_truth.py``; for a workload without one, ``edgetune search`` measures it as
``"measure"`` does (a :class:`TargetModel` built here falls back to :data:`FALLBACK_B_NOISE`). Set a
number from your own run, or use ``"measure"`` to estimate it from gradient norms during the warm-up steps
(:class:`edgetune.predictors.GradientNoiseScale`): the median of ``efficiency.b_noise_warmups``
(:data:`edgetune.config.B_NOISE_WARMUPS`) warm-ups, each on the workload built again with another seed
(:func:`measure_b_noise_warmups`), since one warm-up is one draw.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "DIRECTIONS",
    "FALLBACK_B_NOISE",
    "LAW_RATIO_PRECISION",
    "Outcome",
    "TargetModel",
    "WarmupNoiseScale",
    "ZeusCost",
    "cost_max_power_w",
    "measure_b_noise",
    "measure_b_noise_warmups",
    "objective_values",
    "steps_to_target",
]

#: B_noise (samples) for a workload that carries none: the order of the noise scale McCandlish et al. (2018)
#: report for small image classifiers early in training.
FALLBACK_B_NOISE = 256.0

#: the fewest warm-ups with a positive estimate whose median is taken (fewer warm-ups: all of them)
MIN_POSITIVE_WARMUPS = 2

#: how well the convergence law S(b) = S_min (1 + B_noise / b) is taken to know the ratio of the steps to target
#: of two batch sizes. Its best case on the built-in workloads, with each one's measured B_noise: it misses the
#: median of fifteen seeds' steps by 2-3% at mobilenet's batch sizes 8 to 32, and their ratio S(16)/S(32) by 5%;
#: elsewhere it misses by 7% to several times (experiments/results/convergence_truth.txt). Two batch sizes
#: closer than this by the law are a tie that no measurement of the hardware breaks
#: (:class:`edgetune.search.results.BatchTie`), even where the law is at its best.
LAW_RATIO_PRECISION = 0.05

#: Optuna study directions per objective.
DIRECTIONS: dict[str, list[str]] = {
    "time": ["minimize"],
    "energy": ["minimize"],
    "throughput": ["maximize"],
    "pareto": ["minimize", "minimize"],
    "cost": ["minimize"],
}
#: Zeus's default weight of energy in its cost (eta): energy and time, each in joules, weigh alike
DEFAULT_ETA = 0.5


def steps_to_target(batch_size: float, s_min: float, b_noise: float) -> float:
    """McCandlish et al.'s steps to target at ``batch_size``: ``S_min (1 + B_noise / b)`` (the predictors'
    formula, the one in the project; imported here, not at the top, because the predictors import torch)."""
    from edgetune.predictors import steps_to_target as predictors_steps_to_target

    return float(predictors_steps_to_target(batch_size, s_min, b_noise))


@dataclass(frozen=True)
class TargetModel:
    """The training target in steps: ``S_min`` and ``B_noise`` (see the module docs)."""

    s_min: float = 1000.0
    b_noise: float = FALLBACK_B_NOISE
    b_noise_source: str = "config"

    def __post_init__(self) -> None:
        """The law's parameters checked (ValueError): a negative B_noise makes the steps negative below it, a
        NaN every outcome NaN, and the search would rank them. Steps that are not the law's (:attr:`is_law`
        False: a table's, the user's runs) carry their own."""
        if not self.is_law:
            return
        if isinstance(self.s_min, bool) or not (isinstance(self.s_min, numbers.Real) and 0 < self.s_min < math.inf):
            raise ValueError(f"s_min must be a positive number of steps, got {self.s_min!r}")
        if isinstance(self.b_noise, bool) or not (isinstance(self.b_noise, numbers.Real)
                                                  and 0 <= self.b_noise < math.inf):
            raise ValueError(f"b_noise must be a number of samples >= 0, got {self.b_noise!r}")

    @classmethod
    def for_workload(cls, workload: object, s_min: float = 1000.0) -> TargetModel:
        """The target with ``workload``'s own measured B_noise (``Workload.b_noise``), or
        :data:`FALLBACK_B_NOISE` for a workload that carries none."""
        b_noise = getattr(workload, "b_noise", None)
        name = getattr(workload, "name", "the workload")
        if b_noise is None:
            return cls(s_min, FALLBACK_B_NOISE, f"fallback: {name} carries no measured B_noise")
        return cls(s_min, float(b_noise), f"workload: {name}'s measured B_noise")

    def steps(self, batch_size: float) -> float:
        return steps_to_target(batch_size, self.s_min, self.b_noise)

    @property
    def is_law(self) -> bool:
        """Whether the steps are the noise-scale law's (True here; a table's measured epochs to target are
        not, :class:`edgetune.search.oracle.TableTarget`, nor are the user's runs,
        :class:`edgetune.search.runs_target.RunsTarget`)."""
        return True

    def ratio_precision(self, batch_size: int, other: int) -> float:
        """How well these steps know ``steps(other) / steps(batch_size)``, as a relative error: two batch sizes
        closer than this in the objective are a tie the hardware's measurements cannot break (NaN: no tie is
        claimed). The law's: :data:`LAW_RATIO_PRECISION` for any two."""
        return LAW_RATIO_PRECISION

    def describe(self) -> dict:
        """JSON-ready: ``best.json``'s ``target_model``."""
        return {"s_min": self.s_min, "b_noise": self.b_noise, "b_noise_source": self.b_noise_source,
                "formula": "steps(b) = s_min * (1 + b_noise / b)  (McCandlish et al. 2018)"}


@dataclass(frozen=True)
class Outcome:
    """What a setting yields towards the target (NaN where the setting did not run)."""

    time_to_target_s: float
    energy_to_target_j: float
    samples_per_s: float
    steps_to_target: float

    @classmethod
    def of(cls, batch_size: int, step_time_s: float, energy_per_sample_j: float,
           target: TargetModel) -> Outcome:
        steps = target.steps(batch_size)
        return cls(
            time_to_target_s=steps * step_time_s,
            energy_to_target_j=steps * energy_per_sample_j * batch_size,
            samples_per_s=batch_size / step_time_s if step_time_s > 0 else math.nan,
            steps_to_target=steps,
        )


@dataclass(frozen=True)
class ZeusCost:
    """Zeus's cost of a setting: ``eta x energy + (1 - eta) x max_power_w x time`` (to target), in joules.

    Attributes:
        eta: weight of energy, in [0, 1] (1: energy only; 0: time only).
        max_power_w: the device's maximum power, W (:func:`cost_max_power_w`).
    """

    eta: float = DEFAULT_ETA
    max_power_w: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {self.eta!r}")
        if not (self.max_power_w > 0 and math.isfinite(self.max_power_w)):
            raise ValueError(f"max_power_w must be a positive number of watts, got {self.max_power_w!r}")

    def of(self, time_s: float, energy_j: float) -> float:
        """The cost of ``time_s`` and ``energy_j`` (to target, or of anything else alike)."""
        return self.eta * energy_j + (1.0 - self.eta) * self.max_power_w * time_s

    def of_outcome(self, outcome: Outcome) -> float:
        return self.of(outcome.time_to_target_s, outcome.energy_to_target_j)


def cost_max_power_w(device) -> float | None:
    """The max power in Zeus's cost for ``device``: its largest power limit when it has a ``power_limit``
    knob (Zeus's definition: the GPU's maximum power limit; the Zeus traces), else the most the device can
    draw (``device.max_power_w``: on the twin the module's power at its highest mode and clocks). None when
    neither is known."""
    knob = getattr(device, "knobs", {}).get("power_limit")
    if knob is not None and knob.values:
        return float(max(knob.values))
    return None if device.max_power_w is None else float(device.max_power_w)


def objective_values(outcome: Outcome, objective: str, cost: ZeusCost | None = None) -> list[float]:
    """The study's objective value(s) for ``objective`` (directions in :data:`DIRECTIONS`); ``cost``: the
    weights of the ``cost`` objective."""
    if objective == "time":
        return [outcome.time_to_target_s]
    if objective == "energy":
        return [outcome.energy_to_target_j]
    if objective == "throughput":
        return [outcome.samples_per_s]
    if objective == "pareto":
        return [outcome.time_to_target_s, outcome.energy_to_target_j]
    if objective == "cost":
        if cost is None:
            raise ValueError("the cost objective needs its weights (ZeusCost)")
        return [cost.of_outcome(outcome)]
    raise ValueError(f"unknown objective {objective!r}; use one of {', '.join(DIRECTIONS)}")


def scalar_score(outcome: Outcome, objective: str, cost: ZeusCost | None = None) -> float:
    """One number, smaller is better, for ranking and early stopping (pareto: time)."""
    if objective == "cost":
        return objective_values(outcome, objective, cost)[0]
    if objective == "throughput":
        return -outcome.samples_per_s
    if objective == "energy":
        return outcome.energy_to_target_j
    return outcome.time_to_target_s


def measure_b_noise(workload, batch_size: int, *, steps: int = 20, micro_batches: int = 4,
                    beta: float = 0.9) -> float:
    """Estimate B_noise from gradient norms over ``steps`` real training steps of ``workload``.

    Each step splits a batch of ``batch_size`` into ``micro_batches`` equal parts and accumulates their
    gradients; :class:`edgetune.predictors.GradientNoiseScale` turns the small- and big-batch gradient norms
    into unbiased |G|^2 and tr(Sigma) (McCandlish et al. 2018, appendix A), averaged with bias correction.
    The steps train the model (they are the warm-up). Returns ``nan`` when the estimate is not positive
    (too few steps to tell the signal from the noise).
    """
    from edgetune.predictors import GradientNoiseScale, measure_noise_scale_parts

    if batch_size % micro_batches:
        batch_size = max(micro_batches, batch_size - batch_size % micro_batches)
    gns = GradientNoiseScale(beta=beta)
    model, optimizer = workload.model, workload.optimizer
    model.train()
    for _ in range(steps):
        parts = workload.split_batch(workload.make_batch(batch_size), batch_size, micro_batches)
        measure_noise_scale_parts(gns, model, parts, workload.loss, batch_size // micro_batches)
        optimizer.step()
    return float(gns.noise_scale)


@dataclass(frozen=True)
class WarmupNoiseScale:
    """B_noise measured over several warm-ups (:func:`measure_b_noise_warmups`).

    Attributes:
        estimates: each warm-up's B_noise in samples, in the order run; ``nan`` where it was not positive
            after its steps.
        steps: steps per warm-up.
    """

    estimates: tuple[float, ...]
    steps: int

    @property
    def positive(self) -> tuple[float, ...]:
        """The estimates that are positive and finite."""
        return tuple(v for v in self.estimates if v > 0 and math.isfinite(v))

    @property
    def b_noise(self) -> float:
        """The median of the positive estimates, samples; ``nan`` with fewer than :data:`MIN_POSITIVE_WARMUPS`
        of them (or than the warm-ups run, when fewer ran)."""
        if not self.estimates or len(self.positive) < min(MIN_POSITIVE_WARMUPS, len(self.estimates)):
            return math.nan
        return float(statistics.median(self.positive))


def measure_b_noise_warmups(workloads: Iterable, batch_size: int, *, steps: int = 20) -> WarmupNoiseScale:
    """:func:`measure_b_noise` on each of ``workloads`` in turn (each ``steps`` steps at ``batch_size``).

    Pass the workload the search trains first and copies built with other seeds after it
    (``load_workload(spec, seed=...)``: fresh batches, and fresh weights unless the builder loads them),
    lazily if building one is costly: the estimate of one warm-up is one draw, and its median over several is
    what :attr:`WarmupNoiseScale.b_noise` gives.
    Raises ValueError as :func:`measure_b_noise` does.
    """
    return WarmupNoiseScale(tuple(measure_b_noise(w, batch_size, steps=steps) for w in workloads), steps)
