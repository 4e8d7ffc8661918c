"""`edgetune search` keeps every result: a folder per study, resume said, damaged storage refused, Ctrl-C and
kill -9 lose nothing; progress readable without a terminal; a search whose every trial fails says why."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import textwrap
import time
import warnings
from pathlib import Path

import optuna
import pytest
import torch
from fakes.terminal import edgetune_argv
from optuna.trial import TrialState

from edgetune.cli import main
from tests.test_cli_run import DROPOUT_WORKLOAD

REPO = Path(__file__).resolve().parents[1]

# a fast search: one batch size, one knob, short windows, the twin times all but the warm-up step, no thermal soak
# (its 360 simulated seconds were half of such a search's CPU time; tests/test_thermal.py tests it)
FAST = ["--device", "sim:orin-nano", "--workload", "cnn", "--batch-sizes", "8", "--knobs", "gpu_freq",
        "--sampler", "random", "--measure-s", "0.5", "--real-steps", "0", "--soak-s", "0"]

# A user workload for the process tests: after HANG_AFTER batches it writes HANG_MARKER and waits to be
# interrupted or killed (a step mid-measurement); with RAISE_IN_STEP set every step raises.
HELPER = textwrap.dedent('''
    import os, time, torch
    from edgetune.workloads import Workload

    def build(seed=0):
        torch.manual_seed(seed)
        calls = [0]

        def make_batch(b, g):
            calls[0] += 1
            if os.environ.get("RAISE_IN_STEP"):
                raise RuntimeError("the data loader broke: no such shard")
            hang = int(os.environ.get("HANG_AFTER", "0"))
            if hang and calls[0] > hang:
                with open(os.environ["HANG_MARKER"], "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(120)
            return torch.randn(b, 8, generator=g), torch.randint(0, 2, (b,), generator=g)

        return Workload.from_model("tiny", torch.nn.Linear(8, 2), make_batch, default_batch_size=8)
''')


@pytest.fixture
def helper(tmp_path, monkeypatch):
    (tmp_path / "helper_wl.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _rows(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("edgetune: error: "), err
    assert not any("Traceback" in line for line in err), err
    return err[-1]


def test_each_study_writes_to_its_own_folder_and_a_resume_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2"]) == 0
    first = tmp_path / "edgetune-out" / "sim-orin-nano-cnn-time-10W"
    before = {name: (first / name).read_bytes() for name in ("best.json", "trials.csv", "time_vs_energy.png",
                                                               "power.png")}
    assert "new study 'sim:orin-nano-cnn-10W-time'" in capsys.readouterr().err
    # the README's second search: another budget and objective, same default output
    assert main(["search", *FAST, "--budget", "12", "--objective", "energy", "--n-trials", "2"]) == 0
    second = tmp_path / "edgetune-out" / "sim-orin-nano-cnn-energy-12W"
    assert json.loads((second / "best.json").read_text())["objective"] == "energy"
    assert {name: (first / name).read_bytes() for name in before} == before  # the first one's files untouched
    capsys.readouterr()
    # the first command again, one trial more: it resumes its own study and says so
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "3"]) == 0
    assert "resuming study 'sim:orin-nano-cnn-10W-time': 2 settings measured" in capsys.readouterr().err
    assert sum(row["role"] != "confirm" for row in _rows(first / "trials.csv")) == 3


def test_a_study_resumed_with_a_smaller_n_trials_says_how_many_it_measured(tmp_path, capsys):
    out = tmp_path / "o"
    args = [*FAST, "--budget", "10", "--confirm", "0", "-o", str(out)]
    assert main(["search", *args, "--n-trials", "3"]) == 0
    capsys.readouterr()
    assert main(["search", *args, "--n-trials", "2"]) == 0
    summary = capsys.readouterr().out
    best = json.loads((out / "best.json").read_text())
    assert best["study"]["settings_measured"] == 3
    assert best["study"]["stop_reason"] == "3 settings measured (the limit, n_trials, is 2)"
    assert "measured 3 of " in summary and "stopped: 3 settings measured (the limit, n_trials, is 2)" in summary
    one = tmp_path / "one"  # one setting is one setting
    assert main(["search", *FAST, "--budget", "10", "--confirm", "0", "-o", str(one), "--n-trials", "1"]) == 0
    assert json.loads((one / "best.json").read_text())["study"]["stop_reason"] == "1 setting measured"
    capsys.readouterr()
    assert main(["search", *FAST, "--budget", "10", "--confirm", "0", "-o", str(one), "--n-trials", "1"]) == 0
    assert "': 1 setting measured; results in" in capsys.readouterr().err


def test_output_flag_is_the_folder_itself(tmp_path, capsys):
    out = tmp_path / "mine"
    assert main(["search", *FAST, "--budget", "12", "--n-trials", "1", "--output", str(out)]) == 0
    assert (out / "best.json").is_file() and (out / "study.db").is_file()
    # every output of a simulated search says so: best.json, and each row of trials.csv
    assert json.loads((out / "best.json").read_text())["simulated"] is True
    assert [row["simulated"] for row in _rows(out / "trials.csv")] == ["True"] * len(_rows(out / "trials.csv")) != []


def test_another_studys_results_in_the_output_folder_are_refused_and_kept(tmp_path, capsys, monkeypatch):
    out = tmp_path / "mine"
    kept = _first_search(out)
    capsys.readouterr()
    # another budget is another study: its results would replace the first one's
    assert main(["search", *FAST, "--budget", "12", "--n-trials", "2", "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert "holds the results of study 'sim:orin-nano-cnn-10W-time'" in line and "another --output" in line
    assert {name: (out / name).read_bytes() for name in kept} == kept
    # the same study resumes and writes its own results again
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 0
    # the same study's name in another storage is another study: its 1 trial would replace the folder's 2
    other = f"sqlite:///{tmp_path / 'other.db'}"
    kept = {name: (out / name).read_bytes() for name in kept}
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "1", "-o", str(out), "--storage", other]) == 2
    line = _one_error_line(capsys)
    assert f"in another storage (sqlite:///{out / 'study.db'})" in line and f"in {other} would write" in line
    assert {name: (out / name).read_bytes() for name in kept} == kept
    # and the folder's own storage, spelt as a relative path, is the same one
    monkeypatch.chdir(out)
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "3", "-o", str(out), "--storage",
                 "sqlite:///study.db"]) == 0
    # a folder moved or copied (from the board to a laptop) resumes on its own study.db
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "4", "-o", str(moved)]) == 0
    assert "resuming study 'sim:orin-nano-cnn-10W-time': 3 settings measured" in capsys.readouterr().err
    # a best.json edgetune cannot read is not written over either
    (out / "best.json").write_text("{not json")
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 2
    assert "a best.json edgetune cannot read" in _one_error_line(capsys)
    assert (out / "best.json").read_text() == "{not json"


def test_a_postgresql_study_whose_url_has_a_password_resumes_into_its_own_folder(tmp_path, capsys, postgres_url):
    # best.json keeps the URL without its password: the same study resumed (or a second worker of a fleet) was
    # refused as "another storage", naming the very URL it was given
    from edgetune.search.storage import open_storage, redact

    url = postgres_url
    assert redact(url) != url  # a URL with a password, as .ci/run's
    name = f"pw-{os.getpid()}-{time.monotonic_ns()}"
    args = ["search", *FAST, "--budget", "10", "--storage", url, "--study-name", name, "-o", str(tmp_path / "o")]
    try:
        assert main([*args, "--n-trials", "1"]) == 0
        assert json.loads((tmp_path / "o" / "best.json").read_text())["study"]["storage"] == redact(url)
        capsys.readouterr()
        assert main([*args, "--n-trials", "2"]) == 0
        assert f"resuming study '{name}': 1 setting measured" in capsys.readouterr().err
        assert json.loads((tmp_path / "o" / "best.json").read_text())["study"]["settings_measured"] == 2
        # refused for another budget: the --prior it suggests shows *** for the password, and says so (a URL with
        # *** pasted as it stood failed to log in)
        assert main([*args, "--budget", "12", "--n-trials", "3"]) == 2
        line = _one_error_line(capsys)
        assert f"(--prior '{redact(url)}#{name}', with the password in place of *** starts it" in line
        assert url not in line
    finally:
        storage = open_storage(url)
        if name in optuna.get_all_study_names(storage):
            optuna.delete_study(study_name=name, storage=storage)
        storage.engine.dispose()


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_an_in_memory_storage_is_refused_in_one_line_before_anything_is_measured(tmp_path, capsys, url):
    # it would end with the process: the same command again would start over and write over best.json
    out = tmp_path / "mem"
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "1", "-o", str(out), "--storage", url]) == 2
    line = _one_error_line(capsys)
    assert f"--storage {url} is an in-memory database" in line and "sqlite:///PATH or journal:PATH" in line
    assert not out.exists()


@pytest.mark.parametrize("name", ["trials.csv", "power.png"])
def test_a_file_of_a_results_name_without_a_best_json_is_refused_and_kept(tmp_path, capsys, name):
    # a search writes best.json first: a trials.csv or a plot without one is someone else's file
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("my own measurements\n")
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "1", "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"{out / name} is not an edgetune search's result (no best.json beside it)" in line
    assert f"pass another --output, or move {name} away" in line
    assert sorted(p.name for p in out.iterdir()) == [name] and (out / name).read_text() == "my own measurements\n"


def test_a_fleet_worker_with_another_budget_is_refused_naming_the_values_and_a_way_that_starts_anew(tmp_path, capsys):
    # with a --storage of its own another --output opens the same study again: only a study name starts anew
    fleet = ["search", *FAST, "--n-trials", "1", "--storage", f"journal:{tmp_path / 'fleet.log'}", "--study-name", "f"]
    assert main([*fleet, "--budget", "10", "-o", str(tmp_path / "w1")]) == 0
    capsys.readouterr()
    assert main([*fleet, "--budget", "12", "-o", str(tmp_path / "w2")]) == 2
    line = _one_error_line(capsys)
    assert "study 'f' in journal:" in line and "was made with --budget 10 (not 12); use another --study-name and " \
        "--output to start anew" in line
    assert main([*fleet, "--budget", "12", "--study-name", "g", "-o", str(tmp_path / "w2")]) == 0
    # the default storage lives in the --output folder: another one starts anew
    own = ["search", *FAST, "--n-trials", "1", "--budget", "10", "-o", str(tmp_path / "w3")]
    assert main(own) == 0
    capsys.readouterr()
    assert main([*own, "--knobs", "gpu_freq,emc_freq"]) == 2
    line = _one_error_line(capsys)
    # named by what differs: the line said "another --batch-sizes, --knobs or space.values", not which
    assert re.search(r"was made with --knobs [a-z_,]+ \(not gpu_freq,emc_freq\); use another --output to start anew",
                     line), line
    assert main([*own, "--batch-sizes", "8,16"]) == 2
    line = _one_error_line(capsys)
    assert "was made with --batch-sizes 8 (not 8,16); use another --output to start anew" in line


def test_a_resume_or_fleet_worker_with_another_measurement_protocol_is_refused_naming_the_flags(tmp_path, capsys):
    # FAST measures windows of >= 0.5 s: a resume with 1-s windows would rank and certify windows of two lengths
    own = ["search", *FAST, "--budget", "10", "-o", str(tmp_path / "w1")]
    assert main([*own, "--n-trials", "1"]) == 0
    capsys.readouterr()
    assert main([*own, "--n-trials", "2", "--measure-s", "1"]) == 2
    line = _one_error_line(capsys)
    assert "measured its settings with --measure-s 0.5 (not 1): its windows and this search's would be compared " \
        "as one; resume it with --measure-s 0.5, or start anew with another --output (--prior " in line
    assert main([*own, "--n-trials", "2", "--warmup-steps", "2", "--measure-steps", "3"]) == 2
    assert "with --measure-steps 5 (not 3) and --warmup-steps 1 (not 2): " in _one_error_line(capsys)
    # the same protocol resumes; so do another seed, confirmation, soak and real steps: they change no stored window
    assert main([*own, "--n-trials", "2", "--seed", "1", "--confirm", "0", "--soak-s", "5", "--real-steps", "1"]) == 0
    assert "resuming study" in capsys.readouterr().err
    # a fleet worker with another warm-up: another study name starts anew
    fleet = ["search", *FAST, "--n-trials", "1", "--budget", "10", "--storage", f"journal:{tmp_path / 'fleet.log'}",
             "--study-name", "f"]
    assert main([*fleet, "-o", str(tmp_path / "f1")]) == 0
    capsys.readouterr()
    assert main([*fleet, "--warmup-steps", "0", "-o", str(tmp_path / "f2")]) == 2
    assert "measured its settings with --warmup-steps 1 (not 0): its windows and this search's would be compared " \
        "as one; resume it with --warmup-steps 1, or start anew with another --study-name and --output" \
        in _one_error_line(capsys)


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_a_study_made_before_the_protocol_was_kept_resumes_and_records_this_searchs(tmp_path, capsys, storage):
    out = tmp_path / "out"
    given = [] if storage == "sqlite" else ["--storage", f"journal:{tmp_path / 'j.log'}"]
    args = ["search", *FAST, "--budget", "10", *given, "-o", str(out)]
    assert main([*args, "--n-trials", "1"]) == 0
    capsys.readouterr()
    # its identity as edgetune wrote it before the protocol was kept
    url = f"sqlite:///{out / 'study.db'}" if storage == "sqlite" else None
    opened = (optuna.storages.RDBStorage(url) if url else
              optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "j.log"))))
    study = optuna.load_study(study_name=optuna.get_all_study_names(opened)[0], storage=opened)
    old = {k: v for k, v in study.user_attrs["identity"].items()
           if k not in ("warmup_steps", "measure_steps", "measure_s")}
    assert old != study.user_attrs["identity"]
    study.set_user_attr("identity", old)
    if url:
        opened.engine.dispose()
    # its windows' protocol is unknown: the resume's is taken for it, said, and recorded
    assert main([*args, "--n-trials", "2", "--measure-s", "1"]) == 0
    err = capsys.readouterr().err
    assert "recorded no measurement protocol (made before edgetune kept it): its measurements are taken as made " \
        "with --warmup-steps 1, --measure-steps 5, --measure-s 1, which it records from now on" in err
    # ... so that the next resume with another protocol is refused
    assert main([*args, "--n-trials", "3"]) == 2
    assert "measured its settings with --measure-s 1 (not 0.5)" in _one_error_line(capsys)
    assert main([*args, "--n-trials", "3", "--measure-s", "1"]) == 0
    assert "recorded no measurement protocol" not in capsys.readouterr().err


def _first_search(out: Path) -> dict[str, bytes]:
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 0
    # the search closed its storage: the write-ahead log is folded into study.db, not left for the garbage
    # collector to write into whatever file lies there later
    assert not (out / "study.db-wal").exists()
    return {name: (out / name).read_bytes() for name in ("best.json", "trials.csv")}


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` not writable by this process while the block runs: its mode (root ignores it: the immutable
    attribute then, where the file system has one)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(folder)], check=False, capture_output=True).returncode:
        pytest.skip("root, and no immutable attribute here to make a folder read-only")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)


def test_a_study_in_a_folder_this_user_cannot_write_is_not_called_damaged(tmp_path, capsys):
    # SQLite reads a write-ahead-logged study with a -shm file beside it: in a folder it cannot write (another
    # user's results, a read-only share) it cannot open the file, which was reported as "damaged ... move it
    # away to start a new study, or put back a good copy", as --storage and as --prior alike
    from edgetune.search.prior import PriorError, load_prior

    out = tmp_path / "theirs"
    kept = _first_search(out)
    kept["study.db"] = (out / "study.db").read_bytes()
    with _read_only(out):
        assert main(["search", *FAST, "--budget", "10", "--n-trials", "3", "-o", str(out)]) == 2
        line = _one_error_line(capsys)
        assert f"SQLite cannot open storage {out / 'study.db'} here (unable to open database file)" in line
        assert f"its folder {out} must be writable by this user; nothing was written" in line
        assert "damaged" not in line and "start a new study" not in line
        with pytest.raises(PriorError) as err:
            load_prior(str(out))
        assert str(err.value).endswith("must be writable by this user; run as a user who may write there, or copy "
                                       "the folder somewhere writable and give that"), str(err.value)
        assert "damaged" not in str(err.value)
    assert {name: (out / name).read_bytes() for name in kept} == kept


@pytest.mark.parametrize(("revision", "fix"), [
    ("v3.0.0.d", "back it up, then upgrade it: optuna storage upgrade --storage 'sqlite:///{db}'"),  # an older Optuna's
    ("v99.0.0.a", "update Optuna: pip install -U optuna"),  # a newer one's
])
def test_a_study_file_of_another_optuna_schema_says_how_to_upgrade_it(tmp_path, capsys, revision, fix):
    # Optuna's line ended in "check the URL, that the server runs and accepts this user": no fix for a file
    import sqlite3

    from edgetune.search.prior import PriorError, load_prior

    out = tmp_path / "o"
    _first_search(out)
    with contextlib.closing(sqlite3.connect(out / "study.db")) as db:
        db.execute("UPDATE alembic_version SET version_num = ?", (revision,))  # as that Optuna left its tables
        db.commit()
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "3", "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"storage sqlite:///{out / 'study.db'}'s tables are in another schema than this Optuna" in line
    assert line.endswith(fix.format(db=out / "study.db")) and "server" not in line
    with pytest.raises(PriorError, match="tables are in another schema") as err:
        load_prior(str(out))
    assert str(err.value).endswith(fix.format(db=out / "study.db"))


def test_an_empty_study_file_is_refused_and_nothing_overwritten(tmp_path, capsys):
    out = tmp_path / "o"
    kept = _first_search(out)
    (out / "study.db").write_bytes(b"")  # truncated: SQLite would take it for a new, empty study
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert "is empty (0 bytes)" in line and "nothing was written" in line
    assert {name: (out / name).read_bytes() for name in kept} == kept
    assert (out / "study.db").stat().st_size == 0


def test_a_study_file_damaged_mid_file_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    kept = _first_search(out)
    db = out / "study.db"
    import sqlite3

    with sqlite3.connect(db) as con:  # fold the write-ahead log into the file, then damage its middle
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    middle = len(data) // 2 // 4096 * 4096
    data[middle:middle + 4096] = b"\xff" * 4096
    db.write_bytes(bytes(data))
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 2
    line = _one_error_line(capsys)
    assert "is damaged" in line and str(db) in line
    assert {name: (out / name).read_bytes() for name in kept} == kept


def _spawn(helper: Path, out: Path, marker: Path, hang_after: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{helper}", HANG_AFTER=str(hang_after),
               HANG_MARKER=str(marker))
    # `python -m edgetune search`, with Ctrl-C delivered as in a terminal (fakes/terminal.py)
    argv = [*edgetune_argv("search"), *FAST, "--workload", "helper_wl:build", "--budget", "10",
            "--batch-sizes", "8,16", "--knobs", "gpu_freq", "--n-trials", "6", "--warmup-steps", "1",
            "--real-steps", "1", "--b-noise", "256", "-o", str(out)]  # a B_noise given: the steps are the trials'
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(marker: Path, proc: subprocess.Popen, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker never reached the step it hangs in"
        time.sleep(0.05)


@pytest.mark.parametrize(("signum", "code", "line", "reason"), [
    (signal.SIGINT, 130, "edgetune: interrupted: ", "interrupted (Ctrl-C)"),
    # systemctl stop, docker stop or a scheduler's time limit: the worker died of the signal (143) with no line
    # and no best.json of the trials it had measured
    (signal.SIGTERM, 143, "edgetune: terminated (SIGTERM): ", "terminated (SIGTERM)"),
])
def test_a_stop_writes_what_was_measured_and_says_how_to_resume(helper, tmp_path, signum, code, line, reason):
    out, marker = tmp_path / "o", tmp_path / "hanging"
    proc = _spawn(helper, out, marker, hang_after=8)
    _wait_for(marker, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(line) and "run the same command again to resume" in last
    assert "Traceback" not in err
    rows = _rows(out / "trials.csv")
    best = json.loads((out / "best.json").read_text())
    assert rows and best["study"]["trials_measured"] == len(rows)
    assert best["study"]["stop_reason"] == reason
    from edgetune.search import records

    # the stopped trial is failed and its setting queued again, counted as no worker's death
    study = optuna.load_study(study_name=best["study"]["name"], storage=f"sqlite:///{out / 'study.db'}")
    assert any(t.state == optuna.trial.TrialState.FAIL for t in study.trials)
    assert not records.given_up(study.trials)
    assert any(t.state == optuna.trial.TrialState.WAITING for t in study.trials)


def test_ctrl_c_on_a_resumed_study_redraws_the_plots_of_what_it_wrote(tmp_path, monkeypatch, capsys):
    """The plots of the run before must not stay beside a best.json that no longer names their pick."""
    from edgetune.search.study import Search

    out = tmp_path / "o"
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "1", "-o", str(out)]) == 0
    plots = ("time_vs_energy.png", "power.png")
    before = {name: (out / name).read_bytes() for name in plots}
    run = Search.run

    def run_then_ctrl_c(self):
        run(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(Search, "run", run_then_ctrl_c)
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(out)]) == 130
    assert "power.png" in capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads((out / "best.json").read_text())["study"]["settings_measured"] == 2
    assert all((out / name).read_bytes() != before[name] for name in plots)  # drawn again, with both trials


def test_a_trial_killed_with_kill_9_is_failed_and_queued_again_on_resume(helper, tmp_path, capsys):
    out, marker = tmp_path / "o", tmp_path / "hanging"
    proc = _spawn(helper, out, marker, hang_after=8)
    _wait_for(marker, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    url = f"sqlite:///{out / 'study.db'}"
    name = optuna.get_all_study_names(url)[0]
    running = [t.number for t in optuna.load_study(study_name=name, storage=url).trials
               if t.state == TrialState.RUNNING]
    assert len(running) == 1  # the killed worker's trial, left RUNNING
    assert main(["search", *FAST, "--workload", "helper_wl:build", "--budget", "10", "--batch-sizes", "8,16",
                 "--knobs", "gpu_freq", "--n-trials", "6", "--warmup-steps", "1", "--real-steps", "1",
                 "--b-noise", "256", "-o", str(out)]) == 0
    assert "resuming study" in capsys.readouterr().err
    trials = {t.number: t for t in optuna.load_study(study_name=name, storage=url).trials}
    assert trials[running[0]].state == TrialState.FAIL
    assert not any(t.state == TrialState.RUNNING for t in trials.values())
    killed = trials[running[0]].params
    # the killed setting was measured again by the resume (Optuna's retry of a stale trial)
    assert any(t.params == killed and t.state == TrialState.COMPLETE for t in trials.values())


def test_progress_is_one_line_per_trial_without_a_terminal(tmp_path, capsys):
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "2", "-o", str(tmp_path / "o")]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("edgetune: trial ")]
    first = [ln for ln in lines if "(measured again before the pick)" not in ln]
    assert [ln.split(":")[1].split()[1] for ln in first] == ["1/2", "2/2"]
    assert all(ln.split(":")[1].split()[1] == "2/2" for ln in lines[2:])  # contenders again: no new setting
    for ln in lines:
        assert "batch 8, gpu_freq " in ln and " ms, " in ln
        # --measure-s 0.5: each window is judged on its mean, over its own span, not a 1-s average
        assert re.search(r" W avg of 0\.5\d* s \(shorter than the 1-s window\)| W avg of [\d.]+ s \(stopped early\)", ln)
        assert ("within budget" in ln or "over budget" in ln) and ("best so far #" in ln or "none within" in ln)
    assert main(["search", *FAST, "--budget", "10", "--n-trials", "3", "-o", str(tmp_path / "o"), "--quiet"]) == 0
    assert "edgetune: trial" not in capsys.readouterr().err


def test_every_trial_out_of_memory_names_the_cause_not_the_budget(tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no matplotlib warning leaks out of the plots of an empty search
        code = main(["search", *FAST, "--budget", "10", "--batch-sizes", "400000,800000", "--n-trials", "2",
                     "-o", str(tmp_path / "o")])
    assert code == 2
    line = _one_error_line(capsys)
    # the baseline's batch size, the smaller, ran out: so does the larger, told without a measurement
    assert "the 1 measured setting failed" in line and "1 of 1 out of memory" in line
    assert "first error (trial #0" in line and "smaller batch sizes" in line and "budget of" not in line
    assert (tmp_path / "o" / "trials.csv").is_file()


def test_every_trial_raising_names_the_first_error(helper, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAISE_IN_STEP", "1")
    # the cost of a user workload is measured from one real step: that step raises before the search starts
    code = main(["search", *FAST, "--workload", "helper_wl:build", "--budget", "10", "--n-trials", "2",
                 "-o", str(tmp_path / "o")])
    assert code == 2
    line = _one_error_line(capsys)
    assert "the data loader broke: no such shard" in line


BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary"


@pytest.mark.parametrize(("argv", "message"), [
    (["search", "--config", "{file}", "--budget", "10"], "is not a text TOML file (byte 0 is not UTF-8)"),
    (["search", "--device", "trace:{file}", "--budget", "10"], "is not a text CSV file"),
    (["predict-eval", "{file}"], "is not a text CSV file"),
])
def test_a_binary_config_or_table_is_one_line_exit_2(tmp_path, capsys, argv, message):
    binary = tmp_path / "binary.bin"
    binary.write_bytes(BINARY)
    assert main([a.replace("{file}", str(binary)) for a in argv]) == 2
    line = _one_error_line(capsys)
    assert message in line and str(binary) in line


def test_a_config_value_in_a_unit_of_another_quantity_is_named_as_run_names_it(tmp_path, capsys):
    config = tmp_path / "w.toml"
    config.write_text('device = "sim:orin-nano"\npower_budget_w = 10.0\n[space]\nvalues = { gpu_freq = ["306W"] }\n')
    assert main(["search", "--config", str(config), "-o", str(tmp_path / "o")]) == 2
    line = _one_error_line(capsys)
    assert "space.values: gpu_freq = '306W': gpu_freq is set in Hz, not W" in line and "306 Hz" not in line
    assert main(["run", "--device", "sim:orin-nano", "--set", "gpu_freq=306W"]) == 2
    assert line.partition(": gpu_freq is set")[2] == _one_error_line(capsys).partition(": gpu_freq is set")[2]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("given", ["--output", "file"])
def test_an_output_folder_that_is_a_file_is_refused_naming_the_fix_and_kept(tmp_path, capsys, given):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    config = tmp_path / "c.toml"
    config.write_text(f'output = "{mine}"\n')  # the file's output: a folder per study below it
    argv = ["-o", str(mine)] if given == "--output" else ["--config", str(config)]
    assert main(["search", *FAST, "--budget", "10", *argv]) == 2
    src = "--output" if given == "--output" else f"{config}: output"
    assert _one_error_line(capsys) == (f"edgetune: error: {src} {mine} is a file, not a folder; give a folder for "
                                       f"the study's results, or move the file away")
    assert mine.read_text() == "mine"


def test_a_key_the_search_does_not_use_is_named_in_a_note_not_ignored(tmp_path, capsys):
    """A value the user set that this search has no use for (eta without the cost objective, known_convergence
    off a trace, b_noise_warmups where B_noise is not measured) says so; init's file, every default, says nothing."""
    from edgetune.config import example_config

    config = tmp_path / "c.toml"
    config.write_text(example_config().replace("eta = 0.5", "eta = 0.3"))  # init's file with one key changed
    assert main(["search", *FAST, "--config", str(config), "--n-trials", "1", "--known-convergence",
                 "--b-noise-warmups", "2", "-q", "-o", str(tmp_path / "o")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "is not used" in line]
    assert notes == [
        (f"note: {config}: search.eta 0.3 is not used: it weighs energy in the cost objective, and the objective "
         f"is time"),
        "note: --known-convergence is not used: it is for a trace:<table.csv> device's table of epochs to target",
        ('note: --b-noise-warmups 2 is not used: B_noise is not measured here (it is with efficiency.b_noise = '
         '"measure", or for a workload without one)'),
    ]


def test_a_protocol_the_measurement_refuses_is_one_line_exit_2(tmp_path, capsys):
    assert main(["search", *FAST, "--budget", "10", "--measure-steps", "1000000", "-o", str(tmp_path / "o")]) == 2
    assert "--measure-steps) 1000000 is more steps than one measured window holds; use at most 100000" in \
        _one_error_line(capsys)


def test_best_json_labels_every_knob_value_and_the_runtime_reads_old_and_new_plans(tmp_path):
    from edgetune.runtime import load_plan

    out = tmp_path / "o"
    # 4 trials: the baseline probes the GPU clock from the lowest up and needs them all to be found
    assert main(["search", *FAST, "--budget", "12", "--n-trials", "4", "--knobs", "gpu_freq,cpu_freq",
                 "-o", str(out)]) == 0
    best = json.loads((out / "best.json").read_text())
    gpu, cpu = best["setting"]["gpu_freq"], best["setting"]["cpu_freq"]
    assert gpu["unit"] == "Hz" and gpu["text"] == f"{gpu['value'] / 1e6:g} MHz"
    assert cpu["unit"] == "kHz" and cpu["text"].endswith("Hz") and cpu["value"] < 1e7  # kHz, labelled so
    assert best["baseline"]["setting"]["gpu_freq"]["unit"] == "Hz"
    assert best["workload_cost"]["param_bytes"] > 0 and best["workload_cost"]["flops_per_sample"] > 0
    plan = load_plan(out / "best.json")
    assert plan.setting == {"gpu_freq": gpu["value"], "cpu_freq": cpu["value"]} and plan.workload == "cnn"
    old = tmp_path / "old.json"  # best.json as edgetune wrote it before the units
    old.write_text(json.dumps({"batch_size": 8, "budget_w": 10, "setting": {"gpu_freq": 510000000}}))
    assert load_plan(old).setting == {"gpu_freq": 510000000} and load_plan(old).workload_cost is None


def test_a_plan_applied_to_another_model_is_warned_about(tmp_path, caplog):
    import torch

    import edgetune
    from edgetune.workloads import load_workload

    out = tmp_path / "o"
    assert main(["search", *FAST, "--budget", "12", "--n-trials", "1", "-o", str(out)]) == 0
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    other = torch.nn.Linear(8, 2)
    with caplog.at_level("WARNING", logger="edgetune"), edgetune.tune(
            other, torch.optim.SGD(other.parameters(), lr=0.1), dataset=data, budget_w=12, device="sim:orin-nano",
            plan=out / "best.json", print_summary=False) as tuner:
        pass
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("was searched for another model (cnn): parameter bytes" in w for w in warned), warned
    assert any("was searched for another model" in text for _, text in tuner.events)
    caplog.clear()
    cnn = load_workload("cnn").model  # the plan's own model: no word
    with caplog.at_level("WARNING", logger="edgetune"), edgetune.tune(
            cnn, torch.optim.SGD(cnn.parameters(), lr=0.1), dataset=data, budget_w=12, device="sim:orin-nano",
            plan=out / "best.json", print_summary=False):
        pass
    assert not [r for r in caplog.records if "another model" in r.getMessage()]


def test_a_baseline_out_of_memory_names_the_batch_it_tried(tmp_path, capsys):
    # the baseline runs the space's batch size nearest the workload's default (cnn: 128), here 16384, not the
    # default itself: the summary said "default batch out of memory"
    args = [*FAST[:4], "--batch-sizes", "1,16384", *FAST[6:], "--budget", "10", "--n-trials", "4"]
    assert main(["search", *args, "-o", str(tmp_path / "o")]) == 0
    baseline = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("baseline"))
    assert "none (its batch size 16384 out of memory)" in baseline


def test_one_seed_measures_a_dropout_models_b_noise_alike(tmp_path, capsys):
    # the B_noise warm-ups train a model whose dropout masks come from torch's global generator: unseeded,
    # two searches of one --seed measured two B_noise values, and could pick two batch sizes
    path = tmp_path / "dropout.py"
    path.write_text(DROPOUT_WORKLOAD)
    measured = []
    for run in range(2):
        torch.rand(7)  # whatever the process drew before
        out = tmp_path / f"out{run}"
        assert main(["search", "--device", "sim:orin-nano", "--workload", f"{path}:build", "--budget", "8",
                     "--n-trials", "2", "--soak-s", "0", "--b-noise-warmups", "2", "--output", str(out)]) == 0
        measured.append(json.loads((out / "best.json").read_text())["target_model"]["b_noise"])
    capsys.readouterr()
    assert measured[0] == measured[1]
