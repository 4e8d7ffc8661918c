"""The knob registry: every knob name edgetune knows, with its unit and its role.

A *role* says what a knob does to the hardware, whatever a platform or a table calls it: the GPU clock,
the memory clock, the CPU clock, the online CPU cores, a power limit, a power mode. Code that reasons about
knobs (the hardware model's physics, the baseline of common practice, the runtime guard's ladder, table
column mapping) asks the registry for a role instead of spelling knob names.

A :class:`Candidate` is one point a training step can run at: a batch size and a value for each tuned knob.

Units are SI except where the kernel interface has its own (``cpu_freq`` in kHz, as cpufreq reports it).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgetune.power.base import KnobValue, format_value

__all__ = [
    "KNOBS",
    "BatchSizeError",
    "Candidate",
    "KnobRole",
    "KnobSpec",
    "check_batch_size",
    "governed_value",
    "knob_of_role",
    "knob_spec",
    "knob_unit",
    "reads_running_clock",
]


class KnobRole(enum.Enum):
    """What a knob controls."""

    GPU_CLOCK = "gpu_clock"
    MEMORY_CLOCK = "memory_clock"
    CPU_CLOCK = "cpu_clock"
    CPU_CORES = "cpu_cores"
    POWER_LIMIT = "power_limit"
    POWER_MODE = "power_mode"
    #: an on/off switch that pins the clocks at the current power mode's maximum (``jetson_clocks``):
    #: neither a frequency (not :attr:`is_clock`) nor a cap on the other knobs.
    CLOCK_LOCK = "clock_lock"

    @property
    def is_clock(self) -> bool:
        return self in (KnobRole.GPU_CLOCK, KnobRole.MEMORY_CLOCK, KnobRole.CPU_CLOCK)

    @property
    def caps_others(self) -> bool:
        """A categorical knob whose value caps the other knobs (a Jetson power mode)."""
        return self is KnobRole.POWER_MODE

    @property
    def keeps_memory(self) -> bool:
        """The memory a training step needs is the same at every value of a knob of this role. True of every
        role here: clocks, cores, a power limit, a power mode and the clock lock change how fast and how hot a
        step runs, not what it holds, so a batch size that ran out of memory at one setting runs out at every
        other (:mod:`edgetune.search.memory`). A role that changes it (a precision, a sequence length) says
        False, and the search then carries no out-of-memory across its values."""
        return True


@dataclass(frozen=True)
class KnobSpec:
    """A knob's canonical name, unit and role.

    Attributes:
        name: canonical name used in settings, best.json, tables and the config.
        unit: unit of its values (``Hz``, ``kHz``, ``cores``, ``W``; empty for named values: modes, off/on).
        role: what it controls.
        description: one line for help texts.
    """

    name: str
    unit: str
    role: KnobRole
    description: str

    def format(self, value: KnobValue) -> str:
        """The value with its unit, scaled for reading (``510 MHz``)."""
        return format_value(value, self.unit)


KNOBS: dict[str, KnobSpec] = {
    spec.name: spec
    for spec in (
        KnobSpec("gpu_freq", "Hz", KnobRole.GPU_CLOCK, "GPU clock (devfreq on Jetson, locked clocks on NVML)"),
        KnobSpec("emc_freq", "Hz", KnobRole.MEMORY_CLOCK, "Jetson external memory controller (EMC) clock"),
        KnobSpec("mem_freq", "Hz", KnobRole.MEMORY_CLOCK, "NVML memory clock"),
        KnobSpec("cpu_freq", "kHz", KnobRole.CPU_CLOCK, "CPU clock (cpufreq, in kHz as the kernel reports it)"),
        KnobSpec("cpu_cores", "cores", KnobRole.CPU_CORES, "online CPU cores"),
        KnobSpec("power_limit", "W", KnobRole.POWER_LIMIT, "board or GPU power limit (NVML)"),
        KnobSpec("power_mode", "", KnobRole.POWER_MODE, "nvpmodel power mode; caps the clocks under it"),
        KnobSpec("jetson_clocks", "", KnobRole.CLOCK_LOCK,
                 "jetson_clocks off/on: on pins CPU, GPU and EMC clocks at the power mode's maximum"),
    )
}


def knob_spec(name: str) -> KnobSpec | None:
    """The registry entry of knob ``name``, or None for a knob edgetune has no physics for."""
    return KNOBS.get(name)


def reads_running_clock(name: str) -> bool:
    """True for a clock knob: reading it gives the frequency running now (devfreq's and cpufreq's current
    frequency, NVML's current clock), which a governor moves from one read to the next unless the clock is
    locked, so a value read is not a state to compare."""
    spec = KNOBS.get(name)
    return spec is not None and spec.role.is_clock


def governed_value(values: Sequence[KnobValue], cap: KnobValue | None = None) -> KnobValue:
    """Where a governed clock runs under training load: the highest of ``values`` (ascending) at or below
    ``cap`` (its power mode's maximum; None: uncapped), the lowest where all are above it."""
    return max((v for v in values if cap is None or float(v) <= float(cap)), default=values[0])


def knob_unit(name: str, default: str = "") -> str:
    """The unit of knob ``name`` (``default`` when the registry does not know it)."""
    spec = KNOBS.get(name)
    return spec.unit if spec else default


def knob_of_role(names: Iterable[str], role: KnobRole, roles: Mapping[str, KnobRole] | None = None) -> str | None:
    """The first of ``names`` with ``role`` (``roles`` maps names the registry does not know, e.g. a
    table's own column names); None when none has it."""
    for name in names:
        r = (roles or {}).get(name) or (KNOBS[name].role if name in KNOBS else None)
        if r is role:
            return name
    return None


class BatchSizeError(ValueError):
    """A batch size that is not a positive whole number."""


def check_batch_size(value: Any, what: str = "batch size") -> int:
    """``value`` as an int when it is a positive whole number; :class:`BatchSizeError` (one line) if not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise BatchSizeError(f"{what} must be a positive whole number, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Candidate:
    """One point a training step can run at: a batch size and a value for every tuned knob."""

    batch_size: int
    setting: tuple[tuple[str, KnobValue], ...] = ()

    @classmethod
    def of(cls, batch_size: int, knobs: Mapping[str, KnobValue] | None = None) -> Candidate:
        """A candidate from a batch size and a knob mapping (knobs in the mapping's order)."""
        return cls(check_batch_size(batch_size), tuple((knobs or {}).items()))

    @property
    def knobs(self) -> dict[str, KnobValue]:
        return dict(self.setting)

    def describe(self, units: Mapping[str, str] | None = None) -> str:
        """``batch 32, gpu_freq 510 MHz, ...`` (units from ``units``, else the registry)."""
        units = units or {}
        parts = [f"batch {self.batch_size}"]
        parts += [f"{k} {format_value(v, units.get(k, knob_unit(k)))}" for k, v in self.setting]
        return ", ".join(parts)
