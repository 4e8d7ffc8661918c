"""The search's files: ``best.json`` (the plan ``edgetune run`` and the runtime apply) and ``trials.csv``.

``best.json`` keys (see DEVELOPERS.md, kept stable): ``device``, ``simulated``, ``workload``, ``budget_w``,
``objective``, ``batch_size``, ``setting``, ``measured``, ``predicted``, ``baseline``,
``speedup_over_baseline``; plus context (study, storage, protocol, target model, trials, Pareto front).
``trials.csv`` has one row per measured trial (every measurement, infeasible ones included).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetune.search.efficiency import TargetModel, ZeusCost
from edgetune.search.oracle import oracle_fields
from edgetune.search.records import TrialRecord
from edgetune.search.space import SearchSpace

__all__ = ["TRIAL_COLUMNS", "SearchResult", "best_json", "pareto_front", "write_best", "write_trials_csv"]


@dataclass
class SearchResult:
    """What a search found: every trial, the best, the baseline, and why it stopped."""

    study_name: str
    storage_url: str
    objective: str
    budget_w: float | None  # the budget asked for
    constrained: bool  # False when the budget is above the device's maximum power
    tolerance: float
    space: SearchSpace
    target: TargetModel
    records: list[TrialRecord]
    best: TrialRecord | None
    baseline: TrialRecord | None
    pareto: list[TrialRecord]
    stop_reason: str
    protocol: str
    device_name: str
    device_description: str
    simulated: bool
    workload: str
    cost: ZeusCost | None = None  # the weights of the ``cost`` objective

    @property
    def measured(self) -> list[TrialRecord]:
        return [r for r in self.records if r.measured]

    @property
    def speedup(self) -> float | None:
        if self.best is None or self.baseline is None or not self.best.outcome or not self.baseline.outcome:
            return None
        b, c = self.baseline.outcome, self.best.outcome
        if self.objective == "energy":
            return b.energy_to_target_j / c.energy_to_target_j
        if self.objective == "throughput":
            return c.samples_per_s / b.samples_per_s
        if self.objective == "cost" and self.cost is not None:
            return self.cost.of_outcome(b) / self.cost.of_outcome(c)
        return b.time_to_target_s / c.time_to_target_s


def pareto_front(records: list[TrialRecord]) -> list[TrialRecord]:
    """Records (feasible, with an outcome) not dominated in (time to target, energy to target), by time."""
    pts = sorted(records, key=lambda r: (r.outcome.time_to_target_s, r.outcome.energy_to_target_j))
    front: list[TrialRecord] = []
    best_e = math.inf
    for r in pts:
        if r.outcome.energy_to_target_j < best_e:
            front.append(r)
            best_e = r.outcome.energy_to_target_j
    return front

MEASURED_KEYS = ("step_time_s", "samples_per_s", "mean_power_w", "peak_power_w", "max_avg_power_w",
                 "energy_per_sample_j")
TRIAL_COLUMNS = (
    "trial", "role", "worker", "batch_size", "ok", "oom", "feasible", "step_time_s", "samples_per_s",
    "mean_power_w", "peak_power_w", "max_avg_power_w", "energy_j", "energy_per_sample_j", "duration_s",
    "steps", "real_steps", "time_to_target_s", "energy_to_target_j", "error",
)


def _finite(v: Any) -> Any:
    """JSON has no NaN: None instead."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _plan(r: TrialRecord | None) -> dict[str, Any] | None:
    if r is None:
        return None
    m = r.measurement or {}
    return {
        "trial": r.number,
        "batch_size": r.candidate.batch_size,
        "setting": r.candidate.knobs,
        "measured": {k: _finite(m.get(k)) for k in MEASURED_KEYS},
        "predicted": {
            "time_to_target_s": _finite(r.outcome.time_to_target_s) if r.outcome else None,
            "energy_to_target_j": _finite(r.outcome.energy_to_target_j) if r.outcome else None,
            "steps_to_target": _finite(r.outcome.steps_to_target) if r.outcome else None,
        },
        "budget_held": r.feasible,
    }


def best_json(result: SearchResult) -> dict[str, Any]:
    """The ``best.json`` document of a result (``batch_size`` and ``setting`` None when nothing held)."""
    best = _plan(result.best) or {"batch_size": None, "setting": None, "measured": None, "predicted": None}
    doc: dict[str, Any] = {
        "device": result.device_name,
        "device_description": result.device_description,
        "simulated": result.simulated,
        "workload": result.workload,
        "budget_w": result.budget_w,
        "budget_binds": result.constrained,
        "budget_tolerance": result.tolerance,
        "objective": result.objective,
        "batch_size": best["batch_size"],
        "setting": best["setting"],
        "measured": best["measured"],
        "predicted": best["predicted"],
        "baseline": _plan(result.baseline),
        "speedup_over_baseline": _finite(result.speedup),
        "target_model": {"s_min": result.target.s_min, "b_noise": result.target.b_noise,
                         "b_noise_source": result.target.b_noise_source,
                         "formula": "steps(b) = s_min * (1 + b_noise / b)  (McCandlish et al. 2018)"},
        "study": {"name": result.study_name, "storage": result.storage_url,
                  "trials_measured": len(result.measured), "space_size": result.space.size,
                  "stop_reason": result.stop_reason},
        "protocol": result.protocol,
        "pareto_front": [_plan(r) for r in result.pareto],
    }
    if result.cost is not None:  # Zeus's cost of the pick, J (eta x energy + (1 - eta) x max power x time)
        out = result.best.outcome if result.best is not None else None
        doc["cost"] = {"eta": result.cost.eta, "max_power_w": result.cost.max_power_w,
                       "cost_j": _finite(result.cost.of_outcome(out)) if out else None,
                       "formula": "eta * energy_to_target_j + (1 - eta) * max_power_w * time_to_target_s (Zeus)"}
    doc.update(oracle_fields(result))  # on a trace: gap to the table's own oracle, the table's target
    return doc


def write_best(result: SearchResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(best_json(result), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)  # readers (the runtime) never see half a file
    return path


def write_trials_csv(result: SearchResult, path: str | Path) -> Path:
    """One row per measured trial: the knob columns carry the raw values (Hz, kHz, cores, mode names)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    knobs = list(result.space.knob_names)
    cols = list(TRIAL_COLUMNS[:4]) + knobs + list(TRIAL_COLUMNS[4:])
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in sorted(result.measured, key=lambda r: r.number):
            m = r.measurement or {}
            row = {"trial": r.number, "role": r.role, "worker": r.worker, "batch_size": r.candidate.batch_size,
                   "ok": m.get("ok"), "oom": m.get("oom"), "feasible": r.feasible, "error": m.get("error") or ""}
            row.update(r.candidate.knobs)
            for k in ("step_time_s", "samples_per_s", "mean_power_w", "peak_power_w", "max_avg_power_w",
                      "energy_j", "energy_per_sample_j", "duration_s", "steps", "real_steps"):
                v = m.get(k)
                row[k] = "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
            if r.outcome:
                row["time_to_target_s"] = r.outcome.time_to_target_s
                row["energy_to_target_j"] = r.outcome.energy_to_target_j
            w.writerow(row)
    return path
