"""``trace:<table.csv>``: replay a measurement table as a device.

The table (format in :mod:`edgetune.tables`) lists step time and power per knob setting (and batch size),
as measured on real hardware (e.g. the Zeus NSDI'23 GPU traces, ``experiments/data/zeus-nsdi23``, or a
Jetson clock sweep). The device's knobs are the table's knob columns (registry names and units), with the
values the table holds; a training step at the current setting and batch size takes the row's step time on
a virtual clock and draws the row's power while it runs. A setting or a batch size that the table lacks
raises :class:`DeviceError` naming what the table has; one the table records as out of memory
(:attr:`edgetune.tables.Table.out_of_memory`) raises :class:`DeviceOutOfMemoryError`, as the board did.
Those are not in the search's space (:meth:`TraceReplay.candidates`: the measured rows).

Replays behave like measurements:

* **Noise per window.** Each measurement window (a run of steps at one row with no knob written in
  between: every trial of a search, which applies its setting first, is a new window) draws its step time
  and its power once, log-normally around the row's median with the row's relative spread
  (:meth:`edgetune.tables.Table.spread`: the row's repeats, else the declared default, else the table's
  repeated rows, else the Zeus-derived default of 3.1% time / 1.6% power). The draw comes from an RNG seeded
  by ``(seed, row, visit)``: the k-th window at a row gives the same figures whatever else ran.
  ``noise=False`` replays the medians exactly.
* **Sensor update period.** The sensor reports the power at its last update instant, held until the next
  (``sensor_period_s``: the table's declaration, else :data:`DEFAULT_SENSOR_PERIOD_S`).
* **Convergence is not free.** :meth:`TraceReplay.epochs_to_target` gives a batch size's epochs to target
  only once a step has run at it (the table's convergence runs stand in for training at that batch size),
  unless ``known_convergence=True``: the setting of a recurring job, whose earlier runs measured every
  batch size.

A table without batch sizes is a fixed-batch sweep: the replay runs it at the declared
``default_batch_size``, or, where none is declared, at the first batch size it is asked for (others are
refused: the table measured one batch size).

``device.backend`` is the :class:`TraceReplay`: its rows as :class:`~edgetune.power.knobs.Candidate`\\ s (a
search's space), the table's oracle (the best row under a power budget) for reports of how close a search
came, and the epochs to target a search may see.

Traces carry no idle measurement: between steps the device draws ``idle_power_w`` (default: the lowest
power in the table, an upper bound of true idle). Power inside a step is constant: a trace holds no
within-step shape, so the peak equals the window's power unless the table has ``peak_power_w`` (reported,
not replayed).
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgetune.power.base import (
    Capability,
    Device,
    DeviceError,
    DeviceOutOfMemoryError,
    Knob,
    PowerReading,
    WorkloadCost,
)
from edgetune.power.clock import VirtualClock
from edgetune.power.knobs import Candidate, knob_unit
from edgetune.power.registry import PlatformProbe
from edgetune.tables import Table, TableError, load_table

__all__ = ["DEFAULT_SENSOR_PERIOD_S", "OracleRow", "TraceReplay", "TraceSensor", "open", "probe", "starting_setting"]

T = TypeVar("T")

DEFAULT_SENSOR_PERIOD_S = 0.01  # NVML refreshes GPU power about every 10-20 ms; tables may declare their own
_SEED_SALT = 0x7ACE  # separates the replay's noise stream from other users of the same seed
#: A replay runs on a virtual clock, replays a table, and stands for the training run it measured.
CAPABILITIES = frozenset({Capability.VIRTUAL_CLOCK, Capability.TABLE_REPLAY, Capability.SKIPS_STEP})


@dataclass(frozen=True)
class OracleRow:
    """The best row of a table under a budget: its setting, batch size and what it costs."""

    setting: dict[str, float]
    batch_size: int
    step_time_s: float
    power_w: float
    time_to_target_s: float
    energy_to_target_j: float


class TraceSensor:
    """Power on the replay's virtual clock: the value at the last update instant, held until the next."""

    rails: tuple[str, ...] = ("total",)
    total_label = "total (replayed from the table)"

    def __init__(self, replay: TraceReplay, update_period_s: float) -> None:
        self._replay = replay
        self.update_period_s = float(update_period_s)

    def read(self) -> PowerReading:
        now = self._replay.clock.now()
        # 1e-9 keeps an update instant that float rounding puts a hair below k * period at k
        k = math.floor(now / self.update_period_s + 1e-9)
        p = self._replay.power_at(k * self.update_period_s)
        return PowerReading(now, p, {"total": p})

    def energy_j(self) -> float | None:
        return self._replay.energy_at(self._replay.clock.now())


def starting_setting(table: Table) -> dict[str, float]:
    """The knob values a replay of ``table`` starts at: each knob's largest (a board found at its highest clocks
    and limits). A search leaves the knobs it does not tune there (a knob with one value is never tuned), so a
    searched row is its tuned knobs' values on top of these."""
    return {k: max(table.knob_values(k)) for k in table.knobs}


class TraceReplay:
    """A table replayed on a virtual clock (the backend of a ``trace:`` device).

    Args:
        table: the measurement table; it needs absolute step times (``step_time_s``, or
            ``time_per_epoch_s`` with ``samples_per_epoch`` and batch sizes).
        compute: whether :meth:`run_step` calls the training step itself (False: only time and power).
        idle_power_w: power between steps.
        seed: seeds the per-window noise.
        noise: draw each window's time and power from the row's spread (False: the medians exactly).
        known_convergence: every batch size's epochs to target is known from the start (a recurring job);
            False: only those of batch sizes that have run.
        sensor_period_s: the sensor's update period (default: the table's declaration, else
            :data:`DEFAULT_SENSOR_PERIOD_S`).
        batch_size: for a table without batch sizes, the batch size it stands for (default: the declared
            ``default_batch_size``, else the first batch size run).
    """

    def __init__(self, table: Table, compute: bool = True, idle_power_w: float | None = None, *, seed: int = 0,
                 noise: bool = True, known_convergence: bool = False, sensor_period_s: float | None = None,
                 batch_size: int | None = None) -> None:
        if not table.has_absolute_step_time:
            fix = ("add a samples_per_epoch column" if table.batch_size is not None else
                   "add a step_time_s column (or declare default_batch_size and add samples_per_epoch)")
            raise DeviceError(f"{table.source}: a trace needs step times in seconds; the table gives "
                              f"time_per_epoch_s only: {fix}")
        period = sensor_period_s if sensor_period_s is not None else table.declared.sensor_period_s
        period = DEFAULT_SENSOR_PERIOD_S if period is None else float(period)
        if not (math.isfinite(period) and period > 0):
            raise DeviceError(f"sensor_period_s must be a positive number of seconds, got {period!r}")
        self.table = table
        self.compute = bool(compute)
        self.seed = int(seed)
        self.noise = bool(noise)
        self.known_convergence = bool(known_convergence)
        self.clock = VirtualClock()
        self.idle_power_w = float(idle_power_w if idle_power_w is not None else table.power_w.min())
        self._fixed_batch = batch_size if batch_size is not None else (
            table.default_batch_size if table.batch_size is None else None)
        self._step_time = table.step_time()
        self._spread = table.spread()
        self._values: dict[str, float] = starting_setting(table)
        self._writes = 0  # knob writes so far: a write ends the current measurement window
        self.knobs: dict[str, Knob] = {
            name: Knob(name, knob_unit(name), table.knob_values(name),
                       read=lambda name=name: self._values[name],
                       write=lambda v, name=name: self._write(name, v),
                       description=f"{name} column of {os.path.basename(table.source)}")
            for name in table.knobs
        }
        self.sensor = TraceSensor(self, period)
        # (start, end, power) of recent steps, newest last; older ones are dropped once no reading can see them
        self._steps: deque[tuple[float, float, float]] = deque()
        self._energy = 0.0  # energy up to _t_mark
        self._t_mark = 0.0
        self._window: tuple[int, int] | None = None  # (row, knob writes) of the current window
        self._draw = (0.0, 0.0)  # the current window's (step time, power)
        self._visits = np.zeros(len(table), dtype=int)  # windows opened per row
        self._measured: set[int] = set()
        self.steps = 0

    def _write(self, name: str, value: Any) -> None:
        self._values[name] = float(value)
        self._writes += 1

    # -- the table as a search space ------------------------------------------------------------------
    def _row_batch(self, i: int, batch_size: int | None = None) -> int:
        """Batch size of row ``i`` (a fixed-batch table: ``batch_size``, else the one it stands for)."""
        if self.table.batch_size is not None:
            return int(self.table.batch_size[i])
        b = batch_size if batch_size is not None else self._fixed_batch
        if b is None:
            raise DeviceError(f"trace {self.table.source} is a fixed-batch sweep with no declared batch size: pass "
                              f"the job's batch size, or declare '# edgetune: default_batch_size=<B>' in the table")
        return b

    def candidates(self, batch_size: int | None = None) -> list[Candidate]:
        """The measured settings, one :class:`Candidate` per row (table order): the space a search on this
        trace can measure. ``batch_size`` keeps the rows of that batch size; a table without batch sizes
        labels its rows with it (default: the batch size this replay stands for)."""
        t = self.table
        if t.batch_size is None:
            return [Candidate.of(self._row_batch(i, batch_size), t.setting(i)) for i in range(len(t))]
        rows = range(len(t)) if batch_size is None else np.flatnonzero(t.batch_size == batch_size)
        return [Candidate.of(int(t.batch_size[i]), t.setting(i)) for i in rows]

    @property
    def default_batch_size(self) -> int | None:
        """The table's declared untuned batch size (the baseline's), or None."""
        return self.table.default_batch_size

    @property
    def measured_batch_sizes(self) -> frozenset[int]:
        """Batch sizes at which a step has run (their epochs to target are visible)."""
        return frozenset(self._measured)

    def convergence_note(self) -> str:
        """One line for reports: which batch sizes' epochs to target a search sees, and why."""
        name = os.path.basename(self.table.source)
        if self.table.epochs_to_target is None:
            return f"convergence: {name} has no epochs_to_target column"
        if self.known_convergence:
            return (f"convergence: epochs to target of every batch size in {name} known from the start "
                    f"(known convergence: a recurring job whose earlier runs measured them)")
        return (f"convergence: epochs to target of a batch size in {name} seen only once it has been measured "
                f"(use known convergence for a recurring job)")

    # -- table look-up ---------------------------------------------------------------------------
    def _check_batch(self, batch_size: int, pin: bool = False) -> None:
        """Refuse a batch size other than a fixed-batch table's; ``pin``: the first one run becomes it."""
        if self.table.batch_size is not None:
            return
        if pin and self._fixed_batch is None:
            self._fixed_batch = batch_size
        if self._fixed_batch is not None and batch_size != self._fixed_batch:
            raise DeviceError(f"trace {self.table.source} is a fixed-batch sweep at batch size {self._fixed_batch}; "
                              f"it cannot replay batch size {batch_size}")

    def row(self, setting: Mapping[str, float] | None, batch_size: int) -> int:
        """Row index for a setting (default: the current one) and batch size, or :class:`DeviceError`."""
        setting = dict(self._values if setting is None else setting)
        self._check_batch(batch_size)
        i = self.table.find(setting, batch_size)
        if i is not None:
            return i
        where = ", ".join(f"{k}={v:g}" for k, v in setting.items())
        if self.table.ran_out_of_memory(setting, batch_size):
            raise DeviceOutOfMemoryError(f"out of memory: trace {self.table.source} records {where} at batch size "
                                         f"{batch_size} as out of memory")
        if self.table.batch_size is None:
            have = "; ".join(", ".join(f"{k}={v:g}" for k, v in self.table.setting(j).items())
                             for j in range(min(6, len(self.table))))
            raise DeviceError(f"trace {self.table.source} has no row for {where}; measured: {have}"
                              f"{' ...' if len(self.table) > 6 else ''}")
        if batch_size not in self.table.batch_sizes:
            raise DeviceError(f"trace {self.table.source} has no rows for batch size {batch_size}; measured "
                              f"batch sizes: {', '.join(map(str, self.table.batch_sizes))}")
        same_b = self.table.batch_size == batch_size
        have = "; ".join(", ".join(f"{k}={v:g}" for k, v in self.table.setting(j).items())
                         for j in np.flatnonzero(same_b)[:6])
        raise DeviceError(f"trace {self.table.source} has no row for {where} at batch size {batch_size}; "
                          f"measured there: {have}{' ...' if same_b.sum() > 6 else ''}")

    def epochs_to_target(self, batch_size: int) -> float | None:
        """The table's epochs to target at a batch size as a search may see it.

        Returns ``inf`` (never reached in the table's runs) or a number of epochs; None where the search
        cannot know it: the batch size has not run yet (unless ``known_convergence``), or the table has no
        convergence data there. :class:`DeviceError` for a batch size the table lacks.
        """
        t = self.table
        if t.batch_size is None:
            rows = np.arange(len(t)) if batch_size == self._fixed_batch or self._fixed_batch is None else []
        else:
            rows = np.flatnonzero(t.batch_size == batch_size)
        if len(rows) == 0:
            have = ", ".join(map(str, t.batch_sizes)) or str(self._fixed_batch)
            raise DeviceError(f"trace {t.source} has no rows for batch size {batch_size}; measured batch sizes: "
                              f"{have}")
        if t.epochs_to_target is None or not (self.known_convergence or batch_size in self._measured):
            return None
        e = float(t.epochs_to_target[rows[0]])
        return None if math.isnan(e) else e

    def oracle(self, budget_w: float | None = None, objective: str = "time") -> OracleRow | None:
        """The table's best row under ``budget_w`` (median power) by time or energy to target."""
        i = self.table.oracle(budget_w, objective)
        if i is None:
            return None
        return OracleRow(setting=self.table.setting(i), batch_size=self._row_batch(i),
                         step_time_s=float(self._step_time[i]), power_w=float(self.table.power_w[i]),
                         time_to_target_s=float(self.table.time_to_target_s()[i]),
                         energy_to_target_j=float(self.table.energy_to_target_j()[i]))

    # -- running ---------------------------------------------------------------------------------
    def _window_figures(self, i: int) -> tuple[float, float]:
        """Step time and power of the window at row ``i``: drawn when a new window opens, else the current."""
        key = (i, self._writes)
        if key == self._window:
            return self._draw
        self._window = key
        visit = int(self._visits[i])
        self._visits[i] += 1
        dt, p = float(self._step_time[i]), float(self.table.power_w[i])
        if self.noise:
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, _SEED_SALT, i, visit])
            z_t, z_p = rng.standard_normal(2)
            dt *= math.exp(float(self._spread.time_cv[i]) * z_t)  # log-normal: the median stays the table's
            p *= math.exp(float(self._spread.power_cv[i]) * z_p)
        self._draw = (dt, p)
        return self._draw

    def run_step(self, fn: Callable[[], T], batch_size: int, cost: WorkloadCost | None = None) -> T | None:
        """Run one step: the window's step time passes on the virtual clock at the window's power."""
        b = int(batch_size)
        self._check_batch(b, pin=True)
        i = self.row(None, b)
        result = fn() if self.compute else None
        start = self.clock.now()
        self._energy = self.energy_at(start)
        self._t_mark = start
        dt, p = self._window_figures(i)
        self._steps.append((start, start + dt, p))
        horizon = start - 2.0 * self.sensor.update_period_s  # older steps can never be read again
        while len(self._steps) > 1 and self._steps[0][1] < horizon:
            self._steps.popleft()
        self._measured.add(b)
        self.steps += 1
        self.clock.advance(dt)
        return result

    def power_at(self, t: float) -> float:
        # the end instant counts as the step's: with steps back to back a reading there belongs to the run,
        # not to a zero-length idle gap (it would add spurious spread to what the search reads)
        for start, end, p in reversed(self._steps):
            if start <= t <= end:
                return p
            if end < t:
                break
        return self.idle_power_w

    def energy_at(self, t: float) -> float:
        """Exact cumulative energy from the start of the replay to ``t`` (``t`` not before the last step)."""
        if self._steps and t >= self._steps[-1][0]:
            start, end, p = self._steps[-1]
            return self._energy + p * (min(t, end) - start) + self.idle_power_w * max(0.0, t - end)
        return self._energy + self.idle_power_w * max(0.0, t - self._t_mark)

    def device(self, name: str) -> Device:
        t = self.table
        batches = (f"batch sizes {', '.join(map(str, t.batch_sizes))}" if t.batch_size is not None else
                   f"fixed batch {self._fixed_batch if self._fixed_batch is not None else '(not declared)'}")
        noise = (f"each window draws time and power from the rows' spread ({self._spread.source}; seed "
                 f"{self.seed})" if self.noise else "no noise: every window replays the rows' medians")
        return Device(
            name=name,
            description=f"replay of {os.path.basename(t.source)} ({len(t)} measured settings, {batches}, "
                        f"knobs: {', '.join(t.knobs) or 'none'})",
            simulated=True,
            knobs=self.knobs,
            sensor=self.sensor,
            clock=self.clock,
            run_step=self.run_step,  # type: ignore[arg-type]
            idle_power=lambda: self.idle_power_w,
            max_power_w=float(t.power_w.max()),  # the medians: a noisy window may draw a little more
            notes=[(f"trace replay: time and power are the table's measurements ({len(t)} settings); "
                    f"settings or batch sizes outside the table cannot run"),
                   f"trace noise: {noise}; sensor updates every {self.sensor.update_period_s * 1000:g} ms",
                   self.convergence_note(), *t.notes[:2]],
            backend=self,
            capabilities=CAPABILITIES,
        )


def open(arg: str = "", compute: bool = True, idle_power_w: float | None = None, seed: int = 0, noise: bool = True,
         known_convergence: bool = False, sensor_period_s: float | None = None, batch_size: int | None = None,
         **_: Any) -> Device:
    """``trace:<table.csv>``: a device that replays the table (options: see :class:`TraceReplay`)."""
    path = arg.strip()
    if not path:
        raise DeviceError("trace needs a table: use --device trace:<table.csv>")
    try:
        table = load_table(path)
    except TableError as exc:
        raise DeviceError(str(exc)) from None
    replay = TraceReplay(table, compute=compute, idle_power_w=idle_power_w, seed=seed, noise=noise,
                         known_convergence=known_convergence, sensor_period_s=sensor_period_s,
                         batch_size=batch_size)
    return replay.device(f"trace:{path}")


def probe() -> list[PlatformProbe]:
    """Traces are opened by name only; nothing to detect."""
    return [PlatformProbe("trace", False, summary="replays a measurement table: use --device trace:<table.csv>")]
