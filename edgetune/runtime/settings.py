"""The groups of settings a :class:`~edgetune.runtime.controller.Tuner` is built from.

:func:`edgetune.tune` takes them as flat keyword arguments (``lr_rule=``, ``guard=``, ``log=`` ...) and
builds these; code that builds a :class:`~edgetune.runtime.controller.Tuner` itself passes them whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from edgetune.power.knobs import check_batch_size
from edgetune.runtime.guard import GuardParams
from edgetune.runtime.target import Target

__all__ = ["RESIZE_AT", "RUNTIME_MONITOR_RATE_HZ", "GuardSettings", "LoaderSettings", "RecordSettings",
           "TargetSettings"]

#: Hz: the runtime's power sampling rate. The guard judges 1-s moving averages (50 samples each) and the
#: accounting integrates energy over many steps, so the search's 100 Hz (which resolves a trial window's
#: edges) buys nothing here. Measured on a 2-core x86 (experiments/results/runtime_guard.txt): the
#: controller's CPU per 50 ms step was 1.26% at 100 Hz and is about half of that at 50 Hz (issue 12: <= 1%).
RUNTIME_MONITOR_RATE_HZ = 50.0

#: when a batch-size change takes effect: at the next step, or at the start of the next epoch
RESIZE_AT = ("step", "epoch")


@dataclass(frozen=True)
class LoaderSettings:
    """How ``tuner.loader`` batches the dataset and how the learning rate follows batch-size changes.

    Attributes:
        lr_rule: learning-rate scaling rule when the batch size changes (a key of
            :data:`edgetune.predictors.LR_RULES`: ``linear``, ``sqrt``, ``none`` ...).
        lr_batch_size: the batch size the optimizer's learning rate was set for. When the run starts at another
            (the plan's, or online tuning's first), the rate is scaled to it by ``lr_rule`` first, as the
            search's steps to target assume; None: the rate is used as given at the starting batch size.
        resize_at: when batch-size changes take effect: ``step`` (next step) or ``epoch`` (next epoch).
        seed: seeds the loader's permutation (and the online tuner's hardware model).
        shuffle: a fresh permutation each epoch.
        drop_last: drop a last batch smaller than the batch size in force.
        options: passed to ``torch.utils.data.DataLoader`` (``num_workers``, ``collate_fn`` ...).
    """

    lr_rule: str = "linear"
    lr_batch_size: int | None = None
    resize_at: str = "step"
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from edgetune.predictors import LR_RULES

        if self.lr_rule not in LR_RULES:
            raise ValueError(f"unknown lr_rule {self.lr_rule!r}; use one of {', '.join(LR_RULES)}")
        if self.lr_batch_size is not None:
            check_batch_size(self.lr_batch_size, "lr_batch_size")
            if self.lr_rule == "adascale":
                raise ValueError("lr_batch_size= cannot be used with lr_rule='adascale': its gain needs B_noise, "
                                 "which the run measures only later; use 'linear' (SGD) or 'sqrt' (Adam)")
        if self.resize_at not in RESIZE_AT:
            raise ValueError(f"resize_at must be 'step' or 'epoch', got {self.resize_at!r}")


@dataclass(frozen=True)
class GuardSettings:
    """Whether the budget guard moves the knobs, and its control law's tuning.

    Attributes:
        enabled: False: the guard only reports (the accounting still records every violation).
        params: the control law's tuning.
    """

    enabled: bool = True
    params: GuardParams = field(default_factory=GuardParams)

    @classmethod
    def of(cls, guard: bool | GuardParams | None) -> GuardSettings:
        """From ``tune``'s ``guard=``: False switches the guard off; :class:`GuardParams` tunes it."""
        return cls(enabled=guard is not False, params=guard if isinstance(guard, GuardParams) else GuardParams())


@dataclass(frozen=True)
class RecordSettings:
    """What the run measures and records, and where its summary goes.

    Attributes:
        log: ``.csv`` or ``.jsonl`` file for one row per step (and per epoch in JSONL); None: no file.
        keep_trace: keep every power sample with its 1-s average in ``tuner.accounting`` (for plots).
        print_summary: write the summary table on exit: True to standard error, a stream to that stream,
            False not at all (``tuner.summary`` has it either way).
        monitor_rate_hz: power sampling rate (None: :data:`RUNTIME_MONITOR_RATE_HZ`, 50 Hz).
    """

    log: str | os.PathLike | None = None
    keep_trace: bool = False
    print_summary: bool | TextIO = True
    monitor_rate_hz: float | None = None


@dataclass(frozen=True)
class TargetSettings:
    """The validation target the run trains to, and where its steps to the target are recorded
    (:mod:`edgetune.runtime.target`).

    Attributes:
        target: the :class:`~edgetune.runtime.target.Target` (None: no target; ``tuner.report`` refuses).
        runs_file: a CSV the run appends its steps to the target to, one row per run, in the format
            ``edgetune search --steps-to-target`` reads (None: the summary alone reports them).
        workload: the workload name the row carries: the name ``edgetune search`` gives the workload (None: the
            plan's).
    """

    target: Target | None = None
    runs_file: str | os.PathLike | None = None
    workload: str | None = None

    def __post_init__(self) -> None:
        if self.target is not None and not isinstance(self.target, Target):
            raise ValueError(f"target must be an edgetune.Target(metric, value, higher_is_better), got "
                             f"{self.target!r}")
        if self.runs_file is not None and self.target is None:
            raise ValueError("runs_file= records the steps to a target: pass target=edgetune.Target(metric, value) "
                             "too, and call tuner.report(value) after each evaluation")
        if self.workload is not None and (not isinstance(self.workload, str) or not self.workload.strip()):
            raise ValueError(f"workload must be the workload's name (as edgetune search names it), got "
                             f"{self.workload!r}")
