"""The Jetson's knobs in sysfs: GPU devfreq, online cores, the EMC clock (BPMP debugfs); the nvpmodel mode is in
:mod:`~edgetune.power.jetson.nvpmodel`.

Each is a :class:`~edgetune.power.state.RestorableKnob` whose snapshot is the raw state found (a devfreq
``min_freq``/``max_freq`` pair, the online set, the EMC rate and lock).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgetune.power.base import format_value
from edgetune.power.jetson.board import BoardInfo
from edgetune.power.knobs import knob_unit
from edgetune.power.state import RestorableKnob, StateTracker
from edgetune.power.sysfs import (
    first_existing,
    knob_read_error,
    lock_range,
    parse_int,
    read_knob,
    read_knob_text,
    read_only_reason,
    read_text,
    writable,
    write_checked,
)

__all__ = ["EMC_STEPS_HZ", "GPU_OF_NODES", "cpu_cores_knob", "emc_knob", "find_gpu_devfreq",
           "frequency_table", "range_knob"]

#: devfreq ``of_node`` names of Jetson GPUs (Maxwell/Pascal/Volta/Ampere/Blackwell) and Thor's generic one.
GPU_OF_NODES = ("gm20b", "gp10b", "gv11b", "ga10b", "gb10b", "gpu")

# EMC clock steps (Hz), from NVIDIA's EMC tables as collected in the project's Jetson facts
# (emc_frequencies.csv). BPMP debugfs gives the range but not the steps; firmware rounds a request
# between steps to a neighbour, so these are the values worth offering.
EMC_STEPS_HZ = {
    "orin": (204_000_000, 665_600_000, 2_133_000_000, 3_199_000_000),
    "xavier": (204_000_000, 408_000_000, 600_000_000, 665_600_000, 800_000_000, 1_065_600_000,
               1_331_200_000, 1_600_000_000, 1_866_000_000, 2_133_000_000),
}


def find_gpu_devfreq(root: Path) -> Path | None:
    """The GPU's devfreq directory, found by its device-tree node name (generic across generations)."""
    for node in sorted((root / "sys/class/devfreq").glob("*")):
        try:
            name = read_text(node / "device/of_node/name")
        except OSError:
            name = ""
        if name in GPU_OF_NODES and (node / "available_frequencies").exists():
            return node
    # trees without /sys/class (copies made with plain cp): the known node paths of each generation
    known = ("sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
             "sys/devices/17000000.ga10b/devfreq/17000000.ga10b",
             "sys/devices/17000000.gv11b/devfreq/17000000.gv11b",
             "sys/devices/gpu.0/devfreq/57000000.gpu",
             "sys/devices/gpu.0/devfreq/17000000.gp10b")
    return first_existing(root / k for k in known if (root / k / "available_frequencies").exists())


def frequency_table(devfreq: Path, name: str) -> tuple[int, ...]:
    """A devfreq node's ``available_frequencies`` (Hz), ascending; a one-line :class:`DeviceError` naming the
    knob, the file and the fix where it cannot be read or lists anything but frequencies."""
    path = devfreq / "available_frequencies"
    text = read_knob_text(path, name)
    try:  # every word a number; an empty file is none
        values = [parse_int(w, path) for w in text.split()] or [parse_int(text, path)]
    except ValueError as exc:
        raise knob_read_error(path, name, exc) from None
    return tuple(sorted(set(values)))


def range_knob(name: str, values: tuple[int, ...], min_file: Path, max_file: Path,
                cur_file: Path, tracker: StateTracker, description: str) -> RestorableKnob:
    """A frequency locked by a (min, max) limit pair (devfreq); restored as the pair it found."""
    unit = knob_unit(name)

    def read() -> int:
        return read_knob(cur_file, name)

    def write(value: int) -> None:
        current = (read_knob(min_file, name), read_knob(max_file, name))
        lock_range((min_file, max_file), current, (int(value), int(value)), name)

    def snapshot() -> dict[str, Any]:
        return {"min": read_knob(min_file, name), "max": read_knob(max_file, name)}

    def restore(snap: dict[str, Any]) -> None:
        lo, hi = int(snap["min"]), int(snap["max"])
        if not (0 <= lo <= hi <= values[-1]):
            raise ValueError(f"{name}: saved range {lo}..{hi} {unit} is not a valid range here "
                             f"(at most {values[-1]} {unit})")
        current = (read_knob(min_file, name), read_knob(max_file, name))
        lock_range((min_file, max_file), current, (lo, hi), name)

    def describe(snap: dict[str, Any]) -> str:
        lo, hi = int(snap["min"]), int(snap["max"])
        if lo == hi:
            return f"{name} locked at {format_value(lo, unit)}"
        return f"{name} {format_value(lo, unit)}..{format_value(hi, unit)} (the governor's range)"

    files = [min_file, max_file]
    ok = all(writable(f) for f in files)
    return RestorableKnob(name, unit, values, read=read, write=write, writable=ok,
                          why_read_only="" if ok else read_only_reason(files), snapshot=snapshot,
                          restore_snapshot=restore, tracker=tracker, description=description,
                          default_snapshot=lambda: {"min": values[0], "max": values[-1]},  # the full table
                          describe_snapshot=describe)


def cpu_cores_knob(root: Path, tracker: StateTracker) -> RestorableKnob | None:
    base = root / "sys/devices/system/cpu"
    cpus = sorted(int(p.name[3:]) for p in base.glob("cpu[0-9]*") if p.name[3:].isdigit())
    if len(cpus) < 2:
        return None
    online_files = {c: base / f"cpu{c}/online" for c in cpus if c != 0 and (base / f"cpu{c}/online").exists()}
    if not online_files:
        return None

    def online() -> list[int]:
        return [0] + [c for c, f in online_files.items() if read_knob(f, "cpu_cores") == 1]

    def apply(wanted: set[int]) -> None:
        # bring CPUs online before taking others offline, so the load always has somewhere to run
        for c in sorted(online_files):
            if c in wanted:
                write_checked(online_files[c], 1, "cpu_cores")
        for c in sorted(online_files, reverse=True):
            if c not in wanted:
                write_checked(online_files[c], 0, "cpu_cores")

    def read() -> int:
        return len(online())

    def write(value: int) -> None:
        apply(set(cpus[: int(value)]))

    def snapshot() -> dict[str, Any]:
        return {"online": online()}

    def restore(snap: dict[str, Any]) -> None:
        wanted = {int(c) for c in snap["online"]}
        if 0 not in wanted or not wanted <= set(cpus):
            raise ValueError(f"cpu_cores: saved online set {sorted(wanted)} does not fit CPUs {cpus}")
        apply(wanted)

    files = list(online_files.values())
    ok = all(writable(f) for f in files)
    return RestorableKnob("cpu_cores", knob_unit("cpu_cores"), list(range(1, len(cpus) + 1)), read=read, write=write,
                          writable=ok, why_read_only="" if ok else read_only_reason(files),
                          snapshot=snapshot, restore_snapshot=restore, tracker=tracker,
                          description="online CPU cores (cpu0 always online)",
                          default_snapshot=lambda: {"online": list(cpus)})  # every core online


def emc_knob(root: Path, board: BoardInfo, tracker: StateTracker) -> RestorableKnob | None:
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    rate, locked = emc / "rate", emc / "mrq_rate_locked"
    if not (rate.exists() and locked.exists()):
        return None
    lo, hi = read_knob(emc / "min_rate", "emc_freq"), read_knob(emc / "max_rate", "emc_freq")
    steps = [f for f in EMC_STEPS_HZ.get(board.family, ()) if lo <= f <= hi]
    values = sorted({*steps, lo, hi}) if steps else sorted({lo, hi, read_knob(rate, "emc_freq")})

    def read() -> int:
        return read_knob(rate, "emc_freq")

    def write(value: int) -> None:
        write_checked(locked, 1, "emc_freq")
        write_checked(rate, int(value), "emc_freq")

    def snapshot() -> dict[str, Any]:
        return {"rate": read_knob(rate, "emc_freq"), "locked": read_knob(locked, "emc_freq")}

    def restore(snap: dict[str, Any]) -> None:
        r, was_locked = int(snap["rate"]), int(snap["locked"])
        if not (lo <= r <= hi) or was_locked not in (0, 1):
            raise ValueError(f"emc_freq: saved rate {r} Hz is outside {lo}..{hi} Hz")
        write_checked(rate, r, "emc_freq")
        write_checked(locked, was_locked, "emc_freq")

    files = [rate, locked]
    ok = all(writable(f) for f in files)
    return RestorableKnob("emc_freq", knob_unit("emc_freq"), values, read=read, write=write, writable=ok,
                          why_read_only="" if ok else read_only_reason(files), snapshot=snapshot,
                          restore_snapshot=restore, tracker=tracker,
                          description="memory (EMC) clock through BPMP debugfs",
                          # unlocked: the BPMP's own DVFS picks the rate again (at most max_rate)
                          default_snapshot=lambda: {"rate": hi, "locked": 0})
