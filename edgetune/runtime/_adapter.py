"""What the framework adapters share (:mod:`edgetune.runtime.adapters`): the tuner's life in a framework's
hooks, the samples of a batch, the framework's optimizer and schedulers."""

from __future__ import annotations

import atexit
import os
import types
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from edgetune.log import get_logger
from edgetune.runtime.api import tune
from edgetune.runtime.board import device_spec, model_device
from edgetune.runtime.controller import Tuner
from edgetune.runtime.plan import load_plan
from edgetune.runtime.processes import LocalProcesses
from edgetune.runtime.target import TargetTracker

__all__ = ["batch_samples"]

_log = get_logger(__name__)


def _innermost(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under framework wrappers (accelerate's AcceleratedOptimizer, Lightning's)."""
    seen = 0
    while not type(optimizer).__module__.startswith("torch.optim") and hasattr(optimizer, "optimizer") and seen < 5:
        optimizer = optimizer.optimizer
        seen += 1
    return optimizer


def _metric_fix(metrics: Mapping[str, Any], metric: str) -> str:
    """What to do about a target metric missing from the validation metrics: name one of those that end with
    it in full (several evaluation sets: a Trainer names each ``eval_<set>_<metric>``), else log it."""
    named = sorted(str(k) for k in metrics if str(k).endswith(f"_{metric}"))
    if not named:
        return "log it under that name"
    return (f"name the evaluation set's in full, Target({named[0]!r}, ...)" if len(named) == 1 else
            f"name one in full ({', '.join(named)}), Target({named[0]!r}, ...)")


def batch_samples(batch: Any) -> int | None:
    """The samples in a batch as a framework hands it over: the leading dimension its tensors agree on.

    The tensors are the batch itself, or the items of a tuple, list or mapping (a Hugging Face batch). Where
    they disagree (a ``(T, B)`` sequence batch from ``pad_sequence`` beside its ``(B,)`` labels) or there are
    none (a detection batch of per-image tuples), the count is not known: None.
    """
    if isinstance(batch, torch.Tensor):
        items: Iterable[Any] = (batch,)
    elif isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (tuple, list)):
        items = batch
    else:
        return None
    sizes = {int(t.shape[0]) for t in items if isinstance(t, torch.Tensor) and t.dim() > 0}
    return sizes.pop() if len(sizes) == 1 else None


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
        self._target_seen = False  # the target's metric was among some evaluation's metrics
        #: in a process that does not tune (another on this machine does): the target followed alone, so that
        #: every process stops at it together
        self._follower: TargetTracker | None = None

    def _start(self, model: torch.nn.Module, optimizer: Any, batch_size: int | None, *,
               schedulers: Iterable[Any] = (), resumed_at: int = 0, processes: int = 1, local_rank: int = 0) -> None:
        """Open the tuner. ``schedulers``: the framework's learning-rate schedulers; those of ``optimizer`` are
        scaled with it (``lr_batch_size``, the guard's batch moves), another optimizer's are left alone; ``resumed_at``: the optimizer steps a checkpoint resumed
        from (0: a fresh run); ``processes``: the training processes sharing this machine; ``local_rank``: this
        one's (above 0 only where it tunes its own GPU, :meth:`_tunes_own_gpu`: local rank 0 records the run,
        and a ``log=`` file gets the rank in its name)."""
        if self.tuner is not None:  # a train() that ended on an exception the framework gave no hook for
            self._stop()
        options = dict(self.options)
        if resumed_at and not local_rank and options.get("runs_file") is not None:
            _log.warning("this run starts at step %d (resumed from a checkpoint, or a second fit of one Trainer): its "
                         "steps to the target did not start at zero, so it is not recorded in %s", resumed_at,
                         os.fspath(options["runs_file"]))
            options["runs_file"] = None
        optimizer = _innermost(optimizer)
        # another optimizer's schedulers (a GAN's discriminator) are not this one's: scaling their base rates
        # would change that optimizer's rate at its scheduler's next step, and never before
        schedulers = [s for s in schedulers if _innermost(getattr(s, "optimizer", optimizer)) is optimizer]
        tuner = tune(model, optimizer, batch_size=batch_size, budget_w=self.budget_w,
                     device=self.device, plan=self.plan, online=False, schedulers=schedulers,
                     processes=LocalProcesses(max(processes, local_rank + 1), local_rank), **options)
        tuner.__enter__()
        self.tuner = tuner
        if not self._atexit:
            atexit.register(self._stop)
            self._atexit = True
        if resumed_at:
            tuner._event(f"started at step {resumed_at} (resumed from a checkpoint, or a second fit of one Trainer): "
                         f"steps are counted from there")

    def _tunes_own_gpu(self, model: torch.nn.Module | None) -> bool:
        """Whether this process's tuner takes the GPU its model trains on (``device="nvml"``, or ``auto``
        picking an NVIDIA GPU: :func:`~edgetune.runtime.board.device_spec`); then every process on the
        machine tunes its own GPU, where a board's knobs are local rank 0's alone."""
        if not isinstance(self.device, str):
            return False
        return device_spec(self.device, model_device(model), **(self.options.get("device_options") or {}))[1]

    def _follow_only(self) -> None:
        """This process trains but does not tune (local rank > 0): it follows the target alone, from the same
        validation metrics, to stop where the tuning process stops."""
        target = self.options.get("target")
        self._follower = TargetTracker(target) if target is not None else None

    def _report(self, metrics: Mapping[str, Any], prefix: str = "", step: int = 0) -> bool:
        """Report the target's metric from the framework's validation metrics (``metric``, else ``prefix +
        metric``), evaluated after ``step`` optimizer steps; True once the target is reached (the callback
        then stops training)."""
        target = self.options.get("target")
        if (self.tuner is None and self._follower is None) or target is None:
            return False
        value = metrics.get(target.metric, metrics.get(prefix + target.metric))
        if value is None:
            # once seen, an evaluation without it is another evaluation set's (a Trainer's eval datasets)
            if not self._target_missing_noted and not self._target_seen:
                self._target_missing_noted = True
                _log.warning("target metric %r is not among the validation metrics (%s): %s", target.metric,
                             ", ".join(sorted(map(str, metrics))) or "none", _metric_fix(metrics, target.metric))
            return False
        self._target_seen = True
        number = float(value.item() if hasattr(value, "item") else value)
        if self.tuner is None:
            assert self._follower is not None
            return self._follower.report(step, number)
        return self.tuner.report(number)

    def _evaluated(self, metrics: Mapping[str, Any], prefix: str = "", step: int = 0) -> bool:
        """After the framework's validation (after ``step`` optimizer steps): its time is no step's; the
        target's metric is reported."""
        if self.tuner is not None:
            self.tuner._steps_resume()
        return self._report(metrics, prefix, step)

    def _count(self, batch: Any) -> None:
        """Count a training batch's samples in the step in progress (and, in the first step, its bytes as the
        step's input in the measured cost, not as activations)."""
        if self.tuner is None:
            return
        n = batch_samples(batch)
        if n is not None:
            self.tuner.count_samples(n)
        self.tuner._on_batch(batch)

    def _stop(self, exc: BaseException | None = None) -> None:
        tuner, self.tuner = self.tuner, None
        if tuner is not None:
            tuner.__exit__(type(exc) if exc is not None else None, exc, None)
            self._summary = tuner.summary

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
