"""The Hugging Face ``TrainerCallback`` that :func:`edgetune.runtime.adapters.HFTrainerCallback` builds.

A module of its own, imported only when an adapter is built, so that the class has a name to be imported by.
"""

from __future__ import annotations

from typing import Any

try:
    from transformers import TrainerCallback
except ImportError:
    raise ImportError("the Hugging Face adapter needs transformers: pip install edgetune[hf]") from None

from edgetune.runtime._adapter import _Adapter
from edgetune.runtime.processes import LocalProcesses

__all__ = ["HFTunerCallback"]


class HFTunerCallback(_Adapter, TrainerCallback):
    """A ``TrainerCallback`` running the edgetune controller in ``Trainer.train`` (see
    :mod:`edgetune.runtime.adapters`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._waiting: tuple[Any, Any, Any] | None = None
        self._hook: Any = None
        self._local_rank = 0
        self._cut: tuple[int, int] | None = None  # (the batch auto_find_batch_size cut to, the arguments')

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kw: Any) -> None:
        if optimizer is None:
            raise RuntimeError("the Trainer passed no optimizer to its callbacks; edgetune needs it to mark steps")
        self._stop()  # a tuner left open by a train() that ended on an exception (the Trainer has no hook for it)
        # the tuner opens at the first step, so an evaluation the Trainer runs first (eval_on_start) is no step
        if state.is_local_process_zero or self._tunes_own_gpu(model):
            self._waiting = (model, optimizer, lr_scheduler)
            self._local_rank = args.local_process_index
        else:  # one tuner per board; the Trainer's evaluation metrics are the same in every process
            self._waiting = None
            self._follow_only()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._waiting is None:
            return
        model, optimizer, scheduler = self._waiting
        self._waiting = None
        # the batch the optimizer sees: per device x devices (x accumulation steps per optimizer step); the
        # arguments', not the state's, which a checkpoint resumed from replaces; but auto_find_batch_size cuts it
        # after each out-of-memory error and starts again (on_train_begin again), keeping it in the state only
        batch = args.train_batch_size
        shrunk = bool(getattr(args, "auto_find_batch_size", False)) and bool(getattr(state, "train_batch_size", None))
        if shrunk:
            batch = int(state.train_batch_size)
        per_step = batch * max(1, args.gradient_accumulation_steps)
        self._start(model, optimizer, per_step, schedulers=[scheduler] if scheduler is not None else [],
                    resumed_at=state.global_step, processes=LocalProcesses.from_env().count, local_rank=self._local_rank)
        if self.plan is not None and self.tuner is not None:
            if shrunk and batch < args.train_batch_size:
                self._cut = (batch, args.train_batch_size)  # said once a step ran at it: each cut starts again
            elif batch != self.plan.batch_size:
                # the Trainer built its loader when it was built: too late to set from here, so say how
                self.tuner._warn(f"the plan's batch size {self.plan.batch_size} is not applied, the Trainer's "
                                 f"{args.train_batch_size} per batch trains (fixed when it was built): give "
                                 f"TrainingArguments(per_device_train_batch_size=plan.batch_size), "
                                 f"plan = edgetune.runtime.load_plan(...)")
        if model is not None:  # each training forward pass is a micro-batch: its samples are the step's
            self._hook = model.register_forward_pre_hook(self._forward, with_kwargs=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        cut, self._cut = self._cut, None
        if cut is not None and self.plan is not None and self.tuner is not None:
            self.tuner._warn(f"auto_find_batch_size cut the batch size to {cut[0]} after running out of memory at "
                             f"{cut[1]} (the plan's {self.plan.batch_size}): the plan does not fit this run's "
                             f"memory; search again with the model as it trains here, or with --batch-sizes at "
                             f"most {cut[0]}")

    def _forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if module.training:
            self._count([*args, *kwargs.values()])

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.tuner is not None:
            self.tuner.end_epoch()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any) -> None:
        if self._evaluated(metrics or {}, prefix="eval_", step=state.global_step):
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._waiting = None
        self._stop()

    def _stop(self, exc: BaseException | None = None) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        super()._stop(exc)
