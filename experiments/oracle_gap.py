"""How close does `edgetune search` get to the best setting, with how few measurements, never over budget?

For each device (orin-nano at 7, 10, 15 W; orin-agx at 15, 30, 50 W) and each built-in workload, this runs the
search on the simulated twin (``compute=False``: the twin times the steps, torch does not run them), then
scores the chosen setting with the twin's noise-free ground truth (``Twin.expected``):

* oracle   - the exhaustive best time to target over the whole search space among settings whose true
             power holds the budget (and that fit in memory);
* baseline - the workload's default batch size at the highest GPU frequency whose true power holds the
             budget, the other knobs as the device starts (common practice and the published work);
* chosen   - the search's pick, its true time to target and true power.

The oracle's own true power is printed too: where it sits a hair under the budget (a knife edge), no
measurement-based search that keeps a guard band against sensor error can certify it.

    python experiments/oracle_gap.py [--sampler guided|tpe|gp|random] [--n-trials 40] [--quick]

Prints one row per case and ends with ``worst gap: X% | mean trials/grid: Y% | budget violations: N``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from edgetune.power import open_device
from edgetune.report import format_table
from edgetune.search.efficiency import TargetModel
from edgetune.search.space import build_space
from edgetune.search.study import Search
from edgetune.search.trial import MeasurementProtocol
from edgetune.workloads import load_workload

CASES = [("orin-nano", (7.0, 10.0, 15.0)), ("orin-agx", (15.0, 30.0, 50.0))]
WORKLOADS = ("cnn", "mobilenet", "chartransformer")


@dataclass
class Truth:
    time_s: float
    power_w: float
    feasible: bool


def truth(twin, cost, target: TargetModel, batch_size: int, setting: dict, budget_w: float) -> Truth:
    e = twin.expected(cost, batch_size, setting)
    t = target.steps(batch_size) * e.step_time_s
    return Truth(t, e.power_w, bool(e.fits) and e.power_w <= budget_w)


def oracle_and_baseline(twin, device, cost, space, target, budget_w, default_b, start):
    best = None
    for c in space.grid():
        tr = truth(twin, cost, target, c.batch_size, c.knobs, budget_w)
        if tr.feasible and (best is None or tr.time_s < best[1].time_s):
            best = (c, tr)
    base = None
    b0 = min(space.batch_sizes, key=lambda b: (abs(math.log(b / default_b)), -b))
    for f in reversed(space.knob_values.get("gpu_freq", (None,))):
        setting = {k: v for k, v in start.items() if k in space.knob_values}
        if f is not None:
            setting["gpu_freq"] = f
        tr = truth(twin, cost, target, b0, setting, budget_w)
        if tr.feasible:
            base = (b0, setting, tr)
            break
    return best, base


def run_case(profile, budget_w, workload_name, workloads, sampler, n_trials, seed):
    device = open_device(f"sim:{profile}", seed=seed, compute=False)
    twin = device.backend
    wl = workloads[workload_name]
    start = device.settings()
    space = build_space(device, wl.default_batch_size)
    target = TargetModel()
    oracle, base = oracle_and_baseline(twin, device, wl.cost, space, target, budget_w, wl.default_batch_size,
                                       start)
    s = Search(device, wl, space, budget_w=budget_w, objective="time", target=target,
               protocol=MeasurementProtocol(warmup_steps=1, real_steps=0), storage_url="sqlite:///:memory:",
               study_name=f"{profile}-{workload_name}-{budget_w}", sampler=sampler, n_trials=n_trials,
               seed=seed, storage=optuna.storages.InMemoryStorage())
    t0 = time.perf_counter()
    res = s.run()
    wall = time.perf_counter() - t0
    device.close()
    chosen = truth(twin, wl.cost, target, res.best.candidate.batch_size, res.best.candidate.knobs, budget_w) \
        if res.best else None
    gap = (chosen.time_s / oracle[1].time_s - 1.0) * 100 if (chosen and oracle) else math.inf
    return {
        "device": profile, "workload": workload_name, "budget": budget_w,
        "oracle": oracle[1].time_s if oracle else math.nan,
        "oracle_power": oracle[1].power_w if oracle else math.nan, "baseline": base[2].time_s if base else math.nan,
        "chosen": chosen.time_s if chosen else math.nan, "gap": gap,
        "measured": len(res.measured), "grid": space.size,
        "power": chosen.power_w if chosen else math.nan,
        "violation": bool(chosen and chosen.power_w > budget_w),
        "speedup": (base[2].time_s / chosen.time_s) if (base and chosen) else math.nan,
        "wall": wall, "stop": res.stop_reason,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sampler", default="auto")
    ap.add_argument("--n-trials", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="orin-nano and cnn only")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = ("cnn",) if args.quick else WORKLOADS
    workloads = {n: load_workload(n, seed=args.seed) for n in names}
    rows = []
    for profile, budgets in CASES[:1] if args.quick else CASES:
        for budget in budgets:
            for name in names:
                r = run_case(profile, budget, name, workloads, args.sampler, args.n_trials, args.seed)
                rows.append(r)
                print(f"  {profile} {name} {budget:g} W: gap {r['gap']:.2f}% with {r['measured']} trials "
                      f"({r['wall']:.1f} s; {r['stop']})", file=sys.stderr)
    table = format_table(
        ["device", "workload", "budget W", "oracle s", "oracle W", "baseline s", "chosen s", "gap %",
         "trials/grid", "true W", "speedup"],
        [[r["device"], r["workload"], r["budget"], r["oracle"], round(r["oracle_power"], 4), r["baseline"],
          r["chosen"], round(r["gap"], 2),
          f"{r['measured']}/{r['grid']} ({100 * r['measured'] / r['grid']:.2f}%)",
          f"{r['power']:.2f}{' OVER' if r['violation'] else ''}", round(r["speedup"], 3)] for r in rows])
    print(f"sampler: {args.sampler}; n_trials: {args.n_trials}; seed {args.seed}; target: S_min 1000, "
          f"B_noise 256")
    print(table)
    worst = max(r["gap"] for r in rows)
    mean_frac = 100 * sum(r["measured"] / r["grid"] for r in rows) / len(rows)
    violations = sum(r["violation"] for r in rows)
    print(f"worst gap: {worst:.2f}% | mean trials/grid: {mean_frac:.2f}% | budget violations: {violations}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
