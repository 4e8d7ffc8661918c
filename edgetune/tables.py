"""Measurement tables: step time and power measured per (knob setting, batch size), as CSV.

A table is what a profiling run (or a published trace) measured. The predictors learn from tables, the
``trace:<table.csv>`` device replays them, and the search reports its gap to a table's own oracle.

CSV format (one header line; lines starting with ``#`` before it are kept as notes, e.g. the source):

=====================  ===========  =======================================================================
column                 required     meaning
=====================  ===========  =======================================================================
``batch_size``         yes          samples per training step (positive integer)
``step_time_s``        one of the   seconds per training step at that setting
``time_per_epoch_s``   two          seconds per epoch (published traces report this)
``power_w``            yes          mean board/GPU power while training, W
``peak_power_w``       no           highest power seen, W
``epochs_to_target``   no           epochs to reach the quality target at this batch size (same value on
                                    every row of a batch size); ``inf`` = never reached in the runs;
                                    empty on every row of a batch size = no convergence data there
``samples_per_epoch``  no           training set size; relates ``time_per_epoch_s`` and ``step_time_s``
any other column       -            a knob (``gpu_freq`` Hz, ``emc_freq`` Hz, ``power_limit`` W, ...)
=====================  ===========  =======================================================================

Every value must be a finite number (except the two ``epochs_to_target`` cases above); each (knob
setting, batch size) appears once. A bad table raises :class:`TableError` with one line naming the file,
the row and the fix; nothing is ever fitted on a table that did not validate.

This module is data only: it imports nothing else from edgetune.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = [
    "RESERVED_COLUMNS",
    "Table",
    "TableError",
    "check_train_size",
    "load_table",
    "save_table",
]

BATCH_SIZE = "batch_size"
STEP_TIME = "step_time_s"
TIME_PER_EPOCH = "time_per_epoch_s"
POWER = "power_w"
PEAK_POWER = "peak_power_w"
EPOCHS_TO_TARGET = "epochs_to_target"
SAMPLES_PER_EPOCH = "samples_per_epoch"

#: Columns with a fixed meaning; every other column is a knob.
RESERVED_COLUMNS = (BATCH_SIZE, STEP_TIME, TIME_PER_EPOCH, POWER, PEAK_POWER, EPOCHS_TO_TARGET,
                    SAMPLES_PER_EPOCH)


class TableError(ValueError):
    """A measurement table that cannot be used, with a one-line message naming the problem and fix."""


@dataclass(frozen=True)
class Table:
    """A validated measurement table (rows in file order).

    Attributes:
        knobs: knob column names, in file order.
        settings: knob values, shape (rows, len(knobs)).
        batch_size: samples per step, per row.
        power_w: mean power per row.
        step_time_s / time_per_epoch_s: whichever the file gave (None for the other unless derivable).
        peak_power_w, samples_per_epoch: optional columns, None when absent.
        epochs_to_target: per row; ``inf`` never reached, ``nan`` no convergence data; None when absent.
        source: where the table came from (a path), for messages.
        notes: the ``#`` lines before the header, without the ``#``.
    """

    knobs: tuple[str, ...]
    settings: np.ndarray
    batch_size: np.ndarray
    power_w: np.ndarray
    step_time_s: np.ndarray | None = None
    time_per_epoch_s: np.ndarray | None = None
    peak_power_w: np.ndarray | None = None
    epochs_to_target: np.ndarray | None = None
    samples_per_epoch: np.ndarray | None = None
    source: str = "<table>"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        _validate(self)

    def __len__(self) -> int:
        return int(self.batch_size.size)

    # ------------------------------------------------------------------------------------- views

    @property
    def batch_sizes(self) -> list[int]:
        """Distinct batch sizes, ascending."""
        return sorted({int(b) for b in self.batch_size})

    def knob_values(self, knob: str) -> list[float]:
        """Distinct values of one knob column, ascending."""
        return sorted({float(v) for v in self.settings[:, self.knobs.index(knob)]})

    def setting(self, i: int) -> dict[str, float]:
        """Knob values of row ``i``."""
        return {k: float(v) for k, v in zip(self.knobs, self.settings[i])}

    def features(self) -> list[dict[str, float]]:
        """One mapping per row: knob values and ``batch_size`` (the predictors' input)."""
        return [{**self.setting(i), BATCH_SIZE: float(self.batch_size[i])} for i in range(len(self))]

    def step_time(self) -> np.ndarray:
        """Seconds per step; derived from time per epoch where needed.

        Without ``samples_per_epoch`` a time-per-epoch table gives ``time_per_epoch_s * batch_size``: step
        time times the (unknown, constant) number of samples per epoch. Relative errors, rankings and
        every ratio are unaffected; use :attr:`has_absolute_step_time` before relying on seconds.
        """
        if self.step_time_s is not None:
            return self.step_time_s
        assert self.time_per_epoch_s is not None
        n = self.samples_per_epoch if self.samples_per_epoch is not None else 1.0
        return self.time_per_epoch_s * self.batch_size / n

    @property
    def has_absolute_step_time(self) -> bool:
        return self.step_time_s is not None or self.samples_per_epoch is not None

    def time_per_epoch(self) -> np.ndarray:
        """Seconds per epoch (needs ``time_per_epoch_s`` or ``samples_per_epoch``)."""
        if self.time_per_epoch_s is not None:
            return self.time_per_epoch_s
        if self.samples_per_epoch is None:
            raise TableError(f"{self.source}: time per epoch needs a {TIME_PER_EPOCH} or {SAMPLES_PER_EPOCH} "
                             f"column; add one")
        assert self.step_time_s is not None
        return self.step_time_s * self.samples_per_epoch / self.batch_size

    def time_to_target_s(self) -> np.ndarray:
        """Epochs to target x time per epoch, per row (``inf`` never reached, ``nan`` unknown)."""
        if self.epochs_to_target is None:
            raise TableError(f"{self.source}: no {EPOCHS_TO_TARGET} column; time to target needs one")
        return self.epochs_to_target * self.time_per_epoch()

    def energy_to_target_j(self) -> np.ndarray:
        return self.time_to_target_s() * self.power_w

    def subset(self, rows: Sequence[int] | np.ndarray) -> Table:
        """The table restricted to ``rows`` (validated again)."""
        idx = np.asarray(rows, dtype=int)

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return replace(self, settings=self.settings[idx], batch_size=self.batch_size[idx],
                       power_w=self.power_w[idx], step_time_s=pick(self.step_time_s),
                       time_per_epoch_s=pick(self.time_per_epoch_s), peak_power_w=pick(self.peak_power_w),
                       epochs_to_target=pick(self.epochs_to_target),
                       samples_per_epoch=pick(self.samples_per_epoch))

    def find(self, setting: Mapping[str, float], batch_size: int) -> int | None:
        """Row index of a (setting, batch size), or None. Every knob must be given."""
        missing = [k for k in self.knobs if k not in setting]
        if missing:
            raise KeyError(f"setting lacks knob(s) {', '.join(missing)}")
        want = np.array([float(setting[k]) for k in self.knobs])
        hit = (self.batch_size == batch_size) & np.all(
            np.isclose(self.settings, want, rtol=1e-9, atol=1e-9), axis=1)
        rows = np.flatnonzero(hit)
        return int(rows[0]) if rows.size else None

    def oracle(self, budget_w: float | None = None, objective: str = "time") -> int | None:
        """Row with the least time (or energy) to target whose mean power is within ``budget_w``.

        Rows without convergence data or that never reach the target are skipped. None if no row
        qualifies.
        """
        if objective not in ("time", "energy"):
            raise ValueError("objective must be 'time' or 'energy'")
        cost = self.time_to_target_s() if objective == "time" else self.energy_to_target_j()
        ok = np.isfinite(cost)
        if budget_w is not None:
            ok &= self.power_w <= budget_w
        if not ok.any():
            return None
        return int(np.flatnonzero(ok)[np.argmin(cost[ok])])


# ------------------------------------------------------------------------------------------ validation


def _column_names(table: Table) -> list[str]:
    names = list(table.knobs) + [BATCH_SIZE]
    for name in (STEP_TIME, TIME_PER_EPOCH, POWER, PEAK_POWER, EPOCHS_TO_TARGET, SAMPLES_PER_EPOCH):
        if getattr(table, _ATTR[name]) is not None:
            names.append(name)
    return names


_ATTR = {STEP_TIME: "step_time_s", TIME_PER_EPOCH: "time_per_epoch_s", POWER: "power_w",
         PEAK_POWER: "peak_power_w", EPOCHS_TO_TARGET: "epochs_to_target", SAMPLES_PER_EPOCH: "samples_per_epoch"}


def _validate(t: Table) -> None:
    src = t.source
    n = t.batch_size.size
    if n == 0:
        raise TableError(f"{src}: the table has no rows; add measured rows below the header")
    if t.step_time_s is None and t.time_per_epoch_s is None:
        raise TableError(f"{src}: needs a {STEP_TIME} or a {TIME_PER_EPOCH} column")
    for name in t.knobs:
        if name in RESERVED_COLUMNS:
            raise TableError(f"{src}: {name!r} is a reserved column, not a knob")
    if t.settings.shape != (n, len(t.knobs)):
        raise TableError(f"{src}: settings have shape {t.settings.shape}, expected {(n, len(t.knobs))}")
    for name in (BATCH_SIZE, STEP_TIME, TIME_PER_EPOCH, POWER, PEAK_POWER, SAMPLES_PER_EPOCH):
        a = t.batch_size if name == BATCH_SIZE else getattr(t, _ATTR[name])
        if a is None:
            continue
        if a.shape != (n,):
            raise TableError(f"{src}: column {name} has {a.size} values for {n} rows")
        bad = np.flatnonzero(~np.isfinite(a) | (a <= 0))
        if bad.size:
            raise TableError(f"{src}: row {bad[0] + 1}: {name} must be a positive finite number, "
                             f"got {a[bad[0]]!r}; fix or drop the row")
    bad = np.flatnonzero(~np.isfinite(t.settings).all(axis=1))
    if bad.size:
        raise TableError(f"{src}: row {bad[0] + 1}: knob values must be finite numbers; fix or drop the row")
    if np.any(t.batch_size != np.round(t.batch_size)):
        raise TableError(f"{src}: batch_size must hold whole numbers")
    if t.epochs_to_target is not None:
        e = t.epochs_to_target
        if e.shape != (n,):
            raise TableError(f"{src}: column {EPOCHS_TO_TARGET} has {e.size} values for {n} rows")
        bad = np.flatnonzero(e <= 0)
        if bad.size:
            raise TableError(f"{src}: row {bad[0] + 1}: {EPOCHS_TO_TARGET} must be positive (or inf)")
        for b in np.unique(t.batch_size):
            vals = e[t.batch_size == b]
            if not (np.all(np.isnan(vals)) or np.all(vals == vals[0])):
                raise TableError(f"{src}: {EPOCHS_TO_TARGET} differs between rows of batch size {int(b)}; "
                                 f"it is a property of the batch size, give one value (or leave all empty)")
    # duplicate settings
    keys = np.column_stack([t.settings, t.batch_size])
    _, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
    if np.any(counts > 1):
        dup = keys[first[np.argmax(counts > 1)]]
        where = ", ".join(f"{k}={v:g}" for k, v in zip([*t.knobs, BATCH_SIZE], dup))
        raise TableError(f"{src}: duplicate setting {where} ({counts.max()} rows); keep one row per setting "
                         f"(e.g. the median of repeats)")


def check_train_size(table: Table, k: int) -> None:
    """Raise :class:`TableError` unless ``k`` training rows leave at least one row to evaluate on."""
    if k < 2:
        raise TableError(f"train size {k} is too small: use at least 2 rows")
    if k >= len(table):
        raise TableError(f"{table.source}: has {len(table)} rows, too few for a train size of {k} plus at least "
                         f"one held-out row; use --train-size {max(2, len(table) - 1)} or less")


# ------------------------------------------------------------------------------------------ CSV I/O


def _number(text: str, src: str, line: int, column: str) -> float:
    s = text.strip()
    if s == "":
        raise TableError(f"{src}: line {line}: missing value in column {column}; fill it in or drop the row")
    try:
        value = float(s)
    except ValueError:
        raise TableError(f"{src}: line {line}: {column} = {s!r} is not a number") from None
    if math.isnan(value) or (math.isinf(value) and column != EPOCHS_TO_TARGET):
        raise TableError(f"{src}: line {line}: {column} = {s!r} is not a finite number")
    return value


def load_table(path: str | os.PathLike) -> Table:
    """Read and validate a measurement table (see the module docstring for the format)."""
    src = os.fspath(path)
    try:
        with open(src, newline="") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise TableError(f"cannot read table {src}: {exc.strerror or exc}") from None
    notes: list[str] = []
    start = 0
    while start < len(lines) and (lines[start].startswith("#") or not lines[start].strip()):
        if lines[start].startswith("#"):
            notes.append(lines[start][1:].strip())
        start += 1
    if start >= len(lines):
        raise TableError(f"{src}: empty table; expected a header line with batch_size, power_w and "
                         f"step_time_s or time_per_epoch_s")
    reader = csv.reader(lines[start:])
    header = [h.strip() for h in next(reader)]
    if len(set(header)) != len(header):
        raise TableError(f"{src}: repeated column names in the header")
    for required in (BATCH_SIZE, POWER):
        if required not in header:
            raise TableError(f"{src}: no {required!r} column; the header has {', '.join(header)}")
    knobs = tuple(h for h in header if h not in RESERVED_COLUMNS)
    if any(not k for k in knobs):
        raise TableError(f"{src}: a column has an empty name")
    columns: dict[str, list[float]] = {h: [] for h in header}
    for offset, row in enumerate(reader):
        line = start + 2 + offset
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise TableError(f"{src}: line {line}: {len(row)} values for {len(header)} columns")
        for name, cell in zip(header, row):
            if name == EPOCHS_TO_TARGET and cell.strip() == "":
                columns[name].append(math.nan)  # no convergence data at this batch size
            else:
                columns[name].append(_number(cell, src, line, name))

    def col(name: str) -> np.ndarray | None:
        return np.asarray(columns[name], dtype=float) if name in columns else None

    batch = col(BATCH_SIZE)
    assert batch is not None
    settings = np.column_stack([columns[k] for k in knobs]) if knobs else np.zeros((batch.size, 0))
    return Table(knobs=knobs, settings=settings.reshape(batch.size, len(knobs)), batch_size=batch,
                 power_w=col(POWER), step_time_s=col(STEP_TIME), time_per_epoch_s=col(TIME_PER_EPOCH),
                 peak_power_w=col(PEAK_POWER), epochs_to_target=col(EPOCHS_TO_TARGET),
                 samples_per_epoch=col(SAMPLES_PER_EPOCH), source=src, notes=tuple(notes))


def _format(value: float) -> str:
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "inf"
    return f"{value:.10g}"


def save_table(table: Table, path: str | os.PathLike) -> None:
    """Write ``table`` as CSV (notes first, as ``#`` lines); :func:`load_table` reads it back unchanged."""
    names = _column_names(table)
    arrays = [table.settings[:, i] for i in range(len(table.knobs))] + [table.batch_size] + [
        getattr(table, _ATTR[n]) for n in names[len(table.knobs) + 1:]]
    with open(path, "w", newline="") as f:
        f.writelines(f"# {note}\n" for note in table.notes)
        w = csv.writer(f, lineterminator="\n")
        w.writerow(names)
        for i in range(len(table)):
            w.writerow([_format(float(a[i])) for a in arrays])
