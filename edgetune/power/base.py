"""The one hardware interface every platform implements.

A :class:`Device` is a bundle of three things, each small and swappable:

* :class:`Knob` - a discrete, named DVFS setting (GPU frequency, EMC frequency, CPU frequency, online
  CPU cores, nvpmodel power mode, power limit ...) with its unit, its sorted allowed values, read, set
  and restore of the value it had before edgetune first changed it;
* :class:`PowerSensor` - board total and per-rail power in watts, timestamped on the device clock, and an
  energy counter where the hardware keeps one;
* :class:`~edgetune.power.clock.Clock` - real time on hardware, virtual time on the simulated twin
  (:mod:`edgetune.power.clock`).

Platforms (``jetson``, ``nvml``, ``rapl``, ``sim``, ``trace``) build Devices from these parts. This module
knows nothing of tuning, and nothing of any one platform.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from edgetune.log import get_logger

# the clocks live in edgetune.power.clock; importing them from here keeps working
from edgetune.power.clock import Clock, RealClock, VirtualClock

KnobValue = int | float | str
T = TypeVar("T")

_log = get_logger(__name__)

#: Relative tolerance within which a number matches a table value (float rounding of parsed text, 918e6).
_VALUE_MATCH_REL = 1e-9

__all__ = [
    "CPU_COMPUTE",
    "DERIVED_PREFIX",
    "MODE_KNOB",
    "ApplyError",
    "Capability",
    "Clock",
    "ComputeDevice",
    "Device",
    "DeviceError",
    "DeviceOutOfMemoryError",
    "Knob",
    "KnobValue",
    "KnobValueError",
    "KnobWriteError",
    "ModeCaps",
    "PowerReading",
    "PowerSensor",
    "RealClock",
    "RestoreError",
    "SensorError",
    "VirtualClock",
    "WorkloadCost",
    "format_value",
    "largest_at_most",
    "restore_order",
    "summed_channels",
    "wrong_unit",
]


class DeviceError(RuntimeError):
    """A hardware-layer failure with a one-line, user-facing message."""


class SensorError(DeviceError):
    """The power sensor gives no usable reading (none valid, or none above zero, under load)."""


class KnobValueError(DeviceError, ValueError):
    """A value that is not in the knob's table of allowed values."""


class KnobWriteError(DeviceError):
    """The platform rejected a knob write (permission, kernel refusal, NVML error)."""


class ApplyError(KnobWriteError):
    """:meth:`Device.apply` stopped at a knob whose write failed: the knobs written before it are in force, the
    ones after it were not written. Its message is that knob's own one-line error.

    The failed knob is where its platform leaves a refused write: a plain :class:`Knob` as it was, a
    :class:`~edgetune.power.state.RestorableKnob` put back as found (:attr:`Knob.original` None again; its
    message then says so, or that restoring failed too).

    Attributes:
        knob: the knob whose write failed.
        value: the value it was to take.
        applied: the knobs written before it, with the values now in force (in the order written).
        error: the knob's own error.
    """

    def __init__(self, knob: str, value: KnobValue, applied: Mapping[str, KnobValue], error: DeviceError) -> None:
        super().__init__(str(error))
        self.knob = knob
        self.value = value
        self.applied = dict(applied)
        self.error = error


class RestoreError(KnobWriteError):
    """Knobs that could not be put back: one line naming each knob and its problem, and where their originals
    are kept with the way to finish (``edgetune restore`` once the board is back).

    Attributes:
        failures: ``(knob, problem)`` pairs; each problem is a one-line error that starts with the knob's name.
        kept: the state file that still holds the originals (None where nothing keeps them).
        device: the device's name, for the message ("" where unknown).
    """

    def __init__(self, failures: Sequence[tuple[str, str]], kept: str | None = None, device: str = "") -> None:
        self.failures = tuple((name, why if why.startswith(f"{name}:") else f"{name}: {why}")
                              for name, why in failures)
        self.kept = kept
        self.device = device
        names = [name for name, _ in self.failures]
        which = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        where = f" on {device}" if device else ""
        line = f"not restored{where}: {'; '.join(why for _, why in self.failures)}"
        if kept:
            line += (f"; the state file {kept} keeps the original of {which}: run `edgetune restore` once the "
                     f"board is back")
        super().__init__(line)

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.failures)

    @classmethod
    def combine(cls, errors: Sequence[RestoreError], device: str = "") -> RestoreError:
        """One error for several knobs' (the state file of the first that names one)."""
        kept = next((e.kept for e in errors if e.kept), None)
        return cls([f for e in errors for f in e.failures], kept, device or next((e.device for e in errors), ""))


class DeviceOutOfMemoryError(DeviceError, MemoryError):
    """A batch does not fit in device memory.

    Real boards raise ``torch.OutOfMemoryError`` (a ``RuntimeError`` whose message starts with
    ``CUDA out of memory``); the twin raises this, which mirrors that message, so callers treat both alike
    through :func:`is_out_of_memory`.
    """


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the out-of-memory errors of torch (CUDA, MPS, CPU allocator) and of the twin."""
    # torch.OutOfMemoryError subclasses RuntimeError and says "out of memory"; matching the message
    # avoids importing torch in the hardware layer.
    if isinstance(exc, (DeviceOutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# ---------------------------------------------------------------------------------------------- units

_SCALED_UNITS = {"Hz": (("GHz", 1e9), ("MHz", 1e6), ("kHz", 1e3)), "kHz": (("GHz", 1e6), ("MHz", 1e3)),
                 "W": (("W", 1.0),), "mW": (("W", 1e3),)}


def largest_at_most(values: Sequence[Any], limit: float) -> Any:
    """The largest of ascending ``values`` at or below ``limit`` (the smallest where none is): the value a
    clock set to ``limit`` runs at, on a table of the clocks the hardware has."""
    best = values[0]
    for v in values:
        if v <= limit:
            best = v
    return best


DERIVED_PREFIX = "derived: "


def summed_channels(total_label: str) -> int:
    """How many sensor channels a total sums: 1 for an input rail (``VDD_IN``), the number of rails a derived
    total (``derived: VDD_GPU_SOC + VDD_CPU_CV``) adds. Each channel adds its own offset error to the total."""
    if not total_label.startswith(DERIVED_PREFIX):
        return 1
    return max(1, len([t for t in total_label[len(DERIVED_PREFIX):].split("+") if t.strip()]))


def format_value(value: KnobValue, unit: str) -> str:
    """Human form of a knob value: ``918000000, 'Hz'`` -> ``'918 MHz'``, ``1, 'cores'`` -> ``'1 core'``;
    strings pass through."""
    if isinstance(value, str):
        return value
    for name, scale in _SCALED_UNITS.get(unit, ()):
        if abs(value) >= scale:
            return f"{value / scale:g} {name}"
    if unit in _PLURAL_UNITS and value == 1:
        unit = _PLURAL_UNITS[unit]
    return f"{value:g} {unit}".strip()


#: count units whose singular reads differently: ``1 core``, not ``1 cores``
_PLURAL_UNITS = {"cores": "core"}


_UNIT_SUFFIXES = {"ghz": 1e9, "mhz": 1e6, "khz": 1e3, "hz": 1.0, "kw": 1e3, "mw": 1e-3, "w": 1.0}
# a knob unit's size in the base unit of the suffixes above (Hz, W)
_UNIT_BASES = {"Hz": 1.0, "kHz": 1e3, "W": 1.0, "mW": 1e-3}


#: a number followed by a unit (``408MHz``, ``0.918 GHz``, ``15W``)
_NUMBER_UNIT = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*([A-Za-z]+)\s*$")
#: unit suffixes a value may carry, by the knob's unit (the families :meth:`Knob.parse` converts between)
_SUFFIXES_OF_UNIT = {"Hz": ("GHz", "MHz", "kHz", "Hz"), "kHz": ("GHz", "MHz", "kHz", "Hz"),
                     "W": ("kW", "W", "mW"), "mW": ("kW", "W", "mW")}


def wrong_unit(text: str, unit: str) -> str | None:
    """Why the unit ``text`` carries does not fit a knob set in ``unit`` (``306W`` for a clock), as the end of
    a sentence that starts with the knob's name; None when it fits or ``text`` carries none."""
    m = _NUMBER_UNIT.match(text)
    if m is None or not unit:
        return None
    allowed = _SUFFIXES_OF_UNIT.get(unit, (unit,))
    if m.group(1).lower() in (a.lower() for a in allowed):
        return None
    return (f"is set in {unit}, not {m.group(1)}; give a number in {unit}, a value with one of the units "
            f"{', '.join(allowed)}, min or max")


def _parse_number_with_unit(text: str, unit: str) -> float | None:
    """Parse ``'918'``, ``'918MHz'``, ``'0.918 GHz'`` into the knob's own unit; None if not a number."""
    s = text.strip().lower().replace(" ", "")
    for suffix, factor in sorted(_UNIT_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(suffix) and unit:
            number = s[: -len(suffix)]
            try:
                value = float(number) * factor
            except ValueError:
                return None
            base = _UNIT_BASES.get(unit)
            return None if base is None else value / base
    try:
        return float(s)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------- knobs


@dataclass(frozen=True)
class ModeCaps:
    """What one value of a knob that caps the others (a Jetson power mode, ``nvpmodel -m``) does to them.

    Attributes:
        max_values: per capped knob, the largest of that knob's values that runs under this mode: the knob
            set at or above it runs at it (devfreq clamps to nvpmodel's ``MAX_FREQ``; the online cores to
            the mode's). A knob not named is not capped.
        fixed: what the mode sets that no knob controls, as ``(name, value)`` pairs (the power-gated GPU
            TPCs): modes whose ``fixed`` differ never run the same.
    """

    max_values: tuple[tuple[str, KnobValue], ...]
    fixed: tuple[tuple[str, Any], ...] = ()

    def cap(self, knob: str) -> KnobValue | None:
        """The largest value ``knob`` runs at under this mode (None: not capped)."""
        return dict(self.max_values).get(knob)

    def capped_from(self, knob: str, values: Sequence[KnobValue]) -> int | None:
        """The index in ``values`` (ascending numbers) of the first at or above ``knob``'s cap: it and every
        higher value run at the cap under this mode (None: not capped, or every value runs below the cap)."""
        cap = self.cap(knob)
        if cap is None:
            return None
        return next((k for k, v in enumerate(values) if float(v) >= float(cap)), None)

    def peer(self, other: ModeCaps, tuned: Sequence[str]) -> bool:
        """True when a setting of the ``tuned`` knobs within both modes' caps runs alike under both.

        The same fixed state, and each capped knob not tuned capped the same (it runs at the mode's
        maximum, whatever the mode).
        """
        if dict(self.fixed) != dict(other.fixed):
            return False
        names = {n for n, _ in self.max_values} | {n for n, _ in other.max_values}
        return all(self.cap(n) == other.cap(n) for n in names if n not in tuned)

    def within(self, other: ModeCaps, tuned: Sequence[str]) -> bool:
        """True when every setting under this mode runs exactly as the same knob values under ``other``.

        A peer (:meth:`peer`) that caps each knob in ``tuned`` no lower (uncapped counts as highest).
        """
        if not self.peer(other, tuned):
            return False
        for name in tuned:
            mine, theirs = self.cap(name), other.cap(name)
            if mine is None:
                if theirs is not None:
                    return False
            elif theirs is not None and float(theirs) < float(mine):
                return False
        return True


class Knob:
    """One discrete DVFS knob.

    The platform supplies two callables: ``read`` returns the current value, ``write`` applies a value
    (already validated against ``values``). Everything else - validation, parsing of user text, the
    remembered original, restore - lives here once for every platform.

    Args:
        name: the knob's name in the user's words (``gpu_freq``, ``emc_freq``, ``cpu_freq``,
            ``cpu_cores``, ``power_mode``, ``power_limit``).
        unit: unit of the values (``Hz``, ``kHz``, ``W``, ``cores``; ``""`` for named modes).
        values: the allowed values. Numbers are sorted ascending; names (power modes) keep the order the
            platform gives, which is ascending power.
        read: returns the current value.
        write: applies a value; raises :class:`KnobWriteError` when the platform refuses.
        writable: False where the platform can read but not set the knob (no root, no privilege).
        on_first_change: called with ``(knob, original)`` just before the first write, so a state file can
            record the original before anything changes (see ``edgetune.power.state``).
        why_read_only: one line saying why the knob is read-only and how to fix it.
        caps: for a knob that caps the others (a power mode), what each of its values does to them, where
            the platform knows it (:class:`ModeCaps`); empty otherwise.
        unavailable: values the platform has but cannot switch to now, each with one line on why and how
            to get it (a Jetson power mode that needs a reboot); not among ``values``, and asking for one
            raises :class:`KnobValueError` with that line.
    """

    def __init__(
        self,
        name: str,
        unit: str,
        values: Sequence[KnobValue],
        *,
        read: Callable[[], KnobValue],
        write: Callable[[KnobValue], None] | None = None,
        writable: bool = True,
        on_first_change: Callable[[Knob, KnobValue], None] | None = None,
        why_read_only: str = "",
        description: str = "",
        caps: Mapping[KnobValue, ModeCaps] | None = None,
        unavailable: Mapping[KnobValue, str] | None = None,
    ) -> None:
        if not values:
            raise ValueError(f"knob {name} has no allowed values")
        vals = list(values)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            vals = sorted(set(vals))
        self.name = name
        self.unit = unit
        self.values: tuple[KnobValue, ...] = tuple(vals)
        self.description = description
        self.caps: dict[KnobValue, ModeCaps] = {v: c for v, c in (caps or {}).items() if v in self.values}
        self.unavailable: dict[KnobValue, str] = {v: why for v, why in (unavailable or {}).items()
                                                  if v not in self.values}
        self._read = read
        self._write = write
        self.writable = bool(writable and write is not None)
        self.why_read_only = why_read_only
        self.on_first_change = on_first_change
        self._original: KnobValue | None = None
        self._changed = False

    def __repr__(self) -> str:
        return f"Knob({self.name!r}, {len(self.values)} values, unit={self.unit!r}, writable={self.writable})"

    @property
    def numeric(self) -> bool:
        return not isinstance(self.values[0], str)

    @property
    def min(self) -> KnobValue:
        return self.values[0]

    @property
    def max(self) -> KnobValue:
        return self.values[-1]

    @property
    def original(self) -> KnobValue | None:
        """The value found before edgetune's first write, or None while nothing was written."""
        return self._original

    def read(self) -> KnobValue:
        return self._read()

    def nearest(self, value: float) -> list[KnobValue]:
        """The allowed values on either side of ``value`` (one if it lies outside the table)."""
        if not self.numeric:
            return list(self.values)
        i = bisect.bisect_left(self.values, value)  # type: ignore[arg-type]
        return list(self.values[max(0, i - 1): i + 1])

    def _describe_nearest(self, value: float) -> str:
        return " or ".join(format_value(v, self.unit) for v in self.nearest(value))

    def validate(self, value: KnobValue) -> KnobValue:
        """Return ``value`` as it appears in the table, or raise :class:`KnobValueError`."""
        if self.numeric:
            if isinstance(value, str):
                return self.parse(value)
            for v in self.values:
                if abs(float(v) - float(value)) <= _VALUE_MATCH_REL * max(1.0, abs(float(v))):
                    return v
            raise KnobValueError(
                f"{self.name}: {format_value(value, self.unit)} is not an allowed value; "
                f"nearest allowed: {self._describe_nearest(float(value))}"
            )
        if value in self.values:
            return value
        lowered = {str(v).lower(): v for v in self.values}
        if str(value).lower() in lowered:
            return lowered[str(value).lower()]
        held = next((v for v in self.unavailable if str(v).lower() == str(value).lower()), None)
        if held is not None:
            raise KnobValueError(f"{self.name}: {held} {self.unavailable[held]}")
        raise KnobValueError(
            f"{self.name}: {value!r} is not an allowed value; allowed: {', '.join(map(str, self.values))}"
        )

    def parse(self, text: str) -> KnobValue:
        """Parse user text: ``min``, ``max``, a value in the knob's unit, or with a unit (``918MHz``)."""
        t = text.strip()
        if t.lower() in ("min", "max"):
            return self.min if t.lower() == "min" else self.max
        if not self.numeric:
            return self.validate(t)
        why = wrong_unit(t, self.unit)  # a unit of another quantity would be read as this knob's: refused
        if why is not None:
            raise KnobValueError(f"{self.name} = {t!r}: {self.name} {why}")
        number = _parse_number_with_unit(t, self.unit)
        if number is None:
            raise KnobValueError(f"{self.name}: cannot read {text!r} as a value in {self.unit or 'units'}; "
                                 f"use a number, min or max")
        return self.validate(number)

    def set(self, value: KnobValue) -> None:
        """Validate and apply ``value``; remember the original before the first write."""
        value = self.validate(value)
        if not self.writable:
            raise KnobWriteError(f"{self.name} is read-only here: {self.why_read_only or 'platform refuses writes'}")
        self.remember_original()
        assert self._write is not None
        self._write(value)

    def remember_original(self) -> None:
        """Record the value in force as the original (and call ``on_first_change``), once: from then on
        :meth:`restore` writes it back. :meth:`set` does this before its first write; a device does it for
        every knob before a power mode change, which resets the clocks under it (:meth:`Device.apply`)."""
        if not self._changed:
            self._original = self._read()
            if self.on_first_change is not None:
                self.on_first_change(self, self._original)
            self._changed = True

    def restore(self) -> bool:
        """Write back the value found before the first change. Returns True if anything was written."""
        if not self._changed or self._original is None:
            return False
        assert self._write is not None
        self._write(self._original)
        self._changed = False
        return True


#: The knob whose change resets the others (an nvpmodel mode sets every clock's range and the online cores).
MODE_KNOB = "power_mode"
#: Knobs written before the others, in this order, whether applied or restored: the power mode (it resets
#: the clocks under it), then a power limit.
FIRST_KNOBS = (MODE_KNOB, "power_limit")


def restore_order(names: Iterable[str]) -> list[str]:
    """``names`` in the order knobs are written, applied or restored: :data:`FIRST_KNOBS` first, then the rest
    by name."""
    return sorted(names, key=lambda n: (FIRST_KNOBS.index(n) if n in FIRST_KNOBS else len(FIRST_KNOBS), n))


# ---------------------------------------------------------------------------------------------- sensing


@dataclass(frozen=True)
class PowerReading:
    """One sample: board total and per-rail power in W at device-clock time ``t`` (s)."""

    t: float
    total_w: float
    rails: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class PowerSensor(Protocol):
    """Board power, read on the device clock.

    Attributes:
        rails: names of the rails :meth:`read` reports.
        total_label: what the total is: the input rail's name (``VDD_IN``), or ``derived: ...`` when it
            is a sum of rails.
        update_period_s: how often the hardware produces a new value; reading faster repeats values.
    """

    rails: tuple[str, ...]
    total_label: str
    update_period_s: float

    def read(self) -> PowerReading:
        """The current sample. Raises :class:`DeviceError` (or OSError/ValueError) on a bad read."""
        ...

    def energy_j(self) -> float | None:
        """Cumulative hardware energy counter in J, or None where the hardware has none."""
        ...


# ---------------------------------------------------------------------------------------------- workload cost


@dataclass(frozen=True)
class WorkloadCost:
    """What one training step of a workload asks of the hardware, measured from the real model.

    Produced by ``edgetune.workloads`` (torch's FLOP counter and the model's tensors); consumed by the
    simulated twin's roofline model. Real hardware ignores it.

    Attributes:
        flops_per_sample: forward + backward + optimizer FLOPs for one sample.
        param_bytes: bytes of parameters (weights are read, gradients written, optimizer state updated
            once per step, independent of batch size).
        activation_bytes_per_sample: bytes of activations saved for backward, per sample.
        input_bytes_per_sample: bytes of one input sample as loaded from the data pipeline.
        optimizer_state_bytes: bytes of optimizer state (e.g. Adam's two moments).
        fixed_bytes: bytes a step holds beside the weights and the optimizer state whatever its batch: the
            gradients of the parameters it trains (none of a frozen backbone's) and the copies of weights that
            mixed precision makes for backward (autocast's bfloat16 weights). None: a gradient of every
            parameter, ``param_bytes``.
    """

    flops_per_sample: float
    param_bytes: float
    activation_bytes_per_sample: float
    input_bytes_per_sample: float = 0.0
    optimizer_state_bytes: float = 0.0
    fixed_bytes: float | None = None

    def memory_bytes(self, batch_size: int) -> float:
        """Device memory one step needs at ``batch_size``: weights, gradients (and weight copies: ``fixed_bytes``),
        optimizer state, activations and inputs."""
        fixed = self.param_bytes if self.fixed_bytes is None else self.fixed_bytes
        return self.param_bytes + fixed + self.optimizer_state_bytes + batch_size * (
            self.activation_bytes_per_sample + self.input_bytes_per_sample
        )


# ---------------------------------------------------------------------------------------------- device


class Capability(enum.Enum):
    """What a device can do beyond the interface every device has; callers ask ``device.has(cap)``.

    Search, runtime and CLI branch on these, never on the backend's type or attributes.
    """

    #: the clock is virtual: time advances only when a step runs or the caller sleeps (twin, trace replay).
    VIRTUAL_CLOCK = "virtual_clock"
    #: ``device.backend.expected(cost, batch_size, setting)`` gives noise-free truth (the twin). For
    #: scoring and tests only: a search, guard or predictor must never read it.
    GROUND_TRUTH = "ground_truth"
    #: ``device.backend`` replays a measurement table (``trace:``): ``.table``, ``.oracle(...)``.
    TABLE_REPLAY = "table_replay"
    #: ``run_step`` times the step without executing the training step ``fn`` (twin with compute=False,
    #: trace replay).
    SKIPS_STEP = "skips_step"
    #: ``sensor.energy_j()`` reads a hardware energy counter.
    ENERGY_COUNTER = "energy_counter"
    #: the sensor reads the whole machine (a Jetson's board rails, a CPU package's RAPL counters): every
    #: process training on it draws power it measures. A GPU's own sensor (NVML) reads that GPU alone, and
    #: the twin models the steps of the process that opened it.
    WHOLE_MACHINE = "whole_machine"


@dataclass(frozen=True)
class ComputeDevice:
    """Where the training steps a device measures run, in torch's words.

    A GPU's sensor measures the steps only where they run on that GPU: a step left on the CPU draws CPU
    power, and the GPU's clocks and power limit change nothing in it. The search and ``edgetune run``
    put the workload on :attr:`torch_device` unless told otherwise.

    Attributes:
        torch_device: a :class:`torch.device` string (``cuda:0``, ``cpu``), or None where the GPU measured
            has no CUDA number known here.
        why_unknown: with ``torch_device`` None, why, and what fixes it (one line).
        measures_cpu: whether the power measured includes the CPU's (a board's input rail does; NVML reads
            the GPU alone), so whether training left on the CPU is measured at all.
    """

    torch_device: str | None
    why_unknown: str = ""
    measures_cpu: bool = True


#: the compute device of platforms that measure the CPU (RAPL) or model the step (the twin, trace replay)
CPU_COMPUTE = ComputeDevice("cpu")


def _unknown_idle_power() -> float | None:
    """Idle power of a device that does not model it (real hardware measures it instead)."""
    return None


def _unknown_temperature() -> float | None:
    """Board temperature of a device without a thermal sensor edgetune reads."""
    return None


@dataclass
class Device:
    """A platform's knobs, sensor and clock, with how it runs one training step.

    Attributes:
        name: the device spec the user gave or detection produced (``sim:orin-nano``, ``jetson``,
            ``nvml:0``, ``rapl``, ``trace:table.csv``).
        description: one line naming the hardware (``NVIDIA Jetson Orin Nano 8GB (simulated)``).
        simulated: True for the twin and trace replay. Every report says so.
        knobs: by name.
        sensor: the board power sensor.
        clock: real or virtual time.
        run_step: runs one training step. ``run_step(fn, batch_size, cost)`` calls ``fn`` and returns its
            result once the device has finished the step (real hardware: after synchronising the GPU; the
            twin: after advancing its virtual clock by the modelled step time). Raises an out-of-memory
            error (see :func:`is_out_of_memory`) when the batch does not fit.
        idle_power: returns the device's power at rest now, in W, or None where unknown (hardware
            measures it). Called on every read of :attr:`idle_power_w`, so it reflects the knob values and
            disturbances in force then (the twin's depends on its power mode and power offset).
        max_power_w: the most the device can draw, where known.
        temperature: returns the board temperature now, in degC (the sensor nearest the GPU: a Jetson's GPU
            thermal zone, NVML's GPU temperature), or None where the device reads none. The search's thermal
            soak extrapolates the warm board's power from it (:mod:`edgetune.search.thermal`).
        notes: lines the CLI prints under the device (calibration sources, measure-only mode ...).
        missing_knobs: knobs of the platform left out when the device was opened, because a file or command
            they need is gone or lists nothing (a Jetson's ``nvpmodel.conf``, its GPU devfreq node), each with
            its note (the line in ``notes`` that says why and what to do): a state file may hold the original
            of such a knob, and ``edgetune restore`` then says why it cannot write it back
            (:func:`~edgetune.power.state.recover_actions`).
        close: releases platform resources (NVML shutdown ...).
        backend: the platform object behind the device, for platform-specific use (the twin's
            :class:`~edgetune.power.sim.Twin` for ``sim:``, with its noise-free ground truth).
        capabilities: what the device can do beyond the common interface (:class:`Capability`).
        compute: where the training steps this device measures run (:class:`ComputeDevice`): the GPU
            measured, ``cpu`` for RAPL, the twin (its real steps, where run, give the loss; it models the
            time and power) and trace replay.
    """

    name: str
    description: str
    simulated: bool
    knobs: dict[str, Knob]
    sensor: PowerSensor
    clock: Clock
    run_step: Callable[[Callable[[], T], int, WorkloadCost | None], T]
    idle_power: Callable[[], float | None] = _unknown_idle_power
    max_power_w: float | None = None
    temperature: Callable[[], float | None] = _unknown_temperature
    notes: list[str] = field(default_factory=list)
    close: Callable[[], None] = lambda: None
    backend: Any = None
    capabilities: frozenset[Capability] = frozenset()
    compute: ComputeDevice = CPU_COMPUTE
    missing_knobs: dict[str, str] = field(default_factory=dict)

    @property
    def idle_power_w(self) -> float | None:
        """The device's power at rest with the knob values in force now (W), or None where unknown."""
        return self.idle_power()

    @property
    def temperature_c(self) -> float | None:
        """The board temperature now, degC, or None where the device reads none."""
        return self.temperature()

    def has(self, capability: Capability) -> bool:
        """True when the device has ``capability``."""
        return capability in self.capabilities

    @property
    def writable_knobs(self) -> dict[str, Knob]:
        return {k: v for k, v in self.knobs.items() if v.writable}

    @property
    def measure_only(self) -> bool:
        """True where no knob can be set: only batch size can be tuned."""
        return not self.writable_knobs

    def settings(self) -> dict[str, KnobValue]:
        """The current value of every knob."""
        return {name: knob.read() for name, knob in self.knobs.items()}

    def apply(self, setting: Mapping[str, KnobValue]) -> None:
        """Set several knobs, in :func:`restore_order`. Power modes go first: a mode change resets the clocks
        under it (nvpmodel writes each clock's range and the online cores of the mode), so before the first one
        every other writable knob's original is recorded too (:meth:`Knob.remember_original`), and
        :meth:`restore` puts the board back as it was found, not at the mode's defaults.

        Every value is checked before anything is written (:class:`KnobValueError`: nothing changed). A write
        that fails raises :class:`ApplyError`, which says which knobs were written before it."""
        for name in setting:
            if name not in self.knobs:
                raise KnobValueError(
                    f"unknown knob {name!r} on {self.name}; knobs here: {', '.join(self.knobs) or 'none'}"
                )
        values = {name: self.knobs[name].validate(value) for name, value in setting.items()}
        mode = self.knobs.get(MODE_KNOB)
        if MODE_KNOB in setting and mode is not None and mode.writable and mode.original is None:
            for name, knob in self.knobs.items():
                if knob is mode or not knob.writable:
                    continue
                try:
                    knob.remember_original()
                except (DeviceError, OSError, ValueError) as exc:
                    if name in setting:  # its own write would fail the same way: say so now (nothing written)
                        if isinstance(exc, DeviceError):
                            raise ApplyError(name, values[name], {}, exc) from exc
                        raise
                    # a knob the setting leaves alone and that cannot be read: the mode resets it all the
                    # same, and a failed read must not stop the setting
                    _log.warning("%s: its value before the power mode change could not be recorded (%s); it "
                                 "stays as the mode leaves it", name, exc)
        applied: dict[str, KnobValue] = {}
        for name in restore_order(values):
            try:
                self.knobs[name].set(values[name])
            except DeviceError as exc:
                raise ApplyError(name, values[name], applied, exc) from exc
            applied[name] = values[name]

    def restore(self) -> list[str]:
        """Restore every changed knob to its original value; names of those restored.

        The power mode goes first, as in :meth:`apply` (:func:`restore_order`): a mode change resets the
        clocks under it, so the clocks' originals are written after it, and the board ends as it was found,
        not at the mode's defaults. Every knob is attempted even if one fails; then one
        :class:`RestoreError` names every knob not restored (an unexpected error is raised as it is).
        """
        restored: list[str] = []
        failed: list[RestoreError] = []
        first_error: BaseException | None = None
        for name in restore_order(self.knobs):
            try:
                if self.knobs[name].restore():
                    restored.append(name)
            except RestoreError as exc:
                failed.append(exc)
                shown = getattr(self.knobs[name], "shown", None)  # a tracked knob: its tracker remembers it
                if shown is not None:
                    shown(exc)
            except DeviceError as exc:  # a knob without a state file: nothing keeps its original
                failed.append(RestoreError([(name, str(exc))]))
            except Exception as exc:  # noqa: BLE001 - keep restoring the rest
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        if failed:
            raise RestoreError.combine(failed, self.name)
        return restored

    @contextlib.contextmanager
    def restoring(self) -> Iterator[Device]:
        """Context in which any knob change is undone on exit, whatever the exit."""
        try:
            yield self
        finally:
            self.restore()
