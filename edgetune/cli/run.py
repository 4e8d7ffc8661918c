"""``edgetune run``: train a workload at one setting and print what was measured.

    edgetune run --device sim:orin-nano --workload cnn --batch-size 32 --set gpu_freq=max --steps 200

Every knob is named as the device names it (``edgetune devices`` lists them) and takes a value in its unit,
with a unit suffix (``918MHz``), or ``min``/``max``. Knobs are restored when the run ends, however it ends.
On a simulated device every step runs the real training step unless ``--real-steps`` says fewer: the twin
times the steps from the workload's cost, so the figures are the same, and a run of a large model on a slow
CPU takes seconds instead of minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING

from edgetune.cli import UsageError, simulation_label
from edgetune.cli.flags import flag_help
from edgetune.config import SCHEMA
from edgetune.power.base import Device, format_value, wrong_unit

if TYPE_CHECKING:  # torch: imported by the commands that train, not by `edgetune --help`
    from edgetune.workloads import Placement, Workload

__all__ = ["parse_assignment", "place_workload", "positive_int", "register"]

DEFAULT_STEPS = 100  # measured steps: a window of seconds on a board, enough for the 1-s power average
DEFAULT_WARMUP_STEPS = 5  # steps before measuring: caches, allocator and the clock ramp settle
MAX_STEPS = 100_000  # MeasurementProtocol's cap on one window's steps (hours of steps on a board)




def positive_int(text: str) -> int:
    """argparse type: an integer > 0 (batch size, steps)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def seed_int(text: str) -> int:
    """argparse type for ``--seed``: a whole number the config's ``seed`` takes (0 up to its largest)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    try:
        return SCHEMA["seed"].check(value)
    except ValueError as exc:  # a negative or huge seed failed in numpy or torch, in a traceback
        raise argparse.ArgumentTypeError(str(exc)) from None


def real_steps_arg(text: str) -> int | None:
    """argparse type for ``--real-steps``: a whole number >= 0, or ``all`` (None)."""
    if text == "all":
        return None
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f'expected a whole number >= 0 or "all", got {text!r}') from None


def parse_assignment(text: str) -> tuple[str, str]:
    """argparse type for ``--set KNOB=VALUE``."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected KNOB=VALUE (e.g. gpu_freq=max), got {text!r}")
    return name.strip(), value.strip()


def steps_int(text: str) -> int:
    """argparse type for ``--steps``: a positive integer no larger than one measured window holds."""
    value = positive_int(text)
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(f"{value} is more steps than one measured window holds; use at most "
                                         f"{MAX_STEPS}")
    return value


def _check_unit(name: str, text: str, unit: str) -> None:
    """A value's unit suffix must be one of the knob's unit family (``408000000W`` for a clock is refused)."""
    why = wrong_unit(text, unit)
    if why is not None:
        raise UsageError(f"--set {name}={text}: {name} {why}")


def resolve_setting(device: Device, assignments: list[tuple[str, str]]) -> dict:
    """Turn ``--set`` pairs into knob values, with one-line errors naming the knobs that exist."""
    setting = {}
    given: dict[str, str] = {}
    for name, text in assignments:
        knob = device.knobs.get(name)
        if knob is None:
            known = ", ".join(device.knobs) or "none"
            raise UsageError(f"--set {name}: {device.name} has no knob {name!r}; knobs here: {known}")
        if name in given:
            raise UsageError(f"--set {name} is given twice ({name}={given[name]} and {name}={text}); keep one")
        given[name] = text
        if knob.numeric:
            _check_unit(name, text, knob.unit)
        setting[name] = knob.parse(text)
        if not knob.writable:
            raise UsageError(f"--set {name}: read-only on {device.name}: {knob.why_read_only or 'no permission'}")
    return setting


def seed_training(seed: int) -> None:
    """Seed torch's generators (the CPU's and every GPU's) with the run's seed before its first training step:
    what a model draws from them as it trains (dropout's masks, a random augmentation in ``forward``) is then
    the same in every run of one ``--seed``. torch seeds them at random in each process, and a workload's own
    generator feeds only its batches."""
    import torch

    torch.manual_seed(seed)


def place_workload(workload: Workload, requested: str, device: Device, source: str = "--torch-device") -> Placement:
    """Move ``workload`` to where it trains (:func:`edgetune.workloads.placement.place`) and return the
    :class:`~edgetune.workloads.placement.Placement`; a bad choice is one :class:`UsageError` line naming
    ``source`` (the flag, or the config file's key, that chose it)."""
    from edgetune.workloads import WorkloadError
    from edgetune.workloads.placement import place

    try:
        placed = place(requested, device.compute, device.name, simulated=device.simulated, source=source)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    workload.to(placed.torch_device)
    return placed


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="train a workload at one setting and print the measured step time, power and energy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # the flags `search` shares take their default and help from the config schema
    p.add_argument("--device", default=SCHEMA["device"].default, help=flag_help(SCHEMA["device"], name_key=False))
    p.add_argument("--workload", default=SCHEMA["workload"].default,
                   help=flag_help(SCHEMA["workload"], name_key=False))
    p.add_argument("--torch-device", default=SCHEMA["torch_device"].default,
                   help=flag_help(SCHEMA["torch_device"], name_key=False))
    p.add_argument("--batch-size", type=positive_int, help="samples per step (default: the workload's default)")
    p.add_argument("--set", dest="assignments", action="append", type=parse_assignment, default=[],
                   metavar="KNOB=VALUE", help="set a knob (repeatable): a value in its unit, with a unit, min or max")
    p.add_argument("--steps", type=steps_int, default=DEFAULT_STEPS,
                   help=f"measured training steps (default {DEFAULT_STEPS}; more where the power sensor reads a "
                        "short, regular step at only a few of its phases: the window then runs one sweep of them)")
    p.add_argument("--warmup", type=non_negative_int, default=DEFAULT_WARMUP_STEPS,
                   help=f"warm-up steps before measuring (default {DEFAULT_WARMUP_STEPS})")
    p.add_argument("--real-steps", type=real_steps_arg, default=None, metavar="N|all",
                   help="on a simulated device: how many measured steps run the real training step (the twin "
                        "times every step from the workload's cost, so the figures do not change; the warm-up "
                        "steps always run); default all")
    p.add_argument("--seed", type=seed_int, default=SCHEMA["seed"].default,
                   help=f"seed for the workload (its weights, its data and torch's generators as it trains, dropout's "
                        f"masks among them) and the simulated twin (default {SCHEMA['seed'].default})")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgetune.cli.progress import RunProgress
    from edgetune.power import PowerMonitor, open_device
    from edgetune.search.measurement import MeasurementProtocol
    from edgetune.search.trial import measure_setting
    from edgetune.workloads import WorkloadError, load_workload

    try:
        workload = load_workload(args.workload, seed=args.seed)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None
    seed_training(args.seed)
    batch_size = args.batch_size or workload.default_batch_size
    device = open_device(args.device, seed=args.seed)
    try:
        placed = place_workload(workload, args.torch_device, device)
        if placed.note:
            print(placed.note, file=sys.stderr)
        setting = resolve_setting(device, args.assignments)
        if args.real_steps is not None and not getattr(device.clock, "virtual", False):
            print(f"note: --real-steps is for simulated devices; on {device.name} every step runs the training "
                  f"step", file=sys.stderr)
        # `run` executes every step for real, also on the twin, unless --real-steps says fewer (the twin times
        # the rest); the window is exactly --steps long (no minimum duration)
        protocol = MeasurementProtocol(warmup_steps=args.warmup, measure_steps=args.steps, measure_s=0.0,
                                       real_steps=args.real_steps, max_steps=MAX_STEPS)
        with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
            # a bar on a terminal, a line per tenth of the steps elsewhere (logs, CI, nohup)
            with RunProgress(args.steps, f"{workload.name} b={batch_size} on {device.name}") as progress:
                m = measure_setting(device, workload, batch_size, setting, protocol, monitor, on_step=progress)
            final = device.settings()
    finally:
        device.close()
    if not m.ok:
        raise UsageError(f"{workload.name} at batch size {batch_size} on {device.name}: {m.error}"
                         + ("; try a smaller --batch-size" if m.oom else ""))
    report = {
        "device": device.name,
        "description": device.description,
        "simulated": device.simulated,
        "workload": workload.name,
        "torch_device": str(placed.torch_device),
        "batch_size": batch_size,
        "setting": final,
        "steps": m.steps,
        "real_steps": m.real_steps,  # of the measured steps, those that ran the training step (all on hardware)
        "warmup_steps": args.warmup,
        "step_time_s": m.step_time_s,
        "samples_per_s": m.samples_per_s,
        "mean_power_w": m.mean_power_w,
        "peak_power_w": m.peak_power_w,
        "max_avg_power_w": m.max_avg_power_w,
        "avg_window_s": m.avg_window_s,
        # a run shorter than the budget's window is judged on its mean: the measurement's span is the run's length
        "judged_span_s": m.judged_span_s,
        "energy_j": m.energy_j,
        "energy_per_sample_j": m.energy_per_sample_j,
        "duration_s": m.duration_s,
        "power_samples": m.samples,
        "dropped_samples": m.dropped,
        "loss": m.loss,
        "wall_s": m.wall_s,
    }
    if args.json:
        print(json.dumps(report, default=float))
        return 0
    print(_format_report(report, device))
    return 0


def _span_note(r: dict) -> str:
    """Why the maximum average is over another span than the budget's window (empty where it is not)."""
    span_s, window_s = r["judged_span_s"], r["avg_window_s"]
    if span_s > window_s:
        return f" (averaged over one sweep of the step's phases, not {window_s:g} s)"
    if span_s < window_s:
        return (f" (the mean of the whole run, shorter than the {window_s:g}-s window a budget is judged by; "
                f"more --steps measure that)")
    return ""


def _real_note(r: dict) -> str:
    """How many measured steps ran the training step, where fewer than all did (``--real-steps``)."""
    if r["real_steps"] >= r["steps"]:
        return ""
    return f" ({r['real_steps']} ran the training step, the twin timed the rest)"


def _format_report(r: dict, device: Device) -> str:
    label = simulation_label(r["simulated"])
    knobs = ", ".join(f"{n} {format_value(v, device.knobs[n].unit)}" for n, v in r["setting"].items())
    rows = [
        ("steps", f"{r['steps']} measured after {r['warmup_steps']} warm-up" + _real_note(r)),
        ("step time", f"{r['step_time_s'] * 1e3:.2f} ms"),
        ("samples/s", f"{r['samples_per_s']:.1f}"),
        ("mean power", f"{r['mean_power_w']:.2f} W"),
        ("peak power", f"{r['peak_power_w']:.2f} W"),
        (f"{r['judged_span_s']:.3g}-s avg max", f"{r['max_avg_power_w']:.2f} W" + _span_note(r)),
        ("energy", f"{r['energy_j']:.2f} J over {r['duration_s']:.2f} s"),
        ("energy/sample", f"{r['energy_per_sample_j'] * 1e3:.3f} mJ"),
        ("power samples", f"{r['power_samples']} ({r['dropped_samples']} dropped)"),
    ]
    if not math.isnan(r["loss"]):
        rows.append(("last loss", f"{r['loss']:.4f}"))
    trained = "" if r["simulated"] else f", trained on {r['torch_device']}"
    lines = [f"{label}{r['workload']} on {r['device']} ({r['description']}){trained}",
             f"batch size {r['batch_size']}; {knobs}"]
    lines += [f"  {k:<16}{v}" for k, v in rows]
    lines.append("knobs restored to their values before the run")
    return "\n".join(lines)
