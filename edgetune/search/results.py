"""The search's files: ``best.json`` (the plan ``edgetune run`` and the runtime apply) and ``trials.csv``.

``best.json`` keys (see DEVELOPERS.md, kept stable): ``device``, ``simulated``, ``workload``, ``budget_w``,
``objective``, ``batch_size``, ``setting``, ``measured``, ``predicted``, ``baseline``, ``speedup_over_baseline``
(a ratio of the objective's own measure, which ``speedup_measure`` names: energy under ``energy``, Zeus's cost
under ``cost``); plus context (study, storage, protocol, target model, trials, Pareto front, the workload's step
cost, ``untuned_knobs``: the knobs the search left as found, with their values). Every knob value carries its
unit: ``"setting": {"gpu_freq": {"value": 510000000, "unit": "Hz", "text": "510 MHz"}, "cpu_freq": {"value":
806400, "unit": "kHz", "text": "806.4 MHz"}}`` (the value in the knob's own unit,
:data:`edgetune.power.knobs.KNOBS`, as ``edgetune run --set`` takes it). ``trials.csv`` has one row per measured
trial (every measurement, infeasible ones included); a simulated search's rows end with ``simulated``, True.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.power.base import KnobValue, format_value
from edgetune.power.knobs import Candidate, knob_unit
from edgetune.search.confirm import certified, margin_w, pick_score, pool_windows
from edgetune.search.efficiency import LAW_RATIO_PRECISION, TargetModel, ZeusCost, scalar_score
from edgetune.search.oracle import oracle_fields
from edgetune.search.records import TrialRecord
from edgetune.search.space import SearchSpace
from edgetune.search.storage import storage_file
from edgetune.search.thermal import ThermalSoak, governing, required_margin_w, rise_for_w, thermal_rise_w

__all__ = ["FOLDER_LOCK", "LAW_OBJECTIVES", "LAW_RATIO_PRECISION", "SENSOR_ACCURACY_ABS_W", "SENSOR_ACCURACY_REL",
           "STAGING", "TRIAL_COLUMNS", "BatchTie", "KnifeEdge", "SearchResult", "Written", "batch_tie", "best_json",
           "certified", "choose_best", "folder_lock", "knife_edge", "margin_w", "pareto_front", "sensor_accuracy_w",
           "setting_with_units", "write_best", "write_folder", "write_trials_csv"]

#: a board power sensor's accuracy, relative part: the INA3221's maximum gain errors (shunt and bus voltage,
#: 0.25 % each, TI datasheet SBOS576) add up in their product, the power, and its maximum bus offset (16 mV)
#: is 0.32 % of a 5 V rail
SENSOR_ACCURACY_REL = 0.0082
#: ... and absolute part, W per channel summed into the total: the INA3221's maximum shunt offset (80 uV) over
#: a 5 mOhm shunt at 5 V (the Jetson modules' rails; edgetune/power/profiles/SOURCES.md, "Sensor")
SENSOR_ACCURACY_ABS_W = 0.08
#: the objectives whose figures scale with the law's steps to target (throughput does not use it; pareto
#: reports a front)
LAW_OBJECTIVES = ("time", "energy", "cost")


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
    #: standard errors of the measured average added before judging the budget (None: not known here)
    guard_sigma: float | None = None
    #: what one step of the workload asks of the hardware (``WorkloadCost`` fields; None: not known), so a
    #: plan applied to another model can be told apart
    workload_cost: dict[str, float] | None = None
    cost: ZeusCost | None = None  # the weights of the ``cost`` objective
    #: the run-to-run spread of a window's power the search was told (a table's stated spread; 0 elsewhere)
    power_cv: float = 0.0
    #: power channels the sensor's total sums (:func:`edgetune.power.base.summed_channels`): each adds its
    #: offset to the sensor's accuracy
    sensor_channels: int = 1
    #: the thermal soaks of the study's picks, in order (:mod:`edgetune.search.thermal`; empty: none): the
    #: largest rise per watt, carried to the edge of the budget, is part of the margin every setting must hold
    #: the budget by
    thermal_soaks: list[ThermalSoak] = field(default_factory=list)
    #: the knobs the search did not tune, as they stood while it measured (a Jetson's power mode where the
    #: others need a reboot): the state the plan's figures hold in
    untuned_knobs: dict[str, KnobValue] = field(default_factory=dict)
    #: where the search trained (a torch device): the plan's figures are those of steps run there
    torch_device: str = "cpu"

    @property
    def measured(self) -> list[TrialRecord]:
        """Every measured trial (window), a setting measured again included."""
        return [r for r in self.records if r.measured]

    @property
    def settings(self) -> list[TrialRecord]:
        """One record per measured setting, its windows pooled (:func:`~edgetune.search.confirm.pool_windows`):
        what the pick, the Pareto front and the knife edge are judged on."""
        return pool_windows(self.measured, limit_w=self.limit_w, guard_sigma=self.guard_sigma or 0.0)

    @property
    def over_budget_s(self) -> float:
        """Device seconds the board's moving average spent above the budget while the search measured (its
        thermal soak included)."""
        return sum(r.over_budget_s for r in self.measured) + sum(s.over_budget_s for s in self.thermal_soaks)

    @property
    def thermal(self) -> ThermalSoak | None:
        """The soak whose rise governs the margin (the largest per watt; None: not soaked)."""
        return governing(self.thermal_soaks)

    @property
    def limit_w(self) -> float | None:
        """The budget with its tolerance, W (None: unconstrained)."""
        return self.budget_w * (1.0 + self.tolerance) if self.constrained and self.budget_w is not None else None

    @property
    def accuracy_w(self) -> float | None:
        """The sensor's accuracy at the limit, W (:func:`sensor_accuracy_w`; None: unconstrained)."""
        limit_w = self.limit_w
        return None if limit_w is None else sensor_accuracy_w(limit_w, self.sensor_channels)

    @property
    def thermal_rise_w(self) -> float:
        """How much more the pick draws once the board is warm than the search measured, W, as the margin
        counts it at the edge of the budget (:func:`~edgetune.search.thermal.thermal_rise_w`; 0: not soaked)."""
        limit_w, accuracy_w = self.limit_w, self.accuracy_w
        edge_w = None if limit_w is None or accuracy_w is None else limit_w - accuracy_w
        return thermal_rise_w(self.thermal_soaks, edge_w)

    @property
    def required_margin_w(self) -> float | None:
        """The margin a setting that was not soaked must hold the limit by to be certified, W: the sensor's
        accuracy plus the thermal rise (None: unconstrained; a soaked one: :meth:`required_margin_for`)."""
        accuracy_w = self.accuracy_w
        return None if accuracy_w is None else accuracy_w + self.thermal_rise_w

    def rise_for_w(self, candidate: Candidate) -> float:
        """The thermal rise ``candidate``'s margin includes, W: its own soak's where it was soaked, else
        :attr:`thermal_rise_w` (:func:`~edgetune.search.thermal.rise_for_w`; 0: not soaked)."""
        limit_w, accuracy_w = self.limit_w, self.accuracy_w
        edge_w = None if limit_w is None or accuracy_w is None else limit_w - accuracy_w
        return rise_for_w(self.thermal_soaks, candidate, edge_w)

    def required_margin_for(self, candidate: Candidate) -> float | None:
        """The margin ``candidate`` must hold the limit by to be certified, W: the sensor's accuracy plus the
        rise :meth:`rise_for_w` counts for it; infinite where its own soak crossed the budget
        (:func:`~edgetune.search.thermal.crossed_warm`; None: unconstrained)."""
        limit_w, accuracy_w = self.limit_w, self.accuracy_w
        if limit_w is None or accuracy_w is None:
            return None
        return required_margin_w(self.thermal_soaks, candidate, accuracy_w, limit_w - accuracy_w)

    def certified(self, r: TrialRecord) -> bool:
        """Whether ``r`` held the limit by the margin its setting requires (:meth:`required_margin_for`)."""
        return certified(r, self.limit_w, self.required_margin_for(r.candidate))

    @property
    def knife_edge(self) -> KnifeEdge | None:
        """The best held setting holds the budget by less than the sensor's accuracy (:func:`knife_edge`)."""
        return knife_edge(self)

    @property
    def batch_tie(self) -> BatchTie | None:
        """Another batch size is within the steps' precision of the pick (:func:`batch_tie`)."""
        return batch_tie(self)

    @property
    def aborted_over_budget(self) -> int:
        """Trials stopped early because their live moving average crossed the budget."""
        return sum(r.aborted_over_budget for r in self.measured)

    @property
    def speedup_measure(self) -> str:
        """What :attr:`speedup` is a ratio of, under this objective (best.json ``speedup_measure``)."""
        if self.objective == "cost" and self.cost is not None:
            return "Zeus cost to target (baseline / chosen)"
        return {"energy": "energy to target (baseline / chosen)",
                "throughput": "samples per second (chosen / baseline)"}.get(self.objective,
                                                                           "time to target (baseline / chosen)")

    @property
    def speedup(self) -> float | None:
        """How many times better than the baseline the pick is, in the objective's own measure
        (:attr:`speedup_measure`; None: no pick or no baseline)."""
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


def sensor_accuracy_w(power_w: float, channels: int = 1) -> float:
    """How far a measured board power may be from the true one, W (:data:`SENSOR_ACCURACY_REL` of it plus
    :data:`SENSOR_ACCURACY_ABS_W` per channel the total sums: 1 for an input rail, each rail of a derived
    total, :func:`edgetune.power.base.summed_channels`)."""
    return SENSOR_ACCURACY_REL * abs(power_w) + channels * SENSOR_ACCURACY_ABS_W


@dataclass(frozen=True)
class KnifeEdge:
    """The best measured setting that held the budget (``edge``) holds it by less than the sensor's accuracy
    plus the thermal rise: its true power may be over, or will be once the board is warm. The pick stays on
    the safe side: ``safer``, the best measured setting whose margin is at least that, at ``safer_cost_pct``
    more of the objective than ``edge`` (time, energy, or less throughput); the user may take ``edge``
    instead. ``safer`` is None when no measured setting has that margin: the pick is then ``edge`` itself."""

    edge: TrialRecord
    margin_w: float  # budget (with tolerance) minus the edge's measured 1-s maximum less its noise excess
    accuracy_w: float  # the sensor's accuracy at the limit
    thermal_w: float  # the thermal rise the edge's margin counts (its own soak's where soaked; 0: not soaked)
    safer: TrialRecord | None
    safer_margin_w: float | None
    safer_cost_pct: float | None


def _cost_pct(best: TrialRecord, other: TrialRecord, objective: str, cost: ZeusCost | None = None) -> float:
    """How much worse ``other`` is than ``best`` in the objective, %."""
    a, b = scalar_score(best.outcome, objective, cost), scalar_score(other.outcome, objective, cost)
    if objective == "throughput":  # scores are minus samples/s
        return (a / b - 1.0) * 100.0
    return (b / a - 1.0) * 100.0


def _held(result: SearchResult) -> list[TrialRecord]:
    """The measured settings that held the budget, with an outcome."""
    return [r for r in result.settings if r.feasible and r.outcome is not None]


def _best_of(result: SearchResult, records: list[TrialRecord]) -> TrialRecord | None:
    """The best of ``records`` by :func:`~edgetune.search.confirm.pick_score` (pareto: of their front)."""
    pool = pareto_front(records) if result.objective == "pareto" else records
    return min(pool, key=lambda r: pick_score(r.outcome, result.objective, result.cost), default=None)


def choose_best(result: SearchResult) -> TrialRecord | None:
    """The pick, on the safe side: the best of the measured settings that held the budget by the sensor's
    accuracy (pareto: the lowest energy-delay product of their front), or of all that held it where none
    did (:class:`KnifeEdge` says so)."""
    held = _held(result)
    safe = [r for r in held if result.certified(r)]
    return _best_of(result, safe or held)


def knife_edge(result: SearchResult) -> KnifeEdge | None:
    """A :class:`KnifeEdge` when the best measured setting that held the budget holds it by less than the
    sensor's accuracy (None: a clear margin, nothing held, or no budget)."""
    limit_w, accuracy_w = result.limit_w, result.accuracy_w
    held = _held(result)
    edge = _best_of(result, held)
    if limit_w is None or accuracy_w is None or edge is None or result.certified(edge):
        return None
    safer = _best_of(result, [r for r in held if result.certified(r)])
    objective = "time" if result.objective == "pareto" else result.objective
    return KnifeEdge(edge, margin_w(edge, limit_w), accuracy_w, result.rise_for_w(edge.candidate), safer,
                     margin_w(safer, limit_w) if safer else None,
                     _cost_pct(edge, safer, objective, result.cost) if safer else None)


@dataclass(frozen=True)
class BatchTie:
    """The pick's batch size rests on the steps to target alone: the best setting measured at another batch
    size (``runner_up``, holding the budget as the pick does) is behind the pick by less than the steps'
    precision (``precision``: the law's :data:`LAW_RATIO_PRECISION`, or the user's runs' own spread,
    :meth:`~edgetune.search.runs_target.RunsTarget.ratio_precision`), and that share is all the ratio of
    their steps to target would have to be off by for the runner-up to win. The hardware's figures of both
    are measured; the steps are the law's or the runs'. Training both to the target settles it."""

    pick: TrialRecord
    runner_up: TrialRecord
    cost_pct: float  # how much worse the runner-up is in the objective, by the steps to target, %
    steps_ratio: float  # the steps to target of the runner-up's batch size over the pick's
    precision: float  # the relative precision of that ratio (TargetModel.ratio_precision)


def batch_tie(result: SearchResult) -> BatchTie | None:
    """A :class:`BatchTie` when the best measured setting of a batch size other than the pick's is within
    the steps' precision of the pick in the objective (:meth:`TargetModel.ratio_precision`; None: a clear
    lead, no other batch size held the budget, an objective not in :data:`LAW_OBJECTIVES`, or steps to target
    that claim no tie: a table's measured epochs). The runner-up is held to the pick's own standard:
    certified where the pick is (:meth:`SearchResult.certified`)."""
    pick = result.best
    if result.objective not in LAW_OBJECTIVES or pick is None or pick.outcome is None:
        return None
    strict = result.certified(pick)
    others = [r for r in _held(result)
              if r.candidate.batch_size != pick.candidate.batch_size and (result.certified(r) or not strict)]
    runner_up = _best_of(result, others)
    if runner_up is None:
        return None
    precision = result.target.ratio_precision(pick.candidate.batch_size, runner_up.candidate.batch_size)
    cost_pct = _cost_pct(pick, runner_up, result.objective, result.cost)
    if not cost_pct < 100.0 * precision:
        return None
    return BatchTie(pick, runner_up, cost_pct, runner_up.outcome.steps_to_target / pick.outcome.steps_to_target,
                    precision)


def _batch_tie_json(tie: BatchTie | None, units: dict[str, str], law: bool = True) -> dict[str, Any] | None:
    if tie is None:
        return None
    doc = {"runner_up": _plan(tie.runner_up, units), "cost_pct": tie.cost_pct, "steps_ratio": tie.steps_ratio,
           "ratio_precision_pct": 100.0 * tie.precision, "steps_from": "law" if law else "runs"}
    if law:  # the key best.json has carried since ties were first reported
        doc["law_ratio_precision_pct"] = 100.0 * tie.precision
    return doc


def _knife_edge_json(edge: KnifeEdge | None) -> dict[str, Any] | None:
    if edge is None:
        return None

    def where(r: TrialRecord) -> dict[str, Any]:
        return {"trial": r.number, "batch_size": r.candidate.batch_size, "setting": r.candidate.knobs,
                "max_avg_power_w": _finite((r.measurement or {}).get("max_avg_power_w")),
                "max_avg_noise_w": _finite((r.measurement or {}).get("max_avg_noise_w"))}

    # the edge setting at the top (the fastest that held as measured); the pick is the next safer where there is one
    return {**where(edge.edge), "margin_w": edge.margin_w, "sensor_accuracy_w": edge.accuracy_w,
            "sensor_accuracy": f"{SENSOR_ACCURACY_REL:.2%} + {SENSOR_ACCURACY_ABS_W:g} W per summed channel "
                               f"(INA3221 maxima)",
            "thermal_rise_w": edge.thermal_w,
            "chosen": "this" if edge.safer is None else "next_safer",
            "next_safer": None if edge.safer is None else {**where(edge.safer), "margin_w": edge.safer_margin_w,
                                                           "cost_pct": edge.safer_cost_pct}}


def _soak_json(result: SearchResult) -> dict[str, Any] | None:
    soak = result.thermal
    if soak is None:
        return None
    d = soak.to_dict()
    d["counted_rise_w"] = result.thermal_rise_w  # what the margin counts (a stopped soak: what it proved)
    d["summary"] = soak.describe(result.thermal_rise_w)
    # the rise the pick's own margin counted: its own soak's where it was soaked, else counted_rise_w
    d["pick_rise_w"] = None if result.best is None else result.rise_for_w(result.best.candidate)
    return d


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
    "mean_power_w", "peak_power_w", "max_avg_power_w", "max_avg_noise_w", "power_se_w", "judged_span_s", "energy_j",
    "energy_per_sample_j", "duration_s", "steps", "real_steps", "time_to_target_s", "energy_to_target_j",
    "aborted_over_budget", "stopped_mid_step", "over_budget_s", "settle_s", "error",
)


def _finite(v: Any) -> Any:
    """JSON has no NaN: None instead."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def setting_with_units(setting: dict[str, Any], units: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``{"gpu_freq": {"value": 510000000, "unit": "Hz", "text": "510 MHz"}, ...}``: each knob's value in
    the knob's own unit (:data:`edgetune.power.knobs.KNOBS`: Hz, kHz for ``cpu_freq``, W, cores, mode
    names), that unit, and the value as a person reads it."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in setting.items():
        unit = units.get(name) or knob_unit(name)
        out[name] = {"value": value, "unit": unit, "text": format_value(value, unit)}
    return out


def _plan(r: TrialRecord | None, units: dict[str, str]) -> dict[str, Any] | None:
    if r is None:
        return None
    m = r.measurement or {}
    return {
        "trial": r.number,
        "batch_size": r.candidate.batch_size,
        "setting": setting_with_units(r.candidate.knobs, units),
        "measured": {k: _finite(m.get(k)) for k in MEASURED_KEYS},
        "predicted": {
            "time_to_target_s": _finite(r.outcome.time_to_target_s) if r.outcome else None,
            "energy_to_target_j": _finite(r.outcome.energy_to_target_j) if r.outcome else None,
            "steps_to_target": _finite(r.outcome.steps_to_target) if r.outcome else None,
        },
        "budget_held": r.feasible,
        "windows": int(m.get("windows", 1)),  # measurements pooled into these figures
    }


def best_json(result: SearchResult) -> dict[str, Any]:
    """The ``best.json`` document of a result (``batch_size`` and ``setting`` None when nothing held)."""
    units = dict(result.space.unit_of)
    best = _plan(result.best, units) or {"batch_size": None, "setting": None, "measured": None, "predicted": None}
    doc: dict[str, Any] = {
        "device": result.device_name,
        "device_description": result.device_description,
        "simulated": result.simulated,
        "workload": result.workload,
        # where the search trained: the plan's power and speed are those of steps run there
        "torch_device": result.torch_device,
        "budget_w": result.budget_w,
        "budget_binds": result.constrained,
        "budget_tolerance": result.tolerance,
        "objective": result.objective,
        "batch_size": best["batch_size"],
        "setting": best["setting"],
        "measured": best["measured"],
        "predicted": best["predicted"],
        "baseline": _plan(result.baseline, units),
        "speedup_over_baseline": _finite(result.speedup),
        "speedup_measure": result.speedup_measure,
        "target_model": result.target.describe(),
        # a file storage's path as given may be relative to where the search ran: its absolute path beside it,
        # for --prior FOLDER from anywhere (prior._storage_of_folder)
        "study": {"name": result.study_name, "storage": result.storage_url,
                  "storage_file": None if (file := storage_file(result.storage_url)) is None else str(file),
                  "trials_measured": len(result.measured), "settings_measured": len(result.settings),
                  "space_size": result.space.size,
                  "stop_reason": result.stop_reason,
                  # safe profiling: device seconds the moving average spent above the budget while measuring
                  "over_budget_s": result.over_budget_s, "aborted_over_budget": result.aborted_over_budget},
        "protocol": result.protocol,
        "pareto_front": [_plan(r, units) for r in result.pareto],
        "workload_cost": result.workload_cost,
        # the best setting as measured holds the budget by less than the sensor's accuracy plus the thermal rise
        # (null: a clear margin)
        "knife_edge": _knife_edge_json(knife_edge(result)),
        # another batch size within the convergence law's precision of the pick (null: a clear lead): the law,
        # not the measurements, chose between the two
        "batch_size_tie": _batch_tie_json(batch_tie(result), units, result.target.is_law),
        # the pick trained at for minutes: how much more it draws on the warm board (null: not soaked); the
        # soak with the largest rise per watt, whose rise at the budget's edge the margin of every setting not
        # soaked itself includes (counted_rise_w; a soaked one counts its own), and how many soaks ran
        "thermal_soak": _soak_json(result),
        "thermal_soaks": len(result.thermal_soaks),
        # the knobs left as found (not searched): the plan's figures hold with them so, and the runtime says
        # when a board runs them otherwise
        "untuned_knobs": setting_with_units(result.untuned_knobs, {}),
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
    # a simulated search's rows say so, each (best.json's key; the monitor's CSV does the same)
    cols = list(TRIAL_COLUMNS[:4]) + knobs + list(TRIAL_COLUMNS[4:]) + (["simulated"] if result.simulated else [])
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in sorted(result.measured, key=lambda r: r.number):
            m = r.measurement or {}
            row = {"trial": r.number, "role": r.role, "worker": r.worker, "batch_size": r.candidate.batch_size,
                   "ok": m.get("ok"), "oom": m.get("oom"), "feasible": r.feasible, "error": m.get("error") or ""}
            if result.simulated:
                row["simulated"] = True
            row.update(r.candidate.knobs)
            for k in ("step_time_s", "samples_per_s", "mean_power_w", "peak_power_w", "max_avg_power_w",
                      "max_avg_noise_w", "power_se_w", "judged_span_s", "energy_j", "energy_per_sample_j", "duration_s",
                      "steps", "real_steps", "aborted_over_budget", "stopped_mid_step", "over_budget_s",
                      "settle_s"):
                v = m.get(k)
                row[k] = "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
            if r.outcome:
                row["time_to_target_s"] = r.outcome.time_to_target_s
                row["energy_to_target_j"] = r.outcome.energy_to_target_j
            w.writerow(row)
    return path


#: the lock file of an output folder: each writer of the folder's files holds an exclusive ``flock`` on it
#: while it reads its view and writes (:func:`write_folder`); the lock ends with its process, so the file a
#: killed writer leaves blocks nothing
FOLDER_LOCK = ".edgetune.lock"
#: the folder a writer renders its files into before renaming them into place (a killed writer's is removed
#: by the next one)
STAGING = ".edgetune-writing"


@contextlib.contextmanager
def folder_lock(folder: Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (``flock`` on its :data:`FOLDER_LOCK`), waiting for another
    holder (``on_wait`` called first, once: say so). Without ``fcntl`` (not POSIX) nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the search runs on Linux boards
        yield
        return
    with open(folder / FOLDER_LOCK, "a+b") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _stamp(doc: Any) -> tuple[int, int] | None:
    """How far into its study a best.json's view was: (trials measured, thermal soaks); None: not known."""
    try:
        return int(doc["study"]["trials_measured"]), int(doc.get("thermal_soaks") or 0)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@dataclass(frozen=True)
class Written:
    """What :func:`write_folder` did: the view it wrote (or the worker's own, where it kept the folder's), the
    files (empty: none written), and a line to say (None: nothing to say)."""

    result: SearchResult
    files: list[Path]
    line: str | None = None


def write_folder(folder: str | Path, result: SearchResult, *, reread: Callable[[], SearchResult] | None = None,
                 draw: Callable[[SearchResult, Path], list[Path]] | None = None,
                 on_wait: Callable[[], None] | None = None) -> Written:
    """Write best.json, trials.csv and (``draw``) the plots of one view of the study into ``folder``.

    Under an exclusive lock on the folder (:func:`folder_lock`): the workers of a fleet sharing one folder
    write one at a time, and each writes the view ``reread`` takes under the lock (the storage as it stands
    then), so a worker that read the study before another worker's last trial never leaves its older view
    over the other's files. Where ``reread`` is None or fails, ``result`` (the worker's own last view) is
    written unless the folder's best.json, of the same study, holds more of it (more trials measured, or as
    many and more thermal soaks): those newer files are kept, and :attr:`Written.line` says so.

    The files are rendered into :data:`STAGING` and renamed into place, best.json first (a folder never holds
    a trials.csv or a plot without one): a reader sees each file whole, and the set of one view but for the
    instants between the renames."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    line = None
    with folder_lock(folder, on_wait):
        view = result
        if reread is not None:
            try:
                view = reread()
            except Exception as exc:  # noqa: BLE001 - a storage gone away: fall back to this worker's view
                line = (f"could not read the study again before writing its files ({type(exc).__name__}: "
                        f"{exc}); writing this worker's last view")
                reread = None
        if reread is None:
            try:
                held = json.loads((folder / "best.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                held = None
            theirs, mine = _stamp(held), (len(view.measured), len(view.thermal_soaks))
            same = isinstance(held, dict) and (held.get("study") or {}).get("name") == view.study_name
            if same and theirs is not None and theirs > mine:
                return Written(view, [], f"kept the files in {folder}: they hold a newer view of study "
                                         f"{view.study_name!r} ({theirs[0]} trials measured, this worker's "
                                         f"{mine[0]}), written by another worker")
        stage = folder / STAGING
        shutil.rmtree(stage, ignore_errors=True)  # a writer killed mid-write left it
        stage.mkdir()
        try:
            staged = [write_best(view, stage / "best.json"), write_trials_csv(view, stage / "trials.csv")]
            if draw is not None:
                staged += draw(view, stage)
            files = []
            for path in staged:  # best.json first
                files.append(path.replace(folder / path.name))
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return Written(view, files, line)
