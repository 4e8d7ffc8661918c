"""Convergence truth: measured steps to a validation target per batch size, and the law's prediction of them.

McCandlish et al. (2018) predict the optimizer steps to a target as S(b) = S_min (1 + B_noise / b). This
module holds the pure pieces that check that law against real training runs
(``experiments/convergence_truth.py``) and the measured table the runs leave behind
(``experiments/data/convergence/``), which the benchmark's scorer reads:

* :func:`crossing_step` - the step at which a validation metric first reaches its target, interpolated
  between evaluations;
* :func:`geometric_schedule` - evaluation steps spaced by a constant ratio (constant relative resolution);
* :func:`predict_from_warmup` - S(b) from a noise scale measured in a warm-up at one batch size and the
  steps measured there (S_min = S(b_w) / (1 + B_noise / b_w));
* :func:`steps_error` and :func:`choice_loss` - how far the predicted curve is from the measured one, in
  steps and in time to target lost by choosing the batch size from the prediction;
* :func:`load_convergence` / :func:`save_convergence_rows`, :func:`load_b_noise` - the measured tables
  (steps over seeds per batch size; B_noise over warm-up seeds, their median the workload's value);
  :func:`append_convergence_row` adds one run to such a table (``edgetune.tune(runs_file=...)`` records the
  user's own runs this way, in the format ``edgetune search --steps-to-target`` reads).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

__all__ = [
    "COMMENT_PREFIX",
    "CONVERGENCE_COLUMNS",
    "ChoiceLoss",
    "ConvergenceError",
    "ConvergenceRow",
    "MeasuredCurve",
    "MeasuredNoiseScale",
    "NoiseScaleRow",
    "append_convergence_row",
    "check_appendable",
    "choice_loss",
    "crossing_step",
    "geometric_schedule",
    "load_b_noise",
    "load_convergence",
    "misaligned_cells",
    "predict_from_warmup",
    "read_b_noise_rows",
    "read_comment",
    "read_convergence_rows",
    "save_b_noise_rows",
    "save_convergence_rows",
    "steps_error",
]


class ConvergenceError(ValueError):
    """A convergence table that cannot be read; the message is one line naming the file and the fix."""


# ------------------------------------------------------------------------------------------ steps to target


def crossing_step(steps: Sequence[float], values: Sequence[float], target: float, *,
                  higher_is_better: bool) -> float:
    """The step at which ``values`` (a metric evaluated at ``steps``) first reaches ``target``.

    Between the last evaluation short of the target and the first one at or past it the metric is taken
    as linear in the step, so the answer is not tied to the evaluation grid; reached at the first
    evaluation, or next to one that is not finite (a diverged loss), the answer is that step. ``nan`` when
    the target is never reached (a ``nan`` value never reaches it). Accuracy wants ``higher_is_better=True``,
    a loss ``False``.
    """
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    if s.shape != v.shape or s.ndim != 1:
        raise ValueError("steps and values must be 1-d and of the same length")
    if s.size and np.any(np.diff(s) <= 0):
        raise ValueError("steps must be strictly increasing")
    sign = 1.0 if higher_is_better else -1.0
    margin = sign * (v - target)  # >= 0: target reached
    hits = np.flatnonzero(margin >= 0)
    if hits.size == 0:
        return math.nan
    k = int(hits[0])
    if k == 0:
        return float(s[0])
    m0, m1 = margin[k - 1], margin[k]  # m0 < 0 <= m1
    if not (math.isfinite(m0) and math.isfinite(m1)):
        return float(s[k])  # a diverged evaluation (nan, inf) beside it: nothing to interpolate by
    return float(s[k - 1] + (s[k] - s[k - 1]) * (-m0) / (m1 - m0))


def geometric_schedule(first: int = 1, ratio: float = 1.1) -> Iterator[int]:
    """Evaluation steps ``first, ...``, each at least one step and ``ratio`` times past the last.

    A constant ratio gives every run the same relative resolution (about ``(ratio - 1) / 2`` after
    :func:`crossing_step`'s interpolation), whatever its length, for ``log(N) / log(ratio)`` evaluations.
    """
    if first < 1 or isinstance(first, bool):
        raise ValueError(f"first must be a positive integer, got {first!r}")
    if not ratio > 1.0:
        raise ValueError(f"ratio must be above 1, got {ratio!r}")
    step = int(first)
    while True:
        yield step
        step = max(step + 1, math.ceil(step * ratio))


# ------------------------------------------------------------------------------------------ prediction


def predict_from_warmup(batch_sizes: Sequence[float] | np.ndarray, b_noise: float, warmup_batch: float,
                        warmup_steps: float) -> np.ndarray:
    """S(b) = S_min (1 + B_noise / b), anchored on the steps measured at the warm-up batch size.

    Args:
        batch_sizes: where to predict.
        b_noise: the gradient noise scale measured in the warm-up (samples); ``inf`` means steps fall as
            1/b everywhere (S(b) = S(b_w) b_w / b).
        warmup_batch: the warm-up's batch size b_w.
        warmup_steps: steps to target measured at b_w; S_min = S(b_w) / (1 + B_noise / b_w).
    """
    b = np.asarray(batch_sizes, dtype=float)
    if not (warmup_batch > 0 and warmup_steps > 0 and np.all(b > 0)):
        raise ValueError("batch sizes and warm-up steps must be positive")
    if not b_noise >= 0:  # also rejects nan
        raise ValueError(f"b_noise must be a non-negative number of samples, got {b_noise!r}")
    if math.isinf(b_noise):
        return warmup_steps * warmup_batch / b
    s_min = warmup_steps / (1.0 + b_noise / warmup_batch)
    return s_min * (1.0 + b_noise / b)


def steps_error(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray) -> float:
    """Mean absolute relative error ``mean(|predicted / measured - 1|)`` (a fraction), over finite pairs."""
    p = np.asarray(predicted, dtype=float)
    m = np.asarray(measured, dtype=float)
    if p.shape != m.shape:
        raise ValueError("predicted and measured must have the same shape")
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    if not ok.any():
        raise ValueError("no batch size has both a prediction and a measurement")
    return float(np.mean(np.abs(p[ok] / m[ok] - 1.0)))


@dataclass(frozen=True)
class ChoiceLoss:
    """The batch size each curve picks for the least time to target, and what the predicted pick costs.

    ``loss`` is measured time to target at ``predicted_choice`` over that at ``measured_choice``, minus 1
    (0 when both curves pick the same batch size).
    """

    measured_choice: int
    predicted_choice: int
    measured_time_s: float
    predicted_choice_time_s: float

    @property
    def loss(self) -> float:
        return self.predicted_choice_time_s / self.measured_time_s - 1.0


def choice_loss(batch_sizes: Sequence[int], predicted_steps: Sequence[float], measured_steps: Sequence[float],
                step_time_s: Sequence[float]) -> ChoiceLoss:
    """Time to target lost by choosing the batch size from ``predicted_steps`` instead of ``measured_steps``.

    Time to target at b is steps(b) x step_time_s(b); each curve picks its argmin among the batch sizes
    measured to reach the target (a ``nan`` measurement is a batch size that never reached it: it is
    never the measured pick, and the predicted pick falls on the next best measured one).
    """
    b = np.asarray(batch_sizes, dtype=int)
    p = np.asarray(predicted_steps, dtype=float)
    m = np.asarray(measured_steps, dtype=float)
    t = np.asarray(step_time_s, dtype=float)
    if not (b.shape == p.shape == m.shape == t.shape) or b.ndim != 1:
        raise ValueError("batch_sizes, predicted_steps, measured_steps and step_time_s must be 1-d, same length")
    if not np.all(t > 0):
        raise ValueError("step times must be positive")
    ok = np.isfinite(m) & np.isfinite(p)
    if not ok.any():
        raise ValueError("no batch size has both a prediction and a measurement")
    idx = np.flatnonzero(ok)
    measured_time = m[idx] * t[idx]
    predicted_time = p[idx] * t[idx]
    i_meas = idx[int(np.argmin(measured_time))]
    i_pred = idx[int(np.argmin(predicted_time))]
    return ChoiceLoss(measured_choice=int(b[i_meas]), predicted_choice=int(b[i_pred]),
                      measured_time_s=float(m[i_meas] * t[i_meas]),
                      predicted_choice_time_s=float(m[i_pred] * t[i_pred]))


# ------------------------------------------------------------------------------------------ the measured table

@dataclass(frozen=True)
class ConvergenceRow:
    """One training run: steps to the validation target at one batch size and seed.

    ``steps`` is ``nan`` when the run stopped (``max_samples``) before reaching the target; ``lr`` is the
    learning rate the run trained with (the workload's, rescaled to ``batch_size`` by the runtime's rule).
    """

    workload: str
    metric: str
    target: float
    batch_size: int
    seed: int
    lr: float
    steps: float
    evaluations: int
    wall_s: float


CONVERGENCE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ConvergenceRow))


@dataclass(frozen=True)
class NoiseScaleRow:
    """B_noise of one workload from one warm-up run (seed ``warmup_seed``), measured with
    :class:`~edgetune.predictors.GradientNoiseScale`.

    Measured during a warm-up run at ``warmup_batch`` split into ``micro_batches`` equal micro-batches
    (the estimator's two batch sizes) until the validation target was reached after ``warmup_steps`` steps.
    ``b_noise`` is the estimate at that point with EMA decay ``beta``; ``b_noise_fast`` the same with the
    shorter memory ``fast_beta``, and ``b_noise_first_steps`` that fast estimate after only the first
    ``first_steps`` steps (what ``search.efficiency.measure_b_noise``'s short warm-up sees). All three come
    from the same gradients.
    """

    workload: str
    b_noise: float
    beta: float
    warmup_batch: int
    micro_batches: int
    warmup_seed: int
    warmup_steps: float
    fast_beta: float
    b_noise_fast: float
    first_steps: int
    b_noise_first_steps: float


@dataclass(frozen=True)
class MeasuredCurve:
    """Steps to target per batch size for one workload: median over seeds, and the spread."""

    workload: str
    metric: str
    target: float
    batch_sizes: tuple[int, ...]
    median_steps: tuple[float, ...]
    min_steps: tuple[float, ...]
    max_steps: tuple[float, ...]
    seeds: tuple[int, ...]

    def steps(self, batch_size: int) -> float:
        """Median steps to target at ``batch_size`` (``nan`` where most seeds never reached it)."""
        try:
            return self.median_steps[self.batch_sizes.index(batch_size)]
        except ValueError:
            raise KeyError(f"{self.workload}: no measurement at batch size {batch_size}; "
                           f"measured: {', '.join(map(str, self.batch_sizes))}") from None


@dataclass(frozen=True)
class MeasuredNoiseScale:
    """B_noise of one workload over its warm-up runs (one :class:`NoiseScaleRow` per seed): the median.

    One warm-up is one draw: the same estimator over nine warm-ups that differ only in their seed reads cnn's
    B_noise 5.2-29.4 samples, mobilenet's 55.7-91.8 and chartransformer's 0.6-20.9
    (``experiments/results/convergence_truth.txt``), so a workload's value is the median over several, as its
    steps to target are the median over seeds. A warm-up without a finite figure (one that never reached the
    target, or the target before ``first_steps``) is left out of that figure's median.
    """

    workload: str
    runs: tuple[NoiseScaleRow, ...]

    def _median(self, field: str) -> float:
        """The median of ``field`` over the warm-ups that have a finite one (``nan`` where none has)."""
        values = [v for v in (getattr(r, field) for r in self.runs) if math.isfinite(v)]
        return float(np.median(values)) if values else math.nan

    @property
    def b_noise(self) -> float:
        """Median B_noise over the warm-ups, in samples."""
        return self._median("b_noise")

    @property
    def b_noise_fast(self) -> float:
        """Median of the warm-ups' estimates with the shorter memory ``fast_beta`` (for reference)."""
        return self._median("b_noise_fast")

    @property
    def b_noise_first_steps(self) -> float:
        """Median of the fast estimates after the first ``first_steps`` steps, over the warm-ups that ran that
        long (for reference)."""
        return self._median("b_noise_first_steps")

    @property
    def warmup_steps(self) -> float:
        """Median steps the warm-ups took to reach the target."""
        return self._median("warmup_steps")

    @property
    def seeds(self) -> tuple[int, ...]:
        return tuple(r.warmup_seed for r in self.runs)

    @property
    def warmup_batch(self) -> int:
        """The warm-ups' batch size (every warm-up of one workload shares its settings)."""
        return self.runs[0].warmup_batch

    @property
    def micro_batches(self) -> int:
        return self.runs[0].micro_batches

    @property
    def beta(self) -> float:
        return self.runs[0].beta

    @property
    def fast_beta(self) -> float:
        return self.runs[0].fast_beta

    @property
    def first_steps(self) -> int:
        return self.runs[0].first_steps


#: the warm-up settings the runs of one :class:`MeasuredNoiseScale` share
_SHARED_WARMUP_FIELDS = ("warmup_batch", "micro_batches", "beta", "fast_beta", "first_steps")


#: A line of a table file starting with this is a comment (provenance: data set, lr rule, target, commit).
COMMENT_PREFIX = "#"


def _write_rows(path: str | os.PathLike, rows: Iterable[object], columns: Sequence[str],
                comment: Sequence[str] = ()) -> None:
    with open(path, "w", newline="") as f:
        parts = (part for line in comment for part in str(line).splitlines() or [""])
        f.writelines(f"{COMMENT_PREFIX} {part}".rstrip() + "\n" for part in parts)
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_fmt(getattr(row, c)) for c in columns])


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def misaligned_cells(record: Mapping[Any, Any], used: Sequence[str], columns: int) -> str | None:
    """Why a :class:`csv.DictReader` record of a header of ``columns`` columns does not line up with it, as
    ``has N cells for the M columns: ...``, or None: a cell past the last column (an unquoted ``1,000`` moves
    every later cell one column on and reads as 1) or a line cut short before a column of ``used`` (its value
    would read as missing). An empty cell past the last column (a trailing comma) is no value and passes."""
    extra = [c for c in record.get(None) or () if c.strip()]
    short = [c for c in used if record.get(c) is None]
    if not extra and not short:
        return None
    cells = columns + len(record.get(None) or ()) if extra else sum(v is not None for k, v in record.items()
                                                                     if k is not None)
    why = (f"a cell past the last column ({extra[0]!r}: a number with a thousands separator? write 1000)"
           if extra else f"no {short[0]} cell (a value left empty keeps its comma)")
    return f"has {cells} cell{'s' if cells != 1 else ''} for the {columns} columns: {why}"


def _read_rows(path: str | os.PathLike, cls: type) -> list:
    """The rows of a table file as ``cls``; a line cut short, or with a cell past the last column (an unquoted
    ``1,050`` moves every later cell one column on), is refused (:class:`ConvergenceError`), never read shifted."""
    types = {f.name: f.type for f in fields(cls)}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a BOM: a table saved by Excel
            lines = [(n, text) for n, text in enumerate(f, start=1) if not text.startswith(COMMENT_PREFIX)]
            reader = csv.DictReader(text for _, text in lines)
            missing = [c for c in types if c not in (reader.fieldnames or [])]
            if missing:
                raise ConvergenceError(f"{path}: missing column(s) {', '.join(missing)}; write the table with "
                                       f"experiments/convergence_truth.py")
            rows = []
            for record in reader:
                line = lines[reader.line_num - 1][0]  # the file's line number, comments counted
                problem = misaligned_cells(record, (), len(reader.fieldnames or []))
                if problem is not None:
                    raise ConvergenceError(f"{path}: line {line} {problem}")
                try:
                    values = {k: _parse(types[k], record[k]) for k in types}
                except ValueError as exc:
                    raise ConvergenceError(f"{path}, line {line}: {exc}") from None
                rows.append(cls(**values))
    except OSError as exc:
        raise ConvergenceError(f"cannot read {path}: {exc.strerror or exc}") from None
    return rows


def _parse(kind: object, text: str | None) -> object:
    if text is None:
        raise ValueError("short row")
    if kind in (int, "int"):
        return int(text)
    if kind in (float, "float"):
        return float(text)
    return text


def save_convergence_rows(path: str | os.PathLike, rows: Iterable[ConvergenceRow],
                          comment: Sequence[str] = ()) -> None:
    """Write the runs as CSV with :data:`CONVERGENCE_COLUMNS` (``nan``: target not reached).

    ``comment`` lines go first, each prefixed with ``#`` (the readers skip them): the provenance.
    """
    _write_rows(path, rows, CONVERGENCE_COLUMNS, comment)


def save_b_noise_rows(path: str | os.PathLike, rows: Iterable[NoiseScaleRow], comment: Sequence[str] = ()) -> None:
    """Write the warm-ups' noise scales (one row per workload and warm-up seed) as CSV, after ``comment`` lines
    as :func:`save_convergence_rows`."""
    _write_rows(path, rows, [f.name for f in fields(NoiseScaleRow)], comment)


def _header(path: str | os.PathLike) -> list[str] | None:
    """The column names of a table file (its first line that is not a comment); None: no such line."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        for text in f:
            if not text.startswith(COMMENT_PREFIX) and text.strip():
                return next(csv.reader([text]))
    return None


def check_appendable(path: str | os.PathLike) -> None:
    """Raise :class:`ConvergenceError` (one line) unless :func:`append_convergence_row` can add to ``path``:
    a new file in an existing, writable folder, or a table whose columns are :data:`CONVERGENCE_COLUMNS`.

    Checked before a run starts, so a run is never trained for a file that cannot take its row.
    """
    name = os.fspath(path)
    if os.path.isdir(name):
        raise ConvergenceError(f"{name} is a folder; name a CSV file for the runs (runs.csv)")
    if not os.path.exists(name):
        folder = os.path.dirname(os.path.abspath(name))
        if not os.path.isdir(folder):
            raise ConvergenceError(f"cannot write {name}: no folder {folder}; create it first")
        if not os.access(folder, os.W_OK):
            raise ConvergenceError(f"cannot write {name}: folder {folder} is not writable")
        return
    try:
        header = _header(name)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConvergenceError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    if header is not None and tuple(header) != CONVERGENCE_COLUMNS:
        raise ConvergenceError(f"{name} has the columns {','.join(header)}, not a runs table's "
                               f"({','.join(CONVERGENCE_COLUMNS)}); name a new file, edgetune writes its header")
    if not os.access(name, os.W_OK):
        raise ConvergenceError(f"cannot write {name}: it is read-only")


def append_convergence_row(path: str | os.PathLike, row: ConvergenceRow, comment: Sequence[str] = ()) -> None:
    """Add one run to the table at ``path``; a new (or empty) file first gets ``comment`` and the header.

    Earlier rows are never rewritten: the row goes to the end of the file in one write (with several runs
    appending to one table at once, each row stays whole). Call :func:`check_appendable` first.
    """
    with open(path, "a", newline="") as f:
        buffer = io.StringIO()
        if f.tell() == 0:
            buffer.writelines(f"{COMMENT_PREFIX} {part}".rstrip() + "\n"
                              for line in comment for part in str(line).splitlines() or [""])
            csv.writer(buffer).writerow(CONVERGENCE_COLUMNS)
        csv.writer(buffer).writerow([_fmt(getattr(row, c)) for c in CONVERGENCE_COLUMNS])
        f.write(buffer.getvalue())


def read_comment(path: str | os.PathLike) -> list[str]:
    """The ``#`` comment lines of a table file written here, without the prefix (raises :class:`ConvergenceError`)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            return [text[len(COMMENT_PREFIX):].rstrip("\r\n").removeprefix(" ") for text in f
                    if text.startswith(COMMENT_PREFIX)]
    except OSError as exc:
        raise ConvergenceError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_convergence_rows(path: str | os.PathLike) -> list[ConvergenceRow]:
    """The runs as written by :func:`save_convergence_rows` (raises :class:`ConvergenceError`)."""
    return _read_rows(path, ConvergenceRow)


def load_convergence(path: str | os.PathLike) -> dict[str, MeasuredCurve]:
    """The measured table as one :class:`MeasuredCurve` per workload.

    The median over seeds counts a run that never reached the target as infinitely many steps, so a batch
    size where most seeds missed the target has a ``nan`` median (and ``inf`` maximum).

    Raises:
        ConvergenceError: unreadable file, missing columns, a bad value, or one workload with two targets.
    """
    rows = read_convergence_rows(path)
    by_workload: dict[str, list[ConvergenceRow]] = {}
    for row in rows:
        by_workload.setdefault(row.workload, []).append(row)
    curves = {}
    for name, runs in by_workload.items():
        targets = {(r.metric, r.target) for r in runs}
        if len(targets) != 1:
            raise ConvergenceError(f"{path}: workload {name!r} has several targets {sorted(targets)}; keep one "
                                   f"target per workload")
        (metric, target), = targets
        sizes = sorted({r.batch_size for r in runs})
        med, lo, hi = [], [], []
        for b in sizes:
            steps = np.array([r.steps if math.isfinite(r.steps) else math.inf for r in runs if r.batch_size == b])
            m = float(np.median(steps))
            med.append(m if math.isfinite(m) else math.nan)
            lo.append(float(steps.min()))
            hi.append(float(steps.max()))
        curves[name] = MeasuredCurve(name, metric, target, tuple(sizes), tuple(med), tuple(lo), tuple(hi),
                                     tuple(sorted({r.seed for r in runs})))
    return curves


def read_b_noise_rows(path: str | os.PathLike) -> list[NoiseScaleRow]:
    """The warm-ups as written by :func:`save_b_noise_rows` (raises :class:`ConvergenceError`)."""
    return _read_rows(path, NoiseScaleRow)


def load_b_noise(path: str | os.PathLike) -> Mapping[str, MeasuredNoiseScale]:
    """Workload -> its warm-ups as one :class:`MeasuredNoiseScale` (their median is the workload's B_noise).

    Raises:
        ConvergenceError: unreadable file, missing columns, a bad value, a warm-up seed twice for one workload,
            or warm-ups of one workload with different settings (batch size, micro-batches, decays).
    """
    by_workload: dict[str, list[NoiseScaleRow]] = {}
    for row in read_b_noise_rows(path):
        by_workload.setdefault(row.workload, []).append(row)
    for name, runs in by_workload.items():
        seeds = [r.warmup_seed for r in runs]
        if len(set(seeds)) != len(seeds):
            raise ConvergenceError(f"{path}: workload {name!r} has warm-up seed(s) "
                                   f"{sorted({s for s in seeds if seeds.count(s) > 1})} twice; keep one row each")
        for field in _SHARED_WARMUP_FIELDS:
            if len({getattr(r, field) for r in runs}) != 1:
                raise ConvergenceError(f"{path}: workload {name!r} has warm-ups with different {field}; measure "
                                       f"every warm-up of one workload alike")
    return {name: MeasuredNoiseScale(name, tuple(sorted(runs, key=lambda r: r.warmup_seed)))
            for name, runs in by_workload.items()}
