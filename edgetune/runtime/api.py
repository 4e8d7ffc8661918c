"""``edgetune.tune(...)``: the one call that wraps a training loop, with every setting a keyword argument.

It groups its keyword arguments into the settings of :mod:`edgetune.runtime.settings` and
:class:`~edgetune.runtime.online.OnlineOptions` and builds the :class:`~edgetune.runtime.controller.Tuner`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, TextIO

import torch

from edgetune.power.base import Device, WorkloadCost
from edgetune.runtime.controller import Tuner
from edgetune.runtime.guard import GuardParams
from edgetune.runtime.online import OnlineOptions
from edgetune.runtime.plan import Plan
from edgetune.runtime.processes import LocalProcesses
from edgetune.runtime.settings import GuardSettings, LoaderSettings, RecordSettings, TargetSettings
from edgetune.runtime.target import Target

__all__ = ["tune"]


def tune(model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None, *,
         dataset: Any = None, batch_size: int | None = None, budget_w: float | None = None,
         device: str | Device = "auto", plan: str | os.PathLike | Plan | None = None,
         online: bool | Mapping[str, Any] | None = None, lr_rule: str = "linear",
         lr_batch_size: int | None = None, schedulers: Sequence[Any] = (), resize_at: str = "step",
         seed: int = 0, shuffle: bool = True, drop_last: bool = False, cost: WorkloadCost | None = None,
         log: str | os.PathLike | None = None, budget_file: str | os.PathLike | None = None,
         guard: bool | GuardParams = True, monitor_rate_hz: float | None = None,
         print_summary: bool | TextIO = True, keep_trace: bool = False,
         loader_options: Mapping[str, Any] | None = None,
         device_options: Mapping[str, Any] | None = None, target: Target | None = None,
         runs_file: str | os.PathLike | None = None, workload: str | None = None,
         processes: LocalProcesses | None = None) -> Tuner:
    """Wrap a PyTorch training loop: apply a tuned plan (or tune online), keep power under the budget.

    The keyword arguments are grouped into the :class:`Tuner`'s settings (:class:`LoaderSettings`,
    :class:`GuardSettings`, :class:`RecordSettings`, :class:`TargetSettings`,
    :class:`~edgetune.runtime.online.OnlineOptions`).

    Args:
        model: the model being trained (its first step's cost is measured for the twin).
        optimizer: its optimizer; each ``optimizer.step()`` marks a training step (a post-step hook) and
            the learning rate follows batch-size changes. Without one, call ``tuner.step()`` per step.
        dataset: a map-style dataset; ``tuner.loader`` then yields its batches at the batch size in force.
        batch_size: the batch size to start from (default: the plan's; online tuning explores around it).
        budget_w: the power budget in watts, judged on the 1-s moving average of board power (default:
            the plan's ``budget_w``).
        device: a device spec (``auto``, ``sim:orin-nano``, ``jetson``, ``nvml:0`` ...) or an open Device.
        plan: ``best.json`` of ``edgetune search`` (or a :class:`Plan`): its batch size and knob setting.
        online: tune online (default: when there is no plan). ``True``, or the fields of
            :class:`~edgetune.runtime.online.OnlineOptions` as a mapping (``batch_sizes``,
            ``steps_per_candidate``, ``warmup_steps``, ``max_candidates``, ``b_noise``, ``margin``).
        lr_rule: learning-rate scaling rule when the batch size changes (``linear``, ``sqrt``, ``none``).
        lr_batch_size: the batch size the optimizer's learning rate was set for: a run starting at another
            batch size (the plan's) scales the rate to it by ``lr_rule`` first. Default: the rate is used as
            given at the starting batch size.
        schedulers: the optimizer's learning-rate schedulers (``torch.optim.lr_scheduler``). Whenever edgetune
            scales the learning rate (``lr_batch_size``, a batch-size change), it scales their base rates too;
            a scheduler not given computes its next rate from the old ones and undoes the scaling (one
            created inside the ``with`` block: ``tuner.add_scheduler(s)``).
        resize_at: when batch-size changes take effect: ``step`` (next step) or ``epoch`` (next epoch).
        seed, shuffle, drop_last: the loader's sampling.
        cost: the step's cost for the twin, instead of measuring it from the first step.
        log: ``.csv`` or ``.jsonl`` file for one row per step (and per epoch in JSONL).
        budget_file: a file holding the budget in watts (``7.5``); re-read when it changes and on SIGUSR1.
        guard: False to only report; or :class:`~edgetune.runtime.guard.GuardParams`.
        monitor_rate_hz: power sampling rate (default 50 Hz: the guard judges 1-s averages).
        print_summary: write the summary table on exit (True: to standard error; or to the given stream).
        keep_trace: keep every power sample with its 1-s average in ``tuner.accounting`` (for plots).
        loader_options: passed to ``torch.utils.data.DataLoader`` (``num_workers``, ``collate_fn`` ...).
        device_options: passed to ``open_device`` (``seed`` of the twin ...).
        target: the validation target the run trains to (``edgetune.Target("accuracy", 0.9)``); call
            ``tuner.report(value)`` after each evaluation (it returns True once the target is reached). The
            summary then gives the steps to the target (interpolated between evaluations) with the device time
            and energy of the training steps up to it.
        runs_file: a CSV to append the run's steps to the target to (one row per run; a run that ends without
            reaching the target is recorded as one that missed it; none for a run cut short by an exception
            or Ctrl-C, or whose batch size changed). Runs at a few batch sizes make the table that
            ``edgetune search --steps-to-target runs.csv`` ranks batch sizes by, instead of the noise-scale law.
        workload: the workload name the row carries (as ``edgetune search`` names it; default: the plan's).
        processes: the training processes on this machine and this one's local rank
            (:class:`~edgetune.runtime.processes.LocalProcesses`; default: ``torchrun``'s ``LOCAL_WORLD_SIZE``
            and ``LOCAL_RANK``). On a board whose sensor measures every process (a Jetson, RAPL) local rank 0
            tunes and each step counts every process's samples; a tuner in another local rank is refused.
            With ``device="nvml"`` or ``auto`` every process tunes the GPU it trains on. Local rank 0 alone
            records the run in ``runs_file``; another rank's ``log`` gets its rank in its name.

    Example, on the simulated Orin Nano (a real CPU training run; the twin supplies time and power):

    >>> import torch, edgetune
    >>> from torch.utils.data import TensorDataset
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    >>> with edgetune.tune(model, optimizer, dataset=data, batch_size=32, budget_w=7, online=False,
    ...                    device="sim:orin-nano", print_summary=False) as tuner:
    ...     for epoch in range(2):
    ...         for x, y in tuner.loader:
    ...             loss = torch.nn.functional.cross_entropy(model(x), y)
    ...             optimizer.zero_grad()
    ...             loss.backward()
    ...             optimizer.step()
    >>> tuner.summary.steps, len(tuner.summary.epochs), tuner.summary.knobs_restored
    (32, 2, True)
    >>> tuner.summary.max_avg_w <= 7.0 or tuner.summary.time_over_s < 2.0
    True
    """
    if isinstance(online, Mapping):
        known = [f.name for f in dataclasses.fields(OnlineOptions)]
        unknown = sorted(str(k) for k in online if k not in known)
        if unknown:
            raise ValueError(f"online= has no option {', '.join(map(repr, unknown))}; its options: {', '.join(known)}")
        online = OnlineOptions(**online)  # {}: online tuning with every option at its default
    if processes is not None and not isinstance(processes, LocalProcesses):
        raise TypeError(f"processes= takes a LocalProcesses(count, rank) (None: torchrun's), got {processes!r}")
    if not isinstance(guard, (bool, GuardParams)):
        raise TypeError(f"guard= takes True, False or a GuardParams, got {guard!r}")
    if monitor_rate_hz is not None and (isinstance(monitor_rate_hz, bool) or not isinstance(monitor_rate_hz, Real)
                                        or not 0 < monitor_rate_hz < math.inf):
        raise ValueError(f"monitor_rate_hz must be a positive number of samples per second (None: the default, "
                         f"50), got {monitor_rate_hz!r}")
    return Tuner(model, optimizer, dataset=dataset, device=device, device_options=device_options, plan=plan,
                 schedulers=schedulers or (),
                 batch_size=batch_size, budget_w=budget_w, budget_file=budget_file, online=online, cost=cost,
                 loader=LoaderSettings(lr_rule=lr_rule, lr_batch_size=lr_batch_size, resize_at=resize_at, seed=seed,
                                       shuffle=shuffle, drop_last=drop_last, options=dict(loader_options or {})),
                 guard=GuardSettings.of(guard),
                 record=RecordSettings(log=log, keep_trace=keep_trace, print_summary=print_summary,
                                       monitor_rate_hz=monitor_rate_hz),
                 target=TargetSettings(target=target, runs_file=runs_file, workload=workload), processes=processes)
