"""Epochs to target per batch size from the gradient-noise-scale law, checked on the Zeus convergence runs.

McCandlish et al. (2018): steps to a target S(b) = S_min (1 + B_noise / b), so epochs E(b) = S(b) b / N
= E_min (1 + b / B_noise). For each Zeus workload (epochs to target from the imported tables, at the
default targets: median over seeds; GPU-independent), fit (S_min, B_noise) on 4 batch sizes spread over
the measured range and predict the others. Also the mean error over every choice of 4 batch sizes.
Batch sizes where most runs never reached the target (``inf``) are left out of fit and score, and listed.

No gate (the issue says so): epochs are coarse integers (3-4 epochs for the BERT tasks, so one epoch is a
25% step), and small batches often need more epochs than the law says (a learning rate scaled down for
them, more optimizer noise than the asymptotic law assumes).

    python experiments/epochs_to_target.py
"""

from __future__ import annotations

import glob
import itertools
import math
import os

import numpy as np

from edgetune.predictors import fit_steps_to_target
from edgetune.tables import load_table

HERE = os.path.dirname(os.path.abspath(__file__))
TABLES = os.path.join(HERE, "data", "zeus-nsdi23", "tables")


def workload_epochs() -> dict[str, dict[int, float]]:
    """Workload -> batch size -> epochs to target, merged over the GPUs' tables (same runs)."""
    out: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(TABLES, "*.csv"))):
        t = load_table(path)
        if t.epochs_to_target is None:
            continue  # hardware-only table
        workload = os.path.basename(path)[:-4].split("_", 1)[1]
        for b, e in zip(t.batch_size, t.epochs_to_target):
            if not math.isnan(e):
                out.setdefault(workload, {})[int(b)] = float(e)
    return out


def predict_epochs(fit_b: np.ndarray, fit_e: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    # steps = epochs x N / b; N cancels in the prediction, so N = 1
    fit = fit_steps_to_target(fit_b, fit_e / fit_b)
    return fit.steps(b) * b, fit.b_noise


def main() -> None:
    data = workload_epochs()
    print("epochs to target: fit S(b) = S_min (1 + B_noise / b) on 4 batch sizes, predict the others")
    print(f"{'workload':34s} {'fit on':>22s} {'B_noise':>9s} {'MAPE %':>7s} {'all-4-subsets %':>16s}  "
          f"worst batch (measured -> predicted)")
    errors = []
    for workload, by_b in sorted(data.items()):
        finite = {b: e for b, e in sorted(by_b.items()) if math.isfinite(e)}
        never = [b for b, e in sorted(by_b.items()) if not math.isfinite(e)]
        b = np.array(list(finite), dtype=float)
        e = np.array(list(finite.values()))
        if b.size < 5:
            print(f"{workload:34s} only {b.size} batch sizes reach the target: nothing to hold out")
            continue
        pick = np.unique(np.round(np.linspace(0, b.size - 1, 4)).astype(int))
        rest = np.setdiff1d(np.arange(b.size), pick)
        pred, b_noise = predict_epochs(b[pick], e[pick], b[rest])
        err = np.abs(pred / e[rest] - 1)
        subset_err = []
        for combo in itertools.combinations(range(b.size), 4):
            others = np.setdiff1d(np.arange(b.size), combo)
            p, _ = predict_epochs(b[list(combo)], e[list(combo)], b[others])
            subset_err.append(np.mean(np.abs(p / e[others] - 1)))
        w = int(np.argmax(err))
        errors.append(float(err.mean()))
        fit_on = ",".join(str(int(x)) for x in b[pick])
        note = f"  (never reached at {', '.join(map(str, never))})" if never else ""
        print(f"{workload:34s} {fit_on:>22s} {b_noise:9.0f} {100 * err.mean():7.1f} "
              f"{100 * np.mean(subset_err):16.1f}  b={int(b[rest][w])}: {e[rest][w]:g} -> {pred[w]:.1f}{note}")
    print(f"summary: epochs-to-target MAPE over {len(errors)} workloads, 4 spread batch sizes: mean "
          f"{100 * np.mean(errors):.1f}%, worst {100 * np.max(errors):.1f}% (no gate)")


if __name__ == "__main__":
    main()
