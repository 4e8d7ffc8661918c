"""Knob columns of a measurement table: which knob a column header names, and in which unit.

A column is mapped to a knob of the registry (:data:`edgetune.power.knobs.KNOBS`) by its name:

* a registry name (``gpu_freq``, ``emc_freq``, ``mem_freq``, ``cpu_freq``, ``cpu_cores``, ``power_limit``,
  ``power_mode``), a role name (``gpu_clock``, ``memory_clock``, ``cpu_clock``, ``cpu_cores``,
  ``power_limit``, ``power_mode``: the role's first registry knob, so ``memory_clock`` is ``emc_freq``) or a
  common spelling (:data:`ALIASES`: ``gpu_clk``, ``emc_clock``, ``online_cores``, ``nvpmodel`` ...), in the
  registry's unit;
* any of those with a unit suffix (:data:`UNIT_SUFFIXES`: ``_ghz``, ``_mhz``, ``_khz``, ``_hz`` for clocks,
  ``_w``, ``_mw`` for a power limit), converted to the registry's unit (``emc_freq_mhz`` -> ``emc_freq`` in
  Hz, ``cpu_freq_khz`` -> ``cpu_freq`` in kHz). A unit in brackets after the name, as spreadsheets write it
  (``gpu_freq (MHz)``, ``power_limit [W]``), is the same suffix; a unit edgetune does not read there, on a name
  of the registry, is refused (on any other name it stays part of a knob with no role). The short stems ``gpu``,
  ``emc``, ``mem`` and ``cpu`` name a clock only with a frequency suffix (``gpu_mhz``); alone they are too
  vague.

Matching ignores case, and spaces or hyphens in a name count as ``_`` (``GPU freq (MHz)``, as jtop and
spreadsheets write it, is ``gpu_freq_mhz``). Every other column is a knob with no role: it keeps its header as its name and the
hardware model treats it generically. A power suffix on an unknown name (``vdd_in_mw``) is refused: it is
a measured power, not a knob; so is a name that reads as a measurement or an index (:data:`_FIGURE_WORDS`:
``throughput``, ``time_ms``, ``Temp GPU``, ``run``) or jtop's bare ``GPU``/``EMC``/``CPU1`` (loads). The header comment ``# edgetune: column <header>=<name>`` maps a column by
a name of the forms above (or ``ignore`` to drop it, or a reserved column such as ``power_w`` to rename it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from edgetune.power.knobs import KNOBS, KnobRole, knob_of_role
from edgetune.tables.table import BATCH_SIZE, PEAK_POWER, POWER, RESERVED_COLUMNS, STEP_TIME, TIME_PER_EPOCH

__all__ = ["ALIASES", "BATCH_SIZE_ALIASES", "CLOCK_RANGE_HZ", "MAX_POWER_W", "MEASURED_UNITS", "UNIT_SUFFIXES", "KnobColumn", "MeasuredColumn",
           "resolve_knob_name", "resolve_measured_name"]

#: unit suffix -> (quantity, its size in the quantity's SI unit: Hz or W)
UNIT_SUFFIXES: dict[str, tuple[str, float]] = {
    "ghz": ("frequency", 1e9),
    "mhz": ("frequency", 1e6),
    "khz": ("frequency", 1e3),
    "hz": ("frequency", 1.0),
    "mw": ("power", 1e-3),
    "w": ("power", 1.0),
}

#: registry units that a suffix can convert into: unit -> (quantity, its size in Hz or W)
_REGISTRY_UNITS: dict[str, tuple[str, float]] = {"Hz": ("frequency", 1.0), "kHz": ("frequency", 1e3),
                                                 "W": ("power", 1.0)}

#: column names (lower case, without a unit suffix) -> registry knob name. The registry's own names and the
#: roles' names are added below.
ALIASES: dict[str, str] = {
    "gpu_clock": "gpu_freq", "gpu_clk": "gpu_freq", "gpu_frequency": "gpu_freq", "gr3d_freq": "gpu_freq",
    "sm_clock": "gpu_freq", "graphics_clock": "gpu_freq",
    "emc_clock": "emc_freq", "emc_clk": "emc_freq", "emc_frequency": "emc_freq",
    "mem_clock": "mem_freq", "mem_clk": "mem_freq",
    "cpu_clock": "cpu_freq", "cpu_clk": "cpu_freq", "cpu_frequency": "cpu_freq",
    "cores": "cpu_cores", "online_cores": "cpu_cores", "num_cores": "cpu_cores", "n_cores": "cpu_cores",
    "power_cap": "power_limit", "powercap": "power_limit",
    "nvpmodel": "power_mode", "nvpmodel_mode": "power_mode", "nvp_model": "power_mode",
}
ALIASES.update({name: name for name in KNOBS})
ALIASES.update({role.value: knob_of_role(KNOBS, role) for role in KnobRole})  # type: ignore[misc]

#: stems that name a clock only together with a frequency suffix (``gpu_mhz``)
_SUFFIX_ONLY: dict[str, str] = {"gpu": "gpu_freq", "emc": "emc_freq", "mem": "mem_freq", "cpu": "cpu_freq"}


#: other spellings of ``batch_size`` (lower case, ``_`` for spaces)
BATCH_SIZE_ALIASES = ("bs", "batch", "batchsize", "minibatch", "mini_batch", "minibatch_size", "mini_batch_size")

#: measured columns read with a unit: name stem (lower case) -> the reserved column it fills
_MEASURED_STEMS: dict[str, str] = {
    "step_time": STEP_TIME, "time_per_step": STEP_TIME, "iter_time": STEP_TIME, "iteration_time": STEP_TIME,
    "time_per_epoch": TIME_PER_EPOCH, "epoch_time": TIME_PER_EPOCH,
    "power": POWER, "avg_power": POWER, "mean_power": POWER, "average_power": POWER,
    "peak_power": PEAK_POWER,
}
#: the units a measured column can be given in: reserved column -> {unit: its size in the column's unit}
MEASURED_UNITS: dict[str, dict[str, float]] = {
    STEP_TIME: {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6},
    TIME_PER_EPOCH: {"s": 1.0, "sec": 1.0, "ms": 1e-3, "min": 60.0, "h": 3600.0},
    POWER: {"w": 1.0, "mw": 1e-3, "kw": 1e3},
    PEAK_POWER: {"w": 1.0, "mw": 1e-3, "kw": 1e3},
}


#: the range a clock runs in, Hz: a value outside it was written in another unit than the column says (a
#: Jetson's lowest clocks are about 100 MHz, a datacenter GPU's memory clock about 10 GHz; a clock in MHz
#: read as kHz is at most a few MHz)
CLOCK_RANGE_HZ = (1e7, 1e11)
#: the most power one board or GPU draws, W: more is a power in milliwatts read as watts (a Jetson's 5-60 W
#: is 5000-60000 mW; the largest single accelerators draw about 1-1.2 kW)
MAX_POWER_W = 2000.0


class ColumnNameError(ValueError):
    """A column name that cannot be a knob as written (the loader adds the file to the message)."""


@dataclass(frozen=True)
class KnobColumn:
    """How one column of a table becomes a knob.

    Attributes:
        header: the column's header in the file.
        name: the knob's name in the table: the registry name where the column maps to one, else the header.
        role: the knob's role, None for a knob the registry does not know.
        scale: file value x scale = the value in the registry's unit (1 where no conversion applies).
    """

    header: str
    name: str
    role: KnobRole | None
    scale: float = 1.0

    def convert(self, value: float) -> float:
        """A file value in the registry's unit; converted clocks are whole Hz (kHz for ``cpu_freq``)."""
        if self.scale == 1.0:
            return value
        out = _scaled(value, self.scale)
        return float(round(out)) if self.role is not None and self.role.is_clock else out

    def implausible(self, value: float) -> str | None:
        """Why ``value`` (converted) cannot be this knob's in its unit, naming the fix; None where it can be: a
        clock outside :data:`CLOCK_RANGE_HZ` (``GR3D_FREQ`` in MHz read as Hz), a power limit over
        :data:`MAX_POWER_W` (milliwatts read as watts)."""
        if self.role is None or not math.isfinite(value):
            return None
        unit = KNOBS[self.name].unit
        if self.role.is_clock:
            hz = value * _REGISTRY_UNITS[unit][1]
            if CLOCK_RANGE_HZ[0] <= hz <= CLOCK_RANGE_HZ[1]:
                return None
            in_hz = f" ({hz:g} Hz)" if unit != "Hz" else ""
            where = f"{self.header} reads as {value:g} {unit}{in_hz}, no {self.role.value.replace('_', ' ')} runs at that"
            if self.scale != 1.0:  # the header gives a unit already: the values are in another
                return (f"{where}: its values are not in the unit the header gives; name the column with the unit "
                        f"they are in ({self.name}_mhz, _ghz, _khz or _hz)")
            return (f"{where}: give the column its unit: name it {self.name}_mhz (or _ghz, _khz, _hz), or declare "
                    f"'# edgetune: column {self.header}={self.name}_mhz'")
        if self.role is KnobRole.POWER_LIMIT and value > MAX_POWER_W:
            return (f"{self.header} = {value:g} W, more than a board draws ({MAX_POWER_W:g} W): a limit in "
                    f"milliwatts? name the column {self.name}_mw, or declare '# edgetune: column "
                    f"{self.header}={self.name}_mw'")
        return None

    def describe(self) -> str:
        """``gpu_freq_mhz -> gpu_freq (gpu_clock, x1e+06)``, for logs."""
        if self.role is None:
            return f"{self.header}: a knob with no role (the hardware model treats it generically)"
        conversion = f", x{self.scale:g}" if self.scale != 1.0 else ""
        return f"{self.header} -> {self.name} ({self.role.value} in {KNOBS[self.name].unit or 'names'}{conversion})"


def _scaled(value: float, scale: float) -> float:
    """``value * scale``, dividing by the inverse for scales below 1 (mW -> W, ms -> s): exact for whole mW."""
    if scale == 1.0:
        return value
    return value * scale if scale > 1.0 else value / round(1.0 / scale)


@dataclass(frozen=True)
class MeasuredColumn:
    """How one column of a table becomes a reserved (measured or bookkeeping) column.

    Attributes:
        header: the column's header in the file.
        name: the reserved column it fills (``power_w``, ``step_time_s``, ``batch_size``, ...).
        scale: file value x scale = the value in the reserved column's unit (``power (mW)``: 1e-3).
    """

    header: str
    name: str
    scale: float = 1.0

    def convert(self, value: float) -> float:
        return _scaled(value, self.scale)

    def implausible(self, value: float) -> str | None:
        """Why ``value`` (converted) cannot be a power in W, naming the fix; None where it can be. A column
        in kilowatts (``power_kw``) says the machine draws that much: a node of several GPUs is not refused."""
        if self.name not in (POWER, PEAK_POWER) or not value > MAX_POWER_W or self.scale > 1.0:
            return None
        stem = self.name.removesuffix("_w")
        return (f"{self.header} = {value:g} W, more than a board draws ({MAX_POWER_W:g} W): a power in milliwatts? "
                f"name the column {stem}_mw (or declare '# edgetune: column {self.header}={stem}_mw'); a machine "
                f"that draws that much: give it in kilowatts, {stem}_kw")

    def describe(self) -> str:
        conversion = f", x{self.scale:g}" if self.scale != 1.0 else ""
        return f"{self.header} -> {self.name}{conversion}"


def _normalize(text: str) -> str:
    """A header as the resolvers match it: lower case, runs of spaces and hyphens one ``_`` (``GPU freq`` ->
    ``gpu_freq``), no space around brackets (``gpu_freq (MHz)`` -> ``gpu_freq(mhz)``)."""
    text = re.sub(r"\s*([()\[\]])\s*", r"\1", text.strip().lower())  # no space around brackets
    return re.sub(r"[\s\-]+", "_", text)


def _split_suffix(name: str) -> tuple[str, str | None]:
    for suffix in sorted(UNIT_SUFFIXES, key=len, reverse=True):
        if name.endswith("_" + suffix) and len(name) > len(suffix) + 1:
            return name[: -len(suffix) - 1], suffix
    return name, None


#: ``<name> (<unit>)`` or ``<name> [<unit>]``: a unit in brackets after the name
_UNIT_IN_BRACKETS = re.compile(r"^(?P<name>[^()\[\]]*?)\s*[(\[]\s*(?P<unit>[^()\[\]]*?)\s*[)\]]$")


def _bracketed_unit_as_suffix(header: str, text: str) -> str:
    """``gpu_freq (mhz)`` -> ``gpu_freq_mhz``, ``cpu_cores (cores)`` -> ``cpu_cores`` (the registry's unit;
    ``text`` is lower case); ``text`` itself without a unit in brackets, or where its name is no registry knob
    and its unit no suffix (a knob with no role keeps it).

    Raises:
        ColumnNameError: a unit edgetune does not read after the name of a registry knob.
    """
    match = _UNIT_IN_BRACKETS.match(text)
    if match is None or not match["name"]:
        return text
    stem, unit = _normalize(match["name"]), match["unit"]
    if unit in UNIT_SUFFIXES:
        return f"{stem}_{unit}"
    knob = ALIASES.get(stem)
    if knob is not None and unit == KNOBS[knob].unit.lower():  # the registry's own unit: ``cpu_cores (cores)``
        return stem
    knob = knob or _SUFFIX_ONLY.get(stem)
    if knob is None:
        return text
    quantity = _REGISTRY_UNITS.get(KNOBS[knob].unit, (None,))[0]
    units = [u for u, (q, _) in UNIT_SUFFIXES.items() if q == quantity]
    raise ColumnNameError(
        f"column {header!r}: edgetune reads no unit {unit!r} on {knob}; name the column "
        + (f"'{stem} (<unit>)' or {stem}_<unit> with a unit of {', '.join(units)}, or {knob} in "
           f"{KNOBS[knob].unit}" if units else knob))


def resolve_measured_name(header: str, name: str | None = None) -> MeasuredColumn | None:
    """The reserved column that column ``header`` fills, by its own name or by the declared ``name``; None for
    a name that is no reserved column (a knob, then). Matching ignores case, spaces count as ``_``; a batch
    size may be ``bs``, ``batch``, ``Batch Size`` ...; a measured time or power gives its unit as a suffix or in
    brackets (``power_mw``, ``Power [W]``, ``step_time_ms``, ``step_time (ms)``) and is converted.

    Raises:
        ColumnNameError: a measured time or power without a unit (``power``: W or mW?) or with one that does
            not fit it (``step_time_w``).
    """
    text = _normalize(header if name is None else name)
    if text in RESERVED_COLUMNS and text not in MEASURED_UNITS:
        return MeasuredColumn(header, text)
    if text in BATCH_SIZE_ALIASES or text == BATCH_SIZE:
        return MeasuredColumn(header, BATCH_SIZE)
    match = _UNIT_IN_BRACKETS.match(text)
    if match is not None and match["name"]:
        stem, unit = match["name"].strip("_"), match["unit"]
    else:
        stem, _, unit = text.rpartition("_")
        if not stem or unit not in {u for units in MEASURED_UNITS.values() for u in units}:
            stem, unit = text, None
    column = _MEASURED_STEMS.get(stem)
    if column is None:
        return None
    units = MEASURED_UNITS[column]
    if unit not in units:
        given = "gives no unit" if unit is None else f"gives unit {unit!r}, which edgetune does not read there"
        raise ColumnNameError(
            f"column {header!r} {given}; name it {stem}_<unit> or '{stem} (<unit>)' with a unit of "
            f"{', '.join(units)} (it is converted into {column})")
    return MeasuredColumn(header, column, units[unit])


#: words that make a column a measured figure, not a knob: word -> what to do with it instead
_FIGURE_WORDS: dict[str, str] = {
    **dict.fromkeys(("throughput", "fps", "samples_per_s", "samples_per_sec", "samples_s", "img_s",
                     "images_per_s", "it_s", "its", "iter_s", "iters_per_s", "tokens_per_s", "tokens_s"),
                    "the step time goes in step_time_s (= batch_size / throughput in samples/s)"),
    **dict.fromkeys(("time", "duration", "latency", "runtime", "elapsed"),
                    "a time per step goes in step_time_<unit> and per epoch in time_per_epoch_<unit> (units s, "
                    "ms, ...), or declare '# edgetune: column <header>=step_time_<unit>'"),
    **dict.fromkeys(("power", "energy", "current", "voltage", "vdd"),
                    "the mean power goes in power_w or power_mw (or declare '# edgetune: column <header>="
                    "power_mw'); an energy is not read"),
    **dict.fromkeys(("temp", "temperature", "util", "utilization", "utilisation", "usage", "load", "accuracy",
                     "acc", "loss", "memory_used", "mem_used", "ram", "swap", "timestamp", "uptime", "date",
                     "datetime"), "edgetune does not read it"),
    **dict.fromkeys(("run", "rep", "repeat", "repetition", "seed", "trial", "index", "idx", "id", "epoch", "step",
                     "iteration"),
                    "an index of the measurement is not a setting (repeated rows of one setting are aggregated "
                    "without it)"),
}
#: headers too vague to be a knob: jtop's ``GPU``, ``EMC``, ``CPU1`` are loads, not clocks
_VAGUE = re.compile(r"^(gpu|emc|mem|cpu)\d*$")


def _measured_figure(header: str, text: str) -> str | None:
    """Why column ``header`` (normalized: ``text``) is a measured figure rather than a knob, or None."""
    if _VAGUE.match(text):
        return (f"column {header!r} names no knob: a clock? name it with its unit ({text.rstrip('0123456789')}"
                f"_freq_mhz, ...); a load? drop it with '# edgetune: column {header}=ignore'")
    words = re.split(r"[^a-z0-9]+", text)
    joined = "_".join(w for w in words if w)
    hits = [w for w in _FIGURE_WORDS if w in words or ("_" in w and f"_{w}_" in f"_{joined}_")]
    if not hits:
        return None
    return (f"column {header!r} reads as a measurement ({hits[0]}), not a knob you set: "
            f"{_FIGURE_WORDS[hits[0]].replace('<header>', header)}; drop it with '# edgetune: column {header}=ignore' "
            f"(a knob you set: rename it)")


def resolve_knob_name(header: str, name: str | None = None) -> KnobColumn:
    """The knob that column ``header`` holds, by its own name or by the declared ``name``.

    Raises:
        ColumnNameError: a unit suffix that does not fit the knob's role (``gpu_freq_w``), a power suffix on a
            name that is no power limit, a unit in brackets that is no suffix after a registry knob's name
            (``gpu_freq (rpm)``), or a declared name that names no knob.
    """
    text = _bracketed_unit_as_suffix(header, _normalize(header if name is None else name))
    if text in ALIASES:
        knob = ALIASES[text]
        return KnobColumn(header, knob, KNOBS[knob].role)
    stem, suffix = _split_suffix(text)
    knob = ALIASES.get(stem) or (_SUFFIX_ONLY.get(stem) if suffix else None)
    if knob is None:
        if name is not None:
            raise ColumnNameError(
                f"column {header}={name}: {name!r} names no knob; use a role ("
                f"{', '.join(r.value for r in KnobRole)}) or a registry name ({', '.join(KNOBS)}), optionally "
                f"with a unit suffix (_mhz, _w, ...), or ignore")
        if suffix is not None and UNIT_SUFFIXES[suffix][0] == "power":
            raise ColumnNameError(
                f"column {header!r} holds a power (unit suffix _{suffix}) but is not a power limit; a measured "
                f"power goes in power_w: rename it, or drop it with '# edgetune: column {header}=ignore'")
        figure = _measured_figure(header, text)
        if figure is not None:
            raise ColumnNameError(figure)
        return KnobColumn(header, header.strip(), None)
    spec = KNOBS[knob]
    if suffix is None:
        return KnobColumn(header, knob, spec.role)
    quantity, size = UNIT_SUFFIXES[suffix]
    unit = _REGISTRY_UNITS.get(spec.unit)
    if unit is None or unit[0] != quantity:
        raise ColumnNameError(
            f"column {header!r}: a {quantity} suffix (_{suffix}) on {knob} ({spec.role.value}, unit "
            f"{spec.unit or 'a name'}); name the column {knob}"
            + (f" or {knob}_<unit> with a {unit[0]} unit" if unit else ""))
    return KnobColumn(header, knob, spec.role, size / unit[1])
