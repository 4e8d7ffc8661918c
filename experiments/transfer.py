"""Transfer between boards: a search warm-started from an earlier study (``--prior``) against a cold one.

Each case searches a target (device, workload, budget, power mode) on the simulated twin (``compute=False``)
twice: cold, and warm from the study of a *prior* search (another board, another budget, another power
mode) that ran first and was saved to an SQLite file, read back with :func:`edgetune.search.prior.load_prior`
as ``edgetune search --prior <folder>`` does. The searches use each workload's measured B_noise, as a user's
search does; both are scored as the oracle benchmark scores (experiments/benchlib.py): steps to target from
the measured convergence table (never the search's own law) x the twin's noise-free step time
(``Twin.expected``), against the exhaustive oracle of the target space (least time to target among settings
whose true power holds the budget), over the batch sizes the table measured:

* gap       - chosen / oracle - 1 (target: warm within 3% with at most 15 measured settings, against 40 cold);
* measured  - settings measured on the *target* board (baseline probes included; the prior's are not counted).

PowerTrain (Prashanthi et al., FGCS 2024) transfers a learned time/power model to a new device or workload
after profiling about 50 power modes of it; the ``measured`` column is the comparable figure here.

    python experiments/transfer.py [--quick] [--seed 0]

Prints one row per case and ends with
``warm: worst gap X% | mean measured M | cold: worst gap Y% | mean measured C``.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna
from benchlib import CONVERGENCE_TABLE, benchmark_batch_sizes, steps_at

from edgetune.power import open_device
from edgetune.predictors.convergence import MeasuredCurve, load_convergence
from edgetune.report import format_table
from edgetune.search.efficiency import TargetModel
from edgetune.search.prior import load_prior, map_to_space
from edgetune.search.space import build_space
from edgetune.search.study import Search
from edgetune.search.trial import MeasurementProtocol
from edgetune.workloads import load_workload

PROTOCOL = MeasurementProtocol(warmup_steps=1, real_steps=0)
COLD_TRIALS = 40  # the cold search's cap (the oracle_gap benchmark's)
WARM_TRIALS = 40  # the warm search gets the same cap: how few it measures is its own stop rule's doing


@dataclass(frozen=True)
class Board:
    """A search target: twin profile, budget, and knob values pinned (a power mode)."""

    profile: str
    budget_w: float
    values: tuple[tuple[str, tuple], ...] = ()

    def label(self) -> str:
        pinned = " ".join(f"{k}={'/'.join(map(str, v))}" for k, v in self.values)
        return f"{self.profile} {self.budget_w:g}W{' ' + pinned if pinned else ''}"


@dataclass(frozen=True)
class Case:
    kind: str
    prior: Board
    target: Board


CASES = [
    Case("sibling module", Board("orin-nano", 10.0), Board("orin-nx", 10.0)),
    Case("sibling module", Board("orin-nano", 10.0), Board("orin-nx", 15.0)),
    Case("sibling module", Board("orin-nano", 15.0), Board("orin-nx", 20.0)),
    Case("another budget", Board("orin-nano", 10.0), Board("orin-nano", 7.0)),
    Case("another budget", Board("orin-nano", 10.0), Board("orin-nano", 15.0)),
    Case("another power mode", Board("orin-nano", 12.0, (("power_mode", ("15W",)),)),
         Board("orin-nano", 7.0, (("power_mode", ("7W",)),))),
]
WORKLOADS = ("cnn", "mobilenet", "chartransformer")


def space_of(device, workload, board: Board, curve: MeasuredCurve):
    sizes = list(benchmark_batch_sizes(workload.default_batch_size, curve))
    return build_space(device, workload.default_batch_size, sizes, None, dict(board.values))


def true_steps(curve: MeasuredCurve, batch_size: int) -> float:
    """The scorer's steps to target: the measured table's median, interpolated between measured sizes."""
    return steps_at(curve.batch_sizes, curve.median_steps, batch_size)


def oracle_time_s(twin, workload, space, curve: MeasuredCurve, budget_w: float) -> float:
    """The exhaustive best true time to target among settings whose true power holds the budget."""
    best = math.inf
    for c in space.grid():
        e = twin.expected(workload.cost, c.batch_size, c.knobs)
        if e.fits and e.power_w <= budget_w:
            best = min(best, true_steps(curve, c.batch_size) * e.step_time_s)
    return best


def search(board: Board, workload, curve: MeasuredCurve, seed: int, *, prior=(), storage_url: str | None = None,
           study_name: str = "transfer", n_trials: int = COLD_TRIALS) -> tuple[dict, object]:
    device = open_device(f"sim:{board.profile}", seed=seed, compute=False)
    try:
        twin = device.backend
        space = space_of(device, workload, board, curve)
        target = TargetModel.for_workload(workload)
        mapped = map_to_space(prior, space, device.settings()) if prior else ()
        storage = None if storage_url else optuna.storages.InMemoryStorage()
        s = Search(device, workload, space, budget_w=board.budget_w, target=target, protocol=PROTOCOL,
                   storage_url=storage_url or "sqlite:///:memory:", storage=storage, study_name=study_name,
                   n_trials=n_trials, seed=seed, prior=mapped)
        t0 = time.perf_counter()
        res = s.run()
        wall = time.perf_counter() - t0
        oracle = oracle_time_s(twin, workload, space, curve, board.budget_w)
        chosen, power = math.nan, math.nan
        if res.best is not None:
            e = twin.expected(workload.cost, res.best.candidate.batch_size, res.best.candidate.knobs)
            chosen, power = true_steps(curve, res.best.candidate.batch_size) * e.step_time_s, e.power_w
    finally:
        device.close()
    gap = (chosen / oracle - 1.0) * 100 if math.isfinite(chosen) else math.inf
    return {"gap": gap, "measured": len(res.settings), "windows": len(res.measured), "power": power, "over": power > board.budget_w,
            "wall": wall, "stop": res.stop_reason, "prior": len(mapped)}, res


def run_case(case: Case, workload, curve: MeasuredCurve, seed: int, tmp: Path) -> dict:
    folder = tmp / f"{case.prior.label().replace(' ', '_').replace('/', '-')}-{workload.name}"
    if not (folder / "study.db").exists():  # the prior's search, saved as `edgetune search -o folder` does
        folder.mkdir(parents=True, exist_ok=True)
        search(case.prior, workload, curve, seed, storage_url=f"sqlite:///{folder / 'study.db'}",
               study_name=f"prior-{workload.name}")
    prior = load_prior(str(folder))
    cold, _ = search(case.target, workload, curve, seed)
    warm, _ = search(case.target, workload, curve, seed, prior=prior.observations)
    return {"kind": case.kind, "prior": case.prior.label(), "target": case.target.label(), "workload": workload.name,
            "cold": cold, "warm": warm, "prior_n": len(prior.observations)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="cnn only")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = ("cnn",) if args.quick else WORKLOADS
    rows = []
    curves = load_convergence(CONVERGENCE_TABLE)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            workload = load_workload(name, seed=args.seed)
            for case in CASES:
                r = run_case(case, workload, curves[name], args.seed, Path(tmp))
                rows.append(r)
                print(f"  {r['target']} {name} <- {r['prior']}: warm {r['warm']['gap']:.2f}% / "
                      f"{r['warm']['measured']} ({r['warm']['stop'][:60]}); cold {r['cold']['gap']:.2f}% / "
                      f"{r['cold']['measured']}", file=sys.stderr)
    print(f"seed {args.seed}; the searches' target: each workload's measured B_noise; cold and warm capped at "
          f"{COLD_TRIALS} measured settings; gap against the exhaustive oracle of the target space, scored with the "
          f"measured steps ({CONVERGENCE_TABLE.name}) x the twin's true step time (Twin.expected)")
    print(format_table(
        ["case", "prior (measured there)", "target", "workload", "warm gap %", "warm measured", "cold gap %",
         "cold measured", "warm true W"],
        [[r["kind"], f"{r['prior']} ({r['prior_n']})", r["target"], r["workload"], round(r["warm"]["gap"], 2),
          r["warm"]["measured"], round(r["cold"]["gap"], 2), r["cold"]["measured"],
          f"{r['warm']['power']:.2f}{' OVER' if r['warm']['over'] else ''}"] for r in rows]))
    print("PowerTrain (FGCS 2024): about 50 profiled power modes of the new device or workload to transfer")
    warm_worst = max(r["warm"]["gap"] for r in rows)
    cold_worst = max(r["cold"]["gap"] for r in rows)
    warm_mean = sum(r["warm"]["measured"] for r in rows) / len(rows)
    cold_mean = sum(r["cold"]["measured"] for r in rows) / len(rows)
    over = sum(r["warm"]["over"] or r["cold"]["over"] for r in rows)
    print(f"budget violations (true power over the budget): {over}")
    print(f"warm: worst gap {warm_worst:.2f}% | mean measured {warm_mean:.1f} | cold: worst gap {cold_worst:.2f}% "
          f"| mean measured {cold_mean:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
