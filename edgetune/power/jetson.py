"""NVIDIA Jetson boards: INA3221 power rails, GPU/CPU/EMC clocks, online cores and nvpmodel, from sysfs.

Everything is discovered under the sysfs root (``EDGETUNE_SYSFS_ROOT`` or ``root=``, default ``/``), so the
same code reads a live board and a copied or fake tree. Layouts handled (see the Jetson facts, sysfs.md):

* power rails - INA3221 in the hwmon layout of JetPack 5+ (``in<K>_label``, ``in<K>_input`` mV,
  ``curr<K>_input`` mA) and the iio layout of JetPack 4 (``rail_name_<K>``, ``in_voltage<K>_input``,
  ``in_current<K>_input``, ``in_power<K>_input`` mW); unconnected (``NC``) and sum channels are skipped.
  The board input rail (``VDD_IN``, ``POM_5V_IN``) is the total; where the board has none (AGX Orin
  monitors module rails only) the total is the sum of the rails, labelled ``derived: ...``.
* GPU clock - the devfreq node whose ``device/of_node/name`` is a Jetson GPU (``ga10b``, ``gv11b`` ...),
  locked by writing ``min_freq``/``max_freq`` in the order the kernel accepts.
* CPU clock - one ``cpu_freq`` knob (kHz) that locks every cpufreq policy (cluster) to the same step:
  Jetson clusters share one frequency table, and a per-cluster search space would multiply the trials
  for little gain. A policy whose table lacks the step gets its nearest step at or below it.
* online cores - ``cpu_cores``: CPUs 0..n-1 online, the rest offline (cpu0 never goes offline).
* memory clock - ``emc_freq`` through the BPMP debugfs (``mrq_rate_locked`` + ``rate``) where mounted.
* power mode - ``power_mode`` through the ``nvpmodel`` command (argument list, no shell), modes from
  ``/etc/nvpmodel.conf``.

Writes need root. Without it every knob is read-only with the fix in one line, and the device is in
measure-only mode (the search then tunes batch size alone).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.power.base import (
    Clock,
    Device,
    DeviceError,
    KnobWriteError,
    PowerReading,
    RealClock,
    WorkloadCost,
)
from edgetune.power.knobs import knob_unit
from edgetune.power.registry import PlatformProbe
from edgetune.power.state import DeviceIdentity, RestorableKnob, StateTracker
from edgetune.power.sysfs import (
    ROOT_FIX,
    FastReader,
    cpu_freq_knob,
    find_cpufreq_policies,
    first_existing,
    is_root,
    lock_range,
    read_int,
    read_only_reason,
    read_text,
    sysfs_root,
    writable,
    write_checked,
)

__all__ = [
    "BoardInfo",
    "JetsonPowerSensor",
    "Rail",
    "detect_board",
    "find_rails",
    "measure_update_period",
    "median_change_gap",
    "open",
    "probe",
]

#: Board input rails, the figure a power budget is about, in order of preference.
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
#: Rails that feed several engines at once; reported with a note so nobody reads them as GPU-only.
COMBINED_RAILS = {"VDD_CPU_GPU_CV": "CPU, GPU and CV engines together (not the GPU alone)"}
#: devfreq ``of_node`` names of Jetson GPUs (Maxwell/Pascal/Volta/Ampere/Blackwell) and Thor's generic one.
GPU_OF_NODES = ("gm20b", "gp10b", "gv11b", "ga10b", "gb10b", "gpu")
#: Update period assumed when it cannot be measured (a static tree, or no value changed while
#: sampling): 10 ms, between the INA3221 defaults of JetPack 4 and 5 (a few ms to a few tens of ms).
DEFAULT_UPDATE_PERIOD_S = 0.010
#: Default bound on the update-period measurement (it runs once, on first use).
DEFAULT_DETECT_S = 0.15
#: Polling interval of the update-period measurement: ~5 kHz, far above any INA3221 rate, yet cheap.
_DETECT_POLL_S = 0.0002
#: The measurement stops after this many value changes: seven gaps give a stable median.
_DETECT_MAX_CHANGES = 8
#: Fewer changes than this (two gaps) are no measurement: the values are static or barely move.
_DETECT_MIN_CHANGES = 3
#: The INA3221 files: mV and mA (hwmon), mW (iio).
_MILLI_PER_UNIT = 1e3
_MICRO_PER_UNIT = 1e6
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

# device-tree ``compatible`` part numbers -> module (NVIDIA's module data sheets)
MODULES = {
    "p3701-0000": "AGX Orin 32GB", "p3701-0004": "AGX Orin 32GB", "p3701-0005": "AGX Orin 64GB",
    "p3767-0000": "Orin NX 16GB", "p3767-0001": "Orin NX 8GB", "p3767-0003": "Orin Nano 8GB",
    "p3767-0004": "Orin Nano 4GB", "p3767-0005": "Orin Nano 8GB",
    "p3668-0000": "Xavier NX", "p3668-0001": "Xavier NX 16GB", "p2888-0001": "AGX Xavier 16GB",
    "p2888-0004": "AGX Xavier 32GB", "p2888-0006": "AGX Xavier 8GB", "p3448-0000": "Nano 4GB",
    "p3448-0002": "Nano 4GB (eMMC)", "p3448-0003": "Nano 2GB", "p3310-1000": "TX2",
}
JETPACK = {"32": "JetPack 4", "34": "JetPack 5", "35": "JetPack 5", "36": "JetPack 6", "38": "JetPack 7"}


# ---------------------------------------------------------------------------------------------- board


@dataclass(frozen=True)
class BoardInfo:
    """What the tree says the board is."""

    model: str = ""  # /proc/device-tree/model, e.g. "NVIDIA Jetson AGX Orin Developer Kit"
    module: str = ""  # from the compatible part number, e.g. "Orin Nano 8GB"
    l4t: str = ""  # e.g. "R36.3.0"
    jetpack: str = ""  # e.g. "JetPack 6"

    @property
    def family(self) -> str:
        text = f"{self.model} {self.module}".lower()
        for name in ("orin", "xavier", "thor", "nano", "tx2"):
            if name in text:
                return name
        return ""

    def describe(self) -> str:
        name = self.model or "NVIDIA Jetson (model unknown)"
        extra = ", ".join(x for x in (self.module, f"L4T {self.l4t}" if self.l4t else "", self.jetpack) if x)
        return f"{name} ({extra})" if extra else name


def detect_board(root: Path) -> BoardInfo:
    """Board model, module and software release from the device tree and ``/etc/nv_tegra_release``."""
    model = ""
    for rel in ("proc/device-tree/model", "sys/firmware/devicetree/base/model"):
        try:
            model = read_text(root / rel)
            break
        except OSError:
            continue
    module = ""
    for rel in ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible"):
        try:
            compatible = (root / rel).read_bytes().decode("ascii", "replace")
        except OSError:
            continue
        for part in re.findall(r"p\d{4}-\d{4}", compatible):
            if part in MODULES:
                module = MODULES[part]
                break
        break
    l4t = jetpack = ""
    try:
        release = read_text(root / "etc/nv_tegra_release")
        m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", release)
        if m:
            l4t = f"R{m.group(1)}.{m.group(2)}"
            jetpack = JETPACK.get(m.group(1), "")
    except OSError:
        pass
    return BoardInfo(model, module, l4t, jetpack)


# ---------------------------------------------------------------------------------------------- rails


@dataclass
class Rail:
    """One INA3221 channel: name and the open files its power is read from."""

    name: str
    voltage: FastReader | None = None  # mV
    current: FastReader | None = None  # mA
    power: FastReader | None = None  # mW (iio layout): one read instead of two

    def watts(self) -> float:
        if self.power is not None:
            return self.power.read_int() / _MILLI_PER_UNIT
        assert self.voltage is not None and self.current is not None
        return self.voltage.read_int() * self.current.read_int() / _MICRO_PER_UNIT

    def raw(self) -> tuple[int, ...]:
        readers = (self.power,) if self.power is not None else (self.voltage, self.current)
        return tuple(r.read_int() for r in readers if r is not None)

    def close(self) -> None:
        for r in (self.voltage, self.current, self.power):
            if r is not None:
                r.close()


def _skip_channel(label: str) -> bool:
    tokens = re.split(r"[^A-Za-z0-9]+", label)
    return not label or "NC" in tokens or "sum" in label.lower()


def _hwmon_dirs(root: Path) -> list[Path]:
    found: dict[str, Path] = {}
    candidates = []
    for name_file in (root / "sys/bus/i2c/devices").glob("*/name"):
        try:
            if "ina3221" in read_text(name_file):
                candidates.extend(name_file.parent.glob("hwmon/hwmon*"))
        except OSError:
            continue
    candidates.extend((root / "sys/bus/i2c/drivers/ina3221").glob("*/hwmon/hwmon*"))
    for path in candidates:
        found.setdefault(os.path.realpath(path), path)
    return [found[k] for k in sorted(found)]


def find_rails(root: Path) -> list[Rail]:
    """Every connected INA3221 channel under ``root``, hwmon layout first, then iio; opened for reading."""
    rails: list[Rail] = []
    seen: set[str] = set()
    for hw in _hwmon_dirs(root):
        for label_file in sorted(hw.glob("in*_label"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
            k = re.sub(r"\D", "", label_file.name)
            label = read_text(label_file)
            volt, curr = hw / f"in{k}_input", hw / f"curr{k}_input"
            if _skip_channel(label) or not volt.exists() or not curr.exists() or label in seen:
                continue
            seen.add(label)
            rails.append(Rail(label, voltage=FastReader(volt), current=FastReader(curr)))
    for dev in sorted((root / "sys/bus/i2c/drivers/ina3221x").glob("*/iio:device*")):
        for name_file in sorted(dev.glob("rail_name_*")):
            k = name_file.name.rsplit("_", 1)[1]
            label = read_text(name_file)
            if _skip_channel(label) or label in seen:
                continue
            power, volt, curr = (dev / f"in_power{k}_input", dev / f"in_voltage{k}_input",
                                 dev / f"in_current{k}_input")
            if power.exists():
                rails.append(Rail(label, power=FastReader(power)))
            elif volt.exists() and curr.exists():
                rails.append(Rail(label, voltage=FastReader(volt), current=FastReader(curr)))
            else:
                continue
            seen.add(label)
    return rails


def _hwmon_update_interval_s(root: Path) -> float | None:
    for hw in _hwmon_dirs(root):
        try:
            ms = read_int(hw / "update_interval")
        except (OSError, ValueError):
            continue
        if ms > 0:
            return ms / _MILLI_PER_UNIT
    return None


def measure_update_period(read_raw: Callable[[], Any], budget_s: float = DEFAULT_DETECT_S,
                          clock: Callable[[], float] = time.perf_counter,
                          sleep: Callable[[float], None] = time.sleep) -> float | None:
    """How often a sensor produces a new value: poll ``read_raw`` for at most ``budget_s`` of ``clock``
    time (``sleep`` between polls) and take the median time between changes (:func:`median_change_gap`).
    None when fewer than three changes were seen (static values) or a read failed."""
    if budget_s <= 0:
        return None
    try:
        return median_change_gap(_change_times(read_raw, budget_s, clock, sleep))
    except (OSError, ValueError):
        return None  # a bad read while measuring: fall back rather than fail the run


def _change_times(read_raw: Callable[[], Any], budget_s: float, clock: Callable[[], float],
                  sleep: Callable[[float], None]) -> list[float]:
    """Times at which ``read_raw`` returned a new value, polled for at most ``budget_s``."""
    start = clock()
    last = read_raw()
    changes: list[float] = []
    while clock() - start < budget_s and len(changes) < _DETECT_MAX_CHANGES:
        value = read_raw()
        if value != last:
            changes.append(clock())
            last = value
        sleep(_DETECT_POLL_S)
    return changes


def median_change_gap(change_times: Sequence[float]) -> float | None:
    """The median gap between successive value changes: the sensor's update period (a missed or a
    doubled change moves the median little). None for fewer than three changes."""
    if len(change_times) < _DETECT_MIN_CHANGES:
        return None
    gaps = sorted(b - a for a, b in itertools.pairwise(change_times))
    return gaps[len(gaps) // 2]


class JetsonPowerSensor:
    """Board total and per-rail power from INA3221 files kept open (``os.pread``: >1 kHz from Python).

    ``update_period_s`` is measured on first use (see :func:`measure_update_period`) on the sensor's clock;
    the hwmon ``update_interval`` attribute, where present, is the fallback, then
    :data:`DEFAULT_UPDATE_PERIOD_S`.
    """

    def __init__(self, rails: list[Rail], root: Path, clock: Clock | None = None,
                 detect_s: float = DEFAULT_DETECT_S) -> None:
        if not rails:
            raise DeviceError("no INA3221 power rails found; is this a Jetson with its power monitor enabled?")
        self._rails = rails
        self._root = root
        self._clock = clock or RealClock()
        self._detect_s = detect_s
        self._period: float | None = None
        self.period_source = ""
        self.rails = tuple(r.name for r in rails)
        self._input = next((r for name in INPUT_RAILS for r in rails if r.name == name), None)
        if self._input is not None:
            self.total_label = self._input.name
        else:
            self.total_label = "derived: " + " + ".join(self.rails)

    @property
    def update_period_s(self) -> float:
        if self._period is None:
            measured = measure_update_period(lambda: tuple(r.raw() for r in self._rails), self._detect_s,
                                             clock=self._clock.now, sleep=self._clock.sleep)
            if measured is not None:
                self._period, self.period_source = measured, "measured"
            else:
                interval = _hwmon_update_interval_s(self._root)
                if interval is not None:
                    self._period, self.period_source = interval, "hwmon update_interval"
                else:
                    self._period, self.period_source = DEFAULT_UPDATE_PERIOD_S, "default (values did not change)"
        return self._period

    def read(self) -> PowerReading:
        t = self._clock.now()
        rails = {r.name: r.watts() for r in self._rails}
        total = rails[self._input.name] if self._input is not None else sum(rails.values())
        return PowerReading(t, total, rails)

    def energy_j(self) -> float | None:
        return None  # the INA3221 keeps no energy counter: the monitor integrates

    def close(self) -> None:
        for r in self._rails:
            r.close()


# ---------------------------------------------------------------------------------------------- knobs


def _find_gpu_devfreq(root: Path) -> Path | None:
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


def _range_knob(name: str, values: tuple[int, ...], min_file: Path, max_file: Path,
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
                          restore_snapshot=restore, tracker=tracker, description=description)


def _cpu_cores_knob(root: Path, tracker: StateTracker) -> RestorableKnob | None:
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
                          description="online CPU cores (cpu0 always online)")


def _emc_knob(root: Path, board: BoardInfo, tracker: StateTracker) -> RestorableKnob | None:
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
                          description="memory (EMC) clock through BPMP debugfs")


_MODE_LINE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)")


def _power_mode_knob(root: Path, tracker: StateTracker) -> RestorableKnob | None:
    conf = first_existing(root / p for p in ("etc/nvpmodel.conf", "etc/nvpmodel/nvpmodel.conf"))
    binary = first_existing(root / p for p in ("usr/sbin/nvpmodel", "usr/bin/nvpmodel"))
    if conf is None or binary is None:
        return None
    modes = {int(i): name for i, name in _MODE_LINE.findall(conf.read_text(errors="replace"))}
    if not modes:
        return None
    by_name = {name: i for i, name in modes.items()}
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
                          tracker=tracker, description="nvpmodel power mode (sets clock caps and cores)")


# ---------------------------------------------------------------------------------------------- device


@dataclass
class JetsonBackend:
    """What :func:`open` found, kept on ``Device.backend`` for ``edgetune devices`` and tests."""

    root: Path
    board: BoardInfo
    sensor: JetsonPowerSensor
    gpu_devfreq: Path | None
    tracker: StateTracker
    paths: dict[str, str] = field(default_factory=dict)


def _run_step(fn: Callable[[], Any], batch_size: int, cost: WorkloadCost | None) -> Any:
    """Run one step and wait for the GPU to finish it (CUDA work is asynchronous)."""
    result = fn()
    torch = sys.modules.get("torch")  # only if the workload uses torch; never imported here
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
    return result


def _is_jetson(root: Path, board: BoardInfo) -> bool:
    return "jetson" in board.model.lower() or bool(board.l4t) or bool(board.module)


def open(arg: str = "", *, root: str | os.PathLike | None = None, detect_period_s: float = DEFAULT_DETECT_S,
         **_other: Any) -> Device:
    """Open the Jetson board under the sysfs root. ``arg`` is unused (one board per root)."""
    base = sysfs_root(root)
    board = detect_board(base)
    if not _is_jetson(base, board):
        raise DeviceError(f"no Jetson board under {base} (no /proc/device-tree/model naming a Jetson, no "
                          f"/etc/nv_tegra_release); use --device auto or sim:<profile>")
    rails = find_rails(base)
    if not rails:
        raise DeviceError(f"{board.describe()}: no INA3221 power rails under {base}/sys/bus/i2c; "
                          f"check that the ina3221 driver is loaded")
    sensor = JetsonPowerSensor(rails, base, detect_s=detect_period_s)
    identity = DeviceIdentity("jetson", board.describe(), root=str(base.resolve()))
    tracker = StateTracker(identity)
    knobs: dict[str, RestorableKnob] = {}
    notes: list[str] = []
    paths: dict[str, str] = {}

    gpu = _find_gpu_devfreq(base)
    if gpu is not None:
        table = tuple(sorted({int(v) for v in read_text(gpu / "available_frequencies").split()}))
        knobs["gpu_freq"] = _range_knob("gpu_freq", table, gpu / "min_freq", gpu / "max_freq",
                                        gpu / "cur_freq", tracker, f"GPU clock ({gpu.name} devfreq)")
        paths["gpu_freq"] = str(gpu)
    else:
        notes.append("no GPU devfreq node found: gpu_freq cannot be tuned")
    policies = find_cpufreq_policies(base)
    if policies:
        knobs["cpu_freq"] = cpu_freq_knob(policies, tracker)
        paths["cpu_freq"] = ", ".join(str(p.path) for p in policies)
    cores = _cpu_cores_knob(base, tracker)
    if cores is not None:
        knobs["cpu_cores"] = cores
    emc = _emc_knob(base, board, tracker)
    if emc is not None:
        knobs["emc_freq"] = emc
        paths["emc_freq"] = str(base / "sys/kernel/debug/bpmp/debug/clk/emc")
    elif board.family in ("orin", "xavier"):
        notes.append("emc_freq not tunable: BPMP debugfs not found; mount it with "
                     "`sudo mount -t debugfs none /sys/kernel/debug`")
    mode = _power_mode_knob(base, tracker)
    if mode is not None:
        knobs["power_mode"] = mode

    for rail in sensor.rails:
        if rail in COMBINED_RAILS:
            notes.append(f"{rail} is one rail for the {COMBINED_RAILS[rail]}")
    if not sensor.total_label.startswith("derived"):
        notes.append(f"board total is the input rail {sensor.total_label}")
    else:
        notes.append("no board input rail on this module: total is the sum of the monitored rails "
                     "(module side; the carrier board is not included)")
    if knobs and not any(k.writable for k in knobs.values()):
        why = next(iter(knobs.values())).why_read_only
        notes.append(f"measure-only: {why}; the search tunes batch size alone")

    backend = JetsonBackend(base, board, sensor, gpu, tracker, paths)

    def close() -> None:
        try:
            tracker.restore_all()
        finally:
            sensor.close()

    return Device(
        name="jetson",
        description=board.describe(),
        simulated=False,
        knobs=dict(knobs),
        sensor=sensor,
        clock=RealClock(),
        run_step=_run_step,
        notes=notes,
        close=close,
        backend=backend,
        capabilities=frozenset(),  # real clock, real steps; the INA3221 keeps no energy counter
    )


def probe(root: str | os.PathLike | None = None) -> list[PlatformProbe]:
    """Look for a Jetson under the sysfs root without changing anything."""
    try:
        base = sysfs_root(root)
    except DeviceError as exc:
        return [PlatformProbe("jetson", False, summary=str(exc))]
    board = detect_board(base)
    if not _is_jetson(base, board):
        return [PlatformProbe("jetson", False, summary=f"no Jetson board under {base}")]
    try:
        device = open(root=base, detect_period_s=0.0)
    except DeviceError as exc:
        return [PlatformProbe("jetson", False, summary=str(exc))]
    try:
        details = [f"rails: {', '.join(device.sensor.rails)}; total: {device.sensor.total_label}"]
        details += [f"{name}: {k.description}" for name, k in device.knobs.items()]
        return [PlatformProbe("jetson", True, spec="jetson", summary=device.description, details=details)]
    finally:
        device.close()
