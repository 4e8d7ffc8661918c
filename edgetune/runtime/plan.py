"""The plan the runtime applies: the batch size and knob setting of ``edgetune search``'s ``best.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edgetune.power.base import KnobValue
from edgetune.power.knobs import reads_running_clock

__all__ = ["COST_TOLERANCE", "Plan", "PlanError", "load_plan", "training_mismatch", "untuned_mismatch",
           "workload_mismatch"]

#: a model whose parameter bytes or FLOPs per sample differ from the plan's workload by more than this
#: fraction is another model: the plan's batch size and knobs were measured for a different step
COST_TOLERANCE = 0.1


class PlanError(ValueError):
    """A plan file that cannot be used (one line naming the problem and the fix)."""


@dataclass(frozen=True)
class Plan:
    """The part of ``edgetune search``'s ``best.json`` the runtime applies.

    Attributes:
        batch_size: the batch size the search chose.
        setting: knob name -> value (the device's own units: Hz, kHz, W, mode names).
        budget_w: the budget the search held, in W (None: the plan does not say).
        device: the device spec the plan was made on (None: unknown).
        path: the file it was read from (empty for a plan built in code).
        workload: the workload the plan was searched for (None: unknown).
        workload_cost: that workload's step cost (``WorkloadCost`` fields; None: unknown).
        untuned: the knobs the search left as found, with their values then (``untuned_knobs``; empty where
            the plan does not say): its figures hold with them so (:func:`untuned_mismatch`).
        torch_device: where the search trained (``cuda:0``, ``cpu``; None where the plan does not say): its
            figures are those of steps run there (:func:`training_mismatch`).
    """

    batch_size: int
    setting: dict[str, KnobValue]
    budget_w: float | None
    device: str | None
    path: str = ""
    workload: str | None = None
    workload_cost: dict[str, float] | None = None
    untuned: dict[str, KnobValue] = field(default_factory=dict)
    torch_device: str | None = None


def training_mismatch(plan: Plan, trains_on: str) -> str | None:
    """Why ``plan``'s figures do not hold for a model trained on ``trains_on`` (a torch device), or None: the
    search measured steps run on another processor (a board's CPU, where the plan's board trains on its GPU,
    or the reverse)."""
    if plan.torch_device is None or plan.torch_device == trains_on:
        return None
    return (f"plan {plan.path or '(in code)'} was measured training on {plan.torch_device}, and this model is on "
            f"{trains_on}: its power and speed do not hold here; search again training where the model runs")


def untuned_mismatch(plan: Plan, now: Mapping[str, KnobValue]) -> list[str]:
    """The knobs the plan's search left as found that the board runs otherwise ``now``, one line each (knobs
    the board lacks are not compared): the plan's power and speed were measured with the values it names.
    Clocks are not compared (a plan of an earlier version may list them): a clock reads the frequency running
    now, which a governor moves from one read to the next (:func:`~edgetune.power.knobs.reads_running_clock`)."""
    lines = []
    for name, then in plan.untuned.items():
        if name in now and now[name] != then and not reads_running_clock(name):
            fix = ("boot into it (`sudo nvpmodel -m <id>`, a reboot)" if name == "power_mode" else "set it back")
            lines.append(f"plan{' ' + plan.path if plan.path else ''}: measured with {name} {then}, and the board "
                         f"runs {now[name]}: its power and speed do not hold here; {fix} or search again in this "
                         f"state")
    return lines


def workload_mismatch(plan: Plan, *, param_bytes: float | None = None,
                      flops_per_sample: float | None = None) -> str | None:
    """Why ``plan`` may not fit the model being trained (its cost differs from the plan's workload), or None.

    Compares what is known on both sides: the parameter bytes (always at hand from the model) and the
    FLOPs per sample (once measured), each within :data:`COST_TOLERANCE`.
    """
    cost = plan.workload_cost or {}
    differs = []
    for what, ours, label in (("param_bytes", param_bytes, "parameter bytes"),
                              ("flops_per_sample", flops_per_sample, "FLOPs per sample")):
        theirs = cost.get(what)
        if ours is None or not isinstance(theirs, (int, float)) or theirs <= 0:
            continue
        if abs(ours / theirs - 1.0) > COST_TOLERANCE:
            differs.append(f"{label} {ours:.3g} vs the plan's {theirs:.3g}")
    if not differs:
        return None
    name = f" ({plan.workload})" if plan.workload else ""
    return (f"plan {plan.path or '(in code)'} was searched for another model{name}: {'; '.join(differs)}; its "
            f"batch size and knobs may not be the best for this one (run edgetune search for this model)")


def _setting(raw: object, p: Path) -> dict[str, KnobValue]:
    """best.json's setting: ``{knob: {"value": v, "unit": u, "text": t}}`` (units) or ``{knob: v}`` (older)."""
    if not isinstance(raw, dict):
        raise PlanError(f"plan {p}: setting must be an object of knob -> value, got {type(raw).__name__}")
    setting: dict[str, KnobValue] = {}
    for name, entry in raw.items():
        value = entry.get("value") if isinstance(entry, dict) else entry
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise PlanError(f"plan {p}: setting {name!r} must be a number or a name (or an object with a "
                            f"\"value\"), got {entry!r}")
        setting[str(name)] = value
    return setting


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan (``best.json``); raises :class:`PlanError` with one line on a bad file."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"plan {p}: no such file; run `edgetune search ... --output DIR` and pass DIR/best.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"plan {p}: not readable JSON ({exc}); pass the best.json that edgetune search wrote") from None
    if not isinstance(raw, dict):
        raise PlanError(f"plan {p}: expected a JSON object with batch_size and setting")
    b = raw.get("batch_size")
    if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
        raise PlanError(f"plan {p}: batch_size must be a positive integer, got {b!r}")
    setting = _setting(raw.get("setting") or {}, p)
    budget = raw.get("budget_w")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
        raise PlanError(f"plan {p}: budget_w must be a positive number of watts, got {budget!r}")
    cost = raw.get("workload_cost")
    untuned = _setting(raw.get("untuned_knobs") or {}, p)
    where = raw.get("torch_device")
    return Plan(b, setting, None if budget is None else float(budget), raw.get("device"), str(p),
                workload=raw.get("workload"), workload_cost=cost if isinstance(cost, dict) else None,
                untuned=untuned, torch_device=where if isinstance(where, str) else None)
