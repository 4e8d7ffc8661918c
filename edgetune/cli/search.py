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
from typing import TYPE_CHECKING

from edgetune.cli import UsageError
from edgetune.cli.flags import add_config_flags, config_from_args

if TYPE_CHECKING:
    from edgetune.config import Config, EfficiencySection, ProtocolSection
    from edgetune.search.efficiency import TargetModel
    from edgetune.search.trial import MeasurementProtocol

__all__ = ["measurement_protocol", "register", "search"]

BUDGET_HINT_STEP_W = 0.1  # the lowest feasible budget is suggested rounded up to this step (a budget one can type)


def register(subparsers) -> None:
    p = subparsers.add_parser("search", help="co-select batch size and knobs under a power budget (Optuna, "
                              "hardware in the loop)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", help="TOML config file (`edgetune init` writes an example)")
    add_config_flags(p)  # one flag per config key, help and defaults from the schema
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=search)


def _config(args: argparse.Namespace) -> Config:
    cfg = config_from_args(args)
    if cfg.power_budget_w is None:
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
        workload = load_workload(cfg.workload, seed=cfg.seed)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    device = open_device(cfg.device, seed=cfg.seed)
    try:
        try:
            trace = prepare_trace(device, cfg.space.batch_sizes)  # a trace: its batch sizes, its epochs
            if trace is not None:
                # the table is the training run: reports and the study name name it, not the unused workload
                workload.name = Path(device.name.partition(":")[2]).stem
                # ... and its declared untuned batch size is the baseline's, not the unused workload's
                workload.default_batch_size = device.backend.default_batch_size or workload.default_batch_size
            space = build_space(device, workload.default_batch_size,
                                trace.batch_sizes if trace else cfg.space.batch_sizes, cfg.space.knobs,
                                cfg.space.values)
        except SpaceError as exc:
            raise UsageError(str(exc)) from None
        budget = cfg.power_budget_w
        src = cfg.sources.get("power_budget_w", "power_budget_w")
        if device.idle_power_w is not None and budget <= device.idle_power_w:
            low = _lowest_power_w(device, workload, space)
            lowest_w = math.ceil(low / BUDGET_HINT_STEP_W) * BUDGET_HINT_STEP_W
            hint = (f"the lowest feasible budget is about {lowest_w:g} W (smallest batch size "
                    f"at the lowest knob values)" if low else f"use a budget above {device.idle_power_w:g} W")
            raise UsageError(f"{src} {budget:g} W is below the idle power of {device.name} "
                             f"({device.idle_power_w:.2f} W): no setting can hold it (infeasible); {hint}")
        notes = list(trace.notes) if trace else []
        if device.max_power_w is not None and budget >= device.max_power_w:
            notes.append(f"note: budget {budget:g} W is at or above the most {device.name} can draw "
                         f"({device.max_power_w:.1f} W): no constraint binds; searching unconstrained")
        target = trace.target if trace and trace.target else _target(cfg.efficiency, workload)
        prior = _prior(cfg.search.prior, space, device)
        out = Path(cfg.output)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the output folder {out}: {exc.strerror or exc}") from None
        try:
            storage = open_storage(cfg.storage_url())
        except SearchError as exc:
            raise UsageError(str(exc)) from None
        study_name = cfg.study_name(device.name, workload.name)
        print(f"edgetune search: {workload.name} on {device.name} ({device.description}), budget {budget:g} W, "
              f"objective {cfg.objective}", file=sys.stderr)
        print(f"space: {space.describe()}", file=sys.stderr)
        for line in notes + list(device.notes or []):
            print(line, file=sys.stderr)
        from tqdm import tqdm

        # the bar draws on a terminal only (disable=None), never with --quiet; it clears itself at the end
        with tqdm(total=cfg.search.n_trials, desc="trials", unit="trial", file=sys.stderr, leave=False,
                  disable=True if args.quiet else None) as bar:
            def on_trial(rec, n):
                o = rec.outcome
                note = (f"#{rec.number} b={rec.candidate.batch_size} " +
                        (f"{o.time_to_target_s:.0f}s {'ok' if rec.feasible else 'over'}" if o else "failed"))
                bar.set_postfix_str(note, refresh=False)
                bar.update(n - bar.n)  # n: trials measured so far, this worker's and the fleet's

            s = Search(
                device, workload, space, eta=cfg.search.eta, prior=prior, budget_w=budget, objective=cfg.objective, target=target,
                protocol=measurement_protocol(cfg.protocol), storage_url=cfg.storage_url(),
                study_name=study_name, sampler=cfg.search.sampler, n_trials=cfg.search.n_trials,
                window_s=cfg.budget.window_s, tolerance=cfg.budget.tolerance, guard_sigma=cfg.budget.guard_sigma,
                patience=cfg.search.patience, margin=cfg.search.margin, timeout_s=cfg.search.timeout_s,
                seed=cfg.seed, on_trial=on_trial, storage=storage,
            )
            try:
                result = s.run()
            except SearchError as exc:
                raise UsageError(str(exc)) from None
    finally:
        device.close()
    return _finish(result, out, cfg)


def _prior(spec: str, space, device) -> tuple:
    """``--prior``'s observations mapped to ``space`` (none without one); bad input: a UsageError."""
    if not spec:
        return ()
    from edgetune.search.prior import PriorError, load_prior, map_to_space

    try:
        prior = load_prior(spec)
    except PriorError as exc:
        raise UsageError(str(exc)) from None
    mapped = map_to_space(prior.observations, space, device.settings())
    print(f"{prior.describe()}; {len(mapped)} of them in this space", file=sys.stderr)
    return mapped


def measurement_protocol(section: ProtocolSection) -> MeasurementProtocol:
    """The search's :class:`~edgetune.search.trial.MeasurementProtocol` from the config's ``[protocol]``."""
    from edgetune.search.trial import MeasurementProtocol

    return MeasurementProtocol(warmup_steps=section.warmup_steps, measure_steps=section.measure_steps,
                               measure_s=section.measure_s, real_steps=section.real_steps)


#: warm-up steps whose gradient norms estimate B_noise (``efficiency.b_noise = "measure"``): the number
#: measure_b_noise is written for; they train the model, so they are the warm-up, not extra work
B_NOISE_STEPS = 20


def _target(section: EfficiencySection, workload) -> TargetModel:
    """The steps-to-target model: B_noise from the config, or measured from gradient norms (warm-up)."""
    from edgetune.config import MEASURE
    from edgetune.search.efficiency import TargetModel, measure_b_noise

    if section.b_noise != MEASURE:
        return TargetModel(section.s_min, section.b_noise, "config")
    how = f"measured from gradient norms over {B_NOISE_STEPS} warm-up steps"
    try:
        value = measure_b_noise(workload, workload.default_batch_size, steps=B_NOISE_STEPS)
    except ValueError as exc:
        raise UsageError(f"efficiency.b_noise = \"{MEASURE}\": {exc}") from None
    if not (value > 0 and math.isfinite(value)):
        raise UsageError(f"efficiency.b_noise = \"{MEASURE}\": the gradient noise scale of {workload.name} was "
                         f"not positive after {B_NOISE_STEPS} warm-up steps; set efficiency.b_noise to a number "
                         f"of samples")
    print(f"B_noise {how}: {value:.0f} samples", file=sys.stderr)
    return TargetModel(section.s_min, value, how)


def _finish(result, out: Path, cfg: Config) -> int:
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
    if not cfg.search.storage:  # the default SQLite file: say how to browse it
        print(f"study: optuna-dashboard {cfg.storage_url()}  (study {result.study_name!r})")
    return 0 if result.best is not None else 1
