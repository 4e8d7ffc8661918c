"""Persistence and scale-out: several worker processes on one study, resume after ``kill -9``.

Workers are real processes sharing a real storage: an SQLite file, a journal file, and a PostgreSQL server
(``EDGETUNE_TEST_POSTGRES_URL``, which ``.ci/run`` sets after starting Debian's postgresql; under
``CI=true`` a missing URL fails the test rather than skipping it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[1]

# One worker: a search of a 40-setting space on the twin (compute=False), random sampler, shared study.
WORKER = r"""
import json, os, sys, time
import optuna, torch
optuna.logging.set_verbosity(optuna.logging.WARNING)
from edgetune.power import open_device
from edgetune.search.space import build_space
from edgetune.search.study import Search, open_storage
from edgetune.search.trial import MeasurementProtocol
from edgetune.workloads import Workload

url, name, n_trials, seed, hang_after, marker = sys.argv[1:7]
n_trials, seed, hang_after = int(n_trials), int(seed), int(hang_after)
torch.manual_seed(0)
wl = Workload.from_model("tiny", torch.nn.Linear(8, 2),
                         lambda b, g: (torch.randn(b, 8, generator=g), torch.randint(0, 2, (b,), generator=g)),
                         default_batch_size=32)
device = open_device("sim:orin-nano", compute=False, seed=seed)
space = build_space(device, 32, [16, 32, 64, 128], ["gpu_freq", "emc_freq"], {"emc_freq": ["665.6MHz", "max"]})
done = []

def on_step(k):
    # simulate a crash in the middle of a measurement: tell the parent, then wait to be killed
    if hang_after and len(done) >= hang_after and k == 3:
        open(marker, "w").write(str(os.getpid()))
        time.sleep(600)

search = Search(device, wl, space, budget_w=9.0, storage=open_storage(url), study_name=name,
                sampler="random", n_trials=n_trials, seed=seed, patience=0,
                protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=0.3),
                on_trial=lambda r, n: done.append(r.number), on_step=on_step)
result = search.run()
print(json.dumps({"pid": os.getpid(), "measured_here": done, "stop": result.stop_reason}))
"""


def start_worker(url: str, name: str, n_trials: int, seed: int, hang_after: int = 0,
                 marker: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, url, name, str(n_trials), str(seed), str(hang_after), str(marker or "")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
    )


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if t.user_attrs.get("measured")
            and t.state in (TrialState.COMPLETE, TrialState.FAIL)]


def check_fleet(url: str, storage) -> None:
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    n_trials = 14
    workers = [start_worker(url, name, n_trials, seed) for seed in (1, 2)]
    reports = [finish(w) for w in workers]
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    m = measured(study)
    # every trial recorded once: numbers unique, each measured setting measured by exactly one worker
    assert len({t.number for t in trials}) == len(trials)
    settings = [tuple(sorted(t.params.items())) for t in m]
    assert len(settings) == len(set(settings))
    # the study stops at n_trials; a worker that started its last trial as the other finished may add one
    assert n_trials <= len(m) <= n_trials + 1
    # both workers did part of the work, and each trial is reported by the worker that measured it
    by_worker = {r["pid"]: set(r["measured_here"]) for r in reports}
    assert all(by_worker.values())
    assert set().union(*by_worker.values()) == {t.number for t in m}
    assert sum(len(v) for v in by_worker.values()) == len(m)
    for t in m:
        assert int(t.user_attrs["worker"].rpartition(":")[2]) in by_worker
    optuna.delete_study(study_name=name, storage=storage)


def test_two_workers_share_one_sqlite_study(tmp_path):
    from edgetune.search.study import open_storage

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    check_fleet(url, open_storage(url))


def test_two_workers_share_one_journal_file(tmp_path):
    from edgetune.search.study import open_storage

    url = f"journal:{tmp_path / 'fleet.log'}"
    check_fleet(url, open_storage(url))


def test_two_workers_share_one_postgresql_study():
    url = os.environ.get("EDGETUNE_TEST_POSTGRES_URL")
    if not url:
        message = "EDGETUNE_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    from edgetune.search.study import open_storage

    check_fleet(url, open_storage(url))


def test_kill_9_mid_trial_loses_nothing_and_measures_nothing_twice(tmp_path):
    from edgetune.search.study import open_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    marker = tmp_path / "hung"
    proc = start_worker(url, "resume", 6, 1, hang_after=3, marker=marker)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "worker never reached the hang point"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    storage = open_storage(url)
    study = optuna.load_study(study_name="resume", storage=storage)
    before = {t.number: t.values for t in measured(study)}
    running = [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    assert len(before) == 3 and len(running) == 1
    killed = running[0]

    # the same command again resumes the study
    report = finish(start_worker(url, "resume", 6, 1))
    study = optuna.load_study(study_name="resume", storage=storage)
    trials = {t.number: t for t in study.get_trials()}
    assert trials[killed.number].state == TrialState.FAIL
    assert "died mid-trial" in trials[killed.number].user_attrs["stale"]
    retry = [t for t in trials.values() if t.user_attrs.get("retry_of") == killed.number]
    assert len(retry) == 1 and retry[0].params == killed.params and retry[0].user_attrs["measured"]
    m = measured(study)
    assert len(m) == 6
    assert {t.number: t.values for t in m if t.number in before} == before  # nothing lost
    settings = [tuple(sorted(t.params.items())) for t in m]
    assert len(settings) == len(set(settings))  # nothing measured twice
    assert not set(report["measured_here"]) & set(before)
