"""``edgetune devices``, ``edgetune monitor`` and ``edgetune restore``: the hardware, seen from the shell.

* ``devices`` lists every platform found (Jetson through sysfs or the jtop service, NVML GPUs, RAPL, and
  the simulated twin's profiles) with its sensor (rails, what the total is, update period) and knobs (range
  in human units, writable or why not), and which one ``--device auto`` opens and why. ``--json`` prints
  the same as one JSON document.
* ``monitor`` prints live power per rail - like tegrastats, but at up to hundreds of Hz and with energy
  totals - optionally logs every sample to CSV, and ends (``--duration`` or Ctrl-C) with a summary:
  energy, mean, peak, maximum moving average over the budget window, dropped samples.
* ``restore`` writes back the knobs a killed run left changed (see :mod:`edgetune.power.state`).

The sysfs root comes from ``EDGETUNE_SYSFS_ROOT`` (default ``/``), so all three run against a copied tree.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any, TextIO

from edgetune.cli import UsageError, simulation_label
from edgetune.power import registry, state
from edgetune.power.base import Device, DeviceError, Knob, format_value
from edgetune.power.monitor import DEFAULT_RATE_HZ, PowerMonitor, energy_j

__all__ = ["describe_device", "register"]

#: the column a simulated device's samples carry in the --csv file, True on every row (best.json's key)
SIMULATED_COLUMN = "simulated"
PRINT_INTERVAL_S = 0.5  # one live line per half second: readable as it scrolls, fresh enough to watch a load
MAX_RATE_HZ = 10_000.0  # beyond this a Python loop cannot keep up; sensors update at most every ~1 ms anyway


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("devices", help="list the power hardware found, its sensors and knobs",
                              description="List every platform found (Jetson, NVML GPUs, RAPL, simulated "
                                          "twins) with its power sensor and knobs.")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.set_defaults(func=cmd_devices)

    p = subparsers.add_parser("monitor", help="print live power per rail and log it to CSV",
                              description="Print live board and per-rail power; Ctrl-C ends with a summary.")
    p.add_argument("--device", default="auto",
                   help="device spec: auto, jetson, jtop, nvml[:i], rapl, sim:<profile>")
    p.add_argument("--rate", type=float, default=None, metavar="HZ",
                   help=f"samples per second (default: {DEFAULT_RATE_HZ:g}, or the sensor's update rate where slower)")
    p.add_argument("--csv", default=None, metavar="FILE",
                   help="write every sample to this CSV file (a new one: an existing file is refused)")
    p.add_argument("--force", action="store_true", help="overwrite the --csv file if it exists")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.set_defaults(func=cmd_monitor)

    p = subparsers.add_parser("restore", help="restore knobs an interrupted run left changed",
                              description="Write back the original knob values recorded in the state "
                                          "files of runs that were killed before they could restore them. "
                                          "Exits 1 while any knob may still be changed, naming it; "
                                          "--defaults then puts every knob back to the platform's default.")
    p.add_argument("--defaults", action="store_true",
                   help="also put every knob back to the platform's documented default: devfreq and cpufreq "
                        "ranges from the available tables, all cores online, the default nvpmodel mode, NVML "
                        "clocks unlocked and the default power limit")
    p.add_argument("--device", default=None,
                   help="with --defaults: the device it resets (default: the one a damaged state file names, else "
                        "auto)")
    p.set_defaults(func=cmd_restore)


# ---------------------------------------------------------------------------------------------- devices


def _knob_range(knob: Knob) -> str:
    if not knob.numeric:
        return ", ".join(map(str, knob.values))
    if len(knob.values) == 1:
        return format_value(knob.values[0], knob.unit)
    return (f"{format_value(knob.min, knob.unit)} .. {format_value(knob.max, knob.unit)} "
            f"({len(knob.values)} steps)")


def _training(device: Device) -> dict[str, Any]:
    """Where ``edgetune search`` and ``run`` would train on ``device``, and why they could not (one line, or
    ``""``): a CPU build of torch on a GPU board says so here, before any search."""
    compute = device.compute
    if compute.torch_device == "cpu":
        return {"torch_device": "cpu", "problem": ""}
    try:
        from edgetune.workloads import WorkloadError, place  # torch: imported only for a GPU device
    except ImportError as exc:
        return {"torch_device": compute.torch_device, "problem": f"PyTorch does not import here: {exc}"}
    try:
        place("auto", compute, device.name, simulated=device.simulated)
    except WorkloadError as exc:
        return {"torch_device": compute.torch_device, "problem": str(exc)}
    return {"torch_device": compute.torch_device, "problem": ""}


def describe_device(device: Device) -> dict[str, Any]:
    """What ``devices`` shows for one opened device, as data."""
    sensor = device.sensor
    knobs = []
    for name, knob in device.knobs.items():
        try:
            current: Any = knob.read()
        except (OSError, ValueError, DeviceError) as exc:
            current = f"unreadable: {exc}"
        knobs.append({
            "name": name,
            "unit": knob.unit,
            "description": knob.description,
            "range": _knob_range(knob),
            "values": list(knob.values),
            "current": current,
            "writable": knob.writable,
            "why_read_only": "" if knob.writable else knob.why_read_only,
            "unavailable": {str(v): why for v, why in knob.unavailable.items()},
        })
    return {
        "spec": device.name,
        "description": device.description,
        "simulated": device.simulated,
        "measure_only": device.measure_only,
        "sensor": {
            "rails": list(sensor.rails),
            "total": sensor.total_label,
            "update_period_s": sensor.update_period_s,
            "update_period_source": getattr(sensor, "period_source", ""),
            "energy_counter": sensor.energy_j() is not None,
        },
        "knobs": knobs,
        "training": _training(device),
        "notes": list(device.notes),
    }


def _devices_report() -> dict[str, Any]:
    platforms = []
    probes = registry.probe_platforms()
    for found in probes:
        entry: dict[str, Any] = {"platform": found.platform, "found": found.found, "spec": found.spec,
                                 "summary": found.summary, "details": list(found.details)}
        if found.found and found.platform in registry.REAL_PLATFORMS:
            try:
                device = registry.open_device(found.spec)
            except DeviceError as exc:
                entry["error"] = str(exc)
            else:
                try:
                    entry["device"] = describe_device(device)
                finally:
                    device.close()
        platforms.append(entry)
    hardware = [p for p in platforms if p["found"] and p["platform"] in registry.REAL_PLATFORMS]
    sims = [p["spec"] for p in platforms if p["found"] and p["platform"] == "sim"]
    choice = registry.choose_auto(probes)
    auto = {"spec": choice.spec, "reason": choice.reason, "measure_only": choice.measure_only}
    return {"hardware_found": bool(hardware), "simulated": sims, "platforms": platforms, "auto": auto}


def _period(seconds: float) -> str:
    """``8 ms``, ``1 s``: a sensor's update period in the unit that reads best."""
    return f"{seconds:g} s" if seconds >= 1.0 else f"{seconds * 1e3:.3g} ms"


def _print_device(d: dict[str, Any]) -> None:
    s = d["sensor"]
    print(f"  {d['description']}")
    src = f", {s['update_period_source']}" if s.get("update_period_source") else ""
    print(f"    power: total = {s['total']}; rails: {', '.join(s['rails']) or 'none'}; "
          f"updates every {_period(s['update_period_s'])}{src}"
          + ("; hardware energy counter" if s["energy_counter"] else ""))
    for k in d["knobs"]:
        current = k["current"] if isinstance(k["current"], str) else format_value(k["current"], k["unit"])
        access = "writable" if k["writable"] else f"read-only: {k['why_read_only']}"
        print(f"    {k['name']:<11} {k['range']}; now {current}; {access}")
    if d["measure_only"]:
        print("    measure-only: no knob can be set here; the search tunes batch size alone")
    training = d["training"]
    if training["problem"]:
        print(f"    training: cannot run here: {training['problem']}")
    else:
        print(f"    training runs on: {training['torch_device']}")
    for note in d["notes"]:
        print(f"    note: {note}")


def cmd_devices(args: argparse.Namespace) -> int:
    report = _devices_report()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    for p in report["platforms"]:
        if p["platform"] == "sim" or p["platform"] == "trace":
            continue
        mark = "found" if p["found"] else "not found"
        print(f"{p['platform']}: {mark}" + (f" ({p['spec']})" if p["found"] and p["spec"] else "")
              + (f" - {p['summary']}" if not p["found"] and p["summary"] else ""))
        if "device" in p:
            _print_device(p["device"])
        elif "error" in p:
            print(f"  cannot open: {p['error']}")
    if not report["hardware_found"]:
        print("no power hardware found on this machine (no Jetson, jtop service, NVML GPU or RAPL package).")
    if report["simulated"]:
        print(f"simulated devices available: {', '.join(report['simulated'])}"
              + (" (the default when no hardware is found)" if not report["hardware_found"] else ""))
    print(f"--device auto opens {report['auto']['spec']}: {report['auto']['reason']}")
    return 0


# ---------------------------------------------------------------------------------------------- monitor


def _fmt_w(w: float) -> str:
    return f"{w:7.2f} W" if math.isfinite(w) else "    n/a"


def cmd_monitor(args: argparse.Namespace) -> int:
    if args.rate is not None and not (0 < args.rate <= MAX_RATE_HZ):
        raise UsageError(f"--rate {args.rate:g} is out of range; use a rate between 0 and {MAX_RATE_HZ:g} Hz")
    if args.duration is not None and not args.duration > 0:
        raise UsageError(f"--duration {args.duration:g} must be positive seconds")
    if args.force and not args.csv:
        raise UsageError("--force overwrites the --csv file, and no --csv is given; add --csv FILE, or drop --force")
    device = registry.open_device(args.device)
    try:
        return _monitor(device, args)
    finally:
        device.close()


def _open_samples_csv(path: str, force: bool) -> TextIO:
    """``path`` opened for the samples: a new file ("x"), so an earlier run's samples are refused, not
    truncated, unless ``force`` (raises :class:`UsageError`, one line)."""
    try:
        return open(path, "w" if force else "x", newline="")  # closed by the caller (_monitor's finally)
    except OSError as exc:
        if isinstance(exc, FileExistsError) and not os.path.isdir(path):
            raise UsageError(f"--csv {path} exists: edgetune never overwrites samples; give another path, or pass "
                             f"--force to overwrite it") from None
        what = "is a folder" if os.path.isdir(path) else (exc.strerror or str(exc)).lower()
        raise UsageError(f"--csv {path}: cannot write the samples there ({what}); give a file path in an "
                         f"existing folder") from None


def _monitor(device: Device, args: argparse.Namespace) -> int:
    sensor, clock = device.sensor, device.clock
    monitor = PowerMonitor(sensor, clock, rate_hz=args.rate)
    rails = list(sensor.rails)
    out = _open_samples_csv(args.csv, args.force) if args.csv else None
    writer = None
    marked = [True] if device.simulated else []  # a simulated device's samples say so on every row
    if out is not None:
        writer = csv.writer(out)
        writer.writerow(["t_s", "total_w", *[f"{r}_w" for r in rails]]
                        + ([SIMULATED_COLUMN] if device.simulated else []))
    label = simulation_label(device.simulated)
    sim = " (simulated)" if device.simulated and "simulated" not in device.description else ""
    update = _period(sensor.update_period_s)  # measured once, now, not in the middle of the run
    print(f"{label}monitoring {device.description}{sim}: total = {sensor.total_label}, {monitor.rate_hz:g} Hz "
          f"(sensor updates every {update})"
          + (f", logging to {args.csv}" if args.csv else "") + "; Ctrl-C to stop", flush=True)
    period = 1.0 / monitor.rate_hz
    t0 = clock.now()
    monitor.begin_window("monitor")
    next_due = t0 + period
    next_print = t0 + PRINT_INTERVAL_S
    energy = 0.0
    last: tuple[float, float] | None = None
    try:
        while True:
            reading = monitor.sample()
            if reading is not None:
                if last is not None and reading.t > last[0]:  # the running total, one trapezoid at a time
                    energy += energy_j((last[0], reading.t), (last[1], reading.total_w))
                last = (reading.t, reading.total_w)
                if writer is not None:
                    writer.writerow([f"{reading.t - t0:.4f}", f"{reading.total_w:.4f}",
                                     *[f"{reading.rails.get(r, math.nan):.4f}" for r in rails], *marked])
            now = clock.now()
            if now >= next_print:
                next_print += PRINT_INTERVAL_S
                latest = monitor.latest()
                if latest is not None:
                    parts = "  ".join(f"{r} {_fmt_w(latest.rails.get(r, math.nan)).strip()}" for r in rails)
                    stale = "  STALE: sensor not updating" if monitor.stale else ""
                    drop = f"  dropped {monitor.dropped}" if monitor.dropped else ""
                    print(f"{now - t0:7.1f} s  {parts}  | total {_fmt_w(latest.total_w).strip()}  "
                          f"{monitor.avg_window_s:g}-s avg {_fmt_w(monitor.moving_average()).strip()}  "
                          f"E {energy:.1f} J{drop}{stale}",
                          flush=True)
            if args.duration is not None and now - t0 >= args.duration:
                break
            delay = next_due - clock.now()
            next_due += period
            if delay > 0:
                if clock.virtual:
                    time.sleep(delay)  # pace the twin in real time so the display is watchable
                clock.sleep(delay)
            elif -delay > period:
                next_due = clock.now() + period
    except KeyboardInterrupt:
        print()
    finally:
        if out is not None:
            out.close()
    stats = monitor.end_window("monitor")
    print(f"{label}summary: {stats.duration_s:.2f} s, {stats.samples} samples, energy {stats.energy_j:.2f} J "
          f"({sensor.total_label}), mean {stats.mean_w:.2f} W, peak {stats.peak_w:.2f} W, "
          f"max {stats.avg_window_s:g}-s avg {stats.max_avg_w:.2f} W, dropped samples {stats.dropped}"
          + ("; sensor stale (values stopped changing)" if monitor.stale else ""))
    if stats.rail_energy_j:
        print("  per rail: " + ", ".join(f"{r} {e:.2f} J" for r, e in stats.rail_energy_j.items()))
    if stats.hardware_energy_j is not None:
        print(f"  hardware energy counter: {stats.hardware_energy_j:.2f} J")
    if monitor.dropped and monitor.last_error:
        print(f"  last bad read: {monitor.last_error}")
    return 0


# ---------------------------------------------------------------------------------------------- restore


def cmd_restore(args: argparse.Namespace) -> int:
    """Restore from the state files; exit 1 (naming the knobs) while any knob may still be changed."""
    if args.device is not None and not args.defaults:  # it would be ignored: the state files name their devices
        raise UsageError("--device names the device --defaults resets; without --defaults, restore puts back what "
                         "the state files recorded, on the devices they name: add --defaults, or drop --device")
    actions = state.recover_actions() if state.pending() else []
    for action in actions:
        print(action.message)
    unsettled = [a for a in actions if not a.settled]
    if args.defaults:
        specs = {a.spec for a in unsettled if a.spec}
        spec = args.device or (specs.pop() if len(specs) == 1 else "auto")
        return _reset_to_defaults(spec, unsettled)
    if not actions:
        print(f"nothing to restore: no state files in {state.state_dir()}" if not state.pending() else
              "nothing to restore: the state files belong to edgetune runs still in progress")
        return 0
    if not unsettled:
        return 0
    for a in unsettled:
        knobs = ", ".join(a.knobs) if a.knobs else "knobs the state file held (unknown)"
        where = a.spec or "this machine"
        device = f" --device {a.spec}" if a.spec else ""
        print(f"may still be changed on {where}: {knobs}; `edgetune restore --defaults{device}` puts every knob "
              f"back to the platform's default (a reboot does too)")
    return 1


def _reset_to_defaults(spec: str, unsettled: Sequence[state.RecoveryAction] = ()) -> int:
    """``restore --defaults``: every knob of ``spec`` back to its documented default; 1 if any could not be, or
    if a knob the state files say may still be changed on it is not there to reset (``unsettled``)."""
    device = registry.open_device(spec)
    try:
        changed = [name for a in unsettled if a.spec == device.name for name in a.knobs]
        done, problems = state.restore_defaults(device, changed)
    finally:
        device.close()
    if done:
        print(f"put back to the defaults of {device.name} ({device.description}): {', '.join(done)}")
    if problems:
        print(f"not reset on {device.name}: {'; '.join(problems)}")
        return 1
    if not done:
        print(f"{device.name} has no knob with a documented default: nothing to reset")
    return 0
