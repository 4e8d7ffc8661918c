"""The search on the simulated twin: space, one measured setting, the study, results, the CLI.

Most tests use ``compute=False`` (the twin times the steps; the training itself is not the subject) and a
tiny real torch workload; one CLI test runs the built-in CNN's real training steps.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
import torch

from edgetune.cli import main
from edgetune.power import PowerMonitor, open_device
from edgetune.search.efficiency import TargetModel, steps_to_target
from edgetune.search.records import Role
from edgetune.search.results import best_json, write_trials_csv
from edgetune.search.space import SpaceError, build_space, default_batch_sizes
from edgetune.search.study import Search
from edgetune.search.trial import MeasurementProtocol, measure_setting
from edgetune.workloads import Workload, WorkloadError, load_workload

optuna.logging.set_verbosity(optuna.logging.WARNING)

# the plain-optimize guided test's pick, true time to target over the oracle's (12 trials of a 75-setting space):
# it picks the oracle itself (seeded); the 2% leaves room for other numpy/scikit-learn builds, not for a worse pick
PLAIN_OPTIMIZE_GAP = 1.02
BEST_KEYS = {"device", "simulated", "workload", "torch_device", "budget_w", "objective", "batch_size", "setting",
             "measured", "predicted", "baseline", "speedup_over_baseline", "speedup_measure"}


def tiny_workload(seed: int = 0) -> Workload:
    """A real (small) torch model on CIFAR-shaped synthetic images: 12 KB per sample, so huge batches OOM."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))

    def make_batch(batch_size, generator):
        return (torch.randn(batch_size, 3, 32, 32, generator=generator),
                torch.randint(0, 10, (batch_size,), generator=generator))

    return Workload.from_model("tiny", model, make_batch, default_batch_size=32, seed=seed)


@pytest.fixture(scope="module")
def workload():
    return tiny_workload()


def small_space(device, batch_sizes=(16, 32, 64, 128)):
    return build_space(device, 32, batch_sizes, ["gpu_freq", "emc_freq"])


#: a thermal soak of 30 s, not :data:`~edgetune.search.thermal.SOAK_S`'s 360, for tests of the search whose point is
#: not the soak: it still runs (its windows, its fit, the margin it carries) at a twelfth of the simulated steps,
#: which were half of these tests' time; tests/test_thermal.py and the oracle test below keep the full one
SHORT_SOAK_S = 30.0


def search(device, workload, space, budget_w, **kw):
    kw.setdefault("protocol", MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0))
    kw.setdefault("storage", optuna.storages.InMemoryStorage())
    kw.setdefault("study_name", "test")
    return Search(device, workload, space, budget_w=budget_w, **kw)


# ---------------------------------------------------------------------------------------------- space


def test_space_defaults_to_every_writable_knob_and_parses_values():
    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 128)
    assert space.batch_sizes == default_batch_sizes(128) == (16, 32, 64, 128, 256, 512, 1024)
    assert set(space.knob_names) == {n for n, k in device.knobs.items() if k.writable and len(k.values) > 1}
    assert space.size == 7 * math.prod(len(device.knobs[n].values) for n in space.knob_names)
    sub = build_space(device, 32, [8, 16], ["gpu_freq"], {"gpu_freq": ["max", "306MHz"]})
    assert sub.knob_values == {"gpu_freq": (306_000_000, device.knobs["gpu_freq"].max)}
    assert sub.size == 4
    for cand in sub.grid():
        assert sub.candidate(sub.params(cand)) == cand
    with pytest.raises(SpaceError, match="has no knob 'gpu_clock'"):
        build_space(device, 32, None, ["gpu_clock"])
    with pytest.raises(SpaceError, match="nearest allowed: 612 MHz or 624.75 MHz"):
        build_space(device, 32, None, ["gpu_freq"], {"gpu_freq": ["620MHz"]})
    with pytest.raises(SpaceError, match="not tuned; add it to space.knobs"):
        build_space(device, 32, None, ["gpu_freq"], {"emc_freq": ["max"]})


def test_b_noise_measured_from_gradient_norms_is_positive():
    from edgetune.search.efficiency import measure_b_noise

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 2)

    def make_batch(batch_size, generator):  # a learnable task: the label is the sign of the first input
        x = torch.randn(batch_size, 16, generator=generator)
        return x, (x[:, 0] > 0).long()

    wl = Workload.from_model("sign", model, make_batch, default_batch_size=32)
    value = measure_b_noise(wl, 32, steps=10)
    assert math.isfinite(value) and 0 < value < 1e4


def test_b_noise_is_measured_on_inputs_of_any_form():
    # a tokenizer's dict, a tuple of tensors and a mask shared by the batch: cut per sample, the estimate is
    # the one-tensor workload's, draw for draw (it fell back to 256 for anything but one tensor)
    from edgetune.search.efficiency import measure_b_noise

    class Keyed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(16, 2)

        def forward(self, x=None, scale=None, *, features=None):
            x = features if features is not None else x
            return self.linear(x if scale is None else x * scale)

    def workload(form):
        torch.manual_seed(0)
        model = Keyed()

        def make_batch(batch_size, generator):
            x = torch.randn(batch_size, 16, generator=generator)
            y = (x[:, 0] > 0).long()
            if form == "dict":
                return {"features": x}, y
            if form == "tuple":
                return (x, torch.ones(1, 16)), y  # a (1, 16) scale shared by every sample: not cut
            return x, y

        return Workload.from_model(f"sign-{form}", model, make_batch, default_batch_size=32)

    values = {form: measure_b_noise(workload(form), 32, steps=10) for form in ("tensor", "dict", "tuple")}
    assert math.isfinite(values["tensor"]) and values["tensor"] > 0
    assert values["dict"] == pytest.approx(values["tensor"], rel=1e-6)
    assert values["tuple"] == pytest.approx(values["tensor"], rel=1e-6)


def test_a_batch_whose_samples_are_not_first_is_refused_for_b_noise():
    from edgetune.search.efficiency import measure_b_noise

    torch.manual_seed(0)
    model = torch.nn.GRU(8, 4)  # sequence-first: (length 5, batch, features)

    def make_batch(batch_size, generator):
        return torch.randn(5, batch_size, 8, generator=generator), torch.randn(5, batch_size, 4, generator=generator)

    def loss_fn(out, y):
        return torch.nn.functional.mse_loss(out[0], y)

    wl = Workload.from_model("seq-first", model, make_batch, loss_fn=loss_fn, default_batch_size=8)
    with pytest.raises(WorkloadError, match=r"needs the samples on the first axis, and a tensor of the inputs of "
                                            r"shape \(5, 8, 8\) holds them on its second \(sequence-first\); put "
                                            r"the batch axis first"):
        measure_b_noise(wl, 8, steps=2)
    # a sequence 16 long, twice the batch: the first axis is a multiple of the batch, and was cut along the sequence
    long = Workload.from_model("seq-first-16", model, lambda b, g: (torch.randn(16, b, 8, generator=g),
                                                                     torch.randn(16, b, 4, generator=g)),
                               loss_fn=loss_fn, default_batch_size=8)
    with pytest.raises(WorkloadError, match=r"a tensor of the inputs of shape \(16, 8, 8\) holds them on its second "
                                            r"\(sequence-first\); put the batch axis first"):
        measure_b_noise(long, 8, steps=2)
    # no tensor with the batch on an axis this can tell: the shapes are named
    with pytest.raises(WorkloadError, match=r"needs the samples on the first axis of a tensor of the inputs, whose "
                                            r"shapes are \(3, 16\); put the batch axis first"):
        wl.split_batch((torch.zeros(3, 16), torch.zeros(8)), 8, 4)


def test_b_noise_over_warmups_is_the_median_of_the_positive_ones():
    from edgetune.search.efficiency import WarmupNoiseScale, measure_b_noise_warmups

    nan = math.nan
    assert WarmupNoiseScale((8.0, 3.0, nan, 40.0, 5.0), 20).b_noise == 6.5  # the median of 3, 5, 8, 40
    assert WarmupNoiseScale((8.0, nan, nan, nan, nan), 20).positive == (8.0,)
    assert math.isnan(WarmupNoiseScale((8.0, nan, nan, nan, nan), 20).b_noise)  # one positive of five: too few
    assert WarmupNoiseScale((8.0,), 20).b_noise == 8.0  # one warm-up asked for, one had
    assert math.isnan(WarmupNoiseScale((nan,), 20).b_noise)

    def sign_task(seed):  # a learnable task: the label is the sign of the first input
        torch.manual_seed(seed)

        def make_batch(batch_size, generator):
            x = torch.randn(batch_size, 16, generator=generator)
            return x, (x[:, 0] > 0).long()

        return Workload.from_model("sign", torch.nn.Linear(16, 2), make_batch, default_batch_size=32, seed=seed)

    built = []
    measured = measure_b_noise_warmups((built.append(s) or sign_task(s) for s in range(3)), 32, steps=10)
    assert built == [0, 1, 2] and len(measured.estimates) == 3 and measured.steps == 10
    assert len(set(measured.estimates)) == 3  # fresh weights and batches: three draws
    assert measured.b_noise == sorted(measured.estimates)[1]


def test_target_takes_the_workloads_measured_b_noise_and_falls_back_without_one():
    from edgetune.search.efficiency import FALLBACK_B_NOISE

    model = torch.nn.Linear(4, 2)

    def make_batch(b, g):
        x = torch.randn(b, 4, generator=g)
        return x, (x[:, 0] > 0).long()

    measured = Workload.from_model("lin", model, make_batch, b_noise=40.0)
    t = TargetModel.for_workload(measured, s_min=200)
    assert (t.s_min, t.b_noise) == (200, 40.0) and "lin's measured B_noise" in t.b_noise_source
    unknown = TargetModel.for_workload(Workload.from_model("lin", model, make_batch))
    assert unknown.b_noise == FALLBACK_B_NOISE and unknown.b_noise_source.startswith("fallback")


def test_cli_default_target_uses_the_workloads_measured_b_noise(tmp_path):
    argv = ["search", "--device", "sim:orin-nano", "--workload", "cnn", "--budget", "100", "--batch-sizes", "8",
            "--knobs", "gpu_freq", "--n-trials", "2", "--sampler", "random", "--measure-s", "0.5",
            "--warmup-steps", "0", "--real-steps", "0", "-o", str(tmp_path / "o")]
    assert main(argv) == 0
    best = json.loads((tmp_path / "o" / "best.json").read_text())
    assert best["target_model"]["b_noise"] == load_workload("cnn").b_noise
    assert best["target_model"]["b_noise_source"] == "workload: cnn's measured B_noise"


def test_steps_to_target_is_mccandlish():
    assert steps_to_target(256, 1000, 256) == pytest.approx(2000)
    t = TargetModel(s_min=500, b_noise=100)
    assert t.steps(100) == pytest.approx(1000)
    assert t.steps(10_000) == pytest.approx(505)



@pytest.mark.parametrize("s_min, b_noise, message", [
    # S(b) = S_min (1 + B_noise / b) with B_noise < 0 is negative below |B_noise|: a negative time to target
    # the search ranked first; a nan made every outcome nan
    (1000.0, -50.0, "b_noise must be a number of samples >= 0"),
    (1000.0, math.nan, "b_noise must be a number of samples >= 0"),
    (1000.0, math.inf, "b_noise must be a number of samples >= 0"),
    (0.0, 256.0, "s_min must be a positive number of steps"),
    (math.nan, 256.0, "s_min must be a positive number of steps"),
])
def test_the_laws_parameters_are_checked_where_the_target_is_made(s_min, b_noise, message):
    with pytest.raises(ValueError, match=message):
        TargetModel(s_min, b_noise)
    assert TargetModel(1000.0, 0.0).steps(8) == 1000.0  # no noise: the same steps at every batch size


# ---------------------------------------------------------------------------------------------- one trial


def test_measure_setting_window_covers_the_budget_window(workload):
    device = open_device("sim:orin-nano", compute=False)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        m = measure_setting(device, workload, 64, {"gpu_freq": 510_000_000}, protocol, monitor)
        assert device.knobs["gpu_freq"].read() == 510_000_000
    assert m.ok and not m.oom and m.error is None
    assert m.duration_s >= 2.0 and m.steps >= 5
    assert m.step_time_s == pytest.approx(m.duration_s / m.steps)
    assert m.samples_per_s == pytest.approx(64 / m.step_time_s)
    assert m.mean_power_w <= m.max_avg_power_w + 1e-6 <= m.peak_power_w + 2e-6
    assert m.energy_per_sample_j == pytest.approx(m.energy_j / (64 * m.steps))
    assert m.holds(m.max_avg_power_w) and not m.holds(m.max_avg_power_w * 0.99)
    assert m.holds(m.max_avg_power_w * 0.99, tolerance=0.02)
    assert m.trace_t[0] == pytest.approx(0.0, abs=0.02) and len(m.trace_t) == len(m.trace_w) > 100
    # the device clock is virtual: the window lasted 2 s of device time, not of wall time
    assert m.wall_s < m.duration_s
    assert device.knobs["gpu_freq"].read() == device.knobs["gpu_freq"].max  # restored


def test_a_maximum_less_its_noise_excess_reads_the_true_maximum_where_a_steps_phases_fill_the_differences():
    """Orin NX chartransformer at batch 8: 28-ms steps whose phase edges fall in most of the differences of
    consecutive readings at 100 Hz. The noise estimated from those differences held the step's ripple, and the
    1-s maximum less that excess read 0.14 W under the truth on average: a setting over the budget could be
    certified. Capped by the maximum over the mean of the window's averages, it reads the truth within 0.02 W."""
    workload = load_workload("chartransformer", seed=0)
    device = open_device("sim:orin-nx", compute=False, seed=1)
    setting = {"gpu_freq": 816_000_000, "emc_freq": 3_199_000_000, "cpu_freq": 960_000, "cpu_cores": 8,
               "power_mode": "MAXN"}
    errors, excess = [], []
    with device.restoring(), PowerMonitor(device.sensor, device.clock, rate_hz=100.0) as monitor:
        for _ in range(12):
            m = measure_setting(device, workload, 8, setting, MeasurementProtocol(), monitor)
            e = device.backend.expected(workload.cost, 8, setting)  # the truth: at most a step's peak over 1 s
            errors.append(m.max_avg_power_w - m.max_avg_noise_w - e.power_w)
            excess.append(m.max_avg_noise_w)
            top_w = (e.peak_power_w - e.power_w) * e.step_time_s
    assert 0.02 < e.step_time_s < 0.04 and m.judged_span_s == pytest.approx(1.0) and top_w < 0.03
    assert -0.02 < float(np.mean(errors)) < top_w + 0.02, errors
    assert all(0.0 <= x < 0.1 for x in excess)


def test_a_stuck_sensor_on_a_real_board_is_warned_of_once(tmp_path, monkeypatch, caplog, workload):
    """An INA3221 that stopped converting: its rail files hold one plausible value (4.75 W on VDD_IN) however
    the board works. Every window measures (no fault to refuse), yet every setting would read the same: the
    search says so once, as a warning, and not again at each window after."""
    from fakes.jetson_tree import build_jetson

    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    fake = build_jetson(tmp_path / "root", "orin-nano")  # nothing writes its rail files: the sensor is stuck
    device = open_device("jetson", root=fake.root, detect_period_s=0.0)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=1, measure_s=0.5)
    stuck = ("jetson: the power sensor's total (VDD_IN) has not changed for seconds while training ran: a "
             "stuck sensor reads the same on every setting, and the search cannot tell them apart; check it "
             "with `edgetune monitor --device jetson`")
    with caplog.at_level("WARNING", logger="edgetune"), device.restoring(), \
            PowerMonitor(device.sensor, device.clock) as monitor:
        windows = 0
        while not monitor.stale:  # real time: stale once 2 s pass without a new value (_STALE_MIN_S)
            assert measure_setting(device, workload, 16, {}, protocol, monitor).ok
            windows += 1
            assert windows < 10
        for _ in range(2):  # windows measured after the sensor was seen stuck
            m = measure_setting(device, workload, 16, {}, protocol, monitor)
            assert m.ok and m.mean_power_w == pytest.approx(5.080 * 0.936)  # plausible: no reading fault
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [stuck]
    device.close()


def test_out_of_memory_is_an_infeasible_result_and_the_monitor_goes_on(workload):
    device = open_device("sim:orin-nano", compute=False)
    protocol = MeasurementProtocol(warmup_steps=1, measure_s=0.5)
    with PowerMonitor(device.sensor, device.clock) as monitor:
        m = measure_setting(device, workload, 2**20, {}, protocol, monitor)
        assert not m.ok and m.oom and m.error == f"out of memory at batch size {2**20}"
        assert math.isnan(m.step_time_s) and not m.holds(100.0)
        assert measure_setting(device, workload, 32, {}, protocol, monitor).ok


def test_a_setting_over_the_budget_stops_early_infeasible_and_counts_its_time_over(workload):
    device = open_device("sim:orin-nano", compute=False)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    top = {"gpu_freq": 624_750_000, "emc_freq": 2_133_000_000}
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        free = measure_setting(device, workload, 128, top, protocol, monitor)
        limit_w = free.mean_power_w - 1.0  # this setting draws a watt more than the limit
        low = {"gpu_freq": 306_000_000, "emc_freq": 204_000_000}
        calm = measure_setting(device, workload, 128, low, protocol, monitor, limit_w=limit_w, guard_sigma=2.0)
        over = measure_setting(device, workload, 128, top, protocol, monitor, limit_w=limit_w, guard_sigma=2.0)
    assert not free.aborted_over_budget and free.over_budget_s == 0.0  # no limit: no stop, nothing counted
    # right after the unlimited run the 1-s average still holds its power: the board is over the limit for a
    # moment (counted), but not by this setting's doing (not stopped)
    assert calm.ok and not calm.aborted_over_budget and calm.holds(limit_w) and 0.0 < calm.over_budget_s < 1.0
    # the board idled before the calm setting was applied, until the average was back under the limit: the
    # moment over it is that wait (at most one window), not the calm setting's window
    assert 0.0 < calm.settle_s <= 1.0 and calm.over_budget_s <= calm.settle_s + 0.02
    assert over.settle_s == 0.0  # the calm setting left the average under the limit: no wait
    assert over.ok and over.aborted_over_budget and not over.holds(limit_w, guard_sigma=2.0)
    assert over.max_avg_power_w > limit_w
    # stopped within a second of device time (a full window is >= 2 s); the guard band stops it as the average
    # nears the limit, so the board spends at most one step (plus a monitor sample) above it
    assert over.duration_s < 1.0 < free.duration_s
    assert 0.0 <= over.over_budget_s <= over.step_time_s + 0.01
    assert not over.stopped_mid_step  # its steps are short: each one ends before the watchdog may cut it


@pytest.mark.parametrize("limit_w", [6.0, 8.5])
def test_a_long_step_over_the_budget_is_stopped_in_the_middle(workload, monkeypatch, limit_w):
    """A 2-s step over the budget is cut once the budget window's average crosses: the board drops to rest
    at once and the step finishes there, so it spends far fewer seconds over the budget (counted to well past
    the trial's end: a stopped step's power stays in the 1-s average after it) than when the step runs whole."""
    from edgetune.search import trial
    from edgetune.search.window import over_limit_s

    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    long = {"gpu_freq": "min", "emc_freq": "max", "cpu_freq": "max"}  # batch 131072: 2.2 s per step, 9.5 W
    rest = {"gpu_freq": "min", "emc_freq": "min", "cpu_freq": "min"}

    def run(watch: bool):
        monkeypatch.setattr(trial, "_WATCH_AFTER_WINDOWS", 0.5 if watch else math.inf)
        device = open_device("sim:orin-nano", compute=False)
        with device.restoring(), PowerMonitor(device.sensor, device.clock, keep_s=30.0) as monitor:
            device.apply(rest)
            device.clock.sleep(2.0)  # idle at rest: the 1-s average starts well under the limit
            t0 = device.clock.now()
            m = measure_setting(device, workload, 131072, long, protocol, monitor, limit_w=limit_w)
            at_rest = device.knobs["emc_freq"].read() == device.knobs["emc_freq"].min
            device.clock.sleep(2.0)
            monitor.sample()
            t, p = monitor.records(since=t0 - 1.0)
        return m, at_rest, over_limit_s(t, p, t0, t[-1], monitor.avg_window_s, limit_w)

    cut, cut_at_rest, cut_over_s = run(True)
    whole, _, whole_over_s = run(False)
    assert cut.aborted_over_budget and cut.stopped_mid_step and cut.steps == 1 and cut_at_rest
    assert whole.aborted_over_budget and not whole.stopped_mid_step and whole.steps == 1
    assert cut.duration_s > whole.duration_s  # the rest of the step ran at the rest clocks
    assert cut.max_avg_power_w > limit_w and not cut.holds(limit_w)
    assert cut_over_s < 0.75 * whole_over_s


def _free_and_clearly_over(workload, *extra):
    """On the twin: the top setting at batch 128 unconstrained, then (after the low one) measured again with a
    limit 1 W under its mean: clearly over. ``extra``: ``(batch, setting, protocol, limit_w)`` measured after
    the low setting again, in the same monitor. Returns the protocol and the measurements, in order."""
    device = open_device("sim:orin-nano", compute=False)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    top = {"gpu_freq": 624_750_000, "emc_freq": 2_133_000_000}
    low = {"gpu_freq": 306_000_000, "emc_freq": 204_000_000}
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        free = measure_setting(device, workload, 128, top, protocol, monitor)
        measure_setting(device, workload, 128, low, protocol, monitor)
        clear = measure_setting(device, workload, 128, top, protocol, monitor, limit_w=free.mean_power_w - 1.0)
        measure_setting(device, workload, 128, low, protocol, monitor)
        more = [measure_setting(device, workload, 128, top if setting is None else setting, p or protocol, monitor,
                                limit_w=limit(free) if limit else None) for setting, p, limit in extra]
    return protocol, free, clear, *more


def test_a_setting_clearly_over_stops_before_the_budget_window_crosses(workload):
    """Clearly over (its own average three standard errors above the limit): stopped once its readings have
    swept the step's phases, while the 1-s average is still mostly the idle power before it, so no time over
    the budget at all. Just over (within its own noise): left to the budget window's average, as any setting
    near the budget."""
    _, free, clear, near = _free_and_clearly_over(workload, (None, None, lambda free: free.mean_power_w - 0.01))
    assert clear.aborted_over_budget and clear.over_budget_s == 0.0
    assert clear.duration_s < 0.4  # once its readings have swept its 8-ms steps' phases (0.25 s)
    assert clear.max_avg_power_w > free.mean_power_w - 1.0
    assert near.duration_s > 0.5  # not stopped on its first readings: they cannot tell it from the limit


def test_a_window_shorter_than_the_budget_window_names_its_own_span(workload, monkeypatch, tmp_path):
    """A record shorter than the budget's 1-s window is judged on its mean (the monitor's rule, unchanged): a
    window stopped clearly over the budget after 0.4 s, or one of a protocol shorter than the window, records that
    span, not 1.0; one stopped in the middle of a long step records the span of the setting's own average that
    crossed. The figures themselves are the same; trials.csv and the progress line say the span."""
    from edgetune.cli.progress import trial_line
    from edgetune.search import trial

    low = {"gpu_freq": 306_000_000, "emc_freq": 204_000_000}
    protocol, free, clear, short = _free_and_clearly_over(workload, (low, MeasurementProtocol(measure_s=0.3), None))
    assert free.judged_span_s == free.avg_window_s == 1.0
    assert clear.aborted_over_budget and clear.duration_s < 0.4
    assert clear.judged_span_s == clear.duration_s  # judged on its mean: the record's own span
    assert clear.max_avg_power_w == pytest.approx(clear.mean_power_w)
    assert not short.aborted_over_budget and short.judged_span_s == short.duration_s < 0.4
    # stopped in the middle of a 2-s step (the watchdog): judged on the setting's own average until the stop
    device = open_device("sim:orin-nano", compute=False)
    with device.restoring(), PowerMonitor(device.sensor, device.clock, keep_s=30.0) as monitor:
        device.apply({"gpu_freq": "min", "emc_freq": "min", "cpu_freq": "min"})
        device.clock.sleep(2.0)
        cut = measure_setting(device, workload, 131072, {"gpu_freq": "min", "emc_freq": "max", "cpu_freq": "max"},
                              protocol, monitor, limit_w=6.0)
    assert cut.stopped_mid_step
    assert trial._WATCH_AFTER_WINDOWS * cut.avg_window_s <= cut.judged_span_s < cut.avg_window_s < cut.duration_s
    # a search's trials.csv and progress lines: every stopped window's span is at most its length
    device = open_device("sim:orin-nano", compute=False)
    s = search(device, workload, small_space(device), 7.0, sampler="random", n_trials=8, seed=0, soak_s=0.0)
    result = s.run()
    rows = list(csv.DictReader(write_trials_csv(result, tmp_path / "trials.csv").open()))
    stopped = [row for row in rows if row["aborted_over_budget"] == "True"]
    assert stopped and all(float(row["judged_span_s"]) <= float(row["duration_s"]) for row in stopped)
    assert any(float(row["judged_span_s"]) < 1.0 for row in stopped)
    records = {r.number: r for r in result.measured}
    row = next(row for row in stopped if float(row["judged_span_s"]) < 1.0)
    line = trial_line(records[int(row["trial"])], 1, 8, dict(s.space.unit_of), "time", None)
    assert f"W avg of {float(row['judged_span_s']):.3g} s (stopped early), over budget" in line
    assert "1-s" not in line


def test_the_first_setting_a_monitor_sees_is_judged_with_the_boards_second_before_it(workload):
    """A monitor started just now holds none of the board's past, so its 1-s average would be the first
    setting's power alone: that setting was counted over the budget from its first reading. The board is
    recorded as it is for one window first, so the first setting clearly over is stopped before the board's
    own average crosses, with no time over the budget, as any later setting is."""
    device = open_device("sim:orin-nano", compute=False)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    top = {"gpu_freq": 624_750_000, "emc_freq": 2_133_000_000}
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        t_start = device.clock.now()
        first = measure_setting(device, workload, 128, top, protocol, monitor, limit_w=6.0)
        t, p = monitor.records(since=t_start)
        second = measure_setting(device, workload, 128, top, protocol, monitor, limit_w=6.0)
    assert first.settle_s == pytest.approx(monitor.avg_window_s, abs=0.03)
    assert float(np.mean(p[t < t_start + 0.9])) < 6.0 - 1.0  # that window was the board idle, as found
    assert first.aborted_over_budget and first.over_budget_s == 0.0
    assert first.max_avg_power_w > 6.0 + 1.0  # clearly over: its own average is far above the limit
    assert second.aborted_over_budget and second.settle_s < monitor.avg_window_s  # filled once


@pytest.mark.parametrize("seed", range(8))
def test_a_setting_whose_window_holds_the_budget_is_not_stopped_on_its_first_readings(workload, seed):
    """The early stop weighs a short average's own noise: a setting the whole window judges 0.04 W under the
    limit (guard band included) runs its window, whatever its first readings say (seed 0 was stopped when the
    stop took the short average at face value)."""
    from edgetune.search.window import judged_power_w

    device = open_device("sim:orin-nano", compute=False, seed=seed)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    top = {"gpu_freq": 510_000_000, "emc_freq": 2_133_000_000}
    low = {"gpu_freq": 306_000_000, "emc_freq": 204_000_000}
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        free = measure_setting(device, workload, 128, top, protocol, monitor)
        limit_w = judged_power_w(free.max_avg_power_w, free.power_se_w, 2.0) + 0.04
        measure_setting(device, workload, 128, low, protocol, monitor)
        again = measure_setting(device, workload, 128, top, protocol, monitor, limit_w=limit_w, guard_sigma=2.0)
    assert not again.aborted_over_budget and again.duration_s >= protocol.measure_s
    assert again.holds(limit_w, guard_sigma=2.0)


def test_a_window_of_a_setting_already_running_is_judged_on_its_last_second_not_its_first_steps():
    """The sensor samples a step's phases at a rate close to the step rate (10-ms steps, 6.6-ms updates, read
    at 100 Hz), so the first 50 ms of a window can read only the step's hot phase. The same windows continuing a
    setting already running, as a thermal soak's do, read the setting's last second, which holds the budget by
    0.3 W, and run to their end every time."""
    cnn = load_workload("cnn")
    setting = {"gpu_freq": 956_250_000, "emc_freq": 1_866_000_000, "cpu_freq": 1_344_000, "cpu_cores": 1,
               "power_mode": "MODE_20W_6CORE"}
    protocol = MeasurementProtocol(warmup_steps=0, measure_steps=1, measure_s=1.0, real_steps=0)
    device = open_device("sim:xavier-nx", compute=False, seed=0)
    limit_w = device.backend.expected(cnn.cost, 32, setting).power_w + 0.3  # the hot phase: 0.5 W over
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        first = measure_setting(device, cnn, 32, setting, protocol, monitor)
        since_s = device.clock.now() - first.duration_s
        continued = [measure_setting(device, cnn, 32, setting, protocol, monitor, limit_w=limit_w, guard_sigma=2.0,
                                     running_since_s=since_s) for _ in range(40)]
    assert not any(m.aborted_over_budget for m in continued)
    assert all(m.holds(limit_w, guard_sigma=2.0) for m in continued)


def test_a_setting_is_clearly_over_only_once_its_readings_have_swept_the_steps_phases():
    """A window that begins a setting knows nothing of it but its first readings. Read at a rate close to the
    step rate, those can lie all in the step's hot phase (10.4-ms steps, 6.6-ms updates read at 100 Hz), so the
    clearly-over rule waits until they have swept every phase of the step: 40 windows of a setting that holds
    the budget by 0.3 W all run to their end (2 of them were stopped in their first 0.1 s on the hot phase
    alone before the rule waited). A setting clearly over is still stopped from rest before the budget
    window's average crosses, after one sweep: no time over the budget."""
    from edgetune.search.window import phase_sweep_s

    assert 0.15 < phase_sweep_s(0.2, 100.0, 0.0066) < 0.2  # a long step: about one step sweeps it
    assert 0.1 < phase_sweep_s(0.0094, 100.0) < 0.2  # 106 Hz read at 100 Hz: a 6-Hz alias
    assert phase_sweep_s(0.0066, 100.0, 0.0066) == math.inf  # updated at its own rate: one phase for ever
    assert phase_sweep_s(0.0132, 100.0, 0.0066) == math.inf  # at half of it: two phases
    assert phase_sweep_s(0.0132, 100.0) < 0.5  # the same step read without the sensor's hold
    cnn = load_workload("cnn")
    setting = {"gpu_freq": 956_250_000, "emc_freq": 1_866_000_000, "cpu_freq": 1_344_000, "cpu_cores": 1,
               "power_mode": "MODE_20W_6CORE"}
    protocol = MeasurementProtocol(warmup_steps=0, measure_steps=1, measure_s=1.0, real_steps=0)
    device = open_device("sim:xavier-nx", compute=False, seed=0)
    expected = device.backend.expected(cnn.cost, 32, setting)
    sweep_s = phase_sweep_s(expected.step_time_s, 100.0, device.sensor.update_period_s)
    assert 0.1 < sweep_s < 0.5
    limit_w = expected.power_w + 0.3
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        fresh = [measure_setting(device, cnn, 32, setting, protocol, monitor, limit_w=limit_w, guard_sigma=2.0)
                 for _ in range(40)]
    assert not any(m.aborted_over_budget for m in fresh)
    assert all(m.duration_s >= protocol.measure_s for m in fresh)
    for seed in range(5):  # from rest, 2 W over: the budget window's average is far from crossing
        device = open_device("sim:xavier-nx", compute=False, seed=seed)
        with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
            over = measure_setting(device, cnn, 32, setting, protocol, monitor, limit_w=expected.power_w - 2.0,
                                   guard_sigma=2.0)
        assert over.aborted_over_budget and over.over_budget_s == 0.0
        assert 0.5 * sweep_s < over.duration_s < 1.5 * sweep_s  # the sweep of the steps' own (jittered) times


def test_a_window_whose_readings_keep_to_a_few_phases_of_the_step_is_judged_over_one_sweep_of_them():
    """Twin Orin AGX, mobilenet b 8 in MAXN at 1122 MHz: 13.2-ms steps, twice the INA3221's 6.6-ms update, so a
    1-s window reads two phases of the step drifting slowly, and its mean errs by the step's ripple (before:
    +0.26..+0.59 W, then -0.43 W, against a standard error of 0.11 W). The window now runs for one sweep of the
    phases, is judged over it, and its standard error counts how unevenly the readings share the step's
    phases: every window's error lies within 2.5 of it. A long step is judged over the budget window as before."""
    from edgetune.search.window import SWEEP_WINDOW_CAP_S, judged_span_s, phase_sweep_s, phase_unevenness

    assert judged_span_s(0.2, 1.0, 100.0, 0.0066) == 1.0  # a step of a fifth of the window: its ripple is real
    assert judged_span_s(0.0094, 1.0, 100.0, 0.0066) == 1.0  # swept within the window
    assert judged_span_s(0.0132, 1.0, 100.0, 0.0066) == SWEEP_WINDOW_CAP_S  # two phases for ever: the cap
    assert phase_unevenness(0.0132, SWEEP_WINDOW_CAP_S, 100.0, 0.0066) == pytest.approx(0.375, abs=1e-3)
    assert phase_unevenness(0.0104, 1.0, 100.0, 0.0066) < 0.005  # swept: nearly even
    mobilenet = load_workload("mobilenet")
    device = open_device("sim:orin-agx", compute=False, seed=0)
    setting = {**dict(device.backend.mode_caps()["MAXN"].max_values), "gpu_freq": 1_122_000_000, "power_mode": "MAXN"}
    expected = device.backend.expected(mobilenet.cost, 8, setting)
    assert 1.0 < phase_sweep_s(expected.step_time_s, 100.0, device.sensor.update_period_s) <= SWEEP_WINDOW_CAP_S
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=1, measure_s=1.0, real_steps=0)
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        windows = [measure_setting(device, mobilenet, 8, setting, protocol, monitor) for _ in range(8)]
        truth_w = device.backend.expected(mobilenet.cost, 8, setting).power_w
        long_step = measure_setting(device, mobilenet, 256, setting, protocol, monitor)
    for m in windows:
        assert 1.0 < m.judged_span_s <= SWEEP_WINDOW_CAP_S and m.duration_s >= m.judged_span_s
        assert abs(m.mean_power_w - truth_w) <= 2.5 * m.power_se_w
    assert long_step.judged_span_s == 1.0 and long_step.duration_s < 1.5


def test_a_stopped_trial_drops_its_clocks_and_cores_at_once(workload):
    """Stopped over the budget, the board goes to the least power its quick knobs allow (lowest clocks, one
    core; the power mode stays: a switch is slow), so the 1-s average falls as fast as it can: the wait before
    the next setting idles there, not at that setting's clocks."""
    from edgetune.search.trial import rest_setting

    device = open_device("sim:orin-nano", compute=False)
    knobs = device.knobs
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    top = {"gpu_freq": 624_750_000, "emc_freq": 2_133_000_000, "cpu_cores": 6, "power_mode": "15W"}
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        device.apply(top)
        busy_idle_w = device.idle_power_w
        rest = rest_setting(device, [*top, "cpu_freq"])
        assert rest == {"gpu_freq": knobs["gpu_freq"].min, "emc_freq": knobs["emc_freq"].min, "cpu_cores": 1,
                        "cpu_freq": knobs["cpu_freq"].min}  # clocks and cores; never the power mode
        free = measure_setting(device, workload, 128, top, protocol, monitor)
        over = measure_setting(device, workload, 128, top, protocol, monitor, limit_w=free.mean_power_w - 1.0)
        assert over.aborted_over_budget and over.setting == top  # the record says what was measured
        now = device.settings()
        assert {k: now[k] for k in ("gpu_freq", "emc_freq", "cpu_cores")} == {
            "gpu_freq": knobs["gpu_freq"].min, "emc_freq": knobs["emc_freq"].min, "cpu_cores": 1}
        assert now["power_mode"] == "15W" and device.idle_power_w < busy_idle_w - 0.3
        assert rest_setting(device, top) == {}  # already at rest: nothing to write
        low = {"gpu_freq": 306_000_000, "emc_freq": 204_000_000, "cpu_cores": 6}
        calm = measure_setting(device, workload, 128, low, protocol, monitor, limit_w=free.mean_power_w - 1.0)
    assert calm.ok and not calm.aborted_over_budget and calm.setting == low  # applied after the wait


def test_over_limit_s_counts_the_time_the_moving_average_is_above():
    from edgetune.search.window import over_limit_s

    t = [i * 0.01 for i in range(401)]  # 4 s at 100 Hz: 10 W for 2 s, then 20 W
    p = [10.0 if x < 2.0 else 20.0 for x in t]
    # the 1-s average crosses 15 W half a second after the step: above it for about 1.5 s of the last 2
    assert over_limit_s(t, p, 0.0, 4.0, 1.0, 15.0) == pytest.approx(1.5, abs=0.03)
    assert over_limit_s(t, p, 0.0, 3.0, 1.0, 15.0) == pytest.approx(0.5, abs=0.03)
    assert over_limit_s(t, p, 0.0, 4.0, 1.0, 25.0) == 0.0


def test_real_steps_train_the_model_and_the_twin_times_the_rest():
    wl = tiny_workload(seed=1)
    before = [p.detach().clone() for p in wl.model.parameters()]
    device = open_device("sim:orin-nano", compute=True)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=0.5, real_steps=2)
    with PowerMonitor(device.sensor, device.clock) as monitor:
        m = measure_setting(device, wl, 16, {}, protocol, monitor)
    assert m.ok and m.real_steps == 2 and m.steps > 2
    assert math.isfinite(m.loss) and m.loss > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, wl.model.parameters()))
    assert "first 2 step(s) of the window run the real training step" in protocol.describe(True)


# ---------------------------------------------------------------------------------------------- study


@pytest.mark.parametrize("sampler", ["tpe", "guided"])
def test_search_enqueues_the_baseline_first_and_holds_the_budget(workload, sampler):
    device = open_device("sim:orin-nano", compute=False, seed=3)
    start = device.settings()
    space = small_space(device)
    s = search(device, workload, space, 9.0, soak_s=SHORT_SOAK_S, sampler=sampler, n_trials=10, seed=3)
    result = s.run()
    assert device.settings() == start  # knobs restored
    first = min(result.records, key=lambda r: r.number)
    assert first.role == "baseline" and first.candidate.batch_size == 32
    assert first.candidate.knobs["gpu_freq"] == device.knobs["gpu_freq"].min  # safe: from the lowest clock up
    probes = [r for r in result.records if r.role == "baseline"]
    assert result.baseline is not None and result.baseline.feasible
    # the baseline is the highest GPU frequency that held the budget among the probes
    held = [r.candidate.knobs["gpu_freq"] for r in probes if r.feasible]
    assert result.baseline.candidate.knobs["gpu_freq"] == max(held)
    assert len(result.settings) <= 10
    assert result.best is not None and result.best.feasible
    assert result.best.measurement["max_avg_power_w"] <= 9.0
    assert result.speedup is not None and result.speedup >= 1.0
    for t in s.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        assert set(t.constraints) == {"power_w"}
        assert (t.constraints["power_w"] <= 0) == t.user_attrs["feasible"]
    doc = best_json(result)
    assert BEST_KEYS <= set(doc) and doc["speedup_measure"] == "time to target (baseline / chosen)"
    assert doc["batch_size"] == result.best.candidate.batch_size
    assert {k: v["value"] for k, v in doc["baseline"]["setting"].items()} == result.baseline.candidate.knobs
    json.dumps(doc, allow_nan=False)


@pytest.mark.parametrize("sampler", ["tpe", "guided"])
def test_pareto_objective_keeps_the_front_of_time_and_energy(workload, sampler):
    device = open_device("sim:orin-nano", compute=False, seed=2)
    s = search(device, workload, small_space(device), 9.0, soak_s=SHORT_SOAK_S, objective="pareto", sampler=sampler,
               n_trials=10, seed=2)
    result = s.run()
    assert s.study.directions == [optuna.study.StudyDirection.MINIMIZE] * 2
    from edgetune.search.results import certified

    held = [r for r in result.settings if r.feasible and r.outcome]
    # the front is drawn from the settings that hold the budget by the sensor's accuracy and the thermal rise
    feasible = [r for r in held if certified(r, result.limit_w, result.required_margin_w)] or held
    front = result.pareto
    assert front and result.best in front
    for r in front:  # nothing feasible dominates a point of the front
        o = r.outcome
        assert not any(f.outcome.time_to_target_s <= o.time_to_target_s and
                       f.outcome.energy_to_target_j < o.energy_to_target_j for f in feasible)
    assert len(best_json(result)["pareto_front"]) == len(front)


@pytest.mark.parametrize("objective, threshold", [("time", "0.50%"), ("pareto", "0.25%")])
def test_the_stopping_rule_asks_a_front_for_a_quarter_of_the_margin(workload, objective, threshold):
    """Half the 1% margin for one objective; a quarter for both pareto turns (a front's hypervolume reads a shift
    of its ends several times over)."""
    device = open_device("sim:orin-nano", compute=False, seed=2)
    s = search(device, workload, small_space(device), 9.0, objective=objective, sampler="guided", n_trials=30,
               seed=2, protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0), soak_s=0.0,
               guided_options={"min_trials_to_stop": 6, "stop_confirmations": 1})
    result = s.run()
    assert result.stop_reason.startswith("no unmeasured setting is expected to improve")
    assert f" by {threshold} within the budget" in result.stop_reason
    assert len(result.settings) < s.space.size


def test_a_setting_is_never_measured_twice(workload, tmp_path):
    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 32, [16, 32], ["gpu_freq"], {"gpu_freq": ["min", "max"]})
    s = search(device, workload, space, None, sampler="random", n_trials=10, patience=0)
    result = s.run()
    assert result.stop_reason == "every setting of the space measured"
    # the sampler's proposals: each setting once; only the pick's contenders are measured again
    first = [r for r in result.measured if r.role != Role.CONFIRM]
    assert len(first) == len(result.settings) == space.size == 4
    assert len({r.candidate for r in first}) == 4
    again = [r for r in result.measured if r.role == Role.CONFIRM]
    assert again and result.best.measurement["windows"] >= 2
    path = write_trials_csv(result, tmp_path / "trials.csv")
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == len(result.measured) and {"batch_size", "gpu_freq", "step_time_s", "max_avg_power_w"} <= set(rows[0])
    assert all(float(row["judged_span_s"]) >= 1.0 for row in rows)  # the span each window's power was judged over
    assert sum(row["role"] == "confirm" for row in rows) == len(again)


def test_a_trial_of_a_measured_or_queued_setting_finds_it_instead_of_measuring(workload):
    from edgetune.search import records
    from edgetune.search.fleet import find_same, queued_or_running

    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 32, [16, 32], ["gpu_freq"], {"gpu_freq": ["min", "max"]})
    s = search(device, workload, space, None, sampler="random", n_trials=2, patience=0, confirm_settings=0)
    result = s.run()
    study = s.study
    measured = {r.candidate: r.number for r in result.measured}
    cand = next(iter(measured))
    other = next(c for c in space.grid() if c not in measured)

    def ask(c):
        return study.ask({n: optuna.distributions.IntDistribution(v, v) for n, v in space.params(c).items()})

    for c, expected in ((cand, measured[cand]), (other, None)):
        trial = ask(c)
        found = find_same(study, trial, space, wait_s=0.0)
        assert (found.number if found is not None else None) == expected
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    # another worker measuring the same setting under a lower trial number: its result is the one to take
    first, second = ask(other), ask(other)
    assert queued_or_running(study, space, other) and not queued_or_running(study, space, cand)
    assert find_same(study, second, space, wait_s=0.0).number == first.number
    assert find_same(study, first, space, wait_s=0.0) is None  # ties go to the lower number
    for t in (first, second):
        study.tell(t, state=optuna.trial.TrialState.FAIL)
    # a setting waiting in the queue is not queued again
    assert not queued_or_running(study, space, other)
    records.enqueue(study, space, other)
    assert queued_or_running(study, space, other)


def test_guided_search_finds_the_oracle_of_a_small_space(workload):
    device = open_device("sim:orin-nano", compute=False, seed=1)
    twin = device.backend
    space = small_space(device, (16, 32, 64, 128, 256))
    budget = 8.5
    target = TargetModel()
    s = search(device, workload, space, budget, sampler="guided", n_trials=30, seed=1, target=target)
    result = s.run()

    from edgetune.search.results import sensor_accuracy_w

    def true_time(c):
        # judged on the warm board, as a training run draws it (the search soaked its pick), by the sensor's
        # accuracy: no search that certifies the budget from readings can pick closer to it
        e = twin.steady_state(workload.cost, c.batch_size, c.knobs)
        held = e.power_w + sensor_accuracy_w(budget) <= budget and e.fits
        return target.steps(c.batch_size) * e.step_time_s if held else math.inf

    oracle = min(true_time(c) for c in space.grid())
    chosen = true_time(result.best.candidate)
    assert chosen <= oracle * 1.05
    assert len(result.measured) < space.size


def mode_space(device):
    return build_space(device, 32, (16, 32, 64, 128), ["power_mode", "gpu_freq"])


def watch_proposals(monkeypatch, key: str) -> list[float]:
    """The guided sampler's ``key`` score (``p_feas``, ``expected_over_s``) of each setting its model proposed,
    read from the fit the proposal was made from (cached), as the search runs."""
    from edgetune.search.samplers import GuidedSampler

    seen: list[float] = []
    original = GuidedSampler.sample_relative

    def watched(self, study, trial, search_space):
        params = original(self, study, trial, search_space)
        scores = self._score(study, trial.number)
        if scores is not None and np.any(np.isfinite(scores.acquisition)):
            k = int(np.flatnonzero(scores.idx == self.grid.index(params))[0])
            seen.append(float(getattr(scores, key)[k]))
        return params

    monkeypatch.setattr(GuidedSampler, "sample_relative", watched)
    return seen


def test_guided_sampler_keeps_predicted_power_within_what_the_measurements_imply():
    """Power does not fall as the batch or a clock rises (in one power mode): a prediction is raised to the
    power of a measured setting below the candidate and lowered to that of a measured one above it that held
    the budget; one stopped over the budget bounds only from below."""
    from edgetune.search.samplers.acquisition import within
    from edgetune.search.samplers.guided import GuidedSampler
    from edgetune.search.samplers.models import Measured

    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 32, (16, 32, 64), ["power_mode", "gpu_freq"], {"gpu_freq": ["306MHz", "510MHz", "max"]})
    sampler = GuidedSampler(space, budget_w=6.0)

    def at(b, mode, gpu):
        return sampler.grid.index(space.params(space.candidate({"batch_size_level": space.batch_sizes.index(b),
                                                            "power_mode_level": space.knob_values["power_mode"].index(mode),
                                                            "gpu_freq_level": gpu})))

    measured = Measured(idx=[at(32, "15W", 1), at(16, "15W", 2)], times=[0.1, 0.1], powers=[5.5, 6.4],
                        peaks=[6.0, 7.0], oom_batches=[])
    cand = np.array([at(16, "15W", 0), at(64, "15W", 2), at(16, "15W", 1), at(64, "15W", 0), at(16, "7W", 0)])
    predicted = np.array([5.9, 6.0, 5.0, 5.0, 9.0])
    bounded = within(predicted, *sampler._power_bounds(cand, measured))  # as the sampler's scoring does
    assert bounded[0] == 5.5  # below the 5.5-W setting that held the budget: at most 5.5
    assert bounded[1] == 6.4  # above the 6.4-W one (over the budget): at least 6.4
    assert bounded[2] == 5.0  # below the feasible one, above neither: the model's 5.0 stands
    assert bounded[3] == 5.0  # 64 at the lowest clock: above no measured setting in every dimension
    assert bounded[4] == 9.0  # another power mode: no order across modes


def test_guided_sampler_stopping_rule_follows_the_objective():
    """Without a prior, the stopping rule may end a search from 16 measured settings where its score is step time
    alone, and from 20 where power enters it (its score carries the power model's error too); and one fit that
    finds nothing left worth measuring ends a step-time search, where two in a row must end the others, or a
    search a prior's model steers. An explicit floor or count wins."""
    from edgetune.power.knobs import Candidate
    from edgetune.search.efficiency import ZeusCost
    from edgetune.search.records import Observation
    from edgetune.search.samplers.guided import (
        MIN_TRIALS_TO_STOP,
        STOP_CONFIRMATIONS,
        TIME_MIN_TRIALS_TO_STOP,
        TIME_STOP_CONFIRMATIONS,
        GuidedSampler,
    )

    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 32, (16, 32), ["gpu_freq"], {"gpu_freq": ["306MHz", "max"]})
    samplers = {o: GuidedSampler(space, objective=o, budget_w=6.0, cost=ZeusCost(0.5, 15.0) if o == "cost" else None)
                for o in ("time", "throughput", "energy", "cost", "pareto")}
    assert (TIME_MIN_TRIALS_TO_STOP, MIN_TRIALS_TO_STOP) == (16, 20)
    assert (TIME_STOP_CONFIRMATIONS, STOP_CONFIRMATIONS) == (1, 2)
    assert {o: (s.min_trials_to_stop, s.stop_confirmations) for o, s in samplers.items()} == {
        "time": (16, 1), "throughput": (16, 1), "energy": (20, 2), "cost": (20, 2), "pareto": (20, 2)}
    explicit = GuidedSampler(space, objective="time", min_trials_to_stop=20, stop_confirmations=2)
    assert (explicit.min_trials_to_stop, explicit.stop_confirmations) == (20, 2)
    prior = [Observation(Candidate(b, (("gpu_freq", f),)), measured=True, ok=True, step_time_s=0.1,
                         max_avg_power_w=5.0) for b in (16, 32) for f in space.knob_values["gpu_freq"]]
    assert GuidedSampler(space, objective="time", prior=prior, min_group=2).stop_confirmations == 2


def test_guided_sampler_never_proposes_a_confidently_infeasible_setting(workload, monkeypatch):
    proposals = watch_proposals(monkeypatch, "p_feas")
    device = open_device("sim:orin-nano", compute=False, seed=2)
    s = search(device, workload, mode_space(device), 8.0, soak_s=SHORT_SOAK_S, sampler="guided", n_trials=16, seed=2,
               protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0))
    result = s.run()
    assert len(proposals) >= 5  # the model proposed most of the settings
    assert min(proposals) >= 0.05  # GuidedSampler's min_feasible_p
    assert result.best is not None and result.best.feasible


def test_guided_sampler_candidates_are_settings_as_they_run():
    """With the power modes' caps known, a clock above its mode's cap is its cap, and a mode whose every
    setting another mode runs too (Orin NX 10W inside 15W, once the clocks and cores it caps are tuned) has
    no candidates of its own; a capped knob left untuned runs at each mode's maximum, so no mode is merged."""
    from edgetune.search.samplers import GuidedSampler

    device = open_device("sim:orin-nx", compute=False)
    caps = device.knobs["power_mode"].caps
    every = build_space(device, 32, (16, 32))
    assert dict(every.mode_caps) == caps
    sampler = GuidedSampler(every)
    cand = [every.candidate(sampler.grid.params(int(i))) for i in sampler.grid.candidates()]
    modes = {c.knobs["power_mode"] for c in cand}
    assert "10W" not in modes and "15W" in modes  # 10W: 4 cores, lower CPU and EMC caps, the same GPU
    assert all(c.knobs[k] <= caps[c.knobs["power_mode"]].cap(k) for c in cand for k in ("gpu_freq", "cpu_cores"))
    assert len(cand) < every.size
    # every merged or clamped setting runs as its candidate does (the twin's noise-free truth)
    some = np.random.default_rng(0).choice(sampler.grid.n, 50, replace=False)
    for i in some:
        raw, run = every.candidate(sampler.grid.params(int(i))), every.candidate(sampler.grid.params(int(sampler.grid.canonical(np.array([i]))[0])))
        assert device.backend.effective_clocks(dict(raw.setting)) == device.backend.effective_clocks(dict(run.setting))
        assert raw.batch_size == run.batch_size
    gpu_only = build_space(device, 32, (16, 32), ["power_mode", "gpu_freq"])
    sampler = GuidedSampler(gpu_only)
    cand = [gpu_only.candidate(sampler.grid.params(int(i))) for i in sampler.grid.candidates()]
    assert {c.knobs["power_mode"] for c in cand} == set(gpu_only.knob_values["power_mode"])
    assert all(c.knobs["gpu_freq"] <= caps[c.knobs["power_mode"]].cap("gpu_freq") for c in cand)


def test_guided_sampler_measures_a_setting_two_power_modes_run_alike_once():
    """A setting within the caps of two power modes of the same fixed state runs alike under both (Xavier
    NX: the 10W desktop mode and the 20W 2-core one at the lowest clocks and one core), so it is one
    candidate, in the highest of the modes that run it; no two candidates run the same."""
    from edgetune.power.knobs import Candidate
    from edgetune.search.samplers import GuidedSampler

    device = open_device("sim:xavier-nx", compute=False)
    caps = device.knobs["power_mode"].caps
    tuned = ["power_mode", "gpu_freq", "emc_freq", "cpu_freq", "cpu_cores"]
    space = build_space(device, 32, (16, 32), tuned)
    sampler = GuidedSampler(space)
    low = {k: space.knob_values[k][0] for k in tuned[1:]}
    a, b = (space.params(Candidate(16, tuple(dict(low, power_mode=m).items()))) for m in ("MODE_10W_DESKTOP",
                                                                                        "MODE_20W_2CORE"))
    assert caps["MODE_10W_DESKTOP"].peer(caps["MODE_20W_2CORE"], tuned[1:])
    assert not caps["MODE_10W_DESKTOP"].within(caps["MODE_20W_2CORE"], tuned[1:])  # 4 cores against 2
    assert sampler.grid.index(a) == sampler.grid.index(b)
    runs = set()
    for i in sampler.grid.candidates():
        c = space.candidate(sampler.grid.params(int(i)))
        state = (c.batch_size, device.backend.effective_clocks(dict(c.setting)))  # the gated TPCs too
        assert state not in runs
        runs.add(state)
    assert len(runs) < space.size


def test_guided_sampler_keeps_apart_a_setting_one_mode_caps_between_two_levels():
    """A clock whose mode caps it between two levels (the top two here) runs at the cap, not at the level:
    that setting is its mode's own, while the levels both modes run as set are one candidate, whose measured
    power bounds the settings of both modes (board power does not fall as a clock rises in one mode)."""
    from edgetune.power.base import ModeCaps
    from edgetune.power.knobs import Candidate
    from edgetune.search.samplers import GuidedSampler
    from edgetune.search.space import SearchSpace

    gpu = (306_000_000, 510_000_000, 918_000_000)
    caps = (("LOW", ModeCaps((("gpu_freq", 714_000_000),))), ("HIGH", ModeCaps(())))
    space = SearchSpace(batch_sizes=(16,), knobs=(("gpu_freq", gpu), ("power_mode", ("LOW", "HIGH"))),
                        mode_caps=caps)
    sampler = GuidedSampler(space)

    def index(f, mode):
        return sampler.grid.index(space.params(Candidate(16, (("gpu_freq", f), ("power_mode", mode)))))

    assert index(510_000_000, "LOW") == index(510_000_000, "HIGH")
    assert index(918_000_000, "LOW") != index(918_000_000, "HIGH")  # runs at 714 MHz under LOW
    assert sampler.grid.candidates().size == 4
    # a setting both modes run bounds the power of either mode's settings above and below it: measured over
    # the budget at 510 MHz, LOW's own setting (918 MHz set, 714 run) draws at least as much
    from edgetune.search.samplers.models import Measured

    sampler.budget_w = 10.0
    cand = np.array([index(306_000_000, "HIGH"), index(918_000_000, "LOW"), index(918_000_000, "HIGH")])
    lo, hi = sampler._power_bounds(cand, Measured([index(510_000_000, "LOW")], [0.1], [12.0], [12.0], []))
    assert lo.tolist() == [-np.inf, 12.0, 12.0] and np.all(np.isinf(hi))
    lo, hi = sampler._power_bounds(cand, Measured([index(510_000_000, "HIGH")], [0.1], [8.0], [8.0], []))
    assert hi.tolist() == [8.0, np.inf, np.inf] and lo.tolist() == [-np.inf, 8.0, 8.0]


def test_guided_search_ends_once_every_setting_that_could_hold_the_budget_is_measured(workload):
    device = open_device("sim:orin-nano", compute=False, seed=5)
    space = build_space(device, 32, (16, 32), ["power_mode", "gpu_freq"])
    s = search(device, workload, space, 6.5, soak_s=SHORT_SOAK_S, sampler="guided", n_trials=40, seed=5,
               protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0))
    result = s.run()
    assert result.stop_reason == "every setting that could hold the budget has been measured"
    assert len(result.measured) < 40


def test_guided_sampler_never_measures_a_setting_above_one_that_was_over_the_budget(workload):
    """Board power does not fall when the batch or a clock rises: in the same power mode, a setting at or
    above a measured over-budget one in every numeric knob is over too, and is never measured."""
    device = open_device("sim:orin-nano", compute=False, seed=5)
    space = mode_space(device)
    s = search(device, workload, space, 6.5, soak_s=SHORT_SOAK_S, sampler="guided", n_trials=24, seed=5,
               protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0))
    result = s.run()
    measured = sorted((r for r in result.measured if r.ok), key=lambda r: r.number)
    over = [r for r in measured if not r.feasible]
    assert over, "the budget should put some measured settings over it"

    def above(a, b) -> bool:
        return (a.candidate.knobs["power_mode"] == b.candidate.knobs["power_mode"]
                and a.candidate.batch_size >= b.candidate.batch_size
                and a.candidate.knobs["gpu_freq"] >= b.candidate.knobs["gpu_freq"])

    for r in measured:
        assert not any(o.number < r.number and above(r, o) for o in over), r.candidate


@pytest.mark.parametrize("allowance_s", [0.002, math.inf])
def test_guided_sampler_keeps_the_expected_seconds_over_the_budget_within_the_allowance(workload, monkeypatch,
                                                                                    allowance_s):
    expected = watch_proposals(monkeypatch, "expected_over_s")
    device = open_device("sim:orin-nano", compute=False, seed=2)
    s = search(device, workload, mode_space(device), 7.0, soak_s=SHORT_SOAK_S, sampler="guided", n_trials=16, seed=2,
               protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0),
               guided_options={"over_budget_allowance_s": allowance_s})
    s.run()
    assert len(expected) >= 5
    if math.isfinite(allowance_s):
        assert max(expected) <= allowance_s
    else:  # without the allowance the model does propose settings it expects to run clearly over
        assert max(expected) > 0.002


def test_each_power_mode_is_probed_before_the_model_may_stop(workload):
    device = open_device("sim:orin-nano", compute=False, seed=4)
    space = mode_space(device)
    # a 50% margin: the model would stop on its first fit if the power modes did not need their own probes
    s = search(device, workload, space, 9.0, soak_s=SHORT_SOAK_S, sampler="guided", n_trials=40, seed=4, margin=0.5,
               protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0),
               guided_options={"min_trials_to_stop": 4, "min_group": 4, "stop_confirmations": 1})
    result = s.run()
    assert result.stop_reason.startswith("no unmeasured setting")
    per_mode = {m: sum(r.candidate.knobs["power_mode"] == m and r.ok for r in result.measured)
                for m in space.knob_values["power_mode"]}
    assert min(per_mode.values()) >= 4, per_mode
    assert len(result.measured) < space.size


def test_knife_edge_names_the_margin_and_the_pick_stays_on_the_safe_side(workload, capsys):
    from edgetune.search.results import certified, choose_best, knife_edge, margin_w, sensor_accuracy_w

    device = open_device("sim:orin-nano", compute=False, seed=1)
    space = small_space(device)
    s = search(device, workload, space, 8.5, sampler="random", n_trials=8, seed=1, soak_s=0.0)  # the sensor alone
    result = s.run()
    assert result.best is not None and result.sensor_channels == 1  # the Orin Nano's total is its input rail
    # the pick holds the budget by the sensor's accuracy wherever a measured setting does
    edge = knife_edge(result)
    assert certified(result.best, 8.5, sensor_accuracy_w(8.5)) or (edge is not None and edge.safer is None)
    # the same search under a budget a hair above the fastest held setting's measured power: a knife edge
    held = [r for r in result.settings if r.feasible and r.outcome is not None]
    fastest = min(held, key=lambda r: r.outcome.time_to_target_s)
    m = fastest.measurement  # judged with its guard band, as the search judges it
    result.budget_w = m["max_avg_power_w"] + result.guard_sigma * m["power_se_w"] + 0.01
    # certified on the measured maximum less the part the reading noise adds to a maximum
    margin = result.budget_w - (m["max_avg_power_w"] - m["max_avg_noise_w"])
    assert 0.0 < m["max_avg_noise_w"] < 0.05
    edge = knife_edge(result)
    assert edge is not None and edge.edge.candidate == fastest.candidate
    assert edge.margin_w == pytest.approx(margin) and margin < edge.accuracy_w
    assert edge.accuracy_w == pytest.approx(sensor_accuracy_w(result.budget_w))
    safe = [r for r in held if margin_w(r, result.budget_w) >= edge.accuracy_w]
    pick = choose_best(result)
    if safe:  # the default is the next safer setting, at the cost the summary states
        assert edge.safer is not None and pick.candidate == edge.safer.candidate
        assert edge.safer.candidate == min(safe, key=lambda r: r.outcome.time_to_target_s).candidate
        assert edge.safer_cost_pct == pytest.approx(
            (edge.safer.outcome.time_to_target_s / fastest.outcome.time_to_target_s - 1) * 100)
        assert edge.safer_cost_pct >= 0.0
    else:  # nothing has the margin: the edge setting is the pick, and says so
        assert edge.safer is None and pick.candidate == fastest.candidate
    result.best = pick
    doc = best_json(result)["knife_edge"]
    assert doc["margin_w"] == pytest.approx(margin) and doc["setting"] == fastest.candidate.knobs
    assert (doc["next_safer"] is None) == (edge.safer is None)
    assert doc["chosen"] == ("this" if edge.safer is None else "next_safer")
    assert best_json(result)["batch_size"] == pick.candidate.batch_size
    assert {k: v["value"] for k, v in best_json(result)["setting"].items()} == pick.candidate.knobs
    # the summary says so too, with the margin and the next safer setting (or that there is none)
    from edgetune.report import summary_table

    text = summary_table(result)
    if edge.safer is None:
        assert f"knife edge: the chosen setting's measured power is {margin:.3f} W under the budget" in text
    else:
        assert f"knife edge: the best measured setting (trial {fastest.number}," in text
        assert f"is {margin:.3f} W under the budget" in text and "the pick is the next safer" in text
        run = (f"to run the edge setting: edgetune run --device sim:orin-nano --workload {workload.name} "
               f"--batch-size {fastest.candidate.batch_size} --set ")
        assert run in text
        # the line runs as written: on the search's device, with the workload the search was given
        line = summary_table(result, "cnn").split("to run the edge setting: ")[1].split(" (best.json")[0]
        argv = shlex.split(line)
        assert argv[:6] == ["edgetune", "run", "--device", "sim:orin-nano", "--workload", "cnn"]
        assert main(argv[1:] + ["--steps", "2", "--warmup", "0", "--json"]) == 0
        ran = json.loads(capsys.readouterr().out)["setting"]
        assert {k: ran[k] for k in fastest.candidate.knobs} == fastest.candidate.knobs
    assert f"over budget during search: {result.over_budget_s:.1f} s" in text


def test_batch_tie_names_another_batch_size_within_the_laws_precision(workload):
    """Two batch sizes whose best measured settings are closer by the law's steps than the law is precise are a
    tie: best.json and the summary name the other one; a clear lead names none."""
    import dataclasses

    from edgetune.report import summary_table
    from edgetune.search.efficiency import Outcome
    from edgetune.search.results import LAW_RATIO_PRECISION, batch_tie, choose_best

    device = open_device("sim:orin-nano", compute=False, seed=1)
    result = search(device, workload, small_space(device), 8.5, sampler="random", n_trials=10, seed=1,
                    soak_s=0.0).run()
    measured = list(result.records)

    def under(b_noise: float):
        """The same measurements scored with the law at ``b_noise``: each window's outcome recomputed."""
        target = TargetModel(1000.0, b_noise)

        def rescored(r):
            if r.outcome is None:
                return r
            m = r.measurement
            return dataclasses.replace(r, outcome=Outcome.of(r.candidate.batch_size, m["step_time_s"],
                                                             m["energy_per_sample_j"], target))

        result.records, result.target = [rescored(r) for r in measured], target
        result.best = choose_best(result)
        return result

    # each batch size's fastest certified step (the law's steps are alike within a batch size)
    step = {}
    for r in under(1.0).settings:
        if r.feasible and r.outcome is not None and result.certified(r):
            b = r.candidate.batch_size
            step[b] = min(step.get(b, math.inf), r.measurement["step_time_s"])
    # two batch sizes some B_noise >= 0 ties: the larger slower per step (else it wins under every B_noise, the
    # law's steps never rising with the batch) but faster per sample
    b1, b2 = next((a, c) for a, c in zip(sorted(step), sorted(step)[1:]) if step[a] < step[c])
    t1, t2 = step[b1], step[b2]
    assert t1 / b1 > t2 / b2  # the larger batch takes less time per sample, so some B_noise ties the two
    tie_b_noise = (t2 - t1) / (t1 / b1 - t2 / b2)  # (1 + B/b1) t1 = (1 + B/b2) t2
    assert tie_b_noise > 0
    seen, tie_at = set(), None
    for b_noise in (1.0, tie_b_noise * 0.99, tie_b_noise * 1.01, 1e4):
        res = under(b_noise)
        pick = res.best
        others = [r for r in res.settings if r.feasible and r.outcome is not None and res.certified(r)
                  and r.candidate.batch_size != pick.candidate.batch_size]
        runner = min(others, key=lambda r: r.outcome.time_to_target_s)
        cost_pct = (runner.outcome.time_to_target_s / pick.outcome.time_to_target_s - 1) * 100
        tie = batch_tie(res)
        assert (tie is not None) == (cost_pct < 100 * LAW_RATIO_PRECISION), (b_noise, cost_pct)
        seen.add(tie is not None)
        if tie is not None:
            tie_at = b_noise
        doc = best_json(res)["batch_size_tie"]
        text = summary_table(res)
        if tie is None:
            assert doc is None and "a tie under the convergence law" not in text
            continue
        assert tie.runner_up.candidate == runner.candidate and tie.cost_pct == pytest.approx(cost_pct)
        steps = TargetModel(1000.0, b_noise).steps
        assert tie.steps_ratio == pytest.approx(steps(runner.candidate.batch_size) / steps(pick.candidate.batch_size))
        assert doc["runner_up"]["batch_size"] == runner.candidate.batch_size
        assert doc["cost_pct"] == pytest.approx(cost_pct) and doc["law_ratio_precision_pct"] == 5.0
        assert (f"batch size: a tie under the convergence law: batch {runner.candidate.batch_size} (trial "
                f"{runner.number}," in text)
        assert (f"edgetune run --device {res.device_name} --workload {workload.name} --batch-size "
                f"{runner.candidate.batch_size} --set ") in text
    assert seen == {True, False}  # the law's B_noise near the tie makes one, far from it none
    # steps that are a table's measured epochs to target (a trace replay's), not the law's: no tie is the law's
    from edgetune.search.oracle import TableTarget

    res = under(tie_at)
    assert batch_tie(res) is not None
    res.target = TableTarget(batch_sizes=tuple(res.space.batch_sizes))
    assert not res.target.is_law and TargetModel().is_law
    assert batch_tie(res) is None


def test_sensor_accuracy_counts_every_summed_channel():
    from edgetune.power.base import summed_channels
    from edgetune.search.results import SENSOR_ACCURACY_ABS_W, sensor_accuracy_w

    assert summed_channels("VDD_IN") == 1
    assert summed_channels("derived: VDD_GPU_SOC + VDD_CPU_CV + VIN_SYS_5V0 + VDDQ_VDD2_1V8AO") == 4
    assert summed_channels("derived: package-0") == 1
    # the INA3221's maxima: 0.82 % of the power plus 80 uV over 5 mOhm at 5 V per channel
    assert sensor_accuracy_w(10.0) == pytest.approx(0.082 + 0.08)
    assert sensor_accuracy_w(30.0, 4) == pytest.approx(0.246 + 4 * SENSOR_ACCURACY_ABS_W)
    agx = open_device("sim:orin-agx", compute=False)
    try:
        assert summed_channels(agx.sensor.total_label) == 4  # the AGX module's total sums four rails
    finally:
        agx.close()


def test_knobs_restored_and_no_running_trial_after_ctrl_c(workload):
    device = open_device("sim:orin-nano", compute=False)
    start = device.settings()

    def interrupt(record, n):
        raise KeyboardInterrupt

    s = search(device, workload, small_space(device), 9.0, sampler="random", n_trials=5, on_trial=interrupt)
    with pytest.raises(KeyboardInterrupt):
        s.run()
    assert device.settings() == start
    states = {t.state for t in s.study.get_trials()}
    assert optuna.trial.TrialState.RUNNING not in states


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_search_with_real_cnn_steps_writes_results_and_resumes(tmp_path, capsys):
    out = tmp_path / "out"

    def argv(n_trials):
        return ["search", "--device", "sim:orin-nano", "--workload", "cnn", "--budget", "10", "--batch-sizes",
                "8,16", "--knobs", "gpu_freq", "--n-trials", str(n_trials), "--sampler", "random", "--measure-s",
                "1", "--soak-s", str(SHORT_SOAK_S), "-o", str(out)]

    assert main(argv(3)) == 0
    text = capsys.readouterr().out
    assert "speedup over baseline" in text and "SIMULATED device" in text
    assert "real training step" in text  # the protocol says what ran for real
    best = json.loads((out / "best.json").read_text())
    assert BEST_KEYS <= set(best) and best["simulated"] is True and best["budget_w"] == 10
    assert best["measured"]["max_avg_power_w"] <= 10
    # gpu_freq alone searched: the other knobs as the twin was found, the state the plan holds in; clocks aside,
    # since on a board they read the running frequency a governor moves
    assert {k: v["value"] for k, v in best["untuned_knobs"].items()} == {"cpu_cores": 6, "power_mode": "15W"}
    for name in ("trials.csv", "time_vs_energy.png", "power.png", "study.db"):
        assert (out / name).stat().st_size > 0
    rows = list(csv.DictReader((out / "trials.csv").open()))
    # a trial stopped over the budget counts its real warm-up step too (its figures cover the steps since the
    # knobs were set)
    assert sum(r["role"] != "confirm" for r in rows) == 3 and all(int(r["real_steps"]) == 1 for r in rows
                                  if r["ok"] == "True" and r["aborted_over_budget"] == "False")
    assert all(float(r["over_budget_s"]) >= 0 for r in rows)
    assert best["study"]["over_budget_s"] == pytest.approx(sum(float(r["over_budget_s"]) for r in rows))
    # the same command again: nothing new to measure; more trials: only the new ones are measured
    assert main(argv(3)) == 0
    assert list(csv.DictReader((out / "trials.csv").open())) == rows
    assert main(argv(4)) == 0
    rows2 = list(csv.DictReader((out / "trials.csv").open()))
    assert sum(r["role"] != "confirm" for r in rows2) == 4 and rows2[:len(rows)] == rows


@pytest.mark.parametrize(("extra", "message"), [
    (["--budget", "2"], "is at or below the idle power of sim:orin-nano"),
    (["--budget", "10", "--workload", "no_such_module:build"], "no_such_module"),
    (["--budget", "10", "--storage", "postgresql://edgetune@127.0.0.1:1/none"], "cannot open storage"),
    (["--budget", "10", "--knobs", "gpu_clock"], "has no knob 'gpu_clock'"),
    (["--budget", "10", "--objective", "speed"], "--objective must be one of time, energy"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, extra, message):
    argv = ["search", "--device", "sim:orin-nano", "-o", str(tmp_path / "o"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edgetune: error: ") and message in err[0], err
    if extra[1] == "2":
        assert "infeasible" in err[0] and "lowest feasible budget is about" in err[0]


@pytest.mark.parametrize(("space", "message"), [
    ('knobs = ["gpu_freq", "fan_speed"]', "space: sim:orin-nano has no knob 'fan_speed'"),
    ('knobs = ["gpu_freq"]\nvalues = { emc_freq = [204000000] }', "space.values lists emc_freq, which is not tuned"),
    ('knobs = ["gpu_freq"]\nvalues = { gpu_freq = [1] }', "space.values: "),
])
def test_cli_a_space_error_set_in_a_config_names_the_file(tmp_path, capsys, space, message):
    config = tmp_path / "space.toml"
    config.write_text(f'device = "sim:orin-nano"\npower_budget_w = 10\n\n[space]\n{space}\n')
    assert main(["search", "--config", str(config), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"edgetune: error: {config}: {message}"), err


def test_cli_budget_below_idle_from_a_config_names_the_file_and_key_as_other_config_errors(tmp_path, capsys):
    config = tmp_path / "budget1.toml"
    config.write_text('device = "sim:orin-nano"\npower_budget_w = 1.0\n')
    assert main(["search", "--config", str(config), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"edgetune: error: {config}: power_budget_w 1 W is at or below the idle "
                                               f"power of sim:orin-nano"), err
    config.write_text('device = "sim:orin-nano"\npower_budget_w = -1.0\n')  # another config error, alike
    assert main(["search", "--config", str(config), "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"edgetune: error: {config}: power_budget_w must be > 0")
    # the flag over the file: the flag is named
    assert main(["search", "--config", str(config), "--budget", "2", "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("edgetune: error: --budget 2 W is at or below the idle power")


@pytest.mark.parametrize("given", ["--budget", "file"])
def test_cli_a_budget_that_reads_as_milliwatts_is_refused_before_anything_is_measured(tmp_path, capsys, given):
    """10000 for 10 W: a budget above the most the board draws that is a budget of it in milliwatts. It ran
    unconstrained, a note among the start-up lines, its study and folder named 10000W."""
    config = tmp_path / "mw.toml"
    config.write_text('device = "sim:orin-nano"\npower_budget_w = 10000\n')
    argv = ["--budget", "10000"] if given == "--budget" else ["--config", str(config)]
    assert main(["search", "--device", "sim:orin-nano", *argv, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    src = "--budget" if given == "--budget" else f"{config}: power_budget_w"
    assert len(err) == 1 and err[0].startswith(f"edgetune: error: {src} 10000 W is more than sim:orin-nano can "
                                               f"draw"), err
    assert "10000 mW = 10 W" in err[0] and "give 10" in err[0]
    assert not (tmp_path / "o").exists()


def test_cli_budget_above_the_device_maximum_runs_unconstrained(tmp_path, capsys):
    argv = ["search", "--device", "sim:orin-nano", "--workload", "cnn", "--budget", "100", "--batch-sizes", "8",
            "--knobs", "gpu_freq", "--n-trials", "2", "--sampler", "random", "--measure-s", "0.5",
            "--warmup-steps", "0", "--real-steps", "0", "--b-noise", "measure", "--b-noise-warmups", "2",
            "-o", str(tmp_path / "o")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "no constraint binds; searching unconstrained" in captured.err
    best = json.loads((tmp_path / "o" / "best.json").read_text())
    assert best["budget_binds"] is False and best["budget_w"] == 100.0
    # B_noise measured from gradient norms over two warm-ups, each from fresh weights, and said so
    source = best["target_model"]["b_noise_source"]
    assert source.startswith("measured from gradient norms: the median of 2 warm-up(s) of 20 steps"), source
    line = next(ln for ln in captured.err.splitlines() if ln.startswith("B_noise measured from gradient norms"))
    each = [float(v) for v in line.partition("(each warm-up: ")[2].rstrip(")").split(", ")]
    assert len(each) == 2 and best["target_model"]["b_noise"] == pytest.approx(sum(each) / 2, abs=0.06)


def test_cli_b_noise_never_positive_in_the_warmups_is_one_line_exit_2(tmp_path, capsys):
    # a loss without gradient: no warm-up can tell B_noise, and the error says what each read and the fix
    (tmp_path / "flat.py").write_text(
        "import torch\n"
        "from edgetune.workloads import Workload\n\n"
        "def build(seed=0):\n"
        "    def make_batch(batch_size, generator):\n"
        "        x = torch.randn(batch_size, 8, generator=generator)\n"
        "        return x, torch.zeros(batch_size, dtype=torch.long)\n"
        "    return Workload.from_model('flat', torch.nn.Linear(8, 2), make_batch, default_batch_size=16,\n"
        "                               loss_fn=lambda out, y: out.sum() * 0.0, seed=seed)\n")
    argv = ["search", "--device", "sim:orin-nano", "--workload", f"{tmp_path / 'flat.py'}:build", "--budget", "10",
            "--b-noise", "measure", "--b-noise-warmups", "3", "-o", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # what runs before the first trial is said, then the error in one line
    assert len(err) == 2 and err[0].startswith("B_noise: measuring it from gradient norms: 3 warm-up(s)"), err
    assert ('not positive in enough of 3 warm-ups of 20 steps (not positive, not positive, not positive); '
            "set efficiency.b_noise to a number of samples, or measure more warm-ups") in err[1]
    assert not (tmp_path / "o").exists()  # nothing written


USER_WORKLOADS = """
import torch
from edgetune.workloads import Workload

def batches(batch_size, generator):
    x = torch.randn(batch_size, 8, generator=generator)
    return x, (x[:, 0] > 0).long()

def linear(seed=0):
    return Workload.from_model("linear", torch.nn.Linear(8, 2), batches, default_batch_size=16, seed=seed)

def flat(seed=0):
    return Workload.from_model("flat", torch.nn.Linear(8, 2), batches, default_batch_size=16, seed=seed,
                               loss_fn=lambda out, y: out.sum() * 0.0)
"""


@pytest.mark.parametrize(("function", "objective", "source"), [
    ("linear", "time", "linear carries none; measured from gradient norms: the median of 2 warm-up(s)"),
    ("flat", "energy", "fallback: flat carries no measured B_noise"),  # measuring failed: said so
    ("linear", "throughput", "fallback: linear carries no measured B_noise"),  # no steps to target: not measured
])
def test_cli_a_workload_without_b_noise_has_it_measured(tmp_path, capsys, function, objective, source):
    """The default b_noise = "workload" for your own model, which carries none: measured from gradient norms
    where the objective needs steps to target, rather than a constant deciding the batch size unsaid."""
    (tmp_path / "mine.py").write_text(USER_WORKLOADS)
    argv = ["search", "--device", "sim:orin-nano", "--workload", f"{tmp_path / 'mine.py'}:{function}", "--budget",
            "10", "--objective", objective, "--batch-sizes", "8,16", "--knobs", "gpu_freq", "--n-trials", "2",
            "--sampler", "random", "--measure-s", "0.5", "--warmup-steps", "0", "--real-steps", "0",
            "--b-noise-warmups", "2", "--soak-s", "0", "-o", str(tmp_path / "o")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    best = json.loads((tmp_path / "o" / "best.json").read_text())
    assert best["target_model"]["b_noise_source"].startswith(source)
    if function == "flat":
        assert ("B_noise: flat carries none, and measuring it failed (the gradient noise scale of flat was not "
                "positive in enough of 2 warm-ups of 20 steps (not positive, not positive)): the fallback of 256 "
                "samples decides the batch size; set efficiency.b_noise (--b-noise)") in err
    elif objective == "time":
        assert f"B_noise {source}" in err and best["target_model"]["b_noise"] != 256.0
    else:  # throughput: nothing measured, and the warm-ups asked for are named as not used
        unused = "note: --b-noise-warmups 2 is not used: B_noise is not measured here"
        assert unused in err
        assert not [line for line in err.splitlines() if "B_noise" in line and not line.startswith(unused)]


# ---------------------------------------------------------------------------------------------- samplers


def test_guided_sampler_works_under_plain_optimize_with_injected_observations(workload):
    """No Search, no trial attributes: the objective measures on the twin, sets the budget constraint, and
    tells the sampler what it measured through ``observations_func``."""
    from edgetune.search.records import Observation
    from edgetune.search.samplers import GuidedSampler

    device = open_device("sim:orin-nano", compute=False, seed=4)
    twin = device.backend
    space = small_space(device, (16, 32, 64, 128, 256))
    budget, sigma, target = 8.5, 2.0, TargetModel()
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    seen: dict[int, Observation] = {}
    sampler = GuidedSampler(space, budget_w=budget, target=target, seed=4, guard_sigma=sigma,
                            observations_func=lambda t: seen.get(t.number))
    study = optuna.create_study(sampler=sampler)
    dists = space.distributions()
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:

        def objective(trial: optuna.Trial) -> float:
            cand = space.candidate({n: trial.suggest_int(n, d.low, d.high) for n, d in dists.items()})
            m = measure_setting(device, workload, cand.batch_size, cand.knobs, protocol, monitor)
            seen[trial.number] = Observation.of(cand, m, m.holds(budget, guard_sigma=sigma))
            trial.set_constraint("power_w", m.judged_power_w(sigma) - budget)
            return target.steps(cand.batch_size) * m.step_time_s

        study.optimize(objective, n_trials=12)
    assert len(seen) == 12
    assert len({obs.candidate for obs in seen.values()}) == 12  # never proposes a setting it has seen
    feasible = [obs for obs in seen.values() if obs.feasible]
    assert feasible

    def true_time(c):  # the sampler alone: no soak, no certification margin (plain Optuna knows neither)
        e = twin.expected(workload.cost, c.batch_size, c.knobs)
        return target.steps(c.batch_size) * e.step_time_s if e.power_w <= budget and e.fits else math.inf

    oracle = min(true_time(c) for c in space.grid())
    best = min(feasible, key=lambda o: target.steps(o.candidate.batch_size) * o.step_time_s)
    assert true_time(best.candidate) <= oracle * PLAIN_OPTIMIZE_GAP


def test_baseline_probes_from_the_lowest_clock_up_and_a_given_up_probe_does_not_hold():
    from edgetune.power.knobs import Candidate
    from edgetune.search.baseline import Baseline
    from edgetune.search.records import Role, TrialRecord

    device = open_device("sim:orin-nano", compute=False)
    space = small_space(device)
    gpu = space.knob_values["gpu_freq"]
    baseline = Baseline(space, 32, device.settings())  # no limit given: bisection above the lowest

    def probe(level: int, feasible: bool, given_up: bool = False, power_w: float | None = None) -> TrialRecord:
        cand = baseline.candidate(gpu[level])
        m = None if given_up else {"ok": True, "oom": False, "max_avg_power_w": power_w}
        return TrialRecord(level, "FAIL" if given_up else "COMPLETE", cand, Role.BASELINE, not given_up, m, None,
                           feasible, given_up=given_up)

    first = baseline.state([]).next_probe
    assert first == Candidate(32, (("gpu_freq", gpu[0]), ("emc_freq", device.settings()["emc_freq"])))
    top = len(gpu) - 1
    assert top == 4
    # the lowest clock does not hold the budget: no higher one does, there is no baseline
    none = baseline.state([probe(0, False)])
    assert none.done and none.found is None
    assert baseline.state([probe(0, True)]).next_probe.knobs["gpu_freq"] == gpu[2]  # (0 + 5) // 2
    # that probe's worker died on it every time: it counts as over the budget, bisection goes lower
    state = baseline.state([probe(0, True), probe(2, False, given_up=True)])
    assert state.next_probe.knobs["gpu_freq"] == gpu[1]
    done = baseline.state([probe(0, True), probe(1, True), probe(2, False)])
    assert done.done and done.found.candidate.knobs["gpu_freq"] == gpu[1]


def test_baseline_probes_no_clock_above_the_found_power_modes_cap():
    from edgetune.search.baseline import Baseline
    from edgetune.search.records import Role, TrialRecord
    from edgetune.search.space import build_space

    # the Orin NX as found runs its 15W mode, which caps the GPU at 612 MHz: 714-918 MHz run at 612 MHz there
    device = open_device("sim:orin-nx", compute=False)
    assert device.settings()["power_mode"] == "15W"
    space = build_space(device, 32, [32, 128], None, {})
    assert max(space.knob_values["gpu_freq"]) == 918_000_000 and "power_mode" in space.knob_names
    baseline = Baseline(space, 128, device.settings(), limit_w=10.0)
    assert baseline.lowered_values() == [306_000_000, 408_000_000, 510_000_000, 612_000_000]

    def probe(n: int, cand, power_w: float) -> TrialRecord:
        return TrialRecord(n, "COMPLETE", cand, Role.BASELINE, True,
                           {"ok": True, "oom": False, "max_avg_power_w": power_w}, None, power_w <= 10.0)

    # the twin's b 128 draws 7.3 W at 306 MHz and 8.8 W at 612 MHz: all hold 10 W, and the cap ends the probes
    # (one probe: bisection; then the line through two)
    probes: list[TrialRecord] = []
    while (nxt := baseline.state(probes).next_probe) is not None:
        gpu = nxt.knobs["gpu_freq"]
        assert gpu <= 612_000_000 and nxt.knobs["power_mode"] == "15W"
        probes.append(probe(len(probes), nxt, 7.3 + 1.5 * (gpu - 306e6) / 306e6))
    found = baseline.state(probes).found
    assert found is not None and found.candidate.knobs["gpu_freq"] == 612_000_000
    assert [r.candidate.knobs["gpu_freq"] for r in probes] == [306_000_000, 510_000_000, 612_000_000]
    # where the mode is not tuned, the caps of the mode in force: the space holds nothing above them
    untuned = build_space(device, 32, [32, 128], ["gpu_freq"], {})
    assert max(untuned.knob_values["gpu_freq"]) == 612_000_000 and untuned.found_caps == dict(space.mode_caps)["15W"]
    assert Baseline(untuned, 128, device.settings(), limit_w=10.0).lowered_values() == \
        [306_000_000, 408_000_000, 510_000_000, 612_000_000]


def test_a_board_found_in_a_mode_it_cannot_leave_searches_and_probes_within_its_caps(tmp_path, caplog):
    """An Orin Nano booted in 7W offers no other mode live (15W gates other TPCs: a reboot), so the power mode is
    no searched knob; 7W's caps still hold (GPU 408 MHz, CPU 960 MHz, 4 cores): the space stops at them (a value
    above runs at the cap: the same setting again), and the baseline probes and runs its clocks within them."""
    from fakes.jetson_tree import build_jetson

    from edgetune.power import jetson
    from edgetune.search.baseline import Baseline, governed_clocks

    fake = build_jetson(tmp_path / "root", "orin-nano", boot_mode=1)
    gpu = fake.root / "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    (gpu / "max_freq").write_text("408000000\n")  # what nvpmodel set at boot
    for policy in ("policy0", "policy4"):
        (fake.root / f"sys/devices/system/cpu/cpufreq/{policy}/scaling_max_freq").write_text("960000\n")
    for cpu in ("cpu4", "cpu5"):
        (fake.root / f"sys/devices/system/cpu/{cpu}/online").write_text("0\n")
    device = jetson.open(root=fake.root, detect_period_s=0.0)
    try:
        assert device.knobs["power_mode"].values == ("7W",)
        space = build_space(device, 32, [16, 32])
        values = space.knob_values
        assert "power_mode" not in space.knob_names and max(values["gpu_freq"]) == 408_000_000
        assert max(values["cpu_freq"]) == 960_000 and max(values["cpu_cores"]) == 4
        found = device.settings()
        runs = governed_clocks(space, found)
        assert runs["cpu_freq"] == 960_000 and runs["gpu_freq"] == 408_000_000
        baseline = Baseline(space, 16, runs, limit_w=6.0)
        assert baseline.lowered_values() == [306_000_000, 408_000_000]
        first = baseline.state([]).next_probe
        assert first.knobs["gpu_freq"] == 306_000_000 and first.knobs["cpu_freq"] == 960_000
        # values the user named above the cap are not searched, and the user is told which and why
        with caplog.at_level("WARNING", logger="edgetune"):
            named = build_space(device, 32, [16], ["gpu_freq"], {"gpu_freq": ["306MHz", "510MHz", "624.75MHz"]})
        assert named.knob_values["gpu_freq"] == (306_000_000, 510_000_000)
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warned) == 1 and "gpu_freq 624.75 MHz: above the cap" in warned[0] and "(408 MHz)" in warned[0]
        caplog.clear()
        with caplog.at_level("WARNING", logger="edgetune"):
            build_space(device, 32, [16], ["gpu_freq"])  # the knob's own values: nothing the user named dropped
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
    finally:
        device.close()


def test_a_power_limit_baseline_starts_at_the_highest_limit():
    from edgetune.search.baseline import Baseline
    from edgetune.search.records import Role, TrialRecord
    from edgetune.search.space import SearchSpace

    limits = (100.0, 125.0, 150.0, 175.0, 200.0)
    space = SearchSpace(batch_sizes=(32,), knobs=(("power_limit", limits),))
    baseline = Baseline(space, 32, {"power_limit": 200.0}, limit_w=160.0)

    def probe(limit: float, power_w: float) -> TrialRecord:
        return TrialRecord(0, "COMPLETE", baseline.candidate(limit), Role.BASELINE, True,
                           {"ok": True, "oom": False, "max_avg_power_w": power_w}, None, power_w <= 160.0)

    # the device enforces a limit: the highest first, as common practice does
    assert baseline.state([]).next_probe.knobs["power_limit"] == 200.0
    # it did not hold: bisection
    assert baseline.state([probe(200.0, 199.0)]).next_probe.knobs["power_limit"] == 125.0  # (-1 + 4) // 2
    assert baseline.state([probe(200.0, 199.0), probe(125.0, 124.0)]).next_probe.knobs["power_limit"] == 150.0
    done = baseline.state([probe(200.0, 150.0)])
    assert done.done and done.found.candidate.knobs["power_limit"] == 200.0


def test_baseline_interpolates_power_in_the_clock_towards_the_limit():
    from edgetune.search.baseline import Baseline
    from edgetune.search.records import Role, TrialRecord

    device = open_device("sim:orin-nano", compute=False)
    space = small_space(device)
    gpu = [float(v) for v in space.knob_values["gpu_freq"]]  # 306, 408, 510, 612, 624.75 MHz
    baseline = Baseline(space, 32, device.settings(), limit_w=8.0)

    def probe(level: int, power_w: float) -> TrialRecord:
        return TrialRecord(level, "COMPLETE", baseline.candidate(space.knob_values["gpu_freq"][level]),
                           Role.BASELINE, True, {"ok": True, "oom": False, "max_avg_power_w": power_w}, None,
                           power_w <= 8.0)

    # one probe held at 6 W: nothing to interpolate with yet, bisect
    assert baseline.state([probe(0, 6.0)]).next_probe.knobs["gpu_freq"] == gpu[2]
    # 6 W at 306 MHz, 9 W at 612 MHz: the chord reaches 8 W at 510 MHz, probed next (the bisection would
    # take 408 MHz); 6 W at 306 and 9 W at 510: the chord's 8 W lies at 442 MHz, so 408 MHz
    assert baseline.state([probe(0, 6.0), probe(3, 9.0)]).next_probe.knobs["gpu_freq"] == gpu[2]
    assert baseline.state([probe(0, 6.0), probe(2, 9.0)]).next_probe.knobs["gpu_freq"] == gpu[1]
    # 6 W at 306, 7 W at 408, none over yet: the line through them reaches 8 W at 510 MHz, probed next
    # (not the top, which the line puts at 9.2 W)
    assert baseline.state([probe(0, 6.0), probe(1, 7.0)]).next_probe.knobs["gpu_freq"] == gpu[2]
    # a flat line (no slope) goes to the top
    assert baseline.state([probe(0, 6.0), probe(1, 6.0)]).next_probe.knobs["gpu_freq"] == gpu[4]
    done = baseline.state([probe(0, 6.0), probe(1, 7.0), probe(2, 8.5)])
    assert done.done and done.found.candidate.knobs["gpu_freq"] == gpu[1]

def test_trailing_average_max_bounds_the_next_window():
    from edgetune.search.window import trailing_average_max_w

    t = np.arange(0.0, 3.0 + 1e-9, 0.01)  # 1 W for 2 s, 11 W for 0.3 s, then 1 W idle for 0.7 s
    p = np.where((t >= 2.0) & (t < 2.3), 11.0, 1.0)
    # the last window averages 4 W as a whole, and so does its worst trailing stretch, the one from 2.0 s on
    # (0.3 x 11 + 0.7 x 1 over 1 s); a shorter one from 2.2 s averages (0.1 x 11 + 0.7) / 0.8 = 2.25 W
    worst = trailing_average_max_w(t, p, 1.0)
    assert worst == pytest.approx((0.3 * 11 + 0.7 * 1) / 1.0, rel=0.03)
    assert trailing_average_max_w(t[:200], p[:200], 1.0) == pytest.approx(1.0)  # nothing high in the window
    # brute force: continue the record at the bound for a window; the moving average never exceeds it
    future_t = np.arange(3.01, 4.0 + 1e-9, 0.01)
    tt, pp = np.concatenate([t, future_t]), np.concatenate([p, np.full(future_t.size, worst)])
    from edgetune.search.window import over_limit_s

    assert over_limit_s(tt, pp, 3.0, 4.0, 1.0, worst + 0.05) == 0.0


def test_guided_sampler_never_refits_a_power_mode_on_the_same_measurements(workload, monkeypatch):
    """Each new measurement changes one power mode's rows: the other modes keep their fitted models (a fit is
    deterministic, and costs about a second on an edge CPU). A thermal soak refers every window's power to
    its board temperature: that changes every mode's targets, and they are refitted once."""
    from edgetune.predictors import hardware_model

    fitted = []
    original = hardware_model.HardwareModel.fit

    def counted(self, X, *args, **kwargs):
        fitted.append((tuple(tuple(sorted(r.items())) for r in X), tuple(args[0]), tuple(args[1])))
        return original(self, X, *args, **kwargs)

    monkeypatch.setattr(hardware_model.HardwareModel, "fit", counted)
    device = open_device("sim:orin-nano", compute=False, seed=3)
    s = search(device, workload, mode_space(device), 9.0, soak_s=SHORT_SOAK_S, sampler="guided", n_trials=14, seed=3,
               protocol=MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0),
               guided_options={"min_group": 3})
    result = s.run()
    assert len(fitted) >= 8 and result.thermal_soaks  # the soak's reference refitted the modes
    assert len(set(fitted)) == len(fitted)  # no fit repeated on identical rows and targets


def test_a_knob_error_in_the_middle_of_a_step_propagates(workload, monkeypatch):
    """The watchdog's knob writes run on the sampling thread; a failure there (a clock file gone) is raised to
    the caller once the step is done, as any knob error, not recorded as a failed step."""
    from edgetune.power import DeviceError
    from edgetune.search import trial

    def broken_rest(device, setting):
        raise DeviceError("cannot write /sys/devices/gpu.0/devfreq/17000000.ga10b/max_freq: Permission denied")

    monkeypatch.setattr(trial, "go_to_rest", broken_rest)
    device = open_device("sim:orin-nano", compute=False)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=2.0)
    long = {"gpu_freq": "min", "emc_freq": "max", "cpu_freq": "max"}  # batch 131072: 2.2 s per step, 9.5 W
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        device.clock.sleep(2.0)
        with pytest.raises(DeviceError, match="Permission denied"):
            measure_setting(device, workload, 131072, long, protocol, monitor, limit_w=6.0)
        assert not monitor._windows  # the setting's windows are closed


def fit_on_twin(sampler, twin, workload, idx):
    """The guided sampler's fit on rows of the twin's noise-free figures at grid indices ``idx`` (a test of the
    model alone: no search runs)."""
    from edgetune.search.samplers.models import Measured

    truth = [twin.expected(workload.cost, c.batch_size, c.knobs)
             for c in (sampler.space.candidate(sampler.grid.params(int(i))) for i in idx)]
    rows = Measured(idx=[int(i) for i in idx], times=[e.step_time_s for e in truth],
                    powers=[e.power_w for e in truth], peaks=[e.power_w for e in truth], oom_batches=[])
    sampler._measured = lambda study: rows
    return sampler._fit(None)


def test_a_power_mode_whose_probes_all_ran_over_the_budget_is_settled_by_its_least_setting(workload):
    """Where every setting measured in a power mode was over the budget, the next proposal in that mode is its
    least setting (smallest batch, every numeric knob at its lowest): one measurement settles the mode. Over
    the budget there, every other setting of the mode is ruled out; a mode with a setting that held is left to
    the model."""
    from edgetune.search.samplers.guided import GuidedSampler

    device = open_device("sim:orin-nano", compute=False)
    twin = device.backend
    space = build_space(device, 32, (16, 32, 64, 128), ["power_mode", "gpu_freq", "emc_freq", "cpu_freq"])
    budget_w = 4.8  # 7W holds it at its lowest clocks (4.56 W); 15W at none (its least setting: 5.33 W)

    def lv(b, mode, gpu, emc, cpu):  # grid levels: batch size first, then the knobs in the space's order
        named = {"power_mode": space.knob_values["power_mode"].index(mode), "gpu_freq": gpu, "emc_freq": emc,
                 "cpu_freq": cpu}
        return (b, *(named[n] for n in space.knob_names))

    top = [len(space.knob_values[n]) - 1 for n in ("gpu_freq", "emc_freq", "cpu_freq")]
    measured = [lv(0, "7W", 0, 0, 0), lv(1, "7W", 1, 1, 1), lv(3, "7W", *top),
                lv(0, "15W", *top), lv(3, "15W", 1, 0, 1), lv(1, "15W", 0, 2, 0)]

    def sampler_on(levels):
        s = GuidedSampler(space, budget_w=budget_w, seed=0)
        idx = s.grid.canonical(s.grid.flat(np.array(levels)))
        fit = fit_on_twin(s, twin, workload, idx)
        s._taken = lambda study: {int(i) for i in idx}
        return s, fit

    s, fit = sampler_on(measured)
    held = dict(zip(fit.measured.idx, np.array(fit.measured.powers) <= budget_w))
    group = s.grid.group(np.array(fit.measured.idx))
    g15 = int(s.grid.group(s.grid.flat(np.array([lv(0, "15W", 0, 0, 0)])))[0])
    assert not any(h for i, h in held.items() if group[fit.measured.idx.index(i)] == g15)  # 15W: all over
    floor = int(s.grid.canonical(s.grid.flat(np.array([lv(0, "15W", 0, 0, 0)])))[0])
    cand = s.grid.candidates()
    in15 = cand[(s.grid.group(cand) == g15) & ~np.isin(cand, fit.measured.idx)]
    assert {s._floor_first(None, int(i)) for i in in15[:50]} == {floor}
    in7 = cand[(s.grid.group(cand) != g15) & ~np.isin(cand, fit.measured.idx)]
    assert all(s._floor_first(None, int(i)) == int(i) for i in in7[:50])  # 7W held the budget: the model's
    # measured over the budget, the least setting rules out the whole mode; nothing else is redirected
    s, _ = sampler_on(measured + [lv(0, "15W", 0, 0, 0)])
    scores = s._score(None, len(measured) + 1)
    in_scored15 = s.grid.group(scores.idx) == g15
    assert in_scored15.any() and not np.any(scores.possible[in_scored15])
    assert s._floor_first(None, int(in15[-1])) == int(in15[-1])


def test_power_modes_of_one_fixed_state_share_one_model_fitted_on_all_their_rows(workload):
    """Power modes of the same fixed state (Xavier NX: all nine run 3 TPCs) run a setting within their caps
    alike, so their measurements are of one physics: each mode's model is the one fitted on the rows of all
    of them, clocks as they run; a mode with no row of its own has it too. Modes that gate GPU units apart
    (Orin Nano 7W: 2 TPCs, 15W: 4) keep models of their own rows."""
    from edgetune.search.samplers.guided import GuidedSampler

    device = open_device("sim:xavier-nx", compute=False)
    tuned = ["power_mode", "gpu_freq", "emc_freq", "cpu_freq", "cpu_cores"]
    space = build_space(device, 32, (16, 32, 64, 128), tuned)
    sampler = GuidedSampler(space, budget_w=8.0, seed=0)
    cand, live = sampler.grid.candidates(), sampler.grid.live_groups().tolist()
    assert len(live) == 3 and all(sampler.grid.kin(g) == tuple(live) for g in live)
    groups = sampler.grid.group(cand)
    rng = np.random.RandomState(0)
    idx = np.concatenate([rng.choice(cand[groups == live[0]], 5, replace=False),
                          rng.choice(cand[groups == live[1]], 4, replace=False)])  # none in the third mode
    fitted = fit_on_twin(sampler, device.backend, workload, idx)
    assert set(fitted.per_group) == set(live) and fitted.pooled is None and not fitted.borrowed
    model = fitted.per_group[live[2]]
    assert all(fitted.per_group[g] is model for g in live)
    own = GuidedSampler(space, budget_w=8.0, seed=0, n_startup=5)
    alone = fit_on_twin(own, device.backend, workload, idx[:5])  # the first mode's rows alone
    rows = sampler.grid.rows(idx, sampler.grid.numeric_names)
    assert not np.allclose(model.predict(rows).step_time_s, alone.per_group[live[0]].predict(rows).step_time_s)

    nano = open_device("sim:orin-nano", compute=False)
    space = build_space(nano, 32, (16, 32, 64, 128), ["power_mode", "gpu_freq", "emc_freq"])
    sampler = GuidedSampler(space, budget_w=8.0, seed=0)
    cand, live = sampler.grid.candidates(), sampler.grid.live_groups().tolist()
    assert len(live) == 2 and all(sampler.grid.kin(g) == (g,) for g in live)
    groups = sampler.grid.group(cand)
    idx = np.concatenate([rng.choice(cand[groups == live[0]], 6, replace=False),
                          rng.choice(cand[groups == live[1]], 2, replace=False)])
    fitted = fit_on_twin(sampler, nano.backend, workload, idx)
    assert set(fitted.per_group) == {live[0]} and fitted.pooled is not None  # 2 rows: the pooled model's


def test_a_barely_measured_power_mode_borrows_the_best_measured_modes_model(workload):
    """A power mode with a model of its own on fewer than TRUSTED_GROUP_ROWS rows has its step time predicted
    by the mixture of that model and the best-measured mode's model corrected by its rows: where the two
    disagree the prediction is as doubtful as their disagreement; from TRUSTED_GROUP_ROWS rows the mode's
    model stands alone."""
    from edgetune.search.samplers.guided import TRUSTED_GROUP_ROWS, GuidedSampler

    device = open_device("sim:orin-nx", compute=False)
    twin = device.backend
    space = build_space(device, 32, (16, 32, 64, 128), ["power_mode", "gpu_freq", "emc_freq"])
    sampler = GuidedSampler(space, budget_w=9.0, seed=0)
    cand = sampler.grid.candidates()
    modes = space.knob_values["power_mode"]
    mode_of = np.array([modes[lv] for lv in sampler.grid.levels(cand)[:, 1 + space.knob_names.index("power_mode")]])
    rng = np.random.RandomState(0)
    main_idx = rng.choice(cand[mode_of == "MAXN"], 16, replace=False)
    sparse = cand[mode_of == "15W"]
    sparse_idx = rng.choice(sparse, TRUSTED_GROUP_ROWS, replace=False)

    few = fit_on_twin(sampler, twin, workload, np.concatenate([main_idx, sparse_idx[:5]]))
    g15 = int(sampler.grid.group(sparse[:1])[0])
    assert set(few.borrowed) == {g15}  # MAXN, the best-measured mode, stands on its own model
    rows = sampler.grid.rows(sparse, sampler.grid.numeric_names)
    own = few.per_group[g15].predict(rows)
    other = few.borrowed[g15].predict(rows, sampler.grid.rows(sparse, sampler.grid.pooled_names), sampler.grid.group(sparse))
    t, p, t_std, p_std = sampler._predict(few, sparse)
    assert np.allclose(t, np.sqrt(own.step_time_s * other[0]))
    assert np.all(t_std / t >= 0.5 * np.abs(np.log(own.step_time_s / other[0])) - 1e-12)
    assert np.allclose(p, own.power_w) and np.allclose(p_std, own.power_std)  # power: the mode's own model

    enough = fit_on_twin(sampler, twin, workload, np.concatenate([main_idx, sparse_idx]))
    assert not enough.borrowed
    t, *_ = sampler._predict(enough, sparse)
    assert np.allclose(t, enough.per_group[g15].predict(rows).step_time_s)


def test_a_borrowed_model_is_kept_while_its_mode_and_the_main_model_do_not_change(workload):
    """A measurement in a third power mode leaves the other sparse mode's borrowed model as it was (the fits are
    deterministic); one in the best-measured mode, whose model changes, rebuilds it."""
    from edgetune.search.samplers.guided import GuidedSampler

    device = open_device("sim:orin-agx", compute=False)
    twin = device.backend
    space = build_space(device, 32, (16, 32, 64, 128), ["power_mode", "gpu_freq", "emc_freq"])
    sampler = GuidedSampler(space, budget_w=20.0, seed=0)
    cand = sampler.grid.candidates()
    groups = sampler.grid.group(cand)
    live = sorted(set(groups.tolist()), key=lambda g: -int(np.sum(groups == g)))
    assert len(live) >= 3
    rng = np.random.RandomState(0)
    main, a, b = (rng.choice(cand[groups == g], 16, replace=False) for g in live[:3])

    def fit(idx):
        return fit_on_twin(sampler, twin, workload, idx)

    first = fit(np.concatenate([main[:12], a[:5], b[:4]]))
    assert set(first.borrowed) == {live[1], live[2]}
    third = fit(np.concatenate([main[:12], a[:5], b[:5]]))  # one more row in the third mode
    assert third.borrowed[live[1]] is first.borrowed[live[1]]
    assert third.borrowed[live[2]] is not first.borrowed[live[2]]
    again = fit(np.concatenate([main[:13], a[:5], b[:5]]))  # the main mode's model changes
    assert again.borrowed[live[1]] is not third.borrowed[live[1]]


def test_the_search_stops_only_once_the_best_settings_batch_neighbours_are_measured(workload):
    """When the model finds nothing left that could pay, the best measured setting's knobs at one batch size level
    down and up are measured before the search may stop (the law ranks adjacent batch sizes close, and the model
    may be sure of a batch size it measured only at other clocks); without polish the rule stops at once."""
    from edgetune.search.samplers.guided import GuidedSampler

    device = open_device("sim:orin-nano", compute=False)
    twin = device.backend
    space = build_space(device, 32, (8, 16, 32, 64), ["gpu_freq", "emc_freq"])

    def sampler_on(idx, polish=True):
        s = GuidedSampler(space, budget_w=30.0, seed=0, min_trials_to_stop=0, stop_gain=1.0, stop_confirmations=1,
                          polish=polish)
        fit_on_twin(s, twin, workload, idx)
        s._taken = lambda study: {int(i) for i in idx}
        return s

    sizes = GuidedSampler(space).grid.sizes  # batch, gpu_freq, emc_freq levels
    top_e = sizes[2] - 1
    # batch 16 at every GPU clock, batch 32 at the lowest GPU clock only
    levels = [(1, g, e) for g in range(sizes[1]) for e in (0, top_e)] + [(2, 0, 0), (2, 0, top_e)]
    s = sampler_on(GuidedSampler(space).grid.flat(np.array(levels)))
    m = s._measured(None)
    best = tuple(s.grid.levels(np.array([s._best_measured(m.idx, m.times, m.powers, "time")[0]]))[0])
    expected = sorted({(best[0] + d, *best[1:]) for d in (-1, 1) if 0 <= best[0] + d < sizes[0]} - set(levels))
    assert expected  # its knobs were measured at no other batch size
    near = s._polish_candidates(None)
    assert sorted(tuple(lv) for lv in s.grid.levels(np.array(near))) == expected
    assert s.should_stop(None, 0.01) is None
    trial = SimpleNamespace(number=len(levels))  # sample_relative reads only the trial's number
    assert s.sample_relative(None, trial, space.distributions()) == s.grid.params(near[0])
    assert sampler_on(m.idx, polish=False).should_stop(None, 0.01) is not None  # the rule alone stops
    # a row of the neighbour's batch size one knob level away anchors the model there: no polish needed
    up = (best[0] + 1, max(best[1] - 1, 0) if best[1] else 1, best[2])
    assert up not in levels and up[0] < sizes[0]
    anchored = sampler_on(np.concatenate([m.idx, GuidedSampler(space).grid.flat(np.array([up]))]))
    polished = anchored.grid.levels(np.array(anchored._polish_candidates(None), dtype=np.int64))
    assert all(lv[0] != up[0] for lv in polished)

    measured = list(m.idx)
    for _ in range(sizes[0]):  # measure what polish asks until it asks nothing: a walk along the batch sizes
        measured += near
        s = sampler_on(np.array(measured))
        near = s._polish_candidates(None)
        if not near:
            break
        assert s.should_stop(None, 0.01) is None
    assert near == [] and s.should_stop(None, 0.01).endswith("its neighbours measured")

    # a space of batch sizes alone: a measured neighbour anchors itself, an unmeasured one is polished
    alone = GuidedSampler(build_space(device, 32, (8, 16, 32), []))
    assert alone._polish_near(1, [0, 1]).tolist() == [2]


def test_a_setting_that_held_the_budget_but_not_by_the_sensors_accuracy_is_followed_one_step_down():
    """The edge (the best setting that held the budget, but not by the sensor's accuracy) is one step from one
    that may be certified: where it beats the best certified setting, its neighbours one level down in the batch
    size or a numeric knob are measured before the search may stop."""
    from edgetune.search.samplers.guided import GuidedSampler

    workload = load_workload("cnn", seed=0)  # its step cost: at the top clocks batch 16 is the fastest here
    device = open_device("sim:orin-nano", compute=False)
    twin = device.backend
    space = build_space(device, 32, (8, 16, 32), ["gpu_freq", "emc_freq"])
    probe = GuidedSampler(space)
    top_g, top_e = probe.grid.sizes[1] - 1, probe.grid.sizes[2] - 1
    edge_lv = (1, top_g, top_e)
    levels = [edge_lv, (0, 0, 0), (1, 0, 0), (2, 0, 0), (1, 1, 0), (0, 1, top_e), (2, 0, top_e)]
    idx = probe.grid.flat(np.array(levels))
    edge_w = twin.expected(workload.cost, 16, space.candidate(probe.grid.params(int(idx[0]))).knobs).power_w
    # the edge holds the budget by 0.05 W, inside the sensor's 0.1 W accuracy; the other rows draw far less
    s = GuidedSampler(space, budget_w=edge_w + 0.05, accuracy_w=0.1, seed=0, min_trials_to_stop=0, stop_gain=1.0,
                      stop_confirmations=1)
    fit_on_twin(s, twin, workload, idx)
    s._taken = lambda study: {int(i) for i in idx}
    m = s._measured(None)
    assert max(p for p in m.powers if p != m.powers[0]) < s._limit_w < m.powers[0] <= s._budget_limit_w
    assert s._best_measured(m.idx, m.times, m.powers, "time", held_only=True)[0] == int(idx[0])
    below = {tuple(lv) for lv in s.grid.levels(s._below(int(idx[0])))}
    assert below == {(0, top_g, top_e), (1, top_g - 1, top_e), (1, top_g, top_e - 1)}
    proposed = {tuple(lv) for lv in s.grid.levels(np.array(s._polish_candidates(None), dtype=np.int64))}
    assert proposed & below  # a step back from the edge is measured before the search stops
    assert s.should_stop(None, 0.01) is None


def test_the_space_filling_start_settles_a_power_mode_whose_probes_ran_over_by_its_least_setting(workload):
    """The start is blind, but not to what it measured: once every setting measured in a power mode ran over the
    budget, the start's next setting in that mode is the mode's least one (as the model's proposals are,
    :meth:`GuidedSampler._floor_first`), and once that ran over too, the mode is done. Before, the start went on
    probing the mode at random (Orin Nano 15W at 5 W: three or four more settings at 5.5-9.1 W)."""
    device = open_device("sim:orin-nano", compute=False, seed=0)
    space = build_space(device, 32, (16, 32, 64, 128), ["power_mode", "gpu_freq", "emc_freq", "cpu_freq"])
    budget_w = 5.0  # 7W holds it at its lowest clocks (4.71 W); 15W at none (its least setting: 5.44 W)
    result = search(device, workload, space, budget_w, n_trials=8, soak_s=0.0, seed=0).run()
    least = {"power_mode": "15W", **{k: min(space.knob_values[k]) for k in ("gpu_freq", "emc_freq", "cpu_freq")}}
    start = sorted((r for r in result.measured if r.role != Role.CONFIRM), key=lambda r: r.number)[:6]
    in15 = [r for r in start if r.candidate.knobs["power_mode"] == "15W"]
    assert not in15[0].feasible  # the baseline probe, the board as found: 15W, over the budget
    assert len(in15) == 2 and in15[1].candidate.knobs == least and in15[1].candidate.batch_size == 16
    assert not in15[1].feasible


def test_the_start_never_guesses_over_the_budget_and_stops_once_nothing_unmeasured_could_hold_it(workload):
    """Before any model, a setting at or above a measured over-budget one (batch size and every numeric knob, in
    its power mode) is certain to be over too. The space-filling start draws from the settings not certain to be
    over, from the whole grid when its sample of 4096 has none; once every unmeasured setting is certain to be
    over, the search stops. Before, the start fell back to blind guesses (Orin Nano cnn at 4.6 W, both modes'
    least settings measured over what the sensor can certify: batch 1024 at 15W, 6.8 W, then batch 64 at 8.5 W)."""
    from edgetune.power.knobs import Candidate
    from edgetune.search.samplers.guided import GuidedSampler
    from edgetune.search.samplers.models import Measured

    device = open_device("sim:orin-nano", compute=False)
    tuned = ["power_mode", "gpu_freq", "emc_freq", "cpu_freq", "cpu_cores"]
    space = build_space(device, 32, (16, 32, 64, 128, 256, 512, 1024), tuned)
    least = {k: min(space.knob_values[k]) for k in tuned[1:]}

    def at(mode, batch=16, **up):  # the mode's least setting, some knobs one level up
        knobs = {k: space.knob_values[k][1] if k in up else v for k, v in least.items()}
        return Candidate(batch, tuple({**knobs, "power_mode": mode}.items()))

    def sampler_on(cands, powers, seed=0):
        s = GuidedSampler(space, budget_w=4.6, seed=seed)
        idx = [s.grid.index(space.params(c)) for c in cands]
        rows = Measured(idx=idx, times=[0.07] * len(idx), powers=powers, peaks=powers, oom_batches=[])
        s._measured = lambda study: rows
        s._taken = lambda study: set(idx)
        return s

    # 15W's least setting over the budget; 7W's over it one level up in each knob and in the batch size: of the
    # 7W settings only the least one is not certain to be over
    over = [at("15W"), at("7W", batch=32)] + [at("7W", **{k: 1}) for k in tuned[1:]]
    for seed in range(5):  # a sample of 4096 of its 13,986 candidates misses that one about 7 times in 10
        s = sampler_on(over, [5.1] + [4.7] * (len(over) - 1), seed)
        assert s.should_stop(None, 0.01) is None
        got = space.candidate(s._startup(None))
        assert (got.batch_size, got.knobs) == (16, at("7W").knobs)
    # ... and once that one ran over what the sensor can certify too, nothing is left to measure
    s = sampler_on(over + [at("7W")], [5.1] + [4.7] * (len(over) - 1) + [4.52])
    assert s.should_stop(None, 0.01) == "every setting that could hold the budget has been measured"
    # while a larger batch at 7W's least clocks is not known to be over, the search goes on
    s = sampler_on(over[:1] + over[2:] + [at("7W")], [5.1] + [4.7] * (len(over) - 2) + [4.40])
    assert s.should_stop(None, 0.01) is None


def test_a_study_trained_on_a_gpu_is_not_resumed_on_the_cpu_nor_the_reverse():
    # steps trained on the CPU are not the GPU's: a study records where it trained unless that is the CPU (the
    # twin's studies, and every study made before training followed the device, keep their identity)
    from edgetune.search.identity import StudyIdentity
    from edgetune.search.study import SearchError

    space = build_space(open_device("sim:orin-nano", seed=0), 32, [16, 32])
    target = TargetModel(1000.0, 256.0, "config")

    def identity(torch_device):
        return StudyIdentity.of(space=space, objective="time", budget_w=10.0, workload="cnn", device="jetson",
                                target=target, torch_device=torch_device)

    assert "torch_device" not in identity("cpu").fields and identity("cuda:0").fields["torch_device"] == "cuda:0"
    for made, resumed in (("cpu", "cuda:0"), ("cuda:0", "cpu")):
        study = optuna.create_study(study_name="s")
        identity(made).check(study, storage_url="sqlite:///x.db", sampler="guided", **RULE)
        identity(made).check(study, storage_url="sqlite:///x.db", sampler="guided", **RULE)
        with pytest.raises(SearchError, match=rf"^study 's' in sqlite:///x.db was made with --torch-device {made} "
                                              rf"\(not {resumed}\); use another --study-name or --output to start"):
            identity(resumed).check(study, storage_url="sqlite:///x.db", sampler="guided", **RULE)


RULE = {"tolerance": 0.0, "window_s": 1.0, "guard_sigma": 2.0}


@pytest.mark.parametrize(("key", "flag", "value"), [("tolerance", "--tolerance", 0.1), ("window_s", "--window", 5.0),
                                                     ("guard_sigma", "--guard-sigma", 0.0)])
def test_a_study_is_resumed_only_under_the_budget_rule_its_verdicts_were_made_by(key, flag, value):
    """A trial's verdict on the budget (its constraint) is made once, by the study's tolerance, window and guard
    band: a resume under another would keep 10.2 W as within a 10 W budget beside new trials judged without the
    tolerance. Refused in one line naming the flags to resume with; a study that never recorded its guard band
    (made before it did) resumes under any."""
    from edgetune.search import records
    from edgetune.search.identity import StudyIdentity
    from edgetune.search.study import SearchError

    space = build_space(open_device("sim:orin-nano", seed=0), 32, [16, 32])
    identity = StudyIdentity.of(space=space, objective="time", budget_w=10.0, workload="cnn", device="sim:orin-nano",
                                target=TargetModel(1000.0, 256.0, "config"))
    study = optuna.create_study(study_name="s")
    identity.check(study, storage_url="sqlite:///x.db", sampler="guided", **RULE)
    assert records.read_budget_rule(study) == RULE
    with pytest.raises(SearchError) as err:
        identity.check(study, storage_url="sqlite:///x.db", sampler="guided", **{**RULE, key: value})
    line = str(err.value)
    assert f"judged the budget with {flag} {RULE[key]:g}, not {flag} {value:g}" in line
    assert f"resume it with {flag} {RULE[key]:g}" in line and len(line.splitlines()) == 1
    identity.check(study, storage_url="sqlite:///x.db", sampler="guided", **RULE)
    if key == "guard_sigma":  # a study's attributes as one made before the guard band was recorded
        old = optuna.create_study(study_name="old")
        for k, v in study.user_attrs.items():
            if k != "guard_sigma":
                old.set_user_attr(k, v)
        identity.check(old, storage_url="sqlite:///x.db", sampler="guided", **{**RULE, key: value})


def test_a_study_made_before_the_protocol_was_kept_takes_this_searchs_also_where_it_is_scored_again(tmp_path):
    """A study whose identity lacks the measurement protocol (made before it was kept) resumed with other steps to
    target by a guided sampler: scored again, and the resume's protocol recorded with the rest of its identity, so
    that a later resume with another window length is refused (stored in SQLite, read back by another handle)."""
    from edgetune.search import records
    from edgetune.search.identity import StudyIdentity
    from edgetune.search.measurement import MeasurementProtocol
    from edgetune.search.study import SearchError

    space = build_space(open_device("sim:orin-nano", seed=0), 32, [16, 32])
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def identity(b_noise, measure_s):
        return StudyIdentity.of(space=space, objective="time", budget_w=10.0, workload="cnn", device="sim:orin-nano",
                                target=TargetModel(1000.0, b_noise, "config"),
                                protocol=MeasurementProtocol(measure_s=measure_s))

    made = identity(256.0, 2.0)
    assert {k: made.fields[k] for k in ("warmup_steps", "measure_steps", "measure_s")} == \
        {"warmup_steps": 1, "measure_steps": 5, "measure_s": 2.0} and "real_steps" not in made.fields
    study = optuna.create_study(study_name="s", storage=url)
    old = {k: v for k, v in made.fields.items() if k not in ("warmup_steps", "measure_steps", "measure_s")}
    records.write_identity(study, old, target=made.law, **RULE)  # as edgetune wrote it before
    identity(512.0, 3.0).check(study, storage_url=url, sampler="guided", **RULE)
    again = optuna.load_study(study_name="s", storage=url)
    assert records.read_identity(again)["measure_s"] == 3.0 and len(records.read_rescored(again)) == 1
    with pytest.raises(SearchError, match=r"measured its settings with --measure-s 3 \(not 2\): .*; resume it with "
                                          r"--measure-s 3, or start anew with another --study-name or --output"):
        identity(512.0, 2.0).check(again, storage_url=url, sampler="guided", **RULE)
    identity(512.0, 3.0).check(again, storage_url=url, sampler="guided", **RULE)


def test_a_real_boards_clocks_as_found_are_taken_as_their_governor_runs_them():
    # read at the start of a search, a governed clock gives the governor's choice of the moment (an idle CPU at a
    # low step); under training load it runs at the top of its range under the power mode as found
    from edgetune.search.baseline import governed_clocks

    device = open_device("sim:orin-nano", seed=0)
    space = build_space(device, 32, [16, 32])
    idle = dict(device.settings(), cpu_freq=729_600, emc_freq=204_000_000, gpu_freq=306_000_000)
    caps = dict(space.mode_caps)["15W"]
    assert governed_clocks(space, idle) == dict(idle, cpu_freq=caps.cap("cpu_freq"), emc_freq=2_133_000_000,
                                                gpu_freq=caps.cap("gpu_freq"))
    seven = dict(idle, power_mode="7W")  # under another mode, its caps
    assert governed_clocks(space, seven)["gpu_freq"] == dict(space.mode_caps)["7W"].cap("gpu_freq")
    assert governed_clocks(space, seven)["cpu_cores"] == idle["cpu_cores"]  # not a clock: as read
    # the twin reads the values set, and finds its clocks at the mode's caps: nothing moves there, on any profile
    for profile in ("orin-nano", "orin-nx", "orin-agx", "xavier-nx"):
        twin = open_device(f"sim:{profile}", seed=0)
        assert governed_clocks(build_space(twin, 32, [16, 32]), twin.settings()) == twin.settings(), profile
