"""The budget guard's drive on a run: the ladder it stands on, its tick, the blind hold, its moves applied.

:class:`~edgetune.runtime.ladder_guard.LadderGuard` and the laws it composes decide; this drives them on the
:class:`~edgetune.runtime.controller.Tuner`: it builds the ladder around the chosen setting over the knobs the
run can write (:meth:`GuardDrive._build_guard`), runs the law on the ticker of the device clock with the tap's
averages (:meth:`GuardDrive._tick`; blind: :meth:`GuardDrive._sensor_reads`), and applies each move: the knobs
of the rung through the controller's write, or the batch size through the loader (:meth:`GuardDrive._guard_move`).

:class:`GuardDrive` is mixed into the :class:`~edgetune.runtime.controller.Tuner`, not a part of its own: each
tick reads and moves the whole run under the run's one lock (the tap and the monitor, the budget, the loader,
the online tuner, the knob state, the accounting, the events), and the ticker, the loader's resize and the
online tuner call back into the same object. Its class attributes name the run's state it uses; the Tuner
sets them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgetune.power.base import DeviceError
from edgetune.runtime.guard import Decision, GuardMove, Observation, build_ladder, frequency_prior

if TYPE_CHECKING:
    import threading
    from collections import Counter

    from edgetune.power.base import Device, KnobValue
    from edgetune.power.monitor import PowerMonitor
    from edgetune.runtime.accounting import Accounting, SampleTap
    from edgetune.runtime.budget import BudgetSource
    from edgetune.runtime.guard import GuardParams
    from edgetune.runtime.knob_state import KnobState
    from edgetune.runtime.ladder_guard import LadderGuard
    from edgetune.runtime.loader import BatchLoader
    from edgetune.runtime.online import OnlineTuner

__all__ = ["UNKNOWN_TOP_POWER_BUDGETS", "GuardDrive"]

#: with no maximum power from the device, the frequency prior's top rung draws this many budgets (only the
#: prior's scale: the guard's observations replace it)
UNKNOWN_TOP_POWER_BUDGETS = 1.5


class GuardDrive:
    """The guard's part of the :class:`~edgetune.runtime.controller.Tuner` (a mixin: see the module docs).

    Besides the state below, it calls the Tuner's ``budget_w``, ``batch_size``, ``set_budget``, ``_event``,
    ``_warn``, ``_write`` and ``_warn_failed``, and the step hooks' ``_follow`` and ``_run_state``
    (:class:`~edgetune.runtime.steps.StepHooks`).
    """

    # the run's state the drive reads and moves (the Tuner's)
    device: Device
    tap: SampleTap
    monitor: PowerMonitor
    accounting: Accounting
    loader: BatchLoader | None
    online: OnlineTuner | None
    guard_params: GuardParams
    _lock: threading.RLock
    _budget: BudgetSource
    _knob_state: KnobState
    _guard: LadderGuard
    _guard_enabled: bool
    #: the guard runs the law (enabled, knobs to set, a ladder of two rungs or more)
    _guard_active: bool
    #: device time the guard went blind (no power reading for ``blind_s``), None while the sensor reads
    _blind_since: float | None
    _guard_moves: Counter[GuardMove]
    _virtual: bool
    _ticks: int
    _update_every: int
    _started_t: float

    def _build_guard(self) -> None:
        """The ladder around the chosen setting (the anchor), the prior power model, the law's state at the
        rung in force (after a batch change the guard may be below the anchor: it stays there)."""
        dev = self.device
        knobs = self._knob_state
        ladder = build_ladder(knobs.settable(), self._guard.anchor or knobs.setting) if not dev.measure_only \
            else [dict(knobs.setting)]
        # one setting reachable (no knob settable here, or none left): the batch size alone, where the loop takes
        # its batches from tuner.loader; else the guard only reports
        self._guard_active = self._guard_enabled and (len(ladder) >= 2 or self.loader is not None)
        if not self._guard_active:
            if self._guard_enabled and not dev.measure_only:
                self._event("guard: only one setting is reachable; the guard only reports")
            return
        if len(ladder) < 2 and self._guard.ladder != ladder:
            self._event("guard: no knob it can set here: it holds the budget by the batch size alone (tuner.loader)")
        self._guard.ladder = ladder
        idle = dev.idle_power_w if dev.idle_power_w is not None else 0.0
        top = dev.max_power_w if dev.max_power_w is not None else UNKNOWN_TOP_POWER_BUDGETS * self.budget_w
        prior = (self.online.ladder_prior(ladder, self.batch_size, dev.knobs, dev.idle_power_w or 0.0)
                 if self.online is not None else None)
        # the fast window must first fill with this setting's power (at the start: not the idle before it)
        self._guard.reset(ladder, prior or frequency_prior(ladder, dev.knobs, idle, top), knobs.setting,
                          self.budget_w, dev.clock.now())

    def _guard_goes_on(self) -> str:
        """What the guard holds the budget with once a knob failed (the Tuner's ``_knob_failed``): the knobs
        its ladder moves without the failed ones, and the batch size where the batches come from the loader."""
        if not (self._guard_enabled and not self.device.measure_only):
            return ""
        knobs = self._knob_state
        ladder = build_ladder(knobs.settable(), self._guard.anchor or knobs.setting)
        if len(ladder) < 2:
            return ("; no other knob is left to the guard: it goes on with the batch size alone"
                    if self.loader is not None else "; no other knob is left to the guard: it only reports from now on")
        means = [k for k in ladder[0] if any(rung[k] != ladder[0][k] for rung in ladder)]
        if self.loader is not None:
            means.append("the batch size")
        return f"; the guard goes on with {', '.join(means[:-1])} and {means[-1]}" if len(means) > 1 else \
            f"; the guard goes on with {means[0]}"

    def _tick(self) -> None:
        """One guard tick on the device clock: budget file, the control law, the accounting."""
        with self._lock:
            try:
                if self._budget.path is not None:
                    self._poll_budget_file()
                if self._knob_state.refused:  # a knob whose write failed: its back-off may have passed
                    self._readmit(self.device.clock.now())
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

    def _readmit(self, t: float) -> None:
        """The knobs whose write failed and whose back-off has passed at device time ``t`` go back into the
        ladder on trial (:meth:`~edgetune.runtime.knob_state.KnobState.readmit`): the next move that sets one
        tries it (the Tuner's ``_write``: back, or out again with the back-off doubled). The guard restarts at the
        rung in force; where the setting in force is no rung of the new ladder (the guard had moved the other
        knobs below the chosen setting) it moves to the highest rung at or under it in every knob, so its state
        is the clocks in force and the power does not rise."""
        knobs = self._knob_state
        due = knobs.due(t)
        if not due:
            return
        knobs.readmit(due)
        tries = ", ".join(f"{k} ({knobs.refused[k].next_try})" for k in due)
        self._event(f"guard: {tries} back in the ladder on trial: the next move that sets it tries its write")
        self._build_guard()
        while self._guard_active and self._guard.ready and not self._aligned():
            pass

    def _aligned(self) -> bool:
        """Whether the guard's rung is the setting in force; else move to the highest rung at or under it in
        every knob (False where a knob's write failed on the way: the ladder is rebuilt without it, to be
        checked again)."""
        # a clock the run has not written as its governor runs it (on a board it reads the frequency running now)
        ladder, setting = self._guard.ladder, self._knob_state.governed()
        assert self._guard.state is not None
        if all(setting.get(k) == v for k, v in ladder[self._guard.state.rung].items()):
            return True

        def at_or_under(k: str, v: KnobValue) -> bool:
            now = setting.get(k)
            return v == now or (isinstance(v, (int, float)) and isinstance(now, (int, float)) and v <= now)

        under = max((i for i, rung in enumerate(ladder) if all(at_or_under(k, v) for k, v in rung.items())),
                    default=0)
        changes = self._knob_state.rung_changes(ladder[under])
        failure = self._write(changes)
        self._event(f"guard: to the highest rung at or under the setting in force: "
                    f"{self._knob_state.written_text(changes, failure)}")
        if failure is not None:
            self._warn_failed(failure)
            self._build_guard()
            return False
        self._guard.reset(ladder, self._guard.model, self._knob_state.setting, self.budget_w, self.device.clock.now())
        return True

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
            self._warn(f"guard {decision.reason} (device {self.device.name})", event=False)  # the move is the event
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
        """Apply the guard's move; False where a knob's write failed (the Tuner's ``_knob_failed``): the guard
        then starts again at the setting in force, on a ladder without that knob."""
        if decision.batch_move:
            # the loader draws its next batch at the new size (not waiting for an epoch: the budget cannot
            # wait) and scales the learning rate when that batch reaches the loop (_on_resize)
            assert self.loader is not None and decision.batch_size is not None
            self._event(f"guard {self._reason(decision)}")
            self._guard_moves[decision.kind] += 1
            self.loader.resize_now(decision.batch_size)
            return True
        changes = self._knob_state.rung_changes(self._guard.ladder[decision.rung])
        reason = self._reason(decision)  # before the write: a knob failing now is no part of this decision
        failure = self._write(changes)
        self._event(f"guard {reason}: {self._knob_state.written_text(changes, failure)}")
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
        failed = self._knob_state.failed
        if decision.infeasible and failed:
            return f"{decision.reason} ({', '.join(failed)} left as it is: its write failed)"
        if decision.infeasible and len(self._guard.ladder) < 2:
            return f"{decision.reason} (the only one: no knob the guard can set here)"
        return decision.reason

    def _poll_budget_file(self) -> None:
        reading = self._budget.poll()
        if reading is None:
            return
        if reading.watts is None:
            self._event(reading.problem(self.budget_w))
        elif reading.watts != self.budget_w:
            self.set_budget(reading.watts, why=f"budget file {reading.path}")
