"""``tune()``'s arguments checked at the boundary, before anything opens: each problem is one ``ValueError``
line (a plan file: :class:`~edgetune.runtime.plan.PlanError`; the runs file: the target's own errors).

:func:`check_arguments` resolves what the arguments leave open (the plan's budget and batch size, online tuning
where no plan is given, the default settings) and returns them as :class:`RunArguments`, from which the
:class:`~edgetune.runtime.controller.Tuner` is built.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgetune.power.knobs import check_batch_size
from edgetune.runtime.budget import check_watts
from edgetune.runtime.online import OnlineOptions
from edgetune.runtime.plan import Plan, load_plan
from edgetune.runtime.processes import LocalProcesses
from edgetune.runtime.settings import GuardSettings, LoaderSettings, RecordSettings, TargetSettings
from edgetune.runtime.target import runs_workload

if TYPE_CHECKING:
    import torch

__all__ = ["RunArguments", "check_arguments"]


@dataclass(frozen=True)
class RunArguments:
    """``tune()``'s arguments, checked and resolved.

    Attributes:
        plan: the plan (loaded from its file), or None.
        budget_w: the starting budget (W): the one given, else the plan's.
        batch_size: the batch size asked for (given, else the plan's); None: online tuning's or the default.
        online: online tuning's options; None without online tuning.
        target: the training target's settings.
        runs_workload: the workload name the runs file records (:func:`~edgetune.runtime.target.runs_workload`).
        loader, record, guard: the groups of settings, defaults filled in.
        processes: the training processes on this machine and this one's local rank (given, else torchrun's):
            another rank than 0 records no run (``target.runs_file`` dropped) and its ``record.log`` has its
            rank in its name (:meth:`~edgetune.runtime.processes.LocalProcesses.own_path`).
    """

    plan: Plan | None
    budget_w: float
    batch_size: int | None
    online: OnlineOptions | None
    target: TargetSettings
    runs_workload: str | None
    loader: LoaderSettings
    record: RecordSettings
    guard: GuardSettings
    processes: LocalProcesses


def check_arguments(optimizer: torch.optim.Optimizer | None, *, dataset: Any, plan: str | os.PathLike | Plan | None,
                    batch_size: int | None, budget_w: float | None, online: bool | OnlineOptions | None,
                    loader: LoaderSettings | None, guard: GuardSettings | None, record: RecordSettings | None,
                    target: TargetSettings | None, processes: LocalProcesses | None = None) -> RunArguments:
    """Check ``tune()``'s arguments, in this order: the plan, the budget, the batch size, what online tuning
    needs, the local processes, the runs file, the log file (never overwritten)."""
    plan = plan if isinstance(plan, Plan) else (load_plan(plan) if plan is not None else None)
    if budget_w is None and plan is not None:
        budget_w = plan.budget_w
    try:  # the rule set_budget and the budget file follow: a string, inf, nan are refused in one line
        budget_w = check_watts(budget_w)
    except ValueError:
        raise ValueError(f"budget_w must be a positive number of watts (or come from the plan), "
                         f"got {budget_w!r}") from None
    if batch_size is None:
        batch_size = plan.batch_size if plan is not None else None
    if batch_size is not None:
        batch_size = check_batch_size(batch_size, "batch_size")
    if online is None:
        online = plan is None
    if online and optimizer is None:
        raise ValueError("online tuning needs the optimizer (it reads the real gradients at each step); "
                         "pass it, or pass a plan")
    if online and batch_size is None and dataset is None:
        raise ValueError("give batch_size or a dataset: online tuning changes the batch size through tuner.loader")
    options = (online if isinstance(online, OnlineOptions) else OnlineOptions()) if online else None
    processes = processes if processes is not None else LocalProcesses.from_env()
    target = target or TargetSettings()
    if processes.rank:  # local rank 0 records the run
        target = dataclasses.replace(target, runs_file=None)
    workload = runs_workload(target.runs_file, target.workload, online=bool(online),
                             plan_workload=plan.workload if plan is not None else None)
    record = record or RecordSettings()
    if processes.rank and record.log is not None:  # steps.csv -> steps.rank1.csv
        record = dataclasses.replace(record, log=processes.own_path(record.log))
    if record.log is not None and os.path.exists(record.log):
        raise ValueError(f"log file {os.fspath(record.log)} exists: edgetune never overwrites a log; "
                         f"move it away or name another")
    return RunArguments(plan=plan, budget_w=budget_w, batch_size=batch_size, online=options, target=target,
                        runs_workload=workload, loader=loader or LoaderSettings(), record=record,
                        guard=guard or GuardSettings(), processes=processes)
