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

How the budget is judged on a trace: a trace has no power samples within a step, only each row's mean
power. The replay draws that mean constantly through every step, so the maximum 1-s moving average the
search judges the budget by equals the row's ``power_w``; the oracle uses the same criterion, ``power_w <=
budget * (1 + tolerance)``. A row that holds the budget on average may still exceed it for milliseconds on
the real GPU; the table cannot tell.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from edgetune.power.base import Device
from edgetune.search.efficiency import TargetModel
from edgetune.search.space import SpaceError
from edgetune.tables import Table

if TYPE_CHECKING:
    from edgetune.search.results import SearchResult

__all__ = ["BUDGET_RULE", "TableTarget", "TracePlan", "oracle_fields", "oracle_gap", "oracle_lines",
           "prepare_trace"]

BUDGET_RULE = ("table's mean power of the row (the replay draws it through every step, so the 1-s moving "
               "average equals it) <= budget * (1 + tolerance)")


@dataclass(frozen=True)
class TableTarget(TargetModel):
    """Steps to target from a table's epochs to target per batch size (no noise-scale model).

    ``s_min`` and ``b_noise`` do not apply (NaN); ``epochs`` maps batch size to epochs to target.
    """

    s_min: float = math.nan
    b_noise: float = math.nan
    b_noise_source: str = "table"
    epochs: tuple[tuple[int, float], ...] = ()
    samples_per_epoch: float = math.nan
    table: Table | None = field(default=None, compare=False, hash=False, repr=False)

    def steps(self, batch_size: float) -> float:
        epochs = dict(self.epochs).get(int(batch_size), math.nan)
        return epochs * self.samples_per_epoch / float(batch_size)

    def describe(self) -> dict[str, Any]:
        """JSON-ready: what ``best.json`` says in place of the noise-scale model."""
        return {"source": "table", "table": self.table.source if self.table is not None else None,
                "formula": "steps(b) = epochs_to_target(b) * samples_per_epoch / b; time to target = "
                           "epochs_to_target(b) * time per epoch",
                "samples_per_epoch": self.samples_per_epoch,
                "epochs_to_target": {str(b): e for b, e in self.epochs}}


@dataclass(frozen=True)
class TracePlan:
    """What a trace changes in a search: the batch sizes, the target model (None: keep the config's), notes."""

    batch_sizes: tuple[int, ...]
    target: TableTarget | None
    notes: tuple[str, ...]


def _replay_table(device: Device) -> Table | None:
    from edgetune.power.trace import TraceReplay

    backend = device.backend
    return backend.table if isinstance(backend, TraceReplay) else None


def prepare_trace(device: Device, batch_sizes: tuple[int, ...] | list[int] | None = None) -> TracePlan | None:
    """Set a search up on a ``trace:`` device (None for any other device).

    The table is the training run, so the workload's own training step is not executed (the replay's
    ``compute`` is switched off). With ``epochs_to_target`` in the table the target comes from it and the
    batch sizes default to those that reach the target; without it, the batch sizes default to the table's
    and the config's noise-scale model stays.

    Raises:
        SpaceError: a batch size asked for that the table lacks or that never reaches its target.
    """
    table = _replay_table(device)
    if table is None:
        return None
    device.backend.compute = False
    name = os.path.basename(table.source)
    notes = [(f"trace: the table is the training run; the workload's step is not executed, time and power are "
              f"{name}'s; budget judged by the {BUDGET_RULE}")]
    have = table.batch_sizes
    if table.epochs_to_target is None or table.samples_per_epoch is None:
        why = "epochs_to_target" if table.epochs_to_target is None else "samples_per_epoch"
        notes.append(f"trace: {name} has no {why} column: time to target from the noise-scale model "
                     f"(efficiency.s_min, efficiency.b_noise)")
        chosen = tuple(sorted(batch_sizes)) if batch_sizes else tuple(have)
        missing = [b for b in chosen if b not in have]
        if missing:
            raise SpaceError(f"space.batch_sizes: {name} has no rows for batch size {missing[0]}; it has "
                             f"{', '.join(map(str, have))}")
        return TracePlan(chosen, None, tuple(notes))
    epochs = {b: float(table.epochs_to_target[table.batch_size == b][0]) for b in have}
    reach = [b for b in have if math.isfinite(epochs[b])]
    if not reach:
        raise SpaceError(f"{name}: no batch size reaches the target in the table (epochs_to_target is inf or "
                         f"empty everywhere); choose another target when importing it")
    if batch_sizes:
        chosen = tuple(sorted(batch_sizes))
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
    target = TableTarget(epochs=tuple((b, epochs[b]) for b in chosen), samples_per_epoch=spe, table=table,
                         b_noise_source=f"epochs to target per batch size from {name}")
    notes.append(f"time to target: epochs to target per batch size from {name} x measured time per epoch "
                 f"(not the gradient-noise-scale model)")
    return TracePlan(chosen, target, tuple(notes))


def oracle_gap(result: SearchResult) -> dict[str, Any] | None:
    """The chosen setting against the table's oracle (None unless the search ran on a table target).

    The oracle is the table's best row by the objective (energy to target for ``energy``, else time to
    target) among the batch sizes searched, whose mean power holds the budget as the search judged it.
    ``gap_pct`` is how much longer (or costlier) the chosen row is, in percent; None when nothing was chosen.
    """
    target = result.target
    if not isinstance(target, TableTarget) or target.table is None:
        return None
    table = target.table
    limit = None if result.budget_w is None else result.budget_w * (1.0 + result.tolerance)
    objective = "energy" if result.objective == "energy" else "time"
    searched = np.isin(table.batch_size, list(result.space.batch_sizes))
    cost = table.time_to_target_s() if objective == "time" else table.energy_to_target_j()
    ok = searched & np.isfinite(cost) & (table.power_w <= (math.inf if limit is None else limit))

    def row(i: int) -> dict[str, Any]:
        return {"batch_size": int(table.batch_size[i]), "setting": table.setting(i),
                "power_w": float(table.power_w[i]), "time_to_target_s": float(table.time_to_target_s()[i]),
                "energy_to_target_j": float(table.energy_to_target_j()[i])}

    oracle = int(np.flatnonzero(ok)[np.argmin(cost[ok])]) if ok.any() else None
    chosen = None
    if result.best is not None:
        chosen = table.find({k: float(v) for k, v in result.best.candidate.knobs.items()},
                            result.best.candidate.batch_size)
    gap = None
    if oracle is not None and chosen is not None:
        gap = 100.0 * (float(cost[chosen]) / float(cost[oracle]) - 1.0)
    return {
        "table": table.source,
        "objective": f"{objective} to target",
        "budget_judged_by": BUDGET_RULE,
        "oracle": row(oracle) if oracle is not None else None,
        "chosen": row(chosen) if chosen is not None else None,
        "chosen_holds_budget": (None if chosen is None else
                                bool(limit is None or table.power_w[chosen] <= limit)),
        "gap_pct": gap,
        "measured_settings": len(result.measured),
        "table_rows": int(searched.sum()),
    }


def oracle_fields(result: SearchResult) -> dict[str, Any]:
    """Extra ``best.json`` keys on a table target: ``oracle_gap`` and the table's ``target_model``."""
    report = oracle_gap(result)
    if report is None:
        return {}
    return {"oracle_gap": report, "target_model": result.target.describe()}


def oracle_lines(result: SearchResult) -> list[str]:
    """The summary's lines on a table target: the oracle, the gap, and how the budget was judged."""
    report = oracle_gap(result)
    if report is None:
        return []
    o, c = report["oracle"], report["chosen"]
    what = report["objective"]
    key = "time_to_target_s" if what.startswith("time") else "energy_to_target_j"
    unit = "s" if key == "time_to_target_s" else "J"

    def text(r: dict[str, Any]) -> str:
        knobs = ", ".join(f"{k}={v:g}" for k, v in r["setting"].items())
        return f"batch {r['batch_size']}, {knobs}: {r[key]:.4g} {unit} at {r['power_w']:.1f} W"

    if o is None:
        return [f"table oracle: no row of {os.path.basename(report['table'])} holds the budget"]
    lines = [f"table oracle ({what}, {report['table_rows']} rows): {text(o)}"]
    if c is not None:
        lines.append(f"chosen: {text(c)}; gap to the oracle {report['gap_pct']:+.2f}% after "
                     f"{report['measured_settings']} measured settings")
    lines.append(f"budget on a trace: judged by the {BUDGET_RULE}")
    return lines
