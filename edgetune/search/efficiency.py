"""From a measured step to what the user wants: time and energy to reach the training target.

A bigger batch makes each step slower but needs fewer steps. McCandlish et al. (2018, "An Empirical Model
of Large-Batch Training") model the steps to a target loss as

    steps(b) = S_min * (1 + B_noise / b)

with ``B_noise`` the gradient noise scale (in samples) and ``S_min`` the steps at an infinite batch. So

    time to target   = steps(b) * step time(b, knobs)
    energy to target = steps(b) * energy per step(b, knobs)

``S_min`` scales every setting alike: it changes the absolute figures reported, never which setting wins.
``B_noise`` does decide the winner. The default (``efficiency.b_noise = 256`` samples) is the order of the
noise scale McCandlish et al. report for small image classifiers early in training; set it from your own
run, or use ``"measure"`` to estimate it from gradient norms during the warm-up steps
(:class:`edgetune.predictors.GradientNoiseScale`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DIRECTIONS", "Outcome", "TargetModel", "measure_b_noise", "objective_values", "steps_to_target"]

#: Optuna study directions per objective.
DIRECTIONS: dict[str, list[str]] = {
    "time": ["minimize"],
    "energy": ["minimize"],
    "throughput": ["maximize"],
    "pareto": ["minimize", "minimize"],
}


def steps_to_target(batch_size: float, s_min: float, b_noise: float) -> float:
    """McCandlish et al.'s steps to target at ``batch_size``: ``S_min (1 + B_noise / b)`` (the predictors'
    formula, the one in the project; imported here, not at the top, because the predictors import torch)."""
    from edgetune.predictors import steps_to_target as predictors_steps_to_target

    return float(predictors_steps_to_target(batch_size, s_min, b_noise))


@dataclass(frozen=True)
class TargetModel:
    """The training target in steps: ``S_min`` and ``B_noise`` (see the module docs)."""

    s_min: float = 1000.0
    b_noise: float = 256.0
    b_noise_source: str = "config"

    def steps(self, batch_size: float) -> float:
        return steps_to_target(batch_size, self.s_min, self.b_noise)


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


def objective_values(outcome: Outcome, objective: str) -> list[float]:
    """The study's objective value(s) for ``objective`` (directions in :data:`DIRECTIONS`)."""
    if objective == "time":
        return [outcome.time_to_target_s]
    if objective == "energy":
        return [outcome.energy_to_target_j]
    if objective == "throughput":
        return [outcome.samples_per_s]
    if objective == "pareto":
        return [outcome.time_to_target_s, outcome.energy_to_target_j]
    raise ValueError(f"unknown objective {objective!r}; use one of {', '.join(DIRECTIONS)}")


def scalar_score(outcome: Outcome, objective: str) -> float:
    """One number, smaller is better, for ranking and early stopping (pareto: time)."""
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
    import torch

    from edgetune.predictors import GradientNoiseScale, measure_noise_scale_step

    if batch_size % micro_batches:
        batch_size = max(micro_batches, batch_size - batch_size % micro_batches)
    gns = GradientNoiseScale(beta=beta)
    model, optimizer = workload.model, workload.optimizer
    model.train()
    for _ in range(steps):
        inputs, targets = workload.make_batch(batch_size)
        if not isinstance(inputs, torch.Tensor):
            raise ValueError("measuring B_noise needs a workload whose inputs are one tensor; set "  # noqa: TRY004
                             "efficiency.b_noise to a number")
        measure_noise_scale_step(gns, model, workload.loss_fn, inputs, targets, micro_batches)
        optimizer.step()
    return float(gns.noise_scale)
