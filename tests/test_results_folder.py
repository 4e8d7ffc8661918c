"""The output folder a fleet shares: each worker writes best.json, trials.csv and the plots under an exclusive
lock on the folder, from the storage as it stands then, so the files are never older than the storage's last
write, nor of two views; a stale lock file blocks nothing (flock locks end with their process)."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import optuna
import pytest

from edgetune.cli import main
from edgetune.search.study import Search

# a fast search (tests/test_cli_search.py): one batch size, one knob, short windows, no thermal soak
FAST = ["--device", "sim:orin-nano", "--workload", "cnn", "--batch-sizes", "8", "--knobs", "gpu_freq",
        "--sampler", "random", "--measure-s", "0.5", "--real-steps", "0", "--soak-s", "0"]


def _storage(tmp_path: Path, kind: str) -> str:
    return f"sqlite:///{tmp_path / 'fleet.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'fleet.log'}"


def _measured_in(storage: str) -> int:
    from edgetune.search.storage import close_storage, open_storage

    opened = open_storage(storage)
    try:
        (summary,) = optuna.get_all_study_summaries(opened)
        trials = optuna.load_study(study_name=summary.study_name, storage=opened).get_trials(deepcopy=False)
        return sum(1 for t in trials if t.user_attrs.get("measured"))
    finally:
        close_storage(opened)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _worker_between(monkeypatch, argv: list[str]) -> None:
    """Make the next search's last read of the storage older than another worker's files: once it has measured
    (its view taken), the worker ``argv`` runs a whole search of the same study and writes the shared folder,
    and only then does the first one go on to write its own results."""
    run = Search.run

    def run_then_another_worker(self):
        result = run(self)  # this worker's view of the study, as it stopped
        monkeypatch.setattr(Search, "run", run)  # the other worker searches as usual
        assert main(argv) == 0
        return result

    monkeypatch.setattr(Search, "run", run_then_another_worker)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_worker_that_read_the_study_before_another_wrote_never_leaves_its_older_view(tmp_path, monkeypatch,
                                                                                       capsys, kind):
    storage = _storage(tmp_path, kind)
    out = tmp_path / "shared"  # the fleet's workers, started with the same flags, write one folder
    fleet = ["search", *FAST, "--budget", "10", "--storage", storage, "-o", str(out)]
    _worker_between(monkeypatch, [*fleet, "--n-trials", "3"])  # the other measures 2 more and writes them
    assert main([*fleet, "--n-trials", "1"]) == 0
    measured = _measured_in(storage)  # windows, each confirmation's included: 5 (the first worker saw 2)
    assert measured == 5
    best = json.loads((out / "best.json").read_text())
    assert best["study"]["trials_measured"] == measured  # the storage as it stands, not the first worker's 1
    assert len(_rows(out / "trials.csv")) == measured  # and trials.csv of the same view
    # the first worker's own stop, and what the others measured after it: not its reason alone beside 5 trials
    assert best["study"]["stop_reason"] == "1 setting measured; then 3 more trials measured by other workers of the study"


def test_a_worker_that_cannot_read_the_study_again_keeps_a_newer_workers_files_and_says_so(tmp_path, monkeypatch,
                                                                                           capsys):
    storage = _storage(tmp_path, "journal")
    out = tmp_path / "shared"
    fleet = ["search", *FAST, "--budget", "10", "--storage", storage, "-o", str(out)]
    run = Search.run

    def run_then_another_worker_then_the_storage_goes(self):
        result = run(self)
        monkeypatch.setattr(Search, "run", run)
        assert main([*fleet, "--n-trials", "3"]) == 0
        capsys.readouterr()  # the other worker's output

        def gone(self, stop_reason=""):
            raise OSError("the storage's disk went away")

        monkeypatch.setattr(Search, "result", gone)
        return result

    monkeypatch.setattr(Search, "run", run_then_another_worker_then_the_storage_goes)
    assert main([*fleet, "--n-trials", "1"]) == 0
    newer = (out / "best.json").read_bytes(), (out / "trials.csv").read_bytes()
    assert json.loads(newer[0])["study"]["trials_measured"] == _measured_in(storage) == 5
    assert len(_rows(out / "trials.csv")) == 5
    said = capsys.readouterr().out
    assert (f"kept the files in {out}: they hold a newer view of study 'sim:orin-nano-cnn-10W-time' (5 trials "
            f"measured, this worker's 2), written by another worker") in said
    assert "wrote " not in said


def test_the_folder_is_locked_while_a_worker_writes_and_its_files_appear_whole(tmp_path, monkeypatch):
    import fcntl

    import edgetune.report
    from edgetune.search.results import FOLDER_LOCK, STAGING

    out = tmp_path / "o"
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "1", "-o", str(out)]) == 0
    before = (out / "best.json").read_bytes()
    draw = edgetune.report.write_plots
    seen = []

    def draw_while_checking(result, folder):
        with open(out / FOLDER_LOCK, "a+b") as f, pytest.raises(BlockingIOError):  # another worker: taken
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        # rendered aside: the folder still holds the last view's best.json while this one's is drawn
        assert Path(folder) == out / STAGING and (out / "best.json").read_bytes() == before
        seen.append(json.loads((Path(folder) / "best.json").read_text())["study"]["trials_measured"])
        return draw(result, folder)

    monkeypatch.setattr(edgetune.report, "write_plots", draw_while_checking)
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 0
    best = json.loads((out / "best.json").read_text())
    assert seen == [best["study"]["trials_measured"]] and len(_rows(out / "trials.csv")) == seen[0]
    assert not (out / STAGING).exists()
    with open(out / FOLDER_LOCK, "a+b") as f:  # and free again once written
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_lock_left_by_a_worker_killed_with_kill_9_blocks_nothing(tmp_path):
    import signal
    import subprocess
    import sys

    from edgetune.search.results import FOLDER_LOCK, STAGING

    out = tmp_path / "o"
    (out / STAGING).mkdir(parents=True)  # killed mid-write: its lock file and half its files are left
    (out / STAGING / "best.json").write_text("{")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        f = open({str(out / FOLDER_LOCK)!r}, "a+b")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "1", "-o", str(out)]) == 0
    assert json.loads((out / "best.json").read_text())["study"]["trials_measured"] == 2
    assert (out / FOLDER_LOCK).exists() and not (out / STAGING).exists()


def test_a_worker_waiting_for_the_lock_says_so_once(tmp_path):
    import fcntl

    from edgetune.search.results import FOLDER_LOCK, folder_lock

    said = []
    with open(tmp_path / FOLDER_LOCK, "a+b") as held:  # another worker writing
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)

        def waiting():
            said.append("waiting")
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)  # the other worker is done: the lock is free

        with folder_lock(tmp_path, waiting), open(tmp_path / FOLDER_LOCK, "a+b") as f, \
                pytest.raises(BlockingIOError):
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert said == ["waiting"]
    with folder_lock(tmp_path, waiting):  # free: no wait, nothing said
        pass
    assert said == ["waiting"]
