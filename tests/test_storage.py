"""Persistence and scale-out: several worker processes on one study, resume after ``kill -9``, a setting that
kills its worker given up after the retry cap.

Workers are real processes sharing a real storage: an SQLite file, a journal file, and a PostgreSQL server
(``EDGETUNE_TEST_POSTGRES_URL``, which ``.ci/run`` sets after starting Debian's postgresql; under
``CI=true`` a missing URL fails the test rather than skipping it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from edgetune.power import open_device
from edgetune.power.knobs import Candidate
from edgetune.search import records
from edgetune.search.space import build_space
from edgetune.search.storage import MAX_RETRY, open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)

REPO = Path(__file__).resolve().parents[1]

# One worker: a search of a 40-setting space on the twin (compute=False), random sampler, shared study.
WORKER = r"""
import json, os, sys, time
import optuna, torch
optuna.logging.set_verbosity(optuna.logging.WARNING)
from edgetune.power import open_device
from edgetune.search import records
from edgetune.search.space import build_space
from edgetune.search.study import Search, open_storage
from edgetune.search.trial import MeasurementProtocol
from edgetune.workloads import Workload

url, name, n_trials, seed, hang_after, marker, max_retry, die_on = sys.argv[1:9]
n_trials, seed, hang_after, max_retry = int(n_trials), int(seed), int(hang_after), int(max_retry)
die_on = json.loads(die_on) if die_on else None  # params of a setting that kills its worker
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
    if die_on is not None and k == 1:  # a setting that crashes the worker (a driver bug, a power trip)
        mine = [t for t in search.study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                if records.worker_of(t) == search.worker]
        if mine and mine[0].params == die_on:
            os.kill(os.getpid(), 9)

search = Search(device, wl, space, budget_w=9.0, storage=open_storage(url, max_retry=max_retry), study_name=name,
                sampler="random", n_trials=n_trials, seed=seed, patience=0,
                protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=0.3),
                on_trial=lambda r, n: done.append(r.number), on_step=on_step)
result = search.run()
print(json.dumps({"pid": os.getpid(), "measured_here": done, "stop": result.stop_reason}))
"""


def start_worker(url: str, name: str, n_trials: int, seed: int, hang_after: int = 0,
                 marker: Path | None = None, max_retry: int = MAX_RETRY, die_on: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, url, name, str(n_trials), str(seed), str(hang_after), str(marker or ""),
         str(max_retry), json.dumps(die_on) if die_on else ""],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
    )


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The settings measured: one trial each (the windows measuring a contender again are left out)."""
    return [t for t in study.get_trials() if records.is_measured(t) and not records.is_repeat(t)]


def windows(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Every measured trial, the contenders measured again before the pick included."""
    return [t for t in study.get_trials() if records.is_measured(t)]


def worker_space():
    """The workers' space (see WORKER)."""
    device = open_device("sim:orin-nano", compute=False)
    return build_space(device, 32, [16, 32, 64, 128], ["gpu_freq", "emc_freq"], {"emc_freq": ["665.6MHz", "max"]})


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
    # the study stops at n_trials: each worker counts the settings measured and those the other is measuring
    # before its next trial; two that check at the same instant may both start one (at most one per extra worker)
    assert n_trials <= len(m) <= n_trials + 1
    # every measured trial is reported by exactly the worker that measured it (how the work was split
    # between the two is up to the scheduler: a loaded machine may let one worker do it all)
    every = windows(study)
    assert {tuple(sorted(t.params.items())) for t in every} == set(settings)  # again: only measured settings
    by_worker = {r["pid"]: set(r["measured_here"]) for r in reports}
    assert set().union(*by_worker.values()) == {t.number for t in every}
    assert sum(len(v) for v in by_worker.values()) == len(every)
    for t in every:
        assert int(records.worker_of(t).rpartition(":")[2]) in by_worker
    optuna.delete_study(study_name=name, storage=storage)


def test_two_workers_share_one_sqlite_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    check_fleet(url, open_storage(url))


def test_two_workers_share_one_journal_file(tmp_path):
    url = f"journal:{tmp_path / 'fleet.log'}"
    check_fleet(url, open_storage(url))


def test_two_workers_share_one_postgresql_study(postgres_url):
    check_fleet(postgres_url, open_storage(postgres_url))


def test_kill_9_mid_trial_loses_nothing_and_measures_nothing_twice(tmp_path):
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
    assert trials[killed.number].state == TrialState.FAIL and not records.is_measured(trials[killed.number])
    retry = [t for t in trials.values() if records.retry_history(t) == [killed.number]]
    assert len(retry) == 1 and retry[0].params == killed.params and records.is_measured(retry[0])
    m = measured(study)
    assert len(m) == 6
    assert {t.number: t.values for t in m if t.number in before} == before  # nothing lost
    settings = [tuple(sorted(t.params.items())) for t in m]
    assert len(settings) == len(set(settings))  # nothing measured twice
    assert not set(report["measured_here"]) & set(before)


def test_a_setting_that_kills_its_worker_is_given_up_after_the_retry_cap(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url, max_retry=1)
    space = worker_space()
    deadly = Candidate(64, (("gpu_freq", space.knob_values["gpu_freq"][0]), ("emc_freq", 2_133_000_000)))
    params = space.params(deadly)
    study = optuna.create_study(study_name="deadly", storage=storage)
    records.enqueue(study, space, deadly)  # queued first: the first worker measures it at once
    # the first attempt and its one retry (max_retry=1): the worker dies each time; each run is the same
    # command again, which fails the dead worker's trial and queues it again while retries are left
    for _ in range(1 + 1):
        proc = start_worker(url, "deadly", 6, 1, max_retry=1, die_on=params)
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == -signal.SIGKILL, err[-2000:]
    report = finish(start_worker(url, "deadly", 6, 1, max_retry=1, die_on=params))  # given up: it finishes
    study = optuna.load_study(study_name="deadly", storage=storage)
    tried = [t for t in study.get_trials() if t.params == params]
    assert len(tried) == 2 and all(t.state == TrialState.FAIL and not records.is_measured(t) for t in tried)
    assert records.retry_history(tried[1]) == [tried[0].number]
    assert not [t for t in study.get_trials() if t.state in (TrialState.WAITING, TrialState.RUNNING)]
    given_up = [r for r in records.read_records(study.get_trials(), space) if r.given_up]
    assert [r.number for r in given_up] == [tried[1].number]
    m = measured(study)
    # 6 measured in all (a dying worker may have measured a baseline probe before its deadly retry came up)
    assert len(m) == 6 and set(report["measured_here"]) <= {t.number for t in windows(study)}
    settings = [tuple(sorted(t.params.items())) for t in m]
    assert len(settings) == len(set(settings)) and tuple(sorted(params.items())) not in settings


# A worker elsewhere judges this process's RUNNING trial: prints how many dead workers it found, and the trial's state
JUDGE = r"""
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
from edgetune.search.storage import open_storage, recover_dead_workers, retry_callback
storage = open_storage(sys.argv[1])
study = optuna.load_study(study_name="alive", storage=storage)
print(recover_dead_workers(study, storage, retry_callback(storage)), study.get_trials()[0].state.name)
"""


def _running_trial_of_this_process(url: str) -> None:
    """A study "alive" in ``url`` with one trial this process measures (RUNNING, recorded as a search records it)."""
    from edgetune.search.storage import worker_id, worker_kernel

    study = optuna.create_study(study_name="alive", storage=open_storage(url))
    space = worker_space()
    trial = study.ask(space.distributions())
    records.write_start(trial, space.candidate(trial.params), records.Role.SEARCH, worker_id(), worker_kernel())


def test_a_live_worker_in_another_pid_namespace_of_the_same_host_name_is_not_taken_for_dead(tmp_path):
    # boards flashed from one image share a host name, as do containers run with the host's: a worker there
    # read this process's pid as its own, found no such process, and failed its trial mid-measurement (measured
    # again by the retry; this worker's tell then died with UpdateFinishedTrialError)
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--pid", "--fork", "true"],
                                                         check=False, capture_output=True).returncode:
        pytest.skip("no unshare with pid namespaces here (needs root)")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    _running_trial_of_this_process(url)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", JUDGE, url], capture_output=True,
                         text=True, env=env, cwd=str(REPO), timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "RUNNING"]
    # in this process's own namespace the same judge sees it alive too, and a dead one's trial is failed
    out = subprocess.run([sys.executable, "-c", JUDGE, url], capture_output=True, text=True, env=env, cwd=str(REPO),
                         timeout=120, check=False)
    assert out.stdout.split() == ["0", "RUNNING"], out.stderr[-2000:]


def test_a_trial_recorded_by_another_kernel_is_left_to_the_heartbeat_whatever_its_host_name(tmp_path):
    # the same host name and a pid that is dead here, but recorded by another boot of another board
    from edgetune.search.storage import recover_dead_workers, retry_callback, worker_kernel

    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = open_storage(url)
    study = optuna.create_study(study_name="twins", storage=storage)
    space = worker_space()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = f"{socket.gethostname()}:{int(gone.stdout)}"  # this host's name, a process that has ended
    elsewhere, here = (study.ask(space.distributions()) for _ in range(2))
    for trial, kernel in ((elsewhere, "another-boot/pid:[4026531836]"), (here, worker_kernel())):
        records.write_start(trial, space.candidate(trial.params), records.Role.SEARCH, dead, kernel)
    if not worker_kernel():
        pytest.skip("no boot id here (not Linux)")
    assert recover_dead_workers(study, storage, retry_callback(storage)) == 1
    states = {t.number: t.state for t in study.get_trials()}
    assert states[elsewhere.number] == TrialState.RUNNING and states[here.number] == TrialState.FAIL


def test_a_fleet_stops_at_n_trials_counting_the_settings_live_workers_are_measuring(tmp_path):
    # each worker checked the count of measured settings before its next trial, so one that started as another
    # was measuring the last took the fleet one past n_trials (one per extra worker); a live worker's trial
    # counts now, and a dead one's does not
    import torch

    from edgetune.search.storage import live_trials, worker_kernel
    from edgetune.search.study import Search
    from edgetune.search.trial import MeasurementProtocol
    from edgetune.workloads import Workload

    if not worker_kernel():
        pytest.skip("no boot id here (not Linux)")
    wl = Workload.from_model("tiny", torch.nn.Linear(8, 2),
                             lambda b, g: (torch.randn(b, 8, generator=g), torch.randint(0, 2, (b,), generator=g)),
                             default_batch_size=32)
    url = f"sqlite:///{tmp_path / 'fleet.db'}"

    def search(n_trials):
        return Search(open_device("sim:orin-nano", compute=False, seed=1), wl, worker_space(), budget_w=9.0,
                      storage=open_storage(url), study_name="fleet", sampler="random", n_trials=n_trials, seed=1,
                      patience=0, protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=0.3))

    first = search(1)
    assert len(first.run().settings) == 1
    # another worker on this host is measuring a setting (its process lives)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        storage = open_storage(url)
        study = optuna.load_study(study_name="fleet", storage=storage, sampler=optuna.samplers.RandomSampler(seed=3))
        trial = retried = study.ask(worker_space().distributions())
        records.write_start(trial, worker_space().candidate(trial.params), records.Role.SEARCH,
                            f"{socket.gethostname()}:{other.pid}", worker_kernel())
        assert [t.number for t in live_trials(study, storage)] == [trial.number]
        result = search(2).run()
        assert result.stop_reason == "1 setting measured and 1 being measured by other workers"
        assert len(result.settings) == 1
    finally:
        other.kill()
        other.wait()
    # it died mid-trial: its trial is failed and queued again, and counts no more
    assert live_trials(study, storage) == []
    # its setting, queued again, is the one measured next (a baseline probe waits until it is), and at the limit
    # no queued setting is taken in a confirmation's place
    last = search(2).run()
    assert len(last.settings) == 2 and last.stop_reason == "2 settings measured"
    assert retried.params in [t.params for t in study.get_trials(states=(TrialState.COMPLETE,))]
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_a_worker_whose_trial_another_failed_as_stale_drops_its_window_and_goes_on(tmp_path):
    # a board paused (or its database out of reach) past the grace period: another worker fails its trial and
    # queues it again; the paused one's tell then raised UpdateFinishedTrialError, a traceback that ended it
    import torch

    from edgetune.search.storage import fail_and_retry, retry_callback
    from edgetune.search.study import Search
    from edgetune.search.trial import MeasurementProtocol
    from edgetune.workloads import Workload

    url = f"sqlite:///{tmp_path / 'study.db'}"
    other = open_storage(url)  # the other worker's own connection
    failed: list[int] = []

    def on_step(k: int) -> None:
        if k == 1 and not failed and len(search.study.get_trials(deepcopy=False)) == 2:  # the second trial
            study = optuna.load_study(study_name="stale", storage=other)
            running = [t for t in study.get_trials() if t.state == TrialState.RUNNING]
            failed.append(running[0].number)
            assert fail_and_retry(study, running[0].number, retry_callback(other))

    torch.manual_seed(0)
    wl = Workload.from_model("tiny", torch.nn.Linear(8, 2),
                             lambda b, g: (torch.randn(b, 8, generator=g), torch.randint(0, 2, (b,), generator=g)),
                             default_batch_size=32)
    device = open_device("sim:orin-nano", compute=False, seed=1)
    search = Search(device, wl, worker_space(), budget_w=9.0, storage=open_storage(url), study_name="stale",
                    sampler="random", n_trials=5, seed=1, patience=0, confirm_settings=0, soak_s=0,
                    protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=0.3), on_step=on_step)
    result = search.run()
    assert failed
    study = optuna.load_study(study_name="stale", storage=other)
    trials = {t.number: t for t in study.get_trials()}
    assert trials[failed[0]].state == TrialState.FAIL and not records.is_measured(trials[failed[0]])
    retry = [t for t in trials.values() if records.retry_history(t) == failed]
    assert len(retry) == 1 and records.is_measured(retry[0])  # the setting measured once, by its retry
    assert len(measured(study)) == 5 and result.stop_reason == "5 settings measured"
    settings = [tuple(sorted(t.params.items())) for t in measured(study)]
    assert len(settings) == len(set(settings))


def test_ctrl_c_mid_trial_is_no_death_however_often_and_the_setting_is_measured_on_the_resume(tmp_path):
    # each Ctrl-C counted as a dead worker: the third on one setting (the resume measures it first) gave it up
    # for good, never measured, its later proposals told a failure
    import torch

    from edgetune.search.study import Search
    from edgetune.search.trial import MeasurementProtocol
    from edgetune.workloads import Workload

    url = f"sqlite:///{tmp_path / 'study.db'}"
    space = worker_space()
    cand = Candidate(64, (("gpu_freq", space.knob_values["gpu_freq"][0]), ("emc_freq", 2_133_000_000)))
    records.enqueue(optuna.create_study(study_name="ctrl-c", storage=open_storage(url)), space, cand)
    torch.manual_seed(0)
    wl = Workload.from_model("tiny", torch.nn.Linear(8, 2),
                             lambda b, g: (torch.randn(b, 8, generator=g), torch.randint(0, 2, (b,), generator=g)),
                             default_batch_size=32)

    params = space.params(cand)

    def search(interrupt: bool) -> Search:
        def on_step(k: int) -> None:  # Ctrl-C while that setting is measured
            if interrupt and k == 1 and [t for t in s.study.get_trials(states=(TrialState.RUNNING,))
                                         if t.params == params]:
                raise KeyboardInterrupt
        s = Search(open_device("sim:orin-nano", compute=False, seed=1), wl, space, budget_w=9.0,
                   storage=open_storage(url), study_name="ctrl-c", sampler="random", n_trials=8, seed=1,
                   patience=0, confirm_settings=0, soak_s=0, on_step=on_step,
                   protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=0.3))
        return s

    for _ in range(MAX_RETRY + 2):  # more Ctrl-Cs on the one setting than a dying worker is allowed
        with pytest.raises(KeyboardInterrupt):
            search(interrupt=True).run()
    result = search(interrupt=False).run()
    study = optuna.load_study(study_name="ctrl-c", storage=open_storage(url))
    tried = [t for t in study.get_trials() if t.params == params]
    assert [t.state for t in tried] == [TrialState.FAIL] * (MAX_RETRY + 2) + [TrialState.COMPLETE]
    assert records.is_measured(tried[-1]) and not [r for r in result.records if r.given_up]
    assert len(measured(study)) == 8 and not [t for t in study.get_trials() if t.state == TrialState.WAITING]


def test_a_silent_worker_on_another_host_is_failed_by_the_heartbeat_and_retried(tmp_path):
    from edgetune.search.storage import heartbeat, recover_dead_workers, retry_callback

    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_s=1, grace_s=1)
    study = optuna.create_study(study_name="remote", storage=storage)
    space = worker_space()
    with pytest.warns(UserWarning, match="Heartbeat of storage"):  # Optuna's warning for ask-and-tell
        trial = study.ask(space.distributions())
    records.write_start(trial, space.candidate(trial.params), records.Role.SEARCH, "elsewhere:1")
    with heartbeat(storage, study, trial.number):
        pass  # one beat, then silence: the worker died
    time.sleep(2.5)  # more than the 1-s grace period
    # its pid means nothing here (another host): Optuna's heartbeat check fails it, its callback queues it
    assert recover_dead_workers(study, storage, retry_callback(storage)) == 0
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL
    retry = [t for t in trials if records.retry_history(t) == [trial.number]]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING and retry[0].params == trial.params


def test_a_silent_journal_worker_on_another_host_is_failed_after_the_grace_period_and_retried(tmp_path,
                                                                                               monkeypatch):
    # Optuna's journal storage has no heartbeat: a worker that died on another host left its trial RUNNING for
    # ever, and a fleet on a shared journal file never measured that setting. A journal worker now bumps a
    # counter on its trial; another fails the trial once it has seen the counter unchanged for the grace
    # period on its own clock
    from edgetune.search import storage as st

    clock = [1000.0]
    monkeypatch.setattr(st, "_now", lambda: clock[0])
    storage = open_storage(f"journal:{tmp_path / 'fleet.log'}", heartbeat_s=20)
    assert isinstance(storage, st.BeatingJournalStorage) and storage.grace_s == 60
    study = optuna.create_study(study_name="remote", storage=storage)
    space = worker_space()
    silent, beating, old = (study.ask(space.distributions()) for _ in range(3))
    for trial, worker in ((silent, "board-a:11"), (beating, "board-b:12"), (old, "board-c:13")):
        records.write_start(trial, space.candidate(trial.params), records.Role.SEARCH, worker, "other-boot/pid:[1]")
    for trial in (silent, beating):
        with st.heartbeat(storage, study, trial.number):
            pass  # the beat on entry: counter 0
    assert study.get_trials()[0].user_attrs[st.BEAT_ATTR] == 0
    retry = st.retry_callback(storage)
    live = {t.number for t in st.live_trials(study, storage)}
    assert live == {silent.number, beating.number}  # beating: they count towards n_trials; the old one does not
    for step_s in (0.0, 30.0, 29.0):  # 59 s unchanged: within the grace period
        clock[0] += step_s
        storage.set_trial_user_attr(beating._trial_id, st.BEAT_ATTR, int(clock[0]))  # it goes on beating
        st.recover_dead_workers(study, storage, retry)
    assert all(t.state == TrialState.RUNNING for t in study.get_trials()[:3])
    clock[0] += 2.0
    st.recover_dead_workers(study, storage, retry)
    states = [t.state for t in study.get_trials()]
    assert states[:3] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]  # the old one is not judged
    queued = [t for t in study.get_trials() if records.retry_history(t) == [silent.number]]
    assert len(queued) == 1 and queued[0].state == TrialState.WAITING and queued[0].params == silent.params
    assert {t.number for t in st.live_trials(study, storage)} == {beating.number}


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_url_opens_a_study_in_memory(url):
    # an RDB storage's pool opened an empty database per connection: its tables were gone at the first query
    study = optuna.create_study(study_name="mem", storage=open_storage(url))
    study.tell(study.ask(), 1.0)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE]


def test_a_journal_url_naming_another_kind_of_file_or_a_folder_is_one_line_and_the_file_kept(tmp_path):
    from edgetune.search.storage import SearchError

    other = tmp_path / "best.json"
    other.write_text('{\n "batch_size": 16\n}\n')
    for url, problem in ((f"journal:{other}", f"storage journal:{other} is not an Optuna journal file ("),
                         (f"journal:{tmp_path}", f"storage journal:{tmp_path} is a folder, not a journal file")):
        with pytest.raises(SearchError) as err:
            open_storage(url)
        line = str(err.value)
        assert line.startswith(problem) and "server" not in line and len(line.splitlines()) == 1, line
        assert line.endswith("give the journal file an edgetune search wrote, or a new file's path for a new study")
    assert other.read_text() == '{\n "batch_size": 16\n}\n'
