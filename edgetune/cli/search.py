"""``edgetune search``: find the batch size and knob setting that trains fastest within a power budget.

    edgetune search --device sim:orin-nano --workload cnn --budget 10
    edgetune search --config edgetune.toml --budget 12 --objective energy

Each trial sets the knobs, warms up, and measures the real training step while the power monitor records;
the budget is judged by the 1-s moving average of board power. Each study has a folder of its own under the
output folder, named from the study (``edgetune-out/sim-orin-nano-cnn-time-10W``), unless ``--output DIR``
names the folder itself: best.json, trials.csv, time_vs_energy.png, power.png and the Optuna storage
``study.db`` (unless ``--storage`` says otherwise). The same command again resumes the study and says so;
several processes given one ``--storage`` URL share the work (a fleet of identical boards), and write a folder
they share one at a time, each from the storage as it stands then (a lock on the folder). An empty or
damaged ``study.db`` is refused, nothing overwritten, and so is an ``--output`` folder whose best.json another
study wrote; Ctrl-C writes best.json, trials.csv and the plots from the trials measured. Browse the study with ``optuna-dashboard sqlite:///<folder>/study.db``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from edgetune.cli import Interrupted, Terminated, UsageError
from edgetune.cli.flags import add_config_flags, config_from_args

if TYPE_CHECKING:
    from edgetune.config import Config, EfficiencySection, ProtocolSection
    from edgetune.search.efficiency import TargetModel
    from edgetune.search.measurement import MeasurementProtocol
    from edgetune.search.results import SearchResult, Written

__all__ = ["measurement_protocol", "register", "search"]

OUTPUT_FLAG = "--output"  # the flag that names the output folder itself (no folder per study under it)
BUDGET_HINT_STEP_W = 0.1  # the lowest feasible budget is suggested rounded up to this step (a budget one can type)
MILLIWATTS_PER_WATT = 1000.0  # a budget written in milliwatts reads this many times too large


def register(subparsers) -> None:
    p = subparsers.add_parser("search", help="co-select batch size and knobs under a power budget (Optuna, "
                              "hardware in the loop)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", help="TOML config file (`edgetune init` writes an example)")
    add_config_flags(p)  # one flag per config key, help and defaults from the schema
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=search)


def _config(args: argparse.Namespace) -> Config:
    from edgetune.config import STUDY_DB
    from edgetune.search.storage import in_memory

    cfg = config_from_args(args)
    if cfg.power_budget_w is None:
        raise UsageError("no power budget: pass --budget WATTS or set power_budget_w in the config")
    if in_memory(cfg.search.storage):
        # the study would end with this process, and the same command again would start it over, writing
        # another study's results over best.json as if it were the same one
        raise UsageError(f"{cfg.label('search.storage')} {cfg.search.storage} is an in-memory database: the study "
                         f"and its measurements would be lost when the search ends, and the same command again "
                         f"would start over; give a file (sqlite:///PATH or journal:PATH), or leave it out for "
                         f"the output folder's {STUDY_DB}")
    return cfg


#: the keys that set the steps-to-target model: on a trace whose table has its own convergence, it decides
_TARGET_KEYS = ("efficiency.steps_to_target", "efficiency.b_noise", "efficiency.s_min", "efficiency.b_noise_warmups")


def _given_by(cfg: Config, key: str) -> str | None:
    """How the user set ``key`` (:meth:`Config.label`: ``--flag``, or ``FILE: key``); None where it is the
    default."""
    return cfg.label(key) if key in cfg.sources else None


def _trace_options(cfg: Config, trace, workload) -> list[str]:
    """What a trace makes of the options that shape the training run: the steps-to-target model's keys are
    refused where the table's own convergence decides it (they would be ignored); a workload the user named
    gets a line saying what of it the search still uses (its training step is never run on a trace)."""
    from edgetune.config import MEASURE, WORKLOAD

    if trace.target is not None:
        for key in _TARGET_KEYS:
            given = _given_by(cfg, key)
            if given is not None:
                raise UsageError(f"{given}: on a trace the table's epochs_to_target column decides the steps to "
                                 f"target (time to target = its epochs to target x time per epoch), so it would "
                                 f"be ignored; drop it, or search a table without an epochs_to_target column")
    given = _given_by(cfg, "workload")
    if given is None:
        return []
    uses = []
    if trace.baseline_batch_size is None:
        uses.append(f"its default batch size {workload.default_batch_size} for the baseline (the table declares "
                    f"none; the baseline runs the nearest batch size searched)")
    if trace.target is None and cfg.efficiency.b_noise in (WORKLOAD, MEASURE) and not cfg.efficiency.steps_to_target:
        uses.append("its B_noise for the steps to target (the table has no convergence data)")
    ran = "on a trace the table is the training run, the workload's step is not run"
    if not uses:
        return [f"note: {given} {cfg.workload} is not used: {ran}"]
    return [f"note: {given} {cfg.workload}: {ran}; the search takes only {' and '.join(uses)} from it"]


def _unused_notes(cfg: Config, device, workload) -> list[str]:
    """A line for each key the user set that this search does not use, so that none is ignored without a word:
    set by a flag, or by the file to other than its default (``edgetune init``'s file writes every default)."""
    from edgetune.config import SCHEMA
    from edgetune.search.identity import ranks_measurements

    eff = cfg.efficiency
    runs = "your runs to the target (efficiency.steps_to_target) replace the law it sets"
    measured = _measures_b_noise(eff, workload, cfg.objective)
    why = {
        "search.eta": None if cfg.objective == "cost" else
        f"it weighs energy in the cost objective, and the objective is {cfg.objective}",
        "search.patience": "the guided sampler stops by its own rule (patience is for --sampler tpe, gp or random)"
        if ranks_measurements(cfg.search.sampler) else None,
        "efficiency.known_convergence": None if device.name.startswith("trace:") else
        "it is for a trace:<table.csv> device's table of epochs to target",
        "efficiency.b_noise": runs if eff.steps_to_target else None,
        "efficiency.s_min": runs if eff.steps_to_target else None,
        "efficiency.b_noise_warmups": None if measured else
        "B_noise is not measured here (it is with efficiency.b_noise = \"measure\", or for a workload without one)",
    }
    notes = []
    for key, reason in why.items():
        value = SCHEMA[key].value_in(cfg)
        origin = cfg.sources.get(key)
        if reason and origin and (origin.startswith("--") or value != SCHEMA[key].default):
            shown = "" if SCHEMA[key].flag is not None and SCHEMA[key].flag.switch and origin.startswith("--") \
                else f" {value:g}" if isinstance(value, float) else f" {value}"
            notes.append(f"note: {cfg.label(key)}{shown} is not used: {reason}")
    return notes


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


def _refuse_milliwatts(budget: float, src: str, device) -> None:
    """Refuse a budget above the most ``device`` can draw that, read as milliwatts, is a budget it can hold:
    ``10000`` for 10 W would search unconstrained, a note among the start-up lines the only sign."""
    top, idle = device.max_power_w, device.idle_power_w or 0.0
    watts = budget / MILLIWATTS_PER_WATT
    if top is None or budget <= top or not idle < watts <= top:
        return
    raise UsageError(f"{src} {budget:g} W is more than {device.name} can draw ({top:.1f} W) and reads like "
                     f"milliwatts ({budget:g} mW = {watts:g} W); the budget is in watts: give {watts:g}, or for a "
                     f"search that no budget binds, {math.ceil(top):g}")


def search(args: argparse.Namespace) -> int:
    from edgetune.search.storage import close_storage

    opened: list = []  # the storage, open until the results are written: they are read from it again then
    try:
        return _search(args, opened)
    finally:
        for storage in opened:
            close_storage(storage)


def _search(args: argparse.Namespace, opened: list) -> int:
    cfg = _config(args)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # edgetune prints its own progress and summary
    from edgetune.cli.run import place_workload, seed_training
    from edgetune.power import open_device
    from edgetune.search.oracle import lowest_row_power_w, prepare_trace
    from edgetune.search.records import Role
    from edgetune.search.space import SpaceError, build_space
    from edgetune.search.study import Search, SearchError, open_storage
    from edgetune.workloads import WorkloadError, load_workload

    try:
        workload = load_workload(cfg.workload, seed=cfg.seed)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    seed_training(cfg.seed)
    device = open_device(cfg.device, seed=cfg.seed, known_convergence=cfg.efficiency.known_convergence)
    try:
        chosen_by = cfg.sources.get("torch_device", "--torch-device")
        placed = place_workload(workload, cfg.torch_device, device,
                                chosen_by if chosen_by.startswith("--") else f"{chosen_by}: torch_device =")
        try:
            # a trace: its batch sizes, its convergence as the search may see it, its untuned batch size
            trace = prepare_trace(device, cfg.space.batch_sizes, workload.default_batch_size)
            if trace is not None:
                # the table is the training run: reports and the study name name it, not the unused workload
                workload.name = Path(device.name.partition(":")[2]).stem
            space = build_space(device, workload.default_batch_size,
                                trace.batch_sizes if trace else cfg.space.batch_sizes, cfg.space.knobs,
                                cfg.space.values, None if trace else workload.max_batch_size)
        except SpaceError as exc:
            origin = cfg.sources.get(exc.key) if exc.key else None
            where = f"{origin}: " if origin and not origin.startswith("--") else ""  # set in a file: name it
            raise UsageError(f"{where}{exc}") from None
        interrupted: SearchResult | None = None
        stop: type[Interrupted] = Interrupted  # how the search was stopped early: Ctrl-C, or SIGTERM (Terminated)
        budget = cfg.power_budget_w
        src = cfg.label("power_budget_w")  # --budget, or FILE: power_budget_w
        if device.idle_power_w is not None and budget <= device.idle_power_w:
            # a trace knows its lowest budget from its rows: the least power the table measured among them
            low = lowest_row_power_w(device, space) if trace else _lowest_power_w(device, workload, space)
            where = ("the least power of the table's rows searched" if trace else
                     "smallest batch size at the lowest knob values")
            # rounded up, and above the budget refused (a trace's idle power is its least row's)
            step_w = BUDGET_HINT_STEP_W
            hint = (f"use a budget above {device.idle_power_w:g} W" if low is None else
                    f"the lowest feasible budget is about "
                    f"{max(math.ceil(low / step_w), math.floor(budget / step_w) + 1) * step_w:g} W ({where})")
            raise UsageError(f"{src} {budget:g} W is at or below the idle power of {device.name} "
                             f"({device.idle_power_w:.2f} W): no setting can hold it (infeasible); {hint}")
        _refuse_milliwatts(budget, src, device)
        notes = list(trace.notes) if trace else []
        if trace is not None:
            notes += _trace_options(cfg, trace, workload)
        notes += _unused_notes(cfg, device, workload)
        if device.max_power_w is not None and budget >= device.max_power_w:
            notes.append(f"note: budget {budget:g} W is at or above the most {device.name} can draw "
                         f"({device.max_power_w:.1f} W): no constraint binds; searching unconstrained")
        target = trace.target if trace and trace.target else _target(cfg.efficiency, workload, cfg.workload,
                                                                       cfg.seed, cfg.objective)
        study_name = cfg.study_name(device.name, workload.name)
        output_given = cfg.sources.get("output") == OUTPUT_FLAG
        out = output_folder(cfg, device.name, workload.name)
        cfg = cfg.with_values(output=str(out))  # the default storage, study.db, lives in the study's folder
        _refuse_other_results(out, study_name, cfg.storage_url(), own_db=not cfg.search.storage)
        prior = _prior(cfg, space, device, study_name, workload.name)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocked = next((f for f in (out, *out.parents) if f.exists() and not f.is_dir()), None)
            if blocked is not None:  # mkdir said only "File exists" or "Not a directory"
                raise UsageError(f"{cfg.label('output')} {blocked} is a file, not a folder; give a folder for the "
                                 f"study's results, or move the file away") from None
            raise UsageError(f"cannot create the output folder {out}: {exc.strerror or exc}") from None
        try:
            storage = open_storage(cfg.storage_url())
            opened.append(storage)
            stored = _stored_records(storage, study_name, space)
        except SearchError as exc:
            raise UsageError(str(exc)) from None
        trained = "" if device.simulated else f", training on {placed.torch_device}"
        print(f"edgetune search: {workload.name} on {device.name} ({device.description}), budget {budget:g} W, "
              f"objective {cfg.objective}{trained}", file=sys.stderr)
        measured_before = None if stored is None else sum(1 for r in stored if r.measured and r.role != Role.CONFIRM)
        if stored is None:
            print(f"new study {study_name!r}; results in {out}/", file=sys.stderr)
        else:
            again = sum(1 for r in stored if r.measured and r.role == Role.CONFIRM)
            print(f"resuming study {study_name!r}: {measured_before} setting{'' if measured_before == 1 else 's'} measured"
                  f"{f' ({again} measured again)' if again else ''}; results in {out}/", file=sys.stderr)
        print(f"space: {space.describe()}", file=sys.stderr)
        if placed.note:
            notes.append(placed.note)
        for line in notes + list(device.notes or []):
            print(line, file=sys.stderr)
        from edgetune.cli.progress import SearchProgress

        try:
            s = Search(
                device, workload, space, eta=cfg.search.eta, prior=prior, budget_w=budget, objective=cfg.objective,
                target=target,
                protocol=measurement_protocol(cfg.protocol), storage_url=cfg.storage_url(),
                study_name=study_name, sampler=cfg.search.sampler, n_trials=cfg.search.n_trials,
                window_s=cfg.budget.window_s, tolerance=cfg.budget.tolerance, guard_sigma=cfg.budget.guard_sigma,
                patience=cfg.search.patience, margin=cfg.search.margin, timeout_s=cfg.search.timeout_s,
                seed=cfg.seed, storage=storage,
                baseline_batch_size=trace.baseline_batch_size if trace else None,
                power_cv=trace.power_cv if trace else 0.0, confirm_settings=cfg.search.confirm,
                soak_s=cfg.search.soak_s, start_anew=_start_anew(cfg, output_given),
            )
        except SearchError as exc:
            raise UsageError(str(exc)) from None
        # "best so far" ranks by the study's own objective, the cost objective with the study's weights
        with SearchProgress(cfg.search.n_trials, dict(space.unit_of), cfg.objective, quiet=args.quiet,
                            measured_before=measured_before or 0, stored=stored or [], cost=s.cost) as progress:
            s.on_trial = progress
            try:
                result = s.run()
            except SearchError as exc:
                raise UsageError(str(exc)) from None
            except KeyboardInterrupt as exc:
                stop = Terminated if isinstance(exc, Terminated) else Interrupted
                if s.study is None:  # nothing measured yet
                    raise stop(f"nothing measured; run the same command again to start study "
                               f"{study_name!r}") from None
                interrupted = s.result("terminated (SIGTERM)" if stop is Terminated else "interrupted (Ctrl-C)")
    finally:
        device.close()
    # what the plots and the runtime need beyond the study: the guard band, and the workload's step cost
    extra = {"guard_sigma": cfg.budget.guard_sigma,
             "workload_cost": None if trace else dataclasses.asdict(workload.cost)}
    own = interrupted if interrupted is not None else result
    # written from the storage as it stands once the folder is locked: another worker of a fleet may have
    # measured, and written the folder, since this one stopped
    written = _write_results(dataclasses.replace(own, **extra), out,
                             reread=lambda: _as_stored_now(own, dataclasses.replace(s.result(), **extra)))
    if interrupted is not None:
        # the plots too: a resumed study's folder holds the last run's, whose pick best.json no longer names
        if written.line:
            print(written.line, file=sys.stderr)
        done = (f"written to {', '.join(str(f) for f in written.files)}" if written.files else
                f"the files in {out} kept (another worker's newer view)")
        raise stop(f"{len(written.result.measured)} trials measured, {done}; run the same command again "
                   f"to resume study {study_name!r}") from None
    return _finish(written, out, cfg)


#: characters kept in a folder name made from a study: letters, digits and ``. _ -`` (everything else is a ``-``)
_FOLDER_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def output_folder(cfg: Config, device_name: str, workload_name: str) -> Path:
    """Where a study's files go: ``--output`` as given, else a folder of its own under ``output``.

    The folder is named from the study (``--study-name``, or device, workload, objective and budget:
    ``edgetune-out/sim-orin-nano-cnn-time-10W``), so a second search with another budget or objective never
    overwrites the first one's best.json, trials.csv and plots, and the same command finds its study again.
    """
    if cfg.sources.get("output") == OUTPUT_FLAG:
        return Path(cfg.output)
    if cfg.search.study_name:
        name = cfg.search.study_name
    else:
        # a trace's workload is named after its table already: "trace" rather than the table's path twice
        device = "trace" if device_name.startswith("trace:") else device_name
        budget = "unconstrained" if cfg.power_budget_w is None else f"{cfg.power_budget_w:g}W"
        name = f"{device}-{workload_name}-{cfg.objective}-{budget}"
    return Path(cfg.output) / (_FOLDER_CHARS.sub("-", name).strip("-.") or "study")


def _start_anew(cfg: Config, output_given: bool) -> str:
    """The flags that give a search a study of its own where the one it would resume is for something else: a
    study name where ``--storage`` names the storage (another ``--output`` opens the same study again), and
    another ``--output`` too where one was given (its best.json is the resumed study's); else the folder."""
    if cfg.search.storage:
        return "another --study-name and --output" if output_given else "another --study-name"
    return "another --output" if output_given else "another --study-name or --output"


def _refuse_other_results(out: Path, study_name: str, storage_url: str, *, own_db: bool) -> None:
    """Refuse, before anything is measured, a search that would write its results over another study's: an
    ``--output`` folder whose best.json a search of another study wrote (another name, or the same name in
    another storage), or that edgetune cannot read; or one without a best.json that holds a file of a result's
    name (trials.csv, a plot), which no search wrote (a search writes best.json first).

    Each study's files are its own: the same study resumed rewrites them, another one goes elsewhere. The
    folder's own study.db (``own_db``: no ``--storage``) is the same storage wherever the folder was when it
    was written: a folder moved or copied (from the board to a laptop) resumes.
    """
    from edgetune.config import STUDY_DB
    from edgetune.report import PLOT_FILES
    from edgetune.search.storage import redact, same_storage, sqlite_file

    best = out / "best.json"
    if not best.is_file():
        # a search writes best.json first: files of a search's names without one are someone else's
        theirs = [out / name for name in ("trials.csv", *PLOT_FILES) if (out / name).exists()]
        if theirs:
            raise UsageError(f"{theirs[0]} is not an edgetune search's result (no best.json beside it); study "
                             f"{study_name!r} would write its {theirs[0].name} over it: pass another --output, or "
                             f"move {', '.join(f.name for f in theirs)} away")
        return
    try:
        study = json.loads(best.read_text()).get("study", {})
        held, held_storage = study.get("name"), study.get("storage")
    except (OSError, ValueError, AttributeError):
        held = held_storage = None
    if held == study_name and isinstance(held_storage, str):
        moved_own_db = own_db and (sqlite_file(held_storage) or Path()).name == STUDY_DB
        if moved_own_db or same_storage(held_storage, storage_url):
            return
    if held == study_name and isinstance(held_storage, str):
        what = f"the results of study {held!r} in another storage ({redact(held_storage)})"
    else:
        what = f"the results of study {held!r}" if isinstance(held, str) else "a best.json edgetune cannot read"
    raise UsageError(f"{best} holds {what}; study {study_name!r} in {redact(storage_url)} would write its results "
                     f"over it: pass another --output, or leave it out (each study then gets a folder of its own)")


def _stored_records(storage, study_name: str, space) -> list | None:
    """The trials of the stored study ``study_name``; None when there is no such study yet."""
    import optuna

    from edgetune.search import records

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return None
    return records.read_records(study.get_trials(deepcopy=False), space)


def _prior(cfg: Config, space, device, study_name: str, workload: str) -> tuple:
    """``--prior``'s observations mapped to ``space`` (none without one); bad input: a UsageError.

    Refused: a prior that is the study this search resumes (the same storage and name: its measurements would
    count twice, as this board's and as the prior's), and a sampler that does not read a prior (Optuna's own:
    the warm start would be announced and ignored)."""
    spec = cfg.search.prior
    if not spec:
        return ()
    from edgetune.search.baseline import governed_clocks
    from edgetune.search.identity import ranks_measurements
    from edgetune.search.prior import PriorError, load_prior, map_to_space, moved_count
    from edgetune.search.storage import redact, same_storage

    given = cfg.label("search.prior")
    if not ranks_measurements(cfg.search.sampler):
        raise UsageError(f"{given} guides only the guided sampler (--sampler auto or guided); "
                         f"{cfg.label('search.sampler')} {cfg.search.sampler} would ignore it: drop one of them")
    try:
        prior = load_prior(spec)
    except PriorError as exc:
        raise UsageError(str(exc)) from None
    if prior.study_name == study_name and same_storage(prior.source, redact(cfg.storage_url())):
        raise UsageError(f"{given} {spec} is study {study_name!r} in {prior.source}, the study this search "
                         f"resumes: its measurements are this search's already, and as a prior they would count "
                         f"twice; leave {given} out to resume it, or start a new study from it with another "
                         f"--study-name (and another --output, where you gave one)")
    found = device.settings()  # a real board's clocks: as their governor runs them, not as read (governed_clocks)
    mapped = map_to_space(prior.observations, space, found if device.simulated else governed_clocks(space, found))
    moved = moved_count(prior.observations, space)
    print(f"{prior.describe()}; {len(mapped)} setting{'' if len(mapped) == 1 else 's'} of this space from them"
          + (f" ({moved} moved to the nearest values this space allows)" if moved else ""), file=sys.stderr)
    prior_workload = prior.identity.get("workload")
    if prior_workload and prior_workload != workload:
        print(f"note: the prior trained {prior_workload}, this search {workload}: its step times and power are "
              f"another model's, and this board's measurements correct them as they come", file=sys.stderr)
    return mapped


def measurement_protocol(section: ProtocolSection) -> MeasurementProtocol:
    """The search's :class:`~edgetune.search.trial.MeasurementProtocol` from the config's ``[protocol]``."""
    from edgetune.search.measurement import MeasurementProtocol

    cap = MeasurementProtocol.max_steps
    if section.measure_steps > cap:
        raise UsageError(f"protocol.measure_steps (--measure-steps) {section.measure_steps} is more steps than one "
                         f"measured window holds; use at most {cap}")
    try:
        return MeasurementProtocol(warmup_steps=section.warmup_steps, measure_steps=section.measure_steps,
                                   measure_s=section.measure_s, real_steps=section.real_steps)
    except ValueError as exc:
        raise UsageError(f"[protocol]: {exc}") from None


#: steps of each warm-up whose gradient norms estimate B_noise (``efficiency.b_noise = "measure"``): the
#: number measure_b_noise is written for; the first warm-up trains the model, so it is the warm-up, not extra work
B_NOISE_STEPS = 20


def _target(section: EfficiencySection, workload, spec: str, seed: int, objective: str) -> TargetModel:
    """The steps-to-target model: the user's runs (``efficiency.steps_to_target``), else the law with B_noise
    the workload's, from the config, or measured over warm-ups (:func:`_measured_target`). A workload that
    carries no B_noise has it measured, where the objective needs steps to target (not ``throughput``)."""
    from edgetune.config import WORKLOAD
    from edgetune.search.efficiency import TargetModel
    from edgetune.search.runs_target import RunsTarget, RunsTargetError

    if section.steps_to_target:
        try:
            runs = RunsTarget.from_csv(section.steps_to_target, workload.name)
        except RunsTargetError as exc:
            raise UsageError(f"efficiency.steps_to_target: {exc}") from None
        steps = ", ".join(f"b {b}: {m:.4g}" for b, m in runs.medians.items())
        print(f"steps to target from your runs ({section.steps_to_target}; median per batch size): {steps}",
              file=sys.stderr)
        return runs
    if not _measures_b_noise(section, workload, objective):
        if section.b_noise == WORKLOAD:
            return TargetModel.for_workload(workload, section.s_min)
        return TargetModel(section.s_min, section.b_noise, "config")
    return _measured_target(section, workload, spec, seed, fallback=section.b_noise == WORKLOAD)


def _measures_b_noise(section: EfficiencySection, workload, objective: str) -> bool:
    """Whether the search measures B_noise over warm-ups (:func:`_target`): asked to (``"measure"``), or for a
    workload that carries none where the objective needs steps to target; never beside the user's runs."""
    from edgetune.config import MEASURE, WORKLOAD

    if section.steps_to_target:
        return False
    return section.b_noise == MEASURE or (section.b_noise == WORKLOAD and workload.b_noise is None
                                          and objective != "throughput")


def _measured_target(section: EfficiencySection, workload, spec: str, seed: int, *, fallback: bool) -> TargetModel:
    """The law with B_noise measured from gradient norms: the median over ``section.b_noise_warmups`` warm-ups
    (the workload's own, then copies built from ``spec`` with the next seeds).

    ``fallback``: the default ``b_noise = "workload"`` for a workload that carries none. A measurement that
    fails then leaves :data:`~edgetune.search.efficiency.FALLBACK_B_NOISE`, with a line that says it decides
    the batch size; asked for (``b_noise = "measure"``), it is a :class:`UsageError`."""
    from edgetune.config import MEASURE
    from edgetune.search.efficiency import TargetModel, measure_b_noise_warmups
    from edgetune.workloads import WorkloadError, load_workload

    n = section.b_noise_warmups
    copies = (load_workload(spec, seed=seed + i).to(workload.device) for i in range(1, n))
    key = f"efficiency.b_noise = \"{MEASURE}\""
    # said before it runs: real training steps, minutes on an edge CPU for a large model, before any trial
    print(f"B_noise: measuring it from gradient norms: {n} warm-up(s) of {B_NOISE_STEPS} training steps of "
          f"{workload.name} at batch size {workload.default_batch_size}", file=sys.stderr)
    try:
        measured = measure_b_noise_warmups(itertools.chain([workload], copies), workload.default_batch_size,
                                           steps=B_NOISE_STEPS)
    except (ValueError, WorkloadError) as exc:
        if not fallback:
            raise UsageError(f"{key}: {exc}") from None
        problem = str(exc)
    else:
        value = measured.b_noise
        each = ", ".join(f"{v:.1f}" if v > 0 and math.isfinite(v) else "not positive" for v in measured.estimates)
        if value > 0 and math.isfinite(value):
            how = (f"measured from gradient norms: the median of {n} warm-up(s) of {B_NOISE_STEPS} steps, each on "
                   f"the workload built with the next seed" if n > 1 else
                   f"measured from gradient norms over {B_NOISE_STEPS} warm-up steps")
            if fallback:
                how = f"{workload.name} carries none; {how}"
            print(f"B_noise {how}: {value:.0f} samples (each warm-up: {each})", file=sys.stderr)
            return TargetModel(section.s_min, value, how)
        problem = (f"the gradient noise scale of {workload.name} was not positive in enough of {n} warm-ups of "
                   f"{B_NOISE_STEPS} steps ({each})")
    if not fallback:
        raise UsageError(f"{key}: {problem}; set efficiency.b_noise to a number of samples, or measure more "
                         f"warm-ups (efficiency.b_noise_warmups)")
    target = TargetModel.for_workload(workload, section.s_min)
    print(f"B_noise: {workload.name} carries none, and measuring it failed ({problem}): the fallback of "
          f"{target.b_noise:g} samples decides the batch size; set efficiency.b_noise (--b-noise) to your model's, "
          f"or give your runs to the target (--steps-to-target)", file=sys.stderr)
    return target


def _write_results(result: SearchResult, out: Path, *, reread=None, plots: bool = True) -> Written:
    """best.json, trials.csv and (``plots``) the PNGs of one view of the study in ``out``, under the folder's
    lock: the view ``reread`` takes then (the storage as it stands), else ``result`` where the folder holds no
    newer view (:func:`~edgetune.search.results.write_folder`)."""
    from edgetune.search.results import write_folder

    draw = None
    if plots:
        from edgetune.report import write_plots as draw

    def waiting() -> None:
        print(f"waiting for another worker writing its results to {out}/", file=sys.stderr)

    return write_folder(out, result, reread=reread, draw=draw, on_wait=waiting)


def _as_stored_now(own: SearchResult, now: SearchResult) -> SearchResult:
    """``now`` (the study as the storage holds it once the folder is locked) with this worker's stop reason,
    which says how many trials other workers of a fleet measured after this one stopped: "1 setting measured"
    beside a ``trials_measured`` of 5 read as a contradiction."""
    grown = len(now.measured) - len(own.measured)
    reason = own.stop_reason
    if grown > 0:
        reason = (f"{reason}; then {grown} more trial{'' if grown == 1 else 's'} measured by other workers "
                  f"of the study")
    return dataclasses.replace(now, stop_reason=reason)


def failure_summary(result: SearchResult) -> str | None:
    """When every measured setting failed: the most common cause and the first error; else None."""
    measured = sorted(result.measured, key=lambda r: r.number)
    if not measured or any(r.outcome is not None for r in measured):
        return None
    errors = [(r, "out of memory" if r.oom else (r.error or (r.measurement or {}).get("error") or "no error text"))
              for r in measured]
    causes = Counter("out of memory" if r.oom else text.split(":")[0].strip() for r, text in errors)
    cause, count = causes.most_common(1)[0]
    first, text = errors[0]
    hint = "; try smaller batch sizes (--batch-sizes)" if cause == "out of memory" else ""
    every = "the 1 measured setting" if len(measured) == 1 else f"every one of the {len(measured)} measured settings"
    return (f"{every} failed, none for the power budget: "
            f"{count} of {len(measured)} {cause}; first error (trial #{first.number}, "
            f"{first.candidate.describe(result.space.unit_of)}): {text}{hint}")


def _finish(written: Written, out: Path, cfg: Config) -> int:
    from edgetune.report import summary_table
    from edgetune.search.oracle import oracle_lines

    result, files = written.result, written.files
    print(summary_table(result, cfg.workload))
    for line in oracle_lines(result):  # on a trace: the gap to the table's own oracle
        print(line)
    if written.line:
        print(written.line)
    if files:
        print(f"wrote {', '.join(str(p) for p in files)}")
    if not cfg.search.storage:  # the default SQLite file: say how to browse it
        print(f"study: optuna-dashboard {cfg.storage_url()}  (study {result.study_name!r})")
    failed = failure_summary(result)
    if failed is not None:
        raise UsageError(f"{failed}; every trial is in {out / 'trials.csv'}")
    if result.best is None:
        print(f"no measured setting held the budget of {result.budget_w:g} W: raise the budget, allow lower "
              f"knob values, or smaller batch sizes")
        return 1
    return 0
