"""The INA3221 power rails of a Jetson (hwmon and iio layouts) and their update period."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetune.power.base import DERIVED_PREFIX, DeviceError, PowerReading
from edgetune.power.clock import Clock, RealClock
from edgetune.power.sysfs import FastReader, open_reader, read_int, read_knob_text, read_text

__all__ = [
    "COMBINED_RAILS",
    "DEFAULT_DETECT_S",
    "DEFAULT_UPDATE_PERIOD_S",
    "INPUT_RAILS",
    "UNREADABLE_LABELS",
    "JetsonPowerSensor",
    "Rail",
    "find_rails",
    "measure_update_period",
    "median_change_gap",
    "unlabelled_notes",
]

#: Board input rails, the figure a power budget is about, in order of preference.
INPUT_RAILS = ("VDD_IN", "POM_5V_IN")
#: Rails that feed several engines at once; reported with a note so nobody reads them as GPU-only.
COMBINED_RAILS = {"VDD_CPU_GPU_CV": "CPU, GPU and CV engines together (not the GPU alone)"}
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
#: The fix for a rail file that is gone or reads nonsense when the board is opened.
RAIL_FIX = "check that the ina3221 driver is loaded (the board's power monitor)"
#: Labels that name no rail (compared without case): what a label file reads where the driver could not give the
#: channel its device-tree name. Such a channel with live files is an unlabelled rail, not an unconnected one
#: (``NC``): it is named by its channel (``in1@1-0040``), never given a guessed name, and said in the notes, since
#: it may be the board input rail that a total is about (:func:`unlabelled_notes`)
UNREADABLE_LABELS = ("", "N/A")
#: The INA3221 files: mV and mA (hwmon), mW (iio).
_MILLI_PER_UNIT = 1e3
_MICRO_PER_UNIT = 1e6


@dataclass
class Rail:
    """One INA3221 channel: name and the open files its power is read from."""

    name: str
    voltage: FastReader | None = None  # mV
    current: FastReader | None = None  # mA
    power: FastReader | None = None  # mW (iio layout): one read instead of two
    #: an unlabelled channel's label file, and what it read (:data:`UNREADABLE_LABELS`); None: a named rail
    label_file: Path | None = None
    label_read: str = ""

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


def _unlabelled(label: str) -> bool:
    """Whether a label names no rail (:data:`UNREADABLE_LABELS`)."""
    return label.strip().casefold() in {u.casefold() for u in UNREADABLE_LABELS}


def _skip_channel(label: str) -> bool:
    """An unconnected channel (``NC``) or the sum channel (``sum of shunt voltages``)."""
    tokens = re.split(r"[^A-Za-z0-9]+", label)
    return "NC" in tokens or "sum" in label.lower()


def _unlabelled_rail(label: str, label_file: Path, name: str, files: tuple[Path, ...]) -> Rail | None:
    """An unlabelled channel as a rail named ``name`` (its channel), or None where its reading files are not
    there (no reading: nothing a total could miss)."""
    if not any(f.exists() for f in files):
        return None
    rail = _rail(name, files)
    rail.label_file, rail.label_read = label_file, label
    return rail


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


def _rail(label: str, files: tuple[Path, ...]) -> Rail:
    """The rail ``label`` read from ``files``: (mW,) or (mV, mA), each checked by
    :func:`~edgetune.power.sysfs.open_reader` (a rail that does not read now refuses the board in one line)."""
    readers: list[FastReader] = []
    try:
        for f in files:
            readers.append(open_reader(f, f"power rail {label}", RAIL_FIX))
    except DeviceError:
        for r in readers:
            r.close()
        raise
    if len(readers) == 1:
        return Rail(label, power=readers[0])
    return Rail(label, voltage=readers[0], current=readers[1])


def find_rails(root: Path) -> list[Rail]:
    """Every connected INA3221 channel under ``root``, hwmon layout first, then iio; opened for reading.

    A channel is connected where its label names a rail (not ``NC``, not a sum); its files must then read a
    number now, or the board is refused in one line (:func:`_rail`). A channel whose label names no rail
    (:data:`UNREADABLE_LABELS`) but whose reading files are there is an unlabelled rail, named by its channel
    and monitor (``in1@1-0040``; iio: ``channel0@6-0040``) and marked (:attr:`Rail.label_file`).
    """
    rails: list[Rail] = []
    seen: set[str] = set()
    try:
        for hw in _hwmon_dirs(root):
            for label_file in sorted(hw.glob("in*_label"), key=lambda p: int(re.sub(r"\D", "", p.name) or 0)):
                k = re.sub(r"\D", "", label_file.name)
                label = read_knob_text(label_file, f"power rail in{k}", RAIL_FIX)
                files = (hw / f"in{k}_input", hw / f"curr{k}_input")
                if _unlabelled(label):  # the monitor's device (1-0040) tells two INA3221s' channels apart
                    rail = _unlabelled_rail(label, label_file, f"in{k}@{hw.parent.parent.name}", files)
                    rails += [rail] if rail is not None else []
                    continue
                if _skip_channel(label) or label in seen:
                    continue
                seen.add(label)
                rails.append(_rail(label, files))
        for dev in sorted((root / "sys/bus/i2c/drivers/ina3221x").glob("*/iio:device*")):
            for name_file in sorted(dev.glob("rail_name_*")):
                k = name_file.name.rsplit("_", 1)[1]
                label = read_knob_text(name_file, f"power rail channel {k}", RAIL_FIX)
                power, volt, curr = (dev / f"in_power{k}_input", dev / f"in_voltage{k}_input",
                                     dev / f"in_current{k}_input")
                # JetPack 4's driver has the power file; without it, voltage times current
                files = (power,) if power.exists() or not volt.exists() else (volt, curr)
                if _unlabelled(label):
                    rail = _unlabelled_rail(label, name_file, f"channel{k}@{dev.parent.name}", files)
                    rails += [rail] if rail is not None else []
                    continue
                if _skip_channel(label) or label in seen:
                    continue
                rails.append(_rail(label, files))
                seen.add(label)
    except DeviceError:
        for r in rails:
            r.close()
        raise
    return rails


def unlabelled_notes(rails: Sequence[Rail], total_label: str) -> list[str]:
    """One note per unlabelled rail (:attr:`Rail.label_file`): the file, what it read, and what it does to the
    total ``total_label``. Where no labelled input rail was found the total is derived from every rail, this one
    included: it may be the input rail itself, whose label is what could not be read, and then the total reads
    high (counting the module's rails twice), never low; where one was, the total is that rail."""
    notes = []
    derived = total_label.startswith(DERIVED_PREFIX)
    for rail in rails:
        if rail.label_file is None:
            continue
        read = f"reads {rail.label_read!r}" if rail.label_read else "is empty"
        effect = ("the board input rail cannot be told apart, so the total is derived, the sum of every rail with "
                  "this one (high if this is the input)" if derived else
                  f"shown by its channel; the total is the input rail {total_label}")
        notes.append(f"power rail {rail.name} has no name ({rail.label_file} {read}): {effect}; check the ina3221 "
                     f"driver and its device-tree labels")
    return notes


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
            self.total_label = DERIVED_PREFIX + " + ".join(self.rails)

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
