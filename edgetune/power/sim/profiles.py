"""The twin's Jetson modules: published facts, knob tables, nvpmodel modes, rails and model constants.

Every number is data in ``edgetune/power/profiles/`` (CSV tables with their sources in ``SOURCES.md``);
this module only loads it into frozen dataclasses: :data:`PROFILES` maps a profile name (``orin-nano``)
to its :class:`Profile`.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from edgetune.power.base import DERIVED_PREFIX, DeviceError

__all__ = [
    "DEFAULT_PROFILE",
    "GIB",
    "MIB",
    "PROFILES",
    "TRANSFERS_PER_CLOCK",
    "Calibration",
    "PowerMode",
    "Profile",
    "RailLayout",
]

#: The embedded default module (``sim`` with no profile): the Orin Nano 8GB.
DEFAULT_PROFILE = "orin-nano"
#: Bytes per GiB / MiB (binary units, as torch's memory messages use them).
GIB = 1024**3
MIB = 1024**2
#: DRAM transfers per memory-controller clock: LPDDR4x/LPDDR5 are double data rate.
TRANSFERS_PER_CLOCK = 2.0
#: Bytes per GB (decimal, as NVIDIA's data sheets give memory size and bandwidth).
_BYTES_PER_GB = 1e9

# the profile data's package and folder (the CSV and MD files stay beside the platform modules)
_DATA_PACKAGE = "edgetune.power"
_DATA_FOLDER = "profiles"


@dataclass(frozen=True)
class PowerMode:
    """One nvpmodel mode and the caps it applies.

    Attributes:
        name: as ``nvpmodel -q`` prints it (``15W``, ``MAXN``, ``MODE_30W``).
        mode_id: the ``nvpmodel -m`` number.
        budget_w: the power the mode is designed for (its name's watts; MAXN: the module's maximum).
        cores: CPU cores the mode keeps online.
        cpu_max_khz, gpu_max_hz, emc_max_hz: clock caps; None where the mode leaves a clock uncapped.
        tpcs: GPU TPCs left powered (the rest are gated by the mode's ``tpc_pg_mask``).
        default: whether the module ships in this mode.
        pg_mask: the mode's ``TPC_PG_MASK``: a board switches live only between modes with the mask it booted
            with (the others need a reboot, :mod:`edgetune.power.jetson.nvpmodel`); the twin switches all.
    """

    name: str
    mode_id: int
    budget_w: float
    cores: int
    cpu_max_khz: int | None
    gpu_max_hz: int | None
    emc_max_hz: int | None
    tpcs: int
    default: bool = False
    pg_mask: int = 0


@dataclass(frozen=True)
class Calibration:
    """The model constants of one profile; each one's unit and source are in ``profiles/calibration.csv``."""

    cores_per_tpc: int
    die_tpcs: int
    compute_efficiency: float
    fill_flops_per_core: float
    launch_cycles: float
    load_cycles_per_byte: float
    memory_efficiency: float
    visible_memory_frac: float
    os_reserve_gib: float
    static_w: float
    static_split: tuple[tuple[str, float], ...]
    gpu_cap_nf_per_tpc: float
    gpu_leak_w_per_tpc: float
    gpu_v_min: float
    gpu_v_max: float
    gpu_knee_frac: float
    gpu_clock_share: float
    gpu_memory_activity: float
    gpu_exposed: float
    host_exposed: float
    ripple: float
    cpu_cap_nf_per_core: float
    cpu_v_min: float
    cpu_v_max: float
    cpu_knee_frac: float
    cpu_idle_w_per_core: float
    emc_w_at_max: float
    dram_pj_per_byte: float
    sensor_update_period_s: float
    sensor_noise_w: float
    sensor_noise_rel: float
    step_jitter: float
    ambient_c: float
    thermal_k_per_w: float
    thermal_j_per_k: float
    leak_ref_c: float
    leak_doubling_k: float
    thermal_resolution_k: float

    @property
    def thermal_tau_s(self) -> float:
        """The board's first-order thermal time constant: resistance x heat capacity."""
        return self.thermal_k_per_w * self.thermal_j_per_k


@dataclass(frozen=True)
class RailLayout:
    """Which INA3221 channels a module has and which of them each power component flows through.

    Attributes:
        channels: rail names in the order the sensor reports them.
        input_rail: the board input rail that measures the total (``VDD_IN``), or None where the module
            monitors only its own rails (AGX Orin) and the total is their sum.
        gpu, cpu, emc, dram: the sub-rail each dynamic component shows up on (None: only the input rail).
    """

    channels: tuple[str, ...]
    input_rail: str | None
    gpu: str | None
    cpu: str | None
    emc: str | None
    dram: str | None

    @property
    def total_label(self) -> str:
        if self.input_rail is not None:
            return self.input_rail
        return DERIVED_PREFIX + " + ".join(self.channels)


# Rails per module (Jetson facts, sysfs.md): Orin Nano/NX and Xavier NX have the input rail VDD_IN and the
# combined CPU/GPU/CV rail; AGX Orin monitors module rails only, on two INA3221s.
_SMALL_MODULE_RAILS = RailLayout(("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"), "VDD_IN",
                                 gpu="VDD_CPU_GPU_CV", cpu="VDD_CPU_GPU_CV", emc="VDD_SOC", dram=None)
_RAILS = {
    "orin-agx": RailLayout(("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"), None,
                           gpu="VDD_GPU_SOC", cpu="VDD_CPU_CV", emc="VDD_GPU_SOC", dram="VDDQ_VDD2_1V8AO"),
    "orin-nx": _SMALL_MODULE_RAILS,
    "orin-nano": _SMALL_MODULE_RAILS,
    "xavier-nx": _SMALL_MODULE_RAILS,
}


@dataclass(frozen=True)
class Profile:
    """One Jetson module: its published facts, value tables, power modes, rails and model constants.

    Attributes:
        name: the profile key (``orin-nano``); ``sim:<name>`` opens it.
        module: the module's name in NVIDIA's data (``Orin Nano 8GB``).
        description: ``NVIDIA Jetson Orin Nano 8GB``.
        cuda_cores, cpu_cores: full-module counts.
        memory_bytes: module memory (shared by CPU and GPU).
        memory_bw_bytes_s: peak DRAM bandwidth at the top EMC step.
        power_min_w, power_max_w: the published envelope (smallest and largest nvpmodel budget).
        gpu_freqs_hz, emc_freqs_hz, cpu_freqs_khz: the knob tables, ascending.
        modes: nvpmodel modes in ascending power.
        rails: the INA3221 channels.
        calibration: model constants.
    """

    name: str
    module: str
    description: str
    gpu_arch: str
    cuda_cores: int
    cpu_name: str
    cpu_cores: int
    memory_bytes: int
    memory_bw_bytes_s: float
    power_min_w: float
    power_max_w: float
    gpu_freqs_hz: tuple[int, ...]
    emc_freqs_hz: tuple[int, ...]
    cpu_freqs_khz: tuple[int, ...]
    modes: tuple[PowerMode, ...]
    rails: RailLayout
    calibration: Calibration

    @property
    def default_mode(self) -> PowerMode:
        return next(m for m in self.modes if m.default)

    def mode(self, name: str) -> PowerMode:
        for m in self.modes:
            if m.name == name:
                return m
        raise DeviceError(f"{self.description} has no power mode {name!r}; "
                          f"modes: {', '.join(m.name for m in self.modes)}")

    @property
    def bus_bytes(self) -> float:
        """DRAM bus width in bytes: peak bandwidth = bus bytes x 2 transfers x top EMC clock."""
        return self.memory_bw_bytes_s / (TRANSFERS_PER_CLOCK * self.emc_freqs_hz[-1])

    @property
    def training_memory_bytes(self) -> float:
        """Memory a training process can allocate: what CUDA sees, less the OS and runtime reserve."""
        cal = self.calibration
        return self.visible_memory_bytes - cal.os_reserve_gib * GIB

    @property
    def visible_memory_bytes(self) -> float:
        """What torch reports as the GPU's total capacity (module memory after firmware carve-outs)."""
        return self.memory_bytes * self.calibration.visible_memory_frac

    @property
    def calibration_note(self) -> str:
        return (f"simulation calibrated to NVIDIA's published {self.module} data (envelope "
                f"{self.power_min_w:g}-{self.power_max_w:g} W, nvpmodel modes, clock tables); numbers and "
                f"sources: edgetune/power/profiles/SOURCES.md")


# ---------------------------------------------------------------------------------------------- loading


def _read_table(name: str) -> list[dict[str, str]]:
    text = resources.files(_DATA_PACKAGE).joinpath(_DATA_FOLDER).joinpath(name).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def _mode_budget(name: str, power_max_w: float) -> float:
    match = re.search(r"(\d+(?:\.\d+)?)W", name)
    return float(match.group(1)) if match else power_max_w


def _parse_split(text: str) -> tuple[tuple[str, float], ...]:
    """``VDD_SOC=0.4;VDD_IN=0.6`` -> (("VDD_SOC", 0.4), ("VDD_IN", 0.6)); a tuple keeps Profile hashable."""
    pairs = (item.split("=") for item in text.split(";") if item.strip())
    return tuple((rail.strip(), float(share)) for rail, share in pairs)


def _calibration(rows: list[dict[str, str]], profile: str) -> Calibration:
    """The calibration column of ``profile``, each value parsed as its :class:`Calibration` field's type."""
    kinds = {f.name: f.type for f in fields(Calibration)}
    values: dict[str, Any] = {}
    for row in rows:
        raw = row[profile]
        kind = kinds[row["parameter"]]
        values[row["parameter"]] = (_parse_split(raw) if "tuple" in str(kind)
                                    else int(float(raw)) if kind in (int, "int") else float(raw))
    return Calibration(**values)


def _modes(rows: list[dict[str, str]], profile: str, module: dict[str, str], cal: Calibration,
           power_max_w: float) -> tuple[PowerMode, ...]:
    """``profile``'s nvpmodel modes in ascending power (a cap of -1, or an EMC cap of 0: uncapped)."""
    modes = []
    for r in rows:
        if r["profile"] != profile:
            continue
        gated = (int(r["tpc_pg_mask"]) & ((1 << cal.die_tpcs) - 1)).bit_count()
        tpcs = min(cal.die_tpcs - gated, int(module["cuda_cores"]) // cal.cores_per_tpc)
        modes.append(PowerMode(
            name=r["mode_name"],
            mode_id=int(r["mode_id"]),
            budget_w=_mode_budget(r["mode_name"], power_max_w),
            cores=int(r["cores_online"]),
            cpu_max_khz=None if int(r["cpu_max_khz"]) < 0 else int(r["cpu_max_khz"]),
            gpu_max_hz=None if int(r["gpu_max_hz"]) < 0 else int(r["gpu_max_hz"]),
            emc_max_hz=None if int(r["emc_max_hz"]) <= 0 else int(r["emc_max_hz"]),
            tpcs=tpcs,
            default=r["is_default"] == "yes",
            pg_mask=int(r["tpc_pg_mask"]),
        ))
    # ascending power; MAXN last even where its budget equals a named mode's (Orin NX: 25 W)
    modes.sort(key=lambda mode: (mode.budget_w, mode.name.startswith("MAXN"), mode.mode_id))
    return tuple(modes)


def _load_profiles() -> dict[str, Profile]:
    modules = {r["profile"]: r for r in _read_table("modules.csv")}
    calibration = _read_table("calibration.csv")
    tables: dict[str, dict[str, list[int]]] = {}
    for file, column in (("gpu_frequencies.csv", "gpu_freq_hz"), ("emc_frequencies.csv", "emc_freq_hz"),
                         ("cpu_frequencies.csv", "cpu_freq_khz")):
        for row in _read_table(file):
            tables.setdefault(row["profile"], {}).setdefault(column, []).append(int(row[column]))
    modes_rows = _read_table("power_modes.csv")

    profiles: dict[str, Profile] = {}
    for name, m in modules.items():
        cal = _calibration(calibration, name)
        power_max = float(m["power_max_w"])
        profiles[name] = Profile(
            name=name,
            module=m["module"],
            description=f"NVIDIA Jetson {m['module']}",
            gpu_arch=m["gpu_arch"],
            cuda_cores=int(m["cuda_cores"]),
            cpu_name=m["cpu"],
            cpu_cores=int(m["cpu_cores"]),
            memory_bytes=int(float(m["memory_gb"]) * GIB),
            memory_bw_bytes_s=float(m["memory_bw_gbs"]) * _BYTES_PER_GB,
            power_min_w=float(m["power_min_w"]),
            power_max_w=power_max,
            gpu_freqs_hz=tuple(sorted(tables[name]["gpu_freq_hz"])),
            emc_freqs_hz=tuple(sorted(tables[name]["emc_freq_hz"])),
            cpu_freqs_khz=tuple(sorted(tables[name]["cpu_freq_khz"])),
            modes=_modes(modes_rows, name, m, cal, power_max),
            rails=_RAILS[name],
            calibration=cal,
        )
    return profiles


#: Every simulated module by profile name.
PROFILES: dict[str, Profile] = _load_profiles()
