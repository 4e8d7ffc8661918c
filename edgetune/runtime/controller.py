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
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import types
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TextIO

import torch

from edgetune.log import get_logger
from edgetune.power.base import (
    ApplyError,
    Device,
    DeviceError,
    Knob,
    KnobValue,
    WorkloadCost,
    format_value,
    is_out_of_memory,
)
from edgetune.power.clock import VirtualClock
from edgetune.power.knobs import Candidate, check_batch_size, reads_running_clock
from edgetune.power.monitor import PowerMonitor
from edgetune.runtime.accounting import Accounting, RunSummary, SampleTap
from edgetune.runtime.board import device_spec, governed_setting, model_device, placement_warning
from edgetune.runtime.budget import BudgetSource, check_watts
from edgetune.runtime.guard import Decision, GuardMove, Observation, build_ladder, frequency_prior
from edgetune.runtime.ladder_guard import LadderGuard
from edgetune.runtime.loader import BatchLoader, base_lr, rescale_lr
from edgetune.runtime.online import (
    DEFAULT_START_BATCH_SIZE,
    OnlineDecision,
    OnlineMove,
    OnlineOptions,
    OnlineTuner,
    RunState,
)
from edgetune.runtime.plan import (
    Plan,
    PlanError,
    load_plan,
    training_mismatch,
    untuned_mismatch,
    workload_mismatch,
)
from edgetune.runtime.settings import (
    RUNTIME_MONITOR_RATE_HZ,
    GuardSettings,
    LoaderSettings,
    RecordSettings,
    TargetSettings,
)
from edgetune.runtime.target import TargetOutcome, TargetTracker, finish, runs_workload
from edgetune.runtime.ticker import Ticker
from edgetune.workloads import CostMeter
from edgetune.workloads.cost import recompile_after_counting

# Plan, PlanError and load_plan live in edgetune.runtime.plan; importing them from here keeps working
__all__ = ["Plan", "PlanError", "Tuner", "load_plan"]

_log = get_logger(__name__)

#: the batch size when none is given and neither a plan nor online tuning chooses one (a dataset is given)
DEFAULT_BATCH_SIZE = DEFAULT_START_BATCH_SIZE
#: s: the sample tap keeps two fast windows plus this much history, more than the 1-s moving average the
#: guard also reads
TAP_SLACK_S = 1.5
#: fast windows the tap keeps (the guard's short average with room for one late tick)
TAP_FAST_WINDOWS = 2.0
#: with no maximum power from the device, the frequency prior's top rung draws this many budgets (only the
#: prior's scale: the guard's observations replace it)
UNKNOWN_TOP_POWER_BUDGETS = 1.5
#: s: on a real clock the guard's ticker updates the accounting this often (on a virtual clock, every tick):
#: its records and violations are exact whenever it runs, only their delay changes, and an update costs
#: about as much CPU as ten guard ticks
ACCOUNTING_PERIOD_S = 1.0
#: FLOP per MFLOP, for the event that reports the measured step cost
_FLOP_PER_MFLOP = 1e6


#: the tuners whose ``with`` block runs now (:meth:`Tuner.__enter__` refuses a second on the same optimizer or board)
_RUNNING: weakref.WeakSet[Tuner] = weakref.WeakSet()


def _noop() -> None:
    return None


class Tuner:
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
                 record: RecordSettings | None = None, target: TargetSettings | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        #: the optimizer's learning-rate schedulers, scaled with its rate (:meth:`add_scheduler`)
        self.schedulers: list[Any] = list(schedulers)
        self._scheduler_warned = False
        self._dataset = dataset
        self.plan: Plan | None = plan if isinstance(plan, Plan) else (load_plan(plan) if plan is not None else None)
        if budget_w is None and self.plan is not None:
            budget_w = self.plan.budget_w
        try:  # the rule set_budget and the budget file follow: a string, inf, nan are refused in one line
            budget_w = check_watts(budget_w)
        except ValueError:
            raise ValueError(f"budget_w must be a positive number of watts (or come from the plan), "
                             f"got {budget_w!r}") from None
        if batch_size is None:
            batch_size = self.plan.batch_size if self.plan is not None else None
        if batch_size is not None:
            batch_size = check_batch_size(batch_size, "batch_size")
        if online is None:
            online = self.plan is None
        if online and optimizer is None:
            raise ValueError("online tuning needs the optimizer (it reads the real gradients at each step); "
                             "pass it, or pass a plan")
        if online and batch_size is None and dataset is None:
            raise ValueError("give batch_size or a dataset: online tuning changes the batch size through tuner.loader")
        self._online_options = (online if isinstance(online, OnlineOptions) else OnlineOptions()) if online else None
        self.target_settings = target or TargetSettings()
        self._runs_workload = runs_workload(self.target_settings.runs_file, self.target_settings.workload,
                                            online=bool(online),
                                            plan_workload=self.plan.workload if self.plan is not None else None)
        self._tracker = TargetTracker(self.target_settings.target) if self.target_settings.target else None
        self._wall_start = math.nan
        self._device_arg = device
        self._device_options = dict(device_options or {})
        self._requested_batch = batch_size
        self.loader_settings = loader or LoaderSettings()
        self.lr_rule = self.loader_settings.lr_rule
        self.resize_at = self.loader_settings.resize_at
        self.seed = self.loader_settings.seed
        self.cost = cost
        self.record = record or RecordSettings()
        if self.record.log is not None and os.path.exists(self.record.log):
            raise ValueError(f"log file {os.fspath(self.record.log)} exists: edgetune never overwrites a log; "
                             f"move it away or name another")
        guard = guard or GuardSettings()
        self.guard_params = guard.params
        self._guard_enabled = guard.enabled

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
        self.setting: dict[str, KnobValue] = {}
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
        #: device time the guard went blind (no power reading for ``blind_s``), None while the sensor reads
        self._blind_since: float | None = None
        self._guard_moves: Counter[GuardMove] = Counter()
        self._original: dict[str, KnobValue] = {}
        self._written: set[str] = set()  # knobs this tuner has set: their value in force is the one written
        #: knobs whose write failed during the run, with the error: left as they are from then on (_knob_failed)
        self._failed: dict[str, str] = {}
        self._label: tuple[dict[str, KnobValue], str] | None = None  # the setting label per step, cached

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
                self._event(f"budget {watts:g} W is at or below the device's idle power {idle:g} W: it cannot be "
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
        for the rest of the run, with a warning; :attr:`setting` says what is in force."""
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
        _RUNNING.add(self)
        return self

    def _refuse_nested(self) -> None:
        """A ``with tune(...)`` inside another on the same optimizer or the same board is refused: both would
        count every step, and the inner block's restore would put the knobs back under the outer one."""
        for other in list(_RUNNING):
            same_optimizer = self.optimizer is not None and other.optimizer is self.optimizer
            device = getattr(self, "device", self._device_arg)
            same_board = device is other.device or (isinstance(device, Device) and not device.simulated
                                                    and device.name == other.device.name)
            if same_optimizer or same_board:
                what = "optimizer" if same_optimizer else f"board ({other.device.name})"
                raise RuntimeError(f"a tune() block already runs on this {what}: one tuner per run; use the "
                                   f"outer block's tuner, or end that block first")

    def _refuse_after_block(self, what: str, fix: str = "call it inside the block") -> None:
        """``tuner.<what>`` once the ``with`` block ended: one line, where it would change a finished run."""
        if self.summary is not None:
            raise RuntimeError(f"tuner.{what} after the with block: the run and its summary have ended; {fix}")

    def _enter(self) -> None:
        self._wall_start = time.perf_counter()
        with self._lock:  # on a real clock the ticker's thread runs from the accounting on: it waits for the setup
            self._setup()

    def _setup(self) -> None:
        dev = self.device
        self._original = dev.settings()
        self.setting = dict(self._original)
        self._guard.anchor = self._governed_setting()  # a real board's clocks as their governors run them
        # the tap hands each sample to the guard and the accounting once, without copying the monitor's history
        self.tap = SampleTap(dev.sensor, keep_s=TAP_FAST_WINDOWS * self.guard_params.fast_window_s + TAP_SLACK_S)
        self.monitor = PowerMonitor(self.tap, dev.clock,
                                    rate_hz=self.record.monitor_rate_hz or RUNTIME_MONITOR_RATE_HZ)
        self._virtual = isinstance(dev.clock, VirtualClock)
        if self._virtual:
            self.monitor.start()  # a ticker of the virtual clock
        else:
            self.monitor.sample()  # the first sample; the ticker's thread takes the others
        t0 = dev.clock.now()
        self._started_t = t0
        self._budget.restart(t0)
        simulated = " (simulated)" if dev.simulated and "simulated" not in dev.description else ""
        self._event(f"device {dev.name}: {dev.description}{simulated}")
        self._check_model_placement()
        self.accounting = Accounting(self.tap, self.budget_at, window_s=self.monitor.avg_window_s,
                                     log=self.record.log, keep_trace=self.record.keep_trace,
                                     budgets_at=self._budget.at_times)
        self.accounting.start(t0)
        self._ticks = 0
        self._update_every = max(1, round(ACCOUNTING_PERIOD_S / self.guard_params.tick_s))
        # a real clock: the ticker's thread samples too; without online tuning no window ever needs the monitor
        sample = self.tap.sample if self._online_options is None else self._sample
        self._ticker = Ticker(dev.clock, self.guard_params.tick_s, self._tick,
                              **({} if self._virtual else {"sample": sample,
                                                           "sample_period_s": 1.0 / self.monitor.rate_hz}))
        if dev.measure_only:
            why = "; ".join(sorted({k.why_read_only for k in dev.knobs.values() if k.why_read_only})) or \
                "the platform exposes no writable knob"
            self._event(f"measure-only: knobs cannot be set here ({why}); the guard only reports")
        if self.plan is not None:
            self._apply_plan(self.plan)
        if self._online_options is not None:
            self.online = OnlineTuner(dev.writable_knobs, self.monitor, start_batch_size=self._requested_batch,
                                      dataset_size=len(self._dataset) if self._dataset is not None else None,
                                      options=self._online_options, guard_margin=self.guard_params.target_margin,
                                      seed=self.seed)
            first = self.online.start(self._governed_setting())
            assert first.candidate is not None
            self._note(first)
            self._batch_size = first.candidate.batch_size
            self._apply(first.candidate.knobs, f"online tuning: first candidate: batch size {self._batch_size}")
        if self._batch_size <= 0:
            if self._dataset is None:
                raise ValueError("give batch_size, a plan, or a dataset to tune()")
            self._batch_size = DEFAULT_BATCH_SIZE
            self._event(f"no batch size given: starting at {DEFAULT_BATCH_SIZE}")
        self._scale_lr_to_start()
        if self._dataset is not None:
            ls = self.loader_settings
            self.loader = BatchLoader(
                self._dataset, self._batch_size, optimizer=self.optimizer, lr_rule=ls.lr_rule,
                shuffle=ls.shuffle, seed=ls.seed, drop_last=ls.drop_last,
                on_epoch_start=self._on_epoch_start, on_epoch_end=self._on_epoch_end,
                on_resize=self._on_resize, on_batch=self._on_loader_batch, schedulers=self.schedulers,
                **ls.options)
        self._build_guard()
        if self.optimizer is not None:
            self._hook_handles.append(self.optimizer.register_step_post_hook(lambda opt, args, kwargs: self._on_step()))
            if self.online is not None:
                self._hook_handles.append(self.optimizer.register_step_pre_hook(
                    lambda opt, args, kwargs: self.online.before_step(self.batch_size, self.optimizer)))
        # only the twin needs the step's cost (real hardware runs the step itself): measure it there
        if self.cost is None and dev.simulated:
            if self.model is None:
                raise ValueError("the twin needs the step's cost: pass model= (it is measured from the first "
                                 "step) or cost= (for example load_workload(...).cost)")
            self._cost_meter = CostMeter(self.model).start()
        self._guard.batch_arrived(self.batch_size)
        self._poll_budget_file()
        self._budget.watch()
        self._entered = True

    def _check_model_placement(self) -> None:
        """Warn where the user's model is not where the device measures
        (:func:`~edgetune.runtime.board.placement_warning`)."""
        line = placement_warning(self._model_device(), self.device)
        if line:
            _log.warning("%s", line)

    def _governed_setting(self) -> dict[str, KnobValue]:
        """The setting in force, the clocks this tuner has not set as their governors run them
        (:func:`~edgetune.runtime.board.governed_setting`)."""
        return governed_setting(self.device, self.setting, self._written)

    def _model_device(self) -> torch.device | None:
        """Where the user's model is (:func:`~edgetune.runtime.board.model_device`)."""
        return model_device(self.model)

    def _scale_lr_to_start(self) -> None:
        """The learning rate set for ``lr_batch_size``, scaled to the batch size the run starts at."""
        ref = self.loader_settings.lr_batch_size
        if ref is None or self.optimizer is None or ref == self._batch_size:
            return
        rates = rescale_lr(self.optimizer, ref, self._batch_size, self.lr_rule, schedulers=self.schedulers)
        self._event(f"learning rate set for batch size {ref}, scaled to batch size {self._batch_size} "
                    f"({self.lr_rule}): {rates[0]:.4g}")
        self._warn_unknown_scheduler()

    def _warn_unknown_scheduler(self) -> None:
        """Once: the optimizer steps a learning-rate scheduler this tuner was not given (torch marks the step
        it wraps), which computes its next rate from base rates edgetune did not scale."""
        if self._scheduler_warned or self.schedulers or self.optimizer is None \
                or not getattr(self.optimizer.step, "_wrapped_by_lr_sched", False):
            return
        self._scheduler_warned = True
        text = ("the optimizer has a learning-rate scheduler edgetune was not given: its next step computes the "
                "rate from base rates edgetune did not scale, undoing the scaling; pass tune(schedulers=[...]), "
                "or tuner.add_scheduler(s) for one created inside the with block")
        self.events.append((self.device.clock.now(), text))
        _log.warning("%s", text)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> bool:
        self._cleanup(exc_type)
        return False

    def _cleanup(self, exc_type: Any) -> None:
        """Restore everything, whatever the exit; the knobs first, so nothing else can stop it."""
        restored_ok: bool | None = None
        try:
            if self._ticker is not None:
                self._ticker.stop()
            for h in self._hook_handles:
                h.remove()
            self._hook_handles.clear()
            if self._cost_meter is not None:
                self._cost_meter.close()
            if self.loader is not None:
                self.loader.close()
        finally:
            try:
                restored = self.device.restore()
                now = self.device.settings()
                # a clock reads the running frequency, which a governor moves: its restore is the write's success
                restored_ok = all(now.get(k) == v for k, v in self._original.items() if not reads_running_clock(k))
                if restored:
                    self._event(f"restored {', '.join(restored)}")
            except Exception as exc:  # noqa: BLE001 - reported in the summary, then the exit goes on
                restored_ok = False
                self._event(f"restore failed: {exc}")
        try:
            if hasattr(self, "accounting"):
                self.monitor.sample()
                self.accounting.update()
                self.accounting.end_epoch(self.epoch)  # the open epoch, if it has steps not yet closed
                self.accounting.finish()
                self.summary = self._summary(restored_ok)
                self.summary.target = self._target_outcome(ended_normally=exc_type is None)
            if hasattr(self, "monitor"):
                self.monitor.stop()
            self._budget.unwatch()
            if exc_type is KeyboardInterrupt:
                self._event("interrupted (Ctrl-C): knobs restored" if restored_ok else "interrupted (Ctrl-C)")
            if self.summary is not None and self.record.print_summary:
                self._write_summary(self.summary, self.record.print_summary)
        finally:
            self._entered = False
            _RUNNING.discard(self)
            if self._owns_device:
                self.device.close()

    @staticmethod
    def _write_summary(summary: RunSummary, where: bool | TextIO) -> None:
        """The table the user asked for with ``print_summary=``: to that stream, or standard error for True."""
        out = where if hasattr(where, "write") else sys.stderr
        out.write(summary.table() + "\n")

    def _summary(self, restored_ok: bool | None) -> RunSummary:
        time_s, energy, samples = self.accounting.totals()
        return RunSummary(
            device=self.device.name, simulated=self.device.simulated, measure_only=self.device.measure_only,
            steps=len(self.accounting.steps), samples=samples, time_s=time_s, energy_j=energy,
            mean_w=energy / time_s if time_s > 0 else math.nan, peak_w=self.accounting.peak_w,
            max_avg_w=self.accounting.max_avg_w, budget_w=self.budget_w,
            violations=list(self.accounting.violations), epochs=list(self.accounting.epochs),
            events=list(self.events), batch_size=self.batch_size,
            setting={k: format_value(v, self.device.knobs[k].unit) for k, v in self.setting.items()
                     if k in self.device.knobs and self.device.knobs[k].writable},
            knobs_restored=restored_ok, guard_moves=dict(self._guard_moves), knobs_failed=dict(self._failed),
            unmeasured_steps=self.accounting.unmeasured_steps, unmeasured_s=self.accounting.unmeasured_s,
        )

    # -- the training target --------------------------------------------------------------------------------
    def _target_outcome(self, *, ended_normally: bool) -> TargetOutcome | None:
        """The run against its target; its row appended to the runs file where it stands as one run."""
        if self._tracker is None:
            return None
        return finish(self._tracker, self.accounting.steps, self.target_settings.runs_file, self._runs_workload,
                      ended_normally=ended_normally, seed=self.seed, lr=base_lr(self.optimizer, self.schedulers),
                      wall_s=time.perf_counter() - self._wall_start, device=self.device.name, on_unwritten=self._event)

    # -- plan and knobs ---------------------------------------------------------------------------------
    def _apply_plan(self, plan: Plan) -> None:
        dev = self.device
        if plan.device and plan.device != dev.name:
            self._event(f"plan {plan.path} was made on {plan.device}, running on {dev.name}: "
                        "its setting may not be the best here")
        if self.model is not None or self.cost is not None:  # a plan searched for another model
            mismatch = workload_mismatch(
                plan, flops_per_sample=self.cost.flops_per_sample if self.cost is not None else None,
                param_bytes=self.cost.param_bytes if self.cost is not None else
                float(sum(t.numel() * t.element_size() for t in self.model.parameters())))
            if mismatch:  # a warning, not an info event: a script without logging set up still shows it
                self.events.append((dev.clock.now(), mismatch))
                _log.warning("%s", mismatch)
        if self._requested_batch is None or self._requested_batch == plan.batch_size:
            self._batch_size = plan.batch_size
        else:
            self._event(f"batch size {self._requested_batch} is in force, not the plan's {plan.batch_size}: "
                        f"the plan's power and speed were measured at {plan.batch_size}")
        lines = untuned_mismatch(plan, self._original)  # warnings: the plan was measured in another state
        on = self._model_device()
        if on is not None and not dev.simulated:  # the twin models the step: where the model sits is moot
            lines += [line for line in [training_mismatch(plan, str(on))] if line]
        for line in lines:
            self.events.append((dev.clock.now(), line))
            _log.warning("%s", line)
        unknown = sorted(set(plan.setting) - set(dev.knobs))
        if unknown:
            raise PlanError(f"plan {plan.path}: knob(s) {', '.join(unknown)} do not exist on {dev.name}; "
                            f"knobs here: {', '.join(dev.knobs) or 'none'}")
        if plan.budget_w is not None:
            self._guard.reference_budget_w = plan.budget_w
        self._apply(plan.setting, f"plan {plan.path}: batch size {self._batch_size}" if plan.path else
                    f"plan: batch size {self._batch_size}")

    def _apply(self, setting: Mapping[str, KnobValue], why: str) -> None:
        dev = self.device
        settable = self._settable_knobs()
        writable = {k: dev.knobs[k].validate(v) for k, v in setting.items() if k in settable and settable[k].writable}
        failed = sorted(k for k in setting if k in self._failed)
        skipped = sorted(set(setting) - set(writable) - set(failed))
        # a clock this tuner has not set reads the frequency running now: equal to the value asked for, it may
        # still be the governor's, so it is written (locked) all the same
        changes = {k: v for k, v in writable.items()
                   if self.setting.get(k) != v or (k not in self._written and reads_running_clock(k))}
        failure = self._write(changes)
        # the chosen setting (clocks not set: as their governors run them): the guard climbs back to it, not above
        self._guard.anchor = self._governed_setting()
        text = self._written_text(changes, failure) or "knobs unchanged"
        if skipped and dev.knobs:
            text += f" (not settable here: {', '.join(skipped)})"
        if failed:
            text += f" ({', '.join(failed)} left as it is: its write failed)"
        self._event(f"{why}; {text}")
        if failure is not None:
            self._warn_failed(failure)

    def _settable_knobs(self) -> dict[str, Knob]:
        """The device's knobs less those whose write failed during the run (:meth:`_knob_failed`)."""
        return {k: v for k, v in self.device.knobs.items() if k not in self._failed}

    def _write(self, changes: Mapping[str, KnobValue]) -> ApplyError | None:
        """Write ``changes`` and record them in force; the failure, if a write failed (None: all written).

        A write that fails while the block runs is no error of the user's loop: :meth:`_knob_failed` keeps
        :attr:`setting` to what is in force and leaves the knob as it is from then on; the caller records its
        move, then :meth:`_warn_failed`. Before the block runs (the plan, online tuning's first candidate) the
        failure is raised: nothing has trained yet, and the knobs are restored on the way out."""
        if not changes:
            return None
        try:
            self.device.apply(changes)
        except ApplyError as exc:
            if not self._entered:
                raise
            self._knob_failed(exc)
            return exc
        self.setting.update(changes)
        self._written.update(changes)
        return None

    def _knob_failed(self, exc: ApplyError) -> None:
        """A write failed mid-run: :attr:`setting` takes the knobs written before it (``exc.applied``) and the
        failed knob's value in force (as found where its platform put it back, else the value before the write);
        the knob is left as it is for the rest of the run (out of the guard's ladder, the plan's and online
        tuning's moves). The guard's ladder is rebuilt by the caller (:meth:`_guard_move`,
        :meth:`apply_setting`)."""
        name, knob = exc.knob, self.device.knobs[exc.knob]
        self.setting.update(exc.applied)
        self._written.update(exc.applied)
        if knob.original is None:  # its platform put it back as found (its error says so): governed, if a clock
            self.setting[name] = self._original[name]
            self._written.discard(name)
        self._failed[name] = str(exc)
        in_force = self._governed_setting()[name]
        self._guard.anchor = {**self._guard.anchor, name: in_force}
        if self.online is not None:
            self.online.knob_failed(name, in_force)

    def _warn_failed(self, exc: ApplyError) -> None:
        """One warning for a knob whose write failed (:meth:`_knob_failed`; once: it is never written again):
        the error, the value it keeps, what the guard goes on with."""
        name, knob = exc.knob, self.device.knobs[exc.knob]
        # where its platform put it back as found, its error says so; a refused write leaves the value before it
        stays = "" if knob.original is None else f"{name} stays at {format_value(self.setting[name], knob.unit)}; "
        line = f"{exc}; {stays}edgetune leaves {name} as it is for the rest of the run{self._guard_goes_on()}"
        self.events.append((self.device.clock.now(), line))
        _log.warning("%s", line)

    def _guard_goes_on(self) -> str:
        """What the guard holds the budget with once a knob failed (:meth:`_knob_failed`): the knobs its ladder
        moves without the failed ones, and the batch size where the batches come from the loader."""
        if not (self._guard_enabled and not self.device.measure_only):
            return ""
        ladder = build_ladder(self._settable_knobs(), self._guard.anchor or self.setting)
        if len(ladder) < 2:
            return "; no other knob is left to the guard: it only reports from now on"
        means = [k for k in ladder[0] if any(rung[k] != ladder[0][k] for rung in ladder)]
        if self.loader is not None:
            means.append("the batch size")
        return f"; the guard goes on with {', '.join(means[:-1])} and {means[-1]}" if len(means) > 1 else \
            f"; the guard goes on with {means[0]}"

    def _written_text(self, changes: Mapping[str, KnobValue], failure: ApplyError | None) -> str:
        """The knobs a move wrote, as text (with the one whose write failed, if one did)."""
        knobs = self.device.knobs
        written = changes if failure is None else failure.applied
        text = ", ".join(f"{k}={format_value(v, knobs[k].unit)}" for k, v in written.items())
        if failure is None:
            return text
        failed = f"{failure.knob} not set (its write failed)"
        return f"{text}; {failed}" if text else failed

    # -- guard --------------------------------------------------------------------------------------------
    def _build_guard(self) -> None:
        """The ladder around the chosen setting (the anchor), the prior power model, the law's state at the
        rung in force (after a batch change the guard may be below the anchor: it stays there)."""
        dev = self.device
        self._guard_active = self._guard_enabled and not dev.measure_only
        if not self._guard_active:
            return
        ladder = build_ladder(self._settable_knobs(), self._guard.anchor or self.setting)
        self._guard.ladder = ladder
        if len(ladder) < 2:
            self._guard_active = False
            self._event("guard: only one setting is reachable; the guard only reports")
            return
        idle = dev.idle_power_w if dev.idle_power_w is not None else 0.0
        top = dev.max_power_w if dev.max_power_w is not None else UNKNOWN_TOP_POWER_BUDGETS * self.budget_w
        prior = (self.online.ladder_prior(ladder, self.batch_size, dev.knobs, dev.idle_power_w or 0.0)
                 if self.online is not None else None)
        # the fast window must first fill with this setting's power (at the start: not the idle before it)
        self._guard.reset(ladder, prior or frequency_prior(ladder, dev.knobs, idle, top), self.setting,
                          self.budget_w, dev.clock.now())

    def _tick(self) -> None:
        """One guard tick on the device clock: budget file, the control law, the accounting."""
        with self._lock:
            try:
                if self._budget.path is not None:
                    self._poll_budget_file()
                if self._guard_active and self._guard.ready:
                    # the batch size is the guard's only where the loop takes its batches from tuner.loader, and
                    # not while the online tuner explores batch sizes itself
                    self._guard.allow_batch = self.loader is not None and (self.online is None
                                                                            or not self.online.exploring)
                    t = self.device.clock.now()
                    if self._sensor_reads(t):  # else blind: the lowest setting is held until a reading comes
                        fast, avg = self.tap.averages(self.guard_params.fast_window_s, self.monitor.avg_window_s)
                        decision = self._guard.tick(Observation(t, fast, avg, self.budget_w))
                        if decision.moved:
                            self._guard_move(decision)
                self._ticks += 1
                if self._virtual or self._ticks % self._update_every == 0:
                    self.accounting.update()
            except DeviceError as exc:
                self._event(f"guard: {exc}")

    def _sensor_reads(self, t: float) -> bool:
        """Whether the guard sees power at device time ``t``. After ``blind_s`` (or three of a slower sensor's
        updates) without a good reading, it goes blind once: the lowest setting, a warning, and no law until a
        reading comes; then it says so and the law resumes from there."""
        last = self.tap.last_t
        silent_s = t - (last if last is not None else self._started_t)
        if silent_s <= max(self.guard_params.blind_s, 3 * self.tap.update_period_s):
            if self._blind_since is not None:
                self._event(f"guard: the power sensor reads again after {t - self._blind_since:.1f} s blind; the "
                            f"guard goes on from the lowest setting")
                self._blind_since = None
            return True
        if self._blind_since is None:
            self._blind_since = t
            decision = self._guard.blind(t, silent_s)
            _log.warning("guard %s (device %s)", decision.reason, self.device.name)
            # a knob whose write failed leaves a ladder without it: its lowest rung, until no write fails
            while not self._guard_move(decision) and self._guard_active:
                decision = self._guard.blind(t, silent_s)
        return False

    def _sample(self) -> None:
        """One power sample on a real clock (the ticker's thread, at the monitor's rate).

        The guard and the accounting read the tap; the monitor's own history serves only measurement
        windows, which only the online tuner opens while it explores: then the sample goes through the monitor
        (and on to the tap), else to the tap alone: the monitor's bookkeeping costs about 18 us of CPU per
        sample on a busy 2-core VM (code run 100 times a second is paid cold), for a history no one would read.
        """
        if self.online is not None and self.online.exploring:
            self.monitor.sample()
        else:
            self.tap.sample()

    def _guard_move(self, decision: Decision) -> bool:
        """Apply the guard's move; False where a knob's write failed (:meth:`_knob_failed`): the guard then
        starts again at the setting in force, on a ladder without that knob."""
        if decision.batch_move:
            # the loader draws its next batch at the new size (not waiting for an epoch: the budget cannot
            # wait) and scales the learning rate when that batch reaches the loop (_on_resize)
            assert self.loader is not None and decision.batch_size is not None
            self._event(f"guard {self._reason(decision)}")
            self._guard_moves[decision.kind] += 1
            self.loader.resize_now(decision.batch_size)
            return True
        rung = self._guard.ladder[decision.rung]
        settable = self._settable_knobs()
        changes = {k: v for k, v in rung.items() if self.setting.get(k) != v and k in settable and settable[k].writable}
        reason = self._reason(decision)  # before the write: a knob failing now is no part of this decision
        failure = self._write(changes)
        self._event(f"guard {reason}: {self._written_text(changes, failure)}")
        if failure is None or failure.applied:
            self._guard_moves[decision.kind] += 1
        if failure is not None:
            self._warn_failed(failure)
            self._build_guard()  # the ladder without the knob; the law's state at the rung in force
        if decision.kind is GuardMove.TRIP and self.online is not None and self.online.exploring:
            # the candidate being explored does not hold the budget: the online tuner records it, moves on
            power = self.tap.average(self.guard_params.fast_window_s)
            self._follow(self.online.on_guard_trip(self._run_state(), power))
        return failure is None

    def _reason(self, decision: Decision) -> str:
        """The decision's reason for the event; where it speaks of the lowest setting while a knob's write has
        failed, which knob that lowest setting leaves as it is."""
        if decision.infeasible and self._failed:
            return f"{decision.reason} ({', '.join(self._failed)} left as it is: its write failed)"
        return decision.reason

    def _poll_budget_file(self) -> None:
        reading = self._budget.poll()
        if reading is None:
            return
        if reading.watts is None:
            self._event(reading.problem(self.budget_w))
        elif reading.watts != self.budget_w:
            self.set_budget(reading.watts, why=f"budget file {reading.path}")

    # -- the online tuner's decisions -----------------------------------------------------------------------
    def _run_state(self) -> RunState:
        return RunState(self.device.clock.now(), self.batch_size, self.budget_w, dict(self.setting))

    def _note(self, decision: OnlineDecision) -> None:
        for text in decision.notes:
            self._event(text)
        for text in decision.warnings:  # a warning, not an info event: a script without logging set up shows it
            self.events.append((self.device.clock.now(), text))
            _log.warning("%s", text)

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
        """The run leaves training now (:meth:`between_steps`): the online tuner's window pauses."""
        with self._lock:
            if self._entered and self.online is not None:
                self.online.pause(self.device.clock.now())

    def _steps_resume(self) -> None:
        """Training steps resume now: the time since the last step's end was no step (:meth:`between_steps`).
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
            self._follow(self.online.on_out_of_memory(self._run_state()))
            return
        t = self.device.clock.now()
        self.steps += 1
        self.accounting.mark_step(t, b, self._setting_label(), self.epoch, samples * self._processes_measured)
        if self.online is not None:
            with self._lock:  # the guard's thread may move the online tuner too (real clock)
                self._follow(self.online.after_step(RunState(t, self.batch_size, self.budget_w, dict(self.setting))))

    def _setting_label(self) -> str:
        """The setting in force as text (per step in the accounting; formatted again only when it changed)."""
        if self._label is not None and self._label[0] == self.setting:
            return self._label[1]
        knobs = self.device.knobs
        text = " ".join(f"{k}={format_value(v, knobs[k].unit)}" for k, v in self.setting.items()
                        if k in knobs and knobs[k].writable)
        self._label = (dict(self.setting), text)
        return text

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

    def _event(self, text: str) -> None:
        t = self.device.clock.now() if hasattr(self, "device") else 0.0
        self.events.append((t, text))
        _log.info("%.3f s: %s", t, text)

    def _on_loader_batch(self, batch: Any, samples: int) -> None:
        """A batch of ``tuner.loader`` and the samples it holds (fewer at an epoch's end): its step's, its bytes."""
        self.count_samples(samples)
        self._on_batch(batch)

    def _on_batch(self, batch: Any) -> None:
        """A batch of the first step (the loader's first; each micro-batch of a framework's first optimizer step,
        from the adapters): its bytes are the step's input, not activations."""
        if self._cost_meter is not None and self._cost_meter.active:
            self._first_batch_bytes += self._cost_meter.exclude(batch)
