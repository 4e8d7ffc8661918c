"""The simulated Jetson twin: ``sim:<profile>``, the embedded default where no power hardware is present.

A :class:`Twin` behaves like a Jetson module closely enough that the tuning decisions made on it are the
ones the real board needs. Everything runs on a :class:`~edgetune.power.base.VirtualClock`, so a ten-minute
on-device search takes seconds of wall time.

Profiles (:data:`PROFILES`): ``orin-agx`` (AGX Orin 64GB, JetPack 6 tables), ``orin-nx`` (Orin NX 16GB),
``orin-nano`` (Orin Nano 8GB, the embedded default), ``xavier-nx``. Their value tables and every model
constant live in ``edgetune/power/profiles/`` with their sources (``SOURCES.md``).

Knobs, as on the board:

* ``gpu_freq`` (Hz, the module's devfreq table), ``emc_freq`` (Hz), ``cpu_freq`` (kHz), ``cpu_cores``
  (online cores, 1..N) and ``power_mode`` (nvpmodel modes in ascending power).
* Setting a power mode does what ``nvpmodel -m`` does: it applies the mode's caps (online cores, CPU, GPU
  and EMC maxima, power-gated GPU TPCs) and sets each clock knob to the mode's maximum, as the governor
  runs them under load. The twin starts in the module's default mode.
* The clock a step runs at is the **effective** clock: the largest table value at or below
  ``min(knob value, mode cap, thermal throttle)``; online cores likewise ``min(knob, mode cores)``. A knob
  set above the current mode's cap therefore reads back as set but runs at the cap (as devfreq clamps a
  ``max_freq`` above nvpmodel's limit).

The models (pure functions; constants per profile in ``profiles/calibration.csv``):

* **Step time** (roofline with overlap): compute time ``t_c`` = FLOPs / (active cores x 2 x f_gpu x
  efficiency x occupancy(b)), where occupancy(b) = b / (b + b_half) and b_half = fill work per core x
  cores / FLOPs per sample (small batches of small models do not fill the GPU); memory time ``t_m`` = bytes
  moved / (bus bytes x 2 x f_emc x efficiency), bytes moved = 6 x parameters + 2 x optimizer state (read
  in forward and backward, gradients written, optimizer read-modify-write) + b x (4 x saved activations +
  input); the host's kernel launches ``launch_cycles / f_cpu``; data loading ``b x input bytes x cycles per
  byte / f_cpu`` spread over ``cores - 1`` loader processes (serial with the main thread on one core).
  The parts overlap imperfectly: ``step = smax(smax(t_c, t_m), t_launch, t_load)`` with the smooth
  maximum ``smax = (sum x^4)^(1/4)``.
* **Power** (DVFS): static + GPU ``C x TPCs x V(f)^2 x f x (share x busy + (1 - share) x SM activity)``
  + GPU leakage ``TPCs x leak x V / V_max`` while training (the GPU rail-gates at rest) + EMC (linear in f_emc) + DRAM (pJ per byte moved) + CPU ``online x idle + busy cores x C x V(f)^2 x
  f``. V(f) is flat below a knee and rises linearly to the top clock. Within a step the GPU power ripples
  (forward lower, backward higher) so the peak exceeds the mean while the step's average equals it.
* **Memory**: the module's memory is shared by CPU and GPU; a batch whose ``cost.memory_bytes(b)`` exceeds
  the memory visible to CUDA minus the OS reserve raises :class:`~edgetune.power.base.DeviceOutOfMemoryError`
  with torch's message.
* **Sensor**: the board's INA3221 rails, refreshed every ``sensor_update_period_s`` (the value is held in
  between), with seeded Gaussian noise, rounded to the milliwatt.

Noise-free ground truth for any batch size and setting: :meth:`Twin.expected`. Disturbances for tests
and benchmarks of the runtime controller: :meth:`Twin.set_power_offset` (another process's load, on the CPU
rail, from the current virtual time) and :meth:`Twin.set_throttle` (a thermal cap on the GPU clock, from the
next step).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from typing import Any, TypeVar

import numpy as np

from edgetune.power.base import (
    Device,
    DeviceError,
    DeviceOutOfMemoryError,
    Knob,
    KnobValue,
    PowerReading,
    VirtualClock,
    WorkloadCost,
    format_value,
)
from edgetune.power.registry import PlatformProbe

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "Calibration",
    "Clocks",
    "Expected",
    "PowerMode",
    "Profile",
    "StepPower",
    "Twin",
    "TwinSensor",
    "effective_clocks",
    "idle_power",
    "open",
    "probe",
    "step_model",
]

T = TypeVar("T")

DEFAULT_PROFILE = "orin-nano"
GIB = 1024**3
MIB = 1024**2

# Smooth maximum exponent for overlapping step components: 4 keeps the result within 19% of the true
# maximum when two parts are equal (imperfect overlap) and within 1% when one part is twice the other.
_OVERLAP_P = 4.0

# Forward pass share of a step; the GPU draws (1 - ripple) x its mean then, (1 + ripple / 2) after it.
_FORWARD_SHARE = 1.0 / 3.0

# Noise is drawn in blocks of sensor updates, indexed by the update number, so a trace depends only on the
# seed and the load, never on how often somebody reads the sensor.
_NOISE_BLOCK = 4096


# ---------------------------------------------------------------------------------------------- profiles


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
        return "derived: " + " + ".join(self.channels)


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

# Power components, in the order of the rail matrix's columns.
_COMPONENTS = ("static", "gpu", "cpu", "emc", "dram")


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
        return self.memory_bw_bytes_s / (2.0 * self.emc_freqs_hz[-1])

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


def _read_table(name: str) -> list[dict[str, str]]:
    text = resources.files("edgetune.power").joinpath("profiles").joinpath(name).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def _mode_budget(name: str, power_max_w: float) -> float:
    match = re.search(r"(\d+(?:\.\d+)?)W", name)
    return float(match.group(1)) if match else power_max_w


def _parse_split(text: str) -> tuple[tuple[str, float], ...]:
    """``VDD_SOC=0.4;VDD_IN=0.6`` -> (("VDD_SOC", 0.4), ("VDD_IN", 0.6)); a tuple keeps Profile hashable."""
    pairs = (item.split("=") for item in text.split(";") if item.strip())
    return tuple((rail.strip(), float(share)) for rail, share in pairs)


def _load_profiles() -> dict[str, Profile]:
    modules = {r["profile"]: r for r in _read_table("modules.csv")}
    calibration = _read_table("calibration.csv")
    tables: dict[str, dict[str, list[int]]] = {}
    for file, column in (("gpu_frequencies.csv", "gpu_freq_hz"), ("emc_frequencies.csv", "emc_freq_hz"),
                         ("cpu_frequencies.csv", "cpu_freq_khz")):
        for row in _read_table(file):
            tables.setdefault(row["profile"], {}).setdefault(column, []).append(int(row[column]))
    modes_rows = _read_table("power_modes.csv")
    kinds = {f.name: f.type for f in fields(Calibration)}

    profiles: dict[str, Profile] = {}
    for name, m in modules.items():
        values: dict[str, Any] = {}
        for row in calibration:
            raw = row[name]
            kind = kinds[row["parameter"]]
            values[row["parameter"]] = (_parse_split(raw) if "tuple" in str(kind)
                                        else int(float(raw)) if kind in (int, "int") else float(raw))
        cal = Calibration(**values)
        power_max = float(m["power_max_w"])
        modes = []
        for r in modes_rows:
            if r["profile"] != name:
                continue
            gated = (int(r["tpc_pg_mask"]) & ((1 << cal.die_tpcs) - 1)).bit_count()
            tpcs = min(cal.die_tpcs - gated, int(m["cuda_cores"]) // cal.cores_per_tpc)
            modes.append(PowerMode(
                name=r["mode_name"],
                mode_id=int(r["mode_id"]),
                budget_w=_mode_budget(r["mode_name"], power_max),
                cores=int(r["cores_online"]),
                cpu_max_khz=None if int(r["cpu_max_khz"]) < 0 else int(r["cpu_max_khz"]),
                gpu_max_hz=None if int(r["gpu_max_hz"]) < 0 else int(r["gpu_max_hz"]),
                emc_max_hz=None if int(r["emc_max_hz"]) <= 0 else int(r["emc_max_hz"]),
                tpcs=tpcs,
                default=r["is_default"] == "yes",
            ))
        # ascending power; MAXN last even where its budget equals a named mode's (Orin NX: 25 W)
        modes.sort(key=lambda mode: (mode.budget_w, mode.name.startswith("MAXN"), mode.mode_id))
        profiles[name] = Profile(
            name=name,
            module=m["module"],
            description=f"NVIDIA Jetson {m['module']}",
            gpu_arch=m["gpu_arch"],
            cuda_cores=int(m["cuda_cores"]),
            cpu_name=m["cpu"],
            cpu_cores=int(m["cpu_cores"]),
            memory_bytes=int(float(m["memory_gb"]) * GIB),
            memory_bw_bytes_s=float(m["memory_bw_gbs"]) * 1e9,
            power_min_w=float(m["power_min_w"]),
            power_max_w=power_max,
            gpu_freqs_hz=tuple(sorted(tables[name]["gpu_freq_hz"])),
            emc_freqs_hz=tuple(sorted(tables[name]["emc_freq_hz"])),
            cpu_freqs_khz=tuple(sorted(tables[name]["cpu_freq_khz"])),
            modes=tuple(modes),
            rails=_RAILS[name],
            calibration=cal,
        )
    return profiles


#: Every simulated module by profile name.
PROFILES: dict[str, Profile] = _load_profiles()


# ---------------------------------------------------------------------------------------------- models


@dataclass(frozen=True)
class Clocks:
    """The clocks a step actually runs at, after power-mode caps and thermal throttling."""

    gpu_hz: int
    emc_hz: int
    cpu_khz: int
    cores: int
    tpcs: int


@dataclass(frozen=True)
class Expected:
    """Noise-free ground truth of one training step at one batch size and setting.

    Attributes:
        batch_size: samples per step.
        step_time_s: time of one step.
        power_w: mean board power while training steadily (the sensor's total).
        peak_power_w: highest instantaneous board power within a step (backward phase).
        memory_bytes: device memory the step needs (``cost.memory_bytes(batch_size)``).
        fits: whether that fits the memory left to training; if not, the board raises out-of-memory and
            the other figures describe a step that cannot run.
        gpu_util: share of the step the GPU is busy (what tegrastats shows as GR3D load).
        occupancy: how full the busy GPU is: b / (b + b_half).
        compute_s, memory_s, launch_s, load_s: the roofline parts (compute at this occupancy, DRAM
            traffic, host kernel launches, data loading per loader process).
        rails_w: mean power per INA3221 rail.
        clocks: the effective clocks.
    """

    batch_size: int
    step_time_s: float
    power_w: float
    peak_power_w: float
    memory_bytes: float
    fits: bool
    gpu_util: float
    occupancy: float
    compute_s: float
    memory_s: float
    launch_s: float
    load_s: float
    rails_w: Mapping[str, float] = field(default_factory=dict)
    clocks: Clocks | None = None

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.step_time_s

    @property
    def energy_per_step_j(self) -> float:
        return self.power_w * self.step_time_s

    @property
    def energy_per_sample_j(self) -> float:
        return self.energy_per_step_j / self.batch_size


def _largest_at_most(table: tuple[int, ...], limit: float) -> int:
    """The largest table value <= limit (the table's smallest where none is)."""
    best = table[0]
    for v in table:
        if v <= limit:
            best = v
    return best


def effective_clocks(profile: Profile, setting: Mapping[str, KnobValue],
                     gpu_throttle_hz: float | None = None) -> Clocks:
    """Clocks a step runs at: each knob value capped by the power mode (and the GPU by a throttle)."""
    mode = profile.mode(str(setting["power_mode"]))
    inf = math.inf
    gpu_limit = min(float(setting["gpu_freq"]), mode.gpu_max_hz or inf, gpu_throttle_hz or inf)
    return Clocks(
        gpu_hz=_largest_at_most(profile.gpu_freqs_hz, gpu_limit),
        emc_hz=_largest_at_most(profile.emc_freqs_hz, min(float(setting["emc_freq"]), mode.emc_max_hz or inf)),
        cpu_khz=_largest_at_most(profile.cpu_freqs_khz,
                                 min(float(setting["cpu_freq"]), mode.cpu_max_khz or inf)),
        cores=max(1, min(int(setting["cpu_cores"]), mode.cores)),
        tpcs=mode.tpcs,
    )


def _voltage(f: float, f_top: float, v_min: float, v_max: float, knee_frac: float) -> float:
    """V/f curve: flat at ``v_min`` up to the knee, then linear to ``v_max`` at the top clock."""
    knee = knee_frac * f_top
    if f <= knee:
        return v_min
    return v_min + (v_max - v_min) * (f - knee) / (f_top - knee)


def _smax(*parts: float) -> float:
    return sum(p**_OVERLAP_P for p in parts) ** (1.0 / _OVERLAP_P)


@dataclass(frozen=True)
class StepPower:
    """Mean power per component over a step; ``gpu`` is the switching part that ripples within a step,
    ``gpu_leak`` the leakage of the powered TPCs (the GPU is rail-gated only at rest)."""

    static: float
    gpu: float
    gpu_leak: float
    cpu: float
    emc: float
    dram: float

    def vector(self, gpu_scale: float = 1.0) -> tuple[float, ...]:
        return (self.static, self.gpu * gpu_scale + self.gpu_leak, self.cpu, self.emc, self.dram)


def step_model(profile: Profile, clocks: Clocks, cost: WorkloadCost, batch_size: int
               ) -> tuple[dict[str, float], StepPower]:
    """The roofline step time and DVFS power of one training step (pure; see the module docstring).

    Returns the time parts (``step``, ``compute``, ``memory``, ``gpu``, ``launch``, ``load``, ``full``
    (compute at full occupancy), ``occupancy``, ``traffic`` bytes) and the mean power per component.
    """
    cal = profile.calibration
    b = float(batch_size)
    cores = clocks.tpcs * cal.cores_per_tpc
    f_gpu = float(clocks.gpu_hz)
    f_cpu = clocks.cpu_khz * 1e3

    flops = cost.flops_per_sample * b
    if cost.flops_per_sample > 0:
        b_half = cal.fill_flops_per_core * cores / cost.flops_per_sample
        occupancy = b / (b + b_half)
        t_full = flops / (cores * 2.0 * f_gpu * cal.compute_efficiency)
        t_compute = t_full / occupancy
    else:
        occupancy, t_full, t_compute = 0.0, 0.0, 0.0
    traffic = (6.0 * cost.param_bytes + 2.0 * cost.optimizer_state_bytes
               + b * (4.0 * cost.activation_bytes_per_sample + cost.input_bytes_per_sample))
    bandwidth = profile.bus_bytes * 2.0 * clocks.emc_hz * cal.memory_efficiency
    t_memory = traffic / bandwidth
    t_gpu = _smax(t_compute, t_memory)

    t_launch = cal.launch_cycles / f_cpu
    load_core_s = b * cost.input_bytes_per_sample * cal.load_cycles_per_byte / f_cpu
    if clocks.cores > 1:
        t_load = load_core_s / (clocks.cores - 1)
        step = _smax(t_gpu, t_launch, t_load)
        busy_cores = 1.0 + load_core_s / step  # the main thread waits busily on the GPU all step
    else:
        t_load = load_core_s
        step = _smax(t_gpu, t_launch + t_load)
        busy_cores = 1.0

    v_gpu = _voltage(f_gpu, profile.gpu_freqs_hz[-1], cal.gpu_v_min, cal.gpu_v_max, cal.gpu_knee_frac)
    activity = cal.gpu_clock_share * (t_gpu / step) + (1.0 - cal.gpu_clock_share) * (t_full / step)
    p_gpu = cal.gpu_cap_nf_per_tpc * 1e-9 * clocks.tpcs * v_gpu**2 * f_gpu * activity
    p_leak = cal.gpu_leak_w_per_tpc * clocks.tpcs * v_gpu / cal.gpu_v_max

    v_cpu = _voltage(f_cpu, profile.cpu_freqs_khz[-1] * 1e3, cal.cpu_v_min, cal.cpu_v_max, cal.cpu_knee_frac)
    p_core = cal.cpu_cap_nf_per_core * 1e-9 * v_cpu**2 * f_cpu
    p_cpu = clocks.cores * cal.cpu_idle_w_per_core + busy_cores * p_core

    p_emc = cal.emc_w_at_max * clocks.emc_hz / profile.emc_freqs_hz[-1]
    p_dram = cal.dram_pj_per_byte * 1e-12 * traffic / step
    times = {"step": step, "compute": t_compute, "memory": t_memory, "gpu": t_gpu, "launch": t_launch,
             "load": t_load, "full": t_full, "occupancy": occupancy, "traffic": traffic}
    return times, StepPower(cal.static_w, p_gpu, p_leak, p_cpu, p_emc, p_dram)


def idle_power(profile: Profile, clocks: Clocks) -> StepPower:
    """Power at rest: static, the online cores idling, the memory controller at its clock; GPU gated."""
    cal = profile.calibration
    return StepPower(cal.static_w, 0.0, 0.0, clocks.cores * cal.cpu_idle_w_per_core,
                      cal.emc_w_at_max * clocks.emc_hz / profile.emc_freqs_hz[-1], 0.0)


def _rail_matrix(profile: Profile) -> tuple[tuple[float, ...], ...]:
    """rows: sensor channels; columns: :data:`_COMPONENTS`; rail power = row . component powers."""
    layout, split = profile.rails, dict(profile.calibration.static_split)
    unknown = set(split) - set(layout.channels)
    if unknown or abs(sum(split.values()) - 1.0) > 1e-9:
        raise DeviceError(f"profile {profile.name}: static_split must share 1.0 over {layout.channels}")
    rows = []
    for channel in layout.channels:
        if channel == layout.input_rail:
            rows.append((1.0, 1.0, 1.0, 1.0, 1.0))
            continue
        rows.append((split.get(channel, 0.0),) + tuple(
            1.0 if getattr(layout, component) == channel else 0.0 for component in _COMPONENTS[1:]))
    return tuple(rows)


# ---------------------------------------------------------------------------------------------- sensor


class TwinSensor:
    """The twin's INA3221 rails, read on its virtual clock.

    A new value appears every ``update_period_s``: the board power at that update instant (the 1.1 ms
    conversion is short against training phases), plus seeded Gaussian noise per channel, rounded to the
    milliwatt. Reads between updates return the held value. Where the module has an input rail it is the
    total; on AGX Orin the total is the sum of the rails (``derived: ...``).
    """

    def __init__(self, twin: Twin) -> None:
        self._twin = twin
        profile = twin.profile
        cal = profile.calibration
        self.rails: tuple[str, ...] = profile.rails.channels
        self.total_label: str = profile.rails.total_label
        self.update_period_s: float = cal.sensor_update_period_s
        self._input_index = (self.rails.index(profile.rails.input_rail)
                             if profile.rails.input_rail is not None else None)
        self._k = -1
        self._held: PowerReading | None = None
        self._block_index = -1
        self._block: list[list[float]] = []

    def _noise(self, k: int) -> list[float]:
        block = k // _NOISE_BLOCK
        if block != self._block_index:
            rng = np.random.default_rng([self._twin.seed, 0x5E45, block])
            self._block = rng.standard_normal((_NOISE_BLOCK, len(self.rails))).tolist()
            self._block_index = block
        return self._block[k % _NOISE_BLOCK]

    def read(self) -> PowerReading:
        now = self._twin.clock.now()
        # 1e-9 keeps an update instant that float rounding puts a hair below k * period at k
        k = math.floor(now / self.update_period_s + 1e-9)
        if k != self._k or self._held is None:
            clean = self._twin._power_at(k * self.update_period_s)
            cal = self._twin.profile.calibration
            noisy = [max(0.0, round(p + (cal.sensor_noise_w + cal.sensor_noise_rel * p) * z, 3))
                     for p, z in zip(clean, self._noise(k))]
            total = noisy[self._input_index] if self._input_index is not None else round(sum(noisy), 3)
            self._k = k
            self._held = PowerReading(now, total, dict(zip(self.rails, noisy)))
            return self._held
        return PowerReading(now, self._held.total_w, self._held.rails)

    def energy_j(self) -> float | None:
        return None  # the INA3221 keeps no energy counter


# ---------------------------------------------------------------------------------------------- twin

_KNOB_UNITS = {"gpu_freq": "Hz", "emc_freq": "Hz", "cpu_freq": "kHz", "cpu_cores": "cores", "power_mode": ""}


class Twin:
    """A simulated Jetson module on a virtual clock.

    Args:
        profile: a :class:`Profile` or a profile name (``orin-nano``).
        seed: seeds the sensor noise and the step-time jitter; the same seed and the same calls give the
            same trace.
        compute: whether :meth:`run_step` runs the training step itself; with False only timing and power
            are simulated (benchmarks of many searches).
    """

    def __init__(self, profile: Profile | str = DEFAULT_PROFILE, seed: int = 0, compute: bool = True) -> None:
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise DeviceError(f"unknown simulated profile {profile!r}; known profiles: "
                                  f"{', '.join(sorted(PROFILES))} (use sim:<profile>)")
            profile = PROFILES[profile]
        self.profile: Profile = profile
        self.seed = int(seed)
        self.compute = bool(compute)
        self.clock = VirtualClock()
        self._rng = np.random.default_rng([self.seed, 0x57E9])
        self._matrix = _rail_matrix(profile)
        self._cpu_column = tuple(row[_COMPONENTS.index("cpu")] for row in self._matrix)
        self._setting: dict[str, KnobValue] = {}
        self._apply_mode(profile.default_mode)
        self._throttle_hz: float | None = None
        self._offset_w = 0.0
        # (start, end, clean rail powers) of the steps run; trimmed as time passes
        self._segments: deque[tuple[float, float, tuple[float, ...]]] = deque()
        self._cache: dict[tuple, tuple[Expected, tuple[float, ...], tuple[float, ...]]] = {}
        self._idle_cache: dict[Clocks, tuple[float, ...]] = {}
        self.steps = 0
        self.sensor = TwinSensor(self)
        self.knobs = self._make_knobs()
        self._allowed = {name: frozenset(v for v in knob.values if not isinstance(v, bool))
                         for name, knob in self.knobs.items()}
        self._device: Device | None = None

    def __repr__(self) -> str:
        return f"Twin({self.profile.name!r}, seed={self.seed}, t={self.clock.now():.3f}s)"

    # -- knobs ---------------------------------------------------------------------------------
    def knob_grid(self) -> dict[str, tuple[KnobValue, ...]]:
        """Every knob's allowed values (power modes in ascending power)."""
        p = self.profile
        return {
            "gpu_freq": p.gpu_freqs_hz,
            "emc_freq": p.emc_freqs_hz,
            "cpu_freq": p.cpu_freqs_khz,
            "cpu_cores": tuple(range(1, p.cpu_cores + 1)),
            "power_mode": tuple(m.name for m in p.modes),
        }

    def _mode_setting(self, mode: PowerMode) -> dict[str, KnobValue]:
        """The knob values ``nvpmodel -m`` leaves: online cores and each clock at the mode's maximum."""
        p = self.profile
        return {
            "power_mode": mode.name,
            "gpu_freq": _largest_at_most(p.gpu_freqs_hz, mode.gpu_max_hz or math.inf),
            "emc_freq": _largest_at_most(p.emc_freqs_hz, mode.emc_max_hz or math.inf),
            "cpu_freq": _largest_at_most(p.cpu_freqs_khz, mode.cpu_max_khz or math.inf),
            "cpu_cores": mode.cores,
        }

    def _apply_mode(self, mode: PowerMode) -> None:
        self._setting.update(self._mode_setting(mode))

    def _write(self, name: str) -> Callable[[KnobValue], None]:
        def write(value: KnobValue) -> None:
            if name == "power_mode":
                self._apply_mode(self.profile.mode(str(value)))
            else:
                self._setting[name] = value
        return write

    def _make_knobs(self) -> dict[str, Knob]:
        descriptions = {
            "gpu_freq": "GPU clock (devfreq); runs at min(value, power-mode cap, thermal throttle)",
            "emc_freq": "memory (EMC) clock; runs at min(value, power-mode cap)",
            "cpu_freq": "CPU clock of every cluster; runs at min(value, power-mode cap)",
            "cpu_cores": "online CPU cores; at most the power mode's",
            "power_mode": "nvpmodel mode: sets core count and clock caps, clocks to the mode's maximum",
        }
        return {
            name: Knob(name, _KNOB_UNITS[name], values,
                       read=lambda name=name: self._setting[name], write=self._write(name),
                       description=descriptions[name])
            for name, values in self.knob_grid().items()
        }

    def settings(self) -> dict[str, KnobValue]:
        """Every knob's current value."""
        return dict(self._setting)

    def _resolve(self, setting: Mapping[str, KnobValue] | None) -> dict[str, KnobValue]:
        """Current values overridden by ``setting``, as ``device.apply(setting)`` would leave them."""
        merged = dict(self._setting)
        if not setting:
            return merged
        knobs, allowed = self.knobs, self._allowed
        for name in setting:
            if name not in knobs:
                raise DeviceError(f"unknown knob {name!r} on sim:{self.profile.name}; "
                                  f"knobs here: {', '.join(knobs)}")
        if "power_mode" in setting:
            mode = setting["power_mode"]
            if mode not in allowed["power_mode"]:
                mode = knobs["power_mode"].validate(mode)
            merged.update(self._mode_setting(self.profile.mode(str(mode))))
        for name, value in setting.items():
            if name != "power_mode":
                # exact table values (what an oracle sweeps) skip the parsing path
                merged[name] = value if value in allowed[name] else knobs[name].validate(value)
        return merged

    def effective_clocks(self, setting: Mapping[str, KnobValue] | None = None) -> Clocks:
        """The clocks a step runs at now (or under ``setting``), caps and throttle applied."""
        return effective_clocks(self.profile, self._resolve(setting), self._throttle_hz)

    # -- disturbances ----------------------------------------------------------------------------
    def set_power_offset(self, watts: float) -> None:
        """From now on another process adds ``watts`` of CPU load to the board (0 removes it)."""
        if not math.isfinite(watts):
            raise ValueError(f"power offset must be finite, got {watts}")
        self._offset_w = float(watts)

    def set_throttle(self, gpu_max_hz: float | None) -> None:
        """From the next step on, thermal throttling caps the effective GPU clock (None lifts it).

        A step already running finishes at the clock it started with: the twin models steps whole.
        """
        if gpu_max_hz is not None and not gpu_max_hz > 0:
            raise ValueError(f"throttle must be a positive clock in Hz or None, got {gpu_max_hz}")
        self._throttle_hz = None if gpu_max_hz is None else float(gpu_max_hz)

    @property
    def power_offset_w(self) -> float:
        return self._offset_w

    @property
    def throttle_hz(self) -> float | None:
        return self._throttle_hz

    # -- ground truth ----------------------------------------------------------------------------
    def _rails(self, power: StepPower, gpu_scale: float = 1.0, offset_w: float = 0.0) -> tuple[float, ...]:
        """Rail powers of component powers; ``offset_w`` is another process's CPU load."""
        comp = power.vector(gpu_scale)
        return tuple(sum(w * c for w, c in zip(row, comp)) + off * offset_w
                     for row, off in zip(self._matrix, self._cpu_column))

    def _total(self, rails: tuple[float, ...]) -> float:
        layout = self.profile.rails
        if layout.input_rail is not None:
            return rails[layout.channels.index(layout.input_rail)]
        return sum(rails)

    def _evaluate(self, cost: WorkloadCost, batch_size: int, clocks: Clocks
                  ) -> tuple[Expected, tuple[float, ...], tuple[float, ...]]:
        """Ground truth at ``clocks``, and the clean rail powers of the forward and backward phases.

        The phase rails exclude the power offset: the sensor adds the offset in force when it reads, so a
        change shows at once even in the middle of a step.
        """
        key = (cost, batch_size, clocks, self._offset_w)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        times, power = step_model(self.profile, clocks, cost, batch_size)
        ripple = self.profile.calibration.ripple
        forward = self._rails(power, 1.0 - ripple)
        backward = self._rails(power, 1.0 + ripple * _FORWARD_SHARE / (1.0 - _FORWARD_SHARE))
        offset = self._offset_w
        mean = self._rails(power, 1.0, offset)
        peak = max(self._total(self._rails(power, 1.0 - ripple, offset)),
                   self._total(self._rails(power, 1.0 + ripple * _FORWARD_SHARE / (1.0 - _FORWARD_SHARE), offset)))
        memory = cost.memory_bytes(batch_size)
        expected = Expected(
            batch_size=batch_size,
            step_time_s=times["step"],
            power_w=self._total(mean),
            peak_power_w=peak,
            memory_bytes=memory,
            fits=memory <= self.profile.training_memory_bytes,
            gpu_util=times["gpu"] / times["step"],
            occupancy=times["occupancy"],
            compute_s=times["compute"],
            memory_s=times["memory"],
            launch_s=times["launch"],
            load_s=times["load"],
            rails_w=dict(zip(self.profile.rails.channels, mean)),
            clocks=clocks,
        )
        if len(self._cache) > 65536:  # a search visits a few thousand settings; bound it anyway
            self._cache.clear()
        self._cache[key] = (expected, forward, backward)
        return self._cache[key]

    def expected(self, cost: WorkloadCost, batch_size: int,
                 setting: Mapping[str, KnobValue] | None = None) -> Expected:
        """Noise-free step time and power of ``cost`` at ``batch_size`` under ``setting``.

        ``setting`` maps knob names to values (or ``min``/``max``/``918MHz`` text); knobs it leaves out
        keep their current values, and a power mode in it resets the clocks under it as applying it would.
        The figures include any disturbance in force (power offset, throttle).
        """
        _check_batch_size(batch_size)
        return self._evaluate(cost, batch_size, self.effective_clocks(setting))[0]

    @property
    def idle_power_w(self) -> float:
        """Board power at rest with the current knob values (and any power offset in force)."""
        return self._total(self._with_offset(self._idle_rails()))

    def _idle_rails(self) -> tuple[float, ...]:
        clocks = self.effective_clocks()
        rails = self._idle_cache.get(clocks)
        if rails is None:
            rails = self._idle_cache[clocks] = self._rails(idle_power(self.profile, clocks))
        return rails

    def _with_offset(self, rails: tuple[float, ...]) -> tuple[float, ...]:
        if not self._offset_w:
            return rails
        return tuple(r + off * self._offset_w for r, off in zip(rails, self._cpu_column))

    # -- running ---------------------------------------------------------------------------------
    def run_step(self, fn: Callable[[], T], batch_size: int, cost: WorkloadCost | None) -> T | None:
        """Run one training step: check memory, run ``fn`` (unless ``compute=False``), advance the clock.

        Raises :class:`DeviceOutOfMemoryError` (torch's message) when the batch does not fit.
        """
        if cost is None:
            raise DeviceError("the simulated twin needs the workload's cost to time a step; "
                              "pass cost=workload.cost")
        _check_batch_size(batch_size)
        expected, forward, backward = self._evaluate(cost, batch_size, self.effective_clocks())
        if not expected.fits:
            raise DeviceOutOfMemoryError(self._oom_message(cost, batch_size))
        result = fn() if self.compute else None
        jitter = self.profile.calibration.step_jitter
        # log-normal with unit mean: the average step time stays the modelled one
        dt = expected.step_time_s * math.exp(jitter * float(self._rng.standard_normal()) - jitter**2 / 2)
        start = self.clock.now()
        segments = self._segments
        horizon = start - 2.0 * self.sensor.update_period_s  # older segments can never be read again
        while segments and segments[0][1] <= horizon:
            segments.popleft()
        split = start + dt * _FORWARD_SHARE
        segments.append((start, split, forward))
        segments.append((split, start + dt, backward))
        self.steps += 1
        self.clock.advance(dt)
        return result

    def _power_at(self, t: float) -> tuple[float, ...]:
        """Clean rail powers at virtual time ``t`` (at most one update period in the past): the step
        phase running then, else idle at the current knob values; plus the power offset in force."""
        segments = self._segments
        while segments and segments[0][1] <= t:
            segments.popleft()
        if segments and segments[0][0] <= t:
            return self._with_offset(segments[0][2])
        return self._with_offset(self._idle_rails())

    def _oom_message(self, cost: WorkloadCost, batch_size: int) -> str:
        p = self.profile
        capacity = p.visible_memory_bytes
        allocated = 2 * cost.param_bytes + cost.optimizer_state_bytes
        wanted = cost.memory_bytes(batch_size) - allocated
        free = max(0.0, p.training_memory_bytes - allocated)
        return (f"CUDA out of memory. Tried to allocate {wanted / MIB:.2f} MiB (GPU 0; {capacity / GIB:.2f} GiB "
                f"total capacity; {allocated / GIB:.2f} GiB already allocated; {free / GIB:.2f} GiB free; "
                f"{(capacity - p.training_memory_bytes) / GIB:.2f} GiB held by the OS and runtime) "
                f"[simulated {p.description}: batch size {batch_size} needs "
                f"{cost.memory_bytes(batch_size) / GIB:.2f} GiB; use a smaller batch]")

    # -- device ----------------------------------------------------------------------------------
    def device(self) -> Device:
        """The twin as a :class:`~edgetune.power.base.Device` (built once; its ``backend`` is the twin)."""
        if self._device is None:
            self._device = Device(
                name=f"sim:{self.profile.name}",
                description=f"{self.profile.description} (simulated)",
                simulated=True,
                knobs=self.knobs,
                sensor=self.sensor,
                clock=self.clock,
                run_step=self.run_step,  # type: ignore[arg-type]
                idle_power_w=self.idle_power_w,
                max_power_w=self.profile.power_max_w,
                notes=[self.profile.calibration_note],
                backend=self,
            )
        return self._device


def _check_batch_size(batch_size: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise DeviceError(f"batch size must be a positive whole number, got {batch_size!r}")


# ---------------------------------------------------------------------------------------------- platform


def open(arg: str = "", seed: int = 0, compute: bool = True, **_: Any) -> Device:
    """``sim:<profile>``: a fresh twin of that profile (``sim`` alone: the Orin Nano 8GB)."""
    return Twin(arg.strip() or DEFAULT_PROFILE, seed=seed, compute=compute).device()


def _describe_range(values: tuple[KnobValue, ...], unit: str) -> str:
    if isinstance(values[0], str):
        return ", ".join(map(str, values))
    if unit == "cores":
        return f"{values[0]}-{values[-1]} cores"
    return f"{format_value(values[0], unit)} - {format_value(values[-1], unit)} ({len(values)} steps)"


def probe() -> list[PlatformProbe]:
    """Every profile, always found: simulations need no hardware."""
    found = []
    for name, profile in PROFILES.items():
        grid = Twin(profile, compute=False).knob_grid()
        found.append(PlatformProbe(
            platform="sim",
            found=True,
            spec=f"sim:{name}",
            summary=f"{profile.description} (simulated: a calibrated model, not hardware)",
            details=[
                f"rails: {', '.join(profile.rails.channels)} (total: {profile.rails.total_label})",
                *(f"{knob}: {_describe_range(values, _KNOB_UNITS[knob])}" for knob, values in grid.items()),
                profile.calibration_note,
            ],
        ))
    return found
