"""The validated measurement table (:class:`Table`), its declarations and its measured spread.

The CSV format is documented in :mod:`edgetune.tables`; this module holds the data and its checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from edgetune.power.knobs import KNOBS, KnobRole

__all__ = [
    "DEFAULT_POWER_CV",
    "DEFAULT_TIME_CV",
    "RESERVED_COLUMNS",
    "Declarations",
    "Spread",
    "Table",
    "TableError",
    "check_train_size",
]

BATCH_SIZE = "batch_size"
STEP_TIME = "step_time_s"
TIME_PER_EPOCH = "time_per_epoch_s"
POWER = "power_w"
PEAK_POWER = "peak_power_w"
EPOCHS_TO_TARGET = "epochs_to_target"
SAMPLES_PER_EPOCH = "samples_per_epoch"
CONVERGENCE_RUNS = "convergence_runs"
CONVERGENCE_FAILURES = "convergence_failures"
REPEATS = "repeats"
TIME_CV = "time_cv"
POWER_CV = "power_cv"

#: Columns with a fixed meaning; every other column is a knob.
RESERVED_COLUMNS = (BATCH_SIZE, STEP_TIME, TIME_PER_EPOCH, POWER, PEAK_POWER, EPOCHS_TO_TARGET,
                    SAMPLES_PER_EPOCH, CONVERGENCE_RUNS, CONVERGENCE_FAILURES, REPEATS, TIME_CV, POWER_CV)

#: Relative spread (std / median) of one measurement's time, for tables without repeats. Source: the Zeus
#: NSDI'23 power traces (V100, A40): at power limits >= 1.5x the measured power the limit does not bind, so
#: those rows are repeated measurements of one setting; median over the 44 such (workload, batch size)
#: groups of >= 3 rows of their time-per-epoch coefficient of variation (tests/test_tables.py recomputes it).
DEFAULT_TIME_CV = 0.031
#: ... and of its mean power, from the same 44 groups.
DEFAULT_POWER_CV = 0.016


class TableError(ValueError):
    """A measurement table that cannot be used, with a one-line message naming the problem and fix."""


@dataclass(frozen=True)
class Declarations:
    """What a table's ``# edgetune: key=value`` header lines declare (None: not declared).

    Attributes:
        default_batch_size: the batch size the job runs at untuned (the baseline a search is compared to);
            in a table without a ``batch_size`` column, the batch size of every row.
        sensor_period_s: the update period of the power sensor the table was measured with; a replay holds
            each reading for this long.
        default_time_cv, default_power_cv: relative spread of one measurement for rows without repeats.
    """

    default_batch_size: int | None = None
    sensor_period_s: float | None = None
    default_time_cv: float | None = None
    default_power_cv: float | None = None

    def items(self) -> list[tuple[str, float | int]]:
        """The declared keys and values, in field order (what :func:`save_table` writes)."""
        return [(k, v) for k, v in vars(self).items() if v is not None]


@dataclass(frozen=True)
class Spread:
    """Relative spread (std / median) of one measurement window, per row, and where it comes from.

    Attributes:
        time_cv, power_cv: per row, of the step time (or time per epoch) and of the mean power.
        source: one line saying which rows use their own repeats and what the others use.
    """

    time_cv: np.ndarray
    power_cv: np.ndarray
    source: str


@dataclass(frozen=True)
class Table:
    """A validated measurement table: one row per (knob setting, batch size), in file order.

    Repeated measurements of a setting are one row here (their median); ``repeats`` says how many,
    ``time_cv`` and ``power_cv`` their spread.

    Attributes:
        knobs: knob names, in file order (registry names where the column maps to a role).
        settings: knob values in the registry's units, shape (rows, len(knobs)).
        batch_size: samples per step, per row; None for a fixed-batch sweep whose batch size is not known.
        power_w: mean power per row.
        step_time_s / time_per_epoch_s: whichever the file gave (None for the other).
        peak_power_w, samples_per_epoch: optional columns, None when absent.
        epochs_to_target: per row (a property of the batch size); ``inf`` never reached, ``nan`` no
            convergence data; None when absent.
        convergence_runs, convergence_failures: per row (a property of the batch size): training runs
            behind ``epochs_to_target`` and how many of them never reached the target; None when absent.
        repeats: measurements aggregated into each row; None when every row is a single measurement.
        time_cv, power_cv: relative spread (std / median) of the repeats per row (``nan`` for a single
            measurement); None when absent.
        source: where the table came from (a path), for messages.
        notes: the ``#`` lines before the header, without the ``#`` (declarations excluded).
        declared: the ``# edgetune:`` declarations.
        lines: the file line each row was (first) given on, for messages; None for a table not read from a
            file (messages then count its rows from 1).
        out_of_memory: the settings the table records as out of memory (a step time or power written
            ``OOM``), one tuple each: the knob values in :attr:`knobs` order, then the batch size where the
            table has a ``batch_size`` column. They are no rows (nothing was measured there); a replay
            answers them with an out-of-memory error. Empty where the table records none.
    """

    knobs: tuple[str, ...]
    settings: np.ndarray
    batch_size: np.ndarray | None
    power_w: np.ndarray
    step_time_s: np.ndarray | None = None
    time_per_epoch_s: np.ndarray | None = None
    peak_power_w: np.ndarray | None = None
    epochs_to_target: np.ndarray | None = None
    samples_per_epoch: np.ndarray | None = None
    convergence_runs: np.ndarray | None = None
    convergence_failures: np.ndarray | None = None
    repeats: np.ndarray | None = None
    time_cv: np.ndarray | None = None
    power_cv: np.ndarray | None = None
    source: str = "<table>"
    notes: tuple[str, ...] = field(default_factory=tuple)
    declared: Declarations = field(default_factory=Declarations)
    lines: tuple[int, ...] | None = None
    out_of_memory: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    def __len__(self) -> int:
        return int(self.power_w.size)

    # ------------------------------------------------------------------------------------- views

    @property
    def batch_sizes(self) -> list[int]:
        """Distinct batch sizes, ascending (empty for a fixed-batch sweep of unknown batch size)."""
        return [] if self.batch_size is None else sorted({int(b) for b in self.batch_size})

    @property
    def default_batch_size(self) -> int | None:
        """The declared untuned batch size of the job (``# edgetune: default_batch_size=``), or None."""
        return self.declared.default_batch_size

    @property
    def roles(self) -> dict[str, KnobRole]:
        """Role of each knob that has one (knobs the registry does not know are left out)."""
        return {k: KNOBS[k].role for k in self.knobs if k in KNOBS}

    def knob_values(self, knob: str) -> list[float]:
        """Distinct values of one knob column, ascending."""
        return sorted({float(v) for v in self.settings[:, self.knobs.index(knob)]})

    def setting(self, i: int) -> dict[str, float]:
        """Knob values of row ``i``."""
        return {k: float(v) for k, v in zip(self.knobs, self.settings[i])}

    def _need_batch(self, what: str) -> np.ndarray:
        if self.batch_size is None:
            raise TableError(f"{self.source}: {what} needs the batch size, and the table has no {BATCH_SIZE} "
                             f"column; declare the batch the sweep ran at with '# edgetune: "
                             f"default_batch_size=<B>' above the header")
        return self.batch_size

    def features(self) -> list[dict[str, float]]:
        """One mapping per row: knob values and ``batch_size`` (the predictors' input)."""
        batch = self._need_batch("the hardware model")
        return [{**self.setting(i), BATCH_SIZE: float(batch[i])} for i in range(len(self))]

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
        return self.time_per_epoch_s * self._need_batch("step time from time per epoch") / n

    @property
    def has_absolute_step_time(self) -> bool:
        return self.step_time_s is not None or (self.samples_per_epoch is not None and self.batch_size is not None)

    def time_per_epoch(self) -> np.ndarray:
        """Seconds per epoch (needs ``time_per_epoch_s`` or ``samples_per_epoch``)."""
        if self.time_per_epoch_s is not None:
            return self.time_per_epoch_s
        if self.samples_per_epoch is None:
            raise TableError(f"{self.source}: time per epoch needs a {TIME_PER_EPOCH} or {SAMPLES_PER_EPOCH} "
                             f"column; add one")
        assert self.step_time_s is not None
        return self.step_time_s * self.samples_per_epoch / self._need_batch("time per epoch from step time")

    def time_to_target_s(self) -> np.ndarray:
        """Epochs to target x time per epoch, per row (``inf`` never reached, ``nan`` unknown)."""
        if self.epochs_to_target is None:
            raise TableError(f"{self.source}: no {EPOCHS_TO_TARGET} column; time to target needs one")
        return self.epochs_to_target * self.time_per_epoch()

    def energy_to_target_j(self) -> np.ndarray:
        return self.time_to_target_s() * self.power_w

    def spread(self) -> Spread:
        """Relative spread of one measurement per row: a row's own repeats where it has them; else the
        declared default (``default_time_cv``, ``default_power_cv``); else the median over the table's
        repeated rows; else :data:`DEFAULT_TIME_CV` / :data:`DEFAULT_POWER_CV` (the Zeus traces)."""
        n = len(self)
        parts: list[str] = []
        out = []
        for name, own, declared, default in (
                ("time", self.time_cv, self.declared.default_time_cv, DEFAULT_TIME_CV),
                ("power", self.power_cv, self.declared.default_power_cv, DEFAULT_POWER_CV)):
            cv = np.full(n, np.nan) if own is None else own.astype(float).copy()
            have = np.isfinite(cv)
            if declared is not None:
                fill, why = declared, "declared"
            elif have.any():
                fill, why = float(np.median(cv[have])), "median of the repeated rows"
            else:
                fill, why = default, "default, from the Zeus NSDI'23 traces"
            cv[~have] = fill
            out.append(cv)
            if have.all():
                parts.append(f"{name}: every row from its repeats (median {float(np.median(cv)):.2%})")
            else:
                parts.append(f"{name}: {int(have.sum())} of {n} rows from their repeats, the others {fill:.2%} "
                             f"({why})")
        return Spread(out[0], out[1], "; ".join(parts))

    def subset(self, rows: Sequence[int] | np.ndarray) -> Table:
        """The table restricted to ``rows`` (validated again)."""
        idx = np.asarray(rows, dtype=int)

        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[idx]

        return replace(self, settings=self.settings[idx], batch_size=pick(self.batch_size),
                       power_w=self.power_w[idx], step_time_s=pick(self.step_time_s),
                       time_per_epoch_s=pick(self.time_per_epoch_s), peak_power_w=pick(self.peak_power_w),
                       epochs_to_target=pick(self.epochs_to_target),
                       samples_per_epoch=pick(self.samples_per_epoch),
                       convergence_runs=pick(self.convergence_runs),
                       convergence_failures=pick(self.convergence_failures), repeats=pick(self.repeats),
                       time_cv=pick(self.time_cv), power_cv=pick(self.power_cv),
                       lines=None if self.lines is None else tuple(self.lines[i] for i in idx))

    def ran_out_of_memory(self, setting: Mapping[str, float], batch_size: int | None) -> bool:
        """Whether the table records ``setting`` at ``batch_size`` as out of memory (:attr:`out_of_memory`;
        ``batch_size`` is ignored in a table without batch sizes)."""
        want = [float(setting[k]) for k in self.knobs if k in setting]
        if len(want) != len(self.knobs):
            return False
        if self.batch_size is not None:
            want.append(float(batch_size) if batch_size is not None else math.nan)
        return any(np.allclose(key, want, rtol=1e-9, atol=1e-9) for key in self.out_of_memory)

    def find(self, setting: Mapping[str, float], batch_size: int | None) -> int | None:
        """Row index of a (setting, batch size), or None. Every knob must be given; ``batch_size`` is
        ignored in a table without batch sizes."""
        missing = [k for k in self.knobs if k not in setting]
        if missing:
            raise KeyError(f"setting lacks knob(s) {', '.join(missing)}")
        want = np.array([float(setting[k]) for k in self.knobs])
        hit = np.all(np.isclose(self.settings, want, rtol=1e-9, atol=1e-9), axis=1)
        if self.batch_size is not None:
            hit &= self.batch_size == batch_size
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

#: optional per-row columns that must be positive finite numbers: column -> Table attribute
_POSITIVE = {STEP_TIME: "step_time_s", TIME_PER_EPOCH: "time_per_epoch_s", POWER: "power_w",
             PEAK_POWER: "peak_power_w", SAMPLES_PER_EPOCH: "samples_per_epoch", REPEATS: "repeats"}
#: columns that hold one value per batch size (all rows of a batch size agree, or all are empty)
_PER_BATCH = {EPOCHS_TO_TARGET: "epochs_to_target", CONVERGENCE_RUNS: "convergence_runs",
              CONVERGENCE_FAILURES: "convergence_failures"}
#: every optional per-row column: column -> Table attribute, in the order files are written
ATTRIBUTES = {STEP_TIME: "step_time_s", TIME_PER_EPOCH: "time_per_epoch_s", POWER: "power_w",
              PEAK_POWER: "peak_power_w", EPOCHS_TO_TARGET: "epochs_to_target",
              SAMPLES_PER_EPOCH: "samples_per_epoch", CONVERGENCE_RUNS: "convergence_runs",
              CONVERGENCE_FAILURES: "convergence_failures", REPEATS: "repeats", TIME_CV: "time_cv",
              POWER_CV: "power_cv"}


def describe_setting(knobs: Sequence[str], values: Sequence[float], batch_size: float | None) -> str:
    """``gpu_freq=6.1e+08, batch_size=64`` for messages."""
    parts = [f"{k}={v:g}" for k, v in zip(knobs, values)]
    if batch_size is not None:
        parts.append(f"{BATCH_SIZE}={batch_size:g}")
    return ", ".join(parts) or "the only setting"


def _where(t: Table, i: int) -> str:
    """Where row ``i`` is, for a message: its line in the file, else its number among the rows (from 1)."""
    return f"row {i + 1}" if t.lines is None else f"line {t.lines[i]}"


def _plain(value: float) -> str:
    """A number as a user wrote it: ``-5``, ``0.25``, ``inf`` (not ``np.float64(-5.0)``)."""
    return f"{float(value):g}"


def _validate_declared(t: Table) -> None:
    d, src = t.declared, t.source
    b = d.default_batch_size
    if b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1):
        raise TableError(f"{src}: default_batch_size must be a positive whole number, got {b!r}")
    if d.sensor_period_s is not None and not (math.isfinite(d.sensor_period_s) and d.sensor_period_s > 0):
        raise TableError(f"{src}: sensor_period_s must be a positive number of seconds, got {d.sensor_period_s!r}")
    for name in ("default_time_cv", "default_power_cv"):
        v = getattr(d, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise TableError(f"{src}: {name} must be a relative spread >= 0 (0.02 = 2%), got {v!r}")


def _validate(t: Table) -> None:
    src = t.source
    n = t.power_w.size
    if n == 0 and t.out_of_memory:
        raise TableError(f"{src}: every row records out of memory: nothing was measured; add rows of settings "
                         f"that ran")
    if n == 0:
        raise TableError(f"{src}: the table has no rows; add measured rows below the header")
    if t.step_time_s is None and t.time_per_epoch_s is None:
        raise TableError(f"{src}: needs a {STEP_TIME} or a {TIME_PER_EPOCH} column")
    for name in t.knobs:
        if name in RESERVED_COLUMNS:
            raise TableError(f"{src}: {name!r} is a reserved column, not a knob")
    if t.settings.shape != (n, len(t.knobs)):
        raise TableError(f"{src}: settings have shape {t.settings.shape}, expected {(n, len(t.knobs))}")
    if t.lines is not None and len(t.lines) != n:
        raise TableError(f"{src}: lines has {len(t.lines)} values for {n} rows")
    width = len(t.knobs) + (t.batch_size is not None)
    for key in t.out_of_memory:
        if len(key) != width or not all(math.isfinite(v) for v in key):
            raise TableError(f"{src}: an out-of-memory setting needs {width} finite values (the knobs"
                             f"{' and the batch size' if t.batch_size is not None else ''}), got {key!r}")
    _validate_declared(t)
    columns = {BATCH_SIZE: t.batch_size, **{c: getattr(t, a) for c, a in ATTRIBUTES.items()}}
    for name, a in columns.items():
        if a is not None and a.shape != (n,):
            raise TableError(f"{src}: column {name} has {a.size} values for {n} rows")
    for name in (BATCH_SIZE, *_POSITIVE):
        a = columns[name]
        if a is None:
            continue
        bad = np.flatnonzero(~np.isfinite(a) | (a <= 0))
        if bad.size:
            raise TableError(f"{src}: {_where(t, bad[0])}: {name} must be a positive finite number, "
                             f"got {_plain(a[bad[0]])}; fix or drop the row")
    bad = np.flatnonzero(~np.isfinite(t.settings).all(axis=1))
    if bad.size:
        raise TableError(f"{src}: {_where(t, bad[0])}: knob values must be finite numbers; fix or drop the row")
    for name in (BATCH_SIZE, REPEATS, CONVERGENCE_RUNS, CONVERGENCE_FAILURES):
        a = columns[name]
        bad = np.flatnonzero(np.isfinite(a) & (a != np.round(a))) if a is not None else ()
        if len(bad):
            raise TableError(f"{src}: {_where(t, bad[0])}: {name} must hold whole numbers, got {_plain(a[bad[0]])}")
    for name in (TIME_CV, POWER_CV, CONVERGENCE_RUNS, CONVERGENCE_FAILURES):
        a = columns[name]
        if a is None:
            continue
        bad = np.flatnonzero(np.isinf(a) | (a < 0))
        if bad.size:
            raise TableError(f"{src}: {_where(t, bad[0])}: {name} must be >= 0 (or empty), got {_plain(a[bad[0]])}")
    if t.epochs_to_target is not None:
        bad = np.flatnonzero(t.epochs_to_target <= 0)
        if bad.size:
            raise TableError(f"{src}: {_where(t, bad[0])}: {EPOCHS_TO_TARGET} must be positive (or inf), got "
                             f"{_plain(t.epochs_to_target[bad[0]])}")
    if t.convergence_runs is not None and t.convergence_failures is not None:
        bad = np.flatnonzero(t.convergence_failures > t.convergence_runs)
        if bad.size:
            raise TableError(f"{src}: {_where(t, bad[0])}: {CONVERGENCE_FAILURES} exceeds {CONVERGENCE_RUNS}; "
                             f"failures are counted among the runs")
    groups = [np.arange(n)] if t.batch_size is None else [np.flatnonzero(t.batch_size == b)
                                                          for b in np.unique(t.batch_size)]
    for name, attr in _PER_BATCH.items():
        a = getattr(t, attr)
        if a is None:
            continue
        for rows in groups:
            vals = a[rows]
            if not (np.all(np.isnan(vals)) or np.all(vals == vals[0])):
                where = ("every row" if t.batch_size is None else
                         f"rows of batch size {int(t.batch_size[rows[0]])}")
                raise TableError(f"{src}: {name} differs between {where}; it is a property of the batch size, "
                                 f"give one value (or leave all empty)")
    keys = t.settings if t.batch_size is None else np.column_stack([t.settings, t.batch_size])
    _, first, counts = np.unique(keys, axis=0, return_index=True, return_counts=True)
    if np.any(counts > 1):
        dup = keys[first[np.argmax(counts > 1)]]
        where = describe_setting(t.knobs, dup[:len(t.knobs)], None if t.batch_size is None else dup[-1])
        raise TableError(f"{src}: duplicate setting {where} ({counts.max()} rows); a table holds one row per "
                         f"setting: load_table aggregates repeats (median), or aggregate them yourself")


def check_train_size(table: Table, k: int) -> None:
    """Raise :class:`TableError` unless ``k`` training rows leave at least one row to evaluate on."""
    if k < 2:
        raise TableError(f"train size {k} is too small: use at least 2 rows")
    if len(table) < 3:
        raise TableError(f"{table.source}: has {len(table)} row{'s' if len(table) != 1 else ''}, too few to "
                         f"evaluate a model on: it needs at least 3 (2 to fit, 1 held out); measure more settings")
    if k >= len(table):
        raise TableError(f"{table.source}: has {len(table)} rows, too few for a train size of {k} plus at least "
                         f"one held-out row; use --train-size {max(2, len(table) - 1)} or less")
