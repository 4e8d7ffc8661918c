"""``edgetune search``: find the batch size and knob setting that trains fastest within a power budget.

    edgetune search --device sim:orin-nano --workload cnn --budget 10
    edgetune search --config edgetune.toml --budget 12 --objective energy

Each trial sets the knobs, warms up, and measures the real training step while the power monitor records;
the budget is judged by the 1-s moving average of board power. The study lives in an Optuna storage
(``study.db`` in the output folder unless ``--storage`` says otherwise): the same command again resumes it,
and several processes given one ``--storage`` URL share the work (a fleet of identical boards). Results go
to the output folder: best.json, trials.csv, time_vs_energy.png, power.png. Browse the study with
``optuna-dashboard sqlite:///<output>/study.db``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from edgetune.cli import UsageError

__all__ = ["register", "search"]

# flag dest -> config key (flags override the config file)
FLAG_KEYS = {
    "device": "device", "workload": "workload", "budget": "power_budget_w", "objective": "objective",
    "output": "output", "seed": "seed", "tolerance": "budget.tolerance", "window": "budget.window_s",
    "guard_sigma": "budget.guard_sigma",
    "batch_sizes": "space.batch_sizes", "knobs": "space.knobs", "n_trials": "search.n_trials",
    "sampler": "search.sampler", "storage": "search.storage", "study_name": "search.study_name",
    "patience": "search.patience", "margin": "search.margin", "timeout": "search.timeout_s",
    "warmup_steps": "protocol.warmup_steps", "measure_steps": "protocol.measure_steps",
    "measure_s": "protocol.measure_s", "real_steps": "protocol.real_steps", "s_min": "efficiency.s_min",
    "b_noise": "efficiency.b_noise",
}


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers (16,32,64), got {text!r}") from None


def _name_list(text: str) -> Any:
    return "all" if text.strip() == "all" else [x.strip() for x in text.split(",") if x.strip()]


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _int_or_all(text: str) -> Any:
    return "all" if text == "all" else _int(text)


def _number_or_measure(text: str) -> Any:
    return "measure" if text == "measure" else _number(text)


def register(subparsers) -> None:
    p = subparsers.add_parser("search", help="co-select batch size and knobs under a power budget (Optuna, "
                              "hardware in the loop)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", help="TOML config file (`edgetune init` writes an example)")
    g = p.add_argument_group("what to tune")
    g.add_argument("--device", help="auto (default), sim:<profile>, jetson, nvml[:i], rapl, trace:<table.csv>")
    g.add_argument("--workload", help="cnn (default), mobilenet, chartransformer, or module:function")
    g.add_argument("--budget", type=_number, metavar="W", help="power budget in watts (power_budget_w)")
    g.add_argument("--objective", help="time (default), energy, throughput or pareto")
    g.add_argument("--batch-sizes", type=_int_list, metavar="B,B,..", help="batch sizes to try")
    g.add_argument("--knobs", type=_name_list, metavar="K,K,..", help='knobs to tune (default "all" writable)')
    g.add_argument("--tolerance", type=_number, help="allowed overshoot of the budget, fraction (default 0)")
    g.add_argument("--window", type=_number, metavar="S", help="moving-average window of the budget (default 1 s)")
    g.add_argument("--guard-sigma", type=_number, metavar="K",
                   help="guard band in standard errors of the measured average (default 2)")
    g = p.add_argument_group("search")
    g.add_argument("--n-trials", type=_int, help="settings to measure in all (default 24)")
    g.add_argument("--sampler", help="auto (default), guided, tpe, gp, random")
    g.add_argument("--storage", help="Optuna storage URL for a fleet (postgresql://..., sqlite:///..., journal:FILE)")
    g.add_argument("--study-name", help="study name (default from device, workload, budget, objective)")
    g.add_argument("--patience", type=_int, help="stop after this many trials without improvement (0: never)")
    g.add_argument("--margin", type=_number, help="improvement that counts, fraction (default 0.01)")
    g.add_argument("--timeout", type=_number, metavar="S", help="stop starting trials after S seconds")
    g.add_argument("--seed", type=_int, help="seed (sampler, synthetic data, twin)")
    g = p.add_argument_group("measurement and target")
    g.add_argument("--warmup-steps", type=_int, help="warm-up steps per trial (default 1)")
    g.add_argument("--measure-steps", type=_int, help="at least this many measured steps (default 5)")
    g.add_argument("--measure-s", type=_number, help="... over at least this many device seconds (default 2)")
    g.add_argument("--real-steps", type=_int_or_all, help='twin only: real steps in the window (default 1; "all")')
    g.add_argument("--s-min", type=_number, help="S_min: steps to target at a very large batch (default 1000)")
    g.add_argument("--b-noise", type=_number_or_measure, help='gradient noise scale in samples, or "measure"')
    p.add_argument("--output", "-o", help="output folder (default edgetune-out)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=search)


def _config(args: argparse.Namespace):
    from edgetune.config import ConfigError, load_config

    overrides, sources = {}, {}
    for dest, key in FLAG_KEYS.items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides[key] = value
            sources[key] = "--" + dest.replace("_", "-")
    try:
        cfg = load_config(args.config, overrides, sources)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if cfg.budget_w is None:
        raise UsageError("no power budget: pass --budget WATTS or set power_budget_w in the config")
    return cfg


def _lowest_power_w(device, workload, space) -> float | None:
    """The twin's noise-free power of the least demanding setting in the space (None off the twin)."""
    expected = getattr(device.backend, "expected", None)
    if expected is None:
        return None
    setting = {name: values[0] for name, values in space.knobs}
    try:
        return float(expected(workload.cost, space.batch_sizes[0], setting).power_w)
    except Exception:  # noqa: BLE001 - a hint only
        return None


def search(args: argparse.Namespace) -> int:
    cfg = _config(args)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # edgetune prints its own progress and summary
    from edgetune.power import open_device
    from edgetune.search.oracle import prepare_trace
    from edgetune.search.space import SpaceError, build_space
    from edgetune.search.study import Search, SearchError, open_storage
    from edgetune.workloads import WorkloadError, load_workload

    try:
        workload = load_workload(cfg["workload"], seed=cfg["seed"])
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    device = open_device(cfg["device"], seed=cfg["seed"])
    try:
        try:
            trace = prepare_trace(device, cfg["space.batch_sizes"])  # a trace: its batch sizes, its epochs
            if trace is not None:
                # the table is the training run: reports and the study name name it, not the unused workload
                workload.name = Path(device.name.partition(":")[2]).stem
                # ... and its declared untuned batch size is the baseline's, not the unused workload's
                workload.default_batch_size = device.backend.default_batch_size or workload.default_batch_size
            space = build_space(device, workload.default_batch_size,
                                trace.batch_sizes if trace else cfg["space.batch_sizes"], cfg["space.knobs"],
                                cfg["space.values"])
        except SpaceError as exc:
            raise UsageError(str(exc)) from None
        budget = cfg.budget_w
        src = cfg.sources.get("power_budget_w", "power_budget_w")
        if device.idle_power_w is not None and budget <= device.idle_power_w:
            low = _lowest_power_w(device, workload, space)
            hint = (f"the lowest feasible budget is about {math.ceil(low * 10) / 10:g} W (smallest batch size "
                    f"at the lowest knob values)" if low else f"use a budget above {device.idle_power_w:g} W")
            raise UsageError(f"{src} {budget:g} W is below the idle power of {device.name} "
                             f"({device.idle_power_w:.2f} W): no setting can hold it (infeasible); {hint}")
        notes = list(trace.notes) if trace else []
        if device.max_power_w is not None and budget >= device.max_power_w:
            notes.append(f"note: budget {budget:g} W is at or above the most {device.name} can draw "
                         f"({device.max_power_w:.1f} W): no constraint binds; searching unconstrained")
        target = trace.target if trace and trace.target else _target(cfg, workload)
        out = Path(cfg["output"])
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the output folder {out}: {exc.strerror or exc}") from None
        try:
            storage = open_storage(cfg.storage_url())
        except SearchError as exc:
            raise UsageError(str(exc)) from None
        study_name = cfg.study_name(device.name, workload.name)
        quiet = args.quiet or not sys.stderr.isatty()
        print(f"edgetune search: {workload.name} on {device.name} ({device.description}), budget {budget:g} W, "
              f"objective {cfg['objective']}", file=sys.stderr)
        print(f"space: {space.describe()}", file=sys.stderr)
        for line in notes + list(device.notes or []):
            print(line, file=sys.stderr)
        from edgetune.progress import ProgressBar

        with ProgressBar(cfg["search.n_trials"], "trials", enabled=not quiet) as bar:
            def on_trial(rec, n):
                o = rec.outcome
                note = (f"#{rec.number} b={rec.candidate.batch_size} " +
                        (f"{o.time_to_target_s:.0f}s {'ok' if rec.feasible else 'over'}" if o else "failed"))
                bar.update(n, note)

            s = Search(
                device, workload, space, budget_w=budget, objective=cfg["objective"], target=target,
                protocol=cfg.protocol(), storage_url=cfg.storage_url(), study_name=study_name,
                sampler=cfg["search.sampler"], n_trials=cfg["search.n_trials"], window_s=cfg["budget.window_s"],
                tolerance=cfg["budget.tolerance"], guard_sigma=cfg["budget.guard_sigma"],
                patience=cfg["search.patience"], margin=cfg["search.margin"],
                timeout_s=cfg["search.timeout_s"], seed=cfg["seed"], on_trial=on_trial, storage=storage,
            )
            try:
                result = s.run()
            except SearchError as exc:
                raise UsageError(str(exc)) from None
    finally:
        device.close()
    return _finish(result, out, cfg)


def _target(cfg, workload):
    """The steps-to-target model: B_noise from the config, or measured from gradient norms (warm-up)."""
    from edgetune.search.efficiency import TargetModel, measure_b_noise

    b_noise = cfg["efficiency.b_noise"]
    if b_noise != "measure":
        return TargetModel(cfg["efficiency.s_min"], b_noise, "config")
    steps = 20
    try:
        value = measure_b_noise(workload, workload.default_batch_size, steps=steps)
    except ValueError as exc:
        raise UsageError(f"efficiency.b_noise = \"measure\": {exc}") from None
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"efficiency.b_noise = \"measure\": the gradient noise scale of {workload.name} was not "
                         f"positive after {steps} warm-up steps; set efficiency.b_noise to a number of samples")
    print(f"B_noise measured from gradient norms over {steps} warm-up steps: {value:.0f} samples", file=sys.stderr)
    return TargetModel(cfg["efficiency.s_min"], value, f"measured from gradient norms over {steps} warm-up steps")


def _finish(result, out: Path, cfg) -> int:
    from edgetune.report import summary_table, write_plots
    from edgetune.search.results import write_best, write_trials_csv

    best = write_best(result, out / "best.json")
    trials = write_trials_csv(result, out / "trials.csv")
    plots = write_plots(result, out)
    print(summary_table(result))
    from edgetune.search.oracle import oracle_lines

    for line in oracle_lines(result):  # on a trace: the gap to the table's own oracle
        print(line)
    if result.best is None:
        print(f"no measured setting held the budget of {result.budget_w:g} W: raise the budget, allow lower "
              f"knob values, or smaller batch sizes")
    print(f"wrote {best}, {trials}, {', '.join(str(p) for p in plots)}")
    if cfg["search.storage"] == "":
        print(f"study: optuna-dashboard {cfg.storage_url()}  (study {result.study_name!r})")
    return 0 if result.best is not None else 1
