"""The output folder a fleet shares: each worker writes best.json, trials.csv and the plots under an exclusive
lock on the folder, from the storage as it stands then, so the files are never older than the storage's last
write, nor of two views; a stale lock file blocks nothing (flock locks end with their process)."""

from __future__ import annotations

import csv
import json
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
