"""Which sampler should `edgetune search` use by default? Measured on the twin against the exhaustive oracle.

Runs the same searches as ``experiments/oracle_gap.py`` (objective: time to target under the budget;
``compute=False``; the twin's noise-free ground truth scores the pick) with each sampler and the same trial
budget, and prints, per sampler: worst and mean gap to the oracle, mean measured settings, budget violations
of the pick and mean wall time per search. The default (``search.sampler = "auto"``) is the winner.

    python experiments/sampler_comparison.py [--samplers guided,tpe,gp,random] [--n-trials 40] [--all]

By default the orin-nano cases (7, 10, 15 W x cnn, mobilenet, chartransformer); ``--all`` adds orin-agx.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
from oracle_gap import CASES, WORKLOADS, run_case

from edgetune.report import format_table
from edgetune.workloads import load_workload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samplers", default="guided,tpe,gp,random")
    ap.add_argument("--n-trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="orin-agx cases too")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workloads = {n: load_workload(n, seed=args.seed) for n in WORKLOADS}
    cases = CASES if args.all else CASES[:1]
    rows = []
    for sampler in args.samplers.split(","):
        results = []
        for profile, budgets in cases:
            for budget in budgets:
                for name in WORKLOADS:
                    r = run_case(profile, budget, name, workloads, sampler, args.n_trials, args.seed)
                    results.append(r)
                    print(f"  {sampler} {profile} {name} {budget:g} W: gap {r['gap']:.2f}% "
                          f"({r['measured']} trials, {r['wall']:.1f} s)", file=sys.stderr)
        gaps = [r["gap"] for r in results]
        rows.append([sampler, round(max(gaps), 2), round(statistics.mean(gaps), 2),
                     round(statistics.mean(r["measured"] for r in results), 1),
                     sum(r["violation"] for r in results), round(statistics.mean(r["wall"] for r in results), 1)])
    print(f"{len(results)} cases per sampler; n_trials {args.n_trials}; seed {args.seed}")
    print(format_table(["sampler", "worst gap %", "mean gap %", "mean trials", "violations", "wall s/search"],
                       rows))
    winner = min(rows, key=lambda r: (r[4], r[1], r[2], r[3]))
    print(f"winner: {winner[0]} (fewest violations, then smallest worst gap, mean gap, trials)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
