"""What does a user who skips ``edgetune search`` give up? Online tuning against the honest oracle.

``with edgetune.tune(model, optimizer, dataset=..., budget_w=...)`` without a plan tunes online
(:mod:`edgetune.runtime.online`): it trains up to six candidates of (batch size, GPU clock) for 20 steps each,
the other knobs as the board was found, then settles on the one its measurements and the law of steps to
target rank best under the budget. This benchmark scores where it settles on ``oracle_gap.py``'s cases and
scorer (``experiments/benchlib.py``: the four simulated modules, three binding budgets per workload, the
*measured* steps to target times the twin's true step time, power at the thermal steady state of training,
the budget judged on the true highest 1-s average).

Each case trains on the twin (``compute=False``) as a user's loop does: ``tuner.loader``'s batches, a forward,
a backward, an optimizer step, until the run has taken ``--steps`` steps. The twin times every step from the
workload's measured cost (``cost=``), so the loop trains a one-weight stand-in on the CPU; online tuning is
given the workload's measured B_noise (``OnlineOptions.b_noise``), the law ``oracle_gap.py``'s searches use,
since the stand-in's gradients say nothing of the workload's. It starts at the workload's default batch size;
its batch sizes are its own default ones (a quarter to four times the start) inside the convergence table's
measured range (the scorer has no truth outside it).

Per case, against the honest oracle of the whole space (the best setting whose true 1-s average holds the
budget by the sensor's stated accuracy; as ``oracle_gap.py``):

* ``final``: what the run trained at when it ended: the setting online tuning settled on, as the guard left it
  (it lowers a setting that does not hold the budget, and where online tuning found none, the run goes on at
  the guard's setting); its truth, batch size, GPU clock and ``true W`` (OVER when its steady-state 1-s average
  exceeds the budget, a violation as for a search's pick). The gap is its; ``settled`` is online tuning's own
  choice (``-``: no candidate it measured held the budget);
* ``reach``: the best setting online tuning's own space holds (its batch sizes x every GPU clock, the other
  knobs as found) by the sensor's accuracy: ``reach gap`` is the part of the gap its space leaves, the rest
  is its exploration's and the guard's;
* ``common``: common practice (the default batch size, the power mode as found, the highest GPU clock whose
  true 1-s average holds the budget); ``x common``: how many times faster to the target the final setting is;
* ``explore``: the steps and device-seconds until it settled, and that time as a share of the final setting's
  time to target; ``over s``: device-seconds the run's 1-s average spent over the budget (its own accounting:
  the guard's trips on candidates included); ``limit said``: whether online tuning warned that its space held
  nothing under the budget or kept the run well under it (naming ``edgetune search``).

    python experiments/online_gap.py [--devices orin-nano,...] [--workloads cnn,...] [--seed 0] [--steps 200]

Ends with ``online: worst gap X% | median gap M% | within 3%: K of N | reach: worst gap R%, median Q% | speedup
vs common practice: A-Bx | budget violations: V | over budget during the run: S s``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from benchlib import (
    CONVERGENCE_TABLE,
    DEVICES,
    INA3221_ACCURACY,
    WORKLOADS,
    Bench,
    Case,
    Point,
    common_practice,
    git_commit,
    machine_state,
    make_cases,
    median,
    span,
)
from torch.utils.data import TensorDataset

import edgetune
from edgetune.power import open_device
from edgetune.report import format_table
from edgetune.runtime.online import BATCH_SPAN, OnlineOptions

#: samples in the stand-in dataset per sample of the largest batch size (several batches per epoch)
DATASET_BATCHES = 16


@dataclass
class OnlineRow:
    """One scored online-tuning run."""

    case: Case
    honest: Point | None
    common: Point | None
    settled: Point | None
    #: what the run trained at when it ended (the guard may have moved it from the settled setting): its truth
    #: (None: its batch size lies outside the measured range, so the scorer has no steps for it)
    final: Point | None
    final_batch: int
    final_setting: dict
    reach: Point | None
    candidates: int
    explore_steps: int
    explore_s: float
    over_budget_s: float
    #: online tuning warned that its space (the other knobs as found) held nothing or kept the run from the budget
    limit_said: bool
    wall_s: float
    cpu_s: float

    def _gap(self, p: Point | None) -> float:
        if p is None or self.honest is None or not math.isfinite(p.time_s):
            return math.inf
        return (p.time_s / self.honest.time_s - 1.0) * 100.0

    @property
    def gap_pct(self) -> float:
        """The final setting against the honest oracle (inf: the scorer has no steps for its batch size)."""
        return self._gap(self.final)

    @property
    def reach_gap_pct(self) -> float:
        return self._gap(self.reach)

    @property
    def violation(self) -> bool:
        return self.final is not None and self.final.max_avg_w > self.case.budget_w

    @property
    def speedup(self) -> float:
        if self.common is None or self.final is None:
            return math.nan
        return self.common.time_s / self.final.time_s

    @property
    def explore_share_pct(self) -> float:
        if self.final is None or not math.isfinite(self.final.time_s):
            return math.nan
        return self.explore_s / self.final.time_s * 100.0


def online_batch_sizes(default: int, measured: Sequence[int]) -> list[int]:
    """Online tuning's default batch sizes around ``default`` (a quarter to four times it) that the benchmark's
    space holds (inside the measured range of the convergence table)."""
    return [b for b in measured if default / BATCH_SPAN <= b <= default * BATCH_SPAN]


def run_online(bench: Bench, case: Case, seed: int, steps: int) -> OnlineRow:
    """Train ``steps`` steps of ``case``'s workload on the twin with online tuning, and score where it settled."""
    key = (case.profile, case.workload)
    truth, space, wl = bench.truths[key], bench.spaces[key], bench.workloads[case.workload]
    start = bench.starts[case.profile]
    sizes = online_batch_sizes(wl.default_batch_size, space.batch_sizes)
    torch.manual_seed(seed)
    model = torch.nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    data = TensorDataset(torch.zeros(DATASET_BATCHES * max(sizes), 1))
    device = open_device(f"sim:{case.profile}", seed=seed, compute=False)
    t0, c0 = time.perf_counter(), time.process_time()
    settled_at: tuple[int, float] | None = None
    try:
        with edgetune.tune(model, optimizer, dataset=data, batch_size=wl.default_batch_size, budget_w=case.budget_w,
                           device=device, cost=wl.cost, online=OnlineOptions(batch_sizes=sizes, b_noise=wl.b_noise),
                           print_summary=False, seed=seed) as tuner:
            online = tuner.online
            assert online is not None
            t_start = device.clock.now()
            while tuner.steps < steps:
                for (x,) in tuner.loader:
                    loss = model(x).sum()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    if settled_at is None and not online.exploring:
                        settled_at = (tuner.steps, device.clock.now() - t_start)
                    if tuner.steps >= steps:
                        break
    finally:
        device.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = tuner.summary
    assert summary is not None
    chosen = online.chosen
    settled = truth.point(chosen.candidate.batch_size, chosen.candidate.knobs) if chosen is not None else None
    final_batch, final_setting = tuner.batch_size, {**start, **tuner.setting}
    measured = truth.curve.batch_sizes
    final = truth.point(final_batch, final_setting) if measured[0] <= final_batch <= measured[-1] else None
    primary = online.primary
    reach = None
    for b in sizes:
        for value in online.values or [None]:
            setting = dict(start) if primary is None else {**start, primary: value}
            p = truth.point(b, setting)
            if p.fits and math.isfinite(p.time_s) and p.max_avg_w + truth.margin_w(p.max_avg_w) <= case.budget_w \
                    and (reach is None or p.time_s < reach.time_s):
                reach = p
    honest_mask = truth.feasible(case.budget_w, honest=True)
    explore_steps, explore_s = settled_at if settled_at is not None else (steps, math.nan)
    return OnlineRow(case=case, honest=truth.best("time", honest_mask),
                     common=common_practice(truth, start, wl.default_batch_size, case.budget_w),
                     settled=settled,
                     final=final, final_batch=final_batch, final_setting=final_setting,
                     reach=reach, candidates=len(online.measurements), explore_steps=explore_steps,
                     explore_s=explore_s, over_budget_s=sum(v.duration_s for v in summary.violations),
                     limit_said=any(text.startswith("online: limit") for _, text in summary.events),
                     wall_s=wall, cpu_s=cpu)


def _s(p: Point | None) -> str:
    return f"{p.time_s:.4g}" if p is not None and math.isfinite(p.time_s) else "-"


def _pct(v: float) -> str:
    return f"{v:.2f}" if math.isfinite(v) else "MISS"


def table(rows: Sequence[OnlineRow]) -> str:
    head = ["device", "workload", "budget W", "honest s", "common s", "settled s", "final s", "b", "gpu MHz",
            "cores", "mode", "true W", "gap %", "reach s", "reach gap %", "x common", "candidates", "explore steps",
            "explore s", "explore %", "over s", "limit said"]
    out = []
    for r in rows:
        true_w = "-" if r.final is None else f"{r.final.max_avg_w:.2f}" + (" OVER" if r.violation else "")
        gpu = r.final_setting.get("gpu_freq")
        out.append([r.case.profile, r.case.workload, f"{r.case.budget_w:.2f}", _s(r.honest), _s(r.common),
                    _s(r.settled), _s(r.final), r.final_batch, f"{gpu / 1e6:.0f}" if gpu is not None else "-",
                    r.final_setting.get("cpu_cores", "-"), r.final_setting.get("power_mode", "-"), true_w,
                    _pct(r.gap_pct), _s(r.reach), _pct(r.reach_gap_pct),
                    f"{r.speedup:.2f}" if math.isfinite(r.speedup) else "-", r.candidates, r.explore_steps,
                    f"{r.explore_s:.1f}", f"{r.explore_share_pct:.2f}", f"{r.over_budget_s:.1f}",
                    "yes" if r.limit_said else "no"])
    return format_table(head, out)


def summary(rows: Sequence[OnlineRow]) -> list[str]:
    gaps = [r.gap_pct for r in rows]
    reach = [r.reach_gap_pct for r in rows]
    misses = sum(not math.isfinite(g) for g in gaps)
    unsettled = sum(r.settled is None for r in rows)
    reach_misses = sum(not math.isfinite(g) for g in reach)
    space_bound = sum(r.reach_gap_pct > 3.0 for r in rows)
    over = [r for r in rows if r.gap_pct > 3.0]
    shares = [r.explore_share_pct for r in rows if math.isfinite(r.explore_share_pct)]
    lines = [(f"rows over 3%: {len(over)} of {len(rows)} ({unsettled} rows where no candidate it measured held the "
              f"budget, the run going on at the guard's setting; {misses} where the final batch size is outside the "
              f"measured range, unscored); of "
             f"those, {sum(r.reach_gap_pct > 3.0 for r in over)} where online tuning's own space (batch size x GPU "
             f"clock, the other knobs as found) holds nothing within 3% of the oracle (in all: {space_bound} of "
             f"{len(rows)} rows; {reach_misses} where it holds nothing under the budget); online tuning said its "
             f"limit (the knobs it leaves as found, and `edgetune search`) in {sum(r.limit_said for r in over)} of "
             f"those {len(over)} rows and in {sum(r.limit_said for r in rows if r not in over)} of the others"),
             (f"exploration: median {median([r.explore_steps for r in rows]):g} steps, "
             f"{median([r.explore_s for r in rows]):.1f} device-s; that time over the final setting's whole time to "
             f"target (an upper bound of its cost: the explored steps train too): median {median(shares):.1f}%, "
             f"at most {max(shares, default=math.nan):.1f}% (the honest oracles' time to target: median "
             f"{median([r.honest.time_s for r in rows if r.honest is not None]):.1f} device-s; a fine-tuning run of "
             f"hours makes the share that much smaller)"),
             (f"online: worst gap {'MISS' if misses else f'{max(gaps):.2f}%'} | median gap {median(gaps):.2f}% | "
             f"within 3%: {sum(g <= 3.0 for g in gaps)} of {len(rows)} | reach: worst gap "
             f"{'MISS' if reach_misses else f'{max(reach):.2f}%'}, median {median(reach):.2f}% | speedup vs common "
             f"practice: "
             f"{span([r.speedup for r in rows])} | budget violations: {sum(r.violation for r in rows)} | over budget "
             f"during the run: {max(r.over_budget_s for r in rows):.1f} s")]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--devices", default=",".join(DEVICES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--table", type=Path, default=CONVERGENCE_TABLE, help="the measured convergence table")
    ap.add_argument("--steps", type=int, default=200,
                    help="training steps per run (online tuning explores for at most 6 x 20 of them)")
    args = ap.parse_args(argv)
    t0, c0 = time.perf_counter(), time.process_time()
    state0 = machine_state()
    try:
        bench = Bench.load(args.devices.split(","), args.workloads.split(","), args.table, args.seed)
    except (OSError, ValueError) as exc:
        print(f"online_gap: {exc}", file=sys.stderr)
        return 2
    cases, notes = make_cases(bench.truths, "time")
    rows = []
    for case in cases:
        rows.append(run_online(bench, case, args.seed, args.steps))
        r = rows[-1]
        print(f"  {case.profile} {case.workload} {case.budget_w:.2f} W: gap {_pct(r.gap_pct)}% (reach "
              f"{_pct(r.reach_gap_pct)}%), {r.candidates} candidates ({r.wall_s:.1f} s wall, {r.cpu_s:.1f} s CPU)",
              file=sys.stderr)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"online tuning (edgetune.tune without a plan), commit {git_commit()}, seed {args.seed}, {args.steps} steps "
          f"per run; B_noise given (Workload.b_noise: "
          f"{', '.join(sorted(f'{n} {wl.b_noise:g}' for n, wl in bench.workloads.items()))}); scorer: measured steps "
          f"({args.table.name}) x the twin's true step time, power and the budget at the thermal steady state")
    print(f"honest margin: {INA3221_ACCURACY.offset_w:.3f} W per summed channel + "
          f"{100 * INA3221_ACCURACY.relative:.2f} % ({INA3221_ACCURACY.source})")
    print(f"machine at start: {state0}")
    print(table(rows))
    for note in notes:
        print(f"no binding budget: {note}")
    print(f"timing: {wall:.0f} s wall, {cpu:.0f} s CPU; machine at end: {machine_state()}")
    for line in summary(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
