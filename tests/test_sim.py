"""The simulated Jetson twin: calibration points, the published batch-size/frequency effect, the sensor,
determinism, out-of-memory, power modes, knobs and disturbances.

The workload cost is the real one: the built-in ``cnn`` measured by torch's FLOP counter.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edgetune.power import (
    DeviceError,
    DeviceOutOfMemoryError,
    KnobValueError,
    PowerMonitor,
    VirtualClock,
    is_out_of_memory,
    open_device,
    sim,
)
from edgetune.power.base import Capability, WorkloadCost
from edgetune.power.knobs import BatchSizeError
from edgetune.power.sim import PROFILES, Twin
from edgetune.power.sim.physics import voltage
from edgetune.power.sim.ratios import PUBLISHED, format_ratio_table, ratio_rows
from edgetune.workloads import load_workload


@pytest.fixture(scope="module")
def cnn():
    return load_workload("cnn", seed=0)


@pytest.fixture(scope="module")
def cost(cnn):
    return cnn.cost


def measure(twin: Twin, cost, batch_size: int, seconds: float, warmup_s: float = 1.0):
    """Train for ``seconds`` of virtual time under a power monitor; the window's statistics."""
    device = twin.device()
    with PowerMonitor(device.sensor, device.clock) as monitor:
        end = device.clock.now() + warmup_s
        while device.clock.now() < end:
            device.run_step(lambda: None, batch_size, cost)
        monitor.begin_window("train")
        end = device.clock.now() + seconds
        steps = 0
        while device.clock.now() < end:
            device.run_step(lambda: None, batch_size, cost)
            steps += 1
        stats = monitor.end_window("train")
    return stats, steps


def steps_to_target(batch_size: int, s_min: float, b_noise: float) -> float:
    """McCandlish et al.: optimizer steps to a target loss at batch size b."""
    return s_min * (1.0 + b_noise / batch_size)


# ---------------------------------------------------------------------------------------------- profiles


def test_profiles_carry_the_module_tables():
    assert {"orin-agx", "orin-nx", "orin-nano", "xavier-nx"} <= set(PROFILES)
    agx = PROFILES["orin-agx"]
    assert agx.module == "AGX Orin 64GB"
    assert agx.gpu_freqs_hz[0] == 306_000_000 and agx.gpu_freqs_hz[-1] == 1_300_500_000  # JetPack 6 table
    assert len(agx.gpu_freqs_hz) == 11
    assert agx.emc_freqs_hz == (204_000_000, 665_600_000, 2_133_000_000, 3_199_000_000)
    nano = PROFILES["orin-nano"]
    assert nano.gpu_freqs_hz == (306_000_000, 408_000_000, 510_000_000, 612_000_000, 624_750_000)
    assert [m.name for m in nano.modes] == ["7W", "15W"] and nano.default_mode.name == "15W"
    assert nano.power_min_w == 7 and nano.power_max_w == 15
    assert nano.memory_bytes == 8 * 1024**3
    assert abs(nano.memory_bw_bytes_s - 68e9) < 1
    for profile in PROFILES.values():
        budgets = [m.budget_w for m in profile.modes]
        assert budgets == sorted(budgets)
        assert sum(m.default for m in profile.modes) == 1
        for mode in profile.modes:
            # every cap the modes set is a step of the module's own tables
            assert mode.gpu_max_hz is None or mode.gpu_max_hz in profile.gpu_freqs_hz
            assert mode.emc_max_hz is None or mode.emc_max_hz in profile.emc_freqs_hz
            assert mode.cpu_max_khz is None or mode.cpu_max_khz in profile.cpu_freqs_khz
            assert 1 <= mode.cores <= profile.cpu_cores
            assert 1 <= mode.tpcs * profile.calibration.cores_per_tpc <= profile.cuda_cores
    # tpc_pg_mask power-gates half of the Orin Nano's GPU in its 7W mode
    assert nano.mode("7W").tpcs == 2 and nano.mode("15W").tpcs == 4
    assert PROFILES["orin-nx"].modes[-1].name == "MAXN"


def test_device_contract():
    device = sim.open("orin-nano", seed=3, compute=False)
    twin = device.backend
    assert isinstance(twin, Twin) and twin.seed == 3 and not twin.compute
    assert device.name == "sim:orin-nano" and device.simulated
    assert device.description == "NVIDIA Jetson Orin Nano 8GB (simulated)"
    assert isinstance(device.clock, VirtualClock) and device.clock is twin.clock
    assert set(device.knobs) == {"gpu_freq", "emc_freq", "cpu_freq", "cpu_cores", "power_mode"}
    assert {k: v.unit for k, v in device.knobs.items()} == {
        "gpu_freq": "Hz", "emc_freq": "Hz", "cpu_freq": "kHz", "cpu_cores": "cores", "power_mode": ""}
    assert all(knob.writable for knob in device.knobs.values())
    assert twin.knob_grid()["cpu_cores"] == (1, 2, 3, 4, 5, 6)
    assert device.idle_power_w == pytest.approx(twin.idle_power_w)
    assert device.max_power_w == 15
    assert len(device.notes) == 2 and "SOURCES.md" in device.notes[0]
    assert device.notes[1] == ("simulation: every power mode switches live here; a real board booted in 15W needs a "
                               "reboot for 7W (another GPU power-gating mask), and a search there does not switch "
                               "to it")
    assert len(open_device("sim:xavier-nx", compute=False).notes) == 1  # one mask for every mode: nothing to say
    # the twin starts in the default mode, clocks at the mode's maximum
    assert device.settings() == {"gpu_freq": 624_750_000, "emc_freq": 2_133_000_000, "cpu_freq": 1_497_600,
                                 "cpu_cores": 6, "power_mode": "15W"}
    assert device.sensor.total_label == "VDD_IN"
    assert device.sensor.rails == ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")
    assert device.sensor.energy_j() is None

    assert open_device("sim:orin-agx").backend.profile.name == "orin-agx"
    assert open_device("sim").backend.profile.name == "orin-nano"  # the embedded default
    with pytest.raises(DeviceError, match=r"unknown simulated profile 'orin-tx'.*orin-agx, orin-nano"):
        open_device("sim:orin-tx")

    probes = sim.probe()
    assert [p.spec for p in probes] == [f"sim:{name}" for name in PROFILES]
    assert all(p.found and p.platform == "sim" and "simulated" in p.summary for p in probes)


def test_capabilities_say_virtual_clock_ground_truth_and_whether_the_step_runs():
    computing = sim.open("orin-nano", compute=True)
    assert computing.capabilities == {Capability.VIRTUAL_CLOCK, Capability.GROUND_TRUTH}
    assert computing.has(Capability.GROUND_TRUTH) and not computing.has(Capability.SKIPS_STEP)
    timing_only = open_device("sim:orin-agx", compute=False)
    assert timing_only.capabilities == {Capability.VIRTUAL_CLOCK, Capability.GROUND_TRUTH, Capability.SKIPS_STEP}
    assert not timing_only.has(Capability.ENERGY_COUNTER) and not timing_only.has(Capability.TABLE_REPLAY)


def test_device_idle_power_is_read_when_asked():
    """The device's idle power follows the twin's knobs and disturbances, not the state it was built in."""
    twin = Twin("orin-nano", compute=False)
    device = twin.device()
    at_start = device.idle_power_w
    device.apply({"power_mode": "7W"})
    idle_7w = twin.idle_power_w
    assert device.idle_power_w == idle_7w < at_start  # four cores online at rest instead of six
    twin.set_power_offset(2.0)  # another process's load counts at rest too
    assert device.idle_power_w == twin.idle_power_w == pytest.approx(idle_7w + 2.0)
    device.restore()
    twin.set_power_offset(0.0)
    assert device.idle_power_w == at_start


def test_a_mode_that_gates_tpcs_never_steps_faster_than_the_whole_gpu_at_its_clocks():
    """Only the TPCs powered differ (the clocks, cores and batch are the same): fewer SMs cannot finish a step
    sooner. The small-batch memory term followed the share of the powered SMs busy, so the Orin Nano's 7W mode
    (2 of 4 TPCs) stepped a MobileNet-like batch of 1 in 13.5 ms against the whole GPU's 19.2 ms."""
    light = WorkloadCost(flops_per_sample=1.7e8, param_bytes=2.8e6, activation_bytes_per_sample=1.07e7,
                         input_bytes_per_sample=12296.0, optimizer_state_bytes=2.8e6)  # the built-in mobilenet's
    for name in PROFILES:
        twin = Twin(name, compute=False)
        modes = twin.profile.modes
        whole = max(modes, key=lambda m: m.tpcs)
        for gated in (m for m in modes if m.tpcs < whole.tpcs):
            low = {knob: min(getattr(twin.effective_clocks({"power_mode": m.name}), attr) for m in (gated, whole))
                   for knob, attr in (("gpu_freq", "gpu_hz"), ("emc_freq", "emc_hz"), ("cpu_freq", "cpu_khz"),
                                      ("cpu_cores", "cores"))}
            for batch_size in (1, 4, 16, 64, 256):
                fewer = twin.expected(light, batch_size, {"power_mode": gated.name, **low})
                every = twin.expected(light, batch_size, {"power_mode": whole.name, **low})
                assert fewer.clocks.tpcs < every.clocks.tpcs
                assert (fewer.clocks.gpu_hz, fewer.clocks.emc_hz, fewer.clocks.cpu_khz, fewer.clocks.cores) == \
                    (every.clocks.gpu_hz, every.clocks.emc_hz, every.clocks.cpu_khz, every.clocks.cores)
                assert fewer.step_time_s >= every.step_time_s, (name, gated.name, batch_size)


# ---------------------------------------------------------------------------------------------- calibration


def test_orin_nano_calibration_points(cost, cnn):
    """Full training load sits near each nvpmodel budget; idle well below the smallest."""
    twin = Twin("orin-nano", compute=False)
    assert 3.0 < twin.idle_power_w < 7.0 * 0.75
    for batch_size in (cnn.default_batch_size, 256):
        seven = twin.steady_state(cost, batch_size, {"power_mode": "7W"})  # sustained load: the warm board
        fifteen = twin.steady_state(cost, batch_size, {"power_mode": "15W"})
        assert seven.power_w == pytest.approx(7.0, abs=0.5)
        assert 12.5 <= fifteen.power_w <= 15.0
        assert seven.gpu_util > 0.95 and fifteen.gpu_util > 0.95  # full load indeed
    # measured through the sensor, in the 7W mode
    twin.device().apply({"power_mode": "7W"})
    stats, _ = measure(twin, cost, cnn.default_batch_size, seconds=10.0)
    assert stats.mean_w == pytest.approx(7.0, abs=0.5)
    assert stats.max_avg_w < 7.6


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_stays_inside_its_envelope(name, cost):
    twin = Twin(name, compute=False)
    profile = twin.profile
    for mode in profile.modes:
        mode_twin = Twin(name, compute=False)
        mode_twin.knobs["power_mode"].set(mode.name)
        assert mode_twin.idle_power_w < profile.power_min_w  # idle leaves every mode room for load
        full = twin.steady_state(cost, 256, {"power_mode": mode.name})  # the warm board: the worst case
        assert full.fits
        assert full.power_w <= 1.1 * mode.budget_w, mode.name
        assert full.peak_power_w <= profile.power_max_w
    top = twin.steady_state(cost, 256, {"power_mode": profile.modes[-1].name})
    assert top.power_w >= 0.5 * profile.power_max_w  # the top mode really loads the module


def test_agx_orin_maxn_within_its_60w_envelope(cost):
    twin = Twin("orin-agx", compute=False)
    assert twin.profile.power_min_w == 15 and twin.profile.power_max_w == 60
    assert 5.0 < twin.idle_power_w < 15.0
    maxn = twin.steady_state(cost, 512, {"power_mode": "MAXN"})
    assert 30.0 <= maxn.power_w <= 60.0 and maxn.peak_power_w <= 60.0
    assert maxn.clocks.gpu_hz == 1_300_500_000 and maxn.clocks.tpcs == 8 and maxn.clocks.cores == 12
    # the default 30W mode gates half the GPU and caps it at 612 MHz: slower and cooler
    default = twin.expected(cost, 512)
    assert default.clocks.gpu_hz == 612_000_000 and default.clocks.tpcs == 4
    assert default.step_time_s > 2 * maxn.step_time_s and default.power_w < maxn.power_w / 2
    # the derived total is the sum of the module rails
    assert sum(maxn.rails_w.values()) == pytest.approx(maxn.power_w)
    assert twin.sensor.total_label.startswith("derived: VDD_GPU_SOC + VDD_CPU_CV")


def test_smaller_batch_at_higher_gpu_clock_trains_faster_under_a_tight_cap(cost, cnn):
    """Ahmed et al. (TMLR 2025): under a tight power cap, a smaller batch at a higher GPU frequency
    reaches the target sooner than the default batch at the highest frequency whose power fits."""
    twin = Twin("orin-nano", compute=False)
    default_b = cnn.default_batch_size
    b_noise = cnn.b_noise  # the cnn's measured gradient noise scale (workloads.models, convergence_truth.py)
    cap_w = 10.0
    freqs = twin.knob_grid()["gpu_freq"]

    def fits(b, f):
        return twin.expected(cost, b, {"gpu_freq": f}).power_w <= cap_w

    def time_to_target(b, f):
        return twin.expected(cost, b, {"gpu_freq": f}).step_time_s * steps_to_target(b, 1000, b_noise)

    base_f = max(f for f in freqs if fits(default_b, f))
    assert base_f < freqs[-1]  # the cap binds
    small_b = default_b // 4
    small_f = max(f for f in freqs if fits(small_b, f))
    assert small_f > base_f
    assert time_to_target(small_b, small_f) < 0.95 * time_to_target(default_b, base_f)
    # per step the default batch is still the more efficient: the gain is the frequency the cap allows
    small, base = (twin.expected(cost, b, {"gpu_freq": f}) for b, f in ((small_b, small_f), (default_b, base_f)))
    assert small.power_w < cap_w and base.power_w < cap_w
    assert small.occupancy < base.occupancy


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_power_and_step_time_are_monotone(name, cost):
    twin = Twin(name, compute=False)
    grid = twin.knob_grid()
    for mode in grid["power_mode"]:
        freqs = [f for f in grid["gpu_freq"] if f <= twin.expected(cost, 1, {"power_mode": mode}).clocks.gpu_hz]
        for b in (1, 8, 32, 128, 512):
            runs = [twin.expected(cost, b, {"power_mode": mode, "gpu_freq": f}) for f in freqs]
            assert all(a.power_w < z.power_w for a, z in itertools.pairwise(runs))
            assert all(a.step_time_s > z.step_time_s for a, z in itertools.pairwise(runs))
        for f in freqs:
            runs = [twin.expected(cost, b, {"power_mode": mode, "gpu_freq": f})
                    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]
            assert all(a.power_w < z.power_w for a, z in itertools.pairwise(runs))
            assert all(a.samples_per_s < z.samples_per_s for a, z in itertools.pairwise(runs))
            assert all(r.peak_power_w > r.power_w for r in runs)
    # slower memory costs time; fewer cores at a low CPU clock make the host the bottleneck
    twin.device().apply({"power_mode": grid["power_mode"][-1]})
    fast = twin.expected(cost, 128)
    assert twin.expected(cost, 128, {"emc_freq": "min"}).step_time_s > fast.step_time_s
    assert twin.expected(cost, 8, {"cpu_freq": "min", "cpu_cores": 1}).step_time_s > \
        twin.expected(cost, 8).step_time_s


# ---------------------------------------------------------------------------------------------- sensor


def test_monitor_measures_the_expected_power_and_energy(cost):
    twin = Twin("orin-nano", seed=1, compute=False)
    expected = twin.expected(cost, 64)
    stats, steps = measure(twin, cost, 64, seconds=20.0)
    assert stats.mean_w == pytest.approx(expected.power_w, rel=0.02)
    assert stats.energy_j == pytest.approx(expected.power_w * stats.duration_s, rel=0.02)
    assert stats.duration_s / steps == pytest.approx(expected.step_time_s, rel=0.02)
    assert stats.peak_w > stats.mean_w  # forward/backward ripple
    assert stats.max_avg_w == pytest.approx(expected.power_w, rel=0.05)  # steady training
    for rail, mean in expected.rails_w.items():
        assert stats.rail_energy_j[rail] / stats.duration_s == pytest.approx(mean, rel=0.03)


def test_sensor_holds_its_value_between_updates_and_idles_between_steps(cost):
    twin = Twin("orin-nano", seed=2, compute=False)
    sensor = twin.sensor
    assert sensor.update_period_s == pytest.approx(0.0066)
    twin.clock.advance(0.0101)  # inside the second update period
    first = sensor.read()
    twin.clock.advance(0.001)
    second = sensor.read()
    assert second.t > first.t and second.total_w == first.total_w and second.rails == first.rails
    twin.clock.advance(sensor.update_period_s)
    assert sensor.read().total_w != first.total_w  # a new conversion: new noise
    # idle readings scatter around the idle power
    readings = []
    for _ in range(300):
        twin.clock.sleep(sensor.update_period_s)
        readings.append(sensor.read().total_w)
    assert sum(readings) / len(readings) == pytest.approx(twin.idle_power_w, rel=0.01)
    spread = math.sqrt(sum((r - twin.idle_power_w) ** 2 for r in readings) / len(readings))
    assert 0.01 < spread < 0.2  # a few tens of milliwatts, as an INA3221 shows
    twin.run_step(lambda: None, 128, cost)
    assert sensor.read().total_w > twin.idle_power_w + 3  # the step's power shows at the next update


def test_a_clock_written_in_the_middle_of_a_step_re_times_the_rest_of_it(cost):
    """A knob written at a tick inside a step (the search's watchdog stopping a setting over the budget) takes
    effect at once, as on the board: the rest of the step's work runs at the new clocks, at their power."""
    fast = {"gpu_freq": "max", "emc_freq": "max"}
    slow = {"gpu_freq": "min", "emc_freq": "min"}
    ref = Twin("orin-nano", seed=3, compute=False)
    ref.device().apply(fast)
    ref.run_step(lambda: None, 128, cost)
    whole_s = ref.clock.now()  # the step at the fast clocks alone (the same seed: the same jitter)

    twin = Twin("orin-nano", seed=3, compute=False)
    device = twin.device()
    device.apply(fast)
    t_fast, t_slow = twin.expected(cost, 128, fast).step_time_s, twin.expected(cost, 128, slow).step_time_s
    p_slow = twin.expected(cost, 128, slow).power_w
    cut_at = 0.3 * whole_s
    readings = []

    def watch():
        readings.append(twin.sensor.read())
        if twin.clock.now() >= cut_at and device.knobs["gpu_freq"].read() != device.knobs["gpu_freq"].min:
            device.apply(slow)

    with PowerMonitor(device.sensor, device.clock) as monitor:
        tid = twin.clock.add_ticker(0.005, watch)
        twin.run_step(lambda: None, 128, cost)
        twin.clock.remove_ticker(tid)
        monitor.sample()
    changed = next(r.t for r in readings if r.t >= cut_at)
    share_left = 1.0 - changed / whole_s
    assert twin.clock.now() == pytest.approx(changed + share_left * whole_s * t_slow / t_fast, rel=1e-9)
    assert twin.clock.now() > 2 * whole_s  # the slow clocks take the rest far longer
    late = [r.total_w for r in readings if r.t > changed + 0.05]
    assert np.mean(late) == pytest.approx(p_slow, rel=0.05)  # drawn at the slow clocks' power
    # not in a step, a knob write changes the next step only
    twin.clock.advance(0.1)
    device.apply(fast)
    t0 = twin.clock.now()
    twin.run_step(lambda: None, 128, cost)
    assert twin.clock.now() - t0 == pytest.approx(t_fast, rel=0.2)


def test_same_seed_same_trace_and_step_times(cost):
    def trace(seed):
        twin = Twin("orin-nano", seed=seed, compute=False)
        device = twin.device()
        times = []
        with PowerMonitor(device.sensor, device.clock) as monitor:
            for b in (16, 64, 128) * 30:
                device.run_step(lambda: None, b, cost)
                times.append(device.clock.now())
        t, p = monitor.records()
        return times, t.tolist(), p.tolist()

    a, b, c = trace(7), trace(7), trace(8)
    assert a == b
    assert a[0] != c[0] and a[2] != c[2]


# ---------------------------------------------------------------------------------------------- memory


def test_a_batch_that_does_not_fit_raises_torch_like_out_of_memory(cost):
    twin = Twin("orin-nano", compute=True)
    huge = int(twin.profile.training_memory_bytes / cost.activation_bytes_per_sample) + 1
    assert twin.expected(cost, huge // 2).fits
    expected = twin.expected(cost, huge)
    assert not expected.fits and expected.memory_bytes == cost.memory_bytes(huge)
    called = []
    before = twin.clock.now()
    with pytest.raises(DeviceOutOfMemoryError) as info:
        twin.device().run_step(lambda: called.append(1), huge, cost)
    message = str(info.value)
    assert message.startswith("CUDA out of memory. Tried to allocate ")
    assert "(GPU 0; 7.44 GiB total capacity;" in message
    assert is_out_of_memory(info.value)
    assert not called and twin.clock.now() == before


# ---------------------------------------------------------------------------------------------- knobs


def test_power_mode_applies_its_caps_like_nvpmodel(cost):
    twin = Twin("orin-nano", compute=False)
    device = twin.device()
    device.apply({"power_mode": "7W"})
    assert device.settings() == {"gpu_freq": 408_000_000, "emc_freq": 2_133_000_000, "cpu_freq": 960_000,
                                 "cpu_cores": 4, "power_mode": "7W"}
    # a knob set above the mode's cap reads back as set but runs at the cap
    device.apply({"gpu_freq": "max", "cpu_cores": 6, "cpu_freq": "max"})
    clocks = twin.effective_clocks()
    assert device.knobs["gpu_freq"].read() == 624_750_000
    assert (clocks.gpu_hz, clocks.cpu_khz, clocks.cores, clocks.tpcs) == (408_000_000, 960_000, 4, 2)
    capped = twin.expected(cost, 128)
    assert capped == twin.expected(cost, 128, {"gpu_freq": 408_000_000, "cpu_freq": 960_000, "cpu_cores": 4})
    # below the cap the knob rules
    assert twin.expected(cost, 128, {"gpu_freq": 306_000_000}).clocks.gpu_hz == 306_000_000
    # a partial setting takes the rest from the current values, a power mode in it as applying it would
    back = twin.expected(cost, 128, {"power_mode": "15W"})
    assert back.clocks == sim.Clocks(624_750_000, 2_133_000_000, 1_497_600, 6, 4)
    assert device.settings()["power_mode"] == "7W"  # expected() changes nothing
    assert back.step_time_s < capped.step_time_s / 2


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_power_mode_knob_states_the_caps_it_applies(profile, cost):
    """The power-mode knob's ModeCaps are what the mode does: each knob set at or above its cap runs at it,
    and a mode whose caps another's cover runs its every setting the same there."""
    twin = Twin(profile, compute=False)
    caps = twin.device().knobs["power_mode"].caps
    assert set(caps) == {m.name for m in twin.profile.modes}
    tuned = list(twin.knobs)
    for mode, c in caps.items():
        top = {k: twin.knobs[k].max for k in ("gpu_freq", "emc_freq", "cpu_freq", "cpu_cores")}
        at_top, at_cap = dict(top, power_mode=mode), dict(dict(c.max_values), power_mode=mode)
        assert twin.expected(cost, 32, at_top) == twin.expected(cost, 32, at_cap)
        for other, oc in caps.items():
            if other != mode and c.within(oc, tuned):
                assert twin.expected(cost, 32, at_cap) == twin.expected(cost, 32, dict(at_cap, power_mode=other))


def test_knob_values_are_validated_and_restored(cost):
    device = sim.open("orin-nano", compute=False)
    with pytest.raises(KnobValueError, match=r"gpu_freq: 500 MHz is not an allowed value; "
                                             r"nearest allowed: 408 MHz or 510 MHz"):
        device.apply({"gpu_freq": 500_000_000})
    with pytest.raises(KnobValueError, match="cpu_cores"):
        device.knobs["cpu_cores"].set(7)
    with pytest.raises(KnobValueError, match="allowed: 7W, 15W"):
        device.knobs["power_mode"].set("25W")
    with pytest.raises(DeviceError, match="unknown knob 'fan'"):
        device.backend.expected(cost, 8, {"fan": 1})
    original = device.settings()
    original_power = device.backend.expected(cost, 64).power_w
    with device.restoring():
        device.apply({"power_mode": "7W", "gpu_freq": "306MHz", "emc_freq": "min", "cpu_cores": 2})
        assert device.settings() != original
    assert device.settings() == original
    assert device.backend.expected(cost, 64).power_w == original_power
    device.knobs["cpu_freq"].set("1.1136GHz")
    assert device.restore() == ["cpu_freq"] and device.settings() == original


def test_bad_arguments_are_one_line_errors(cost):
    twin = Twin("orin-nano", compute=False)
    for bad in (0, -4, 2.5, True):
        with pytest.raises(DeviceError, match="batch size must be a positive whole number"):
            twin.run_step(lambda: None, bad, cost)
    with pytest.raises(DeviceError, match="needs the workload's cost"):
        twin.run_step(lambda: None, 8, None)


def test_batch_size_check_is_the_registry_one(cost):
    """The twin checks batch sizes with power.knobs.check_batch_size; its error is both kinds at once."""
    twin = Twin("orin-nano", compute=False)
    with pytest.raises(BatchSizeError, match=r"^batch size must be a positive whole number, got 0$") as err:
        twin.expected(cost, 0)
    assert isinstance(err.value, DeviceError) and "\n" not in str(err.value)
    # whole numbers of any type run as the int (numpy integers come out of arrays of batch sizes)
    assert twin.expected(cost, np.int64(32)) == twin.expected(cost, 32.0) == twin.expected(cost, 32)
    assert type(twin.expected(cost, np.int64(32)).batch_size) is int


# ---------------------------------------------------------------------------------------------- running


def test_run_step_runs_the_real_training_step(cnn):
    device = sim.open("orin-nano", compute=True)
    losses = [device.run_step(lambda: cnn.train_step(8), 8, cnn.cost) for _ in range(3)]
    assert all(isinstance(loss, float) and math.isfinite(loss) for loss in losses)
    assert device.backend.steps == 3
    assert device.clock.now() == pytest.approx(3 * device.backend.expected(cnn.cost, 8).step_time_s, rel=0.05)
    skipped = sim.open("orin-nano", compute=False)
    assert skipped.run_step(lambda: pytest.fail("compute=False must not run the step"), 8, cnn.cost) is None


def test_disturbances_take_effect_from_now(cost):
    twin = Twin("orin-nano", seed=4, compute=False)
    before = twin.expected(cost, 128)
    calm, _ = measure(twin, cost, 128, seconds=5.0)
    twin.set_power_offset(2.0)
    loaded, _ = measure(twin, cost, 128, seconds=5.0, warmup_s=0.0)
    assert loaded.mean_w - calm.mean_w == pytest.approx(2.0, abs=0.15)
    # the board warmed over the 11 s of training: compare at the temperature ``before`` holds at
    start_c = before.temperature_c
    assert twin.temperature_c > start_c
    assert twin.expected(cost, 128, temperature_c=start_c).power_w == pytest.approx(before.power_w + 2.0)
    assert twin.expected(cost, 128, temperature_c=start_c).rails_w["VDD_CPU_GPU_CV"] == pytest.approx(
        before.rails_w["VDD_CPU_GPU_CV"] + 2.0)
    twin.set_power_offset(0.0)

    twin.set_throttle(450e6)  # thermal throttling to the table step at or below 450 MHz
    throttled = twin.expected(cost, 128)
    assert throttled.clocks.gpu_hz == 408_000_000
    assert throttled.step_time_s > before.step_time_s and throttled.power_w < before.power_w
    start = twin.clock.now()
    twin.run_step(lambda: None, 128, cost)
    assert twin.clock.now() - start == pytest.approx(throttled.step_time_s, rel=0.05)
    twin.set_throttle(None)
    assert twin.expected(cost, 128, temperature_c=start_c) == before
    with pytest.raises(ValueError):
        twin.set_throttle(0)


# ---------------------------------------------------------------------------------------------- calibration v2


def test_ratio_table_sits_within_the_published_ranges():
    """Power at batch 1 over the saturated batch, the GPU rail at the lowest over the highest clock, and the
    step time's elasticity in the GPU clock: every profile and built-in workload inside the published ranges
    (profiles/SOURCES.md); the table is printed with -s."""
    costs = {name: load_workload(name, seed=0).cost for name in ("cnn", "mobilenet", "chartransformer")}
    rows = ratio_rows(sorted(PROFILES), costs)
    print("\n" + format_ratio_table(rows))
    assert len(rows) == len(PROFILES) * len(costs) * len(PUBLISHED)
    outside = [(r.profile, r.workload, r.metric, round(r.value, 3), r.low, r.high) for r in rows if not r.within]
    assert not outside
    # light models saturate late, heavy ones early: the saturation batch follows the work per sample
    by = {(r.profile, r.workload): r.batch_size for r in rows}
    assert all(by[(p, "cnn")] > by[(p, "chartransformer")] for p in PROFILES)
    # and a wider GPU needs a larger batch to fill
    assert by[("orin-agx", "cnn")] > by[("orin-nano", "cnn")]


def test_power_rises_with_batch_until_the_gpu_saturates(cost):
    """Orin Nano 15W at its top clock: the cnn's power rises steeply below the saturation batch and flattens
    above it (the published shape: doubling from batch 1 to saturation, then flat)."""
    twin = Twin("orin-nano", compute=False)
    power = {b: twin.steady_state(cost, b).power_w for b in (1, 8, 64, 512)}
    assert power[1] < power[8] < power[64] < power[512]
    assert power[512] / power[1] > 1.5
    assert power[512] / power[64] < power[64] / power[8]  # flattening


def test_low_gpu_clocks_share_the_voltage_floor():
    """The V/f curve: the lowest steps of a module share the minimum voltage, so below the knee the GPU's
    switching power falls only in proportion to f (not to V^2 f), an effect the predictors' f^gamma lacks."""
    profile = PROFILES["orin-agx"]
    cal = profile.calibration
    volts = [voltage(f, profile.gpu_freqs_hz[-1], cal.gpu_v_min, cal.gpu_v_max, cal.gpu_knee_frac)
             for f in profile.gpu_freqs_hz]
    assert volts[0] == volts[1] == volts[2] == cal.gpu_v_min
    assert volts[-1] == cal.gpu_v_max
    assert all(a <= z for a, z in itertools.pairwise(volts))


def test_the_board_warms_over_minutes_and_leaks_more():
    """Leakage follows a first-order board temperature: after minutes of load the same step draws more,
    converging to steady_state(); at rest the board cools back. Deterministic under the seed."""
    def run(seed):
        twin = Twin("orin-agx", seed=seed, compute=False)
        twin.device().apply({"power_mode": "MAXN"})
        cost = load_workload("chartransformer", seed=0).cost
        start = twin.expected(cost, 32)
        steady = twin.steady_state(cost, 32)
        tau = twin.profile.calibration.thermal_tau_s
        while twin.clock.now() < 5 * tau:
            twin.run_step(lambda: None, 32, cost)
        warm = twin.expected(cost, 32)
        twin.clock.advance(10 * tau)
        return twin, start, steady, warm

    twin, start, steady, warm = run(0)
    assert start.temperature_c < warm.temperature_c
    assert warm.power_w > start.power_w + 3.0  # several watts of leakage on the warm AGX Orin
    assert warm.power_w == pytest.approx(steady.power_w, rel=0.01)
    assert warm.step_time_s == start.step_time_s  # leakage costs power, not time
    assert twin.temperature_c == pytest.approx(start.temperature_c, abs=0.5)  # cooled back at rest
    again = run(0)
    assert again[3] == warm
    with pytest.raises(ValueError):
        twin.set_temperature(math.nan)
    twin.set_temperature(80.0)
    assert twin.temperature_c == 80.0 and twin.expected(load_workload("cnn").cost, 8).temperature_c == 80.0
