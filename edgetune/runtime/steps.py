"""The run's step boundaries: what the :class:`~edgetune.runtime.controller.Tuner` does at each optimizer step,
each batch, epoch and batch-size change of the loop, and how it follows the online tuner's decisions there.

At each step (the optimizer's post-step hook) :meth:`StepHooks._on_step` has the device run it (real hardware:
wait for the GPU; the twin: advance its virtual clock by the modelled step, each micro-batch as run), marks it
in the accounting, and hands it to the online tuner, whose decision it applies (:meth:`StepHooks._follow`). The
loader and the framework adapters call the batch and epoch hooks; ``tuner.between_steps()`` the pause and resume.

:class:`StepHooks` is mixed into the :class:`~edgetune.runtime.controller.Tuner`, not a part of its own: the
loader, the optimizer's hooks and the adapters call these methods on the Tuner, and each step reads and moves
the whole run (the device, the accounting, the cost meter, the online tuner, the guard's batch state) under
the run's one lock, as the guard's ticks do (:mod:`edgetune.runtime.guard_drive`). Its class attributes name
the run's state it uses; the Tuner sets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgetune.power.base import is_out_of_memory
from edgetune.runtime.online import OnlineMove, RunState
from edgetune.workloads import CostMeter
from edgetune.workloads.cost import recompile_after_counting

if TYPE_CHECKING:
    import threading

    import torch

    from edgetune.power.base import Device, WorkloadCost
    from edgetune.power.knobs import Candidate
    from edgetune.power.monitor import PowerMonitor
    from edgetune.runtime.accounting import Accounting
    from edgetune.runtime.knob_state import KnobState
    from edgetune.runtime.ladder_guard import LadderGuard
    from edgetune.runtime.loader import BatchLoader
    from edgetune.runtime.online import OnlineDecision, OnlineTuner

__all__ = ["StepHooks"]

#: FLOP per MFLOP, for the event that reports the measured step cost
_FLOP_PER_MFLOP = 1e6


def _noop() -> None:
    return None


class StepHooks:
    """The step boundaries' part of the :class:`~edgetune.runtime.controller.Tuner` (a mixin: see the module
    docs).

    Besides the state below, it calls the Tuner's ``batch_size``, ``budget_w``, ``setting``, ``count_samples``,
    ``set_batch_size``, ``apply_setting``, ``_event``, ``_warn``, ``_refuse_after_block`` and
    ``_warn_unknown_scheduler``, and the guard drive's ``_build_guard``
    (:class:`~edgetune.runtime.guard_drive.GuardDrive`).
    """

    # the run's state the steps read and move (the Tuner's)
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    device: Device
    monitor: PowerMonitor
    accounting: Accounting
    loader: BatchLoader | None
    online: OnlineTuner | None
    cost: WorkloadCost | None
    lr_rule: str
    steps: int
    epoch: int
    _lock: threading.RLock
    _entered: bool
    _virtual: bool
    _knob_state: KnobState
    _guard: LadderGuard
    _cost_meter: CostMeter | None
    _first_batch_bytes: float
    #: samples of each batch of the step in progress (``count_samples``)
    _step_batches: list[int]
    _processes_measured: int

    # -- the online tuner's decisions -----------------------------------------------------------------------
    def _run_state(self) -> RunState:
        return RunState(self.device.clock.now(), self.batch_size, self.budget_w, dict(self.setting))

    def _note(self, decision: OnlineDecision) -> None:
        for text in decision.notes:
            self._event(text)
        for text in decision.warnings:  # a warning, not an info event: a script without logging set up shows it
            self._warn(text)

    def _follow(self, decision: OnlineDecision) -> None:
        """Apply the online tuner's decision: record its notes, move to its candidate."""
        self._note(decision)
        if decision.kind is OnlineMove.SETTLE and self.loader is not None and self.online is not None \
                and self.online.b_noise is not None:
            self.loader.b_noise = self.online.b_noise  # the adascale rule needs it from now on
        if decision.kind is OnlineMove.MOVE:
            self._move_to(decision.candidate, "online tuning: next candidate")
        elif decision.kind is OnlineMove.SETTLE:
            self._move_to(decision.candidate, "online tuning: settled")

    def _move_to(self, candidate: Candidate | None, why: str) -> None:
        assert candidate is not None, "a MOVE or SETTLE decision names its candidate"
        if candidate.batch_size != self.batch_size:
            self.set_batch_size(candidate.batch_size, at="step")
        self.apply_setting(candidate.knobs, f"{why}: batch size {candidate.batch_size}")

    # -- step boundaries ----------------------------------------------------------------------------------
    def _steps_pause(self) -> None:
        """The run leaves training now (``tuner.between_steps()``): the online tuner's window pauses."""
        with self._lock:
            if self._entered and self.online is not None:
                self.online.pause(self.device.clock.now())

    def _steps_resume(self) -> None:
        """Training steps resume now: the time since the last step's end was no step (``between_steps()``).
        The online tuner's window goes on, and before the first step the cost meter starts over (what it
        counted was the evaluation)."""
        with self._lock:
            if not self._entered:
                return
            t = self.device.clock.now()
            self.accounting.mark_gap(t)
            if self.online is not None:
                self.online.resume(t)
            if self._cost_meter is not None and self._cost_meter.active and self.model is not None:
                self._cost_meter.close()
                self._cost_meter = CostMeter(self.model).start()
                self._first_batch_bytes = 0.0

    def _on_step(self) -> None:
        b = self.batch_size
        batches, self._step_batches = self._step_batches or [b], []
        samples = sum(batches)
        if self._cost_meter is not None and self._cost_meter.active:
            self.cost = self._cost_meter.finish(samples, self.optimizer, self._first_batch_bytes or 0.0,
                                                pass_batch_size=max(batches))
            self._cost_meter = None
            if self.model is not None:
                recompile_after_counting(self.model)
            self._event(f"step cost measured from the first step: {self.cost.flops_per_sample / _FLOP_PER_MFLOP:.1f} "
                        f"MFLOP per sample")
        try:
            if self._virtual:  # the twin times each batch of the step (micro-batches under accumulation) as run
                for n in batches:
                    self.device.run_step(_noop, n, self.cost)
            else:  # real hardware ran them: wait for the GPU
                self.device.run_step(_noop, samples, self.cost)
        except Exception as exc:
            # the twin says a candidate's batch does not fit: exploration records it and moves on
            if not (is_out_of_memory(exc) and self.online is not None and self.online.exploring):
                raise
            with self._lock:  # as after a step: the guard's thread may move the online tuner too
                self._follow(self.online.on_out_of_memory(self._run_state()))
            return
        t = self.device.clock.now()
        self.steps += 1
        self.accounting.mark_step(t, b, self._knob_state.label(), self.epoch, samples * self._processes_measured)
        if self.online is not None:
            with self._lock:  # the guard's thread may move the online tuner too (real clock)
                self._follow(self.online.after_step(RunState(t, self.batch_size, self.budget_w, dict(self.setting))))

    def _on_epoch_start(self, epoch: int) -> None:
        self._refuse_after_block("loader")  # its batches would train unmeasured, the knobs restored
        if epoch > 0:
            with self._lock:  # if the loop left the last epoch early (a break), close it now
                self.monitor.sample()
                self.accounting.update()
                self.accounting.end_epoch(self.epoch)
        self.epoch = epoch

    def _on_epoch_end(self, epoch: int) -> None:
        with self._lock:
            self.monitor.sample()  # a sample at the last step's end, so the accounting closes it
            self.accounting.update()
            self.accounting.end_epoch(epoch)

    def _on_resize(self, old: int, new: int, rates: list[float]) -> None:
        lr = f"; learning rate {rates[0]:.4g} ({self.lr_rule})" if rates else ""
        with self._lock:
            own = self._guard.batch_arrived(new)  # the guard's own move, or the run's new choice
            self._event(f"batch size {old} -> {new}{' (guard)' if own else ''}{lr}")
            if rates:
                self._warn_unknown_scheduler()
            if self._guard.ladder:
                self._build_guard()  # power depends on the batch size: start the ladder's observations afresh

    def _on_loader_batch(self, batch: Any, samples: int) -> None:
        """A batch of ``tuner.loader`` and the samples it holds (fewer at an epoch's end): its step's, its bytes."""
        self.count_samples(samples)
        self._on_batch(batch)

    def _on_batch(self, batch: Any) -> None:
        """A batch of the first step (the loader's first; each micro-batch of a framework's first optimizer step,
        from the adapters): its bytes are the step's input, not activations."""
        if self._cost_meter is not None and self._cost_meter.active:
            self._first_batch_bytes += self._cost_meter.exclude(batch)
