"""Steps to target from the user's own training runs, where the noise-scale law is not trusted.

The law S_min (1 + B_noise / b) (:mod:`edgetune.search.efficiency`) has one shape. A real training run need not
follow it: with the learning rate scaled to the batch, edgetune's CNN needs 2.8x more steps at batch 8 than at
16, more than any S_min (1 + B/b) allows, and an energy search that trusts the law there picks a batch size up
to 7% short of the best (``experiments/results/oracle_gap_energy.txt``). A user who has trained the model to
the target at a few batch sizes knows better; ``efficiency.steps_to_target = "runs.csv"`` hands that to the
search (:class:`RunsTarget`).

The file is a CSV with a header; lines starting with ``#`` are comments. Columns (others are ignored):

* ``batch_size``: the run's batch size (a positive integer; ``16.0`` reads as 16);
* ``steps``: its optimizer steps to the target (empty, ``nan`` or ``inf``: the run never reached it);
* ``workload`` (optional): whose run it is; the search keeps the rows of the workload it searches (a file of
  several workloads read without naming one is refused);
* ``metric`` and ``target`` (optional): what the run trained to; the rows kept must share one (runs to
  different targets are refused: their steps do not compare).

So the measured table ``experiments/convergence_truth.py`` writes (``experiments/data/convergence/steps.csv``)
serves as it is. A line whose cells do not line up with the header (a cell past the last column, as an
unquoted ``1,000`` makes, or a line cut short before a column read) is refused, never read shifted. Several
runs of one batch size (seeds) are repeats: their median counts, a run that missed the target counting as
infinitely many steps (so a batch size most runs missed is never chosen).

Between the batch sizes measured, steps are interpolated linearly in log steps against log batch size (a
power law between neighbours); outside them, the law fitted to the measured medians
(:func:`edgetune.predictors.fit_steps_to_target`) carries the nearest measured one on. A batch size next to
or beyond one most of whose runs missed the target is taken to miss it too (it is never picked). ``S_min`` and ``B_noise`` report that fit;
they decide nothing inside the measured span.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgetune.search.efficiency import LAW_RATIO_PRECISION, TargetModel

__all__ = ["RunsTarget", "RunsTargetError"]

#: lines of a runs file that start with this are comments
COMMENT_PREFIX = "#"
#: standard error of a sample's median over its mean's, for a normal sample (sqrt(pi / 2))
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2.0)


class RunsTargetError(ValueError):
    """A runs file that cannot serve: unreadable, missing a column, a bad value, too few batch sizes."""


#: the columns a runs file's rows are read by (module docs); others are ignored
_USED_COLUMNS = ("workload", "metric", "target", "batch_size", "steps")


def _check_cells(record: Mapping[Any, Any], used: Sequence[str], columns: int, name: str, line: int) -> None:
    """Refuse a line whose cells do not line up with the header (:func:`~edgetune.predictors.convergence.
    misaligned_cells`): an unquoted ``1,000`` would read as the run's 1 step, a line cut short as a run that
    missed the target."""
    from edgetune.predictors.convergence import misaligned_cells

    problem = misaligned_cells(record, used, columns)
    if problem is not None:
        raise RunsTargetError(f"{name}: line {line} {problem}")


def _median_steps(steps: Sequence[float]) -> float:
    """The median of runs' steps, a run that missed the target counting as infinitely many (inf: most did)."""
    return float(statistics.median(s if math.isfinite(s) else math.inf for s in steps))


@dataclass(frozen=True)
class RunsTarget(TargetModel):
    """Steps to target from measured training runs (module docs).

    Attributes:
        runs: ``(batch size, (steps of each run, ...))`` in increasing batch size; ``inf``: a run that never
            reached the target.
        source: where the runs came from (a file name), for reports.
        s_min, b_noise: the noise-scale law fitted to the measured medians (used outside the measured span).
    """

    s_min: float = math.nan
    b_noise: float = math.nan
    b_noise_source: str = "measured runs"
    runs: tuple[tuple[int, tuple[float, ...]], ...] = ()
    source: str = ""

    @classmethod
    def from_runs(cls, runs: Mapping[int, Sequence[float]], source: str = "measured runs") -> RunsTarget:
        """The target from steps per batch size (several runs of one batch size: repeats).

        Raises:
            RunsTargetError: a batch size that is not a positive integer, steps that are not positive (``-inf``
                included; ``nan`` and ``inf`` are runs that missed the target), or fewer than two batch sizes
                whose median run reached the target.
        """
        from edgetune.predictors import fit_steps_to_target

        clean: dict[int, tuple[float, ...]] = {}
        for b, steps in runs.items():
            if int(b) != b or b <= 0:
                raise RunsTargetError(f"{source}: batch size {b!r} is not a positive integer")
            given = tuple(float(s) for s in steps)
            values = tuple(s if math.isfinite(s) else math.inf for s in given)
            if any(s <= 0 for s in given):  # -inf too: not a run that missed the target (nan or inf)
                raise RunsTargetError(f"{source}: batch size {b}: steps to target must be positive (leave a run "
                                      f"that never reached the target empty)")
            if values:
                clean[int(b)] = values
        medians = {b: _median_steps(s) for b, s in sorted(clean.items())}
        reached = {b: m for b, m in medians.items() if math.isfinite(m)}
        if len(reached) < 2:
            raise RunsTargetError(f"{source}: steps to target at {len(reached)} batch size(s) where most runs "
                                  f"reached it; measure runs at two batch sizes or more (or drop "
                                  f"efficiency.steps_to_target to use the noise-scale law)")
        fit = fit_steps_to_target(list(reached), list(reached.values()))
        sizes = ", ".join(map(str, reached))
        return cls(s_min=fit.s_min, b_noise=fit.b_noise,
                   b_noise_source=f"steps to target measured at batch sizes {sizes} ({source})",
                   runs=tuple(sorted(clean.items())), source=source)

    @classmethod
    def from_csv(cls, path: str | os.PathLike, workload: str | None = None) -> RunsTarget:
        """The target from a runs file (module docs), keeping ``workload``'s rows where it names workloads.

        Raises:
            RunsTargetError: see :meth:`from_runs`; also an unreadable file, a missing column, a bad value, a
                line whose cells do not line up with the header, no row of ``workload``, or (``workload`` None)
                rows of several workloads.
        """
        name = os.fspath(path)
        try:
            with open(path, newline="", encoding="utf-8-sig") as f:  # a BOM: saved by Excel
                lines = [(n, text) for n, text in enumerate(f, start=1) if not text.startswith(COMMENT_PREFIX)]
        except OSError as exc:
            raise RunsTargetError(f"cannot read {name}: {exc.strerror or exc}") from None
        reader = csv.DictReader(text for _, text in lines)
        if reader.fieldnames:  # "batch_size, steps": the space after a comma is no part of a name
            reader.fieldnames = [c.strip() for c in reader.fieldnames]
        missing = [c for c in ("batch_size", "steps") if c not in (reader.fieldnames or [])]
        if missing:
            raise RunsTargetError(f"{name}: missing column(s) {', '.join(missing)}; a runs file has the columns "
                                  f"batch_size and steps (steps to the target of each run)")
        by_workload = "workload" in (reader.fieldnames or [])
        by_target = {"metric", "target"} <= set(reader.fieldnames or [])
        runs: dict[int, list[float]] = {}
        seen: set[str] = set()
        targets: dict[tuple[str, str], int] = {}  # (metric, target) -> its first line
        used = [c for c in (reader.fieldnames or []) if c in _USED_COLUMNS]
        for record in reader:
            line = lines[reader.line_num - 1][0]
            _check_cells(record, used, len(reader.fieldnames or []), name, line)
            if by_workload:
                seen.add(record["workload"] or "")
                if workload is not None and record["workload"] != workload:
                    continue
            try:
                b = float(record["batch_size"] or "")
                text = (record["steps"] or "").strip()
                steps = math.inf if text == "" else float(text)
            except ValueError:
                raise RunsTargetError(f"{name}, line {line}: batch_size {record['batch_size']!r} or steps "
                                      f"{record['steps']!r} is not a number") from None
            if not (math.isfinite(b) and b == int(b)):
                raise RunsTargetError(f"{name}, line {line}: batch_size {record['batch_size']!r} is not a whole "
                                      f"number")
            runs.setdefault(int(b), []).append(steps)
            if by_target:
                targets.setdefault((record["metric"] or "", (record["target"] or "").strip()), line)
        if len(targets) > 1:
            which = "; ".join(f"{m} {t} from line {n}" for (m, t), n in targets.items())
            whose = f" of workload {workload!r}" if by_workload and workload is not None else ""
            raise RunsTargetError(f"{name}: runs{whose} to different targets ({which}); steps to one target "
                                  f"compare only with steps to the same: keep one target's runs in the file")
        if by_workload and workload is not None and not runs:
            raise RunsTargetError(f"{name}: no run of workload {workload!r} (it has {', '.join(sorted(seen))}); "
                                  f"add its runs, or leave the workload column out")
        if by_workload and workload is None and len(seen) > 1:
            raise RunsTargetError(f"{name}: runs of several workloads ({', '.join(sorted(seen))}); name the workload "
                                  f"whose runs to keep (RunsTarget.from_csv(path, workload))")
        return cls.from_runs(runs, source=name)

    @functools.cached_property
    def medians(self) -> dict[int, float]:
        """Median steps to target per measured batch size (inf: most runs missed the target)."""
        return {b: _median_steps(s) for b, s in self.runs}

    def steps(self, batch_size: float) -> float:
        medians = self.medians
        b = float(batch_size)
        if b in medians:
            return medians[b]
        sizes = sorted(medians)
        if b < sizes[0] or b > sizes[-1]:
            end = sizes[0] if b < sizes[0] else sizes[-1]
            return medians[end] * self._law(b) / self._law(end)  # inf stays inf: beyond a miss, a miss
        k = next(i for i, s in enumerate(sizes) if s > b)
        lo, hi = sizes[k - 1], sizes[k]
        if not (math.isfinite(medians[lo]) and math.isfinite(medians[hi])):
            return math.inf  # next to a batch size most of whose runs missed the target: not trusted to reach it
        x = (math.log(b) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return math.exp(math.log(medians[lo]) + x * (math.log(medians[hi]) - math.log(medians[lo])))

    def _law(self, batch_size: float) -> float:
        """The fitted law's steps at ``batch_size``, up to a constant (only its ratios are used)."""
        if not math.isfinite(self.b_noise):  # no floor of steps in the data: S(b) ~ 1 / b
            return 1.0 / batch_size
        return 1.0 + self.b_noise / batch_size

    @property
    def is_law(self) -> bool:
        """The steps are measured runs' (interpolated between them), not the law's."""
        return False

    def log_se(self, batch_size: int) -> float:
        """Standard error of the log of the median steps at ``batch_size``: 1.2533 (the median's efficiency on
        a normal sample) x the runs' standard deviation of log steps / sqrt(runs), over the runs that reached
        the target. Where the runs cannot tell (one run, or a batch size not measured and not between two
        that can), half the law's precision in quadrature (:data:`LAW_RATIO_PRECISION` / sqrt 2); between two
        measured batch sizes, the larger of theirs."""
        unknown = LAW_RATIO_PRECISION / math.sqrt(2.0)
        runs = dict(self.runs)
        b = int(batch_size)
        if b in runs:
            reached = [math.log(s) for s in runs[b] if math.isfinite(s)]
            if len(reached) < 2:
                return unknown
            return MEDIAN_SE_FACTOR * statistics.stdev(reached) / math.sqrt(len(runs[b]))
        sizes = sorted(runs)
        if b < sizes[0] or b > sizes[-1]:
            return unknown
        k = next(i for i, s in enumerate(sizes) if s > b)
        return max(self.log_se(sizes[k - 1]), self.log_se(sizes[k]))

    def ratio_precision(self, batch_size: int, other: int) -> float:
        """How well the runs know ``steps(other) / steps(batch_size)``: the two medians' log standard errors in
        quadrature (:meth:`log_se`). Five runs of the built-in cnn, whose seeds differ up to 3x at one batch
        size, know the ratio of batch 16's steps to 32's to about 20%; consistent runs to a few percent."""
        return math.hypot(self.log_se(batch_size), self.log_se(other))

    def describe(self) -> dict[str, Any]:
        """JSON-ready: what ``best.json`` says in place of the noise-scale model."""
        return {"source": "measured runs", "runs_file": self.source,
                "formula": "steps(b) = the median of the runs at b; between measured batch sizes linear in log "
                           "steps against log b; outside them the law s_min * (1 + b_noise / b) fitted to the "
                           "medians, carried on from the nearest measured batch size",
                "steps_to_target": {str(b): (m if math.isfinite(m) else None) for b, m in self.medians.items()},
                "runs": {str(b): len(s) for b, s in self.runs},
                "s_min": self.s_min, "b_noise": self.b_noise}
