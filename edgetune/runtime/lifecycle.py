"""How a tuned run opens and closes: the :class:`~edgetune.runtime.controller.Tuner`'s setup when its ``with``
block begins, and its exit.

Setup (:meth:`RunLifecycle._setup`, under the run's lock: on a real clock the ticker's thread waits for it):
the knobs as found, the tap and the monitor on the device's sensor, the accounting, the ticker (the guard's
ticks; on hardware its thread samples too), the plan (:meth:`RunLifecycle._apply_plan`, with its warnings) or
online tuning's first candidate, the batch size and learning rate the run starts at, the loader, the guard's
ladder, the optimizer's hooks, the cost meter where the twin needs the step's cost. Exit
(:meth:`RunLifecycle._cleanup`, whatever the exit): the ticker and the hooks stopped, every knob restored
first, then the accounting closed, the summary (:class:`~edgetune.runtime.accounting.RunSummary`) and the
training target's outcome, the device closed where the run opened it.

:class:`RunLifecycle` is mixed into the :class:`~edgetune.runtime.controller.Tuner`, not a part of its own: the
setup builds the Tuner's own parts (its public ``tap``, ``monitor``, ``accounting``, ``loader``, ``online``) and
the exit reads them all back. Its class attributes name the run's state it uses; the Tuner sets them.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from edgetune.power.clock import VirtualClock
from edgetune.power.monitor import PowerMonitor
from edgetune.runtime import one_run
from edgetune.runtime.accounting import Accounting, RunSummary, SampleTap
from edgetune.runtime.board import model_device, placement_warning
from edgetune.runtime.loader import BatchLoader, base_lr, rescale_lr
from edgetune.runtime.online import DEFAULT_START_BATCH_SIZE, OnlineTuner
from edgetune.runtime.plan import Plan, PlanError, training_mismatch, untuned_mismatch, workload_mismatch
from edgetune.runtime.processes import LocalProcesses, machine_share
from edgetune.runtime.settings import RUNTIME_MONITOR_RATE_HZ
from edgetune.runtime.target import TargetOutcome, finish
from edgetune.runtime.ticker import Ticker
from edgetune.workloads import CostMeter

if TYPE_CHECKING:
    import threading
    from collections import Counter

    import torch

    from edgetune.power.base import Device, WorkloadCost
    from edgetune.runtime.budget import BudgetSource
    from edgetune.runtime.guard import GuardMove, GuardParams
    from edgetune.runtime.knob_state import KnobState
    from edgetune.runtime.ladder_guard import LadderGuard
    from edgetune.runtime.online import OnlineOptions
    from edgetune.runtime.settings import LoaderSettings, RecordSettings, TargetSettings
    from edgetune.runtime.target import TargetTracker

__all__ = ["ACCOUNTING_PERIOD_S", "DEFAULT_BATCH_SIZE", "TAP_FAST_WINDOWS", "TAP_SLACK_S", "RunLifecycle"]

#: the batch size when none is given and neither a plan nor online tuning chooses one (a dataset is given)
DEFAULT_BATCH_SIZE = DEFAULT_START_BATCH_SIZE
#: s: the sample tap keeps two fast windows plus this much history, more than the 1-s moving average the
#: guard also reads
TAP_SLACK_S = 1.5
#: fast windows the tap keeps (the guard's short average with room for one late tick)
TAP_FAST_WINDOWS = 2.0
#: s: on a real clock the guard's ticker updates the accounting this often (on a virtual clock, every tick):
#: its records and violations are exact whenever it runs, only their delay changes, and an update costs
#: about as much CPU as ten guard ticks
ACCOUNTING_PERIOD_S = 1.0


class RunLifecycle:
    """The opening and closing part of the :class:`~edgetune.runtime.controller.Tuner` (a mixin: see the module
    docs).

    Besides the state below, it calls the Tuner's ``batch_size``, ``budget_at``, ``_apply``, ``_event`` and
    ``_warn``, the guard drive's ``_build_guard``, ``_tick``, ``_sample`` and ``_poll_budget_file``
    (:class:`~edgetune.runtime.guard_drive.GuardDrive`), and the step hooks' ``_note``, ``_on_step`` and the
    loader's callbacks (:class:`~edgetune.runtime.steps.StepHooks`).
    """

    # the run's state it builds and reads back (the Tuner's)
    model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer | None
    schedulers: list[Any]
    plan: Plan | None
    device: Device
    tap: SampleTap
    monitor: PowerMonitor
    accounting: Accounting
    loader: BatchLoader | None
    online: OnlineTuner | None
    summary: RunSummary | None
    cost: WorkloadCost | None
    events: list[tuple[float, str]]
    epoch: int
    seed: int
    lr_rule: str
    guard_params: GuardParams
    loader_settings: LoaderSettings
    record: RecordSettings
    target_settings: TargetSettings
    processes: LocalProcesses
    _lock: threading.RLock
    _entered: bool
    _wall_start: float
    _started_t: float
    _dataset: Any
    _requested_batch: int | None
    _batch_size: int
    _online_options: OnlineOptions | None
    _budget: BudgetSource
    _knob_state: KnobState
    _guard: LadderGuard
    _guard_moves: Counter[GuardMove]
    _tracker: TargetTracker | None
    _runs_workload: str | None
    _cost_meter: CostMeter | None
    _hook_handles: list[Any]
    _ticker: Ticker | None
    _virtual: bool
    _ticks: int
    _update_every: int
    _owns_device: bool
    _own_gpu: bool
    _processes_measured: int
    _scheduler_warned: bool
    _guard_enabled: bool

    def _enter(self) -> None:
        self._wall_start = time.perf_counter()
        with self._lock:  # on a real clock the ticker's thread runs from the accounting on: it waits for the setup
            self._setup()

    def _setup(self) -> None:
        dev = self.device
        self._knob_state.start(dev)
        self._guard.anchor = self._knob_state.governed()  # a real board's clocks as their governors run them
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
        idle, budget = dev.idle_power_w, self._budget.current_w
        if idle is not None and budget is not None and budget <= idle:  # as set_budget says of a later one
            self._warn(f"budget {budget:g} W is at or below {dev.name}'s idle power {idle:g} W: it cannot be met, "
                       f"the guard holds the lowest setting and the run counts as over the budget; give a budget "
                       f"above {idle:g} W")
        self._check_model_placement()
        self._share_machine()
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
            # with tuner.loader the guard holds the budget by the batch size alone, and says so (_build_guard)
            alone = self._dataset is not None and self._guard_enabled
            self._event(f"measure-only: knobs cannot be set here ({why})" + ("" if alone else
                                                                              "; the guard only reports"))
        if self.plan is not None:
            self._apply_plan(self.plan)
        if self._online_options is not None:
            self.online = OnlineTuner(dev.writable_knobs, self.monitor, start_batch_size=self._requested_batch,
                                      dataset_size=len(self._dataset) if self._dataset is not None else None,
                                      options=self._online_options, guard_margin=self.guard_params.target_margin,
                                      seed=self.seed)
            first = self.online.start(self._knob_state.governed())
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

    def _share_machine(self) -> None:
        """Among several training processes on this machine: what this tuner does
        (:func:`~edgetune.runtime.processes.machine_share`); refused before any knob is set where another
        local rank tunes the board."""
        share = machine_share(self.processes, self.device, self._budget.current_w, own_gpu=self._own_gpu)
        if share.refusal is not None:
            raise RuntimeError(share.refusal)
        self._processes_measured = share.samples_factor
        if share.event is not None:
            self._event(share.event)
        if share.warning is not None:
            self._warn(share.warning, event=False)

    def _check_model_placement(self) -> None:
        """Warn where the user's model is not where the device measures
        (:func:`~edgetune.runtime.board.placement_warning`)."""
        line = placement_warning(self._model_device(), self.device)
        if line:
            self._warn(line, event=False)

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
        self._warn("the optimizer has a learning-rate scheduler edgetune was not given: its next step computes the "
                   "rate from base rates edgetune did not scale, undoing the scaling; pass tune(schedulers=[...]), "
                   "or tuner.add_scheduler(s) for one created inside the with block")

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
                restored_ok = self._knob_state.as_found(self.device)
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
            one_run.stopped(self)
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
            setting=self._knob_state.formatted(), knobs_restored=restored_ok, guard_moves=dict(self._guard_moves),
            knobs_failed={k: r.error for k, r in self._knob_state.refused.items()},
            unmeasured_steps=self.accounting.unmeasured_steps, unmeasured_s=self.accounting.unmeasured_s,
        )

    # -- the training target ----------------------------------------------------------------------------
    def _target_outcome(self, *, ended_normally: bool) -> TargetOutcome | None:
        """The run against its target; its row appended to the runs file where it stands as one run."""
        if self._tracker is None:
            return None
        return finish(self._tracker, self.accounting.steps, self.target_settings.runs_file, self._runs_workload,
                      ended_normally=ended_normally, seed=self.seed, lr=base_lr(self.optimizer, self.schedulers),
                      wall_s=time.perf_counter() - self._wall_start, device=self.device.name, on_unwritten=self._event)

    # -- the plan --------------------------------------------------------------------------------------
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
                self._warn(mismatch)
        if self._requested_batch is None or self._requested_batch == plan.batch_size:
            self._batch_size = plan.batch_size
        else:
            self._event(f"batch size {self._requested_batch} is in force, not the plan's {plan.batch_size}: "
                        f"the plan's power and speed were measured at {plan.batch_size}")
        lines = untuned_mismatch(plan, self._knob_state.original)  # warnings: measured in another state
        on = self._model_device()
        if on is not None and not dev.simulated:  # the twin models the step: where the model sits is moot
            lines += [line for line in [training_mismatch(plan, str(on))] if line]
        for line in lines:
            self._warn(line)
        unknown = sorted(set(plan.setting) - set(dev.knobs))
        if unknown:
            raise PlanError(f"plan {plan.path}: knob(s) {', '.join(unknown)} do not exist on {dev.name}; "
                            f"knobs here: {', '.join(dev.knobs) or 'none'}")
        if plan.budget_w is not None:
            self._guard.reference_budget_w = plan.budget_w
        self._apply(plan.setting, f"plan {plan.path}: batch size {self._batch_size}" if plan.path else
                    f"plan: batch size {self._batch_size}")
