"""The budget guard on one run: its ladder, the ladder's power model and the control law's state.

:mod:`edgetune.runtime.guard` holds the law as a pure function; :class:`LadderGuard` keeps what it needs
between ticks (the ladder around the chosen setting, the prior power model, the :class:`GuardState`) and
answers each tick with a :class:`~edgetune.runtime.guard.Decision`. It never writes a knob: the controller
applies the decided rung's setting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from edgetune.power.base import KnobValue
from edgetune.runtime.guard import Decision, GuardParams, GuardState, LadderModel, Observation, control

__all__ = ["LadderGuard"]


class LadderGuard:
    """The guard's state over a run.

    Args:
        params: the control law's tuning.
        reference_budget_w: the budget the chosen setting was made for (the plan's, else the starting one):
            at or below it the guard climbs no higher than the chosen setting, above it to the top rung.

    Attributes:
        ladder: the rungs (complete settings, ascending power) around the chosen setting.
        model: the rungs' power model (None before :meth:`reset`).
        state: the law's state (None before :meth:`reset`).
        anchor: the chosen setting (the plan's or the online tuner's); the controller sets it.
    """

    def __init__(self, params: GuardParams, reference_budget_w: float) -> None:
        self.params = params
        self.reference_budget_w = reference_budget_w
        self.ladder: list[dict[str, KnobValue]] = []
        self.model: LadderModel | None = None
        self.state: GuardState | None = None
        self.anchor: dict[str, KnobValue] = {}

    @property
    def ready(self) -> bool:
        """True once a ladder with its model and state is in place."""
        return self.state is not None and self.model is not None

    def reset(self, ladder: list[dict[str, KnobValue]], model: LadderModel, setting: Mapping[str, KnobValue],
              budget_w: float, t: float) -> None:
        """Start afresh on ``ladder`` at the rung of ``setting`` (device time ``t``; the law's first
        observation waits until the fast window holds only this rung's power)."""
        self.ladder = ladder
        self.model = model
        rung = self.rung_of(setting)
        self.state = GuardState(rung=rung, ceiling=max(rung, self.ceiling_for(budget_w)), changed_t=t)

    def rung_of(self, setting: Mapping[str, KnobValue]) -> int:
        """The rung nearest ``setting``: fewest knobs differing, the higher rung on a tie."""
        best, best_d = 0, math.inf
        for i, rung in enumerate(self.ladder):
            d = sum(0 if setting.get(k) == v else 1 for k, v in rung.items())
            if d < best_d or (d == best_d and i > best):
                best, best_d = i, d
        return best

    def ceiling_for(self, budget_w: float) -> int:
        """The anchor's rung while the budget is the reference or lower; the top when it was raised."""
        top = len(self.ladder) - 1
        return top if budget_w > self.reference_budget_w else self.rung_of(self.anchor)

    def budget_changed(self, budget_w: float) -> None:
        """A new budget: the highest rung the guard may climb to follows it."""
        if self.state is not None:
            self.state = replace(self.state, ceiling=self.ceiling_for(budget_w))

    def tick(self, obs: Observation) -> Decision:
        """One step of the law (:func:`~edgetune.runtime.guard.control`); the state moves on."""
        assert self.state is not None and self.model is not None, "reset() first"
        self.state, decision = control(self.state, obs, self.model, self.params)
        return decision
