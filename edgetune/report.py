"""Tables for the terminal and PNG plots of a search (matplotlib).

Figures are built as :class:`matplotlib.figure.Figure` objects drawn by the Agg canvas, without pyplot:
no display is needed, and the backend of the process that calls edgetune (a notebook, a GUI) is left alone.

* :func:`summary_table` - the chosen setting against the baseline, and how the search went;
* :func:`plot_time_energy` - time vs energy to target of every measured setting, the Pareto front of the
  feasible ones on top, infeasible settings (over budget) marked, the chosen one and the baseline
  highlighted; outliers drawn at the edge of the view (:func:`view_limits`) so they do not squeeze the rest;
* :func:`plot_power` - board power over each measured window, with the budget line and the guard band.

Keys are legends below the axes, never titles; titles wrap to the figure's width; a search with nothing to
draw gets a figure that says why, not empty axes.
"""

from __future__ import annotations

import math
import shlex
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgetune.power.base import format_value
from edgetune.power.monitor import cumulative_energy_j

if TYPE_CHECKING:
    from edgetune.search.study import SearchResult, TrialRecord

__all__ = ["PLOT_FILES", "format_table", "plot_power", "plot_time_energy", "summary_table", "view_limits",
           "write_plots"]

#: the plots :func:`write_plots` draws in a study's folder: time against energy, and power over the search
PLOT_FILES = ("time_vs_energy.png", "power.png")

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


def _pooled_pick_line(result: SearchResult) -> str:
    """Where the pick's windows were pooled and held the budget though some window alone did not (trials.csv
    and the progress lines judge each window alone): why the two verdicts differ. Empty otherwise."""
    from edgetune.search.window import judged_power_w

    best = result.best
    if best is None or result.limit_w is None or int((best.measurement or {}).get("windows", 1)) < 2:
        return ""
    windows = [r for r in result.measured if r.candidate == best.candidate]
    alone_over = [r.number for r in windows if not r.feasible]
    if not alone_over:
        return ""
    m = best.measurement or {}
    judged = judged_power_w(float(m["max_avg_power_w"]), float(m.get("power_se_w") or 0.0), result.guard_sigma or 0.0)
    trials = ", ".join(f"#{r.number}" for r in windows)
    return (f"the chosen setting is {len(windows)} windows pooled (trials {trials}): "
            f"their mean, {m['max_avg_power_w']:.3f} W with the guard band of the mean ({judged:.3f} W judged), holds "
            f"the limit of {result.limit_w:.3f} W, though window{'s' if len(alone_over) > 1 else ''} "
            f"{', '.join(f'#{n}' for n in alone_over)} alone, with one window's wider band, did not (trials.csv "
            f"judges each window alone)")


def summary_table(result: SearchResult, workload_spec: str | None = None) -> str:
    """The end-of-search summary: chosen vs baseline, then one line on the search itself.

    ``workload_spec`` is the ``--workload`` the search was given (``module:function`` for your own model),
    for the ``edgetune run`` lines the summary offers; the workload's name where not given."""
    units = result.space.unit_of
    all_failed = bool(result.measured) and all(r.outcome is None for r in result.measured)
    rows = []
    for label, r in (("chosen", result.best), ("baseline", result.baseline)):
        if r is None:
            why = ("every setting failed" if all_failed else "none held the budget") if label == "chosen" else (
                _no_baseline_why(result))
            rows.append([label, "-", why, None, None, None, None, None])
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
    settings = result.settings
    n = len(settings)
    failed = sum(1 for r in settings if r.outcome is None)
    over = sum(1 for r in settings if r.outcome is not None and not r.feasible)
    again = len(result.measured) - n
    budget = ("unconstrained" if result.budget_w is None else
              f"{result.budget_w:g} W" + ("" if result.constrained else " (above the device maximum: "
                                                                          "no constraint binds)"))
    lines = [table, ""]
    pooled = _pooled_pick_line(result)
    if pooled:
        lines.append(pooled)
    sp = result.speedup
    if sp is not None:
        lines.append(_gain_line(result, sp))
    front = _front_line(result)
    if front:
        lines.append(front)
    confirmed = f"; {again} measured again before the pick" if again else ""
    lines.append(f"measured {n} of {result.space.size} settings ({over} over budget, {failed} failed{confirmed}); "
                 f"budget {budget}; stopped: {result.stop_reason}")
    if result.constrained:
        lines.append(f"over budget during search: {result.over_budget_s:.1f} s (device seconds the board's "
                     f"{window_s:g}-s average spent above the budget while settings were measured)")
    if result.thermal is not None:
        lines.append(result.thermal.describe(result.thermal_rise_w) + " (best.json: thermal_soak)")
        pick_rise_w = None if result.best is None else result.rise_for_w(result.best.candidate)
        if pick_rise_w is not None and pick_rise_w != result.thermal_rise_w:
            lines.append(f"the pick was soaked itself: its margin counts its own rise, {pick_rise_w:.2f} W "
                         f"(best.json: thermal_soak.pick_rise_w)")
    edge = result.knife_edge
    if edge is not None:
        where = (f"trial {edge.edge.number}, batch {edge.edge.candidate.batch_size}, "
                 f"{_setting_text(edge.edge, units)}")
        within = (f"within the sensor's accuracy ({edge.accuracy_w:.3f} W)" if not edge.thermal_w else
                  f"within the sensor's accuracy and the thermal rise ({edge.accuracy_w:.3f} + {edge.thermal_w:.3f} W)")
        if edge.safer is None:
            lines.append(f"knife edge: the chosen setting's measured power is {edge.margin_w:.3f} W under the budget, "
                         f"{within}: its true power may be over; no "
                         f"measured setting has a wider margin (best.json: knife_edge)")
        else:
            lines.append(f"knife edge: the best measured setting ({where}) is {edge.margin_w:.3f} W under the "
                         f"budget, {within}: its true power may be "
                         f"over, so the pick is the next safer (margin {edge.safer_margin_w:.3f} W), "
                         f"{edge.safer_cost_pct:+.1f}% {result.objective}; to run the edge setting: "
                         f"{_run_command(result, edge.edge, workload_spec)} (best.json: knife_edge)")
    tie = result.batch_tie
    if tie is not None:
        other = tie.runner_up
        ratio = (f"S({other.candidate.batch_size}) / S({tie.pick.candidate.batch_size}) = "
                 f"{tie.steps_ratio:.3f}")
        if result.target.is_law:
            how = (f"a tie under the convergence law: batch {other.candidate.batch_size} (trial {other.number}, "
                   f"{_setting_text(other, units)}) is {tie.cost_pct:.1f}% behind by the law's steps to target "
                   f"({ratio}), within the law's precision ({tie.precision:.0%})")
        else:
            how = (f"a tie under your runs: batch {other.candidate.batch_size} (trial {other.number}, "
                   f"{_setting_text(other, units)}) is {tie.cost_pct:.1f}% behind by your runs' median steps to "
                   f"target ({ratio}), within what their spread tells apart ({tie.precision:.0%})")
        lines.append(f"batch size: {how}; train both to your target to decide: edgetune.tune(..., target=..., "
                     f"runs_file=...) records each run, and this search run again with --steps-to-target scores "
                     f"what it measured with them (README: Your runs to the target); the other setting: "
                     f"{_run_command(result, other, workload_spec)} (best.json: batch_size_tie)")
    if result.simulated:
        lines.append(f"SIMULATED device ({result.device_description}); protocol: {result.protocol}")
    return "\n".join(lines)


def _front_line(result: SearchResult) -> str:
    """For ``pareto``: the front the search offers, which the table's one chosen row stands for (empty
    otherwise, or where nothing held the budget)."""
    front = [r for r in result.pareto if r.outcome is not None]
    if result.objective != "pareto" or not front:
        return ""
    if len(front) == 1:
        return ("Pareto front: 1 setting, the chosen one (no other measured setting within the budget is faster "
                "or uses less energy; best.json: pareto_front)")
    times = [r.outcome.time_to_target_s for r in front]
    energies = [r.outcome.energy_to_target_j for r in front]
    return (f"Pareto front: {len(front)} settings within the budget, {min(times):.4g}-{max(times):.4g} s and "
            f"{min(energies):.4g}-{max(energies):.4g} J to target (best.json: pareto_front; time_vs_energy.png); "
            f"chosen: its lowest energy x time")


def _run_command(result: SearchResult, r: TrialRecord, workload_spec: str | None) -> str:
    """The ``edgetune run`` line that trains the search's workload on its device at ``r``'s batch size and
    setting (knob values in their own units)."""
    spec = workload_spec or result.workload
    return (f"edgetune run --device {shlex.quote(result.device_name)} --workload {shlex.quote(spec)} "
            f"--batch-size {r.candidate.batch_size} " + " ".join(f"--set {k}={v}" for k, v in r.candidate.setting))


def _no_baseline_why(result: SearchResult) -> str:
    """Why a search has no baseline, in a few words for the summary's baseline row."""
    from edgetune.search.records import Role

    # measured probes, and one known to run out of memory (not measured: edgetune.search.memory)
    probes = [r for r in result.records if r.role == Role.BASELINE and (r.measured or r.oom_of is not None)]
    if not probes:
        return "none (not measured)"
    oom = next((r for r in probes if r.oom), None)
    if oom is not None:  # the default batch size, or the space's nearest where it lacks the default
        return f"none (its batch size {oom.candidate.batch_size} out of memory)"
    if any(r.feasible for r in probes):
        return "unfinished (more trials to bisect)"
    return "none (no probe held the budget)"


def _gain_line(result: SearchResult, ratio: float) -> str:
    """The chosen setting against the baseline, in the objective's own words (``ratio``: the result's
    :attr:`~edgetune.search.results.SearchResult.speedup`, in its ``speedup_measure``; above 1 is better). The
    cost objective's ratio is a cost, with the speedup in time to target beside it: the two differ unless eta is 0."""
    objective = result.objective
    if not (math.isfinite(ratio) and ratio > 0):  # a side that never reaches the target: no ratio to state
        never = [f"{label} (batch {r.candidate.batch_size})" for label, r in
                 (("the baseline", result.baseline), ("the chosen setting", result.best))
                 if r is not None and r.outcome is not None and not math.isfinite(r.outcome.time_to_target_s)]
        steps = "the convergence law" if result.target.is_law else "your runs to the target"
        return (f"{result.speedup_measure.split(' (')[0]} vs baseline: no ratio to state, "
                f"{' and '.join(never) or 'one of the two'} never reaches the target by {steps} "
                f"(best.json: speedup_over_baseline is null)")
    change = f"{1.0 - 1.0 / ratio:.0%} less" if ratio >= 1.0 else f"{1.0 / ratio - 1.0:.0%} more"
    if objective == "energy":
        return f"energy to target vs baseline: {change} energy (baseline / chosen = {ratio:.2f}x)"
    if objective == "throughput":
        return f"throughput vs baseline: {ratio:.2f}x the samples/s"
    if objective == "cost" and result.cost is not None:
        cost = result.cost
        b, c = result.baseline.outcome, result.best.outcome
        return (f"cost to target vs baseline: {change} cost (baseline / chosen = {ratio:.2f}x; Zeus's cost, "
                f"eta {cost.eta:g} x energy + {1.0 - cost.eta:g} x {cost.max_power_w:g} W x time); speedup over "
                f"baseline (time to target): {b.time_to_target_s / c.time_to_target_s:.2f}x")
    return f"speedup over baseline (time to target): {ratio:.2f}x"


TIME_ENERGY_SIZE_IN = (8, 5.5)  # inches: the scatter, with the legend in a row below it
POWER_SIZE_IN = (10, 5)  # inches: wide, windows run back to back along the time axis; legend below
PLOT_DPI = 110  # 880x605 and 1100x550 pixels: readable on a laptop screen, small files
WINDOW_GAP_S = 0.2  # gap drawn between consecutive measured windows in the power plot
TITLE_FONT_PT = 10  # titles name device, workload and budget: long, so smaller than matplotlib's 12
TITLE_CHARS = 80  # a title line is wrapped at this many characters: 10-pt text fits the figure's width
LEGEND_FONT_PT = 8  # the legend must not hide the points
FALLBACK_AVG_WINDOW_S = 1.0  # the budget's default window, for a record that does not name its own
#: the time-energy view spans the middle half of the points (in log space) widened by this many of its
#: widths on each side (Tukey's fences, 1.5); points beyond are outliers, drawn at the edge of the view
OUTLIER_FENCE = 1.5
#: narrowest middle half, in decades, the fences are built on: points within a few percent of each other
#: are not called outliers of each other
MIN_SPREAD_DECADES = 0.1
VIEW_PAD_DECADES = 0.03  # room between the outermost points and the axes' edge
EXPLAIN_FONT_PT = 11  # the text of a figure that explains why there is nothing to draw


def _figure(size_in: tuple[float, float]):
    """A figure on the Agg canvas (PNG without a display), independent of pyplot and its backend."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size_in, layout="constrained")  # title, axes and legend laid out to fit
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=PLOT_DPI)
    return path


def _title(text: str) -> str:
    return textwrap.fill(text, TITLE_CHARS)


def _context(result: SearchResult) -> str:
    budget = "unconstrained" if result.budget_w is None else f"budget {result.budget_w:g} W"
    return (f"{result.workload} on {result.device_name}, {budget}, objective {result.objective}"
            + (" (simulated)" if result.simulated else ""))


def _explain(fig, title: str, lines: Sequence[str]) -> None:
    """A figure that says why there is nothing to plot, instead of empty axes."""
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(_title(title), fontsize=TITLE_FONT_PT)
    ax.text(0.5, 0.5, "\n".join(textwrap.fill(line, TITLE_CHARS - 10) for line in lines), ha="center",
            va="center", fontsize=EXPLAIN_FONT_PT, transform=ax.transAxes, wrap=True)


def _failure_lines(result: SearchResult) -> list[str]:
    failed = [r for r in result.measured if r.outcome is None]
    if not result.measured:
        return [(f"No setting was measured: the search stopped before its first trial "
                 f"({result.stop_reason or 'no reason recorded'}).")]
    causes = Counter("out of memory" if r.oom else (r.error or "failed").split(":")[0] for r in failed)
    cause, count = causes.most_common(1)[0] if causes else ("", 0)
    return [(f"None of the {len(result.measured)} measured settings ran to the end, so there is no time or "
             f"energy to draw."), f"Most common cause: {cause} ({count} of {len(failed)}).",
            "Every trial and its error are in trials.csv."]


def view_limits(values: Sequence[float], keep: Sequence[float] = ()) -> tuple[float, float]:
    """Log-axis limits that show the bulk of ``values`` and every one of ``keep``, whatever the outliers.

    Pure: the middle half of the values in log space, widened by :data:`OUTLIER_FENCE` of its width on each
    side, then stretched to hold every value in ``keep`` (the chosen setting, the baseline, the Pareto
    front) and never past the values' own range. Values outside are the outliers.
    """
    logs = np.log10(np.asarray(values, dtype=float))
    q1, q3 = np.percentile(logs, [25, 75])
    spread = max(q3 - q1, MIN_SPREAD_DECADES)
    lo, hi = max(q1 - OUTLIER_FENCE * spread, logs.min()), min(q3 + OUTLIER_FENCE * spread, logs.max())
    for v in keep:
        lo, hi = min(lo, math.log10(v)), max(hi, math.log10(v))
    return 10 ** (lo - VIEW_PAD_DECADES), 10 ** (hi + VIEW_PAD_DECADES)


def plot_time_energy(result: SearchResult, path: str | Path) -> Path:
    """Time vs energy to target: feasible, over budget (x), the Pareto front on top, chosen and baseline;
    outliers drawn at the edge of the view as triangles (so one slow trial does not squeeze the rest)."""
    fig = _figure(TIME_ENERGY_SIZE_IN)
    ok = [r for r in result.settings if r.outcome is not None and r.outcome.time_to_target_s > 0
          and r.outcome.energy_to_target_j > 0 and math.isfinite(r.outcome.time_to_target_s)
          and math.isfinite(r.outcome.energy_to_target_j)]
    title = f"Time vs energy to target: {_context(result)}"
    if not ok:
        _explain(fig, title, _failure_lines(result))
        return _save(fig, path)
    ax = fig.subplots()

    def xy(rs):
        return ([r.outcome.time_to_target_s for r in rs], [r.outcome.energy_to_target_j for r in rs])

    highlighted = [r for r in (result.best, result.baseline, *result.pareto) if r is not None and r in ok]
    hx, hy = xy(highlighted)
    xs, ys = xy(ok)
    x_lo, x_hi = view_limits(xs, hx)
    y_lo, y_hi = view_limits(ys, hy)

    def inside(r) -> bool:
        o = r.outcome
        return x_lo <= o.time_to_target_s <= x_hi and y_lo <= o.energy_to_target_j <= y_hi

    shown = [r for r in ok if inside(r)]
    outliers = [r for r in ok if not inside(r)]
    feas = [r for r in shown if r.feasible]
    over = [r for r in shown if not r.feasible]
    if feas:
        ax.scatter(*xy(feas), s=18, c="tab:blue", label="within budget", zorder=2)
    if over:
        ax.scatter(*xy(over), s=24, c="tab:red", marker="x", label="over budget (infeasible)", zorder=2)
    if outliers:
        cx = np.clip(xy(outliers)[0], x_lo, x_hi)
        cy = np.clip(xy(outliers)[1], y_lo, y_hi)
        ax.scatter(cx, cy, s=40, marker="^", facecolors="none", edgecolors="0.4", zorder=2, clip_on=False,
                   label=f"{len(outliers)} outlier(s) beyond the view, drawn at its edge (values in trials.csv)")
    if result.pareto:
        ax.plot(*xy(result.pareto), "-o", c="tab:green", ms=4, lw=1.5, zorder=4, label="Pareto front (feasible)")
    for r, style, label in ((result.baseline, {"marker": "s", "c": "tab:orange"}, "baseline"),
                            (result.best, {"marker": "*", "c": "gold"}, "chosen")):
        if r is not None and r.outcome is not None and r in ok:
            ax.scatter(*xy([r]), s=160, edgecolors="k", zorder=5, label=label, **style)
    # settings span orders of magnitude (tiny batches at low clocks): log axes keep the front readable
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("time to target (s, log scale)")
    ax.set_ylabel("energy to target (J, log scale)")
    n_fail = sum(1 for r in result.measured if r.outcome is None)
    if n_fail:
        title += f"; {n_fail} setting(s) failed (out of memory or error), not drawn"
    ax.set_title(_title(title), fontsize=TITLE_FONT_PT)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=LEGEND_FONT_PT, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    return _save(fig, path)


def plot_power(result: SearchResult, path: str | Path) -> Path:
    """Board power over the measured windows, one after another: the budget line, and where the guard band
    is known the line the moving average had to stay under (budget less ``guard_sigma`` standard errors)."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig = _figure(POWER_SIZE_IN)
    traced = [r for r in sorted(result.measured, key=lambda r: r.number) if r.trace_t]
    title = f"Board power over the measured windows: {_context(result)}"
    if not traced:
        nothing_ran = bool(result.measured) and all(r.outcome is None for r in result.measured)
        _explain(fig, title, _failure_lines(result) if nothing_ran else
                 ["No power record was kept for the measured settings (nothing to draw)."])
        return _save(fig, path)
    ax = fig.subplots()
    limit_w = None if result.budget_w is None else result.budget_w * (1.0 + result.tolerance)
    guard = getattr(result, "guard_sigma", None)
    window_s = FALLBACK_AVG_WINDOW_S
    offset = 0.0
    banded = False
    for r in traced:
        m = r.measurement or {}
        color = "tab:blue" if r.feasible else "tab:red"
        ax.plot([offset + t for t in r.trace_t], r.trace_w, lw=0.8, c=color, alpha=0.6, zorder=2)
        window_s = m.get("avg_window_s") or FALLBACK_AVG_WINDOW_S
        ma_t, ma_w = _moving_average(r.trace_t, r.trace_w, window_s)
        if ma_t.size:
            ax.plot(offset + ma_t, ma_w, lw=0.8, c="0.25", zorder=3)
        end = offset + r.trace_t[-1]
        peak_avg = m.get("max_avg_power_w")
        if isinstance(peak_avg, (int, float)) and math.isfinite(peak_avg):
            ax.hlines(peak_avg, offset, end, colors="k", lw=2.0, zorder=4)
        if r is result.best:
            ax.axvspan(offset, end, color="gold", alpha=0.3, lw=0, zorder=1)
        se = m.get("power_se_w")
        if limit_w is not None and result.constrained and guard and isinstance(se, (int, float)) and se > 0:
            ax.fill_between([offset, end], limit_w - guard * se, limit_w, color="tab:orange", alpha=0.35, lw=0,
                            zorder=1)
            banded = True
        offset = end + WINDOW_GAP_S
    handles = [Line2D([], [], c="tab:blue", lw=0.8, label="power, setting within budget"),
               Line2D([], [], c="tab:red", lw=0.8, label="power, setting over budget"),
               Line2D([], [], c="0.25", lw=0.8, label=f"{window_s:g}-s moving average"),
               Line2D([], [], c="k", lw=2.0, label=f"highest {window_s:g}-s average of the window (judged)")]
    if result.best is not None and result.best in traced:
        handles.append(Patch(color="gold", alpha=0.3, label="chosen setting"))
    if limit_w is not None:
        ax.axhline(limit_w, c="k", ls="--", lw=1, zorder=4)
        tol = f" + {result.tolerance:.0%} tolerance" if result.tolerance else ""
        handles.append(Line2D([], [], c="k", ls="--", lw=1, label=f"budget {result.budget_w:g} W{tol}"))
    if banded:
        handles.append(Patch(color="tab:orange", alpha=0.35,
                             label=f"guard band ({guard:g} standard errors of the average): a window whose "
                                   f"average enters it counts as over"))
    ax.set_xlabel("measured windows, back to back (s, device clock)")
    ax.set_ylabel("board power (W)")
    ax.set_title(_title(title), fontsize=TITLE_FONT_PT)
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=LEGEND_FONT_PT, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
              frameon=False)
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
    time_energy, power = PLOT_FILES
    return [plot_time_energy(result, folder / time_energy), plot_power(result, folder / power)]
