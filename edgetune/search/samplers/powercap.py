"""The guided sampler on a space whose only knob is a power cap (the power-limit role: NVML GPUs, Zeus traces).

A power cap is enforced by the GPU: a setting whose cap is at or below the budget draws about the cap or
less, so it is (on average) feasible before anything is measured, and for each batch size the fastest
feasible setting is near the highest cap that holds the budget. :class:`PowerCapSampler` uses that:

1. *Initial design*: the cap nearest at or below the budget (unconstrained: the highest), at batch sizes
   spread evenly over the range (``design_points``, smallest and largest included). Every such point is informative (near each batch
   size's best feasible setting) and almost surely feasible; the guided sampler's space-filling start
   would spend the same measurements on caps far below the budget (slow) or far above (infeasible).
2. The hardware model's constrained expected improvement, as :class:`~edgetune.search.guided.GuidedSampler`.
3. *Polish*: when the model finds nothing left that could beat the best by the margin, the unmeasured
   neighbours of the best setting (one cap level up or down, one batch size level up or down) are measured
   before stopping, most promising first. Above the power a batch size saturates at, caps change nothing
   physical, and measured rows then differ by run-to-run noise (the Zeus A40 CIFAR-100 trace: 15.8 to
   18.0 s per epoch at batch 128 over caps of 125 to 300 W); the model rightly calls them equal, and only
   measuring them finds the one that measured fastest.

Used by :func:`edgetune.search.samplers.make_sampler` for ``guided`` (and ``auto``) when the space's only
knob is a power limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.study import Study

from edgetune.power.knobs import Candidate, KnobRole, knob_of_role
from edgetune.search.samplers.guided import GuidedSampler
from edgetune.search.space import SearchSpace

__all__ = ["PowerCapSampler", "is_power_cap_space"]


def is_power_cap_space(space: SearchSpace) -> bool:
    """True when a power limit is the only knob tuned (with the batch size)."""
    return len(space.knob_names) == 1 and knob_of_role(space.knob_names, KnobRole.POWER_LIMIT) is not None


class PowerCapSampler(GuidedSampler):
    """:class:`GuidedSampler` with a power-cap initial design and a polish of the best's neighbours.

    Args:
        design_points: batch sizes measured at the cap nearest at or below the budget before the model.
        **kwargs: as :class:`GuidedSampler` (its ``polish`` measures every neighbour of the best here, one cap
            or batch size level away, :meth:`_polish_near`) (``n_spread`` defaults to 0: the design is the spread).
    """

    def __init__(self, space: SearchSpace, *, design_points: int = 3, **kwargs: Any) -> None:
        if not is_power_cap_space(space):
            raise ValueError(f"PowerCapSampler needs a space whose only knob is a power limit (power_limit); got "
                             f"{', '.join(space.knob_names) or 'none'}")
        kwargs.setdefault("n_spread", 0)  # the design spreads the start over the batch sizes already
        super().__init__(space, **kwargs)
        self.cap = space.knob_names[0]
        self.design_points = design_points

    # -- 1. initial design ----------------------------------------------------------------------------
    def design(self) -> list[dict[str, int]]:
        """The initial design as Optuna params (levels), in measuring order."""
        caps = [float(v) for v in self.space.knob_values[self.cap]]
        limit = np.inf if self.budget_w is None else self.budget_w * (1.0 + self.tolerance)
        held = [i for i, c in enumerate(caps) if c <= limit]
        cap_level = held[-1] if held else 0
        n_b = len(self.space.batch_sizes)
        k = max(1, min(n_b, self.design_points))
        levels = list(dict.fromkeys(np.rint(np.linspace(0, n_b - 1, k)).astype(int).tolist()))
        cap = self.space.knob_values[self.cap][cap_level]
        return [self.space.params(Candidate(self.space.batch_sizes[b], ((self.cap, cap),))) for b in levels]

    def _startup(self, study: Study, among: np.ndarray | None = None) -> dict[str, Any]:
        taken = self._taken(study)
        for params in self.design():
            if self.grid.index(params) not in taken:
                return params
        return super()._startup(study, among)

    # -- 3. polish --------------------------------------------------------------------------------------
    def _polish_near(self, best: int, measured: Sequence[int] = ()) -> np.ndarray:
        """Every setting one level from the best in the cap or in the batch size: caps above a batch size's
        saturation change nothing physical, so only measuring tells them apart (``measured`` rows nearby do not
        excuse a neighbour here)."""
        near = self.grid.neighbours(np.array([best]))
        near = near[np.abs(self.grid.levels(near) - self.grid.levels(np.array([best]))[0]).max(axis=1) <= 1]
        return near[near != best]

    def __repr__(self) -> str:
        return f"PowerCapSampler(grid={self.grid.n}, objective={self.objective!r})"
