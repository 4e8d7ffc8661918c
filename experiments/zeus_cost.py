"""Zeus's own objective on Zeus's traces: ``--objective cost --eta 0.5`` against the table's cost optimum.

Zeus (You et al., NSDI'23) minimises ``cost = eta x energy to target + (1 - eta) x max power x time to
target`` with max power the GPU's maximum power limit; its optimiser lands 0.80% from the cost optimum on
average (10.6% worst) after about 100 recurring training runs. For every Zeus table with convergence data
this runs the search as ``edgetune search --device trace:<table.csv> --objective cost --eta 0.5`` with no
budget (Zeus's setting), and scores its pick by the table's own cost:

* max power - the largest power limit of the table (:func:`edgetune.search.efficiency.cost_max_power_w`;
  V100 and A40 in the traces);
* optimum   - the least cost over the table's rows that reach the target;
* gap       - chosen cost / optimum - 1; measured: settings the search measured; windows: its measurements,
  the contenders measured again before the pick included (:mod:`edgetune.search.confirm`).

    python experiments/zeus_cost.py [--eta 0.5] [--n-trials 20] [--seed 0]

Ends with ``cost: mean gap X% | worst gap Y% | mean measured M`` (a separate section for
experiments/trace_search.py to take in).
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import optuna

from edgetune.power import open_device
from edgetune.report import format_table
from edgetune.search.efficiency import ZeusCost, cost_max_power_w
from edgetune.search.oracle import prepare_trace
from edgetune.search.space import build_space
from edgetune.search.study import Search
from edgetune.workloads import load_workload

TABLES = Path(__file__).resolve().parent / "data" / "zeus-nsdi23" / "tables"


def cost_case(path: str, eta: float, workload, n_trials: int, seed: int) -> dict | None:
    """One search of ``path``'s table by Zeus's cost; None for a table without convergence data."""
    device = open_device(f"trace:{path}")
    try:
        table = device.backend.table
        if table.epochs_to_target is None:
            return None
        cost = ZeusCost(eta, cost_max_power_w(device))
        plan = prepare_trace(device)
        space = build_space(device, workload.default_batch_size, plan.batch_sizes)
        search = Search(device, workload, space, budget_w=None, objective="cost", eta=eta, target=plan.target,
                        n_trials=n_trials, seed=seed, study_name=f"{Path(path).stem}-cost",
                        storage=optuna.storages.InMemoryStorage())
        result = search.run()
        per_row = cost.of(table.time_to_target_s(), table.energy_to_target_j())
        per_row = np.where(np.isfinite(per_row), per_row, np.inf)
        optimum = float(np.min(per_row))
        chosen = math.inf
        if result.best is not None:
            c = result.best.candidate
            chosen = float(per_row[device.backend.row(c.knobs, c.batch_size)])
    finally:
        device.close()
    return {"table": Path(path).stem, "max_power_w": cost.max_power_w, "optimum": optimum, "chosen": chosen,
            "gap": (chosen / optimum - 1.0) * 100, "measured": len(result.settings), "windows": len(result.measured)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eta", type=float, default=0.5)
    ap.add_argument("--n-trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    workload = load_workload("cnn", seed=args.seed)  # its step is not run on a trace
    t0 = time.perf_counter()
    rows = [r for p in sorted(glob.glob(str(TABLES / "*.csv")))
            if (r := cost_case(p, args.eta, workload, args.n_trials, args.seed)) is not None]
    print(format_table(["table", "max power W", "optimum cost J", "chosen cost J", "gap %", "measured", "windows"],
                       [[r["table"], r["max_power_w"], r["optimum"], r["chosen"], round(r["gap"], 3),
                         r["measured"], r["windows"]] for r in rows]))
    print(f"\n{len(rows)} searches in {time.perf_counter() - t0:.0f} s; eta {args.eta:g}, n_trials {args.n_trials}, "
          f"seed {args.seed}; Zeus's optimiser: 0.80% mean, 10.6% worst after ~100 recurring runs")
    gaps = [r["gap"] for r in rows]
    print(f"cost: mean gap {sum(gaps) / len(gaps):.2f}% | worst gap {max(gaps):.2f}% | mean measured "
          f"{sum(r['measured'] for r in rows) / len(rows):.1f} | mean windows "
          f"{sum(r['windows'] for r in rows) / len(rows):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
