"""Searching a measurement table (``--device trace:<table.csv>``), and the gap to the table's own oracle.

On a trace the table is both the hardware and the training run. The search measures step time and power
by replaying the table (:mod:`edgetune.power.trace`), exactly as it measures a board; what a trace adds
is convergence: the table's ``epochs_to_target`` per batch size (for the Zeus NSDI'23 traces, the median
over seeds of the first epoch that reached the target), as the published approach takes it from proxy
runs. :func:`prepare_trace` puts it in place of the gradient-noise-scale model:

    steps to target(b) = epochs(b) * samples per epoch / b
    time to target     = steps(b) * measured step time       (= epochs(b) * time per epoch on the table)

so the search's time to target of a row is the table's own figure, and the best row the table holds under
the budget (its *oracle*) is the yardstick: :func:`oracle_gap` reports how far the chosen setting is from it.

What the search may know of convergence: only what it measured. A batch size's epochs to target become
visible once a step has run at it (:meth:`~edgetune.power.trace.TraceReplay.epochs_to_target`), unless the
table's convergence data is known from the start (``--known-convergence``: a recurring job whose earlier
runs measured every batch size). Until then :class:`TableTarget` estimates them from the measured batch sizes
(:func:`estimate_epochs`: the nearest measured batch size's epochs, an optimistic guess for the larger ones,
so the sampler measures a batch size before it trusts it); the outcome of a measured setting always uses the
table's own figure.

How the budget is judged on a trace: a trace has no power samples within a step, only each window's mean
(the replay draws one per window around the row's median with the table's stated spread). A window's
readings are therefore constant and their standard error zero, which would leave the guard band nothing to
add: a row whose median is 0.1% over the budget passes when its window happens to read low. The search is
told the replay's stated spread (``TracePlan.power_cv``), and the standard error of a window's power is at
least that fraction of it, so the guard band covers the run-to-run noise the table states. The oracle judges
rows by their median, ``power_w <= budget * (1 + tolerance)``: the truth the search is scored against.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgetune.power.base import Device
from edgetune.search.efficiency import TargetModel
from edgetune.search.space import SpaceError
from edgetune.search.window import judged_power_w
from edgetune.tables import Table

if TYPE_CHECKING:
    from edgetune.search.results import SearchResult

__all__ = ["BUDGET_RULE", "TableTarget", "TracePlan", "estimate_epochs", "lowest_row_power_w", "oracle_fields",
           "oracle_gap", "oracle_lines", "prepare_trace"]

BUDGET_RULE = ("window's measured power plus guard_sigma x the table's stated power spread (a window's power is "
               "one draw, constant through its steps) <= budget * (1 + tolerance); the oracle and the "
               "violation count use the row's median power")


@dataclass(frozen=True)
class TableTarget(TargetModel):
    """Steps to target from a table's epochs to target per batch size (no noise-scale model).

    ``s_min`` and ``b_noise`` do not apply (NaN). ``batch_sizes`` are those searched; ``epochs_of(b)`` is
    what the search may know of batch size ``b`` (the replay's :meth:`epochs_to_target`: None until ``b`` is
    measured, unless convergence is known); where it knows nothing, :func:`estimate_epochs` from the known.
    A measured batch size the table has no convergence data for counts as never reaching the target
    (``measured_of``: the replay's measured batch sizes).
    """

    s_min: float = math.nan
    b_noise: float = math.nan
    b_noise_source: str = "table"
    batch_sizes: tuple[int, ...] = ()
    samples_per_epoch: float = math.nan
    table: Table | None = field(default=None, compare=False, hash=False, repr=False)
    epochs_of: Callable[[int], float | None] | None = field(default=None, compare=False, hash=False, repr=False)
    measured_of: Callable[[], frozenset[int]] | None = field(default=None, compare=False, hash=False, repr=False)
    known_convergence: bool = False

    def known_epochs(self) -> dict[int, float]:
        """Epochs to target of the batch sizes the search knows them for (``inf``: never reached)."""
        if self.epochs_of is None:
            return {}
        measured = self.measured_of() if self.measured_of is not None else frozenset()
        out = {}
        for b in self.batch_sizes:
            e = self.epochs_of(b)
            if e is not None:
                out[b] = float(e)
            elif b in measured:  # measured, and the table has no convergence data there: it cannot be chosen
                out[b] = math.inf
        return out

    def epochs(self, batch_size: int) -> float:
        """Epochs to target at ``batch_size``: the table's where known, else the estimate."""
        known = self.known_epochs()
        b = int(batch_size)
        return known[b] if b in known else estimate_epochs(b, known)

    def steps(self, batch_size: float) -> float:
        return self.epochs(int(batch_size)) * self.samples_per_epoch / float(batch_size)

    @property
    def is_law(self) -> bool:
        """The steps are the table's measured epochs to target (estimated between them), not a law's."""
        return False

    def ratio_precision(self, batch_size: int, other: int) -> float:
        """NaN: no tie is claimed on a table's epochs to target (they are the replay's truth)."""
        return math.nan

    def describe(self) -> dict[str, Any]:
        """JSON-ready: what ``best.json`` says in place of the noise-scale model."""
        known = self.known_epochs()
        return {"source": "table", "table": self.table.source if self.table is not None else None,
                "formula": "steps(b) = epochs_to_target(b) * samples_per_epoch / b; time to target = "
                           "epochs_to_target(b) * time per epoch",
                "samples_per_epoch": self.samples_per_epoch,
                "convergence": ("known from the start (known convergence)" if self.known_convergence else
                                "seen only for the batch sizes measured"),
                "epochs_to_target": {str(b): e for b, e in known.items()},
                "epochs_estimated_for": [b for b in self.batch_sizes if b not in known]}


def estimate_epochs(batch_size: int, known: dict[int, float]) -> float:
    """Epochs to target at an unmeasured batch size from those known: the nearest known batch size's (in
    ratio; a tie goes to the smaller, whose epochs are usually fewer); 1 epoch when nothing is known.

    Epochs to target rarely fall as the batch grows, so for a larger batch size this is optimistic: the
    sampler sees promise there and measures it, and the measurement reveals the table's figure. Above a
    never-reached nearest neighbour: never reached either; below it, the nearest finite one's.
    """
    if not known:
        return 1.0

    def nearest(pool: dict[int, float]) -> int:
        return min(pool, key=lambda b: (abs(math.log(b / batch_size)), b))

    b = nearest(known)
    if math.isfinite(known[b]) or batch_size >= b:
        return known[b]
    finite = {k: e for k, e in known.items() if math.isfinite(e)}
    return finite[nearest(finite)] if finite else 1.0


@dataclass(frozen=True)
class TracePlan:
    """What a trace changes in a search.

    Attributes:
        batch_sizes: the batch sizes searched.
        target: the table's convergence as a target model (None: the table has none; keep the config's).
        notes: lines for the report.
        baseline_batch_size: the table's declared untuned batch size (None: the workload's).
        power_cv: the replay's stated relative spread of one window's power (the guard band's floor,
            :class:`~edgetune.search.study.Search`'s ``power_cv``); 0 with noise off.
    """

    batch_sizes: tuple[int, ...]
    target: TableTarget | None
    notes: tuple[str, ...]
    baseline_batch_size: int | None = None
    power_cv: float = 0.0


def _replay(device: Device) -> Any:
    from edgetune.power.trace import TraceReplay

    backend = device.backend
    return backend if isinstance(backend, TraceReplay) else None


def prepare_trace(device: Device, batch_sizes: Sequence[int] | None = None,
                  default_batch_size: int | None = None) -> TracePlan | None:
    """Set a search up on a ``trace:`` device (None for any other device).

    The table is the training run, so the workload's own training step is not executed (the replay's
    ``compute`` is switched off). The batch sizes default to the table's (a table without batch sizes: its
    declared batch size, else ``default_batch_size``, the workload's; it runs no other). With known
    convergence, only those that reach the target. With convergence data in the table
    the target is a :class:`TableTarget` that asks the replay what the search may know; without it the
    config's noise-scale model stays.

    Raises:
        SpaceError: a batch size asked for that the table lacks, or (known convergence) that never
            reaches its target.
    """
    replay = _replay(device)
    if replay is None:
        return None
    table: Table = replay.table
    replay.compute = False
    name = os.path.basename(table.source)
    spread = table.spread()
    power_cv = float(np.max(spread.power_cv)) if replay.noise else 0.0
    notes = [(f"trace: the table is the training run; the workload's step is not executed, time and power are "
             f"{name}'s; budget judged by the {BUDGET_RULE} (stated power spread up to {power_cv:.2%})")]
    if table.batch_size is None:  # a fixed-batch sweep: one batch size, the declared one or the job's
        b = replay.default_batch_size or (min(batch_sizes) if batch_sizes else default_batch_size)
        if b is None:
            raise SpaceError(f"{name} is a fixed-batch sweep with no declared batch size: declare "
                             f"'# edgetune: default_batch_size=<B>' in it, or give the job's batch size")
        have = [int(b)]
    else:
        have = table.batch_sizes
    chosen = tuple(sorted(set(batch_sizes))) if batch_sizes else tuple(have)
    missing = [b for b in chosen if b not in have]
    if missing:
        raise SpaceError(f"space.batch_sizes: {name} has no rows for batch size {missing[0]}; it has "
                         f"{', '.join(map(str, have))}")
    baseline = replay.default_batch_size
    if table.epochs_to_target is None or table.samples_per_epoch is None:
        why = "epochs_to_target" if table.epochs_to_target is None else "samples_per_epoch"
        notes.append(f"trace: {name} has no {why} column: time to target from the noise-scale model "
                     f"(efficiency.s_min, efficiency.b_noise)")
        return TracePlan(chosen, None, tuple(notes), baseline, power_cv)
    if replay.known_convergence:
        reach = [b for b in have if (e := replay.epochs_to_target(b)) is not None and math.isfinite(e)]
        if not reach:
            raise SpaceError(f"{name}: no batch size reaches the target in the table (epochs_to_target is inf or "
                             f"empty everywhere); choose another target when importing it")
        if batch_sizes:
            bad = [b for b in chosen if b not in reach]
            if bad:
                raise SpaceError(f"space.batch_sizes: batch size {bad[0]} has no epochs to target in {name}; "
                                 f"use some of {', '.join(map(str, reach))}")
        else:
            chosen = tuple(reach)
            left_out = [b for b in have if b not in reach]
            if left_out:
                notes.append(f"trace: batch sizes {', '.join(map(str, left_out))} left out: they never reach the "
                             f"target in the table (or it has no convergence data for them)")
    spe = float(table.samples_per_epoch[0])
    target = TableTarget(batch_sizes=chosen, samples_per_epoch=spe, table=table, epochs_of=replay.epochs_to_target,
                         measured_of=lambda: replay.measured_batch_sizes, known_convergence=replay.known_convergence,
                         b_noise_source=f"epochs to target per batch size from {name}")
    notes.append(f"time to target: epochs to target per batch size from {name} x measured time per epoch "
                 f"(not the gradient-noise-scale model)")
    notes.append(replay.convergence_note())
    return TracePlan(chosen, target, tuple(notes), baseline, power_cv)


def _scored_table(result: SearchResult) -> tuple[Table, np.ndarray, np.ndarray, np.ndarray] | None:
    """The table a trace search ran on, each row's batch size, time and energy to target (the truth the
    search is scored against: the table's own convergence; without any, the search's target model)."""
    target = result.target
    if isinstance(target, TableTarget) and target.table is not None:
        table = target.table
        batch = table.batch_size if table.batch_size is not None else np.full(len(table), result.space.batch_sizes[0])
        return table, batch, table.time_to_target_s(), table.energy_to_target_j()
    platform, _, path = result.device_name.partition(":")
    if platform != "trace" or not path:
        return None
    from edgetune.tables import TableError, load_table

    try:
        table = load_table(path)
    except (OSError, TableError):
        return None
    batch = table.batch_size if table.batch_size is not None else np.full(len(table), result.space.batch_sizes[0])
    steps = np.array([float(target.steps(b)) for b in batch])
    step_time = table.step_time()
    if table.batch_size is None and table.step_time_s is None:
        return None
    ttt = steps * step_time
    return table, batch, ttt, ttt * table.power_w


def _row_of(table: Table, knobs: dict[str, Any], batch_size: int) -> int | None:
    """The table's row a searched candidate ran at: its tuned knobs, every other knob where the replay left it
    (:func:`~edgetune.power.trace.starting_setting`; a knob with one value in the table is never tuned)."""
    from edgetune.power.trace import starting_setting

    return table.find({**starting_setting(table), **{k: float(v) for k, v in knobs.items()}}, batch_size)


def lowest_row_power_w(device: Device, space: Any) -> float | None:
    """The least median power of the table's rows in ``space`` on a ``trace:`` device: the lowest budget any
    searched row holds (the trace's counterpart of the twin's noise-free power at the least setting); None
    for any other device."""
    replay = _replay(device)
    if replay is None or space.rows is None:
        return None
    table: Table = replay.table
    rows = [_row_of(table, c.knobs, c.batch_size) for c in space.rows]
    return min((float(table.power_w[i]) for i in rows if i is not None), default=None)


def oracle_gap(result: SearchResult) -> dict[str, Any] | None:
    """The chosen setting against the table's oracle (None unless the search ran on a table).

    The oracle is the table's best row by the objective (energy to target for ``energy``, Zeus's cost to
    target for ``cost``, each row then carrying ``cost_j``, else time to target: the table's epochs to target
    where it has them, else the search's target model) among the batch sizes searched, whose median power
    holds the budget. ``gap_pct`` is how much longer (or costlier) the chosen row is, in percent; None when
    nothing was chosen.

    The certifiable oracle is the best row that a window reading its median power would show to hold the
    budget under the search's own rule (:func:`~edgetune.search.window.judged_power_w`, the standard error
    floored at the result's ``power_cv``, as :class:`~edgetune.search.study.Search` floors it on a trace): a
    row closer to the budget than the table's stated noise cannot be told from one just over it by any
    number of single windows. ``certifiable_gap_pct`` is the gap to it (negative when the pick is a row the
    rule could not certify but that holds the budget on its median).
    """
    scored = _scored_table(result)
    if scored is None:
        return None
    table, batch, ttt, ett = scored
    limit = None if result.budget_w is None else result.budget_w * (1.0 + result.tolerance)
    zeus = result.cost if result.objective == "cost" else None  # rank by the cost the search minimised
    objective = "energy" if result.objective == "energy" else "cost" if zeus is not None else "time"
    searched = np.isin(batch, list(result.space.batch_sizes))
    if result.space.rows is not None:
        rows = {_row_of(table, c.knobs, c.batch_size) for c in result.space.rows}
        searched &= np.isin(np.arange(len(table)), [r for r in rows if r is not None])
    cost = zeus.of(ttt, ett) if zeus is not None else ttt if objective == "time" else ett
    ok = searched & np.isfinite(cost) & (table.power_w <= (math.inf if limit is None else limit))

    def row(i: int) -> dict[str, Any]:
        out = {"batch_size": int(batch[i]), "setting": table.setting(i), "power_w": float(table.power_w[i]),
               "time_to_target_s": float(ttt[i]), "energy_to_target_j": float(ett[i])}
        if zeus is not None:
            out["cost_j"] = float(cost[i])
        return out

    oracle = int(np.flatnonzero(ok)[np.argmin(cost[ok])]) if ok.any() else None
    judged = judged_power_w(table.power_w, max(0.0, result.power_cv) * table.power_w, result.guard_sigma or 0.0)
    sure = ok & (judged <= (math.inf if limit is None else limit))
    certifiable = int(np.flatnonzero(sure)[np.argmin(cost[sure])]) if sure.any() else None
    chosen = None
    if result.best is not None:
        chosen = _row_of(table, result.best.candidate.knobs, result.best.candidate.batch_size)
    gap = certifiable_gap = None
    if oracle is not None and chosen is not None:
        gap = 100.0 * (float(cost[chosen]) / float(cost[oracle]) - 1.0)
    if certifiable is not None and chosen is not None:
        certifiable_gap = 100.0 * (float(cost[chosen]) / float(cost[certifiable]) - 1.0)
    target = result.target
    return {
        "table": table.source,
        "objective": f"{objective} to target",
        "budget_judged_by": BUDGET_RULE,
        "oracle": row(oracle) if oracle is not None else None,
        "chosen": row(chosen) if chosen is not None else None,
        "chosen_holds_budget": (None if chosen is None else
                                bool(limit is None or table.power_w[chosen] <= limit)),
        "gap_pct": gap,
        "certifiable_oracle": row(certifiable) if certifiable is not None else None,
        "certifiable_gap_pct": certifiable_gap,
        "convergence": (target.describe()["convergence"] if isinstance(target, TableTarget) else
                        "the table has none: steps to target from the noise-scale model (the same for every "
                        "row of a batch size)"),
        "measured_settings": len(result.settings),
        "measured_windows": len(result.measured),  # contenders measured again before the pick included
        "table_rows": int(searched.sum()),
    }


def oracle_fields(result: SearchResult) -> dict[str, Any]:
    """Extra ``best.json`` keys on a table: ``oracle_gap`` and (with convergence data) the table's
    ``target_model``."""
    report = oracle_gap(result)
    if report is None:
        return {}
    out: dict[str, Any] = {"oracle_gap": report}
    if isinstance(result.target, TableTarget):
        out["target_model"] = result.target.describe()
    return out


def oracle_lines(result: SearchResult) -> list[str]:
    """The summary's lines on a table target: the oracle, the gap, and how the budget was judged."""
    report = oracle_gap(result)
    if report is None:
        return []
    o, c = report["oracle"], report["chosen"]
    what = report["objective"]
    key = {"time": "time_to_target_s", "energy": "energy_to_target_j", "cost": "cost_j"}[what.split()[0]]
    unit = "s" if key == "time_to_target_s" else "J"

    def text(r: dict[str, Any]) -> str:
        where = ", ".join([f"batch {r['batch_size']}", *(f"{k}={v:g}" for k, v in r["setting"].items())])
        return f"{where}: {r[key]:.4g} {unit} at {r['power_w']:.1f} W"

    if o is None:
        return [f"table oracle: no row of {os.path.basename(report['table'])} holds the budget"]
    lines = [f"table oracle ({what}, {report['table_rows']} rows): {text(o)}"]
    sure = report["certifiable_oracle"]
    if sure is not None and sure != o:
        lines.append(f"certifiable oracle (under the budget by the guard band at its median): {text(sure)}")
    if c is not None:
        lines.append(f"chosen: {text(c)}; gap to the oracle {report['gap_pct']:+.2f}%"
                     + (f", to the certifiable oracle {report['certifiable_gap_pct']:+.2f}%"
                        if sure is not None and sure != o else "")
                     + f" after {report['measured_settings']} measured settings")
    lines.append(f"budget on a trace: judged by the {BUDGET_RULE}")
    lines.append(f"convergence on a trace: {report['convergence']}")
    return lines
