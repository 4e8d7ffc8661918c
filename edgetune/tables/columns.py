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
a measured power, not a knob. The header comment ``# edgetune: column <header>=<name>`` maps a column by
a name of the forms above (or ``ignore`` to drop it, or a reserved column such as ``power_w`` to rename it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgetune.power.knobs import KNOBS, KnobRole, knob_of_role

__all__ = ["ALIASES", "UNIT_SUFFIXES", "KnobColumn", "resolve_knob_name"]

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
    "nvpmodel": "power_mode", "nvpmodel_mode": "power_mode",
}
ALIASES.update({name: name for name in KNOBS})
ALIASES.update({role.value: knob_of_role(KNOBS, role) for role in KnobRole})  # type: ignore[misc]

#: stems that name a clock only together with a frequency suffix (``gpu_mhz``)
_SUFFIX_ONLY: dict[str, str] = {"gpu": "gpu_freq", "emc": "emc_freq", "mem": "mem_freq", "cpu": "cpu_freq"}


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
        # divide by the inverse for scales below 1 (mW -> W): exact for whole milliwatts
        out = value * self.scale if self.scale > 1.0 else value / round(1.0 / self.scale)
        return float(round(out)) if self.role is not None and self.role.is_clock else out

    def describe(self) -> str:
        """``gpu_freq_mhz -> gpu_freq (gpu_clock, x1e+06)``, for logs."""
        if self.role is None:
            return f"{self.header}: a knob with no role (the hardware model treats it generically)"
        conversion = f", x{self.scale:g}" if self.scale != 1.0 else ""
        return f"{self.header} -> {self.name} ({self.role.value} in {KNOBS[self.name].unit or 'names'}{conversion})"


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
