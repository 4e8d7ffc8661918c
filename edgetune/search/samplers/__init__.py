"""The search's Optuna samplers, by the names the config uses.

* ``guided`` (:class:`GuidedSampler`): the hardware model's constrained expected improvement over the grid;
  on a space whose only knob is a power limit, :class:`PowerCapSampler` (its own initial design and polish);
* ``tpe``, ``gp``, ``random``: Optuna's own;
* ``auto``: :data:`AUTO_SAMPLER`, the winner of ``experiments/sampler_comparison.py``.

The guided samplers learn what was measured through an ``observations_func`` (``FrozenTrial ->
Observation | None``, default :func:`edgetune.search.records.read_observation`), the way Optuna's samplers take
a ``constraints_func``: they never read trial attributes themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from edgetune.search.samplers.guided import GuidedSampler, ObservationsFunc
from edgetune.search.samplers.powercap import PowerCapSampler, is_power_cap_space
from edgetune.search.space import SearchSpace

__all__ = ["AUTO_SAMPLER", "GuidedSampler", "ObservationsFunc", "PowerCapSampler", "is_power_cap_space",
           "make_sampler"]

#: sampler used by ``sampler = "auto"``: chosen by experiments/sampler_comparison.py
AUTO_SAMPLER = "guided"

# Optuna's model-based samplers start with random proposals: a quarter of the trial budget, at least 3 (a
# model needs a few points) and at most 10 (past that the random start only delays the model)
_STARTUP_FRACTION = 4
_MIN_STARTUP_TRIALS = 3
_MAX_STARTUP_TRIALS = 10


def make_sampler(name: str, *, seed: int, n_trials: int, objective: str, space: SearchSpace,
                 guided_options: Mapping[str, Any] | None = None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler named in the config (``auto``: the measured winner, :data:`AUTO_SAMPLER`).

    Raises:
        ValueError: an unknown name (one line).
    """
    name = AUTO_SAMPLER if name == "auto" else name
    startup = max(_MIN_STARTUP_TRIALS, min(_MAX_STARTUP_TRIALS, n_trials // _STARTUP_FRACTION))
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True,
                                          constant_liar=True)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup, deterministic_objective=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "guided":
        cls = PowerCapSampler if is_power_cap_space(space) else GuidedSampler  # a power cap: its own design
        return cls(space, objective=objective, seed=seed, **dict(guided_options or {}))
    raise ValueError(f"unknown sampler {name!r}; use auto, guided, tpe, gp or random")
