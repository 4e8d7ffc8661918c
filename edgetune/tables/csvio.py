"""Reading and writing measurement tables as CSV (format: :mod:`edgetune.tables`)."""

from __future__ import annotations

import csv
import math
import os
import re
from dataclasses import fields

import numpy as np

from edgetune.log import get_logger
from edgetune.tables.columns import (
    ColumnNameError,
    KnobColumn,
    MeasuredColumn,
    resolve_knob_name,
    resolve_measured_name,
)
from edgetune.tables.table import (
    ATTRIBUTES,
    BATCH_SIZE,
    EPOCHS_TO_TARGET,
    POWER,
    POWER_CV,
    REPEATS,
    STEP_TIME,
    TIME_CV,
    TIME_PER_EPOCH,
    Declarations,
    Table,
    TableError,
    describe_setting,
)

__all__ = ["DECLARATION_PREFIX", "load_table", "save_table"]

_log = get_logger(__name__)

#: a comment line that starts with this (after ``#``) declares ``key=value`` items, comma-separated
DECLARATION_PREFIX = "edgetune:"
_DECLARATION_TYPES = {f.name: int if f.name == "default_batch_size" else float for f in fields(Declarations)}
#: measured columns aggregated by the median of a setting's repeats; their spread is kept for these two
_SPREAD_OF = {TIME_CV: (STEP_TIME, TIME_PER_EPOCH), POWER_CV: (POWER,)}
#: empty cells allowed (read as "no value") in these columns
_MAY_BE_EMPTY = (EPOCHS_TO_TARGET, "convergence_runs", "convergence_failures", TIME_CV, POWER_CV)


#: a measured cell saying the setting ran out of memory (``OOM``, ``CUDA OOM``, ``out of memory``), as sweep
#: scripts write for a batch size that did not fit
_OUT_OF_MEMORY = re.compile(r"(?:cuda[\s_-]*)?(?:oom|out[\s_-]*of[\s_-]*memory)", re.IGNORECASE)
#: the measured columns whose cell may say so (any one of them marks the row)
_OOM_COLUMNS = (STEP_TIME, TIME_PER_EPOCH, POWER)

#: a number written with a decimal comma (``0,0516``, ``1,3e9``), as spreadsheets in many locales save CSV
_DECIMAL_COMMA = re.compile(r"[+-]?\d*,\d+(?:[eE][+-]?\d+)?")


def _number(text: str, src: str, line: int, column: str, header: str | None = None, *,
            decimal_comma: bool = False) -> float:
    """A cell of ``column`` (a reserved column or a knob; ``header``: its header, where it differs);
    ``decimal_comma``: the table writes its decimals with a comma."""
    s = text.strip()
    label = header or column
    if s == "":
        if column in _MAY_BE_EMPTY:
            return math.nan
        raise TableError(f"{src}: line {line}: missing value in column {label}; fill it in or drop the row")
    if decimal_comma:
        if "." in s:
            raise TableError(f"{src}: line {line}: {label} = {s!r} in a table written with decimal commas: a '.' "
                             f"there may be a thousands separator; write the number without it")
        s = s.replace(",", ".")
    try:
        value = float(s)
    except ValueError:
        raise TableError(f"{src}: line {line}: {label} = {s!r} is not a number; fix it, or drop the row (a "
                         f"setting that failed has no row; one that ran out of memory may say OOM)") from None
    if math.isnan(value) or (math.isinf(value) and column != EPOCHS_TO_TARGET):
        raise TableError(f"{src}: line {line}: {label} = {s!r} is not a finite number; fix it or drop the row")
    return value


def _parse_declarations(texts: list[tuple[int, str]], src: str) -> tuple[Declarations, dict[str, str]]:
    """``# edgetune: key=value, column <header>=<name>`` lines -> declarations and column mappings."""
    values: dict[str, float | int] = {}
    columns: dict[str, str] = {}
    for line, text in texts:
        for item in (s.strip() for s in text.split(",")):
            key, sep, value = (s.strip() for s in item.partition("="))
            if not sep or not key or not value:
                raise TableError(f"{src}: line {line}: declaration {item!r} is not key=value (e.g. "
                                 f"'# edgetune: default_batch_size=64' or '# edgetune: column gpu_mhz=gpu_clock')")
            if key.startswith(("column ", "column\t")):
                header = key[len("column"):].strip()
                if header in columns:
                    raise TableError(f"{src}: line {line}: column {header} is declared twice; keep one")
                columns[header] = value
                continue
            kind = _DECLARATION_TYPES.get(key)
            if kind is None:
                raise TableError(f"{src}: line {line}: unknown declaration {key!r}; known: "
                                 f"{', '.join(_DECLARATION_TYPES)}, column <header>=<knob>")
            if key in values:
                raise TableError(f"{src}: line {line}: {key} is declared twice; keep one")
            try:
                number = float(value)
                if kind is int and (not number.is_integer() or number < 1):
                    raise ValueError
            except ValueError:
                what = "a positive whole number" if kind is int else "a number"
                raise TableError(f"{src}: line {line}: {key} = {value!r} is not {what}") from None
            values[key] = int(number) if kind is int else number
    try:
        return Declarations(**values), columns  # type: ignore[arg-type]
    except TypeError as exc:  # pragma: no cover - keys were checked above
        raise TableError(f"{src}: {exc}") from None


def _map_header(header: list[str], declared: dict[str, str],
                src: str) -> list[MeasuredColumn | KnobColumn | None]:
    """Per column: a reserved column (:class:`MeasuredColumn`), a :class:`KnobColumn`, or None (ignored)."""
    unknown = [h for h in declared if h not in header]
    if unknown:
        raise TableError(f"{src}: declares column {unknown[0]}, which the header lacks; the header has "
                         f"{', '.join(header)}")
    out: list[MeasuredColumn | KnobColumn | None] = []
    for h in header:
        target = declared.get(h)
        if target is not None and target.strip().lower() == "ignore":
            out.append(None)
            continue
        try:
            out.append(resolve_measured_name(h, target) or resolve_knob_name(h, target))
        except ColumnNameError as exc:
            raise TableError(f"{src}: {exc}") from None
    names = [c.name for c in out if c is not None]
    for name in set(names):
        if names.count(name) > 1:
            raise TableError(f"{src}: two columns give {name!r}; keep one, or drop the other with "
                             f"'# edgetune: column <header>=ignore'")
    roles = [c for c in out if isinstance(c, KnobColumn) and c.role is not None]
    for c in roles:
        same = [d.header for d in roles if d.role is c.role]
        if len(same) > 1:
            raise TableError(f"{src}: columns {' and '.join(same)} both hold the {c.role.value.replace('_', ' ')} "
                             f"role; keep one, or drop the other with '# edgetune: column {same[1]}=ignore'")
    return out


def _spread_of(values: np.ndarray) -> float:
    """Relative spread (std / median) of a setting's repeats, to 4 significant digits (3 repeats do not
    carry more, and a saved table then reads back unchanged); NaN for a single measurement."""
    if values.size < 2:
        return math.nan
    return float(f"{np.std(values, ddof=1) / np.median(values):.4g}")


def _aggregate(columns: dict[str, np.ndarray], knobs: tuple[str, ...], src: str,
               lines: tuple[int, ...]) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """One row per (setting, batch size): the median of the repeats, their count and relative spread; and the
    file line each row is first given on (``lines``: each measurement's)."""
    n = len(next(iter(columns.values())))
    if n == 0:
        return columns, lines
    key_names = [*knobs, *([BATCH_SIZE] if BATCH_SIZE in columns else [])]
    keys = np.column_stack([columns[k] for k in key_names]) if key_names else np.zeros((n, 0))
    _, first, inverse, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True,
                                          return_counts=True)
    inverse = inverse.reshape(-1)
    if counts.max() <= 1:
        return columns, lines
    given = [c for c in (REPEATS, TIME_CV, POWER_CV) if c in columns]
    if given:
        dup = keys[first[np.argmax(counts > 1)]]
        raise TableError(f"{src}: repeated rows for {describe_setting(knobs, dup[:len(knobs)], None)} in a table "
                         f"with a {given[0]} column (already aggregated); give either one row per setting with "
                         f"its spread, or the raw repeats without {', '.join(given)}")
    order = np.argsort(first, kind="stable")  # groups in order of first appearance in the file
    groups = [np.flatnonzero(inverse == g) for g in order]
    out: dict[str, np.ndarray] = {}
    for name, a in columns.items():
        if name in key_names:
            out[name] = np.array([a[rows[0]] for rows in groups])
        elif name in (EPOCHS_TO_TARGET, "convergence_runs", "convergence_failures", "samples_per_epoch"):
            for rows in groups:  # properties of the batch size: the repeats must agree
                vals = a[rows]
                if not (np.all(np.isnan(vals)) or np.all(vals == vals[0])):
                    where = describe_setting(knobs, keys[rows[0]][:len(knobs)],
                                             columns[BATCH_SIZE][rows[0]] if BATCH_SIZE in columns else None)
                    raise TableError(f"{src}: {name} differs between the repeats of {where}; it is a property "
                                     f"of the batch size, give one value")
            out[name] = np.array([a[rows[0]] for rows in groups])
        else:
            out[name] = np.array([float(np.median(a[rows])) for rows in groups])
    out[REPEATS] = counts[order].astype(float)
    for cv_name, sources in _SPREAD_OF.items():
        col = next((columns[s] for s in sources if s in columns), None)
        if col is not None:
            out[cv_name] = np.array([_spread_of(col[rows]) for rows in groups])
    _log.debug("%s: %d rows aggregated into %d settings (median of up to %d repeats)", src, n, len(groups),
              int(counts.max()))
    return out, tuple(lines[rows[0]] for rows in groups)


def load_table(path: str | os.PathLike) -> Table:
    """Read, map, aggregate and validate a measurement table (format: :mod:`edgetune.tables`)."""
    src = os.fspath(path)
    try:
        with open(src, newline="", encoding="utf-8-sig") as f:  # a byte-order mark (Excel's CSV) is no header
            lines = f.read().splitlines()
    except OSError as exc:
        raise TableError(f"cannot read table {src}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TableError(f"table {src} is not a text CSV file (byte {exc.start} is not UTF-8); pass the "
                         f"CSV table itself") from None
    notes: list[str] = []
    declarations: list[tuple[int, str]] = []
    start = 0
    while start < len(lines) and (lines[start].startswith("#") or not lines[start].strip()):
        text = lines[start][1:].strip()
        if lines[start].startswith("#"):
            if text.lower().startswith(DECLARATION_PREFIX):
                declarations.append((start + 1, text[len(DECLARATION_PREFIX):]))
            else:
                notes.append(text)
        start += 1
    if start >= len(lines):
        raise TableError(f"{src}: empty table; expected a header line with power_w and step_time_s or "
                         f"time_per_epoch_s, and knob columns")
    declared, column_map = _parse_declarations(declarations, src)
    # the delimiter: a comma, else a semicolon or a tab where the header has no comma (spreadsheets in locales
    # with a decimal comma save CSV with semicolons); decimal commas only where the comma is no delimiter
    delimiter = next((d for d in (";", "\t") if "," not in lines[start] and d in lines[start]), ",")
    reader = csv.reader(lines[start:], delimiter=delimiter)
    header = [h.strip() for h in next(reader)]
    rows = list(reader)
    decimal_comma = delimiter != "," and any(_DECIMAL_COMMA.fullmatch(c.strip()) for r in rows for c in r)
    if any(not h for h in header):
        raise TableError(f"{src}: a column has an empty name")
    twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
    if twice is not None:
        raise TableError(f"{src}: column {twice!r} appears twice in the header; keep one, or rename the other")
    mapped = _map_header(header, column_map, src)
    names = [c.name for c in mapped if c is not None]
    if POWER not in names:
        raise TableError(f"{src}: no {POWER!r} column; the header has {', '.join(header)}")
    knob_columns = [c for c in mapped if isinstance(c, KnobColumn)]
    for c in mapped:
        if c is not None and (c.header != c.name or c.scale != 1.0):
            _log.debug("%s: column %s", src, c.describe())
    knobs = tuple(c.name for c in knob_columns)
    values: dict[str, list[float]] = {name: [] for name in names}
    row_lines: list[int] = []  # the file line of each measurement
    out_of_memory: dict[tuple[float, ...], int] = {}  # setting (and batch size) -> its first line
    for offset, row in enumerate(rows):
        line = start + 2 + offset
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise TableError(f"{src}: line {line}: {len(row)} values for {len(header)} columns")
        if any(c is not None and c.name in _OOM_COLUMNS and _OUT_OF_MEMORY.fullmatch(cell.strip())
               for c, cell in zip(mapped, row)):
            key = _setting_key(mapped, row, knobs, src, line, decimal_comma)
            out_of_memory.setdefault(key, line)
            continue
        row_lines.append(line)
        for column, cell in zip(mapped, row):
            if column is not None:
                values[column.name].append(_cell_value(column, cell, src, line, decimal_comma))
    columns, lines_of = _aggregate({k: np.asarray(v, dtype=float) for k, v in values.items()}, knobs, src,
                                   tuple(row_lines))
    oom = _out_of_memory(out_of_memory, columns, knobs, src)
    n = len(columns[POWER])
    batch = columns.get(BATCH_SIZE)
    if batch is None and declared.default_batch_size is not None:
        batch = np.full(n, float(declared.default_batch_size))  # a fixed-batch sweep at the declared batch
        oom = tuple((*key, float(declared.default_batch_size)) for key in oom)
    settings = np.column_stack([columns[k] for k in knobs]) if knobs else np.zeros((n, 0))
    return Table(knobs=knobs, settings=settings.reshape(n, len(knobs)), batch_size=batch,
                 **{attr: columns.get(name) for name, attr in ATTRIBUTES.items()},
                 source=src, notes=tuple(notes), declared=declared, lines=lines_of, out_of_memory=oom)


def _cell_value(column: MeasuredColumn | KnobColumn, cell: str, src: str, line: int, decimal_comma: bool) -> float:
    """A cell of ``column`` in the registry's unit, or :class:`TableError` (not a number, or a value its
    column's unit makes impossible)."""
    if isinstance(column, KnobColumn):
        value = column.convert(_number(cell, src, line, column.header, decimal_comma=decimal_comma))
    else:
        label = column.header if column.header != column.name else None
        value = column.convert(_number(cell, src, line, column.name, label, decimal_comma=decimal_comma))
    wrong_unit = column.implausible(value)
    if wrong_unit is not None:
        raise TableError(f"{src}: line {line}: {wrong_unit}")
    return value


def _setting_key(mapped: list[MeasuredColumn | KnobColumn | None], row: list[str], knobs: tuple[str, ...],
                 src: str, line: int, decimal_comma: bool) -> tuple[float, ...]:
    """The knob values of a row (in ``knobs`` order), then its batch size where the table has the column."""
    cells = {c.name: (c, cell) for c, cell in zip(mapped, row) if c is not None}
    names = (*knobs, *([BATCH_SIZE] if BATCH_SIZE in cells else []))
    return tuple(_cell_value(*cells[name], src, line, decimal_comma) for name in names)


def _out_of_memory(keys: dict[tuple[float, ...], int], columns: dict[str, np.ndarray], knobs: tuple[str, ...],
                   src: str) -> tuple[tuple[float, ...], ...]:
    """The settings recorded out of memory and never measured: a setting that also has a measured row (a
    repeat that ran, where one ran out) is measured, and its out-of-memory line is noted and dropped."""
    if not keys:
        return ()
    n = len(columns[POWER])
    measured = {tuple(float(columns[k][i]) for k in (*knobs, *([BATCH_SIZE] if BATCH_SIZE in columns else [])))
                for i in range(n)}
    ran = [line for key, line in keys.items() if key in measured]
    if ran:
        _log.info("%s: line %s records out of memory where a repeat of the setting ran; its measured rows "
                  "stand", src, ", ".join(map(str, ran)))
    kept = tuple(key for key in keys if key not in measured)
    if kept:
        _log.info("%s: %d setting(s) recorded out of memory (no row; a replay answers them out of memory)",
                  src, len(kept))
    return kept


def _format(value: float) -> str:
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return "inf"
    return f"{value:.10g}"


def save_table(table: Table, path: str | os.PathLike) -> None:
    """Write ``table`` as CSV (notes and declarations first, as ``#`` lines); :func:`load_table` reads it
    back unchanged. Knob columns are written under their registry names, in the registry's units; the
    settings recorded out of memory follow the rows, ``OOM`` in their time and power."""
    names = list(table.knobs) + ([BATCH_SIZE] if table.batch_size is not None else [])
    arrays = [table.settings[:, i] for i in range(len(table.knobs))]
    arrays += [table.batch_size] if table.batch_size is not None else []
    for name, attr in ATTRIBUTES.items():
        if getattr(table, attr) is not None:
            names.append(name)
            arrays.append(getattr(table, attr))
    with open(path, "w", newline="") as f:
        f.writelines(f"# {note}\n" for note in table.notes)
        f.writelines(f"# {DECLARATION_PREFIX} {key}={value:.10g}\n" for key, value in table.declared.items())
        w = csv.writer(f, lineterminator="\n")
        w.writerow(names)
        for i in range(len(table)):
            w.writerow([_format(float(a[i])) for a in arrays])
        width = len(table.knobs) + (table.batch_size is not None)
        for key in table.out_of_memory:  # the settings that ran out of memory, as a sweep script writes them
            w.writerow([_format(v) for v in key] + ["OOM" if name in _OOM_COLUMNS else "" for name in names[width:]])
