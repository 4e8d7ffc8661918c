"""NVIDIA Jetson boards: INA3221 power rails, GPU/CPU/EMC clocks, online cores and nvpmodel, from sysfs.

Everything is discovered under the sysfs root (``EDGETUNE_SYSFS_ROOT`` or ``root=``, default ``/``), so the
same code reads a live board and a copied or fake tree. Layouts handled (see the Jetson facts, sysfs.md):

* power rails - INA3221 in the hwmon layout of JetPack 5+ (``in<K>_label``, ``in<K>_input`` mV,
  ``curr<K>_input`` mA) and the iio layout of JetPack 4 (``rail_name_<K>``, ``in_voltage<K>_input``,
  ``in_current<K>_input``, ``in_power<K>_input`` mW); unconnected (``NC``) and sum channels are skipped. A
  channel whose label names no rail (``N/A``, empty) but whose files read is named by its channel
  (``in1@1-0040``), never by a guessed rail, and said in the notes (it may be the input rail).
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
  ``/etc/nvpmodel.conf``: those the board switches to without a reboot (the same GPU power-gating mask as
  the one it booted with); the others are listed in the device's notes.

Writes need root. Without it every knob is read-only with the fix in one line, and the device is in
measure-only mode (the search then tunes batch size alone).

The package: :mod:`~edgetune.power.jetson.board` (which board), :mod:`~edgetune.power.jetson.rails` (the
INA3221 sensor and its update period), :mod:`~edgetune.power.jetson.knobs` (devfreq, cores, EMC),
:mod:`~edgetune.power.jetson.nvpmodel` (the power mode); this module opens the device (:func:`open`,
:func:`probe`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.power.base import Capability, ComputeDevice, Device, DeviceError, KnobWriteError
from edgetune.power.clock import RealClock
from edgetune.power.cuda_order import cuda_step_runner
from edgetune.power.jetson.board import JETPACK, MODULES, BoardInfo, detect_board
from edgetune.power.jetson.knobs import (
    EMC_STEPS_HZ,
    GPU_OF_NODES,
    cpu_cores_knob,
    emc_knob,
    find_gpu_devfreq,
    frequency_table,
    range_knob,
)
from edgetune.power.jetson.nvpmodel import power_mode_knob
from edgetune.power.jetson.rails import (
    COMBINED_RAILS,
    DEFAULT_DETECT_S,
    DEFAULT_UPDATE_PERIOD_S,
    INPUT_RAILS,
    JetsonPowerSensor,
    Rail,
    find_rails,
    measure_update_period,
    median_change_gap,
    unlabelled_notes,
)
from edgetune.power.jetson.thermal import board_temperature
from edgetune.power.registry import PlatformProbe
from edgetune.power.state import DeviceIdentity, RestorableKnob, StateTracker
from edgetune.power.sysfs import cpu_freq_knob, find_cpufreq_policies, sysfs_root

__all__ = [
    "COMBINED_RAILS",
    "DEFAULT_DETECT_S",
    "DEFAULT_UPDATE_PERIOD_S",
    "EMC_STEPS_HZ",
    "GPU_OF_NODES",
    "INPUT_RAILS",
    "JETPACK",
    "MODULES",
    "BoardInfo",
    "DeviceError",
    "JetsonBackend",
    "JetsonPowerSensor",
    "KnobWriteError",
    "Rail",
    "detect_board",
    "find_rails",
    "measure_update_period",
    "median_change_gap",
    "open",
    "probe",
]


@dataclass
class JetsonBackend:
    """What :func:`open` found, kept on ``Device.backend`` for ``edgetune devices`` and tests."""

    root: Path
    board: BoardInfo
    sensor: JetsonPowerSensor
    gpu_devfreq: Path | None
    tracker: StateTracker
    paths: dict[str, str] = field(default_factory=dict)


#: the module's integrated GPU: the one CUDA device of a Jetson
JETSON_COMPUTE = ComputeDevice("cuda:0")


#: a step is done once the module's GPU (``cuda:0``) has finished it
_run_step = cuda_step_runner(0)


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
    missing: dict[str, str] = {}  # knobs left out, each with its note (Device.missing_knobs)
    paths: dict[str, str] = {}

    def left_out(name: str, note: str) -> None:
        missing[name] = note
        notes.append(note)

    gpu = find_gpu_devfreq(base)
    if gpu is not None:
        table = frequency_table(gpu, "gpu_freq")
        knobs["gpu_freq"] = range_knob("gpu_freq", table, gpu / "min_freq", gpu / "max_freq",
                                        gpu / "cur_freq", tracker, f"GPU clock ({gpu.name} devfreq)")
        paths["gpu_freq"] = str(gpu)
    else:
        left_out("gpu_freq", "no GPU devfreq node found: gpu_freq cannot be tuned")
    policies = find_cpufreq_policies(base)
    if policies:
        knobs["cpu_freq"] = cpu_freq_knob(policies, tracker)
        paths["cpu_freq"] = ", ".join(str(p.path) for p in policies)
    cores = cpu_cores_knob(base, tracker)
    if cores is not None:
        knobs["cpu_cores"] = cores
    emc = emc_knob(base, board, tracker)
    if emc is not None:
        knobs["emc_freq"] = emc
        paths["emc_freq"] = str(base / "sys/kernel/debug/bpmp/debug/clk/emc")
    elif board.family in ("orin", "xavier"):
        left_out("emc_freq", "emc_freq not tunable: BPMP debugfs not found; mount it with "
                             "`sudo mount -t debugfs none /sys/kernel/debug`")
    mode, mode_notes = power_mode_knob(base, tracker, knobs, gpu)
    if mode is not None:
        knobs["power_mode"] = mode
        notes += mode_notes
    elif mode_notes:  # nvpmodel.conf gone or listing no mode, or half of nvpmodel: why it is left out
        left_out("power_mode", "; ".join(mode_notes))

    for rail in sensor.rails:
        if rail in COMBINED_RAILS:
            notes.append(f"{rail} is one rail for the {COMBINED_RAILS[rail]}")
    unlabelled = unlabelled_notes(rails, sensor.total_label)  # a label that names no rail: said, never guessed
    notes += unlabelled
    if not sensor.total_label.startswith("derived"):
        notes.append(f"board total is the input rail {sensor.total_label}")
    elif not unlabelled:
        notes.append("no board input rail on this module: total is the sum of the monitored rails "
                     "(module side; the carrier board is not included)")
    if knobs and not any(k.writable for k in knobs.values()):
        why = next(iter(knobs.values())).why_read_only
        notes.append(f"measure-only: {why}; the search tunes batch size alone")

    backend = JetsonBackend(base, board, sensor, gpu, tracker, paths)
    temperature, temperature_note = board_temperature(base)  # optional: a note, never an error
    if temperature_note:
        notes.append(temperature_note)

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
        temperature=temperature or (lambda: None),
        notes=notes,
        close=close,
        backend=backend,
        capabilities=frozenset({Capability.WHOLE_MACHINE}),  # the INA3221 keeps no energy counter
        compute=JETSON_COMPUTE,
        missing_knobs=missing,
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
