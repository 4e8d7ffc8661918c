"""``edgetune trace import-zeus`` and ``edgetune predict-eval``: measurement tables in, tables and errors out.

``import-zeus`` converts the Zeus NSDI'23 traces (``summary_power_<gpu>.csv`` + ``summary_train.csv``) into
one measurement table per workload (format: :mod:`edgetune.tables`):

* the knob is ``power_limit``; ``time_per_epoch_s`` and ``power_w`` come from the power summary;
* where a workload was measured with several optimizers (V100 CIFAR-100: Adadelta and Adam), the table
  uses the optimizer of that workload's convergence runs in ``summary_train.csv`` (the only one whose
  epochs to target are known); every other optimizer gets its own hardware-only table
  ``<gpu>_<workload>_<optimizer>.csv`` (no ``epochs_to_target``);
* ``epochs_to_target`` per batch size is the median, over the seeds that reached the target
  (``--target``), of the first epoch that did; ``convergence_runs`` and ``convergence_failures`` count the
  seeds and those that never got there. A batch size counts as reaching the target when more than half of
  its seeds did; where at most half did, ``epochs_to_target`` is ``inf``. Why: a failed run says nothing
  about how fast a run converges, only how often runs fail; counting it as infinitely long in the median
  (the earlier rule) biased the figure upward whenever a seed failed (CIFAR-100 batch 4096: 498 epochs
  with one failure in five, where the four that converged took a median of 477), and the failure rate is
  kept in its own column instead. The majority rule for "reaches" is the one the earlier median implied,
  so the same batch sizes reach the target as before. Batch sizes measured for power but never trained are
  left empty (no convergence data). Every such case is printed.
* ``default_batch_size`` is declared per table (``# edgetune: default_batch_size=``): Zeus's default batch
  size of the workload (``ZEUS_DEFAULT_BATCH_SIZES``), capped at the table's largest, as Zeus's own
  trace-driven runs do.
* ``samples_per_epoch`` is the training-set size of the dataset (``DATASET_SIZES``; override with
  ``--samples-per-epoch``). It only sets the step length when a table is replayed (step time = time per
  epoch x batch size / samples); times and energies to target do not depend on it.
* A table already in ``--out`` is refused before any is written (``--force`` overwrites).

``predict-eval`` fits the hardware model on K random rows of a table and prints its error on the rest.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from edgetune.cli import EXIT_USAGE, UsageError
from edgetune.tables import Declarations, Table, TableError, check_train_size, load_table, save_table

__all__ = ["DATASET_SIZES", "DEFAULT_TARGETS", "ZEUS_DEFAULT_BATCH_SIZES", "import_zeus", "predict_eval",
           "register"]

#: default quality targets per dataset (issue 5): accuracy, WER (lower is better), hit rate, F1, accuracy
DEFAULT_TARGETS: dict[str, float] = {
    "cifar100": 0.6,
    "imagenet": 0.65,
    "librispeech": 40.0,
    "movielens-1m": 0.41,
    "squad": 84.0,
    "sentiment140": 0.84,
}

#: training-set sizes (samples per epoch) from the datasets' own documentation
DATASET_SIZES: dict[str, int] = {
    "cifar100": 50_000,  # CIFAR-100 train split
    "imagenet": 1_281_167,  # ILSVRC-2012 train
    "librispeech": 281_241,  # LibriSpeech 960 h train utterances
    "movielens-1m": 1_000_209,  # MovieLens-1M ratings
    "squad": 87_599,  # SQuAD v1.1 train questions
    "sentiment140": 1_600_000,  # Sentiment140 train tweets
}

#: the valid ``--target`` and ``--samples-per-epoch`` items their error lines show
TARGET_EXAMPLE = "cifar100=0.6"
SIZE_EXAMPLE = f"squad={DATASET_SIZES['squad']}"
#: rows a hardware model is fitted on by default: the budget experiments/predictor_comparison.py measures
DEFAULT_TRAIN_ROWS = 10
FIRST_DATA_LINE = 2  # CSV line of the first row (line 1 is the header), for error messages
#: the batch size each workload runs at untuned: ``get_job_with_defaults`` in Zeus's
#: examples/research_reproducibility/zeus_nsdi23/run_alibaba.py (ml-energy/zeus; capped there at the largest
#: batch size in the power trace, which makes LibriSpeech 192, the ``--b_0`` default of run_single.py)
ZEUS_DEFAULT_BATCH_SIZES: dict[str, int] = {
    "cifar100": 1024,
    "imagenet": 256,
    "librispeech": 256,
    "movielens-1m": 1024,
    "squad": 32,
    "sentiment140": 128,
}

_POWER_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "power_limit", "time_per_epoch",
                  "average_power")
_TRAIN_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "run", "target_metric", "target_epoch")


def _read_csv(path: str, required: Sequence[str], what: str) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a BOM: saved by Excel
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise UsageError(f"{path} is not a Zeus {what} summary: no column(s) {', '.join(missing)}")
            return list(reader)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _float(row: dict[str, str], column: str, path: str, line: int) -> float:
    try:
        return float(row[column])
    except (TypeError, ValueError):
        raise UsageError(f"{path}: line {line}: {column} = {row[column]!r} is not a number") from None


def _gpu_name(power_csv: str) -> str:
    stem = os.path.splitext(os.path.basename(power_csv))[0]
    return stem.removeprefix("summary_power_")


def import_zeus(power_csv: str, train_csv: str, targets: dict[str, float] | None = None,
                samples_per_epoch: dict[str, int] | None = None) -> tuple[dict[str, Table], list[str]]:
    """Convert Zeus summaries into tables by file name, plus the report lines (see the module docstring)."""
    targets = {**DEFAULT_TARGETS, **(targets or {})}
    sizes = {**DATASET_SIZES, **(samples_per_epoch or {})}
    gpu = _gpu_name(power_csv)
    power_rows = _read_csv(power_csv, _POWER_COLUMNS, "power")
    train_rows = _read_csv(train_csv, _TRAIN_COLUMNS, "training")

    # (dataset, network, optimizer) -> {(batch, limit): (time, power)}
    measured: dict[tuple[str, str, str], dict[tuple[int, float], tuple[float, float]]] = defaultdict(dict)
    for line, r in enumerate(power_rows, start=FIRST_DATA_LINE):
        key = (r["dataset"], r["network"], r["optimizer"])
        b = _float(r, "batch_size", power_csv, line)
        limit = _float(r, "power_limit", power_csv, line)
        t, p = _float(r, "time_per_epoch", power_csv, line), _float(r, "average_power", power_csv, line)
        if (int(b), limit) in measured[key]:
            raise UsageError(f"{power_csv}: line {line}: a second row for {key[0]}/{key[1]} {key[2]} batch size "
                             f"{int(b)} at {limit:g} W")
        measured[key][(int(b), limit)] = (t, p)
    if not measured:
        raise UsageError(f"{power_csv} has no measurements")

    # (dataset, network) -> optimizer -> batch -> run -> {target: epoch}
    runs: dict[tuple[str, str], dict[str, dict[int, dict[str, dict[float, float]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(dict))))
    for line, r in enumerate(train_rows, start=FIRST_DATA_LINE):
        epoch = r["target_epoch"].strip().lower()
        e = math.inf if epoch in ("nan", "") else _float(r, "target_epoch", train_csv, line)
        run_id = f"{r.get('learning_rate', '')}/{r['run']}"
        runs[(r["dataset"], r["network"])][r["optimizer"]][int(_float(r, "batch_size", train_csv, line))][
            run_id][_float(r, "target_metric", train_csv, line)] = e
    for dataset in targets:
        if dataset not in DEFAULT_TARGETS and not any(d == dataset for d, _ in runs):
            raise UsageError(f"--target names dataset {dataset!r}, which {train_csv} does not have; datasets: "
                             f"{', '.join(sorted({d for d, _ in runs}))}")

    tables: dict[str, Table] = {}
    report: list[str] = []
    for (dataset, network) in sorted({(d, n) for d, n, _ in measured}):
        optimizers = sorted(o for d, n, o in measured if (d, n) == (dataset, network))
        trained = runs.get((dataset, network), {})
        main = next((o for o in optimizers if o in trained), None)
        name = f"{gpu}_{dataset}_{network}"
        for opt in optimizers:
            data = measured[(dataset, network, opt)]
            keys = sorted(data)
            batch = np.array([k[0] for k in keys], dtype=float)
            epochs = runs_col = failures_col = None
            notes = [(f"Zeus NSDI'23 trace ({os.path.basename(power_csv)}), {dataset}/{network}, optimizer {opt}; "
                      f"Apache-2.0, ml-energy/zeus")]
            if opt == main:
                target = targets.get(dataset)
                if target is None:
                    raise UsageError(f"no target for dataset {dataset!r}: pass --target {dataset}=<value>")
                per_batch, lines = _epochs_to_target(trained[opt], target, f"{name}")
                report.extend(lines)
                conv = [per_batch.get(int(b), (math.nan, math.nan, math.nan)) for b in batch]
                unknown = sorted({int(b) for b in batch if int(b) not in per_batch})
                if unknown:
                    report.append(f"{name}: batch size(s) {', '.join(map(str, unknown))}: measured for power but "
                                  f"no convergence runs; epochs_to_target left empty")
                epochs, runs_col, failures_col = (np.array(c, dtype=float) for c in zip(*conv))
                notes.append(f"epochs_to_target: median over the seeds that reached {target:g} of the first "
                             f"epoch that did (summary_train.csv); inf = at most half the seeds reached it; "
                             f"empty = no runs")
                file_name = f"{name}.csv"
            else:
                why = (f"not the optimizer of the convergence runs ({main})" if main else
                       "no convergence runs for this workload")
                report.append(f"{name}: optimizer {opt}: hardware-only table ({why})")
                file_name = f"{name}_{opt}.csv" if main else f"{name}.csv"
            size = sizes.get(dataset)
            default_b = ZEUS_DEFAULT_BATCH_SIZES.get(dataset)
            if default_b is not None:
                default_b = min(default_b, int(batch.max()))
            table = Table(
                knobs=("power_limit",),
                settings=np.array([[k[1]] for k in keys], dtype=float),
                batch_size=batch,
                time_per_epoch_s=np.array([data[k][0] for k in keys]),
                power_w=np.array([data[k][1] for k in keys]),
                epochs_to_target=epochs,
                samples_per_epoch=None if size is None else np.full(len(keys), float(size)),
                convergence_runs=runs_col,
                convergence_failures=failures_col,
                source=file_name,
                notes=tuple(notes),
                declared=Declarations(default_batch_size=default_b),
            )
            tables[file_name] = table
    return tables, report


def _epochs_to_target(by_batch: dict[int, dict[str, dict[float, float]]], target: float,
                      name: str) -> tuple[dict[int, tuple[float, int, int]], list[str]]:
    """Per batch size: (epochs to ``target``, runs, runs that never reached it), and lines on the misses.

    Epochs: the median over the runs that reached the target when more than half did, else ``inf``.
    """
    result: dict[int, tuple[float, int, int]] = {}
    lines: list[str] = []
    available: set[float] = set()
    for b, run_map in sorted(by_batch.items()):
        epochs = []
        for targets in run_map.values():
            available.update(targets)
            # the target as written in the CSV and as given: the same number up to float rounding
            hit = [e for t, e in targets.items() if math.isclose(t, target, rel_tol=1e-9, abs_tol=1e-12)]
            if hit:
                epochs.append(hit[0])
        if not epochs:
            continue
        reached = [e for e in epochs if math.isfinite(e)]
        missed = len(epochs) - len(reached)
        median = float(np.median(reached)) if 2 * len(reached) > len(epochs) else math.inf
        result[b] = (median, len(epochs), missed)
        if missed:
            outcome = ("epochs_to_target = inf: at most half reached it" if math.isinf(median) else
                       f"median {median:g} epochs over the {len(reached)} that did")
            lines.append(f"{name}: batch size {b}: {missed} of {len(epochs)} runs never reached {target:g} "
                         f"({outcome})")
    if not result:
        raise UsageError(f"{name}: no run records target {target:g}; targets in the data: "
                         f"{', '.join(f'{t:g}' for t in sorted(available))}")
    return result, lines


def _parse_pairs(items: Sequence[str] | None, flag: str, kind: type, example: str) -> dict:
    """``DATASET=VALUE`` items as {dataset: kind(value)}; ``example`` is a valid item, for the error line."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        try:
            if not sep or not key:
                raise ValueError
            out[key.strip()] = kind(value)
        except ValueError:
            raise UsageError(f"{flag} {item!r}: expected DATASET=VALUE, e.g. {flag} {example}") from None
    return out


def _parse_sizes(items: Sequence[str] | None) -> dict[str, int]:
    """``--samples-per-epoch``'s items: a training-set size is a whole number of samples, at least 1."""
    flag = "--samples-per-epoch"
    sizes = _parse_pairs(items, flag, int, SIZE_EXAMPLE)
    for dataset, size in sizes.items():
        if size < 1:
            raise UsageError(f"{flag} {dataset}={size}: a training-set size must be a whole number of samples, "
                             f"at least 1, e.g. {flag} {SIZE_EXAMPLE}")
    return sizes


def _parse_targets(items: Sequence[str] | None) -> dict[str, float]:
    """``--target``'s items: a quality target is a finite number (nan or inf would match no run)."""
    targets = _parse_pairs(items, "--target", float, TARGET_EXAMPLE)
    for dataset, value in targets.items():
        if not math.isfinite(value):
            raise UsageError(f"--target {dataset}={value}: a quality target must be a finite number, e.g. --target "
                             f"{TARGET_EXAMPLE}")
    return targets


def _cmd_import_zeus(args: argparse.Namespace) -> int:
    targets = _parse_targets(args.target)
    sizes = _parse_sizes(args.samples_per_epoch)
    try:
        tables, report = import_zeus(args.power_csv, args.train_csv, targets, sizes)
    except TableError as exc:  # a value the table's own checks refuse: one line, as every bad input
        raise UsageError(str(exc)) from None
    there = [name for name in tables if os.path.exists(os.path.join(args.out, name))]
    if there and not args.force:  # checked before any is written: all or none
        more = f" (and {len(there) - 1} more of the {len(tables)} tables)" if len(there) > 1 else ""
        raise UsageError(f"{os.path.join(args.out, there[0])} exists{more}: edgetune never overwrites a table; "
                         f"give another --out, or pass --force to overwrite them")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {args.out}: {exc.strerror or exc}") from None
    for file_name, table in tables.items():
        save_table(table, os.path.join(args.out, file_name))
        print(f"wrote {os.path.join(args.out, file_name)}: {len(table)} rows, batch sizes "
              f"{', '.join(map(str, table.batch_sizes))}")
    for line in report:
        print(f"note: {line}")
    return 0


def _check_positive_knobs(table: Table) -> None:
    """Raise :class:`TableError` at a knob value the hardware model cannot take: a table holds any finite one (a
    fan level 0, a clock offset -100), the model's bases and scaling positive ones only."""
    bad = np.argwhere(table.settings <= 0)
    if bad.size:
        i, j = (int(v) for v in bad[0])
        where = f"row {i + 1}" if table.lines is None else f"line {table.lines[i]}"
        raise TableError(f"{table.source}: {where}: {table.knobs[j]} = {table.settings[i, j]:g}; the hardware model "
                         f"takes positive knob values only (clocks, core counts, limits): declare the column "
                         f"'# edgetune: column {table.knobs[j]}=ignore' above the header, or drop it")


def predict_eval(table: Table, train_size: int, seed: int) -> dict:
    """Fit the hardware model on ``train_size`` random rows; errors on the others (pure, no printing)."""
    from edgetune.predictors import HardwareModel

    check_train_size(table, train_size)
    _check_positive_knobs(table)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(table))
    train, test = order[:train_size], order[train_size:]
    X = table.features()
    t, p = table.step_time(), table.power_w
    started = time.perf_counter()
    model = HardwareModel(random_state=seed).fit([X[i] for i in train], t[train], p[train])
    fit_s = time.perf_counter() - started
    rows = [X[i] for i in test]
    pred = model.predict(rows)
    time_err = np.abs(pred.step_time_s / t[test] - 1.0)
    power_err = np.abs(pred.power_w / p[test] - 1.0)
    # the doubt: the shares of held-out truths within 2 predicted std, the GP's alone and with the refits' spread
    return {"model": model, "train": train, "test": test, "fit_s": fit_s, "time_errors": time_err,
            "power_errors": power_err, "time_mape": float(time_err.mean() * 100),
            "power_mape": float(power_err.mean() * 100), "coverage": pred.within_std(t[test], p[test]),
            "coverage_refit_spread": model.predict(rows, refit_spread=True).within_std(t[test], p[test])}


def _cmd_predict_eval(args: argparse.Namespace) -> int:
    try:
        table = load_table(args.table)
        result = predict_eval(table, args.train_size, args.seed)
    except TableError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # the hardware model's: what the table's own checks let through
        raise UsageError(f"{args.table}: the hardware model cannot fit it: {exc}") from None
    model = result["model"]
    print(f"table: {args.table} ({len(table)} rows; knobs: {', '.join(table.knobs) or 'none'})")
    print(f"trained on {args.train_size} random rows (seed {args.seed}); base model: {model.base_kind_}; "
          f"fit in {result['fit_s'] * 1000:.0f} ms")
    worst = int(np.argmax(result["time_errors"]))
    row = int(result["test"][worst])
    where = ", ".join(f"{k}={v:g}" for k, v in table.setting(row).items())
    print(f"evaluated on {len(result['test'])} held-out rows; worst time error "
          f"{result['time_errors'][worst] * 100:.1f}% at {where}, batch size {int(table.batch_size[row])}")
    (tg, pg), (ts, ps) = result["coverage"], result["coverage_refit_spread"]
    print(f"held-out rows within 2 predicted std (about 95% if the doubt is honest): time {tg:.0%}, power {pg:.0%} "
          f"(the GP's std, which the search uses); time {ts:.0%}, power {ps:.0%} with the refits' spread")
    print(f"time MAPE: {result['time_mape']:.2f}% | power MAPE: {result['power_mape']:.2f}%")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="measurement tables: import published traces",
                                  description="Measurement tables (CSV): import published traces.")
    trace_sub = trace.add_subparsers(dest="trace_command", metavar="ACTION")
    trace.set_defaults(func=lambda args: trace.print_help() or EXIT_USAGE)
    zeus = trace_sub.add_parser(
        "import-zeus", help="convert the Zeus NSDI'23 traces into one table per workload",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    zeus.add_argument("power_csv", metavar="POWER_CSV", help="summary_power_<gpu>.csv")
    zeus.add_argument("train_csv", metavar="TRAIN_CSV", help="summary_train.csv")
    zeus.add_argument("--out", required=True, metavar="DIR",
                      help="folder for the tables (a table already there is refused: see --force)")
    zeus.add_argument("--force", action="store_true", help="overwrite tables already in --out")
    zeus.add_argument("--target", action="append", metavar="DATASET=VALUE",
                      help="quality target per dataset (repeatable); defaults: " +
                      ", ".join(f"{k}={v:g}" for k, v in DEFAULT_TARGETS.items()))
    zeus.add_argument("--samples-per-epoch", action="append", metavar="DATASET=N",
                      help="training-set size per dataset (repeatable)")
    zeus.set_defaults(func=_cmd_import_zeus)

    pe = subparsers.add_parser("predict-eval", help="error of the hardware model fitted on K rows of a table",
                               description="Fit the hardware model on K random rows of a measurement table and "
                                           "print its error on all other rows.")
    pe.add_argument("table", metavar="TABLE", help="measurement table (CSV)")
    pe.add_argument("--train-size", type=_positive_int, default=DEFAULT_TRAIN_ROWS, metavar="K",
                    help=f"training rows (default {DEFAULT_TRAIN_ROWS})")
    pe.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the row choice (default 0)")
    pe.set_defaults(func=_cmd_predict_eval)
