"""The twin itself: knobs as on the board, ground truth, the training step on a virtual clock, the device.

Setting a power mode does what ``nvpmodel -m`` does: it applies the mode's caps (online cores, CPU, GPU and
EMC maxima, power-gated GPU TPCs) and sets each clock knob to the mode's maximum, as the governor runs them
under load. The twin starts in the module's default mode. A knob set above the current mode's cap reads
back as set but runs at the cap (as devfreq clamps a ``max_freq`` above nvpmodel's limit).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from edgetune.power.base import (
    Capability,
    Device,
    DeviceError,
    DeviceOutOfMemoryError,
    Knob,
    KnobValue,
    ModeCaps,
    WorkloadCost,
    format_value,
)
from edgetune.power.clock import VirtualClock
from edgetune.power.knobs import BatchSizeError, check_batch_size, knob_unit
from edgetune.power.registry import PlatformProbe
from edgetune.power.sim.physics import (
    COMPONENTS,
    FORWARD_SHARE,
    Clocks,
    Expected,
    StepPower,
    board_total,
    effective_clocks,
    idle_power,
    largest_at_most,
    leak_scale,
    phase_gpu_scales,
    rail_matrix,
    rail_powers,
    relax_temperature_c,
    steady_temperature_c,
    step_model,
)
from edgetune.power.sim.profiles import DEFAULT_PROFILE, GIB, MIB, PROFILES, PowerMode, Profile
from edgetune.power.sim.sensor import TwinSensor

__all__ = ["Twin", "TwinBatchSizeError", "open", "probe"]

T = TypeVar("T")

#: Stream id mixed into the twin's seed for the step-time jitter (the sensor noise has its own stream).
_JITTER_STREAM = 0x57E9
#: Bound on the ground-truth cache: a search visits a few thousand settings; an oracle sweep may visit
#: more, so the cache is cleared past this many entries rather than grow without end.
_CACHE_MAX_ENTRIES = 65536
#: Step segments older than this many sensor update periods are dropped: the sensor reads the power at
#: the last update instant, at most one period back.
_SEGMENT_HORIZON_PERIODS = 2.0
#: Fixed-point iterations of :meth:`Twin.steady_state` (temperature -> leakage -> power -> temperature):
#: each shrinks the error by R_th x dP/dT, about 0.1, so a few reach a millikelvin.
_STEADY_ITERATIONS = 12

_KNOB_DESCRIPTIONS = {
    "gpu_freq": "GPU clock (devfreq); runs at min(value, power-mode cap, thermal throttle)",
    "emc_freq": "memory (EMC) clock; runs at min(value, power-mode cap)",
    "cpu_freq": "CPU clock of every cluster; runs at min(value, power-mode cap)",
    "cpu_cores": "online CPU cores; at most the power mode's",
    "power_mode": "nvpmodel mode: sets core count and clock caps, clocks to the mode's maximum",
}


class Twin:
    """A simulated Jetson module on a virtual clock.

    Args:
        profile: a :class:`~edgetune.power.sim.profiles.Profile` or a profile name (``orin-nano``).
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
        self._rng = np.random.default_rng([self.seed, _JITTER_STREAM])
        self._matrix = rail_matrix(profile)
        self._cpu_column = tuple(row[COMPONENTS.index("cpu")] for row in self._matrix)
        self._setting: dict[str, KnobValue] = {}
        self._apply_mode(profile.default_mode)
        self._throttle_hz: float | None = None
        self._offset_w = 0.0
        # (start, end, clean rail powers) of the steps run; trimmed as time passes
        self._segments: deque[tuple[float, float, tuple[float, ...]]] = deque()
        self._cache: dict[tuple, tuple[dict[str, float], StepPower, float]] = {}
        self._idle_cache: dict[Clocks, tuple[float, ...]] = {}
        self.steps = 0
        self.sensor = TwinSensor(self)
        self.knobs = self._make_knobs()
        self._allowed = {name: frozenset(v for v in knob.values if not isinstance(v, bool))
                         for name, knob in self.knobs.items()}
        self._device: Device | None = None
        self._in_step = False
        # the board starts warmed to its idle steady state (it has been on), at virtual time 0
        self._temperature_c = steady_temperature_c(profile, self.idle_power_w)
        self._temperature_t = self.clock.now()

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
            "gpu_freq": largest_at_most(p.gpu_freqs_hz, mode.gpu_max_hz or math.inf),
            "emc_freq": largest_at_most(p.emc_freqs_hz, mode.emc_max_hz or math.inf),
            "cpu_freq": largest_at_most(p.cpu_freqs_khz, mode.cpu_max_khz or math.inf),
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
            if self._in_step:  # written at a tick inside a step (a watchdog): the step re-times its rest
                self.clock.interrupt()
        return write

    def _make_knobs(self) -> dict[str, Knob]:
        return {
            name: Knob(name, knob_unit(name), values,
                       read=lambda name=name: self._setting[name], write=self._write(name),
                       description=_KNOB_DESCRIPTIONS[name],
                       caps=self.mode_caps() if name == "power_mode" else None)
            for name, values in self.knob_grid().items()
        }

    def mode_caps(self) -> dict[str, ModeCaps]:
        """What each power mode does to the other knobs: the values ``nvpmodel -m`` leaves are the largest
        each knob runs at (:meth:`_mode_setting`), and the gated TPCs no knob controls."""
        return {m.name: ModeCaps(tuple((k, v) for k, v in self._mode_setting(m).items() if k != "power_mode"),
                                 (("tpcs", m.tpcs),))
                for m in self.profile.modes}

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

        A step already running finishes at the clock it started with (a knob written during a step, by
        contrast, re-times the rest of it: :meth:`run_step`).
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
        return rail_powers(self._matrix, self._cpu_column, power, gpu_scale, offset_w)

    def _total(self, rails: tuple[float, ...]) -> float:
        return board_total(self.profile.rails, rails)

    def _model(self, cost: WorkloadCost, batch_size: int, clocks: Clocks
               ) -> tuple[dict[str, float], StepPower, float]:
        """The temperature-free step model (times, component powers at the reference temperature, memory
        needed), cached: a search revisits settings, and the board temperature changes every step."""
        key = (cost, batch_size, clocks)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > _CACHE_MAX_ENTRIES:
                self._cache.clear()
            times, power = step_model(self.profile, clocks, cost, batch_size)
            hit = self._cache[key] = (times, power, cost.memory_bytes(batch_size))
        return hit

    def _evaluate(self, cost: WorkloadCost, batch_size: int, clocks: Clocks, temperature_c: float
                  ) -> tuple[Expected, tuple[float, ...], tuple[float, ...]]:
        """Ground truth at ``clocks`` and ``temperature_c``, and the clean rail powers of the forward and
        backward phases.

        The phase rails exclude the power offset: the sensor adds the offset in force when it reads, so a
        change shows at once even in the middle of a step.
        """
        times, reference, memory = self._model(cost, batch_size, clocks)
        power = reference.with_leak_scale(leak_scale(self.profile, temperature_c))
        forward_scale, backward_scale = phase_gpu_scales(self.profile.calibration.ripple)
        forward = self._rails(power, forward_scale)
        backward = self._rails(power, backward_scale)
        offset = self._offset_w
        mean = self._rails(power, 1.0, offset)
        peak = max(self._total(self._with_offset(forward)), self._total(self._with_offset(backward)))
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
            temperature_c=temperature_c,
        )
        return expected, forward, backward

    def expected(self, cost: WorkloadCost, batch_size: int,
                 setting: Mapping[str, KnobValue] | None = None, *,
                 temperature_c: float | None = None) -> Expected:
        """Noise-free step time and power of ``cost`` at ``batch_size`` under ``setting``.

        ``setting`` maps knob names to values (or ``min``/``max``/``918MHz`` text); knobs it leaves out
        keep their current values, and a power mode in it resets the clocks under it as applying it would.
        The figures include any disturbance in force (power offset, throttle) and hold at the board
        temperature ``temperature_c``: by default the board's temperature now (:attr:`temperature_c`), so
        they are what the next step would draw; the board then warms or cools towards the load's steady
        state over minutes (:meth:`steady_state`).
        """
        batch_size = _batch_size(batch_size)
        temperature = self.temperature_c if temperature_c is None else float(temperature_c)
        return self._evaluate(cost, batch_size, self.effective_clocks(setting), temperature)[0]

    def steady_state(self, cost: WorkloadCost, batch_size: int,
                     setting: Mapping[str, KnobValue] | None = None) -> Expected:
        """:meth:`expected` after minutes of this load: at the temperature where the board's heat balance
        (ambient + thermal resistance x power) and the leakage it causes agree."""
        batch_size = _batch_size(batch_size)
        clocks = self.effective_clocks(setting)
        temperature = self.temperature_c
        for _ in range(_STEADY_ITERATIONS):
            power_w = self._evaluate(cost, batch_size, clocks, temperature)[0].power_w
            temperature = steady_temperature_c(self.profile, power_w)
        return self._evaluate(cost, batch_size, clocks, temperature)[0]

    # -- temperature -----------------------------------------------------------------------------
    @property
    def temperature_c(self) -> float:
        """The board temperature now: first order towards ambient + R_th x power, time constant
        ``thermal_tau_s``; steps heat it with their power, rest lets it cool towards the idle state."""
        self._settle(self.clock.now())
        return self._temperature_c

    def temperature_reading_c(self) -> float:
        """The board temperature as its thermal zone reports it: :attr:`temperature_c` in the zone's steps
        (calibration ``thermal_resolution_k``; the search reads this, never the exact figure)."""
        step = self.profile.calibration.thermal_resolution_k
        return round(self.temperature_c / step) * step

    def set_temperature(self, temperature_c: float) -> None:
        """Put the board at ``temperature_c`` now (a test's or benchmark's starting condition)."""
        if not math.isfinite(temperature_c):
            raise ValueError(f"temperature must be finite, got {temperature_c}")
        self._settle(self.clock.now())
        self._temperature_c = float(temperature_c)

    def _settle(self, now: float) -> None:
        """Relax the temperature over the rest since the last step (idle power at the current knobs)."""
        if now > self._temperature_t:
            self._temperature_c = relax_temperature_c(self.profile, self._temperature_c, self.idle_power_w,
                                                      now - self._temperature_t)
            self._temperature_t = now

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

        A knob written while the clock advances (a ticker's callback: the search's watchdog stopping a setting
        over the budget in the middle of a long step) takes effect at once, as a clock write does on the
        board: the step's remaining work runs at the new clocks, with their time and power.

        Raises :class:`DeviceOutOfMemoryError` (torch's message) when the batch does not fit.
        """
        if cost is None:
            raise DeviceError("the simulated twin needs the workload's cost to time a step; "
                              "pass cost=workload.cost")
        batch_size = _batch_size(batch_size)
        clocks = self.effective_clocks()
        expected, forward, backward = self._evaluate(cost, batch_size, clocks, self.temperature_c)
        if not expected.fits:
            raise DeviceOutOfMemoryError(self._oom_message(cost, batch_size))
        result = fn() if self.compute else None
        jitter = self.profile.calibration.step_jitter
        # log-normal with unit mean: the average step time stays the modelled one
        factor = math.exp(jitter * float(self._rng.standard_normal()) - jitter**2 / 2)
        start = self.clock.now()
        segments = self._segments
        horizon = start - _SEGMENT_HORIZON_PERIODS * self.sensor.update_period_s
        while segments and segments[0][1] <= horizon:
            segments.popleft()
        self.steps += 1
        done = 0.0  # share of the step's work done
        self._in_step = True
        try:
            while True:
                dt = expected.step_time_s * factor  # the whole step at the clocks in force
                t0, left_s = self.clock.now(), (1.0 - done) * dt
                self._plan(t0, done, dt, forward, backward)
                # the step heats the board with its mean power (each stretch at the temperature it started at)
                temperature_c = self._temperature_c
                self._temperature_c = relax_temperature_c(self.profile, temperature_c, expected.power_w, left_s)
                self._temperature_t = t0 + left_s
                if self.clock.advance(left_s) <= 0.0:
                    break
                now = self.clock.now()
                self._temperature_c = relax_temperature_c(self.profile, temperature_c, expected.power_w, now - t0)
                self._temperature_t = now
                done = min(1.0, done + (now - t0) / dt)
                clocks = self.effective_clocks()
                expected, forward, backward = self._evaluate(cost, batch_size, clocks, self._temperature_c)
        finally:
            self._in_step = False
        return result

    def _plan(self, t0: float, done: float, dt: float, forward: tuple[float, ...],
              backward: tuple[float, ...]) -> None:
        """Lay out the step's phases from ``t0`` on, ``done`` of its work behind it and ``dt`` for the whole
        step at these clocks; whatever was planned past ``t0`` (at other clocks) is dropped."""
        segments = self._segments
        while segments and segments[-1][0] >= t0:
            segments.pop()
        if segments and segments[-1][1] > t0:
            segments[-1] = (segments[-1][0], t0, segments[-1][2])
        end = t0 + (1.0 - done) * dt
        if done < FORWARD_SHARE:
            split = t0 + (FORWARD_SHARE - done) * dt
            segments.append((t0, split, forward))
            segments.append((split, end, backward))
        else:
            segments.append((t0, end, backward))

    def power_at(self, t: float) -> tuple[float, ...]:
        """Clean rail powers at virtual time ``t`` (at most one update period in the past): the step
        phase running then, else idle at the current knob values; plus the power offset in force.
        The sensor reads it at each update instant."""
        segments = self._segments
        while segments and segments[0][1] <= t:
            segments.popleft()
        if segments and segments[0][0] <= t:
            return self._with_offset(segments[0][2])
        return self._with_offset(self._idle_rails())

    def _oom_message(self, cost: WorkloadCost, batch_size: int) -> str:
        p = self.profile
        capacity = p.visible_memory_bytes
        allocated = cost.memory_bytes(0)  # weights, gradients and optimizer state: before any sample
        wanted = cost.memory_bytes(batch_size) - allocated
        free = max(0.0, p.training_memory_bytes - allocated)
        return (f"CUDA out of memory. Tried to allocate {wanted / MIB:.2f} MiB (GPU 0; {capacity / GIB:.2f} GiB "
                f"total capacity; {allocated / GIB:.2f} GiB already allocated; {free / GIB:.2f} GiB free; "
                f"{(capacity - p.training_memory_bytes) / GIB:.2f} GiB held by the OS and runtime) "
                f"[simulated {p.description}: batch size {batch_size} needs "
                f"{cost.memory_bytes(batch_size) / GIB:.2f} GiB; use a smaller batch]")

    # -- device ----------------------------------------------------------------------------------
    @property
    def capabilities(self) -> frozenset[Capability]:
        """Virtual clock and ground truth always; the step skipped where ``compute`` is off."""
        caps = {Capability.VIRTUAL_CLOCK, Capability.GROUND_TRUTH}
        if not self.compute:
            caps.add(Capability.SKIPS_STEP)
        return frozenset(caps)

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
                idle_power=lambda: self.idle_power_w,  # read when asked: knobs and offset change it
                max_power_w=self.profile.power_max_w,
                temperature=self.temperature_reading_c,
                notes=[self.profile.calibration_note, *self._reboot_note()],
                backend=self,
                capabilities=self.capabilities,
            )
        return self._device

    def _reboot_note(self) -> list[str]:
        """Where the twin's freedom to switch every power mode live differs from the board's: the modes a board
        booted in the default mode cannot enter without a reboot (another GPU power-gating mask)."""
        modes = self.profile.modes
        booted = next((m for m in modes if m.default), modes[0])
        held = [m.name for m in modes if m.pg_mask != booted.pg_mask]
        if not held:
            return []
        them = "it" if len(held) == 1 else "them"
        note = (f"simulation: every power mode switches live here; a real board booted in {booted.name} needs a "
                f"reboot for {', '.join(held)} (another GPU power-gating mask), and a search there does not "
                f"switch to {them}")
        return [note]


class TwinBatchSizeError(DeviceError, BatchSizeError):
    """A batch size the twin cannot run (not a positive whole number): the registry's
    :class:`~edgetune.power.knobs.BatchSizeError` (a ValueError) and a :class:`DeviceError`, so the CLI
    prints it as one line like every other device error."""


def _batch_size(value: Any) -> int:
    """``value`` checked by :func:`~edgetune.power.knobs.check_batch_size` (numpy integers, as batch sizes
    taken from arrays are, count as whole numbers); :class:`TwinBatchSizeError` if it is not one."""
    if isinstance(value, np.integer):
        value = int(value)
    try:
        return check_batch_size(value)
    except BatchSizeError as exc:
        raise TwinBatchSizeError(str(exc)) from None


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
                *(f"{knob}: {_describe_range(values, knob_unit(knob))}" for knob, values in grid.items()),
                profile.calibration_note,
            ],
        ))
    return found
