"""``with edgetune.tune(...)`` on the simulated twin: plan, budget guard under disturbances and budget changes,
accounting, restore on every exit, the loader's batch-size changes, online tuning on a real training run."""

from __future__ import annotations

import contextlib
import doctest
import itertools
import json
import logging
import math
import os
import signal

import numpy as np
import pytest
import torch
from fakes.jetson_tree import build_jetson
from hf_models import DictData, LabelledClassifier
from torch.utils.data import TensorDataset

import edgetune
from edgetune.power import Knob, KnobWriteError, open_device
from edgetune.runtime import GuardParams, OnlineOptions, Plan, PlanError, load_plan
from edgetune.runtime.guard import GuardMove
from edgetune.workloads import load_workload

SETTLE_S = 2.0


@pytest.fixture(autouse=True)
def one_thread():
    # tiny models: torch's thread pool only adds contention on a shared 2-core machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def cnn_cost():
    return load_workload("cnn").cost


def mlp(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    data = TensorDataset(torch.randn(2048, 16), torch.randint(0, 4, (2048,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data


def train_until(tuner, model, optimizer, seconds, script=(), losses=None):
    """The user's plain loop, run until ``seconds`` of device time; ``script`` fires (t, fn) on the clock."""
    clock = tuner.device.clock
    pending = sorted(script, key=lambda e: e[0])

    def fire():
        while pending and pending[0][0] <= clock.now():
            pending.pop(0)[1]()

    tid = clock.add_ticker(0.01, fire)
    try:
        while clock.now() < seconds:
            for x, y in tuner.loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                if losses is not None:
                    losses.append(loss.item())
                if clock.now() >= seconds:
                    break
    finally:
        clock.remove_ticker(tid)


def last_over(tuner, t0, t1):
    """Seconds after ``t0`` at which the 1-s moving average was last above the budget, within [t0, t1)."""
    a = tuner.accounting
    t, avg, budget = np.array(a.trace_t), np.array(a.trace_avg), np.array(a.trace_budget)
    sel = (t >= t0) & (t < t1) & (avg > budget + 1e-9)
    return float(t[sel].max() - t0) if sel.any() else 0.0


# ---------------------------------------------------------------------------------------------- plan, restore


def train_epochs(tuner, workload, epochs, after_step):
    """``epochs`` passes over ``tuner.loader`` training ``workload``; ``after_step(loss)`` after each step."""
    for _ in range(epochs):
        for x, y in tuner.loader:
            loss = workload.loss_fn(workload.model(x), y)
            workload.optimizer.zero_grad()
            loss.backward()
            workload.optimizer.step()
            after_step(loss)


def write_plan(tmp_path, **over):
    plan = {"device": "sim:orin-nano", "simulated": True, "workload": "cnn", "budget_w": 10.0,
            "objective": "time", "batch_size": 64, "setting": {"gpu_freq": 408000000, "emc_freq": 2133000000}}
    plan.update(over)
    path = tmp_path / "best.json"
    path.write_text(json.dumps(plan))
    return path


def test_plan_is_applied_accounted_and_knobs_restored(tmp_path, cnn_cost):
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    log = tmp_path / "steps.csv"
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=write_plan(tmp_path), cost=cnn_cost,
                       log=log, print_summary=False) as tuner:
        assert tuner.batch_size == 64 and tuner.budget_w == 10.0
        assert dev.knobs["gpu_freq"].read() == 408000000
        for _ in range(2):
            for x, y in tuner.loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    s = tuner.summary
    assert dev.settings() == before and s.knobs_restored
    assert s.steps == 2 * 2048 // 64 and s.samples == 2 * 2048 and len(s.epochs) == 2
    assert [e.steps for e in s.epochs] == [32, 32]
    # per-step figures add up to the totals; energy = mean power x time
    steps = tuner.accounting.steps
    assert sum(r.energy_j for r in steps) == pytest.approx(s.energy_j)
    assert s.energy_j == pytest.approx(s.mean_w * s.time_s)
    expected = dev.backend.expected(cnn_cost, 64, {"gpu_freq": 408000000})
    assert s.time_s / s.steps == pytest.approx(expected.step_time_s, rel=0.05)
    assert s.mean_w == pytest.approx(expected.power_w, rel=0.05)
    assert max(r.peak_w for r in steps) == pytest.approx(s.peak_w)
    assert not s.violations and s.max_avg_w < 10.0
    rows = log.read_text().splitlines()
    assert len(rows) == 1 + s.steps and rows[0].startswith("step,epoch,batch_size")
    table = s.table()
    assert "sim:orin-nano (simulated twin)" in table and "0 violation(s)" in table and "knobs restored: yes" in table


def test_a_plan_measured_in_another_untuned_state_is_applied_with_a_warning(tmp_path, cnn_cost, caplog):
    """best.json's untuned_knobs: the knobs the search left as found. A board that runs one otherwise (a
    Jetson booted in another power mode) gets the plan with a warning naming both values."""
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    plan = write_plan(tmp_path, untuned_knobs={"power_mode": {"value": "7W", "unit": "", "text": "7W"}})
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost,
                       print_summary=False) as tuner:
        assert dev.knobs["gpu_freq"].read() == 408000000  # applied all the same
    said = [text for _, text in tuner.events if "measured with power_mode 7W" in text]
    assert len(said) == 1 and "the board runs 15W" in said[0] and "nvpmodel" in said[0]
    assert "measured with power_mode 7W" in caplog.text
    # a clock reads the frequency running now, which a governor moves from read to read: never compared (a plan
    # of an earlier version lists clocks among its untuned knobs)
    plan = write_plan(tmp_path, untuned_knobs={"power_mode": {"value": "15W", "unit": "", "text": "15W"},
                                               "cpu_freq": {"value": 729600, "unit": "kHz", "text": "729.6 MHz"}})
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost,
                       print_summary=False) as tuner:
        pass
    assert not [text for _, text in tuner.events if "measured with" in text]


def test_jsonl_log_has_steps_and_epochs(tmp_path, cnn_cost):
    model, opt, data = mlp()
    log = tmp_path / "run.jsonl"
    with edgetune.tune(model, opt, dataset=data, batch_size=256, budget_w=15, device="sim:orin-nano",
                       online=False, cost=cnn_cost, log=log, print_summary=False) as tuner:
        train_until(tuner, model, opt, 0.5)
    kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
    assert kinds.count("step") == tuner.summary.steps and kinds.count("epoch") == len(tuner.summary.epochs)


def test_a_log_written_after_the_tuner_was_built_is_never_overwritten(tmp_path, cnn_cost):
    # the log's existence was checked when the Tuner was built only: a second run of the same tuner, or another
    # tuner built before the first ran, truncated the first run's rows
    model, opt, data = mlp()
    log = tmp_path / "run.csv"
    kw = {"dataset": data, "batch_size": 256, "budget_w": 15, "device": "sim:orin-nano", "online": False,
          "cost": cnn_cost, "log": log, "print_summary": False}
    first, second = edgetune.tune(model, opt, **kw), edgetune.tune(model, opt, **kw)
    with first:
        train_until(first, model, opt, 0.3)
    rows = log.read_text()
    assert len(rows.splitlines()) == first.summary.steps + 1
    with pytest.raises(ValueError, match="exists: edgetune never overwrites a log"), second:
        pass
    with pytest.raises(RuntimeError, match="this tuner's run has ended"), first:  # a tuner runs one block
        pass
    assert log.read_text() == rows


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_knobs_are_restored_when_the_loop_raises(tmp_path, cnn_cost, error, capsys):
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    with pytest.raises(error), edgetune.tune(model, opt, dataset=data, device=dev, plan=write_plan(tmp_path),
                                             cost=cnn_cost) as tuner:
        for i, (x, y) in enumerate(tuner.loader):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if i == 5:
                raise error("boom")
    assert dev.settings() == before
    assert tuner.summary.knobs_restored and tuner.summary.steps == 6
    assert "knobs restored: yes" in capsys.readouterr().err  # the summary table is printed on any exit


def test_bad_plans_say_what_is_wrong(tmp_path):
    with pytest.raises(PlanError, match="no such file"):
        load_plan(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not readable JSON"):
        load_plan(bad)
    with pytest.raises(PlanError, match="batch_size must be a positive integer"):
        load_plan(write_plan(tmp_path, batch_size=0))
    with pytest.raises(PlanError, match="setting must be an object"):
        load_plan(write_plan(tmp_path, setting=[1]))
    model, opt, data = mlp()
    with pytest.raises(PlanError, match="knob.*turbo.*do not exist"), \
            edgetune.tune(model, opt, dataset=data, device="sim:orin-nano", plan=write_plan(tmp_path, setting={"turbo": 1})):
        pass


def test_steps_are_marked_by_hand_without_an_optimizer(cnn_cost):
    dev = open_device("sim:orin-nano", seed=0)
    with edgetune.tune(batch_size=32, budget_w=12, device=dev, cost=cnn_cost, online=False,
                       print_summary=False) as tuner:
        assert tuner.loader is None
        for _ in range(10):
            tuner.step()
    assert tuner.summary.steps == 10 and tuner.summary.samples == 320
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=12, device="sim:orin-nano",
                       online=False, print_summary=False) as tuner, \
            pytest.raises(RuntimeError, match="optimizer's step hook"):
        tuner.step()


def test_step_cost_is_measured_from_the_first_real_step():
    w = load_workload("cnn")
    x, y = w.make_batch(64)
    with edgetune.tune(w.model, w.optimizer, dataset=TensorDataset(x, y), batch_size=16, budget_w=15,
                       device="sim:orin-nano", online=False, print_summary=False) as tuner:
        for bx, by in tuner.loader:
            w.optimizer.zero_grad()
            w.loss_fn(w.model(bx), by).backward()
            w.optimizer.step()
    assert tuner.cost.flops_per_sample == pytest.approx(w.cost.flops_per_sample, rel=0.05)
    assert tuner.cost.param_bytes == w.cost.param_bytes
    assert tuner.cost.activation_bytes_per_sample == pytest.approx(w.cost.activation_bytes_per_sample, rel=0.25)
    assert tuner.cost.input_bytes_per_sample > 0


# ---------------------------------------------------------------------------------------------- the guard


def test_guard_keeps_the_budget_through_disturbances_and_budget_changes(cnn_cost):
    """Power offset step, thermal throttle on and off, budget 10 -> 7 -> 10 W: the 1-s moving average is
    over the budget only within 2 s of each event, and the guard does not oscillate."""
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=1)
    twin = dev.backend
    plan = Plan(64, {"gpu_freq": 408000000}, 10.0, "sim:orin-nano")
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost, keep_trace=True,
                       print_summary=False) as tuner:
        events = [(4.0, lambda: twin.set_power_offset(2.5)), (10.0, lambda: twin.set_power_offset(0.0)),
                  (16.0, lambda: twin.set_throttle(306e6)), (22.0, lambda: twin.set_throttle(None)),
                  (28.0, lambda: tuner.set_budget(7.0)), (34.0, lambda: tuner.set_budget(10.0))]
        train_until(tuner, model, opt, 40.0, events)
    times = [0.0] + [t for t, _ in events] + [40.0]
    for t0, t1 in itertools.pairwise(times):
        assert last_over(tuner, t0, t1) <= SETTLE_S, f"over budget more than {SETTLE_S} s after t={t0}"
    moves = [text for _, text in tuner.events if text.startswith("guard")]
    assert 2 <= len(moves) <= 16, moves
    assert any("trip" in m for m in moves) and any("climb" in m for m in moves)
    kinds = tuner.summary.guard_moves  # counted by the decisions' kinds, not from the event texts
    assert sum(kinds.values()) == len(moves) and kinds[GuardMove.TRIP] == sum(m.startswith("guard trip") for m in moves)
    assert tuner.summary.knobs_restored and dev.settings()["gpu_freq"] == 624750000
    # after the budget came back, the plan's setting is back in force
    assert tuner.setting["gpu_freq"] == 408000000


def test_a_budget_under_the_lowest_setting_shrinks_the_batch_and_a_higher_one_grows_it_back(cnn_cost):
    """Batch 128 at 408 MHz; the budget drops to 5.8 W, under what the lowest clocks draw at 128 (6.06 W) and
    64 (5.89 W): the guard halves the batch twice (32 draws 5.68 W), the learning rate follows the linear
    rule; back at 10 W it doubles twice and climbs to the plan's setting. No move more than that."""
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    plan = Plan(128, {"gpu_freq": 408000000}, 10.0, "sim:orin-nano")
    seen = []
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost, keep_trace=True,
                       print_summary=False) as tuner:
        def look():
            seen.append((tuner.batch_size, opt.param_groups[0]["lr"], dict(tuner.setting)))

        train_until(tuner, model, opt, 20.0, [(3.0, lambda: tuner.set_budget(5.8)), (10.0, look),
                                              (11.0, lambda: tuner.set_budget(10.0))])
    s = tuner.summary
    batch, lr, setting = seen[0]
    assert batch == 32 and lr == pytest.approx(0.05 * 32 / 128)
    # the lowest clocks, still in force at the smaller batch
    assert (setting["gpu_freq"], setting["emc_freq"], setting["cpu_freq"]) == (306000000, 204000000, 115200)
    assert last_over(tuner, 3.0, 11.0) <= 2.5  # a trip, two halvings, then the 1-s average under 5.8 W
    t, avg = np.array(tuner.accounting.trace_t), np.array(tuner.accounting.trace_avg)
    assert avg[(t > 6.0) & (t < 11.0)].max() < 5.8
    # one trip to the lowest clocks, two halvings, two doublings, one climb back: no oscillation
    assert s.guard_moves == {GuardMove.TRIP: 1, GuardMove.SHRINK_BATCH: 2, GuardMove.GROW_BATCH: 2, GuardMove.CLIMB: 1}
    moves = [text for _, text in tuner.events if text.startswith(("guard shrink", "guard grow"))]
    assert [m.split(": ")[0] for m in moves] == ["guard shrink batch"] * 2 + ["guard grow batch"] * 2
    assert moves[0].endswith("batch size 128 -> 64") and moves[-1].endswith("batch size 64 -> 128")
    assert any(text == "batch size 64 -> 32 (guard); learning rate 0.0125 (linear)" for _, text in tuner.events)
    # back where the plan put it: batch, learning rate, clocks
    assert s.batch_size == 128 and opt.param_groups[0]["lr"] == pytest.approx(0.05)
    assert tuner.setting["gpu_freq"] == 408000000 and tuner.setting["emc_freq"] == 2133000000
    assert "batch size halved 2x and doubled 2x" in s.table() and s.knobs_restored


def test_the_guard_leaves_the_batch_alone_without_the_loader_or_below_the_floor(cnn_cost):
    """Without tuner.loader the batches are the user's: the guard holds the lowest setting and reports. With
    batch_max_shrink=2 one halving is all it may make."""
    with edgetune.tune(None, None, batch_size=128, budget_w=5.8, device="sim:orin-nano", cost=cnn_cost,
                       online=False, print_summary=False) as tuner:
        while tuner.device.clock.now() < 4.0:
            tuner.step()
    assert tuner.batch_size == 128 and not tuner.summary.guard_moves.get(GuardMove.SHRINK_BATCH)
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=128, budget_w=5.8, device="sim:orin-nano",
                       cost=cnn_cost, online=False, guard=GuardParams(batch_max_shrink=2),
                       print_summary=False) as tuner:
        train_until(tuner, model, opt, 6.0)
    assert tuner.batch_size == 64 and tuner.summary.guard_moves[GuardMove.SHRINK_BATCH] == 1


def test_budget_file_and_sigusr1_are_followed(tmp_path, cnn_cost):
    model, opt, data = mlp()
    budget_file = tmp_path / "budget"
    budget_file.write_text("10\n")
    dev = open_device("sim:orin-nano", seed=2)
    plan = Plan(64, {"gpu_freq": 408000000}, 10.0, "sim:orin-nano")

    def battery_low():
        budget_file.write_text("7 W\n")

    def garbage():
        budget_file.write_text("lots\n")

    def sneaky_edit():
        # same mtime as before: only the signal makes the controller look again
        st = budget_file.stat()
        budget_file.write_text("8.5")
        os.utime(budget_file, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.kill(os.getpid(), signal.SIGUSR1)

    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost, budget_file=budget_file,
                       keep_trace=True, print_summary=False) as tuner:
        train_until(tuner, model, opt, 12.0, [(2.0, battery_low), (5.0, garbage), (8.0, sneaky_edit)])
    budgets = [text for _, text in tuner.events if text.startswith("budget")]
    assert any("budget 7 W (budget file" in b for b in budgets)
    assert any("cannot read 'lots' as watts" in b for b in budgets)
    assert any("budget 8.5 W (budget file" in b for b in budgets)
    assert last_over(tuner, 2.0, 8.0) <= SETTLE_S
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # the handler is gone after exit


def test_measure_only_changes_no_knob(cnn_cost):
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    # a board where we lack root: every knob reads, none writes (faked at the knob boundary); the guard's only
    # move is the batch size (test_with_no_knob_it_can_set_the_guard_holds_the_budget_by_the_batch_size_alone)
    dev.knobs = {name: Knob(k.name, k.unit, k.values, read=k.read, writable=False,
                            why_read_only="no write permission; run as root") for name, k in dev.knobs.items()}
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=256, budget_w=9.0, device=dev, cost=cnn_cost,
                       online=False, keep_trace=True, print_summary=False) as tuner:
        train_until(tuner, model, opt, 3.0)
    texts = " ".join(text for _, text in tuner.events)
    assert "measure-only" in texts and "run as root" in texts
    assert all("batch" in text for _, text in tuner.events if text.startswith("guard"))
    s = tuner.summary
    assert dev.settings() == before and not s.setting  # no knob written, none settable
    assert s.measure_only and s.violations and s.time_over_s > 0.5  # 256 at 624 MHz draws > 9 W: reported
    assert "measure-only" in s.table()


def test_a_model_elsewhere_than_the_gpu_measured_is_warned_about(tmp_path, monkeypatch, caplog, cnn_cost):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    model, opt, _ = mlp()  # on the CPU, where this machine's torch keeps it
    for device in ("sim:orin-nano", open_device("jetson", root=fake.root, detect_period_s=0)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="edgetune"), \
                edgetune.tune(model, opt, batch_size=8, budget_w=20, device=device, cost=cnn_cost, online=False,
                              guard=False, print_summary=False):
            pass
        if device == "sim:orin-nano":  # the twin models the step: where the model sits changes the loss only
            assert "the model is on the CPU" not in caplog.text
    assert ("the model is on the CPU, but jetson measures its GPU (cuda:0): move it there before tune() "
            "(model.to('cuda:0')), or the GPU's knobs change nothing in the training step") in caplog.text
    caplog.clear()
    elsewhere = torch.nn.Linear(4, 2, device="meta")  # another device than the one measured (no CUDA here)
    with caplog.at_level(logging.WARNING, logger="edgetune"), \
            edgetune.tune(elsewhere, None, batch_size=8, budget_w=20, device=device, cost=cnn_cost, online=False,
                          guard=False, print_summary=False):
        pass
    assert "the model is on meta, but jetson measures cuda:0: move it there before tune()" in caplog.text
    # a plan searched training on the board's GPU does not hold for a model trained on its CPU, nor the reverse;
    # older plans (no torch_device) and the twin's are applied without a word
    for searched, warned in (("cuda:0", True), ("cpu", False), (None, False)):
        caplog.clear()
        plan = write_plan(tmp_path, device="jetson", setting={}, **({"torch_device": searched} if searched else {}))
        with caplog.at_level(logging.WARNING, logger="edgetune"), \
                edgetune.tune(model, opt, device=device, plan=plan, cost=cnn_cost, guard=False, print_summary=False):
            pass
        assert (f"plan {plan} was measured training on cuda:0, and this model is on cpu: its power and speed do "
                f"not hold here; search again training where the model runs" in caplog.text) is warned
    device.close()


def test_a_plan_locks_a_clock_that_runs_at_its_value_by_chance(tmp_path, monkeypatch, cnn_cost):
    # a clock reads the frequency running now: the governor's 306 MHz reads as the plan's 306 MHz, and the plan's
    # clock was taken for applied while the governor kept moving it. It is locked; the knobs come back as found.
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    gpu = "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    assert (fake.root / gpu / "cur_freq").read_text().strip() == "306000000"  # running at the plan's value, unlocked
    before = fake.knob_state()
    device = open_device("jetson", root=fake.root, detect_period_s=0)
    model, opt, _ = mlp()
    plan = write_plan(tmp_path, device="jetson", setting={"gpu_freq": 306000000})
    with edgetune.tune(model, opt, device=device, plan=plan, cost=cnn_cost, guard=False,
                       print_summary=False) as tuner:
        assert fake.knob_state()[f"{gpu}/min_freq"] == fake.knob_state()[f"{gpu}/max_freq"] == "306000000\n"
        # the setting the guard climbs back to: the plan's, the CPU the plan left alone as its governor runs it
        # under load (1510.4 MHz), not the 883.2 MHz it read at rest
        assert tuner._guard.anchor["gpu_freq"] == 306000000 and tuner._guard.anchor["cpu_freq"] == 1510400
    assert fake.knob_state() == before and tuner.summary.knobs_restored
    device.close()


def test_online_tuning_on_a_board_leaves_clocks_it_does_not_explore_as_their_governor_runs_them(
        tmp_path, monkeypatch, cnn_cost):
    # the fake Orin Nano's CPU reads 883.2 MHz (its governor's choice at rest); online tuning explores the GPU
    # clock and batch size, and its candidates take the CPU at the top of its range, as under training load,
    # not locked at the reading
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    cpu0 = "sys/devices/system/cpu/cpufreq/policy0"
    assert (fake.root / cpu0 / "scaling_cur_freq").read_text() == "883200\n"
    device = open_device("jetson", root=fake.root, detect_period_s=0)
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=20, device=device, cost=cnn_cost,
                       guard=False, print_summary=False):
        files = fake.knob_state()
        assert files[f"{cpu0}/scaling_min_freq"] == files[f"{cpu0}/scaling_max_freq"] == "1510400\n"
    device.close()


def test_guard_can_be_switched_off(cnn_cost):
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=128, budget_w=9.0, device="sim:orin-nano",
                       cost=cnn_cost, online=False, guard=False, print_summary=False) as tuner:
        train_until(tuner, model, opt, 2.0)
    assert tuner.summary.violations and not any(t.startswith("guard") for _, t in tuner.events)


def test_guard_params_are_used(cnn_cost):
    model, opt, data = mlp()
    params = GuardParams(target_margin=0.15, up_margin=0.2)
    with edgetune.tune(model, opt, dataset=data, batch_size=128, budget_w=12.0, device="sim:orin-nano",
                       cost=cnn_cost, online=False, guard=params, keep_trace=True, print_summary=False) as tuner:
        train_until(tuner, model, opt, 4.0)
    a = tuner.accounting
    t, p = np.array(a.trace_t), np.array(a.trace_p)
    assert p[t > 2.0].mean() <= 12.0 * (1 - 0.15) + 0.2


# ---------------------------------------------------------------------------------------------- loader


def test_batch_size_changes_scale_the_learning_rate_and_keep_optimizer_state(cnn_cost):
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=15, device="sim:orin-nano",
                       online=False, cost=cnn_cost, lr_rule="linear", print_summary=False) as tuner:
        sizes, rates = [], []
        for i, (x, y) in enumerate(tuner.loader):
            sizes.append(len(x))
            rates.append(opt.param_groups[0]["lr"])
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if i == 2:
                momentum = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
                tuner.set_batch_size(128)
            if i == 5:
                tuner.set_batch_size(64, at="epoch")
        assert sizes[:3] == [32] * 3 and set(sizes[3:-1]) == {128}
        assert rates[:3] == [0.05] * 3 and rates[3] == pytest.approx(0.2)
        assert all(opt.state[p]["momentum_buffer"] is m for p, m in zip(model.parameters(), momentum))
        # seen once each within the epoch, whatever the batch size was
        assert sum(sizes) == len(data)
        x, _ = next(iter(tuner.loader))
        assert len(x) == 64 and opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert any("batch size 32 -> 128" in t for _, t in tuner.events)


def test_sqrt_rule(cnn_cost):
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=16, budget_w=15, device="sim:orin-nano",
                       online=False, cost=cnn_cost, lr_rule="sqrt", print_summary=False) as tuner:
        it = iter(tuner.loader)
        next(it)
        tuner.set_batch_size(64)
        next(it)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 2)


# ---------------------------------------------------------------------------------------------- online


def test_online_tuning_trains_while_it_explores_and_settles_under_the_budget():
    """A real CNN run: the controller changes batch size and GPU clock while the loss falls."""
    w = load_workload("cnn", seed=0)
    x, y = w.make_batch(512)
    data = TensorDataset(x, y)
    dev = open_device("sim:orin-nano", seed=0)
    losses = []
    options = {"batch_sizes": [8, 16, 32], "steps_per_candidate": 6, "warmup_steps": 2, "max_candidates": 5}
    with edgetune.tune(w.model, w.optimizer, dataset=data, batch_size=16, budget_w=9.0, device=dev,
                       online=options, keep_trace=True, print_summary=False) as tuner:
        train_epochs(tuner, w, 2, lambda loss: losses.append(loss.item()))
    online = tuner.online
    assert 3 <= len(online.measurements) <= 5 and online.chosen is not None
    # the exploration moved batch size and GPU clock
    assert len({m.candidate.batch_size for m in online.measurements}) >= 2
    assert len({m.candidate.knobs["gpu_freq"] for m in online.measurements}) >= 2
    texts = [t for _, t in tuner.events]
    assert any(t.startswith("online: settled") for t in texts)
    assert len({m.candidate for m in online.measurements}) == len(online.measurements)
    # every step trained: the steps accounted are the steps the loop ran
    assert tuner.summary.steps == len(losses)
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:10])
    chosen = online.chosen
    truth = dev.backend.expected(w.cost, chosen.candidate.batch_size, chosen.candidate.knobs)
    assert truth.power_w <= 9.0
    assert tuner.summary.time_over_s <= SETTLE_S  # a first candidate over budget, tripped at once
    assert online.b_noise is not None and online.b_noise > 0


def test_noise_scale_from_norms_recovers_a_known_noise_scale():
    from edgetune.runtime.online import noise_scale_from_norms

    rng = np.random.default_rng(0)
    g2, trace = 2.0, 400.0  # B_noise = 200
    norms = {b: list(g2 + trace / b + rng.normal(0, 0.05 * (g2 + trace / b), 50)) for b in (16, 64, 256)}
    est = noise_scale_from_norms(norms)
    assert est is not None and est[2] == pytest.approx(200, rel=0.15)
    assert noise_scale_from_norms({32: [1.0, 2.0]}) is None


# ---------------------------------------------------------------------------------------------- docs


def test_docstring_examples_run():
    from edgetune.runtime import api, batch_law, budget, guard

    for module in (api, batch_law, budget, guard):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0


def test_import_edgetune_stays_light():
    import subprocess
    import sys

    code = "import sys, edgetune; print('torch' in sys.modules); print(callable(edgetune.tune))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]



def test_a_run_without_online_tuning_never_imports_scikit_learn(tmp_path):
    """An edge CPU pays about a second and 70 MiB for scikit-learn and scipy: a run at a chosen setting (a
    batch-size change, a target, a runs file) needs neither, only online tuning's hardware model does."""
    import subprocess
    import sys

    code = f"""
import sys, torch, edgetune
m = torch.nn.Linear(4, 2); o = torch.optim.SGD(m.parameters(), 0.1)
ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
with edgetune.tune(m, o, dataset=ds, budget_w=8, device="sim:orin-nano", batch_size=8, online=False,
                   target=edgetune.Target("loss", 10.0, higher_is_better=False), runs_file={str(tmp_path / 'runs.csv')!r},
                   workload="toy", print_summary=False) as tuner:
    for x, y in tuner.loader:
        loss = torch.nn.functional.cross_entropy(m(x), y); o.zero_grad(); loss.backward(); o.step()
        tuner.report(float(loss))
        if tuner.steps == 2:
            tuner.set_batch_size(16)
print(tuner.batch_size, sorted(k for k in ("sklearn", "scipy", "optuna") if k in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[-2] == "16 []", out

# ---------------------------------------------------------------------------------------------- adapters


class _ToyData(torch.utils.data.Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _lightning_module(pl):
    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
            self.batch_size = 8
            self.losses = []

        def train_dataloader(self):
            return torch.utils.data.DataLoader(_ToyData(), batch_size=self.batch_size)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


def _fit_lightning(pl, tmp_path, cnn_cost, **trainer_options):
    from edgetune.runtime.adapters import LightningCallback

    torch.manual_seed(0)
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    callback = LightningCallback(budget_w=10.0, device=dev, plan=write_plan(tmp_path, batch_size=32),
                                 cost=cnn_cost, print_summary=False)
    module = _lightning_module(pl)
    trainer = pl.Trainer(max_epochs=2, callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=tmp_path, **trainer_options)
    trainer.fit(module)
    assert callback.summary.knobs_restored and dev.settings() == before
    return module, callback.summary


def test_lightning_callback_applies_the_plan_and_restores(tmp_path, cnn_cost):
    pl = pytest.importorskip("pytorch_lightning")
    module, s = _fit_lightning(pl, tmp_path, cnn_cost)
    assert module.batch_size == 32 and s.steps == 2 * 256 // 32 and len(s.epochs) == 2
    assert s.batch_size == 32 and s.samples == 2 * 256
    assert any(text.startswith("plan") and "gpu_freq=408 MHz" in text for _, text in s.events)
    assert np.mean(module.losses[-3:]) < np.mean(module.losses[:3])


def test_lightning_gradient_accumulation_is_accounted_per_optimizer_step(tmp_path, cnn_cost):
    pl = pytest.importorskip("pytorch_lightning")
    module, s = _fit_lightning(pl, tmp_path, cnn_cost, accumulate_grad_batches=2)
    # each optimizer step takes two batches of the plan's 32: 64 samples per step, every sample accounted
    assert module.batch_size == 32 and s.steps == 2 * 256 // 64 and s.samples == 2 * 256
    assert s.batch_size == 64 and any("not the plan's 32" in text for _, text in s.events)


@pytest.mark.parametrize("board", [True, False])
def test_processes_sharing_the_machine_are_accounted_by_what_the_sensor_measures(
        tmp_path, monkeypatch, cnn_cost, caplog, board):
    """Two DDP processes, local rank 0 tuning. A Jetson's rails measure both: each step counts both processes'
    samples (energy per sample is the board's over all it trained). The twin models this process's steps
    alone (as NVML measures one GPU): its own samples, and a warning that the others are not held."""
    from edgetune.runtime._adapter import _Adapter

    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    if board:
        fake = build_jetson(tmp_path / "root", "orin-nano")
        device = open_device("jetson", root=fake.root, detect_period_s=0)
    else:
        device = open_device("sim:orin-nano", seed=0)
    model, opt, data = mlp()
    adapter = _Adapter(budget_w=20.0, device=device, cost=cnn_cost, guard=False, print_summary=False)
    with caplog.at_level("WARNING", logger="edgetune"):
        adapter._start(model, opt, 32, processes=2)
    for k in range(4):
        x = data.tensors[0][32 * k:32 * (k + 1)]
        adapter._count((x, data.tensors[1][32 * k:32 * (k + 1)]))
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    adapter._stop()
    device.close()
    s = adapter.summary
    warned = [r.getMessage() for r in caplog.records if "training processes" in r.getMessage()]
    assert s.steps == 4 and s.samples == (2 if board else 1) * 4 * 32
    assert any("2 training processes share this machine" in text for _, text in s.events) == board
    assert bool(warned) != board and all("not held to the 20-W budget by this tuner" in w for w in warned)


def test_a_process_tuning_its_own_gpu_keeps_to_its_own_files(tmp_path, cnn_cost):
    """Local rank 1 of a DDP run tuning the GPU it trains on (``device="nvml"``; the twin stands in for the
    GPU here): its step log gets the rank in its name, and only local rank 0 records the run."""
    from edgetune.runtime._adapter import _Adapter

    model, opt, data = mlp()
    log, runs = tmp_path / "steps.csv", tmp_path / "runs.csv"
    adapter = _Adapter(budget_w=20.0, device="sim:orin-nano", cost=cnn_cost, guard=False, print_summary=False,
                       log=log, runs_file=runs, target=edgetune.Target("accuracy", 0.99), workload="mlp")
    adapter._start(model, opt, 32, processes=2, local_rank=1)
    for k in range(2):
        adapter._count((data.tensors[0][32 * k:32 * (k + 1)], data.tensors[1][32 * k:32 * (k + 1)]))
        loss = model(data.tensors[0][32 * k:32 * (k + 1)]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    adapter._stop()
    assert adapter.summary.steps == 2 and adapter.summary.samples == 64  # its own GPU's, its own samples
    assert (tmp_path / "steps.rank1.csv").is_file() and not log.exists() and not runs.exists()


def test_hf_trainer_callback_applies_the_plan_and_restores(tmp_path, cnn_cost, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    from edgetune.runtime.adapters import HFTrainerCallback

    torch.manual_seed(0)
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    callback = HFTrainerCallback(budget_w=10.0, device=dev, plan=write_plan(tmp_path, batch_size=32),
                                 cost=cnn_cost, print_summary=False)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), num_train_epochs=2,
                                          per_device_train_batch_size=16, learning_rate=0.05, report_to=[],
                                          save_strategy="no", logging_strategy="no", use_cpu=True,
                                          disable_tqdm=True)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    data = _ToyData()
    trainer = transformers.Trainer(model=LabelledClassifier(net), args=args, train_dataset=DictData(data.x, data.y),
                                   callbacks=[callback])
    with caplog.at_level("WARNING", logger="edgetune"):
        trainer.train()
    s = callback.summary
    # the Trainer fixed its batch size when built: the run's own is accounted, the difference reported, and a
    # warning names the argument that sets it (before: an info event alone)
    assert s.steps == 2 * 256 // 16 and s.samples == 2 * 256 and len(s.epochs) == 2
    assert any("not the plan's 32" in text for _, text in s.events)
    assert any("the plan's batch size 32 is not applied, the Trainer's 16 per batch trains" in r.getMessage()
               and "per_device_train_batch_size=plan.batch_size" in r.getMessage() for r in caplog.records)
    assert any(text.startswith("plan") and "gpu_freq=408 MHz" in text for _, text in s.events)
    assert s.knobs_restored and dev.settings() == before


def test_between_steps_leaves_an_evaluation_out_of_the_steps(cnn_cost):
    """An evaluation taking 2 s of device time between steps 2 and 3: outside the block it is charged to
    step 3 (what every step was before); inside it, to no step. The twin's clock moves only where told, so
    the figures are exact."""

    def run(block: bool):
        model, opt, _ = mlp()
        with edgetune.tune(model, opt, batch_size=32, budget_w=15, device="sim:orin-nano", online=False,
                           cost=cnn_cost, print_summary=False) as tuner:
            for k in range(4):
                if k == 2:
                    with tuner.between_steps() if block else contextlib.nullcontext():
                        tuner.device.clock.sleep(2.0)  # the evaluation
                loss = model(torch.randn(32, 16)).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        return tuner.accounting.steps, tuner.summary

    charged, left_out = run(False), run(True)
    assert charged[0][2].time_s == pytest.approx(2.0 + charged[0][1].time_s, abs=1e-3)
    assert left_out[0][2].time_s == pytest.approx(left_out[0][1].time_s, abs=1e-3)
    assert left_out[1].steps == 4 and left_out[1].time_s == pytest.approx(charged[1].time_s - 2.0, abs=1e-3)
    assert left_out[1].energy_j < charged[1].energy_j - 2.0 * 3.0  # the board draws watts while it evaluates


def test_online_tuning_measures_the_steps_and_not_the_evaluations_between_them():
    """An evaluation of 0.3 s of device time every 4 steps, inside between_steps: each candidate's window
    pauses there, so its step time and power are the steps' own (before: ten times the step time)."""
    cnn = load_workload("cnn", seed=0)
    x, y = cnn.make_batch(512)
    dev = open_device("sim:orin-nano", seed=0)
    options = {"batch_sizes": [8, 16, 32], "steps_per_candidate": 6, "warmup_steps": 2, "max_candidates": 4}

    def evaluate(_loss):
        if tuner.steps % 4 == 0:
            with tuner.between_steps():
                dev.clock.sleep(0.3)  # the evaluation

    with edgetune.tune(cnn.model, cnn.optimizer, dataset=TensorDataset(x, y), batch_size=16, budget_w=9.0,
                       device=dev, online=options, print_summary=False) as tuner:
        train_epochs(tuner, cnn, 2, evaluate)
    measured = tuner.online.measurements
    assert len(measured) == 3 and tuner.online.chosen is not None
    for m in measured:  # the twin's truth, for scoring only
        truth = dev.backend.expected(cnn.cost, m.candidate.batch_size, m.candidate.knobs)
        assert m.step_time_s == pytest.approx(truth.step_time_s, rel=0.05)
        assert m.power_w == pytest.approx(truth.power_w, abs=0.4)


def test_an_evaluation_before_the_first_step_is_not_measured_as_its_cost():
    costs = []
    for evaluate in (False, True):
        model, opt, data = mlp()
        with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=15, device="sim:orin-nano",
                           online=False, print_summary=False) as tuner:
            if evaluate:
                with tuner.between_steps(), torch.no_grad():  # a baseline evaluation of 1024 samples
                    model(torch.randn(1024, 16))
            for k, (x, y) in enumerate(tuner.loader):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if k == 2:
                    break
        costs.append(tuner.cost)
    assert costs[1] == costs[0]


def test_a_compiled_model_compiles_after_the_twin_measured_its_cost():
    """The cost meter's FLOP counter makes torch.compile skip the frames it meets for good: the run must
    compile them afresh once the first step's cost is measured (before: eager for the whole run)."""
    from torch._dynamo.utils import counters

    model, opt, data = mlp()
    compiled = torch.compile(model, backend="eager")
    counters.clear()
    with edgetune.tune(compiled, opt, dataset=data, batch_size=256, budget_w=15, device="sim:orin-nano",
                       online=False, print_summary=False) as tuner:
        for x, y in tuner.loader:
            torch.nn.functional.cross_entropy(compiled(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert tuner.cost is not None and tuner.cost.flops_per_sample > 0
    assert counters["stats"]["unique_graphs"] >= 1
    torch.compiler.reset()


def test_count_samples_accounts_what_each_step_trained_on(cnn_cost):
    model, opt, _ = mlp()
    with edgetune.tune(model, opt, batch_size=32, budget_w=15, device="sim:orin-nano", online=False,
                       cost=cnn_cost, print_summary=False) as tuner:
        for samples in (32, 32, 20):  # an epoch's smaller last batch
            tuner.count_samples(samples)
            opt.step()
        opt.step()  # none counted: the batch size in force
    steps = tuner.accounting.steps
    assert [(r.batch_size, r.samples) for r in steps] == [(32, 32), (32, 32), (32, 20), (32, 32)]
    assert tuner.summary.samples == 116
    assert steps[2].time_s < steps[1].time_s  # the twin times the step it trained


def test_the_loaders_smaller_last_batch_is_accounted_at_its_samples(cnn_cost):
    model, opt, _ = mlp()
    data = TensorDataset(torch.randn(100, 16), torch.randint(0, 4, (100,)))
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=15, device="sim:orin-nano", online=False,
                       cost=cnn_cost, print_summary=False) as tuner:
        for x, y in tuner.loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [(r.batch_size, r.samples) for r in tuner.accounting.steps] == [(32, 32)] * 3 + [(32, 4)]
    assert tuner.summary.samples == tuner.summary.epochs[0].samples == 100


def _warmup(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4))


def _train_lrs(tuner, model, opt, scheduler, halve_at=None):
    lrs = []
    for k, (x, y) in enumerate(tuner.loader):
        if k == halve_at:
            tuner.set_batch_size(16)
        lrs.append(round(opt.param_groups[0]["lr"], 6))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        scheduler.step()
    return lrs


def test_schedulers_given_keep_every_scaling_of_the_learning_rate(cnn_cost, caplog):
    """0.1 was set for batch 128; the run starts at 32 (linear: 0.025), with a 4-step warm-up LambdaLR, which
    computes each rate from its base_lrs: those are scaled too, at the start and at a batch-size change."""
    model, opt, _ = mlp()
    opt.param_groups[0]["lr"] = 0.1
    data = TensorDataset(torch.randn(6 * 32, 16), torch.randint(0, 4, (6 * 32,)))
    sched = _warmup(opt)  # created before tune(), as in most scripts
    with edgetune.tune(model, opt, dataset=data, batch_size=32, lr_batch_size=128, schedulers=[sched], budget_w=15,
                       device="sim:orin-nano", online=False, cost=cnn_cost, print_summary=False) as tuner:
        lrs = _train_lrs(tuner, model, opt, sched)
    assert lrs == pytest.approx([0.00625, 0.0125, 0.01875, 0.025, 0.025, 0.025])
    # one created inside the block, then the batch halves: the warm-up's rates follow the halving
    model, opt, _ = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=15, device="sim:orin-nano", online=False,
                       cost=cnn_cost, print_summary=False) as tuner:
        sched = _warmup(opt)
        tuner.add_scheduler(sched)
        lrs = _train_lrs(tuner, model, opt, sched, halve_at=2)
    # mlp's 0.05 warming up; batch 16 arrives at the fourth batch drawn, halving the rate from there on
    assert lrs == pytest.approx([0.0125, 0.025, 0.0375] + [0.025] * 6)
    assert "scheduler" not in caplog.text


def test_a_run_records_the_rate_its_scheduler_computes_from(tmp_path, cnn_cost):
    from edgetune.predictors.convergence import read_convergence_rows

    model, opt, data = mlp()  # lr 0.05, annealed to zero over the run
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 8)
    runs = tmp_path / "runs.csv"
    with edgetune.tune(model, opt, dataset=TensorDataset(data.tensors[0][:256], data.tensors[1][:256]), batch_size=32,
                       schedulers=[sched], budget_w=15, device="sim:orin-nano", online=False, cost=cnn_cost,
                       print_summary=False, target=edgetune.Target("accuracy", 0.5), runs_file=runs,
                       workload="mlp") as tuner:
        for x, y in tuner.loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            with tuner.between_steps():
                tuner.report(1.0 if tuner.steps >= 6 else 0.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)
    (row,) = read_convergence_rows(runs)
    assert row.lr == pytest.approx(0.05) and row.batch_size == 32
    with pytest.raises(RuntimeError, match=r"tuner.report\(\) after the with block: the run and its summary"):
        tuner.report(1.0)  # it would reach no summary and no runs file


def test_a_scheduler_not_given_is_named_when_edgetune_scales_the_rate(cnn_cost, caplog):
    model, opt, data = mlp()
    _warmup(opt)
    with caplog.at_level("WARNING"), edgetune.tune(model, opt, dataset=data, batch_size=32, lr_batch_size=128,
                                                   budget_w=15, device="sim:orin-nano", online=False, cost=cnn_cost,
                                                   print_summary=False) as tuner:
        pass
    assert "the optimizer has a learning-rate scheduler edgetune was not given" in caplog.text
    assert any("tune(schedulers=[...])" in text for _, text in tuner.events)


def test_persistent_loader_workers_stop_with_the_run(cnn_cost):
    import multiprocessing

    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=256, budget_w=15, device="sim:orin-nano", online=False,
                       cost=cnn_cost, print_summary=False,
                       loader_options={"num_workers": 1, "persistent_workers": True}) as tuner:
        for _ in range(2):
            for x, y in tuner.loader:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        assert multiprocessing.active_children()  # kept between the epochs
    assert not multiprocessing.active_children() and tuner.summary.samples == 2 * 2048


def test_batch_samples_is_the_leading_dimension_the_batchs_tensors_agree_on():
    from edgetune.runtime.adapters import batch_samples

    x = torch.zeros(7, 3)
    assert batch_samples(x) == 7 and batch_samples((x, torch.zeros(7))) == 7
    assert batch_samples({"input_ids": torch.zeros(5, 12), "labels": torch.zeros(5)}) == 5
    assert batch_samples([torch.zeros(5, 12), torch.zeros(5, 12)]) == 5  # a forward's arguments, flattened
    # pad_sequence's (T, B) beside (B,) labels, per-image tuples of a detection batch, text: not known
    assert batch_samples((torch.zeros(50, 4), torch.zeros(4))) is None
    assert batch_samples(((torch.zeros(3, 8, 8), torch.zeros(3, 8, 8)), ({"boxes": x}, {"boxes": x}))) is None
    assert batch_samples(["text"]) is None and batch_samples(torch.tensor(1.0)) is None


def test_gradient_accumulation_in_a_plain_loop_times_each_micro_batch(cnn_cost):
    """Four batches of 32 per optimizer step: the twin times four steps of 32 (not one of 128, which need
    not fit), and a run recorded to the target is at the batch an optimizer step trains on."""
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=15, device="sim:orin-nano", online=False,
                       cost=cnn_cost, print_summary=False) as tuner:
        for k, (x, y) in enumerate(tuner.loader):
            (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
            if k % 4 == 3:
                opt.step()
                opt.zero_grad()
            if k == 15:
                break
    steps = tuner.accounting.steps
    assert [(r.batch_size, r.samples) for r in steps] == [(32, 128)] * 4
    twin = open_device("sim:orin-nano", seed=0).backend
    one = twin.expected(cnn_cost, 32, dict(tuner.setting)).step_time_s
    assert steps[1].time_s == pytest.approx(4 * one, rel=0.15)  # four micro-batches' time, the twin's jitter aside


class _SizedModule:
    """A Lightning module without a batch_size attribute: its batch size lives in the loader given to fit()."""

    @staticmethod
    def build(pl, dev=None, *, scheduler=False, validate_s=0.0):
        class Module(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
                self.seen, self.lrs = 0, []

            def training_step(self, batch, _):
                self.seen += len(batch[0])
                self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
                return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

            def validation_step(self, batch, _):
                dev.clock.sleep(validate_s)  # a validation pass taking device time
                self.log("val_loss", torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

            def configure_optimizers(self):
                opt = torch.optim.SGD(self.parameters(), lr=0.05)
                if not scheduler:
                    return opt
                return [opt], [{"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0),
                                "interval": "step"}]

        return Module()


def _fit(pl, tmp_path, module, dev, loaders, *, callback_options=(), callbacks_after=(), **trainer_options):
    from edgetune.runtime.adapters import LightningCallback

    before = dev.settings()
    callback = LightningCallback(budget_w=10.0, device=dev, plan=write_plan(tmp_path, batch_size=32),
                                 print_summary=False, **dict(callback_options))
    trainer = pl.Trainer(callbacks=[callback, *callbacks_after], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path,
                         **{"max_epochs": 1, **trainer_options})
    trainer.fit(module, *loaders)
    assert callback.summary.knobs_restored and dev.settings() == before
    return callback.summary


def test_lightning_accounts_the_loaders_batch_size_and_an_epochs_smaller_last_batch(tmp_path, cnn_cost):
    pl = pytest.importorskip("pytorch_lightning")
    dev = open_device("sim:orin-nano", seed=0)
    torch.manual_seed(0)
    module = _SizedModule.build(pl, dev)
    loader = torch.utils.data.DataLoader(_ToyData(250), batch_size=16)  # 15 batches of 16 and one of 10
    s = _fit(pl, tmp_path, module, dev, [loader], callback_options={"cost": cnn_cost})
    assert s.batch_size == 16 and s.steps == 16 and s.samples == module.seen == 250
    assert any("batch size 16 is in force, not the plan's 32" in text for _, text in s.events)


def test_lightning_sets_the_plans_batch_size_where_a_datamodule_keeps_it_as_a_hyperparameter(tmp_path, cnn_cost):
    """Lightning's documented pattern, ``save_hyperparameters()`` and ``self.hparams.batch_size`` in
    ``train_dataloader``: the plan's batch size reaches the loader (before: 8 trained, and only an info event
    said so)."""
    pl = pytest.importorskip("pytorch_lightning")

    class Data(pl.LightningDataModule):
        def __init__(self, batch_size=8):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return torch.utils.data.DataLoader(_ToyData(256), batch_size=self.hparams.batch_size)

    dev = open_device("sim:orin-nano", seed=0)
    module = _SizedModule.build(pl, dev)
    from edgetune.runtime.adapters import LightningCallback

    callback = LightningCallback(budget_w=10.0, device=dev, plan=write_plan(tmp_path, batch_size=32), cost=cnn_cost,
                                 print_summary=False)
    trainer = pl.Trainer(callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path, max_epochs=1)
    trainer.fit(module, datamodule=Data())
    s = callback.summary
    assert s.batch_size == 32 and s.steps == 256 // 32 and s.samples == module.seen == 256


def test_lightning_warns_where_the_plans_batch_size_cannot_be_set(tmp_path, cnn_cost, caplog):
    pl = pytest.importorskip("pytorch_lightning")
    dev = open_device("sim:orin-nano", seed=0)
    loader = torch.utils.data.DataLoader(_ToyData(64), batch_size=16)  # given to fit(): no attribute to set
    with caplog.at_level("WARNING", logger="edgetune"):
        s = _fit(pl, tmp_path, _SizedModule.build(pl, dev), dev, [loader], callback_options={"cost": cnn_cost})
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert s.batch_size == 16 and any("the plan's batch size 32 is not applied, the loader's 16 trains" in w
                                      and "save_hyperparameters()" in w for w in warned), warned


def test_lightning_measures_the_steps_input_as_input_not_activations(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    dev = open_device("sim:orin-nano", seed=0)
    module = _SizedModule.build(pl, dev)
    tuners = []

    class Grab(pl.Callback):
        def on_train_batch_end(self, trainer, *_):
            tuners.append(trainer.callbacks[0].tuner)

    loader = torch.utils.data.DataLoader(_ToyData(256), batch_size=32)
    _fit(pl, tmp_path, module, dev, [loader], accumulate_grad_batches=2, callbacks_after=[Grab()])
    cost = tuners[-1].cost  # measured from the first step: two batches of 32 x (16 float32 + an int64 label)
    assert cost.input_bytes_per_sample == 16 * 4 + 8
    assert cost.activation_bytes_per_sample < 3 * (32 + 32 + 2) * 4  # the layers' outputs, not the inputs


def test_lightning_accumulation_cut_short_at_an_epochs_end_counts_its_batches(tmp_path, cnn_cost):
    pl = pytest.importorskip("pytorch_lightning")
    dev = open_device("sim:orin-nano", seed=0)
    module = _SizedModule.build(pl, dev)
    loader = torch.utils.data.DataLoader(_ToyData(256), batch_size=32)  # 8 batches: steps of 3, 3 and 2
    s = _fit(pl, tmp_path, module, dev, [loader], callback_options={"cost": cnn_cost}, max_epochs=2,
             accumulate_grad_batches=3)
    assert s.steps == 6 and s.samples == module.seen == 512 and [e.samples for e in s.epochs] == [256, 256]


@pytest.mark.parametrize("scheduler_first", [False, True])
def test_lightning_accumulation_scheduled_per_epoch_is_read_for_the_epoch_it_runs(tmp_path, cnn_cost, scheduler_first):
    """A GradientAccumulationScheduler after edgetune's callback sets the accumulation in an epoch-start hook that
    runs after edgetune's: each step's batch size is still the epoch's own (before: one epoch late, 32 where 64
    trained and 64 where 32 did)."""
    import csv

    pl = pytest.importorskip("pytorch_lightning")
    from pytorch_lightning.callbacks import GradientAccumulationScheduler

    from edgetune.runtime.adapters import LightningCallback

    dev = open_device("sim:orin-nano", seed=0)
    module = _SizedModule.build(pl, dev)
    log = tmp_path / "steps.csv"
    callback = LightningCallback(budget_w=10.0, device=dev, cost=cnn_cost, log=log, print_summary=False)
    schedule = GradientAccumulationScheduler({0: 2, 1: 1})
    trainer = pl.Trainer(callbacks=[schedule, callback] if scheduler_first else [callback, schedule], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", default_root_dir=tmp_path, max_epochs=2)
    trainer.fit(module, torch.utils.data.DataLoader(_ToyData(256), batch_size=32))
    with open(log, newline="") as fh:
        rows = [(int(r["epoch"]), int(r["batch_size"]), int(r["samples"])) for r in csv.DictReader(fh)]
    assert rows == [(0, 64, 64)] * 4 + [(1, 32, 32)] * 8 and callback.summary.batch_size == 32


def test_lightning_validation_is_no_training_step(tmp_path, cnn_cost):
    pl = pytest.importorskip("pytorch_lightning")
    dev = open_device("sim:orin-nano", seed=0)
    module = _SizedModule.build(pl, dev, validate_s=2.0)
    train = torch.utils.data.DataLoader(_ToyData(256), batch_size=32)
    val = torch.utils.data.DataLoader(_ToyData(64), batch_size=64)
    s = _fit(pl, tmp_path, module, dev, [train, val], callback_options={"cost": cnn_cost}, val_check_interval=4,
             num_sanity_val_steps=0)
    # two validations of 2 s of device time each, after steps 4 and 8: in no step
    assert s.steps == 8 and s.time_s < 1.0


def test_lightning_schedulers_keep_the_learning_rate_scaled_for_the_batch_size(tmp_path, cnn_cost):
    pl = pytest.importorskip("pytorch_lightning")
    dev = open_device("sim:orin-nano", seed=0)
    module = _SizedModule.build(pl, dev, scheduler=True)
    loader = torch.utils.data.DataLoader(_ToyData(256), batch_size=32)
    s = _fit(pl, tmp_path, module, dev, [loader], callback_options={"cost": cnn_cost, "lr_batch_size": 16},
             max_steps=4)
    # 0.05 set for batch 16, scaled linearly to the loader's 32; the scheduler recomputes it from base_lrs
    assert module.lrs == pytest.approx([0.1] * 4)
    assert any("scaled to batch size 32" in text for _, text in s.events)


def test_lightning_leaves_another_optimizers_scheduler_alone(tmp_path, cnn_cost):
    """Two optimizers (a GAN's, manual optimization), each with a scheduler: lr_batch_size scales the tuned
    (first) optimizer's rate; the second's scheduler is not handed to the tuner, so its rate stays as set (before:
    its base rate was doubled too, and its next step trained the second optimizer at 0.02)."""
    pl = pytest.importorskip("pytorch_lightning")
    from edgetune.runtime.adapters import LightningCallback

    class Gan(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.g, self.d = torch.nn.Linear(16, 2), torch.nn.Linear(16, 2)
            self.automatic_optimization = False
            self.lrs = []

        def training_step(self, batch, _):
            for opt, net, sched in zip(self.optimizers(), (self.g, self.d), self.lr_schedulers()):
                opt.zero_grad()
                self.manual_backward(torch.nn.functional.cross_entropy(net(batch[0]), batch[1]))
                opt.step()
                sched.step()
            self.lrs.append([opt.param_groups[0]["lr"] for opt in self.optimizers()])

        def configure_optimizers(self):
            opts = [torch.optim.SGD(self.g.parameters(), lr=0.05), torch.optim.SGD(self.d.parameters(), lr=0.01)]
            return opts, [torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0) for opt in opts]

    dev = open_device("sim:orin-nano", seed=0)
    module = Gan()
    callback = LightningCallback(budget_w=10.0, device=dev, plan=write_plan(tmp_path, batch_size=32), cost=cnn_cost,
                                 lr_batch_size=16, print_summary=False)
    trainer = pl.Trainer(callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu", default_root_dir=tmp_path, max_epochs=1)
    trainer.fit(module, torch.utils.data.DataLoader(_ToyData(128), batch_size=32))
    assert np.allclose(module.lrs, [[0.1, 0.01]] * 4) and callback.summary.steps == 4, module.lrs


def test_a_run_resumed_from_a_checkpoint_is_tuned_but_not_recorded(tmp_path, cnn_cost, caplog):
    from edgetune.runtime._adapter import _Adapter

    model, opt, _ = mlp()
    runs = tmp_path / "runs.csv"
    adapter = _Adapter(budget_w=10.0, device="sim:orin-nano", plan=write_plan(tmp_path, batch_size=32),
                       cost=cnn_cost, print_summary=False, target=edgetune.Target("acc", 0.5), runs_file=runs)
    with caplog.at_level("WARNING"):
        adapter._start(model, opt, 32, resumed_at=6)
    assert "starts at step 6 (resumed from a checkpoint, or a second fit of one Trainer)" in caplog.text and "not recorded in" in caplog.text
    for value in (0.2, 0.6):
        opt.step()
        adapter.tuner.report(value)
    adapter._stop()
    assert adapter.summary.steps == 2 and not runs.exists()
    assert any("started at step 6 (resumed from a checkpoint" in text for _, text in adapter.summary.events)


def _hf_trainer(transformers, tmp_path, model, callback, **args):
    options = {"output_dir": str(tmp_path / "hf"), "num_train_epochs": 1, "per_device_train_batch_size": 16,
               "learning_rate": 0.05, "report_to": [], "save_strategy": "no", "logging_strategy": "no",
               "use_cpu": True, "disable_tqdm": True, **args}
    data = _ToyData()
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**options),
                                train_dataset=DictData(data.x, data.y), eval_dataset=DictData(data.x, data.y),
                                callbacks=[callback])


def test_hf_evaluation_before_the_first_step_is_not_measured_as_one(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from edgetune.runtime.adapters import HFTrainerCallback

    costs = []
    for eval_on_start in (False, True):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        callback = HFTrainerCallback(budget_w=10.0, device="sim:orin-nano", plan=write_plan(tmp_path, batch_size=16),
                                     print_summary=False)
        _hf_trainer(transformers, tmp_path, LabelledClassifier(net), callback, eval_on_start=eval_on_start,
                    max_steps=4).train()
        costs.append(callback.summary)
    # the step's cost is measured from the first training step, not from the evaluation the Trainer runs first
    assert costs[0].steps == costs[1].steps == 4
    assert costs[1].time_s == pytest.approx(costs[0].time_s, rel=1e-6)


def test_hf_train_again_after_an_exception_closes_the_first_tuner(tmp_path, cnn_cost):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from edgetune.runtime.adapters import HFTrainerCallback

    calls = {"n": 0}

    class Failing(LabelledClassifier):
        def forward(self, x, labels=None):
            calls["n"] += self.training
            if self.training and calls["n"] == 3:
                raise RuntimeError("CUDA out of memory (simulated)")
            return super().forward(x, labels)

    torch.manual_seed(0)
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    callback = HFTrainerCallback(budget_w=10.0, device=dev, plan=write_plan(tmp_path, batch_size=16), cost=cnn_cost,
                                 print_summary=False)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    trainer = _hf_trainer(transformers, tmp_path, Failing(net), callback)
    with pytest.raises(RuntimeError, match="simulated"):
        trainer.train()
    first = callback.tuner
    assert first is not None and first._entered  # no hook for the exception: still open, knobs set
    trainer.train()  # again, as in a notebook
    assert not first._entered and not first._hook_handles and first.steps == 2
    assert callback.summary.steps == 256 // 16 and callback.summary.samples == 256
    assert callback.summary.knobs_restored and dev.settings() == before


def test_hf_auto_find_batch_size_cutting_the_plan_s_batch_is_counted_and_said_once(tmp_path, caplog):
    """``auto_find_batch_size`` cuts the batch by a tenth after each out-of-memory error and trains again. The
    callback took the arguments' batch size: the summary said 32 where 15 trained, and nothing said the plan did
    not fit."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from edgetune.runtime.adapters import HFTrainerCallback

    class Big(LabelledClassifier):  # a model that runs out of memory above 16 samples, as a GPU would say it
        def forward(self, x, labels=None):
            if self.training and len(x) > 16:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return super().forward(x, labels)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    callback = HFTrainerCallback(budget_w=10.0, device="sim:orin-nano", plan=write_plan(tmp_path, batch_size=32),
                                 print_summary=False)
    with caplog.at_level(logging.WARNING, logger="edgetune"):
        _hf_trainer(transformers, tmp_path, Big(net), callback, per_device_train_batch_size=32,
                    auto_find_batch_size=True, max_steps=4).train()
    summary = callback.summary
    assert summary.steps == 4 and summary.batch_size == 15 and summary.samples == 60  # 32, 28, 25, 22, 19, 17, 15
    said = [r.getMessage() for r in caplog.records if "auto_find_batch_size" in r.getMessage()]
    assert said == [("auto_find_batch_size cut the batch size to 15 after running out of memory at 32 (the plan's "
                    "32): the plan does not fit this run's memory; search again with the model as it trains here, "
                    "or with --batch-sizes at most 15")]


def test_a_process_that_does_not_tune_stops_at_the_target_with_the_one_that_does(tmp_path):
    """HF under torchrun: a process other than the machine's first trains without a tuner (one per board),
    but follows the target from the same evaluation metrics, so every process stops together."""
    transformers = pytest.importorskip("transformers")
    from edgetune.runtime.adapters import HFTrainerCallback

    callback = HFTrainerCallback(budget_w=10.0, device="sim:orin-nano", plan=write_plan(tmp_path, batch_size=16),
                                 print_summary=False, target=edgetune.Target("accuracy", 0.9))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to=[], use_cpu=True)
    state = transformers.TrainerState(is_local_process_zero=False)
    control = transformers.TrainerControl()
    model, opt, _ = mlp()
    callback.on_train_begin(args, state, control, model=model, optimizer=opt)
    callback.on_step_begin(args, state, control)
    assert callback.tuner is None  # the board is the first process's to tune
    for step, accuracy in ((4, 0.5), (8, 0.95)):
        state.global_step = step
        callback.on_evaluate(args, state, control, metrics={"eval_accuracy": accuracy})
        assert control.should_training_stop is (accuracy > 0.9)
    callback.on_train_end(args, state, control)
    assert callback.summary is None


def test_adapters_refuse_online_tuning():
    from edgetune.runtime._adapter import _Adapter

    with pytest.raises(ValueError, match="online tuning needs edgetune's loader"):
        _Adapter(budget_w=10, online=True)


def test_an_epoch_left_early_is_still_accounted(cnn_cost):
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=256, budget_w=15, device="sim:orin-nano",
                       online=False, cost=cnn_cost, print_summary=False) as tuner:
        for epoch in range(3):
            for i, (x, y) in enumerate(tuner.loader):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                if epoch == 1 and i == 2:
                    break
    s = tuner.summary
    assert [e.steps for e in s.epochs] == [8, 3, 8] and sum(e.steps for e in s.epochs) == s.steps


# ---------------------------------------------------------------------------------------------- the pieces alone


def test_budget_source_follows_the_api_the_file_and_the_signal(tmp_path):
    from edgetune.runtime.budget import BudgetSource, parse_watts

    assert parse_watts(" 7.5 W\n") == 7.5 and parse_watts("12") == 12.0
    for bad in ("lots", "0", "-3 W", "inf", "nan"):
        with pytest.raises(ValueError):
            parse_watts(bad)
    path = tmp_path / "budget"
    src = BudgetSource(10.0, path)
    src.restart(1.0)
    assert src.poll() is None  # not written yet: the starting budget holds
    assert src.set(3.0, 7.0) and not src.set(4.0, 7.0)  # the same budget again is no change
    assert (src.at(0.5), src.at(2.0), src.at(3.0), src.current_w) == (10.0, 10.0, 7.0, 7.0)
    times = np.array([0.5, 2.0, 3.0, 9.0])
    assert src.at_times(times).tolist() == [src.at(float(x)) for x in times]  # the same, vectorised
    with pytest.raises(ValueError, match="budget must be a positive number of watts"):
        src.set(5.0, float("nan"))
    path.write_text("8.5 W\n")
    reading = src.poll()
    assert reading is not None and reading.watts == 8.5 and src.poll() is None  # read once per change
    path.write_text("lots of watts")
    st = path.stat()
    bad = src.poll()
    assert bad is not None and bad.watts is None
    assert bad.problem(7.0) == (f"budget file {path}: cannot read 'lots of watts' as watts; write a number such "
                                f"as 7.5 (the budget stays 7 W)")
    # an edit that keeps the modification time is seen only after SIGUSR1
    path.write_text("6")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert src.poll() is None
    before = signal.getsignal(signal.SIGUSR1)
    src.watch()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        again = src.poll()
        assert again is not None and again.watts == 6.0
    finally:
        src.unwatch()
    assert signal.getsignal(signal.SIGUSR1) == before


def test_ticker_follows_a_virtual_clock_and_runs_a_thread_on_a_real_one():
    from edgetune.power.base import RealClock, VirtualClock
    from edgetune.runtime.ticker import Ticker

    clock, calls = VirtualClock(), []
    ticker = Ticker(clock, 0.05, lambda: calls.append(clock.now()))
    assert ticker.virtual and ticker.thread is None
    clock.advance(1.0)
    assert calls == pytest.approx([0.05 * k for k in range(1, 21)])
    ticker.stop()
    clock.advance(1.0)
    assert len(calls) == 20
    real = Ticker(RealClock(), 60.0, lambda: None)  # a period no test waits for: only the thread is checked
    thread = real.thread
    assert not real.virtual and thread is not None and thread.daemon and thread.is_alive()
    real.stop()
    assert real.thread is None and not thread.is_alive()


def test_one_ticker_thread_samples_and_ticks_and_a_failing_tick_does_not_stop_the_samples():
    import threading

    from edgetune.power.base import RealClock, VirtualClock
    from edgetune.runtime.ticker import Ticker

    clock, calls = VirtualClock(), []
    ticker = Ticker(clock, 0.05, lambda: calls.append(("tick", clock.now())),
                    sample=lambda: calls.append(("sample", clock.now())), sample_period_s=0.01)
    clock.advance(0.1)
    assert [c[0] for c in calls].count("sample") == 10 and [c for c in calls if c[0] == "tick"] == \
        [("tick", pytest.approx(0.05)), ("tick", pytest.approx(0.1))]
    ticker.stop()
    samples, ticks = [], []
    done = threading.Event()

    def sample():
        samples.append(threading.get_ident())
        if len(samples) >= 20:
            done.set()

    def tick():
        ticks.append(threading.get_ident())
        raise RuntimeError("a bug in the tick")

    real = Ticker(RealClock(), 0.002, tick, sample=sample, sample_period_s=0.001)
    try:
        assert done.wait(timeout=30.0)  # (a bound no run reaches: the test asserts that it happens, not when)
    finally:
        real.stop()
    assert ticks and len(set(samples + ticks)) == 1  # one thread did both, and sampled on after the ticks raised


def test_the_tap_queues_readings_and_keeps_the_monitors_rules():
    from edgetune.power import PowerReading
    from edgetune.runtime.accounting import SampleTap

    class Sensor:
        rails, total_label, update_period_s = ("VDD_IN",), "VDD_IN", 0.01

        def __init__(self):
            self.readings = [(0.0, 4.0), (0.1, 6.0), (0.1, 9.0), (0.2, float("nan")), (0.3, -1.0), (0.4, 6.0), None]

        def read(self):
            r = self.readings.pop(0)
            if r is None:
                raise OSError("sensor gone")
            return PowerReading(r[0], r[1], {})

        def energy_j(self):
            return None

    tap = SampleTap(Sensor(), keep_s=10.0)
    for _ in range(7):
        tap.sample()
    assert tap.dropped == 1  # the failed read, counted, not raised
    # a repeated time, a non-finite and a negative power are dropped (the monitor's rules); energy is exact
    assert tap.average(10.0) == pytest.approx((0.5 + 0.3 * 6.0) / 0.4) and tap.total_samples == 3
    t, p = tap.drain()
    assert t.tolist() == [0.0, 0.1, 0.4] and p.tolist() == [4.0, 6.0, 6.0] and tap.drain()[0].size == 0
    assert tap.averages(0.3, 10.0) == (pytest.approx(6.0), pytest.approx(2.3 / 0.4))


def test_an_epochs_figures_are_over_its_own_steps():
    """An epoch's mean, peak and max 1-s average over one set of samples: the sensor silent for 0.5 s across an
    epoch's start (a busy board), the next epoch shorter than a window, an evaluation hotter than the steps."""
    from edgetune.power import PowerReading

    def silent(t):
        return 1.0 < t < 1.5

    class Sensor:  # the hardware boundary: a scripted board power by device time
        rails, total_label, update_period_s = ("VDD_IN",), "VDD_IN", 0.1

        def __init__(self):
            self.t = 0.0

        def read(self):
            return PowerReading(self.t, 9.0 if self.t <= 1.0 else 12.0 if 4.0 < self.t < 4.5 else 7.0, {})

        def energy_j(self):
            return None

    sensor = Sensor()
    tap, acc = _scripted_accounting(sensor)
    epoch = 0
    # (time, what): a sample every 0.1 s; steps; an epoch's end takes a sample (the controller's), which the
    # silent sensor answers only at 1.5; a gap (an evaluation) from 4.0 to 4.5
    samples = [(round(0.1 * n, 1), "sample") for n in range(66) if not silent(0.1 * n)]
    marks = ([(0.25 * n, "step") for n in range(1, 5)] + [(1.05, "step"), (1.05, "epoch")]
             + [(1.55 + 0.2 * n, "step") for n in range(6)] + [(2.55, "epoch")]
             + [(2.7, "step"), (2.85, "step"), (2.85, "epoch")]
             + [(2.85 + 0.2 * n, "step") for n in range(1, 6)] + [(4.0, "step"), (4.5, "gap")]
             + [(4.5 + 0.2 * n, "step") for n in range(1, 11)] + [(6.5, "epoch")])
    for t, what in sorted(samples + marks, key=lambda e: (e[0], e[1] != "sample")):
        if what == "sample":
            sensor.t = t
            tap.sample()
        elif what == "step":
            acc.mark_step(t, 8, "", epoch)
        elif what == "gap":
            acc.mark_gap(t)
        else:
            sensor.t = 1.5 if silent(t) else t
            tap.sample()
            acc.update()
            acc.end_epoch(epoch)
            epoch += 1
    e0, e1, e2, e3 = acc.epochs
    for e in acc.epochs:  # a mean or a 1-s average of an epoch's power cannot exceed its peak
        assert e.mean_w <= e.peak_w + 1e-9 and not e.max_avg_w > e.peak_w + 1e-9
    for s in acc.steps:
        assert s.mean_w <= s.peak_w + 1e-9
    # epoch 1's first step (1.05 to 1.55) is integrated from the 9 W sample at 1.0 and the 7 W one at 1.5 (8 W
    # between, apportioned by time): its peak is 9 W, not the 7 W of the samples inside it
    assert e1.peak_w == 9.0 and e1.mean_w > 7.0
    # its 1-s windows lie inside it: the highest ends at 2.1, over [1.1, 2.1] (0.4 s at 8 W, then 7 W), not a
    # window reaching back into epoch 0's 9 W
    assert e1.max_avg_w == pytest.approx(0.4 * 8.0 + 0.6 * 7.0)
    assert e0.max_avg_w == pytest.approx(9.0)
    assert math.isnan(e2.max_avg_w) and e2.mean_w == pytest.approx(7.0) and e2.peak_w == 7.0  # shorter than 1 s
    # the 12 W evaluation is left out of epoch 3's steps, and its windows do not cross it
    assert e3.peak_w == pytest.approx(7.0) and e3.max_avg_w == pytest.approx(7.0)
    # the run's 1-s average (the budget's) holds every window, the evaluation's too
    assert acc.max_avg_w > 9.0 and acc.peak_w == 12.0
    rows = [line.split() for line in _table_of(acc).splitlines()[2:6]]
    assert rows[2][7] == "-"  # the table prints no 1-s average for an epoch shorter than one


def test_the_run_s_highest_1_s_average_is_over_a_whole_second(cnn_cost):
    """In its first second the moving average spans less than a window: a 12-W first 0.2 s was the run's "max 1s
    W" as 12 W, over the 8.2 W of any whole second; and a run shorter than a second printed an average over less
    than one in the total row, where its epoch row printed "-"."""
    from edgetune.power import PowerReading

    class Sensor:  # the hardware boundary: a scripted board power by device time
        rails, total_label, update_period_s = ("VDD_IN",), "VDD_IN", 0.1

        def __init__(self):
            self.t = 0.0

        def read(self):
            return PowerReading(self.t, 12.0 if self.t <= 0.2 else 7.0, {})

        def energy_j(self):
            return None

    for end_s, expected in ((2.0, 7.75), (0.8, math.nan)):  # over [0.1, 1.1] from the first sample, its trapezoids
        sensor = Sensor()
        tap, acc = _scripted_accounting(sensor)
        for n in range(1, round(end_s / 0.1) + 1):
            sensor.t = round(0.1 * n, 1)
            tap.sample()
            if n % 2 == 0:
                acc.mark_step(sensor.t, 8, "", 0)
        acc.update()
        acc.end_epoch(0)
        if math.isnan(expected):
            assert math.isnan(acc.max_avg_w) and math.isnan(acc.epochs[0].max_avg_w)
            rows = [line.split() for line in _table_of(acc).splitlines()[2:4]]
            assert rows[0][7] == rows[1][7] == "-"  # the epoch and the total alike
        else:
            assert acc.max_avg_w == pytest.approx(expected) and acc.peak_w == 12.0  # 12 W before, over 0.1 s


def test_a_sensor_that_fails_for_a_while_or_for_good_keeps_the_epochs_and_says_what_was_not_measured(cnn_cost):
    """The sensor silent from 1.0 to 2.0 s across epoch 0's end: its last steps closed only once the sensor was back,
    in a second record of epoch 0; silent for good from 3.5 s: the steps after it were left out of every figure
    without a word (tuner.summary.steps 86 of a run of 340)."""
    import dataclasses

    from edgetune.power import PowerReading

    def silent(t):
        return 1.0 < t < 2.0 or t > 3.5

    class Sensor:  # the hardware boundary: a board whose reads fail while silent
        rails, total_label, update_period_s = ("VDD_IN",), "VDD_IN", 0.1

        def __init__(self):
            self.t = 0.0

        def read(self):
            if silent(self.t):
                raise OSError(f"no reading at {self.t}")
            return PowerReading(self.t, 8.0, {})

        def energy_j(self):
            return None

    sensor = Sensor()
    tap, acc = _scripted_accounting(sensor)
    samples = [(round(0.1 * n, 1), "sample") for n in range(46)]
    marks = ([(0.25 * n, "step", 0) for n in range(1, 7)] + [(1.5, "epoch", 0)]
             + [(1.5 + 0.25 * n, "step", 1) for n in range(1, 7)] + [(3.0, "epoch", 1)]
             + [(3.0 + 0.25 * n, "step", 2) for n in range(1, 7)])
    for t, what, *epoch in sorted(samples + marks, key=lambda e: (e[0], e[1] != "sample")):
        sensor.t = t
        if what == "sample":
            tap.sample()
        elif what == "step":
            acc.mark_step(t, 8, "", epoch[0])
        else:  # the controller's epoch end: a sample, the accounting, the epoch
            tap.sample()
            acc.update()
            acc.end_epoch(epoch[0])
    acc.update()
    acc.end_epoch(2)
    acc.finish()
    assert [(e.epoch, e.steps) for e in acc.epochs] == [(0, 6), (1, 6), (2, 2)]  # each epoch once, whole
    assert acc.epochs[0].time_s == pytest.approx(1.5) and acc.epochs[0].mean_w == pytest.approx(8.0)
    assert (acc.unmeasured_steps, acc.unmeasured_s) == (4, pytest.approx(1.0))  # 3.5 .. 4.5: no reading

    # a run: the twin's sensor stops answering at 1 s of device time; the summary says what it did not measure
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    real = dev.sensor

    class Failing:  # the twin's sensor, dead from 1 s on
        rails, total_label, update_period_s = real.rails, real.total_label, real.update_period_s

        def read(self):
            if dev.clock.now() > 1.0:
                raise OSError("ina3221: no such device")
            return real.read()

        def energy_j(self):
            return None

    failing = dataclasses.replace(dev, sensor=Failing())
    with edgetune.tune(model, opt, dataset=data, batch_size=64, budget_w=15, device=failing, cost=cnn_cost,
                       online=False, print_summary=False) as tuner:
        train_until(tuner, model, opt, 2.5)
    s = tuner.summary
    assert s.steps + s.unmeasured_steps == tuner.steps and s.unmeasured_steps > 0
    assert s.time_s <= 1.0 + 1e-9 and s.unmeasured_s == pytest.approx(1.5, abs=0.2)
    assert sum(e.steps for e in s.epochs) == s.steps
    assert f"not measured: the last {s.unmeasured_steps} step(s)" in s.table()


def _scripted_accounting(sensor):
    """A tap on ``sensor`` and the accounting over it, under a 20-W budget, started at 0 s."""
    from edgetune.runtime.accounting import Accounting, SampleTap

    tap = SampleTap(sensor, keep_s=10.0)
    acc = Accounting(tap, lambda t: 20.0, budgets_at=lambda t: np.full(len(t), 20.0))
    acc.start(0.0)
    return tap, acc


def _table_of(acc):
    from edgetune.runtime.accounting import RunSummary

    time_s, energy, samples = acc.totals()
    return RunSummary("fake", False, False, len(acc.steps), samples, time_s, energy, energy / time_s, acc.peak_w,
                      acc.max_avg_w, 20.0, acc.violations, acc.epochs).table()


def test_a_tuner_on_a_real_clock_runs_one_background_thread():
    import threading

    from edgetune.power import Device, PowerReading, RealClock

    class Sensor:  # the hardware boundary: a constant reading on the real clock
        rails, total_label, update_period_s = ("VDD_IN",), "VDD_IN", 0.01

        def read(self):
            return PowerReading(RealClock().now(), 5.0, {"VDD_IN": 5.0})

        def energy_j(self):
            return None

    limit = {"w": 10.0}
    knob = Knob("power_limit", "W", [4.0, 6.0, 8.0, 10.0], read=lambda: limit["w"],
                write=lambda v: limit.update(w=float(v)))
    dev = Device(name="wall", description="real clock, constant sensor", simulated=False, knobs={"power_limit": knob},
                 sensor=Sensor(), clock=RealClock(), run_step=lambda fn, b, cost: fn(), idle_power=lambda: 2.0,
                 max_power_w=10.0)
    before = {t.name for t in threading.enumerate()}
    with edgetune.tune(None, None, batch_size=8, budget_w=7.0, device=dev, online=False,
                       print_summary=False) as tuner:
        names = [t.name for t in threading.enumerate() if t.name not in before]
        for _ in range(3):
            tuner.step()
    assert names == ["edgetune-guard"]  # no separate monitor thread: the ticker samples too
    assert {t.name for t in threading.enumerate()} - before == set()  # and it is gone after exit
    assert tuner.summary.steps == 3 and tuner.monitor.total_samples >= 2 and limit["w"] == 10.0


def test_online_tuner_decides_on_plain_values_and_applies_nothing(cnn_cost):
    """The online tuner alone, on the twin's real monitor: it returns decisions, the caller applies them."""
    from edgetune.power import PowerMonitor
    from edgetune.power.knobs import Candidate
    from edgetune.runtime.online import MeasurementStatus, OnlineMove, OnlineOptions, OnlineTuner, RunState

    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    options = OnlineOptions(batch_sizes=[16, 64], steps_per_candidate=5, warmup_steps=2, max_candidates=3)
    with PowerMonitor(dev.sensor, dev.clock) as monitor:
        tuner = OnlineTuner(dev.writable_knobs, monitor, start_batch_size=32, options=options, guard_margin=0.04)
        first = tuner.start(before)
        assert first.kind is OnlineMove.MOVE and isinstance(first.candidate, Candidate)
        assert first.notes[0].startswith("online tuning: batch sizes [16, 64], gpu_freq")
        decisions = []
        candidate = first.candidate
        while tuner.exploring:
            dev.apply(candidate.knobs)  # the caller applies what the tuner decided
            dev.run_step(lambda: None, candidate.batch_size, cnn_cost)
            now = RunState(dev.clock.now(), candidate.batch_size, 9.0, dev.settings())
            d = tuner.after_step(now)
            if d.kind is not OnlineMove.NONE:
                decisions.append(d)
                candidate = d.candidate or candidate
    dev.restore()
    assert [d.kind for d in decisions[:-1]] == [OnlineMove.MOVE] * (len(decisions) - 1)
    assert decisions[-1].kind in (OnlineMove.SETTLE, OnlineMove.STOP)
    assert len(tuner.measurements) == len(decisions) <= 3
    assert all(m.steps == 3 and m.status in (MeasurementStatus.OK, MeasurementStatus.OVER_BUDGET)
               for m in tuner.measurements)
    assert all(d.notes[0].startswith("online: candidate batch size") for d in decisions)
    if decisions[-1].kind is OnlineMove.SETTLE:
        assert tuner.chosen is not None and decisions[-1].candidate == tuner.chosen.candidate
    assert dev.settings() == before


def test_a_guard_trip_ends_the_candidate_as_over_budget(cnn_cost):
    from edgetune.power import PowerMonitor
    from edgetune.runtime.online import MeasurementStatus, OnlineMove, OnlineOptions, OnlineTuner, RunState

    dev = open_device("sim:orin-nano", seed=0)
    options = OnlineOptions(batch_sizes=[16, 64], steps_per_candidate=8, warmup_steps=2, max_candidates=4)
    with PowerMonitor(dev.sensor, dev.clock) as monitor:
        tuner = OnlineTuner(dev.writable_knobs, monitor, options=options, guard_margin=0.04)
        first = tuner.start(dev.settings()).candidate
        for _ in range(4):
            dev.run_step(lambda: None, first.batch_size, cnn_cost)
            assert tuner.after_step(RunState(dev.clock.now(), first.batch_size, 9.0, dev.settings())).kind \
                is OnlineMove.NONE
        d = tuner.on_guard_trip(RunState(dev.clock.now(), first.batch_size, 9.0, dev.settings()), power_w=9.6)
    m = tuner.measurements[-1]
    assert m.candidate == first and m.status is MeasurementStatus.OVER_BUDGET and m.power_w == 9.6
    assert m.steps == 4 and m.step_time_s > 0
    assert d.kind is OnlineMove.MOVE and d.candidate != first
    assert "over budget (" in d.notes[0]


def _online_run(profile, budget_w, cost, caplog):
    """Online tuning on the twin, its steps timed by ``cost``: a one-weight stand-in trains, as experiments/
    online_gap.py runs it. Returns the summary and the warnings logged."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgetune"):
        tuner = _explore_online(open_device(f"sim:{profile}", seed=0, compute=False), budget_w, cost)
    return tuner.summary, [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _explore_online(device, budget_w, cost, during=None):
    """A one-weight stand-in trains with online tuning (batch sizes 16, 32, 64) on ``device`` until its
    exploration ends; ``during(tuner)`` runs then, inside the block. Returns the tuner."""
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    data = TensorDataset(torch.zeros(2048, 1))
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=budget_w, cost=cost, device=device,
                       print_summary=False, online=OnlineOptions(batch_sizes=[16, 32, 64], b_noise=13.2)) as tuner:
        while tuner.online.exploring:
            for (x,) in tuner.loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                if not tuner.online.exploring:
                    break
        if during is not None:
            during(tuner)
    return tuner


def test_online_tuning_says_when_the_knobs_it_leaves_as_found_hold_nothing_under_the_budget(cnn_cost, caplog):
    """Online tuning varies the batch size and the GPU clock; at 5 W no such candidate on an Orin NX in 15W
    (four cores, the CPU and memory clocks at their maximum) holds the budget: it says so, and names the
    search, which also moves those knobs (experiments/online_gap.py: 14 of its 36 rows)."""
    summary, warnings = _online_run("orin-nx", 5.0, cnn_cost, caplog)
    line = next(t for t in warnings if t.startswith("online: limit"))
    assert "no batch size and gpu_freq with the other knobs as found" in line and "power_mode=15W" in line
    assert "cpu_cores=4 cores" in line and "the 5 W budget" in line and "edgetune search" in line
    assert line in summary.table()
    assert any(t.startswith("online: no candidate held the budget") for _, t in summary.events)


def test_online_tuning_says_when_the_power_mode_keeps_the_run_well_under_the_budget(cnn_cost, caplog):
    """An AGX Orin found in MODE_30W: every candidate of online tuning draws about 15 W or less (the mode caps
    the GPU clock), far from a 27 W budget that MAXN could use; a budget it binds says nothing."""
    summary, warnings = _online_run("orin-agx", 27.0, cnn_cost, caplog)
    line = next(t for t in warnings if t.startswith("online: limit"))
    assert "every batch size and gpu_freq online tuning can choose draws at most 1" in line
    assert "of the 27 W budget" in line and "MODE_30W" in line
    assert line in summary.table()
    summary, warnings = _online_run("orin-agx", 16.0, cnn_cost, caplog)
    assert any(t.startswith("online: settled") for _, t in summary.events)
    assert not any(t.startswith("online: limit") for t in warnings)


def test_tune_groups_its_keywords_into_settings(tmp_path, cnn_cost):
    from edgetune.runtime import GuardSettings, LoaderSettings, OnlineOptions, RecordSettings, Tuner

    model, opt, data = mlp()
    tuner = edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=12, lr_rule="sqrt", resize_at="epoch",
                          seed=3, guard=GuardParams(tick_s=0.1), log=tmp_path / "s.csv", keep_trace=True,
                          print_summary=False, online={"max_candidates": 2}, device="sim:orin-nano")
    assert tuner.loader_settings == LoaderSettings(lr_rule="sqrt", resize_at="epoch", seed=3)
    assert tuner.guard_params == GuardParams(tick_s=0.1)
    assert tuner.record == RecordSettings(log=tmp_path / "s.csv", keep_trace=True, print_summary=False)
    assert GuardSettings.of(False) == GuardSettings(enabled=False)
    with pytest.raises(ValueError, match="unknown lr_rule"):
        LoaderSettings(lr_rule="cubic")
    with pytest.raises(ValueError, match="resize_at"):
        edgetune.tune(model, opt, dataset=data, budget_w=12, resize_at="never")
    with pytest.raises(ValueError, match="steps_per_candidate must exceed warmup_steps"):
        OnlineOptions(steps_per_candidate=3, warmup_steps=3)
    with pytest.raises(ValueError, match="batch_size must be a positive whole number"):
        edgetune.tune(model, opt, dataset=data, batch_size=0, budget_w=12)
    # the settings given whole, without tune()
    with Tuner(None, None, batch_size=16, budget_w=12, device="sim:orin-nano", cost=cnn_cost, online=False,
               guard=GuardSettings(enabled=False), record=RecordSettings(print_summary=False)) as direct:
        for _ in range(5):
            direct.step()
    assert direct.summary.steps == 5 and not any(t.startswith("guard") for _, t in direct.events)


def test_an_unknown_online_option_is_one_line_naming_the_options():
    # online={"steps": 5} was a raw TypeError from OnlineOptions.__init__ ("unexpected keyword argument")
    model, opt, data = mlp()
    with pytest.raises(ValueError, match=r"online= has no option 'steps'; its options: batch_sizes, "
                                         r"steps_per_candidate, warmup_steps"):
        edgetune.tune(model, opt, dataset=data, budget_w=10, device="sim:orin-nano", online={"steps": 5})


def test_tunes_other_arguments_at_the_boundary(cnn_cost):
    """schedulers=None was a raw TypeError; monitor_rate_hz=0 silently the default; guard="yes" an enabled guard;
    online={} switched online tuning off; a batch larger than the dataset with drop_last=True trained 0 steps
    without a word."""
    model, opt, data = mlp()
    common = {"dataset": data, "budget_w": 10, "device": "sim:orin-nano", "cost": cnn_cost, "print_summary": False}
    for rate in (0, -5, math.inf, math.nan, "50", True):
        with pytest.raises(ValueError, match=r"^monitor_rate_hz must be a positive number of samples per second"):
            edgetune.tune(model, opt, online=False, monitor_rate_hz=rate, **common)
    with pytest.raises(TypeError, match=r"^guard= takes True, False or a GuardParams, got 'yes'"):
        edgetune.tune(model, opt, online=False, guard="yes", **common)
    assert edgetune.tune(model, opt, online={}, **common)._online_options is not None  # every option's default
    tuner = edgetune.tune(model, opt, online=False, batch_size=4096, drop_last=True, **common)
    with pytest.raises(ValueError, match=r"^batch size 4096 is larger than the dataset \(2048 samples\) with "
                                         r"drop_last=True: no batch would be drawn"), tuner:
        pass
    assert tuner.summary is not None and tuner.summary.knobs_restored is not False
    with edgetune.tune(model, opt, online=False, batch_size=64, schedulers=None, **common) as tuner:
        x, y = next(iter(tuner.loader))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert tuner.summary.steps == 1


def test_a_budget_is_checked_alike_by_tune_and_set_budget(cnn_cost):
    # tune(budget_w="abc") was a raw "could not convert string to float"; tune(budget_w=inf) and "10" were taken
    # while set_budget refused them; set_budget(np.float32(7)) was refused as "not a positive number of watts"
    model, opt, data = mlp()
    for bad in ("abc", "10", math.inf, math.nan, 0, -1, True, None):
        with pytest.raises(ValueError, match=r"^budget_w must be a positive number of watts \(or come from the "
                                             r"plan\), got "):
            edgetune.tune(model, opt, dataset=data, budget_w=bad, device="sim:orin-nano", online=False)
    with edgetune.tune(model, opt, dataset=data, batch_size=64, budget_w=np.float32(9.5), device="sim:orin-nano",
                       online=False, cost=cnn_cost, print_summary=False) as tuner:
        assert tuner.budget_w == 9.5
        tuner.set_budget(np.float32(7.5))
        tuner.set_budget(np.int64(8))
        with pytest.raises(ValueError, match="budget must be a positive number of watts, got inf"):
            tuner.set_budget(math.inf)
    assert [text for _, text in tuner.events if text.startswith("budget ")] == ["budget 7.5 W (set_budget)",
                                                                               "budget 8 W (set_budget)"]


def test_runtime_imports_point_one_way():
    """No import cycle inside edgetune.runtime; the online tuner never reaches the controller; no search."""
    import ast
    import pathlib

    root = pathlib.Path(edgetune.__file__).parent / "runtime"
    graph = {}
    for path in root.glob("*.py"):
        name = f"edgetune.runtime.{path.stem}" if path.stem != "__init__" else "edgetune.runtime"
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        assert not any(d.startswith(("edgetune.search", "edgetune.cli")) for d in deps), name
        graph[name] = {d for d in deps if d.startswith("edgetune.runtime.")}

    def reaches(start, target, seen=()):
        return any(d == target or (d not in seen and reaches(d, target, (*seen, d))) for d in graph.get(start, ()))

    assert not [m for m in graph if m != "edgetune.runtime" and reaches(m, m)]
    assert not reaches("edgetune.runtime.online", "edgetune.runtime.controller")
    assert not reaches("edgetune.runtime.guard", "edgetune.runtime.controller")


def test_one_tuner_per_run_and_none_after_its_block(tmp_path, monkeypatch, cnn_cost):
    """A tune() block nested in another on the same optimizer (or the same board) counted every step twice and
    restored the knobs under the outer block; a finished tuner's set_budget, set_batch_size, end_epoch and
    loader changed a run that had ended, and its block could run again over the old summary. Each is one line."""
    model, opt, data = mlp()
    common = {"budget_w": 10, "device": "sim:orin-nano", "cost": cnn_cost, "online": False, "print_summary": False}
    with edgetune.tune(model, opt, dataset=data, batch_size=64, **common) as tuner:
        inner = edgetune.tune(model, opt, batch_size=64, **common)
        with pytest.raises(RuntimeError, match=r"^a tune\(\) block already runs on this optimizer: one tuner"):
            inner.__enter__()
        x, y = next(iter(tuner.loader))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert tuner.summary.steps == 1 and tuner.summary.knobs_restored
    late = {"set_budget()": lambda: tuner.set_budget(8), "set_batch_size()": lambda: tuner.set_batch_size(32),
            "end_epoch()": tuner.end_epoch, "loader": lambda: next(iter(tuner.loader))}
    for what, call in late.items():
        with pytest.raises(RuntimeError, match=r"after the with block: the run and its summary have ended") as err:
            call()
        assert str(err.value).startswith(f"tuner.{what} after the with block")
    with pytest.raises(RuntimeError, match=r"^this tuner's run has ended"):
        tuner.__enter__()
    # a board is one set of knobs: a second tuner on it, with its own optimizer, is refused too
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    other_model, other_opt, _ = mlp(seed=1)
    board = {"batch_size": 64, "budget_w": 10, "cost": cnn_cost, "online": False, "guard": False,
             "print_summary": False}
    with edgetune.tune(model, opt, device=open_device("jetson", root=fake.root, detect_period_s=0), **board):
        second = edgetune.tune(other_model, other_opt, device="jetson",
                               device_options={"root": fake.root, "detect_period_s": 0}, **board)
        with pytest.raises(RuntimeError, match=r"already runs on this board \(jetson\)"):
            second.__enter__()


def test_the_guard_takes_the_lowest_setting_while_the_sensor_gives_no_reading(tmp_path, cnn_cost, caplog):
    """The twin's sensor silent from 1.5 to 5 s of device time: the guard judged the last readings it had, so a
    load rising meanwhile went unseen. After blind_s (2 s) without a reading it holds the lowest setting, warns
    once, and when readings come back says so and goes on from there (climbing back under the budget)."""
    import dataclasses

    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    real = dev.sensor

    class Silent:  # the hardware boundary: the twin's sensor, failing for a while
        rails, total_label, update_period_s = real.rails, real.total_label, real.update_period_s

        def read(self):
            if 1.5 < dev.clock.now() < 5.0:
                raise OSError("ina3221: no such device")
            return real.read()

        def energy_j(self):
            return None

    with caplog.at_level("WARNING", logger="edgetune"), edgetune.tune(
            model, opt, dataset=data, plan=write_plan(tmp_path), device=dataclasses.replace(dev, sensor=Silent()),
            cost=cnn_cost, print_summary=False) as tuner:
        lowest = tuner._guard.ladder[0]
        train_until(tuner, model, opt, 4.5)
        assert all(tuner.setting[k] == v for k, v in lowest.items())  # blind: the lowest setting
        train_until(tuner, model, opt, 9.0)
    events = [text for _, text in tuner.summary.events]
    blind = [(t, text) for t, text in tuner.summary.events if text.startswith("guard blind: no power reading")]
    assert len(blind) == 1 and 3.5 <= blind[0][0] <= 3.7  # 2 s after the last reading
    assert any(text.startswith("guard: the power sensor reads again after 1.") for text in events)
    assert tuner.summary.guard_moves.get(GuardMove.BLIND) == 1 and GuardMove.CLIMB in tuner.summary.guard_moves
    warned = [r.getMessage() for r in caplog.records if "blind" in r.getMessage()]
    assert len(warned) == 1 and "(device sim:orin-nano)" in warned[0]


# ---------------------------------------------------------------------------------------------- a knob write failing


def _refusing(dev, name, after_s, until_s=math.inf, why=lambda t: "EBUSY: Device or resource busy"):
    """``dev`` with knob ``name`` answering every write from ``after_s`` to ``until_s`` of device time as a busy
    kernel does (the hardware boundary: the twin's knob, its driver refusing; ``why(t)``: the errno's text).
    Returns the device and the values tried while it refused."""
    import dataclasses

    real = dev.knobs[name]
    tried = []

    def write(value):
        if after_s < dev.clock.now() < until_s:
            tried.append(value)
            raise KnobWriteError(f"{name}: the kernel rejected {value} for /sys/.../{name} ({why(dev.clock.now())})")
        real._write(value)

    knob = Knob(name, real.unit, real.values, read=real.read, write=write, description=real.description)
    return dataclasses.replace(dev, knobs=dict(dev.knobs, **{name: knob})), tried


@pytest.mark.parametrize(("knob", "budget_w", "written", "stays", "others"), [
    ("gpu_freq", 6.5, "cpu_freq=115.2 MHz, emc_freq=204 MHz; ", "408 MHz", "emc_freq, cpu_freq"),
    ("cpu_freq", 6.8, "", "1.4976 GHz", "gpu_freq, emc_freq"),
], ids=["gpu_freq-after-two-written", "cpu_freq-first-written"])
def test_a_knob_write_that_fails_mid_run_leaves_the_guard_at_the_clocks_in_force(knob, budget_w, written, stays,
                                                                                  others, cnn_cost, caplog):
    """A knob answers EBUSY from 2 s of device time; at 3 s the budget drops under what the plan's clocks draw. The
    guard's trip writes cpu_freq, emc_freq, then gpu_freq (restore order): a failing gpu_freq leaves the first
    two written, a failing cpu_freq none. The guard used to believe its lowest rung in force: the setting it
    reported was not the board's, it never lowered the clocks it could (cpu_freq: 7.6 W over 6.8 W for 11 s)
    and halved the batch 'at the lowest setting'. Now the setting is the board's at every tick, the knob is
    written once and left as it is (its retry, 30 s later, is past the run), one warning says so, and the guard
    holds the budget with the other knobs and the batch size."""
    model, opt, data = mlp()
    dev, tried = _refusing(open_device("sim:orin-nano", seed=0), knob, after_s=2.0)
    twin = dev.backend
    plan = Plan(128, {"gpu_freq": 408000000}, 10.0, "sim:orin-nano")
    wrong = []
    with caplog.at_level(logging.WARNING, logger="edgetune"), edgetune.tune(
            model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost, keep_trace=True,
            print_summary=False) as tuner:
        def compare():  # the setting the tuner reports against the one the board runs
            if any(twin.settings()[k] != v for k, v in tuner.setting.items()):
                wrong.append(dev.clock.now())

        dev.clock.add_ticker(0.05, compare)
        train_until(tuner, model, opt, 14.0, [(3.0, lambda: tuner.set_budget(budget_w))])
        guard = tuner._guard
        assert all(rung[knob] == tuner.setting[knob] for rung in guard.ladder)  # the ladder leaves it as it is
        assert all(tuner.setting[k] == v for k, v in guard.ladder[guard.state.rung].items())  # its rung in force
    assert wrong == []
    assert len(tried) == 2  # the trip's write, then the restore's: never again in between
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"{knob}: the kernel rejected ") and "(EBUSY: Device or resource busy)" in warned[0]
    assert warned[0].endswith(f"; {knob} stays at {stays}; edgetune leaves {knob} as it is and tries it again after 30 s "
                              f"of device time (try 1 of 5); the guard goes on with {others} and the batch size")
    s = tuner.summary
    events = [text for _, text in s.events]
    trip = next(text for text in events if text.startswith("guard trip"))
    assert trip.endswith(f": {written}{knob} not set (its write failed)")
    shrinks = [text for text in events if text.startswith("guard shrink batch")]
    assert shrinks and all(text.endswith(f"({knob} left as it is: its write failed)") for text in shrinks)
    assert s.guard_moves[GuardMove.TRIP] >= 1 and s.guard_moves[GuardMove.SHRINK_BATCH] == len(shrinks)
    # the budget held from 8 s on, with the clocks the guard could set and a smaller batch
    t, avg = np.array(tuner.accounting.trace_t), np.array(tuner.accounting.trace_avg)
    assert avg[t > 8.0].max() < budget_w
    # the summary says what was not set; the knob still refuses, so its restore failed too, and says so
    assert list(s.knobs_failed) == [knob] and f"write failed: {knob}: the kernel rejected" in s.table()
    assert "(lowest setting it could set over the budget)" in s.table()
    assert s.knobs_restored is False and any(text.startswith(f"restore failed: not restored on sim:orin-nano: {knob}")
                                             for text in events)


def test_online_tuning_goes_on_at_the_clock_in_force_when_its_clock_cannot_be_written(cnn_cost, caplog):
    """The GPU clock answers EBUSY from 1 s of device time, in the middle of online tuning's exploration: the
    write used to raise out of the user's optimizer.step(). Now the candidate that asked for another clock ends
    unmeasured, the exploration goes on with the batch size at the clock in force, and settles there."""
    dev, tried = _refusing(open_device("sim:orin-nano", seed=0, compute=False), "gpu_freq", after_s=1.0)
    in_force = 408000000

    def in_block(tuner):
        assert tuner.setting["gpu_freq"] == dev.backend.settings()["gpu_freq"] == in_force

    with caplog.at_level(logging.WARNING, logger="edgetune"):
        tuner = _explore_online(dev, 9.0, cnn_cost, during=in_block)
    online = tuner.online
    assert len(tried) == 2  # the candidate's write, then the restore's
    events = [text for _, text in tuner.summary.events]
    assert "online: candidate batch size 16, gpu_freq=510 MHz: not measured (gpu_freq could not be set)" in events
    # the candidates after the failure ran at the clock in force, and the run settled on one of them
    assert online.chosen.candidate.knobs["gpu_freq"] == in_force
    assert online.measurements[-1].candidate.knobs["gpu_freq"] == in_force
    settled = next(text for text in events if text.startswith("online: settled"))
    assert "gpu_freq=408 MHz" in settled
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("gpu_freq: the kernel rejected 510000000")
    assert "gpu_freq stays at 408 MHz; edgetune leaves gpu_freq as it is and tries it again after 30 s" in warned[0]


def test_a_jetsons_clock_whose_write_fails_mid_run_is_put_back_as_found_and_left_there(tmp_path, monkeypatch,
                                                                                         cnn_cost, caplog):
    """The fake Orin Nano on a real clock: its kernel answers EBUSY to a lowered GPU max_freq once the run is under
    way (another client holds the GPU's range). The Jetson backend puts the GPU's range back as found; the tuner
    takes the clock as its governor runs it (the top of its range), online tuning explores the batch size there,
    and the knob files end as they began."""
    from edgetune.power import sysfs

    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    gpu = "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    busy = {"on": False}
    real_write = sysfs.write_checked

    def kernel_write(path, value, what):
        if busy["on"] and path.name == "max_freq" and int(value) < int(path.read_text()):
            raise KnobWriteError(f"{what}: the kernel rejected {value} for {path} (EBUSY: Device or resource busy)")
        real_write(path, value, what)

    monkeypatch.setattr(sysfs, "write_checked", kernel_write)
    before = fake.knob_state()
    device = open_device("jetson", root=fake.root, detect_period_s=0)
    model, opt, data = mlp()
    options = OnlineOptions(batch_sizes=[16, 32, 64], steps_per_candidate=6, warmup_steps=2, max_candidates=4)
    with caplog.at_level(logging.WARNING, logger="edgetune"), edgetune.tune(
            model, opt, dataset=data, batch_size=32, budget_w=20, device=device, cost=cnn_cost, guard=False,
            online=options, print_summary=False) as tuner:
        busy["on"] = True  # the first candidate's 510 MHz is locked: from now on max_freq cannot go lower
        while tuner.online.exploring:
            for x, y in tuner.loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if not tuner.online.exploring:
                    break
        files = fake.knob_state()
        assert (files[f"{gpu}/min_freq"], files[f"{gpu}/max_freq"]) == (before[f"{gpu}/min_freq"],
                                                                        before[f"{gpu}/max_freq"])
        assert tuner._guard.anchor["gpu_freq"] == 624750000  # as its governor runs it under load
    # (the other warnings: the model on the CPU, and online tuning's space far under a 20 W budget)
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gpu_freq")]
    assert len(warned) == 1, warned
    assert warned[0].startswith("gpu_freq: the kernel rejected 306000000 for ") and "max_freq (EBUSY" in warned[0]
    assert warned[0].endswith("; gpu_freq is back at its original value; edgetune leaves gpu_freq as it is and tries "
                              "it again after 30 s of device time (try 1 of 5)")
    assert tuner.online.chosen.candidate.knobs["gpu_freq"] == 624750000
    assert fake.knob_state() == before and tuner.summary.knobs_restored
    assert list(tuner.summary.knobs_failed) == ["gpu_freq"]
    device.close()


@pytest.mark.parametrize("loader", [True, False])
def test_with_no_knob_it_can_set_the_guard_holds_the_budget_by_the_batch_size_alone(cnn_cost, loader):
    """A board without root (measure-only: NVML, a Jetson's sysfs read-only) has one setting the guard can
    reach. The guard switched off there and only reported, though the batch size still lowers power (a GPU
    draws more per step until the batch saturates it): with tuner.loader it now halves the batch size at that
    setting, and says so; without a loader it only reports, as before."""
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    for knob in dev.knobs.values():
        knob.writable, knob.why_read_only = False, "no root here"
    with edgetune.tune(model, opt, dataset=data if loader else None, batch_size=128, budget_w=11.6, device=dev,
                       cost=cnn_cost, online=False, print_summary=False) as tuner:
        if loader:
            train_until(tuner, model, opt, 10.0)
        else:
            x, y = data.tensors[0][:128], data.tensors[1][:128]
            while dev.clock.now() < 10.0:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    events = [text for _, text in tuner.events]
    s = tuner.summary
    assert dev.settings() == tuner._knob_state.original  # nothing written
    if loader:
        assert "guard: no knob it can set here: it holds the budget by the batch size alone (tuner.loader)" in events
        assert any(e.startswith("guard shrink batch") and e.endswith("batch size 128 -> 64 (the only one: no knob "
                                                                      "the guard can set here)") for e in events)
        assert tuner.batch_size == 64 and s.time_over_s < 2.0
    else:
        assert "measure-only: knobs cannot be set here (no root here); the guard only reports" in events
        assert not any(e.startswith("guard") for e in events) and s.time_over_s > 8.0
    dev.close()


# ---------------------------------------------------------------------------------------------- a power mode change


def test_a_power_mode_change_reads_back_the_clocks_and_cores_it_reset(cnn_cost):
    """nvpmodel -m resets every clock's range and the online cores under the new mode (the twin does the same).
    The tuner kept the values from before for the knobs a setting did not write: after 7W, tuner.setting said
    gpu_freq 510 MHz, cpu_freq 1.1904 GHz and 6 cores while the board ran 408 MHz, 960 MHz and 4 cores, and the
    guard's ladder was built on the 6 cores. Now the knobs the mode reset are read back, at every tick."""
    model, opt, data = mlp()
    dev = open_device("sim:orin-nano", seed=0)
    twin = dev.backend
    wrong = []
    with edgetune.tune(model, opt, dataset=data, batch_size=64, budget_w=30, device=dev, cost=cnn_cost, online=False,
                       print_summary=False) as tuner:
        def compare():  # the setting the tuner reports against the one the board runs
            if any(twin.settings()[k] != v for k, v in tuner.setting.items()):
                wrong.append(dev.clock.now())

        dev.clock.add_ticker(0.05, compare)
        train_until(tuner, model, opt, 4.0, [
            (1.0, lambda: tuner.apply_setting({"gpu_freq": 510000000, "cpu_freq": 1190400}, "by hand")),
            (2.0, lambda: tuner.apply_setting({"power_mode": "7W"}, "by hand"))])
        assert (tuner.setting["gpu_freq"], tuner.setting["cpu_freq"], tuner.setting["cpu_cores"]) == (408000000, 960000,
                                                                                                      4)
        assert tuner._knob_state.written == {"power_mode"}  # the clocks run as the mode leaves them, not locked
        assert all(rung["cpu_cores"] == 4 for rung in tuner._guard.ladder)
    assert wrong == []


def _refused_run(dev, cnn_cost, seconds, script):
    """A tuned run of a step-less model on ``dev`` (the twin times the cnn's steps) at the plan's 408 MHz, the
    budget dropped to 6.5 W at 3 s (the trip writes cpu_freq, emc_freq, then gpu_freq); ``script`` as for
    :func:`train_until`. Returns the tuner and the device times at which its setting was not the board's."""
    model, opt, data = mlp()
    twin = dev.backend
    plan = Plan(128, {"gpu_freq": 408000000}, 10.0, "sim:orin-nano")
    wrong = []
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=cnn_cost, keep_trace=True,
                       print_summary=False) as tuner:
        def compare():  # the setting the tuner reports against the one the board runs, and the guard's rung
            rung = tuner._guard.ladder[tuner._guard.state.rung]
            if any(twin.settings()[k] != v for k, v in tuner.setting.items()) or \
                    any(tuner.setting[k] != v for k, v in rung.items()):
                wrong.append(dev.clock.now())

        dev.clock.add_ticker(0.05, compare)
        train_until(tuner, model, opt, seconds, [(3.0, lambda: tuner.set_budget(6.5)), *script])
    return tuner, wrong


def test_a_knob_whose_write_failed_for_a_busy_moment_is_tried_again_after_its_back_off_and_comes_back(cnn_cost,
                                                                                                      caplog):
    """The GPU clock answers EBUSY from 2 s to 20 s of device time (a busy driver). Its write failed at the trip
    at 3 s and it was left as it is for the rest of the run: the guard held 6.5 W with the CPU and memory clocks
    and the batch size, at 408 MHz, for good. Now it is tried again after 30 s of device time: the guard takes
    it back into its ladder, moves to the highest rung under the setting in force (the GPU at its lowest), the
    write succeeds and the knob is back, one event saying so; one warning in all, the setting the board's and
    the guard's rung at every tick."""
    dev, tried = _refusing(open_device("sim:orin-nano", seed=0), "gpu_freq", after_s=2.0, until_s=20.0)
    with caplog.at_level(logging.WARNING, logger="edgetune"):
        tuner, wrong = _refused_run(dev, cnn_cost, 40.0, [])
    assert wrong == []
    assert tried == [306000000]  # the trip's write; the try at 33 s went through
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "tries it again after 30 s of device time (try 1 of 5)" in warned[0]
    events = tuner.summary.events
    back_in = [(t, e) for t, e in events if e.startswith("guard: gpu_freq (try 1 of 5) back in the ladder")]
    back = [(t, e) for t, e in events if e.startswith("gpu_freq is back: its write succeeded at try 1 of 5")]
    assert len(back_in) == 1 and len(back) == 1 and 33.0 <= back_in[0][0] == back[0][0] < 33.2
    assert tuner.setting["gpu_freq"] == 306000000  # the board's too (wrong: none)
    assert not tuner._knob_state.failed and not tuner._knob_state.refused and tuner.summary.knobs_failed == {}
    assert len({rung["gpu_freq"] for rung in tuner._guard.ladder}) > 1  # the guard moves it again
    assert tuner.summary.knobs_restored


def test_a_knob_that_stays_refused_is_tried_with_a_doubling_back_off_then_left_for_the_run(cnn_cost, caplog,
                                                                                          monkeypatch):
    """The GPU clock refuses every write from 2 s on (EBUSY, then EIO from 10 s). With the back-off at 1 s,
    doubling, capped at 4 s (the constants shortened; 30 s and 480 s on a run), it is tried at 4, 6, 10, 14 and
    18 s after its failure at 3 s: out again after each, one warning per error text (EBUSY, then EIO), an
    event for the tries whose error was seen before, and after the fifth it is left for the rest of the run,
    said once. The setting is the board's and the guard's rung at every tick."""
    from edgetune.runtime import knob_state

    monkeypatch.setattr(knob_state, "RETRY_FIRST_S", 1.0, raising=False)  # (raising: the code before had none)
    monkeypatch.setattr(knob_state, "RETRY_MAX_S", 4.0, raising=False)
    dev, tried = _refusing(open_device("sim:orin-nano", seed=0), "gpu_freq", after_s=2.0,
                           why=lambda t: "EBUSY: Device or resource busy" if t < 10.0 else "EIO: Input/output error")
    with caplog.at_level(logging.WARNING, logger="edgetune"):
        tuner, wrong = _refused_run(dev, cnn_cost, 30.0, [])
    assert wrong == []
    assert len(tried) == 1 + 5 + 1  # the trip's write, five tries, the restore's
    tries = [t for t, e in tuner.summary.events if e.startswith("guard: gpu_freq (try ")]
    assert [round(t) for t in tries] == [4, 6, 10, 14, 18]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned
    assert "(EBUSY: Device or resource busy)" in warned[0] and "(try 1 of 5)" in warned[0]
    assert "(EIO: Input/output error)" in warned[1] and "(try 4 of 5)" in warned[1]
    events = [e for _, e in tuner.summary.events]
    again = [e for e in events if e.startswith("gpu_freq refused again: ")]
    assert len(again) == 4 and "for the rest of the run (5 tries failed)" in again[-1]  # try 3: EIO, warned
    assert sum("for the rest of the run" in e for e in events) == 1
    assert not any(e.startswith("gpu_freq is back") for e in events)
    assert list(tuner.summary.knobs_failed) == ["gpu_freq"] and "EIO" in tuner.summary.knobs_failed["gpu_freq"]
    assert all(rung["gpu_freq"] == 408000000 for rung in tuner._guard.ladder)


def test_a_budget_at_or_below_idle_power_is_a_warning_from_the_start(cnn_cost, caplog):
    """tune(budget_w=3) on an Orin Nano that idles at about 4.5 W: no setting can hold it, and the run counts
    as over from its first second; a warning says so at the start (before: nothing, the summary's violations
    alone), as a later set_budget below idle does."""
    model, opt, data = mlp()
    with caplog.at_level("WARNING", logger="edgetune"), \
            edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=3, device="sim:orin-nano", online=False,
                          cost=cnn_cost, print_summary=False) as tuner:
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(w.startswith("budget 3 W is at or below sim:orin-nano's idle power") and "give a budget above"
                   in w for w in warned), warned
        for x, y in itertools.islice(tuner.loader, 2):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
