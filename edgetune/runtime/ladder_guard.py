"""The budget guard on one run: its ladder, the ladder's power model and the control law's state.

:mod:`edgetune.runtime.guard` and :mod:`edgetune.runtime.batch_law` hold the laws as pure functions;
:class:`LadderGuard` keeps what they need between ticks (the ladder around the chosen setting, the prior
power model, the :class:`GuardState`, and the :class:`~edgetune.runtime.batch_law.BatchState`, which
outlives the ladder's resets) and answers each tick with a :class:`~edgetune.runtime.guard.Decision`. It
never writes a knob nor changes the batch size: the controller applies the decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from edgetune.power.base import KnobValue
from edgetune.runtime.batch_law import BatchState, batch_in_force, control_batch
from edgetune.runtime.guard import Decision, GuardMove, GuardParams, GuardState, LadderModel, Observation

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
        batch: the batch-size law's state (None before :meth:`batch_arrived`).
        allow_batch: whether the guard may change the batch size now (the controller says: only when the
            batches come from its loader, and not while online tuning explores).
    """

    def __init__(self, params: GuardParams, reference_budget_w: float) -> None:
        self.params = params
        self.reference_budget_w = reference_budget_w
        self.ladder: list[dict[str, KnobValue]] = []
        self.model: LadderModel | None = None
        self.state: GuardState | None = None
        self.anchor: dict[str, KnobValue] = {}
        self.batch: BatchState | None = None
        self.allow_batch = False

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

    def batch_arrived(self, batch_size: int) -> bool:
        """The batch size ``batch_size`` is in force now; True when it is the guard's own pending change
        (else it is the run's new choice: the guard never grows above it)."""
        own = self.batch is not None and self.batch.pending == batch_size
        self.batch = batch_in_force(self.batch, batch_size)
        return own

    def blind(self, t: float, silent_s: float) -> Decision:
        """The sensor has given no reading for ``silent_s`` (device time ``t``): the lowest rung, held until it
        reads again (the law then resumes there, after its dwell, as after any move)."""
        assert self.state is not None, "reset() first"
        self.state = replace(self.state, rung=0, changed_t=t, climb_from=None, learn_base=True)
        return Decision(0, GuardMove.BLIND, f"blind: no power reading for {silent_s:.1f} s: the lowest setting "
                                            f"until the sensor reads again")

    def tick(self, obs: Observation) -> Decision:
        """One step of the laws (:func:`~edgetune.runtime.batch_law.control_batch` around
        :func:`~edgetune.runtime.guard.control`); the states move on."""
        assert self.state is not None and self.model is not None, "reset() first"
        if self.batch is None:
            self.batch = BatchState(batch_size=0, chosen=0)  # no batch size known: the ladder only
        allow = self.allow_batch and self.params.batch_max_shrink > 1 and self.batch.chosen > 1
        self.state, self.batch, decision = control_batch(self.state, self.batch, obs, self.model, self.params,
                                                         allow=allow)
        return decision
