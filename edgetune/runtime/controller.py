"""``with edgetune.tune(...)``: the controller around an ordinary PyTorch training loop.

The user's loop stays a plain loop::

    with edgetune.tune(model, optimizer, dataset=train_set, budget_w=10, device="sim:orin-nano",
                       plan="out/best.json") as tuner:
        for epoch in range(3):
            for x, y in tuner.loader:          # batches at the batch size edgetune chose
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()               # marks the step (an optimizer hook); no other call needed
    print(tuner.summary.table())

How the user's steps meet the device
    Every optimizer step is a step boundary (``Optimizer.register_step_post_hook``; without an optimizer,
    call :meth:`Tuner.step`). At each boundary the controller calls the device's
    ``run_step(no-op, batch_size, cost)`` and marks the step in the accounting. The same call serves both
    kinds of device:

    * real hardware (``jetson``, ``nvml``, ``rapl``): the step already ran on the GPU; ``run_step`` waits
      for the device to finish it (a CUDA synchronise); one background thread samples the real sensor at
      the monitor's rate and runs the guard every ``tick_s`` (:mod:`edgetune.runtime.ticker` says why one),
      all on the real clock;
    * the twin (``sim:<profile>``): the step ran for real on the CPU (the loss is real), and ``run_step``
      advances the twin's virtual clock by the step time its model gives for this batch size and knob
      setting, recording the power it draws. The monitor samples at its due times during that advance and
      the guard ticks on the same virtual clock, so the guard reacts inside a step just as it would on a
      board. The step's cost (FLOPs, bytes) is measured from the user's first real step
      (:class:`torch.utils.flop_counter.FlopCounterMode` and the autograd saved-tensor hooks, with the
      conventions of :func:`edgetune.workloads.measure_cost`), or given as ``cost=``.

What it does, in order
    enter: open the device, start the monitor, apply the plan (``plan=best.json`` of ``edgetune search``,
    :mod:`edgetune.runtime.plan`) or start online tuning (no plan: :mod:`edgetune.runtime.online`), start
    the budget guard;
    each step: device accounting, the online tuner's decisions (batch size and knobs, at step boundaries);
    each tick (:mod:`edgetune.runtime.ticker`): the budget file (:mod:`edgetune.runtime.budget`), the
    guard (:mod:`edgetune.runtime.guard`; when its lowest setting is still over the budget, the batch
    size too, :mod:`edgetune.runtime.batch_law`), the accounting;
    exit (normal, exception, Ctrl-C): restore every knob, write the summary table.

The pieces decide, the controller applies: the guard's law returns a :class:`~edgetune.runtime.guard.Decision`
(a :class:`~edgetune.runtime.guard.GuardMove` and a rung or a batch size) and the online tuner an
:class:`~edgetune.runtime.online.OnlineDecision` (an :class:`~edgetune.runtime.online.OnlineMove` and a
:class:`~edgetune.power.knobs.Candidate`); only the controller writes knobs, changes the batch size and
records events.

Where each part is
    This module: the :class:`Tuner`'s state, its public methods, ``__enter__``/``__exit__``, the knob writes
    (:meth:`Tuner._apply`; a write that fails mid-run: :meth:`Tuner._knob_failed`) and the events. Parts with
    their own state are objects it holds or functions it calls: :class:`~edgetune.runtime.knob_state.KnobState`
    (the knob values as found, in force, written, failed), :mod:`~edgetune.runtime.one_run` (one tuner per
    run), :func:`~edgetune.runtime.arguments.check_arguments` (``tune()``'s arguments). The behaviours that read
    and move the whole run under its one lock are mixed into the :class:`Tuner`, one module each:
    :class:`~edgetune.runtime.lifecycle.RunLifecycle` (setup and exit),
    :class:`~edgetune.runtime.guard_drive.GuardDrive` (the guard's ticks and moves) and
    :class:`~edgetune.runtime.steps.StepHooks` (the step boundaries, the online tuner's moves).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import types
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from edgetune.log import get_logger
from edgetune.power.base import ApplyError, Device, KnobValue, WorkloadCost
from edgetune.power.monitor import PowerMonitor
from edgetune.runtime import one_run
from edgetune.runtime.accounting import Accounting, RunSummary, SampleTap
from edgetune.runtime.arguments import check_arguments
from edgetune.runtime.board import device_spec
from edgetune.runtime.budget import BudgetSource, check_watts
from edgetune.runtime.guard import GuardMove
from edgetune.runtime.guard_drive import GuardDrive
from edgetune.runtime.knob_state import KnobState
from edgetune.runtime.ladder_guard import LadderGuard
from edgetune.runtime.lifecycle import RunLifecycle
from edgetune.runtime.loader import BatchLoader, rescale_lr
from edgetune.runtime.online import OnlineOptions, OnlineTuner
from edgetune.runtime.plan import Plan, PlanError, load_plan
from edgetune.runtime.processes import LocalProcesses
from edgetune.runtime.settings import GuardSettings, LoaderSettings, RecordSettings, TargetSettings
from edgetune.runtime.steps import StepHooks
from edgetune.runtime.target import TargetTracker
from edgetune.runtime.ticker import Ticker
from edgetune.workloads import CostMeter

# Plan, PlanError and load_plan live in edgetune.runtime.plan; importing them from here keeps working
__all__ = ["Plan", "PlanError", "Tuner", "load_plan"]

_log = get_logger(__name__)


class Tuner(RunLifecycle, GuardDrive, StepHooks):
    """The object ``with edgetune.tune(...) as tuner`` gives: the loader, the budget, the figures.

    Build it with :func:`tune` (or directly, with the settings grouped: :class:`LoaderSettings`,
    :class:`GuardSettings`, :class:`RecordSettings`, :class:`~edgetune.runtime.online.OnlineOptions`).
    Attributes in the user's words:

    * ``loader``: the batches to train on (a :class:`~edgetune.runtime.loader.BatchLoader`; None without a
      dataset: then take ``batch_size`` and batch yourself);
    * ``batch_size``: the batch size in force; ``setting``: the knob values in force;
    * ``budget_w``: the budget in force; :meth:`set_budget` changes it while training runs;
    * ``summary``: the :class:`~edgetune.runtime.accounting.RunSummary` (complete after exit);
    * ``device``, ``monitor``, ``events`` (device time, text); ``online``: the online tuner, if any.
    """

    def __init__(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, *,
                 dataset: Any = None, device: str | Device = "auto", device_options: Mapping[str, Any] | None = None,
                 plan: str | os.PathLike | Plan | None = None, batch_size: int | None = None,
                 budget_w: float | None = None, budget_file: str | os.PathLike | None = None,
                 online: bool | OnlineOptions | None = None, cost: WorkloadCost | None = None,
                 schedulers: Sequence[Any] = (),
                 loader: LoaderSettings | None = None, guard: GuardSettings | None = None,
                 record: RecordSettings | None = None, target: TargetSettings | None = None,
                 processes: LocalProcesses | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        #: the optimizer's learning-rate schedulers, scaled with its rate (:meth:`add_scheduler`)
        self.schedulers: list[Any] = list(schedulers)
        self._scheduler_warned = False
        self._dataset = dataset
        args = check_arguments(optimizer, dataset=dataset, plan=plan, batch_size=batch_size, budget_w=budget_w,
                               online=online, loader=loader, guard=guard, record=record, target=target,
                               processes=processes)
        self.plan: Plan | None = args.plan
        budget_w, batch_size = args.budget_w, args.batch_size
        self._online_options = args.online
        self.target_settings = args.target
        #: the training processes on this machine (torchrun's, by default) and this one's local rank
        #: (:mod:`edgetune.runtime.processes`)
        self.processes = args.processes
        self._runs_workload = args.runs_workload
        self._tracker = TargetTracker(self.target_settings.target) if self.target_settings.target else None
        self._wall_start = math.nan
        self._device_arg = device
        self._device_options = dict(device_options or {})
        self._requested_batch = batch_size
        self.loader_settings = args.loader
        self.lr_rule = self.loader_settings.lr_rule
        self.resize_at = self.loader_settings.resize_at
        self.seed = self.loader_settings.seed
        self.cost = cost
        self.record = args.record
        self.guard_params = args.guard.params
        self._guard_enabled = args.guard.enabled

        self._budget = BudgetSource(float(budget_w), budget_file)
        self.events: list[tuple[float, str]] = []
        self._lock = threading.RLock()
        self._entered = False
        self.summary: RunSummary | None = None
        self.loader: BatchLoader | None = None
        self.device: Device
        self.monitor: PowerMonitor
        self.accounting: Accounting
        self.tap: SampleTap
        self.online: OnlineTuner | None = None
        self.steps = 0
        self.epoch = 0
        self._batch_size = batch_size or 0
        self._step_batches: list[int] = []  # samples of each batch of the step in progress (count_samples)
        #: training processes whose steps the device's power measures, each training what this one does (a
        #: board's sensor under DDP): the accounting counts this process's samples that many times
        self._processes_measured = 1
        #: the knobs as found, in force (``setting``), written and failed
        self._knob_state = KnobState()
        self._cost_meter: CostMeter | None = None
        self._first_batch_bytes = 0.0
        self._hook_handles: list[Any] = []
        self._ticker: Ticker | None = None
        self._virtual = False
        self._ticks = 0
        self._update_every = 1
        self._owns_device = False
        #: the device is the GPU the model trains on, by the spec's choice (``nvml`` or ``auto``:
        #: :func:`~edgetune.runtime.board.device_spec`), not one the user named
        self._own_gpu = False
        self._guard = LadderGuard(self.guard_params, reference_budget_w=float(budget_w))
        self._guard_active = False
        self._blind_since: float | None = None
        self._guard_moves: Counter[GuardMove] = Counter()

    # -- public API ---------------------------------------------------------------------------------------
    @property
    def budget_w(self) -> float:
        """The budget in force now (W, judged on the 1-s moving average of board power)."""
        return self._budget.current_w

    @property
    def batch_size(self) -> int:
        """The batch size in force (the loader's, when there is one)."""
        return self.loader.batch_size if self.loader is not None else self._batch_size

    @property
    def measure_only(self) -> bool:
        return self.device.measure_only

    @property
    def setting(self) -> dict[str, KnobValue]:
        """The knob values in force (a clock this run has not set: its reading when the run began)."""
        return self._knob_state.setting

    def budget_at(self, t: float) -> float:
        """The budget that was in force at device time ``t``."""
        return self._budget.at(t)

    def set_budget(self, watts: float, why: str = "set_budget") -> None:
        """Change the budget while training runs; the guard acts on it at once (within one tick).

        Also reachable from outside the process: ``budget_file=`` names a file holding the budget in watts,
        re-read when it changes and on SIGUSR1.
        """
        watts = check_watts(watts)
        self._refuse_after_block("set_budget()")
        with self._lock:
            t = self.device.clock.now() if self._entered else 0.0
            if not self._budget.set(t, watts):
                return
            self._event(f"budget {watts:g} W ({why})")
            idle = self.device.idle_power_w if self._entered else None
            if idle is not None and watts <= idle:
                self._warn(f"budget {watts:g} W is at or below the device's idle power {idle:g} W: it cannot be "
                           f"met; the guard holds the lowest setting")
            self._guard.budget_changed(watts)
            if self._entered:
                self._tick()

    def step(self) -> None:
        """Mark the end of a training step. Needed only when no optimizer was given to :func:`tune`."""
        if self.optimizer is not None:
            raise RuntimeError("steps are marked by the optimizer's step hook; call tuner.step() only when "
                               "tune() was given no optimizer")
        self._on_step()

    def add_scheduler(self, scheduler: Any) -> None:
        """A learning-rate scheduler of the optimizer, created inside the ``with`` block: its base rates are
        scaled with every later batch-size change, as ``tune(schedulers=...)``'s are."""
        if scheduler not in self.schedulers:
            self.schedulers.append(scheduler)

    def count_samples(self, samples: int) -> None:
        """A batch of ``samples`` in the training step in progress: what it trains on, where a framework's
        loader forms the batches (a last, smaller batch; the micro-batches of gradient accumulation, the twin
        timing each as run). A step with none counted is one batch of :attr:`batch_size`. The framework
        adapters call this per batch; ``tuner.loader`` does it itself."""
        self._step_batches.append(int(samples))

    @contextlib.contextmanager
    def between_steps(self) -> Iterator[None]:
        """Evaluate, save a checkpoint or do anything else that is not training inside this block: the device
        time and energy from the last step's end to the block's end are then left out of the steps (and of
        the time and energy to the target), not charged to the next step. The budget still holds them. The
        framework adapters do this around validation."""
        self._steps_pause()
        try:
            yield
        finally:
            self._steps_resume()

    def end_epoch(self) -> None:
        """Close an epoch in the accounting. ``tuner.loader`` does this itself at the end of each pass; call it
        when the batches come from elsewhere (the framework adapters call it from their epoch hooks)."""
        self._refuse_after_block("end_epoch()")
        self._on_epoch_end(self.epoch)
        self.epoch += 1

    def set_batch_size(self, batch_size: int, at: str | None = None, *, scale_lr: bool = True) -> None:
        """Change the batch size at the next step (or epoch: ``at="epoch"``), scaling the learning rate
        (``scale_lr=False``: where the batches come from elsewhere and changed without it, such as a
        framework's gradient accumulation scheduled per epoch)."""
        self._refuse_after_block("set_batch_size()")
        at = at or self.resize_at
        if self.loader is not None:
            self.loader.set_batch_size(batch_size, at=at)
        else:
            old, self._batch_size = self._batch_size, batch_size
            if not scale_lr and old and old != batch_size:
                self._on_resize(old, batch_size, [])
            elif self.optimizer is not None and old and old != batch_size:
                b_noise = self.online.b_noise if self.online is not None else None
                options = {"b_noise": b_noise} if self.lr_rule == "adascale" else {}
                rates = rescale_lr(self.optimizer, old, batch_size, self.lr_rule, schedulers=self.schedulers,
                                   **options)
                self._on_resize(old, batch_size, rates)

    def report(self, value: float) -> bool:
        """Report the target metric's value, evaluated after the steps taken so far; True once the target
        (``tune(target=...)``) is reached, so the loop can stop there.

        The steps to the target are interpolated between the evaluations either side of it
        (:mod:`edgetune.runtime.target`); on exit the summary gives them with the device time and energy of the
        training steps up to it, and ``runs_file=`` records the run for ``edgetune search --steps-to-target``.
        """
        if self._tracker is None:
            raise RuntimeError("tuner.report() needs a target: pass target=edgetune.Target(metric, value) to tune()")
        self._refuse_after_block("report()", "report each evaluation inside the block")
        with self._lock:
            was = self._tracker.reached
            reached = self._tracker.report(self.steps, value)
            if self._entered:
                self.accounting.note_evaluation(self.steps, self._tracker.target.metric,
                                                self._tracker.values[-1], self.device.clock.now())
            if reached and not was:
                self._event(f"target {self._tracker.target.describe()} reached after {self._tracker.crossing:.1f} "
                            f"steps")
        return reached

    def apply_setting(self, setting: Mapping[str, KnobValue], why: str) -> None:
        """Apply knob values and re-anchor the guard's ladder on them. A knob whose write fails is left as it is
        until its back-off has passed (then tried again), with a warning; :attr:`setting` says what is in force."""
        self._refuse_after_block("apply_setting()")
        with self._lock:
            self._apply(setting, why)
            self._build_guard()

    # -- context ----------------------------------------------------------------------------------------
    def __enter__(self) -> Tuner:  # noqa: PYI034 - Tuner is not subclassed
        from edgetune.power.registry import open_device

        if self.summary is not None:
            raise RuntimeError("this tuner's run has ended (a tuner runs one with block): call edgetune.tune(...) "
                               "again for another run")
        self._refuse_nested()
        if isinstance(self._device_arg, Device):
            self.device = self._device_arg
        else:
            spec, self._own_gpu = device_spec(self._device_arg, self._model_device(), **self._device_options)
            self.device = open_device(spec, **self._device_options)
            self._owns_device = True
        try:
            self._refuse_nested()  # the board, now that it is open
            self._enter()
        except BaseException:
            self._cleanup(None)
            raise
        one_run.started(self)
        return self

    def _refuse_nested(self) -> None:
        """A block inside another on the same optimizer or board is refused
        (:func:`~edgetune.runtime.one_run.refuse_nested`)."""
        one_run.refuse_nested(self.optimizer, getattr(self, "device", self._device_arg))

    def _refuse_after_block(self, what: str, fix: str = "call it inside the block") -> None:
        """``tuner.<what>`` once the ``with`` block ended: one line, where it would change a finished run."""
        one_run.refuse_after_block(self.summary is not None, what, fix)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> bool:
        self._cleanup(exc_type)
        return False

    # -- knob writes ----------------------------------------------------------------------------------
    def _apply(self, setting: Mapping[str, KnobValue], why: str) -> None:
        changes, skipped, failed = self._knob_state.changes_for(setting)
        failure = self._write(changes)
        # the chosen setting (clocks not set: as their governors run them): the guard climbs back to it, not above
        self._guard.anchor = self._knob_state.governed()
        text = self._knob_state.written_text(changes, failure) or "knobs unchanged"
        if skipped and self.device.knobs:
            text += f" (not settable here: {', '.join(skipped)})"
        if failed:
            text += f" ({', '.join(failed)} left as it is: its write failed)"
        self._event(f"{why}; {text}")
        if failure is not None:
            self._warn_failed(failure)

    def _write(self, changes: Mapping[str, KnobValue]) -> ApplyError | None:
        """Write ``changes`` and record them in force; the failure, if a write failed (None: all written).

        A write that fails while the block runs is no error of the user's loop: :meth:`_knob_failed` keeps
        :attr:`setting` to what is in force and leaves the knob as it is until its back-off has passed; the
        caller records its move, then :meth:`_warn_failed`. A knob on trial that this write set is back (one
        event). Before the block runs (the plan, online tuning's first candidate) the failure is raised: nothing
        has trained yet, and the knobs are restored on the way out."""
        failure = None
        try:
            self._knob_state.write(changes)
        except ApplyError as exc:
            if not self._entered:
                raise
            self._knob_failed(exc)
            failure = exc
        for name, refused in self._knob_state.take_back():
            self._event(f"{name} is back: its write succeeded at {refused.next_try} after it "
                        f"failed ({refused.error}); the guard moves it again")
        return failure

    def _knob_failed(self, exc: ApplyError) -> None:
        """A write failed mid-run: the knob state takes what is in force
        (:meth:`~edgetune.runtime.knob_state.KnobState.fail`), the knob is left as it is until its back-off has
        passed (out of the guard's ladder, the plan's moves; online tuning's for the rest of the run), the guard's
        anchor and the online tuner take its value in force. The guard's ladder is rebuilt by the caller
        (:meth:`_guard_move`, :meth:`apply_setting`)."""
        in_force = self._knob_state.fail(exc, self.device.clock.now())
        self._guard.anchor = {**self._guard.anchor, exc.knob: in_force}
        if self.online is not None:
            self.online.knob_failed(exc.knob, in_force)

    def _warn_failed(self, exc: ApplyError) -> None:
        """Say that a knob's write failed (:meth:`_knob_failed`): a warning the first time and for an error not
        seen before (never one per try), else an event: the error, the value it keeps, when it is tried again (or
        that it is left for the rest of the run, after its last try), what the guard goes on with."""
        refused = self._knob_state.refused[exc.knob]
        if refused.final:
            then = f"edgetune leaves {exc.knob} as it is for the rest of the run ({refused.tries} tries failed)"
        else:
            then = (f"edgetune leaves {exc.knob} as it is and tries it again after {refused.wait_s:g} s of device "
                    f"time ({refused.next_try})")
        text = f"{exc}; {self._knob_state.stays(exc)}{then}{self._guard_goes_on()}"
        if refused.warn:
            self._warn(text)
        else:
            self._event(f"{exc.knob} refused again: {text}")

    # -- events -------------------------------------------------------------------------------------------
    def _event(self, text: str) -> None:
        """Record ``text`` at the device time now (an info line in the log)."""
        t = self.device.clock.now() if hasattr(self, "device") else 0.0
        self.events.append((t, text))
        _log.info("%.3f s: %s", t, text)

    def _warn(self, text: str, *, event: bool = True) -> None:
        """A warning the user sees without logging set up (Python's last-resort handler shows it), recorded as an
        event (``event=False``: logged only: the model's placement, the blind guard whose move is the event)."""
        if event:
            self.events.append((self.device.clock.now(), text))
        _log.warning("%s", text)
