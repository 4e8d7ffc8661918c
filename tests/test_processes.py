"""Several training processes on one machine (torchrun, DDP): what each process's tuner does."""

from __future__ import annotations

import pytest
import torch
from fakes.jetson_tree import build_jetson
from torch.utils.data import TensorDataset

import edgetune
from edgetune.power import open_device
from edgetune.runtime import Plan
from edgetune.runtime.processes import LocalProcesses, machine_share
from edgetune.workloads import load_workload


@pytest.fixture(scope="module")
def cnn_cost():
    return load_workload("cnn").cost


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.05), data


def train(tuner, model, opt):
    for x, y in tuner.loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def torchrun(monkeypatch, rank, count=2):
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(count))


@pytest.mark.parametrize(("env", "expected"), [
    ({}, LocalProcesses(1, 0)),
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, LocalProcesses(4, 1)),
    ({"LOCAL_RANK": " 0 ", "LOCAL_WORLD_SIZE": "2"}, LocalProcesses(2, 0)),
    ({"LOCAL_RANK": "2"}, LocalProcesses(3, 2)),  # an older launcher: no count, at least rank + 1 processes
    ({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": ""}, LocalProcesses(2, 0)),
])
def test_local_processes_are_read_where_torchrun_puts_them(env, expected):
    assert LocalProcesses.from_env(env) == expected


@pytest.mark.parametrize(("env", "message"), [
    ({"LOCAL_RANK": "one"}, (r"^LOCAL_RANK='one' is not a whole number: the launcher \(torchrun\) sets it; unset "
                             r"it, or pass processes=LocalProcesses\(count, rank\) to tune\(\)$")),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, r"^LOCAL_WORLD_SIZE=2 and LOCAL_RANK=2: local rank 2 of 2"),
    ({"LOCAL_WORLD_SIZE": "0"}, r"^LOCAL_WORLD_SIZE=0 and LOCAL_RANK=0: .*at least one process$"),
])
def test_a_malformed_launcher_environment_is_one_line(env, message):
    with pytest.raises(ValueError, match=message):
        LocalProcesses.from_env(env)


def test_local_processes_refuse_what_is_not_a_count():
    with pytest.raises(TypeError, match=r"LocalProcesses.count must be a whole number, got 2.0"):
        LocalProcesses(2.0, 0)
    with pytest.raises(ValueError, match=r"local rank -1 of 2 processes"):
        LocalProcesses(2, -1)
    with pytest.raises(TypeError, match=r"^processes= takes a LocalProcesses\(count, rank\)"):
        edgetune.tune(None, None, batch_size=8, budget_w=10, device="sim:orin-nano", processes=2)


def test_a_rank_keeps_its_own_copy_of_per_run_files(tmp_path):
    assert LocalProcesses(2, 0).own_path(tmp_path / "steps.csv") == tmp_path / "steps.csv"
    assert LocalProcesses(3, 2).own_path(tmp_path / "steps.jsonl") == tmp_path / "steps.rank2.jsonl"
    assert LocalProcesses(2, 1).own_path(None) is None


def test_machine_share_by_what_the_device_measures(tmp_path):
    """Pure: each process on its own GPU tunes it; one board is local rank 0's and counts every process; a
    device that measures this process alone leaves the others unheld, said once by local rank 0."""
    twin = open_device("sim:orin-nano", seed=0)
    assert machine_share(LocalProcesses(), twin, 10.0, own_gpu=False) == machine_share(
        LocalProcesses(), twin, 10.0, own_gpu=True)
    own = machine_share(LocalProcesses(4, 3), twin, 10.0, own_gpu=True)
    assert own.samples_factor == 1 and own.refusal is None and own.warning is None
    assert own.event == ("4 training processes on this machine: each tunes and measures the GPU it trains on under "
                         "the 10-W budget (this one: sim:orin-nano)")
    first = machine_share(LocalProcesses(2, 0), twin, 10.0, own_gpu=False)
    assert first.samples_factor == 1 and "not held to the 10-W budget by this tuner" in first.warning
    assert machine_share(LocalProcesses(2, 1), twin, 10.0, own_gpu=False) == type(first)()
    twin.close()


def test_tune_in_a_second_local_rank_on_one_board_is_refused_before_any_knob_changes(
        tmp_path, monkeypatch, cnn_cost):
    """Raw ``tune()`` in every process of ``torchrun --nproc-per-node 2`` on a Jetson: local rank 1 would set
    the clocks under local rank 0's tuner (or be refused by the state file's lock, with a fix that does not
    apply). It is refused in one line naming the way out, and no knob, state file or log is touched."""
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    torchrun(monkeypatch, rank=1)
    before = fake.knob_state()
    model, opt, data = mlp()
    plan = Plan(batch_size=32, setting={"gpu_freq": 306000000}, budget_w=10.0, device="jetson")
    tuner = edgetune.tune(model, opt, dataset=data, device="jetson", plan=plan,
                          device_options={"root": fake.root, "detect_period_s": 0}, cost=cnn_cost,
                          log=tmp_path / "steps.csv", print_summary=False)
    with pytest.raises(RuntimeError, match=r"^tune\(\) in local rank 1 of 2: jetson is one board, whose sensor "
                                           r"measures every process and whose knobs local rank 0 tunes; open the "
                                           r"tuner in local rank 0 only") as err, tuner:
        pytest.fail("the block must not run")
    assert "\n" not in str(err.value)
    state = tmp_path / "state"
    assert fake.knob_state() == before and (not state.exists() or not any(state.iterdir()))
    assert not list(tmp_path.glob("steps*.csv"))


def test_tune_in_local_rank_0_on_one_board_counts_every_process(tmp_path, monkeypatch, cnn_cost):
    """Local rank 0 of two on a Jetson: the rails measure both processes, so energy per sample is the board's
    over both processes' samples (it was twice the true figure: the board's energy over this process's)."""
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    torchrun(monkeypatch, rank=0)
    before = fake.knob_state()
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=20.0, device="jetson", online=False,
                       device_options={"root": fake.root, "detect_period_s": 0}, cost=cnn_cost, guard=False,
                       print_summary=False) as tuner:
        train(tuner, model, opt)
    s = tuner.summary
    assert s.steps == 256 // 32 and s.samples == 2 * 256
    assert any("2 training processes share this machine: this one (local rank 0) tunes the board" in text
               for _, text in s.events)
    assert fake.knob_state() == before and s.knobs_restored


def test_tune_in_a_second_local_rank_keeps_to_its_own_files(tmp_path, monkeypatch, cnn_cost):
    """Local rank 1 tuning what it opens (the twin here; a GPU it names): its step log gets the rank in its
    name, where the same ``log=`` in every process made the second refuse the first's file, and only local
    rank 0 records the run in ``runs_file``."""
    torchrun(monkeypatch, rank=1)
    log, runs = tmp_path / "steps.csv", tmp_path / "runs.csv"
    model, opt, data = mlp()
    with edgetune.tune(model, opt, dataset=data, batch_size=32, budget_w=20.0, device="sim:orin-nano", online=False,
                       cost=cnn_cost, guard=False, print_summary=False, log=log, runs_file=runs,
                       target=edgetune.Target("accuracy", 0.99), workload="mlp") as tuner:
        train(tuner, model, opt)
        tuner.report(0.5)
    assert tuner.summary.steps == 8 and tuner.summary.samples == 256  # its own samples: the twin is its own
    assert (tmp_path / "steps.rank1.csv").is_file() and not log.exists() and not runs.exists()
