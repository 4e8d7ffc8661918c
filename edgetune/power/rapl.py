"""x86 CPUs through RAPL (Intel, and AMD Zen through the same powercap interface) and cpufreq.

Power comes from the powercap energy counters, ``/sys/class/powercap/intel-rapl:<P>/energy_uj`` for each
package and its ``dram`` sub-zone where the platform has one. The counters wrap at
``max_energy_range_uj`` (tens of minutes at full load on a server package); every read unwraps them, so
power (energy delta over time delta between reads) and the cumulative energy stay right across wraps.
``core``/``uncore`` sub-zones are parts of the package and ``psys`` covers the whole platform: they are
not added, so the total (packages + DRAM) counts nothing twice. Where a package has several dies the kernel
makes a zone per die (``package-0-die-1``); each counts, with its DRAM as ``dram-0-die-1``.

Knob: ``cpu_freq`` (kHz) through the cpufreq policies, shared with the Jetson backend. Since Linux 5.10
``energy_uj`` is readable by root only (CVE-2020-8694): without it the backend says so in one line.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetune.power.base import DERIVED_PREFIX, Capability, Device, DeviceError, PowerReading, WorkloadCost
from edgetune.power.clock import RealClock
from edgetune.power.registry import PlatformProbe
from edgetune.power.state import DeviceIdentity, StateTracker
from edgetune.power.sysfs import (
    ROOT_FIX,
    FastReader,
    cpu_freq_knob,
    find_cpufreq_policies,
    open_reader,
    read_knob,
    read_text,
    sysfs_root,
)

__all__ = ["RaplSensor", "RaplZone", "find_zones", "open", "probe"]

#: RAPL updates its counters about every millisecond; the monitor samples at up to 100 Hz.
RAPL_UPDATE_PERIOD_S = 0.001
#: Reads closer together than this reuse the last power figure: one counter update is too coarse a delta.
MIN_INTERVAL_S = 0.002
#: energy_uj counts microjoules.
_UJ_PER_J = 1e6
#: The way out of a RAPL file that is gone or reads nonsense.
DRIVER_FIX = "check that the RAPL driver is loaded (`sudo modprobe intel_rapl_msr`; `edgetune devices` lists it)"
READ_FIX = ("energy_uj is root-only since Linux 5.10; run edgetune as root, or allow reading with "
            "`sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj /sys/class/powercap/intel-rapl:*:*/energy_uj`")


@dataclass
class RaplZone:
    """One counted zone: ``package-0`` or ``dram-0``."""

    name: str
    path: Path
    max_range_uj: int
    counter: FastReader | None = None


def find_zones(root: Path) -> list[RaplZone]:
    """Package zones and their DRAM sub-zones under the powercap tree, in package order. A zone's
    ``max_energy_range_uj`` that cannot be read is a one-line :class:`DeviceError` naming it."""
    base = root / "sys/class/powercap"
    zones: list[RaplZone] = []
    for pkg in sorted(base.glob("intel-rapl:[0-9]*"), key=lambda p: [int(x) for x in re.findall(r"\d+", p.name)]):
        parts = pkg.name.split(":")
        if len(parts) != 2:
            continue  # sub-zones are visited under their package
        try:
            name = read_text(pkg / "name")
        except OSError:
            continue
        if not name.startswith("package"):
            continue  # psys: the whole platform, would count the packages twice
        index = name.removeprefix("package-")  # "0", or "0-die-1" where a package has several dies
        zones.append(RaplZone(name, pkg, read_knob(pkg / "max_energy_range_uj", f"RAPL {name}", DRIVER_FIX)))
        for sub in sorted(pkg.glob(f"{pkg.name}:[0-9]*")):
            try:
                if read_text(sub / "name") == "dram":
                    zones.append(RaplZone(f"dram-{index}", sub, read_knob(sub / "max_energy_range_uj",
                                                                          f"RAPL dram-{index}", DRIVER_FIX)))
            except OSError:
                continue
    return zones


class RaplSensor:
    """Package and DRAM power from energy counter deltas, unwrapped; a cumulative energy counter."""

    update_period_s = RAPL_UPDATE_PERIOD_S
    period_source = "RAPL counter update interval"

    def __init__(self, zones: list[RaplZone], clock: RealClock | None = None) -> None:
        self._zones = zones
        self._clock = clock or RealClock()
        self.rails = tuple(z.name for z in zones)
        self.total_label = DERIVED_PREFIX + " + ".join(self.rails)
        self._lock = threading.Lock()
        try:  # each counter must read now: a zone whose every read fails would read 0 W
            for z in zones:
                z.counter = open_reader(z.path / "energy_uj", f"RAPL {z.name}", DRIVER_FIX)
        except DeviceError:
            self.close()
            raise
        self._last_raw = [z.counter.read_int() for z in zones]  # type: ignore[union-attr]
        self._total_uj = [0] * len(zones)  # unwrapped energy since open
        self._last_t = self._clock.now()
        self._base_t = self._last_t
        self._base_uj = list(self._total_uj)
        self._last_power = [0.0] * len(zones)

    def _advance(self) -> float:
        """Read every counter once, adding the unwrapped deltas. Returns the read time."""
        t = self._clock.now()
        for i, z in enumerate(self._zones):
            raw = z.counter.read_int()  # type: ignore[union-attr]
            if raw > z.max_range_uj:
                raise ValueError(f"{z.path / 'energy_uj'}: {raw} exceeds max_energy_range_uj {z.max_range_uj}")
            delta = raw - self._last_raw[i]
            if delta < 0:  # wrapped past max_energy_range_uj back to 0
                delta += z.max_range_uj + 1
            self._total_uj[i] += delta
            self._last_raw[i] = raw
        self._last_t = t
        return t

    def read(self) -> PowerReading:
        with self._lock:
            t = self._advance()
            dt = t - self._base_t
            if dt >= MIN_INTERVAL_S:
                self._last_power = [(e - b) / _UJ_PER_J / dt for e, b in zip(self._total_uj, self._base_uj)]
                self._base_t, self._base_uj = t, list(self._total_uj)
            rails = dict(zip(self.rails, self._last_power))
        return PowerReading(t, sum(rails.values()), rails)

    def energy_j(self) -> float | None:
        with self._lock:
            self._advance()
            return sum(self._total_uj) / _UJ_PER_J

    def close(self) -> None:
        for z in self._zones:
            if z.counter is not None:
                z.counter.close()


def _cpu_model(root: Path) -> str:
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", (root / "proc/cpuinfo").read_text(errors="replace"), re.MULTILINE)
    except OSError:
        return "x86 CPU"
    return m.group(1).strip() if m else "x86 CPU"


def _unreadable(zones: list[RaplZone]) -> list[RaplZone]:
    """The zones whose counter is there but this process may not read (root-only since Linux 5.10)."""
    return [z for z in zones if (z.path / "energy_uj").exists() and not os.access(z.path / "energy_uj", os.R_OK)]


def _run_step(fn: Callable[[], Any], batch_size: int, cost: WorkloadCost | None) -> Any:
    return fn()  # CPU work is done when fn returns


def open(arg: str = "", *, root: str | os.PathLike | None = None, **_other: Any) -> Device:
    """Open the CPU packages' RAPL counters and cpufreq policies under the sysfs root."""
    base = sysfs_root(root)
    zones = find_zones(base)
    if not zones:
        raise DeviceError(f"no RAPL package zones under {base}/sys/class/powercap; on Intel load the "
                          f"intel_rapl_common module (`sudo modprobe intel_rapl_msr`)")
    unreadable = _unreadable(zones)
    if unreadable:
        raise DeviceError(f"RAPL: cannot read {unreadable[0].path / 'energy_uj'}: {READ_FIX}")
    sensor = RaplSensor(zones)
    dies = [z.name.removeprefix("package-") for z in zones if z.name.startswith("package")]
    packages = len({d.split("-")[0] for d in dies})
    per_die = f", {len(dies)} dies" if len(dies) > packages else ""
    description = f"{_cpu_model(base)} ({packages} package(s){per_die}, RAPL)"
    tracker = StateTracker(DeviceIdentity("rapl", description, root=str(base.resolve())))
    knobs = {}
    missing: dict[str, str] = {}  # knobs left out, each with its note (Device.missing_knobs)
    notes = [f"total is packages + DRAM ({' + '.join(sensor.rails)}); core/uncore are inside the package"]
    policies = find_cpufreq_policies(base)
    if policies:
        knobs["cpu_freq"] = cpu_freq_knob(policies, tracker)
        driver_file = policies[0].path / "scaling_driver"
        try:  # for a note alone
            driver = read_text(driver_file)
        except OSError:
            driver = ""
        if driver in ("intel_pstate", "amd-pstate", "amd-pstate-epp"):
            notes.append(f"{driver} publishes no frequency table: cpu_freq offers 100 MHz steps")
    else:
        missing["cpu_freq"] = "no cpufreq policies: cpu_freq cannot be tuned"
        notes.append(missing["cpu_freq"])
    if not any(k.writable for k in knobs.values()):
        why = next(iter(knobs.values())).why_read_only if knobs else f"no knobs; {ROOT_FIX}"
        notes.append(f"measure-only: {why}; the search tunes batch size alone")

    def close() -> None:
        try:
            tracker.restore_all()
        finally:
            sensor.close()

    return Device(name="rapl", description=description, simulated=False, knobs=dict(knobs), sensor=sensor,
                  clock=RealClock(), run_step=_run_step, notes=notes, close=close, backend=sensor,
                  missing_knobs=missing,
                  capabilities=frozenset({Capability.ENERGY_COUNTER, Capability.WHOLE_MACHINE}))  # energy_uj: the counter


def probe(root: str | os.PathLike | None = None) -> list[PlatformProbe]:
    try:
        base = sysfs_root(root)
    except DeviceError as exc:
        return [PlatformProbe("rapl", False, summary=str(exc))]
    try:
        zones = find_zones(base)
    except DeviceError as exc:
        return [PlatformProbe("rapl", False, summary=str(exc))]
    if not zones:
        return [PlatformProbe("rapl", False, summary="no RAPL powercap zones")]
    if _unreadable(zones):
        return [PlatformProbe("rapl", False, summary=f"RAPL present but unreadable: {READ_FIX}")]
    try:
        RaplSensor(zones).close()  # every counter reads a number now
    except DeviceError as exc:
        return [PlatformProbe("rapl", False, summary=str(exc))]
    return [PlatformProbe("rapl", True, spec="rapl", summary=f"{_cpu_model(base)}: {', '.join(z.name for z in zones)}")]
