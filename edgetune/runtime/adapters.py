"""Thin adapters: the same controller as ``with edgetune.tune(...)`` inside PyTorch Lightning and the
Hugging Face ``Trainer``.

Both frameworks own the training loop and its data loader, so the adapters apply the plan's knobs (and its
batch size, where the framework reads it from an attribute before building the loader), keep the budget
with the guard, mark steps through the same optimizer hook and account energy per step and epoch. Where
the batch size cannot be set from here (the Hugging Face ``Trainer`` fixes it when it is built), the run's
own batch size is accounted and a difference from the plan's is a warning naming the argument that sets it. Online
tuning needs the loader (it changes the batch size mid-run), so it is not offered here: run
``edgetune search`` first and pass its ``best.json``.

The frameworks are optional extras (``pip install edgetune[lightning]``, ``edgetune[hf]``) and are imported
only when an adapter is built: importing this module costs nothing.

Lightning::

    from edgetune.runtime.adapters import LightningCallback
    trainer = pl.Trainer(callbacks=[LightningCallback(budget_w=10, device="sim:orin-nano", plan="best.json")])
    trainer.fit(model, datamodule)            # the datamodule's batch_size is set to the plan's at fit start

The plan's batch size is set, before the loaders are built, wherever Lightning's own batch-size finder sets
it: a ``batch_size`` attribute or hyperparameter (``save_hyperparameters()``) of the module or the datamodule.
Where there is none (a loader given to ``fit`` is built already), or the loader was built at another batch size,
a warning says so and how to give one; the loader's batch size trains and is accounted.

A step is an optimizer step in both: with gradient accumulation (``accumulate_grad_batches``,
``gradient_accumulation_steps``) it takes that many batches; where that differs from the plan's batch size,
the events say so. Each step is accounted at the samples it trained on (Lightning: the batches it was given;
Hugging Face: the model's training forward passes), so an epoch's smaller last batch and an accumulation cut
short at an epoch's end count what they hold. The batch size in force is read from the loader the framework
built (Lightning's ``trainer.train_dataloader``, the Trainer's ``train_batch_size``). Validation and
evaluation are no training steps: their time and energy are left out of the steps (and of the time and energy
to the target), while the budget still holds them.

A run resumed from a checkpoint (``ckpt_path``, ``resume_from_checkpoint``), or a second ``fit`` of one Trainer,
is tuned and accounted from the step it starts at, but not recorded in ``runs_file``: its steps to the target did
not start at zero. The
framework's learning-rate schedulers are given to the tuner (``tune(schedulers=...)``), so every scaling of the
rate (``lr_batch_size``, the guard's batch moves) scales their ``base_lrs`` too, or they would undo it. Only
the first optimizer's rate is scaled, the one whose steps mark the training steps; another optimizer's (a GAN's
discriminator) and its schedulers are left as they are.

In several processes on one machine (DDP, ``torchrun``), only the first process of the machine (local rank 0)
tunes a board: it has one set of knobs. Where its sensor measures the whole machine (a Jetson's rails, RAPL),
each step counts every process's samples (each trains the same batch, as DDP does), and the events say so.
With ``device="nvml"``, or ``auto`` picking an NVIDIA GPU, every process tunes the GPU its model trains on,
each held to the budget; local rank 0 alone records the run in ``runs_file``, and a ``log=`` file gets each
other rank's number in its name (``steps.rank1.csv``). A GPU named by number (``nvml:0``) is local rank 0's
alone: the other processes' GPUs are neither tuned nor held to the budget, and a warning says so. The rules
are ``tune()``'s own (:mod:`edgetune.runtime.processes`); the callbacks give it the framework's count and rank.

Hugging Face::

    from edgetune.runtime.adapters import HFTrainerCallback
    plan = edgetune.runtime.load_plan("best.json")
    args = TrainingArguments(..., per_device_train_batch_size=plan.batch_size)  # the Trainer fixes it at init
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[HFTrainerCallback(budget_w=10, plan=plan)])
    trainer.train()

A training target (``target=edgetune.Target("val_acc", 0.9)``, with ``runs_file=`` to record the run for
``edgetune search --steps-to-target``) is read from the framework's own validation metrics: Lightning's
``trainer.callback_metrics`` after each validation (what ``self.log`` logged), the Hugging Face Trainer's
evaluation metrics (``accuracy`` is found as ``eval_accuracy`` too; with several eval datasets the Trainer
names each set's ``eval_<set>_accuracy``: give that name, and the other sets' evaluations are passed over).
Once it is reached the callback stops
training (``trainer.should_stop``, ``control.should_training_stop``).

The Hugging Face ``Trainer`` has no hook for an exception inside ``train()``; the callback restores the
knobs at the end of training and, failing that, when the interpreter exits. Wrap ``trainer.train()`` in
``with callback:`` to restore on an exception at once.
"""

from __future__ import annotations

from typing import Any

from edgetune.runtime._adapter import batch_samples

__all__ = ["HFTrainerCallback", "LightningCallback", "batch_samples"]


def LightningCallback(**kwargs: Any):  # the framework is imported only here
    """A ``pytorch_lightning.Callback`` running the edgetune controller (arguments as :func:`edgetune.tune`)."""
    from edgetune.runtime._lightning import LightningTunerCallback

    return LightningTunerCallback(**kwargs)


def HFTrainerCallback(**kwargs: Any):  # the framework is imported only here
    """A ``transformers.TrainerCallback`` running the edgetune controller (arguments as :func:`edgetune.tune`)."""
    from edgetune.runtime._hf import HFTunerCallback

    return HFTunerCallback(**kwargs)
