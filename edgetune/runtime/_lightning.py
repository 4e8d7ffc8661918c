"""The PyTorch Lightning callback that :func:`edgetune.runtime.adapters.LightningCallback` builds.

A module of its own, imported only when an adapter is built, so that the class has a name to be imported by:
spawned processes (``strategy="ddp_spawn"``) unpickle the callback by it.
"""

from __future__ import annotations

from typing import Any

try:
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import GradientAccumulationScheduler
    from pytorch_lightning.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
except ImportError:  # the unified package names it lightning.pytorch
    try:
        import lightning.pytorch as pl  # type: ignore[no-redef]
        from lightning.pytorch.callbacks import GradientAccumulationScheduler  # type: ignore[no-redef]
        from lightning.pytorch.utilities.parsing import (  # type: ignore[no-redef]
            lightning_getattr,
            lightning_hasattr,
            lightning_setattr,
        )
    except ImportError:
        raise ImportError("the Lightning adapter needs PyTorch Lightning: pip install edgetune[lightning]") from None

from torch.utils.data import DataLoader

from edgetune.runtime._adapter import _Adapter

__all__ = ["LightningTunerCallback"]


def _loader_batch_size(loader: Any) -> int | None:
    """The batch size of the loader Lightning built for training; None for several loaders or none."""
    if not isinstance(loader, DataLoader):
        return None
    return loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)


def _accumulation(trainer: Any) -> int:
    """Batches per optimizer step in the epoch starting or running. A ``GradientAccumulationScheduler`` changes
    it in its own ``on_train_epoch_start``, which may run after this callback's: its schedule is read for the
    epoch, not the value it left from the epoch before."""
    scheduler = next((c for c in trainer.callbacks if isinstance(c, GradientAccumulationScheduler)), None)
    if scheduler is not None:
        return max(1, int(scheduler.get_accumulate_grad_batches(trainer.current_epoch)))
    return max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))


class LightningTunerCallback(_Adapter, pl.Callback):
    """A ``Callback`` running the edgetune controller in ``Trainer.fit`` (see :mod:`edgetune.runtime.adapters`)."""

    #: the plan's batch size was set on the module's or datamodule's ``batch_size`` at this fit's setup
    _plan_batch_set = False

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before the loaders are built: the plan's batch size, where the user's code reads it from an attribute
        # or a hyperparameter (``save_hyperparameters``) of the module or the datamodule, as Lightning's own
        # batch-size finder sets it
        self._plan_batch_set = False
        if stage == "fit" and self.plan is not None and lightning_hasattr(pl_module, "batch_size"):
            lightning_setattr(pl_module, "batch_size", self.plan.batch_size)
            self._plan_batch_set = True

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        rank = trainer.local_rank
        if rank != 0 and not self._tunes_own_gpu(pl_module):  # one tuner per board: the machine's first process
            self._follow_only()
            return
        named = lightning_getattr(pl_module, "batch_size") if lightning_hasattr(pl_module, "batch_size") else None
        per_batch = (_loader_batch_size(trainer.train_dataloader) or named
                     or (self.plan.batch_size if self.plan else None))
        self._per_batch = per_batch
        # a step is an optimizer step: with gradient accumulation it takes that many batches
        self._start(pl_module, trainer.optimizers[0], per_batch * _accumulation(trainer) if per_batch else None,
                    schedulers=[config.scheduler for config in trainer.lr_scheduler_configs],
                    resumed_at=trainer.global_step, processes=trainer.num_devices, local_rank=rank)
        if self.plan is not None and per_batch != self.plan.batch_size:
            fix = ("edgetune set the batch_size attribute to it, but the training loader was built at another: "
                   "build it from that attribute" if self._plan_batch_set else
                   "neither the LightningModule nor its DataModule has a batch_size attribute or hyperparameter for "
                   "edgetune to set before the loaders are built; give one that train_dataloader() reads "
                   "(self.batch_size, or save_hyperparameters() with a batch_size argument)")
            self.tuner._warn(  # type: ignore[union-attr]
                f"the plan's batch size {self.plan.batch_size} is not applied, the loader's {per_batch} trains: {fix}")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        per_batch = getattr(self, "_per_batch", None)
        if self.tuner is not None and per_batch and per_batch * _accumulation(trainer) != self.tuner.batch_size:
            # the framework's accumulation changed (GradientAccumulationScheduler): the batch per step with it
            self.tuner.set_batch_size(per_batch * _accumulation(trainer), scale_lr=False)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._count(batch)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tuner is not None:
            self.tuner.end_epoch()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        reached = self._evaluated(trainer.callback_metrics, step=trainer.global_step)
        if self.options.get("target") is not None and trainer.world_size > 1:
            # every process stops when any reached it (metrics not synced across them may differ), as
            # Lightning's EarlyStopping decides: a process left training alone would wait for the others forever
            reached = trainer.strategy.reduce_boolean_decision(reached, all=False)
        if reached:
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop(exception)
