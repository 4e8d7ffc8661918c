"""The Jetson's knobs in sysfs: GPU devfreq, online cores, the EMC clock (BPMP debugfs), nvpmodel modes.

Each is a :class:`~edgetune.power.state.RestorableKnob` whose snapshot is the raw state found (a devfreq
``min_freq``/``max_freq`` pair, the online set, the EMC rate and lock, the nvpmodel mode id).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgetune.power.base import Knob, KnobValue, KnobWriteError, ModeCaps, largest_at_most
from edgetune.power.jetson.board import BoardInfo
from edgetune.power.knobs import knob_unit
from edgetune.power.state import RestorableKnob, StateTracker
from edgetune.power.sysfs import (
    ROOT_FIX,
    first_existing,
    is_root,
    lock_range,
    read_int,
    read_only_reason,
    read_text,
    writable,
    write_checked,
)

__all__ = ["EMC_STEPS_HZ", "GPU_OF_NODES", "cpu_cores_knob", "emc_knob", "find_gpu_devfreq", "mode_caps", "power_mode_knob",
           "range_knob"]

#: devfreq ``of_node`` names of Jetson GPUs (Maxwell/Pascal/Volta/Ampere/Blackwell) and Thor's generic one.
GPU_OF_NODES = ("gm20b", "gp10b", "gv11b", "ga10b", "gb10b", "gpu")
#: How long nvpmodel may take: a mode change reprograms clocks and cores, normally within seconds.
_NVPMODEL_TIMEOUT_S = 30
#: Characters of unreadable nvpmodel output shown in an error.
_SHOWN_CHARS = 60

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


def range_knob(name: str, values: tuple[int, ...], min_file: Path, max_file: Path,
                cur_file: Path, tracker: StateTracker, description: str) -> RestorableKnob:
    """A frequency locked by a (min, max) limit pair (devfreq); restored as the pair it found."""
    unit = knob_unit(name)

    def read() -> int:
        return read_int(cur_file)

    def write(value: int) -> None:
        current = (read_int(min_file), read_int(max_file))
        lock_range((min_file, max_file), current, (int(value), int(value)), name)

    def snapshot() -> dict[str, Any]:
        return {"min": read_int(min_file), "max": read_int(max_file)}

    def restore(snap: dict[str, Any]) -> None:
        lo, hi = int(snap["min"]), int(snap["max"])
        if not (0 <= lo <= hi <= values[-1]):
            raise ValueError(f"{name}: saved range {lo}..{hi} {unit} is not a valid range here "
                             f"(at most {values[-1]} {unit})")
        current = (read_int(min_file), read_int(max_file))
        lock_range((min_file, max_file), current, (lo, hi), name)

    files = [min_file, max_file]
    ok = all(writable(f) for f in files)
    return RestorableKnob(name, unit, values, read=read, write=write, writable=ok,
                          why_read_only="" if ok else read_only_reason(files), snapshot=snapshot,
                          restore_snapshot=restore, tracker=tracker, description=description,
                          default_snapshot=lambda: {"min": values[0], "max": values[-1]})  # the full table


def cpu_cores_knob(root: Path, tracker: StateTracker) -> RestorableKnob | None:
    base = root / "sys/devices/system/cpu"
    cpus = sorted(int(p.name[3:]) for p in base.glob("cpu[0-9]*") if p.name[3:].isdigit())
    if len(cpus) < 2:
        return None
    online_files = {c: base / f"cpu{c}/online" for c in cpus if c != 0 and (base / f"cpu{c}/online").exists()}
    if not online_files:
        return None

    def online() -> list[int]:
        return [0] + [c for c, f in online_files.items() if read_int(f) == 1]

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
    lo, hi = read_int(emc / "min_rate"), read_int(emc / "max_rate")
    steps = [f for f in EMC_STEPS_HZ.get(board.family, ()) if lo <= f <= hi]
    values = sorted({*steps, lo, hi}) if steps else sorted({lo, hi, read_int(rate)})

    def read() -> int:
        return read_int(rate)

    def write(value: int) -> None:
        write_checked(locked, 1, "emc_freq")
        write_checked(rate, int(value), "emc_freq")

    def snapshot() -> dict[str, Any]:
        return {"rate": read_int(rate), "locked": read_int(locked)}

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


_MODE_LINE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)")
_DEFAULT_MODE_LINE = re.compile(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)")


#: a POWER_MODEL block's frequency keys and the knob each caps (CPU clusters: CPU_A78_0, CPU_DENVER_1 ...)
_CAPPED = {"GPU": "gpu_freq", "EMC": "emc_freq", "CPU": "cpu_freq"}


def mode_caps(conf_text: str, knobs: Mapping[str, Knob]) -> dict[str, ModeCaps]:
    """What each nvpmodel mode does to the other knobs, read from ``nvpmodel.conf``'s POWER_MODEL blocks.

    Per mode: each clock's ``MAX_FREQ`` (Hz for GPU and EMC, kHz for CPU clusters; -1, or 0 for EMC, is no
    cap) and the count of ``CPU_ONLINE CORE_i 1`` lines, each as the largest value of that knob's table at
    or below it; the power-gating masks (``TPC_PG_MASK`` ...), a ``MIN_FREQ`` above a knob's lowest value and
    per-cluster CPU caps that differ go into :attr:`ModeCaps.fixed`, so that such modes are never taken for
    another. Lines outside a POWER_MODEL block (the PARAM definitions, with their own ``MAX_FREQ`` paths)
    are not read; a knob the board lacks is not capped. A mode whose block states no limit for a knob the
    board has (no ``MAX_FREQ`` line, no ``CPU_ONLINE`` lines) is left out: what it caps is unknown, and a
    search then treats its settings as its own.
    """
    blocks: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for raw in conf_text.splitlines():
        line = raw.strip()
        if line.startswith("<"):
            header = _MODE_LINE.match(line)
            current = blocks.setdefault(header.group(2), []) if header else None
        elif current is not None and line and not line.startswith("#"):
            current.append(line.split())
    caps: dict[str, ModeCaps] = {}
    for name, lines in blocks.items():
        highest: dict[str, list[float]] = {}
        fixed: dict[str, Any] = {}
        online = None
        for words in lines:
            if len(words) != 3:
                continue
            unit, key, value = words
            try:
                number = float(value)
            except ValueError:
                continue
            if unit == "CPU_ONLINE":
                online = (online or 0) + (number == 1)
            elif key.endswith("_PG_MASK"):
                fixed[key] = value
            elif key in ("MAX_FREQ", "MIN_FREQ") and unit.split("_")[0] in _CAPPED:
                knob = _CAPPED[unit.split("_")[0]]
                if knob not in knobs:
                    continue
                if key == "MAX_FREQ":
                    highest.setdefault(knob, []).append(number if number > 0 else float(knobs[knob].max))
                elif number > float(knobs[knob].min):
                    fixed[f"{unit}_MIN_FREQ"] = value
        max_values: dict[str, KnobValue] = {}
        for knob, limits in highest.items():
            if len(set(limits)) > 1:
                fixed[f"{knob}_caps"] = tuple(limits)
            max_values[knob] = largest_at_most(knobs[knob].values, max(limits))
        if online is not None and "cpu_cores" in knobs:
            max_values["cpu_cores"] = largest_at_most(knobs["cpu_cores"].values, online)
        if any(k in knobs and k not in max_values for k in (*_CAPPED.values(), "cpu_cores")):
            continue  # a block silent on a knob the board has: its cap is unknown, not absent
        caps[name] = ModeCaps(tuple(sorted(max_values.items())), tuple(sorted(fixed.items())))
    return caps


def power_mode_knob(root: Path, tracker: StateTracker, others: Mapping[str, Knob] | None = None
                    ) -> RestorableKnob | None:
    """The nvpmodel mode; with the board's other knobs, what each mode caps of them (:func:`mode_caps`)."""
    conf = first_existing(root / p for p in ("etc/nvpmodel.conf", "etc/nvpmodel/nvpmodel.conf"))
    binary = first_existing(root / p for p in ("usr/sbin/nvpmodel", "usr/bin/nvpmodel"))
    if conf is None or binary is None:
        return None
    modes = {int(i): name for i, name in _MODE_LINE.findall(conf.read_text(errors="replace"))}
    if not modes:
        return None
    by_name = {name: i for i, name in modes.items()}
    default = _DEFAULT_MODE_LINE.search(conf.read_text(errors="replace"))  # the mode L4T boots into
    default_id = int(default.group(1)) if default and int(default.group(1)) in modes else None
    status = root / "var/lib/nvpmodel/status"

    def run(*args: str) -> str:
        try:
            done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=_NVPMODEL_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KnobWriteError(f"power_mode: running {binary} failed: {exc}") from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise KnobWriteError(f"power_mode: nvpmodel {' '.join(args)} failed: {why[-1] if why else done.returncode}")
        return done.stdout

    def current_id() -> int:
        if status.exists():  # what nvpmodel itself keeps: "pmode:0002 fmode:..."
            m = re.search(r"pmode:(\d+)", status.read_text())
            if m:
                return int(m.group(1))
        out = run("-q")
        numbers = [int(x) for x in re.findall(r"^\s*(\d+)\s*$", out, re.MULTILINE)]
        if numbers:
            return numbers[-1]
        m = re.search(r"NV Power Mode:\s*(\S+)", out)
        if m and m.group(1) in by_name:
            return by_name[m.group(1)]
        raise KnobWriteError(f"power_mode: cannot read the current mode from nvpmodel -q: {out.strip()[:_SHOWN_CHARS]!r}")

    def read() -> str:
        return modes.get(current_id(), str(current_id()))

    def write(value: str) -> None:
        run("-m", str(by_name[str(value)]))

    def snapshot() -> dict[str, Any]:
        return {"mode_id": current_id()}

    def restore(snap: dict[str, Any]) -> None:
        mode = int(snap["mode_id"])
        if mode not in modes:
            raise ValueError(f"power_mode: saved mode id {mode} is not in {conf}")
        run("-m", str(mode))

    ok = is_root() and os.access(binary, os.X_OK)
    why = "" if ok else (f"nvpmodel needs root; {ROOT_FIX}" if not is_root() else f"{binary} is not executable")
    return RestorableKnob("power_mode", knob_unit("power_mode"), [modes[i] for i in sorted(modes)], read=read, write=write,
                          writable=ok, why_read_only=why, snapshot=snapshot, restore_snapshot=restore,
                          tracker=tracker, description="nvpmodel power mode (sets clock caps and cores)",
                          default_snapshot=None if default_id is None else lambda: {"mode_id": default_id},
                          caps=mode_caps(conf.read_text(errors="replace"), others or {}))

