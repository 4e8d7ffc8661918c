"""``trace:<table.csv>``: replay a measurement table as a device.

The table (format in :mod:`edgetune.tables`) lists step time and power per (knob setting, batch size), as
measured on real hardware (e.g. the Zeus NSDI'23 GPU traces, ``experiments/data/zeus-nsdi23``). The
device's knobs are the table's knob columns, with the values the table holds; a training step at the
current setting and batch size takes the table's step time on a virtual clock and draws the table's mean
power while it runs, so a search against it measures exactly what the hardware measured. A setting or a
batch size that the table lacks raises :class:`DeviceError` naming what the table has.

``device.backend`` is the :class:`TraceReplay`, which also offers the table's own oracle (the best row
under a power budget) for reports of how close a search came.

Traces carry no idle measurement: between steps the device draws ``idle_power_w`` (default: the lowest
power in the table, an upper bound of true idle). Power inside a step is the table's mean: a trace holds no
within-step shape, so the peak equals the mean unless the table has ``peak_power_w`` (reported, not
replayed).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from edgetune.power.base import (
    Capability,
    Device,
    DeviceError,
    Knob,
    PowerReading,
    VirtualClock,
    WorkloadCost,
)
from edgetune.power.knobs import knob_unit
from edgetune.power.registry import PlatformProbe
from edgetune.tables import Table, TableError, load_table

__all__ = ["TraceReplay", "TraceSensor", "open", "probe"]

T = TypeVar("T")

SENSOR_PERIOD_S = 0.01  # NVML refreshes GPU power about every 10-20 ms
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
    """Power on the replay's virtual clock: the running step's table power, else idle."""

    rails: tuple[str, ...] = ("total",)
    total_label = "total (replayed from the table)"
    update_period_s = SENSOR_PERIOD_S

    def __init__(self, replay: TraceReplay) -> None:
        self._replay = replay

    def read(self) -> PowerReading:
        now = self._replay.clock.now()
        p = self._replay.power_at(now)
        return PowerReading(now, p, {"total": p})

    def energy_j(self) -> float | None:
        return self._replay.energy_at(self._replay.clock.now())


class TraceReplay:
    """A table replayed on a virtual clock (the backend of a ``trace:`` device).

    Args:
        table: the measurement table; it needs absolute step times (``step_time_s``, or
            ``time_per_epoch_s`` with ``samples_per_epoch``).
        compute: whether :meth:`run_step` calls the training step itself (False: only time and power).
        idle_power_w: power between steps.
    """

    def __init__(self, table: Table, compute: bool = True, idle_power_w: float | None = None) -> None:
        if not table.has_absolute_step_time:
            raise DeviceError(f"{table.source}: a trace needs step times in seconds; the table gives "
                              f"time_per_epoch_s only: add a samples_per_epoch column")
        self.table = table
        self.compute = bool(compute)
        self.clock = VirtualClock()
        self.idle_power_w = float(idle_power_w if idle_power_w is not None else table.power_w.min())
        self._step_time = table.step_time()
        self._values: dict[str, float] = {k: max(table.knob_values(k)) for k in table.knobs}
        self.knobs: dict[str, Knob] = {
            name: Knob(name, knob_unit(name), table.knob_values(name),
                       read=lambda name=name: self._values[name],
                       write=lambda v, name=name: self._values.__setitem__(name, float(v)),
                       description=f"{name} column of {os.path.basename(table.source)}")
            for name in table.knobs
        }
        self.sensor = TraceSensor(self)
        self._step: tuple[float, float, float] | None = None  # (start, end, power) of the last step
        self._energy = 0.0  # energy up to _t_mark
        self._t_mark = 0.0
        self.steps = 0

    # -- table look-up ---------------------------------------------------------------------------
    def row(self, setting: dict[str, float] | None, batch_size: int) -> int:
        """Row index for a setting (default: the current one) and batch size, or :class:`DeviceError`."""
        setting = dict(self._values if setting is None else setting)
        i = self.table.find(setting, batch_size)
        if i is not None:
            return i
        where = ", ".join(f"{k}={v:g}" for k, v in setting.items())
        if batch_size not in self.table.batch_sizes:
            raise DeviceError(f"trace {self.table.source} has no rows for batch size {batch_size}; measured "
                              f"batch sizes: {', '.join(map(str, self.table.batch_sizes))}")
        same_b = self.table.batch_size == batch_size
        have = "; ".join(", ".join(f"{k}={v:g}" for k, v in self.table.setting(j).items())
                         for j in np.flatnonzero(same_b)[:6])
        raise DeviceError(f"trace {self.table.source} has no row for {where} at batch size {batch_size}; "
                          f"measured there: {have}{' ...' if same_b.sum() > 6 else ''}")

    def epochs_to_target(self, batch_size: int) -> float:
        """The table's epochs to target at a batch size (``inf``: never reached; ``nan``: not measured)."""
        if self.table.epochs_to_target is None:
            raise DeviceError(f"trace {self.table.source} has no epochs_to_target column")
        rows = np.flatnonzero(self.table.batch_size == batch_size)
        if rows.size == 0:
            raise DeviceError(f"trace {self.table.source} has no rows for batch size {batch_size}")
        return float(self.table.epochs_to_target[rows[0]])

    def oracle(self, budget_w: float | None = None, objective: str = "time") -> OracleRow | None:
        """The table's best row under ``budget_w`` (mean power) by time or energy to target."""
        i = self.table.oracle(budget_w, objective)
        if i is None:
            return None
        return OracleRow(setting=self.table.setting(i), batch_size=int(self.table.batch_size[i]),
                         step_time_s=float(self._step_time[i]), power_w=float(self.table.power_w[i]),
                         time_to_target_s=float(self.table.time_to_target_s()[i]),
                         energy_to_target_j=float(self.table.energy_to_target_j()[i]))

    # -- running ---------------------------------------------------------------------------------
    def run_step(self, fn: Callable[[], T], batch_size: int, cost: WorkloadCost | None = None) -> T | None:
        """Run one step: the table's step time passes on the virtual clock at the table's power."""
        i = self.row(None, int(batch_size))
        result = fn() if self.compute else None
        start = self.clock.now()
        self._energy = self.energy_at(start)
        self._t_mark = start
        dt, p = float(self._step_time[i]), float(self.table.power_w[i])
        self._step = (start, start + dt, p)
        self.steps += 1
        self.clock.advance(dt)
        return result

    def power_at(self, t: float) -> float:
        # the end instant counts as the step's: with steps back to back a reading there belongs to the run,
        # not to a zero-length idle gap (it would add spurious spread to what the search reads)
        if self._step is not None and self._step[0] <= t <= self._step[1]:
            return self._step[2]
        return self.idle_power_w

    def energy_at(self, t: float) -> float:
        """Exact cumulative energy from the start of the replay to ``t`` (``t`` not before the last step)."""
        if self._step is not None and t >= self._step[0]:
            start, end, p = self._step
            return self._energy + p * (min(t, end) - start) + self.idle_power_w * max(0.0, t - end)
        return self._energy + self.idle_power_w * max(0.0, t - self._t_mark)

    def device(self, name: str) -> Device:
        return Device(
            name=name,
            description=f"replay of {os.path.basename(self.table.source)} ({len(self.table)} measured rows, "
                        f"knobs: {', '.join(self.table.knobs) or 'none'})",
            simulated=True,
            knobs=self.knobs,
            sensor=self.sensor,
            clock=self.clock,
            run_step=self.run_step,  # type: ignore[arg-type]
            idle_power=lambda: self.idle_power_w,
            max_power_w=float(self.table.power_w.max()),
            notes=[(f"trace replay: time and power are the table's measurements ({len(self.table)} rows); "
                    f"settings or batch sizes outside the table cannot run"), *self.table.notes[:2]],
            backend=self,
            capabilities=CAPABILITIES,
        )


def open(arg: str = "", compute: bool = True, idle_power_w: float | None = None, **_: Any) -> Device:
    """``trace:<table.csv>``: a device that replays the table."""
    path = arg.strip()
    if not path:
        raise DeviceError("trace needs a table: use --device trace:<table.csv>")
    try:
        table = load_table(path)
    except TableError as exc:
        raise DeviceError(str(exc)) from None
    return TraceReplay(table, compute=compute, idle_power_w=idle_power_w).device(f"trace:{path}")


def probe() -> list[PlatformProbe]:
    """Traces are opened by name only; nothing to detect."""
    return [PlatformProbe("trace", False, summary="replays a measurement table: use --device trace:<table.csv>")]
