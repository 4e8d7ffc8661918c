"""The twin's batch-size and clock ratios beside the published ones (calibration v2's acceptance table).

For each profile, in its top power mode at every clock's maximum, after minutes of the load
(:meth:`~edgetune.power.sim.twin.Twin.steady_state`), three ratios per workload:

* ``power b1/bsat``: board power at batch 1 over board power at the saturation batch (the smallest power of
  two at which the GPU is at least :data:`SATURATED_OCCUPANCY` full, or the largest that fits);
* ``gpu rail fmin/fmax``: the INA3221 rail the GPU flows through (``VDD_GPU_SOC`` on AGX Orin,
  ``VDD_CPU_GPU_CV`` on the others: what a real board's GPU rail reads) at the lowest over the highest GPU
  clock, at the saturation batch;
* ``time elasticity``: ``log(t(fmin) / t(fmax)) / log(fmax / fmin)`` at the saturation batch: 1 is a step
  exactly proportional to 1/f, 0 a step that ignores the GPU clock.

The published ranges (:data:`PUBLISHED`) and the figures behind them are in ``profiles/SOURCES.md``. The
workload costs come from the caller (``power`` does not import the workloads); tests/test_sim.py checks
every row and prints the table (``pytest -s -k ratio_table tests/test_sim.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from edgetune.power.base import WorkloadCost
from edgetune.power.sim.physics import occupancy
from edgetune.power.sim.twin import Twin

__all__ = ["PUBLISHED", "SATURATED_OCCUPANCY", "PublishedRange", "RatioRow", "format_ratio_table",
           "published_range", "ratio_rows", "saturation_batch"]

#: Occupancy at which the GPU counts as saturated: the power curve is within a tenth of its plateau.
SATURATED_OCCUPANCY = 0.9
#: The exponent of the GPU rail's clock law a + k f^alpha on real Jetsons ("alpha near 2", SOURCES.md).
_RAIL_CLOCK_EXPONENT = 2.0
#: Largest batch the saturation search tries (2^12): beyond it the twin's workloads no longer fit anyway.
_MAX_BATCH_EXPONENT = 12


@dataclass(frozen=True)
class PublishedRange:
    """The range a twin ratio must sit in, and the published figures it comes from."""

    metric: str
    low: float
    high: float
    source: str


#: The acceptance ranges, one per metric (figures and sources in profiles/SOURCES.md).
PUBLISHED: dict[str, PublishedRange] = {
    "power b1/bsat": PublishedRange(
        "power b1/bsat", 0.49, 0.91,
        "Orin AGX MAXN, board power bs 1 / saturated: ResNet-50 0.49, MobileNet 0.53, YOLOv8n 0.58, LSTM 0.71, "
        "BERT-large 0.91 (pagoda, arXiv 2509.20189)"),
    "gpu rail fmin/fmax": PublishedRange(
        "gpu rail fmin/fmax", 0.25, 0.40,
        "Jetson GPU rails follow a + k f^2 and read about a third at the lowest clock (leakage, voltage floor): "
        "a = 0.25-0.40 of the top-clock rail; the range at a module's clock ratio r is a + (1 - a) r^2"),
    "time elasticity": PublishedRange(
        "time elasticity", 0.10, 0.95,
        "strictly between flat (0) and 1/f (1): real Jetson step times slope in between (no published figure "
        "in the project's data; the bounds reject the v1 twin's 1.00 and 0.06)"),
}


@dataclass(frozen=True)
class RatioRow:
    """One twin ratio beside its published range."""

    profile: str
    mode: str
    workload: str
    metric: str
    value: float
    batch_size: int
    low: float
    high: float

    @property
    def within(self) -> bool:
        return self.low <= self.value <= self.high


def _top_setting(twin: Twin) -> dict[str, object]:
    grid = twin.knob_grid()
    return {"power_mode": grid["power_mode"][-1], "gpu_freq": grid["gpu_freq"][-1],
            "emc_freq": grid["emc_freq"][-1], "cpu_freq": grid["cpu_freq"][-1], "cpu_cores": grid["cpu_cores"][-1]}


def saturation_batch(twin: Twin, cost: WorkloadCost, setting: Mapping[str, object] | None = None) -> int:
    """The smallest power-of-two batch at which the GPU is :data:`SATURATED_OCCUPANCY` full under
    ``setting``, or the largest power of two that fits in memory if none is."""
    clocks = twin.effective_clocks(setting)  # type: ignore[arg-type]
    fitting = 1
    for exponent in range(_MAX_BATCH_EXPONENT + 1):
        b = 2**exponent
        if cost.memory_bytes(b) > twin.profile.training_memory_bytes:
            break
        fitting = b
        if occupancy(twin.profile, clocks, cost, b) >= SATURATED_OCCUPANCY:
            return b
    return fitting


def _gpu_rail_w(twin: Twin, cost: WorkloadCost, batch_size: int, setting: Mapping[str, object]) -> float:
    """The GPU's INA3221 rail after minutes of one load."""
    steady = twin.steady_state(cost, batch_size, setting)  # type: ignore[arg-type]
    return steady.rails_w[twin.profile.rails.gpu or twin.profile.rails.channels[0]]


def published_range(metric: str, clock_ratio: float) -> tuple[float, float]:
    """The range of ``metric`` on a module whose lowest GPU clock is ``clock_ratio`` of its highest: the GPU
    rail's constant share a gives a + (1 - a) clock_ratio^2 (the rail's a + k f^2 law); the others as
    published."""
    published = PUBLISHED[metric]
    if metric != "gpu rail fmin/fmax":
        return published.low, published.high
    dynamic = clock_ratio**_RAIL_CLOCK_EXPONENT
    return (published.low + (1 - published.low) * dynamic, published.high + (1 - published.high) * dynamic)


def ratio_rows(profiles: list[str], costs: Mapping[str, WorkloadCost]) -> list[RatioRow]:
    """Every profile's three ratios per workload (see the module docstring)."""
    rows = []
    for name in profiles:
        twin = Twin(name, compute=False)
        top = _top_setting(twin)
        fmin, fmax = twin.profile.gpu_freqs_hz[0], twin.profile.gpu_freqs_hz[-1]
        slow = {**top, "gpu_freq": fmin}
        for workload, cost in costs.items():
            bsat = saturation_batch(twin, cost, top)
            values = {
                "power b1/bsat": twin.steady_state(cost, 1, top).power_w / twin.steady_state(cost, bsat, top).power_w,
                "gpu rail fmin/fmax": _gpu_rail_w(twin, cost, bsat, slow) / _gpu_rail_w(twin, cost, bsat, top),
                "time elasticity": math.log(twin.expected(cost, bsat, slow).step_time_s
                                            / twin.expected(cost, bsat, top).step_time_s) / math.log(fmax / fmin),
            }
            for metric, value in values.items():
                low, high = published_range(metric, fmin / fmax)
                rows.append(RatioRow(name, str(top["power_mode"]), workload, metric, value, bsat, low, high))
    return rows


def format_ratio_table(rows: list[RatioRow]) -> str:
    """The rows as a Markdown table (profile, workload, saturation batch, each metric with its range)."""
    metrics = list(PUBLISHED)
    header = ("| profile | workload | b_sat | "
              + " | ".join(f"{m} (published range)" for m in metrics) + " |")
    lines = [header, "|---|---|---:|" + "---:|" * len(metrics)]
    keyed: dict[tuple[str, str], dict[str, RatioRow]] = {}
    for row in rows:
        keyed.setdefault((row.profile, row.workload), {})[row.metric] = row
    for (profile, workload), by_metric in keyed.items():
        cells = [f"{by_metric[m].value:.2f} ({by_metric[m].low:.2f}-{by_metric[m].high:.2f})"
                 f"{'' if by_metric[m].within else ' OUT'}" for m in metrics]
        lines.append(f"| {profile} | {workload} | {next(iter(by_metric.values())).batch_size} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)
