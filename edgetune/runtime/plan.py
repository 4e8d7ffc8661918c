"""The plan the runtime applies: the batch size and knob setting of ``edgetune search``'s ``best.json``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from edgetune.power.base import KnobValue

__all__ = ["Plan", "PlanError", "load_plan"]


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
    """

    batch_size: int
    setting: dict[str, KnobValue]
    budget_w: float | None
    device: str | None
    path: str = ""


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a plan (``best.json``); raises :class:`PlanError` with one line on a bad file."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"plan {p}: no such file; run `edgetune search ... --out DIR` and pass DIR/best.json") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"plan {p}: not readable JSON ({exc}); pass the best.json that edgetune search wrote") from None
    if not isinstance(raw, dict):
        raise PlanError(f"plan {p}: expected a JSON object with batch_size and setting")
    b = raw.get("batch_size")
    if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
        raise PlanError(f"plan {p}: batch_size must be a positive integer, got {b!r}")
    setting = raw.get("setting", {})
    if not isinstance(setting, dict):
        raise PlanError(f"plan {p}: setting must be an object of knob -> value, got {type(setting).__name__}")
    budget = raw.get("budget_w")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
        raise PlanError(f"plan {p}: budget_w must be a positive number of watts, got {budget!r}")
    return Plan(b, dict(setting), None if budget is None else float(budget), raw.get("device"), str(p))
