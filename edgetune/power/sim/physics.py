"""The twin's models: pure functions of a :class:`~edgetune.power.sim.profiles.Profile`, clocks and a cost.

* **Effective clocks**: the clock a step runs at is the largest table value at or below
  ``min(knob value, mode cap, thermal throttle)``; online cores likewise ``min(knob, mode cores)``.
* **Step time** (roofline with partial overlap): compute time ``t_c`` = FLOPs / (active cores x 2 x
  f_gpu x efficiency x occupancy(b)), where occupancy(b) = b / (b + b_half) and b_half = fill work per core x
  cores / FLOPs per sample (small batches of small models do not fill the GPU); memory time ``t_m`` =
  (6 x parameters + 2 x optimizer state) / bandwidth + b x (4 x saved activations + input) / (bandwidth x
  memory occupancy) (a small batch keeps few requests in flight as it keeps few SMs busy: the occupancy of the
  module's whole GPU, since the requests follow the SMs busy, not the share of those powered; a mode that gates
  TPCs is then never faster than the whole GPU at its clocks), bandwidth = bus bytes
  x 2 x f_emc x efficiency; the host's kernel launches ``launch_cycles / f_cpu``; data loading ``b x
  input bytes x cycles per byte / f_cpu`` spread over ``cores - 1`` loader processes (serial with the main
  thread on one core). The parts overlap partially (:func:`overlap`: the largest plus a share of the
  others): ``t_gpu = overlap(gpu_exposed, t_c, t_m)``, ``step = overlap(host_exposed, t_gpu, t_launch,
  t_load)``, so the step's slope in the GPU clock lies between flat and 1/f.
* **Power** (DVFS): static + GPU ``C x TPCs x V(f)^2 x f x activity`` with activity = busy share x
  (clock share + (1 - clock share) x occupancy x (compute share + memory activity x memory share)): the
  GPU's switching power follows the SMs actually active, so small batches draw much less + GPU leakage
  ``TPCs x leak x V / V_max x 2^((T - T_ref) / doubling)`` while training (rail-gated at rest; T the board
  temperature, :func:`leak_scale`) + EMC (linear in f_emc) + DRAM (pJ per byte moved) + CPU ``online x
  idle + busy cores x C x V(f)^2 x f``. V(f) is flat at V_min below a knee, so the lowest clock steps
  share one voltage, and rises linearly to the top clock. Within a step the GPU power ripples (forward
  lower, backward higher) so the peak exceeds the mean while the step's average equals it
  (:func:`phase_gpu_scales`).
* **Board temperature** (first order): it relaxes towards ambient + R_th x power with time constant
  R_th x C_th (:func:`relax_temperature_c`, :func:`steady_temperature_c`); the twin integrates it on its
  virtual clock.
* **Rails**: component powers map onto the INA3221 channels through :func:`rail_matrix`.

The constants of each profile are in ``profiles/calibration.csv``; the structural ones are named here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from edgetune.power.base import DeviceError, KnobValue, WorkloadCost, largest_at_most
from edgetune.power.sim.profiles import TRANSFERS_PER_CLOCK, Profile, RailLayout

__all__ = [
    "COMPONENTS",
    "FORWARD_SHARE",
    "Clocks",
    "Expected",
    "StepPower",
    "board_total",
    "effective_clocks",
    "idle_power",
    "largest_at_most",
    "leak_scale",
    "occupancy",
    "overlap",
    "phase_gpu_scales",
    "rail_matrix",
    "rail_powers",
    "relax_temperature_c",
    "steady_temperature_c",
    "step_model",
    "voltage",
]

#: Share of a step spent in the forward pass (backward costs about twice the forward); the GPU draws
#: (1 - ripple) x its mean then and more after it (:func:`phase_gpu_scales`).
FORWARD_SHARE = 1.0 / 3.0
#: FLOPs per CUDA core per clock: one fused multiply-add.
_FLOPS_PER_CORE_CYCLE = 2.0
#: Passes over the parameter bytes per step: read in forward and in backward, gradients written, and the
#: optimizer's read-modify-write of the weights reading the gradients (2 + 1 + 3).
_PARAM_PASSES = 6.0
#: Passes over the optimizer state per step: read and written back once (Adam's moments).
_OPTIMIZER_PASSES = 2.0
#: Passes over a sample's saved activations: written in forward, read in backward, and their gradients
#: written and read.
_ACTIVATION_PASSES = 4.0
#: Cores the training process keeps busy besides its loaders: the main thread spins on the GPU all step.
_MAIN_THREAD_CORES = 1.0
#: Unit conversions of the calibration table: nF -> F, pJ -> J, kHz -> Hz.
_F_PER_NF = 1e-9
_J_PER_PJ = 1e-12
_HZ_PER_KHZ = 1e3
#: How far a profile's static split may miss summing to 1 (float rounding of the CSV's shares).
_SPLIT_TOLERANCE = 1e-9

#: Power components, in the order of the rail matrix's columns.
COMPONENTS = ("static", "gpu", "cpu", "emc", "dram")


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
        temperature_c: the board temperature the figures hold at (GPU leakage rises with it).
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
    temperature_c: float | None = None

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.step_time_s

    @property
    def energy_per_step_j(self) -> float:
        return self.power_w * self.step_time_s

    @property
    def energy_per_sample_j(self) -> float:
        return self.energy_per_step_j / self.batch_size


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

    def with_leak_scale(self, scale: float) -> StepPower:
        """The same step with the GPU leakage scaled by ``scale`` (a warmer or cooler board)."""
        return replace(self, gpu_leak=self.gpu_leak * scale)

    def vector(self, gpu_scale: float = 1.0) -> tuple[float, ...]:
        """Component powers in :data:`COMPONENTS` order, the GPU's switching part scaled by ``gpu_scale``."""
        return (self.static, self.gpu * gpu_scale + self.gpu_leak, self.cpu, self.emc, self.dram)


# ---------------------------------------------------------------------------------------------- clocks


def effective_clocks(profile: Profile, setting: Mapping[str, KnobValue],
                     gpu_throttle_hz: float | None = None) -> Clocks:
    """Clocks a step runs at: each knob value capped by the power mode (and the GPU by a throttle)."""
    mode = profile.mode(str(setting["power_mode"]))
    inf = math.inf
    gpu_limit = min(float(setting["gpu_freq"]), mode.gpu_max_hz or inf, gpu_throttle_hz or inf)
    return Clocks(
        gpu_hz=largest_at_most(profile.gpu_freqs_hz, gpu_limit),
        emc_hz=largest_at_most(profile.emc_freqs_hz, min(float(setting["emc_freq"]), mode.emc_max_hz or inf)),
        cpu_khz=largest_at_most(profile.cpu_freqs_khz,
                                min(float(setting["cpu_freq"]), mode.cpu_max_khz or inf)),
        cores=max(1, min(int(setting["cpu_cores"]), mode.cores)),
        tpcs=mode.tpcs,
    )


# ---------------------------------------------------------------------------------------------- step


def voltage(f: float, f_top: float, v_min: float, v_max: float, knee_frac: float) -> float:
    """V/f curve: flat at ``v_min`` up to the knee, then linear to ``v_max`` at the top clock."""
    knee = knee_frac * f_top
    if f <= knee:
        return v_min
    return v_min + (v_max - v_min) * (f - knee) / (f_top - knee)


def overlap(exposed: float, *parts: float) -> float:
    """Time of parts that overlap partially: the largest part plus ``exposed`` of each of the others.

    ``exposed`` = 0 is perfect overlap (the slowest part alone), 1 no overlap (the parts add up). The
    result rises with every part, so a faster clock never lengthens a step.
    """
    top = max(parts)
    return top + exposed * (sum(parts) - top)


def occupancy(profile: Profile, clocks: Clocks, cost: WorkloadCost, batch_size: int) -> float:
    """How full the busy GPU is: b / (b + b_half), b_half = fill work per core x active cores / FLOPs per
    sample (a wider GPU, or a lighter sample, needs a larger batch to saturate); 1 for a cost without
    FLOPs."""
    return _fill(profile, clocks.tpcs, cost, batch_size)


def memory_occupancy(profile: Profile, cost: WorkloadCost, batch_size: int) -> float:
    """The share of the memory system's bandwidth a step's per-sample traffic reaches: :func:`occupancy` of the
    module's whole GPU (all the TPCs its modes power). The requests in flight follow the SMs busy, b x FLOPs
    per sample / fill work at a small batch whatever the TPCs powered, so a mode that gates TPCs reaches the
    bandwidth the whole GPU reaches at that batch, and saturates it at a large batch as the whole GPU does."""
    return _fill(profile, max(mode.tpcs for mode in profile.modes), cost, batch_size)


def _fill(profile: Profile, tpcs: int, cost: WorkloadCost, batch_size: int) -> float:
    if cost.flops_per_sample <= 0:
        return 1.0
    cores = tpcs * profile.calibration.cores_per_tpc
    b_half = profile.calibration.fill_flops_per_core * cores / cost.flops_per_sample
    return batch_size / (batch_size + b_half)


def step_model(profile: Profile, clocks: Clocks, cost: WorkloadCost, batch_size: int
               ) -> tuple[dict[str, float], StepPower]:
    """The roofline step time and DVFS power of one training step (see the module docstring).

    Returns the time parts (``step``, ``compute``, ``memory``, ``gpu``, ``launch``, ``load``, ``full``
    (compute at full occupancy), ``occupancy``, ``traffic`` bytes) and the mean power per component, the
    GPU leakage at the calibration's reference temperature (scale it with :func:`leak_scale`).
    """
    cal = profile.calibration
    b = float(batch_size)
    cores = clocks.tpcs * cal.cores_per_tpc
    f_gpu = float(clocks.gpu_hz)
    f_cpu = clocks.cpu_khz * _HZ_PER_KHZ

    occ = occupancy(profile, clocks, cost, batch_size)
    flops = cost.flops_per_sample * b
    t_full = flops / (cores * _FLOPS_PER_CORE_CYCLE * f_gpu * cal.compute_efficiency)
    t_compute = t_full / occ
    fixed_traffic = _PARAM_PASSES * cost.param_bytes + _OPTIMIZER_PASSES * cost.optimizer_state_bytes
    sample_traffic = b * (_ACTIVATION_PASSES * cost.activation_bytes_per_sample + cost.input_bytes_per_sample)
    traffic = fixed_traffic + sample_traffic
    bandwidth = profile.bus_bytes * TRANSFERS_PER_CLOCK * clocks.emc_hz * cal.memory_efficiency
    # per-sample kernels of a small batch keep few requests in flight, as they keep few SMs busy
    t_memory = (fixed_traffic + sample_traffic / memory_occupancy(profile, cost, batch_size)) / bandwidth
    t_gpu = overlap(cal.gpu_exposed, t_compute, t_memory)

    t_launch = cal.launch_cycles / f_cpu
    load_core_s = b * cost.input_bytes_per_sample * cal.load_cycles_per_byte / f_cpu
    if clocks.cores > 1:
        t_load = load_core_s / (clocks.cores - 1)
        step = overlap(cal.host_exposed, t_gpu, t_launch, t_load)
        busy_cores = _MAIN_THREAD_CORES + load_core_s / step
    else:
        t_load = load_core_s
        step = overlap(cal.host_exposed, t_gpu, t_launch + t_load)
        busy_cores = _MAIN_THREAD_CORES

    v_gpu = voltage(f_gpu, profile.gpu_freqs_hz[-1], cal.gpu_v_min, cal.gpu_v_max, cal.gpu_knee_frac)
    gpu_parts = t_compute + t_memory
    compute_share = t_compute / gpu_parts if gpu_parts > 0 else 0.0
    sm_activity = occ * (compute_share + cal.gpu_memory_activity * (1.0 - compute_share))
    activity = (t_gpu / step) * (cal.gpu_clock_share + (1.0 - cal.gpu_clock_share) * sm_activity)
    p_gpu = cal.gpu_cap_nf_per_tpc * _F_PER_NF * clocks.tpcs * v_gpu**2 * f_gpu * activity
    p_leak = cal.gpu_leak_w_per_tpc * clocks.tpcs * v_gpu / cal.gpu_v_max

    v_cpu = voltage(f_cpu, profile.cpu_freqs_khz[-1] * _HZ_PER_KHZ, cal.cpu_v_min, cal.cpu_v_max,
                    cal.cpu_knee_frac)
    p_core = cal.cpu_cap_nf_per_core * _F_PER_NF * v_cpu**2 * f_cpu
    p_cpu = clocks.cores * cal.cpu_idle_w_per_core + busy_cores * p_core

    p_emc = cal.emc_w_at_max * clocks.emc_hz / profile.emc_freqs_hz[-1]
    p_dram = cal.dram_pj_per_byte * _J_PER_PJ * traffic / step
    times = {"step": step, "compute": t_compute, "memory": t_memory, "gpu": t_gpu, "launch": t_launch,
             "load": t_load, "full": t_full, "occupancy": occ, "traffic": traffic}
    return times, StepPower(cal.static_w, p_gpu, p_leak, p_cpu, p_emc, p_dram)


# ---------------------------------------------------------------------------------------------- thermal


def leak_scale(profile: Profile, temperature_c: float) -> float:
    """GPU leakage at ``temperature_c`` relative to the calibration's reference temperature: it doubles
    every ``leak_doubling_k`` kelvin."""
    cal = profile.calibration
    return 2.0 ** ((temperature_c - cal.leak_ref_c) / cal.leak_doubling_k)


def steady_temperature_c(profile: Profile, power_w: float) -> float:
    """Board temperature after minutes at a constant ``power_w``: ambient + thermal resistance x power."""
    cal = profile.calibration
    return cal.ambient_c + cal.thermal_k_per_w * power_w


def relax_temperature_c(profile: Profile, temperature_c: float, power_w: float, seconds: float) -> float:
    """The first-order board temperature after ``seconds`` at ``power_w``, starting from ``temperature_c``
    (exact for a constant power: relaxing over two spans equals relaxing over their sum)."""
    target = steady_temperature_c(profile, power_w)
    return target + (temperature_c - target) * math.exp(-seconds / profile.calibration.thermal_tau_s)


def idle_power(profile: Profile, clocks: Clocks) -> StepPower:
    """Power at rest: static, the online cores idling, the memory controller at its clock; GPU gated."""
    cal = profile.calibration
    return StepPower(cal.static_w, 0.0, 0.0, clocks.cores * cal.cpu_idle_w_per_core,
                     cal.emc_w_at_max * clocks.emc_hz / profile.emc_freqs_hz[-1], 0.0)


def phase_gpu_scales(ripple: float) -> tuple[float, float]:
    """GPU switching-power scales of the forward and backward phases: forward ``1 - ripple``, backward
    raised so that the step's time-weighted mean stays 1."""
    return 1.0 - ripple, 1.0 + ripple * FORWARD_SHARE / (1.0 - FORWARD_SHARE)


# ---------------------------------------------------------------------------------------------- rails


def rail_matrix(profile: Profile) -> tuple[tuple[float, ...], ...]:
    """rows: sensor channels; columns: :data:`COMPONENTS`; rail power = row . component powers."""
    layout, split = profile.rails, dict(profile.calibration.static_split)
    unknown = set(split) - set(layout.channels)
    if unknown or abs(sum(split.values()) - 1.0) > _SPLIT_TOLERANCE:
        raise DeviceError(f"profile {profile.name}: static_split must share 1.0 over {layout.channels}")
    rows = []
    for channel in layout.channels:
        if channel == layout.input_rail:
            rows.append((1.0,) * len(COMPONENTS))  # the input rail carries every component
            continue
        rows.append((split.get(channel, 0.0),) + tuple(
            1.0 if getattr(layout, component) == channel else 0.0 for component in COMPONENTS[1:]))
    return tuple(rows)


def rail_powers(matrix: tuple[tuple[float, ...], ...], cpu_column: tuple[float, ...], power: StepPower,
                gpu_scale: float = 1.0, offset_w: float = 0.0) -> tuple[float, ...]:
    """Rail powers of component powers (GPU switching scaled by ``gpu_scale``) plus ``offset_w`` of
    another process's CPU load on the rails the CPU flows through (``cpu_column``)."""
    comp = power.vector(gpu_scale)
    return tuple(sum(w * c for w, c in zip(row, comp)) + off * offset_w
                 for row, off in zip(matrix, cpu_column))


def board_total(layout: RailLayout, rails: tuple[float, ...]) -> float:
    """The board total of rail powers: the input rail where the module has one, else their sum."""
    if layout.input_rail is not None:
        return rails[layout.channels.index(layout.input_rail)]
    return sum(rails)
