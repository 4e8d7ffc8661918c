"""Tables for the terminal and PNG plots of a search (matplotlib).

Figures are built as :class:`matplotlib.figure.Figure` objects drawn by the Agg canvas, without pyplot:
no display is needed, and the backend of the process that calls edgetune (a notebook, a GUI) is left alone.

* :func:`summary_table` - the chosen setting against the baseline, and how the search went;
* :func:`plot_time_energy` - time vs energy to target of every measured setting, the Pareto front of the
  feasible ones, infeasible settings (over budget) marked, the chosen one and the baseline highlighted;
* :func:`plot_power` - board power over each measured window, with the budget line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgetune.power.base import format_value
from edgetune.power.monitor import cumulative_energy_j

if TYPE_CHECKING:
    from edgetune.search.study import SearchResult, TrialRecord

__all__ = ["format_table", "plot_power", "plot_time_energy", "summary_table", "write_plots"]

SCIENTIFIC_FROM = 1e5  # table cells this large print as 1.234e+05: 4 significant digits would drop digits


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [line(cells[0]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells[1:]]
    return "\n".join(s.rstrip() for s in out)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.4g}" if abs(v) < SCIENTIFIC_FROM else f"{v:.3e}"
    return str(v)


def _setting_text(r: TrialRecord, units: dict[str, str]) -> str:
    return ", ".join(f"{k}={format_value(v, units.get(k, ''))}" for k, v in r.candidate.setting)


def summary_table(result: SearchResult) -> str:
    """The end-of-search summary: chosen vs baseline, then one line on the search itself."""
    units = result.space.unit_of
    rows = []
    for label, r in (("chosen", result.best), ("baseline", result.baseline)):
        if r is None:
            rows.append([label, "-", "none held the budget" if label == "chosen" else "none (see notes)",
                         None, None, None, None, None])
            continue
        m = r.measurement or {}
        o = r.outcome
        rows.append([label, r.candidate.batch_size, _setting_text(r, units), m.get("step_time_s"),
                     m.get("max_avg_power_w"), m.get("energy_per_sample_j"),
                     o.time_to_target_s if o else None, o.energy_to_target_j if o else None])
    # the budget window the monitor used (1 s, or longer on a slow sensor such as jtop's)
    window_s = next((w for r in (result.best, result.baseline) if r is not None
                     for w in [(r.measurement or {}).get("avg_window_s")] if w), 1.0)
    table = format_table(["", "batch", "setting", "step s", f"max {window_s:g}s-avg W", "J/sample",
                          "time to target s", "energy to target J"], rows)
    n = len(result.measured)
    infeasible = sum(1 for r in result.measured if not r.feasible)
    budget = ("unconstrained" if result.budget_w is None else
              f"{result.budget_w:g} W" + ("" if result.constrained else " (above the device maximum: "
                                                                          "no constraint binds)"))
    lines = [table, ""]
    sp = result.speedup
    if sp is not None:
        what = {"energy": "energy to target", "throughput": "throughput"}.get(result.objective, "time to target")
        lines.append(f"speedup over baseline ({what}): {sp:.2f}x")
    lines.append(f"measured {n} of {result.space.size} settings ({infeasible} over budget or failed); "
                 f"budget {budget}; stopped: {result.stop_reason}")
    if result.simulated:
        lines.append(f"SIMULATED device ({result.device_description}); protocol: {result.protocol}")
    return "\n".join(lines)


TIME_ENERGY_SIZE_IN = (7, 5)  # inches: a square-ish scatter with room for the legend
POWER_SIZE_IN = (9, 4)  # inches: wide, windows run back to back along the time axis
PLOT_DPI = 110  # 770x550 and 990x440 pixels: readable on a laptop screen, small files
WINDOW_GAP_S = 0.2  # gap drawn between consecutive measured windows in the power plot
TITLE_FONT_PT = 10  # titles name device, workload and budget: long, so smaller than matplotlib's 12
LEGEND_FONT_PT = 8  # the legend must not hide the points
FALLBACK_AVG_WINDOW_S = 1.0  # the budget's default window, for a record that does not name its own


def _figure(size_in: tuple[float, float]):
    """A figure on the Agg canvas (PNG without a display), independent of pyplot and its backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size_in)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=PLOT_DPI)
    return path


def plot_time_energy(result: SearchResult, path: str | Path) -> Path:
    """Time vs energy to target: feasible, over budget (x), Pareto front (line), chosen and baseline."""
    fig = _figure(TIME_ENERGY_SIZE_IN)
    ax = fig.subplots()
    ok = [r for r in result.measured if r.outcome is not None]
    feas = [r for r in ok if r.feasible]
    over = [r for r in ok if not r.feasible]
    if feas:
        ax.scatter([r.outcome.time_to_target_s for r in feas], [r.outcome.energy_to_target_j for r in feas],
                   s=18, c="tab:blue", label="within budget")
    if over:
        ax.scatter([r.outcome.time_to_target_s for r in over], [r.outcome.energy_to_target_j for r in over],
                   s=24, c="tab:red", marker="x", label="over budget (infeasible)")
    if result.pareto:
        ax.plot([r.outcome.time_to_target_s for r in result.pareto],
                [r.outcome.energy_to_target_j for r in result.pareto], "-o", c="tab:green", ms=4,
                label="Pareto front (feasible)")
    for r, style, label in ((result.baseline, {"marker": "s", "c": "tab:orange"}, "baseline"),
                            (result.best, {"marker": "*", "c": "gold"}, "chosen")):
        if r is not None and r.outcome is not None:
            ax.scatter([r.outcome.time_to_target_s], [r.outcome.energy_to_target_j], s=160, edgecolors="k",
                       zorder=5, label=label, **style)
    n_fail = sum(1 for r in result.measured if r.outcome is None)
    budget = "unconstrained" if result.budget_w is None else f"budget {result.budget_w:g} W"
    # settings span orders of magnitude (tiny batches at low clocks): log axes keep the front readable
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time to target (s, log)")
    ax.set_ylabel("energy to target (J, log)")
    title = f"{result.workload} on {result.device_name}, {budget}"
    if n_fail:
        title += f" ({n_fail} out of memory/failed, not shown)"
    ax.set_title(title + (" [simulated]" if result.simulated else ""), fontsize=TITLE_FONT_PT)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_FONT_PT)
    return _save(fig, path)


def plot_power(result: SearchResult, path: str | Path) -> Path:
    """Board power over the measured windows, one after another, with the budget line."""
    fig = _figure(POWER_SIZE_IN)
    ax = fig.subplots()
    offset = 0.0
    for r in sorted(result.measured, key=lambda r: r.number):
        if not r.trace_t:
            continue
        color = "tab:blue" if r.feasible else "tab:red"
        ax.plot([offset + t for t in r.trace_t], r.trace_w, lw=0.8, c=color, alpha=0.6)
        window_s = (r.measurement or {}).get("avg_window_s", FALLBACK_AVG_WINDOW_S)
        ma_t, ma_w = _moving_average(r.trace_t, r.trace_w, window_s)
        if ma_t.size:
            ax.plot(offset + ma_t, ma_w, lw=1.2, c="k")
        if r is result.best:
            ax.axvspan(offset, offset + r.trace_t[-1], color="gold", alpha=0.3, lw=0)
        offset += r.trace_t[-1] + WINDOW_GAP_S
    if result.budget_w is not None:
        ax.axhline(result.budget_w, c="k", ls="--", lw=1, label=f"budget {result.budget_w:g} W")
        ax.legend(fontsize=LEGEND_FONT_PT, loc="upper right")
    ax.set_xlabel("measured window time, windows back to back (s, device clock)")
    ax.set_ylabel("board power (W)")
    ax.set_title("power over the measured windows (black: moving average; red: over budget; gold: chosen)"
                 + (" [simulated]" if result.simulated else ""), fontsize=TITLE_FONT_PT)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _moving_average(t: Sequence[float], w: Sequence[float], window_s: float):
    """The trailing ``window_s`` average of a power record, where a full window is available."""
    t = np.asarray(t, dtype=float)
    w = np.asarray(w, dtype=float)
    if t.size < 2 or t[-1] - t[0] < window_s:
        return np.array([]), np.array([])
    energy = cumulative_energy_j(t, w)
    at = t[t >= t[0] + window_s]
    return at, (energy[t >= t[0] + window_s] - np.interp(at - window_s, t, energy)) / window_s


def write_plots(result: SearchResult, folder: str | Path) -> list[Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return [plot_time_energy(result, folder / "time_vs_energy.png"), plot_power(result, folder / "power.png")]
