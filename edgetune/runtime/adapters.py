"""Thin adapters: the same controller as ``with edgetune.tune(...)`` inside PyTorch Lightning and the
Hugging Face ``Trainer``.

Both frameworks own the training loop and its data loader, so the adapters apply the plan's knobs (and its
batch size, where the framework reads it from an attribute before building the loader), keep the budget
with the guard, mark steps through the same optimizer hook and account energy per step and epoch. Where
the batch size cannot be set from here (the Hugging Face ``Trainer`` fixes it when it is built), the run's
own batch size is accounted and a difference from the plan's is reported among the events. Online
tuning needs the loader (it changes the batch size mid-run), so it is not offered here: run
``edgetune search`` first and pass its ``best.json``.

The frameworks are optional extras (``pip install edgetune[lightning]``, ``edgetune[hf]``) and are imported
only when an adapter is built: importing this module costs nothing.

Lightning::

    from edgetune.runtime.adapters import LightningCallback
    trainer = pl.Trainer(callbacks=[LightningCallback(budget_w=10, device="sim:orin-nano", plan="best.json")])
    trainer.fit(model, datamodule)            # the datamodule's batch_size is set to the plan's at fit start

A step is an optimizer step in both: with gradient accumulation (``accumulate_grad_batches``,
``gradient_accumulation_steps``) it takes that many batches, and the samples per step are accounted so; where
that differs from the plan's batch size, the events say so.

Hugging Face::

    from edgetune.runtime.adapters import HFTrainerCallback
    plan = edgetune.runtime.load_plan("best.json")
    args = TrainingArguments(..., per_device_train_batch_size=plan.batch_size)  # the Trainer fixes it at init
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[HFTrainerCallback(budget_w=10, plan=plan)])
    trainer.train()

A training target (``target=edgetune.Target("val_acc", 0.9)``, with ``runs_file=`` to record the run for
``edgetune search --steps-to-target``) is read from the framework's own validation metrics: Lightning's
``trainer.callback_metrics`` after each validation (what ``self.log`` logged), the Hugging Face Trainer's
evaluation metrics (``accuracy`` is found as ``eval_accuracy`` too). Once it is reached the callback stops
training (``trainer.should_stop``, ``control.should_training_stop``).

The Hugging Face ``Trainer`` has no hook for an exception inside ``train()``; the callback restores the
knobs at the end of training and, failing that, when the interpreter exits. Wrap ``trainer.train()`` in
``with callback:`` to restore on an exception at once.
"""

from __future__ import annotations

import atexit
import types
from collections.abc import Mapping
from typing import Any

import torch

from edgetune.log import get_logger
from edgetune.runtime.api import tune
from edgetune.runtime.controller import Tuner
from edgetune.runtime.plan import load_plan

__all__ = ["HFTrainerCallback", "LightningCallback"]

_log = get_logger(__name__)


def _innermost(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under framework wrappers (accelerate's AcceleratedOptimizer, Lightning's)."""
    seen = 0
    while not type(optimizer).__module__.startswith("torch.optim") and hasattr(optimizer, "optimizer") and seen < 5:
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer


class _Adapter:
    """What both adapters share: build the tuner once the framework has its model and optimizer."""

    def __init__(self, *, budget_w: float | None = None, device: Any = "auto", plan: Any = None,
                 **tune_options: Any) -> None:
        if tune_options.get("online"):
            raise ValueError("online tuning needs edgetune's loader; in a framework, pass a plan from `edgetune search`")
        self.budget_w = budget_w
        self.device = device
        self.plan = load_plan(plan) if plan is not None and not hasattr(plan, "batch_size") else plan
        self.options = tune_options
        self.tuner: Tuner | None = None
        self._summary = None
        self._atexit = False
        self._target_missing_noted = False

    def _start(self, model: torch.nn.Module, optimizer: Any, batch_size: int | None) -> None:
        self.tuner = tune(model, _innermost(optimizer), batch_size=batch_size, budget_w=self.budget_w,
                          device=self.device, plan=self.plan, online=False, **self.options)
        self.tuner.__enter__()
        if not self._atexit:
            atexit.register(self._stop)
            self._atexit = True

    def _report(self, metrics: Mapping[str, Any], prefix: str = "") -> bool:
        """Report the target's metric from the framework's validation metrics (``metric``, else ``prefix +
        metric``); True once the target is reached (the callback then stops training)."""
        target = self.options.get("target")
        if self.tuner is None or target is None:
            return False
        value = metrics.get(target.metric, metrics.get(prefix + target.metric))
        if value is None:
            if not self._target_missing_noted:
                self._target_missing_noted = True
                _log.warning("target metric %r is not among the validation metrics (%s): log it under that name",
                             target.metric, ", ".join(sorted(map(str, metrics))) or "none")
            return False
        return self.tuner.report(float(value.item() if hasattr(value, "item") else value))

    def _stop(self, exc: BaseException | None = None) -> None:
        tuner, self.tuner = self.tuner, None
        if tuner is not None:
            tuner.__exit__(type(exc) if exc is not None else None, exc, None)

    def __enter__(self) -> _Adapter:  # noqa: PYI034 - not subclassed by users
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> bool:
        self._stop(exc)
        return False

    @property
    def summary(self):
        """The run's :class:`~edgetune.runtime.accounting.RunSummary` once training ended."""
        return self._summary


def LightningCallback(**kwargs: Any):  # a class factory: Lightning is imported only here
    """A ``pytorch_lightning.Callback`` running the edgetune controller (arguments as :func:`edgetune.tune`)."""
    try:
        import pytorch_lightning as pl
    except ImportError:  # the unified package names it lightning.pytorch
        try:
            import lightning.pytorch as pl  # type: ignore[no-redef]
        except ImportError:
            raise ImportError("the Lightning adapter needs PyTorch Lightning: pip install edgetune[lightning]") from None

    class _LightningCallback(_Adapter, pl.Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            # before the loaders are built: the plan's batch size, where the user's code reads an attribute
            if stage == "fit" and self.plan is not None:
                for holder in (trainer.datamodule, pl_module):
                    if holder is not None and hasattr(holder, "batch_size"):
                        holder.batch_size = self.plan.batch_size

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            holder = trainer.datamodule if getattr(trainer.datamodule, "batch_size", None) else pl_module
            per_batch = getattr(holder, "batch_size", None) or (self.plan.batch_size if self.plan else None)
            # a step is an optimizer step: with gradient accumulation it takes that many batches
            accumulate = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
            self._start(pl_module, trainer.optimizers[0], per_batch * accumulate if per_batch else None)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self.tuner is not None:
                self.tuner.end_epoch()

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.sanity_checking and self._report(trainer.callback_metrics):
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            tuner = self.tuner
            self._stop()
            self._summary = tuner.summary if tuner is not None else None

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            tuner = self.tuner
            self._stop(exception)
            self._summary = tuner.summary if tuner is not None else None

    return _LightningCallback(**kwargs)


def HFTrainerCallback(**kwargs: Any):  # a class factory: transformers is imported only here
    """A ``transformers.TrainerCallback`` running the edgetune controller (arguments as :func:`edgetune.tune`)."""
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("the Hugging Face adapter needs transformers: pip install edgetune[hf]") from None

    class _HFTrainerCallback(_Adapter, TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                           **kw: Any) -> None:
            if optimizer is None:
                raise RuntimeError("the Trainer passed no optimizer to its callbacks; edgetune needs it to mark steps")
            # the batch the optimizer sees: per device x devices (x accumulation steps per optimizer step)
            per_step = (getattr(state, "train_batch_size", None) or args.per_device_train_batch_size) \
                * max(1, args.gradient_accumulation_steps)
            self._start(model, optimizer, per_step)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.tuner is not None:
                self.tuner.end_epoch()

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kw: Any) -> None:
            if self._report(metrics or {}, prefix="eval_"):
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            tuner = self.tuner
            self._stop()
            self._summary = tuner.summary if tuner is not None else None

    return _HFTrainerCallback(**kwargs)
