"""The search space: batch sizes times the values of the device knobs being tuned.

A space is a *grid* (every combination of batch size and knob values: a board or the twin, which can run
any of them) or a set of *rows* (an explicit list of candidates: a ``trace:`` table, which holds only the
settings it measured; a sparse Jetson clock sweep holds 58 of a 6,776-setting grid). A rows space keeps the
grid's dimensions (the values each knob takes in some row) so that levels, samplers and reports are the
same; :meth:`SearchSpace.grid` lists only the rows, :meth:`SearchSpace.contains` accepts only them, and
:meth:`SearchSpace.candidate` maps levels that name no row to the nearest row (a sampler that knows nothing
of rows, such as TPE, still measures only real rows).

Every dimension is discrete and ordered (batch sizes ascending; frequencies ascending; power modes in
ascending power). Optuna sees each dimension as an integer *level* (``batch_size_level``,
``gpu_freq_level`` ...: an index into the ordered values), so that TPE and GP samplers can use the order;
the values themselves go into each trial's user attributes, ``trials.csv`` and the dashboard.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetune.log import get_logger
from edgetune.power.base import (
    Capability,
    Device,
    DeviceError,
    Knob,
    KnobValue,
    KnobValueError,
    ModeCaps,
    format_value,
)
from edgetune.power.knobs import KNOBS, Candidate

__all__ = ["Candidate", "SearchSpace", "SpaceError", "build_space", "default_batch_sizes"]

BATCH = "batch_size"
LEVEL = "_level"

_log = get_logger(__name__)


class SpaceError(ValueError):
    """A search space that cannot be built from the config (unknown knob, empty list): one line.

    Attributes:
        key: the config key at fault (``space.knobs``, ``space.values``, ``space.batch_sizes``; None: the
            device or table itself), so the caller can say where the user set it.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class SearchSpace:
    """Batch sizes and tuned knobs with their allowed values (ordered), plus knob units for display.

    ``mode_caps`` is what each value of the tuned power mode does to the other knobs, where the device knows
    it (:class:`~edgetune.power.base.ModeCaps`, from ``nvpmodel.conf`` or the twin's profile): a sampler may
    then treat settings that run the same (a clock set above its mode's cap; a setting two modes of the
    same fixed state both run) as one. Empty: nothing is known, every setting counts as its own.

    ``found_caps``: where the power mode is not tuned (a board that offers only the mode it booted in, or
    ``space.knobs`` without it), what the mode in force caps, where the device knows it. The space then holds no
    value above a cap (:func:`build_space`), and the baseline probes and runs its clocks no higher.
    """

    batch_sizes: tuple[int, ...]
    knobs: tuple[tuple[str, tuple[KnobValue, ...]], ...]
    units: tuple[tuple[str, str], ...] = ()
    rows: tuple[Candidate, ...] | None = None  # None: the whole grid; else the only candidates there are
    mode_caps: tuple[tuple[KnobValue, ModeCaps], ...] = ()
    found_caps: ModeCaps | None = None

    @classmethod
    def from_rows(cls, rows: Sequence[Candidate], units: Mapping[str, str] | None = None) -> SearchSpace:
        """A rows space: its dimensions inferred per column (each knob's values in some row, ascending).

        Raises:
            SpaceError: no rows, or rows that do not all set the same knobs.
        """
        rows = tuple(dict.fromkeys(rows))  # in order, without repeats
        if not rows:
            raise SpaceError("space: no rows to search (the table has none for the batch sizes and knob values "
                             "asked for); widen space.batch_sizes or space.values")
        names = tuple(n for n, _ in rows[0].setting)
        if any(tuple(n for n, _ in r.setting) != names for r in rows):
            raise SpaceError("space: rows set different knobs; every row must set the same ones")
        knobs = tuple((n, tuple(sorted({r.knobs[n] for r in rows}))) for n in names)
        units = dict(units or {})
        return cls(batch_sizes=tuple(sorted({r.batch_size for r in rows})), knobs=knobs,
                   units=tuple((n, units.get(n, "")) for n in names), rows=rows)

    @property
    def knob_values(self) -> dict[str, tuple[KnobValue, ...]]:
        return dict(self.knobs)

    @property
    def knob_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.knobs)

    @property
    def unit_of(self) -> dict[str, str]:
        return dict(self.units)

    @property
    def size(self) -> int:
        if self.rows is not None:
            return len(self.rows)
        return len(self.batch_sizes) * math.prod(len(v) for _, v in self.knobs)

    @property
    def grid_size(self) -> int:
        """Settings of the full grid of the dimensions (a rows space holds only :attr:`size` of them)."""
        return len(self.batch_sizes) * math.prod(len(v) for _, v in self.knobs)

    def grid(self) -> Iterator[Candidate]:
        """Every candidate, batch size outermost (a rows space: its rows, in order)."""
        if self.rows is not None:
            yield from self.rows
            return
        names = self.knob_names
        for b in self.batch_sizes:
            for combo in itertools.product(*(v for _, v in self.knobs)):
                yield Candidate(b, tuple(zip(names, combo)))

    # -- Optuna's view --------------------------------------------------------------------------
    def param_names(self) -> list[str]:
        return [BATCH + LEVEL] + [name + LEVEL for name in self.knob_names]

    def distributions(self) -> dict[str, Any]:
        from optuna.distributions import IntDistribution

        dists = {BATCH + LEVEL: IntDistribution(0, len(self.batch_sizes) - 1)}
        for name, values in self.knobs:
            dists[name + LEVEL] = IntDistribution(0, len(values) - 1)
        return dists

    def params(self, candidate: Candidate) -> dict[str, int]:
        """Optuna params (levels) of a candidate."""
        out = {BATCH + LEVEL: self.batch_sizes.index(candidate.batch_size)}
        values = self.knob_values
        for name, value in candidate.setting:
            out[name + LEVEL] = values[name].index(value)
        return out

    def candidate(self, params: Mapping[str, Any]) -> Candidate:
        """The candidate of Optuna params (levels); in a rows space, the row nearest them (module docs)."""
        b = self.batch_sizes[int(params[BATCH + LEVEL])]
        cand = Candidate(b, tuple((name, values[int(params[name + LEVEL])]) for name, values in self.knobs))
        if self.rows is None or cand in self._row_set:
            return cand
        return self.rows[self.nearest_row(self.params(cand))]

    @functools.cached_property
    def _row_set(self) -> frozenset[Candidate]:
        return frozenset(self.rows or ())

    @functools.cached_property
    def row_levels(self) -> np.ndarray:
        """(rows, dims) levels of a rows space's rows (batch size first), in row order."""
        return np.array([[self.params(r)[n] for n in self.param_names()] for r in self.rows or ()], dtype=np.int64)

    def nearest_row(self, params: Mapping[str, Any]) -> int:
        """Index of the row nearest Optuna params: the least sum of level distances, each scaled by its
        dimension's length; ties to the first row."""
        want = np.array([int(params[n]) for n in self.param_names()])
        scale = np.maximum(np.array([len(self.batch_sizes)] + [len(v) for _, v in self.knobs]) - 1, 1)
        return int(np.argmin((np.abs(self.row_levels - want) / scale).sum(axis=1)))

    def contains(self, candidate: Candidate) -> bool:
        if self.rows is not None:
            return candidate in self._row_set
        values = self.knob_values
        return candidate.batch_size in self.batch_sizes and all(
            name in values and v in values[name] for name, v in candidate.setting
        ) and len(candidate.setting) == len(self.knobs)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (stored in the study so a resume can check it is the same space)."""
        out: dict[str, Any] = {"batch_sizes": list(self.batch_sizes), "knobs": {k: list(v) for k, v in self.knobs}}
        if self.rows is not None:
            out["rows"] = len(self.rows)
        return out

    def describe(self) -> str:
        units = self.unit_of
        parts = [f"batch size {list(self.batch_sizes)}"]
        for name, values in self.knobs:
            parts.append(f"{name} {len(values)} values ({format_value(values[0], units.get(name, ''))}"
                         f"..{format_value(values[-1], units.get(name, ''))})" if len(values) > 1
                         else f"{name} {format_value(values[0], units.get(name, ''))}")
        if self.rows is not None:
            return f"{self.size} rows of a {self.grid_size}-setting grid: " + ", ".join(parts)
        return f"{self.size} settings: " + ", ".join(parts)


def default_batch_sizes(default: int, largest: int | None = None) -> tuple[int, ...]:
    """Powers of two around the workload's default: default/8 .. default*8 (the default always included),
    none above ``largest`` (the workload's data size, where it has one)."""
    sizes = {default}
    for k in range(-3, 4):
        b = default * 2.0 ** k
        if b >= 1 and b == int(b):
            sizes.add(int(b))
    return tuple(sorted(b for b in sizes if largest is None or b <= largest))


def build_space(
    device: Device,
    default_batch_size: int,
    batch_sizes: Sequence[int] | None = None,
    knobs: Sequence[str] | None = None,
    values: Mapping[str, Sequence[Any]] | None = None,
    max_batch_size: int | None = None,
) -> SearchSpace:
    """The space for ``device`` from the config's ``[space]`` keys.

    Args:
        device: the open device; its writable knobs are the default dimensions.
        default_batch_size: the workload's default (the default batch sizes are around it).
        batch_sizes: ``space.batch_sizes`` or None.
        knobs: ``space.knobs`` or None for every writable knob.
        values: ``space.values``: allowed subset per knob, in the user's words (``"918MHz"``, ``"max"``).
        max_batch_size: the largest batch the workload's data gives (``Workload.max_batch_size``), or None.

    Raises:
        SpaceError: unknown or read-only knob, value not allowed (names the nearest allowed values), a batch
            size larger than ``max_batch_size``.
    """
    values = dict(values or {})
    bs = tuple(sorted(set(batch_sizes))) if batch_sizes else default_batch_sizes(default_batch_size, max_batch_size)
    if max_batch_size is not None and bs[-1] > max_batch_size:
        over = ", ".join(str(b) for b in bs if b > max_batch_size)
        raise SpaceError(f"batch sizes (--batch-sizes, space.batch_sizes) {over}: larger than the workload's data "
                         f"({max_batch_size} samples); give batch sizes up to {max_batch_size}", "space.batch_sizes")
    if knobs is None:
        names = [n for n, k in device.knobs.items() if k.writable and len(k.values) > 1]
    else:
        names = list(knobs)
    for name in list(names) + list(values):
        if name not in device.knobs:
            raise SpaceError(f"space: {device.name} has no knob {name!r}; its knobs: "
                             f"{', '.join(device.knobs) or 'none'}", "space.knobs" if name in names else "space.values")
    for name in names:
        if not device.knobs[name].writable:
            why = device.knobs[name].why_read_only or "the platform refuses writes"
            raise SpaceError(f"space.knobs: {name} is read-only on {device.name} ({why}); remove it from "
                             f"space.knobs", "space.knobs")
    for name in values:
        if name not in names:
            raise SpaceError(f"space.values lists {name}, which is not tuned; add it to space.knobs", "space.values")
    dims: list[tuple[str, tuple[KnobValue, ...]]] = []
    for name in names:
        knob = device.knobs[name]
        if name in values:
            try:
                chosen = {knob.parse(v) if isinstance(v, str) else knob.validate(v) for v in values[name]}
            except KnobValueError as exc:
                raise SpaceError(f"space.values: {exc}", "space.values") from None
            ordered = tuple(v for v in knob.values if v in chosen)  # the knob's own order
        else:
            ordered = tuple(knob.values)
        dims.append((name, ordered))
    units = tuple((name, device.knobs[name].unit) for name in names)
    if device.has(Capability.TABLE_REPLAY):
        return _rows_space(device, bs, dims, dict(units))
    mode_caps = _mode_caps(device, dims)
    found_caps = _found_caps(device, names) if not mode_caps else None
    if found_caps is not None:  # a value above the mode's cap runs at it: the same setting as the cap
        capped = [(name, _within_cap(found_caps, name, v)) for name, v in dims]
        for (name, named), (_, kept) in zip(dims, capped):
            if name in values and len(kept) < len(named):
                _note_above_cap(device.knobs[name], found_caps, named[len(kept):])
        dims = capped
    return SearchSpace(batch_sizes=bs, knobs=tuple(dims), units=units, mode_caps=mode_caps, found_caps=found_caps)


def _found_caps(device: Device, tuned: Sequence[str]) -> ModeCaps | None:
    """What the power mode in force caps, where the power mode is not tuned and the device knows its caps."""
    for name, knob in device.knobs.items():
        if name in KNOBS and KNOBS[name].role.caps_others and name not in tuned:
            try:
                return (knob.caps or {}).get(knob.read())
            except (OSError, ValueError, DeviceError):  # the mode unreadable: caps unknown, the space as given
                return None
    return None


def _note_above_cap(knob: Knob, caps: ModeCaps, dropped: Sequence[KnobValue]) -> None:
    """Say that values the user named in ``space.values`` are not searched: the power mode in force (not
    tuned) caps the knob below them, so each would run at the cap, a setting the space already holds."""
    cap = caps.cap(knob.name)
    assert cap is not None  # values are dropped only under a cap
    _log.warning("space.values: %s %s: above the cap of the power mode the board is in (%s), so not searched "
                 "(each would run at the cap); to search them, tune power_mode too (space.knobs), or boot the "
                 "board into a higher mode", knob.name, ", ".join(format_value(v, knob.unit) for v in dropped),
                 format_value(cap, knob.unit))


def _within_cap(caps: ModeCaps, name: str, values: tuple[KnobValue, ...]) -> tuple[KnobValue, ...]:
    """``values`` (the knob's order, ascending numbers) up to the first at or above ``name``'s cap."""
    if not values or isinstance(values[0], str):
        return values
    first = caps.capped_from(name, values)
    return values if first is None else values[:first + 1]


def _mode_caps(device: Device, dims: list[tuple[str, tuple[KnobValue, ...]]]) -> tuple[tuple[KnobValue, ModeCaps], ...]:
    """The tuned power mode's caps per value, where the device knows them for every tuned value."""
    for name, values in dims:
        if name in KNOBS and KNOBS[name].role.caps_others:
            caps = device.knobs[name].caps
            if all(v in caps for v in values):
                return tuple((v, caps[v]) for v in values)
    return ()


def _rows_space(device: Device, batch_sizes: tuple[int, ...], dims: list[tuple[str, tuple[KnobValue, ...]]],
                units: dict[str, str]) -> SearchSpace:
    """A table replay's space: its rows at ``batch_sizes`` whose tuned knobs take allowed values and whose
    untuned knobs are at their current values (``device.backend.candidates(b)``: one candidate per row)."""
    allowed = dict(dims)
    found = device.settings()
    rows = []
    for b in batch_sizes:
        for cand in device.backend.candidates(b):
            knobs = cand.knobs
            if all(knobs[n] in allowed[n] if n in allowed else knobs[n] == found.get(n) for n in knobs):
                rows.append(Candidate(cand.batch_size, tuple((n, knobs[n]) for n in allowed)))
    if not rows:
        raise SpaceError(f"space: {device.name} has no row at batch sizes {list(batch_sizes)} with the knob values "
                         f"asked for (untuned knobs at their current values); widen space.batch_sizes, "
                         f"space.knobs or space.values")
    return SearchSpace.from_rows(rows, units)
