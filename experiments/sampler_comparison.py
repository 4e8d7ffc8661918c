"""Which sampler should `edgetune search` use by default? Measured on the honest oracle benchmark.

Runs the cases of ``experiments/oracle_gap.py`` (every simulated module x built-in workload x three binding
budgets; objective: time to target; scored by ``experiments/benchlib.py`` with the measured steps to target
and the twin's truth, against the honest oracle) with each sampler and the same trial budget, on one commit,
and prints per sampler: worst, mean and median gap, misses, the median and largest number of settings
measured, budget violations of the pick, and the wall and CPU time per search. The default
(``search.sampler = "auto"``) should be the winner.

    python experiments/sampler_comparison.py [--samplers guided,tpe,gp,random] [--n-trials 40]
                                             [--time-limit-s 0] [--devices ...] [--workloads ...]

``--time-limit-s`` stops starting a sampler's cases after that much wall time (0: none); the table then
says how many of the cases it ran.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
from benchlib import (
    CONVERGENCE_TABLE,
    DEVICES,
    OBJECTIVES,
    WORKLOADS,
    Bench,
    git_commit,
    machine_state,
    make_cases,
)

from edgetune.report import format_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samplers", default="guided,tpe,gp,random")
    ap.add_argument("--objective", choices=OBJECTIVES[:2], default="time")
    ap.add_argument("--n-trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit-s", type=float, default=0.0)
    ap.add_argument("--devices", default=",".join(DEVICES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--table", type=Path, default=CONVERGENCE_TABLE, help="the measured convergence table")
    ap.add_argument("--jobs", type=int, default=1, help="searches run in parallel processes (rows unchanged)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0, c0 = time.perf_counter(), time.process_time()
    state0 = machine_state()
    try:
        bench = Bench.load(args.devices.split(","), args.workloads.split(","), args.table, args.seed)
    except (OSError, ValueError) as exc:
        print(f"sampler_comparison: {exc}", file=sys.stderr)
        return 2
    cases, notes = make_cases(bench.truths, args.objective)
    table = []
    cpu_children = 0.0
    for sampler in args.samplers.split(","):
        started = time.perf_counter()
        rows = []

        def progress(r, sampler=sampler) -> None:
            print(f"  {sampler} {r.case.profile} {r.case.workload} {r.case.budget_w:.2f} W: gap {r.gap_pct:.2f}% "
                  f"({r.measured} settings, {r.wall_s:.1f} s wall, {r.cpu_s:.1f} s CPU)", file=sys.stderr)

        # in chunks of --jobs cases, so that the time limit is checked between them
        step = max(1, args.jobs)
        for i in range(0, len(cases), step):
            if args.time_limit_s and time.perf_counter() - started > args.time_limit_s:
                break
            rows += bench.run_all(cases[i:i + step], sampler, args.n_trials, args.seed, args.jobs, progress)
        cpu_children += sum(r.cpu_s for r in rows) if args.jobs > 1 else 0.0
        gaps = [r.gap_pct for r in rows]
        finite = [g for g in gaps if math.isfinite(g)]
        measured = [r.measured for r in rows]
        table.append([sampler, f"{len(rows)}/{len(cases)}",
                      f"{max(gaps):.2f}" if len(finite) == len(gaps) else "MISS",
                      round(statistics.mean(finite), 2), round(statistics.median(finite), 2),
                      sum(g <= 3.0 for g in gaps), len(gaps) - len(finite),
                      statistics.median(measured), max(measured), sum(r.violation for r in rows),
                      round(statistics.mean(r.wall_s for r in rows), 1),
                      round(statistics.mean(r.cpu_s for r in rows), 1)])
    print(f"commit {git_commit()}; objective {args.objective}; n_trials {args.n_trials}; seed {args.seed}; "
          f"{len(cases)} cases ({args.devices} x {args.workloads} x 3 binding budgets); "
          f"gap against the honest oracle (experiments/oracle_gap.py)")
    print(f"machine at start: {state0}")
    for note in notes:
        print(f"no binding budget: {note}")
    print(format_table(["sampler", "cases", "worst gap %", "mean gap %", "median gap %", "within 3%", "misses",
                        "median trials", "max trials", "violations", "wall s/search", "CPU s/search"], table))
    print(f"timing: {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0 + cpu_children:.0f} s CPU in all; "
          f"machine at end: {machine_state()}")
    complete = [r for r in table if r[1] == f"{len(cases)}/{len(cases)}"] or table
    winner = min(complete, key=lambda r: (r[9], r[6], math.inf if r[2] == "MISS" else float(r[2]), r[3], r[7]))
    print(f"winner: {winner[0]} (of the samplers that ran every case: fewest violations, then misses, smallest "
          f"worst gap, mean gap, median trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
