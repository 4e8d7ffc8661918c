"""Search on real measured hardware: the Zeus NSDI'23 traces, against each table's own oracle.

For every Zeus workload table with convergence data (``experiments/data/zeus-nsdi23/tables``, made by
``edgetune trace import-zeus``) and every budget (V100 at 125, 150, 175 W; A40 at 150, 200, 250 W), this runs
the search exactly as ``edgetune search --device trace:<table.csv> --budget W --n-trials N`` does
(:func:`edgetune.search.oracle.prepare_trace`; the replay is noisy: each measurement window draws its time
and power from the table's stated spread; convergence is unknown: a batch size's epochs to target are seen
only once it has been measured, unless ``--known-convergence``) and scores the pick with :func:`oracle_gap`:

* oracle  - the table's least time to target among rows whose mean power holds the budget;
* chosen  - the search's pick, its time to target and mean power from the table;
* gap     - chosen / oracle - 1 (target: <= 3% on every workload, with <= 10 measured settings);
* binds   - whether the budget excludes the table's unconstrained best row;
* certifiable - the best row whose median power, plus the search's guard band (guard_sigma x the table's
  stated power spread), holds the budget: what any search judging single noisy windows can certify
  (``same`` when it is the oracle), and the gap to it.

The search judges the budget by each window's measured power plus a guard band of the table's stated power
spread; violations are judged on the table's true (median) power of the chosen row.

    python experiments/trace_search.py [--n-trials 10] [--sampler auto] [--seed 0] [--known-convergence]

Prints one row per case and ends with ``worst gap: X% | mean measured: M | violations: N``.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from edgetune.power import open_device
from edgetune.report import format_table
from edgetune.search.oracle import oracle_gap, prepare_trace
from edgetune.search.space import build_space
from edgetune.search.study import Search
from edgetune.workloads import load_workload

TABLES = Path(__file__).resolve().parent / "data" / "zeus-nsdi23" / "tables"
BUDGETS = {"v100": (125.0, 150.0, 175.0), "a40": (150.0, 200.0, 250.0)}


def run_case(path: str, budget_w: float, workload, n_trials: int, sampler: str, seed: int,
             known_convergence: bool) -> dict:
    device = open_device(f"trace:{path}", seed=seed, known_convergence=known_convergence)
    try:
        plan = prepare_trace(device, None, workload.default_batch_size)
        space = build_space(device, workload.default_batch_size, plan.batch_sizes)
        search = Search(device, workload, space, budget_w=budget_w, target=plan.target, n_trials=n_trials,
                        sampler=sampler, seed=seed, study_name=f"{Path(path).stem}-{budget_w:g}",
                        storage=optuna.storages.InMemoryStorage(), baseline_batch_size=plan.baseline_batch_size,
                        power_cv=plan.power_cv)
        result = search.run()
    finally:
        device.close()
    report = oracle_gap(result)
    table = plan.target.table
    unconstrained = table.oracle(None)
    binds = report["oracle"] is not None and float(table.time_to_target_s()[unconstrained]) < \
        report["oracle"]["time_to_target_s"] * (1 - 1e-12)
    return {"report": report, "binds": binds, "space": space.size, "stop": result.stop_reason}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-trials", type=int, default=10, help="measured settings per search (default 10)")
    ap.add_argument("--sampler", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--known-convergence", action="store_true",
                    help="every batch size's epochs to target known from the start (a recurring job)")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = load_workload("cnn", seed=args.seed)  # the CLI's default; its step is not run on a trace
    rows, gaps, sure_gaps, measured, windows, violations, misses = [], [], [], [], [], 0, []
    t0 = time.perf_counter()
    for path in sorted(glob.glob(str(TABLES / "*.csv"))):
        name = Path(path).stem
        gpu, workload_name = name.split("_", 1)
        probe = open_device(f"trace:{path}")
        has_target = probe.backend.table.epochs_to_target is not None
        probe.close()
        if not has_target:
            print(f"skipped {name}: no epochs_to_target column (no convergence data in the trace)",
                  file=sys.stderr)
            continue
        for budget in BUDGETS[gpu]:
            case = run_case(path, budget, workload, args.n_trials, args.sampler, args.seed,
                            args.known_convergence)
            r = case["report"]
            o, c = r["oracle"], r["chosen"]
            gap = r["gap_pct"] if r["gap_pct"] is not None else math.inf
            sure_gap = r["certifiable_gap_pct"] if r["certifiable_gap_pct"] is not None else math.inf
            sure_gaps.append(sure_gap)
            sure = r["certifiable_oracle"]
            held = bool(r["chosen_holds_budget"])
            violations += int(c is not None and not held)
            gaps.append(gap)
            measured.append(r["measured_settings"])
            windows.append(r["measured_windows"])
            if gap > 3.0:
                misses.append(f"{name}@{budget:g}W")

            def where(x):
                return "-" if x is None else f"b={x['batch_size']} pl={x['setting']['power_limit']:g}"

            rows.append([gpu, workload_name, budget, "yes" if case["binds"] else "no", where(o),
                         o["time_to_target_s"] if o else None, where(c), c["time_to_target_s"] if c else None,
                         round(gap, 2), where(sure) if sure != o else "same", round(sure_gap, 2),
                         r["measured_settings"], case["space"], c["power_w"] if c else None,
                         "held" if held else "OVER"])
    print(format_table(["gpu", "workload", "budget W", "binds", "oracle", "oracle ttt s", "chosen",
                        "chosen ttt s", "gap %", "certifiable", "gap % (cert.)", "measured", "grid", "chosen W",
                        "budget"], rows))
    convergence = "known" if args.known_convergence else "unknown (seen once measured)"
    print(f"\n{len(rows)} searches in {time.perf_counter() - t0:.0f} s; sampler {args.sampler}, "
          f"n_trials {args.n_trials}, seed {args.seed}, noisy replay, convergence {convergence}; "
          f"misses (> 3%): {', '.join(misses) or 'none'}")
    near = sum(1 for g, sg in zip(gaps, sure_gaps) if g > 3.0 and sg <= 3.0)
    print(f"certifiable oracle: the best row a window at its median would show under the budget by the guard "
          f"band (guard_sigma x the table's stated power spread); {near} of the {len(misses)} misses are within 3% "
          f"of it (their plain oracle sits within the measurement noise of the budget); worst gap to it "
          f"{max(sure_gaps):.2f}%")
    print(f"windows per search (the pick's contenders measured again included): mean "
          f"{sum(windows) / len(windows):.1f}, max {max(windows)}")
    print(f"worst gap: {max(gaps):.2f}% | mean measured: {sum(measured) / len(measured):.1f} | "
          f"violations: {violations}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
