"""Safe restore: state file, signal handlers, recovery after kill -9, corrupt files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes.jetson_tree import build_jetson

from edgetune.power import jetson, state

REPO = Path(__file__).resolve().parents[1]

# A run that changes knobs through the public API and then waits to be killed.
CHANGER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
from edgetune.power import open_device
device = open_device("jetson", detect_period_s=0)
device.apply({"gpu_freq": "408MHz", "cpu_cores": 2, "cpu_freq": "729.6MHz", "power_mode": "MODE_15W_2CORE"})
print("changed", flush=True)
time.sleep(60)
"""


@pytest.fixture
def board(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    # a Xavier NX: its power modes share one GPU power-gating mask, so they switch without a reboot
    return build_jetson(tmp_path / "root", "xavier-nx")


def _env(fake, tmp_path):
    env = dict(os.environ, EDGETUNE_SYSFS_ROOT=str(fake.root), EDGETUNE_STATE_DIR=str(tmp_path / "state"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _start_changer(fake, tmp_path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHANGER], env=_env(fake, tmp_path), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "changed", proc.stderr.read()
    return proc


def _state_files(tmp_path) -> list[Path]:
    return sorted((tmp_path / "state").glob("*.json"))


# ------------------------------------------------------------------------------------------ processes


def test_sigterm_restores_before_dying(board, tmp_path):
    before = board.knob_state()
    proc = _start_changer(board, tmp_path)
    assert board.knob_state() != before and len(_state_files(tmp_path)) == 1
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # still dies of the signal, as without edgetune
    assert "SIGTERM: restored" in err
    assert board.knob_state() == before
    assert not _state_files(tmp_path)


def test_sigterm_says_what_it_could_not_restore_before_dying(board, tmp_path):
    """A knob file gone when SIGTERM comes: nothing else reports the handler's restore, so it says which knob
    was not restored and the state file that keeps it, and the process still dies of the signal."""
    proc = _start_changer(board, tmp_path)
    (board.gpu / "min_freq").unlink()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    line = next(x for x in err.splitlines() if "SIGTERM: not restored" in x)
    assert "gpu_freq: cannot read" in line and "run `edgetune restore` once the board is back" in line
    assert len(_state_files(tmp_path)) == 1


def test_sigint_restores(board, tmp_path):
    before = board.knob_state()
    proc = _start_changer(board, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "SIGINT: restored" in err and "KeyboardInterrupt" in err  # chained to Python's handler
    assert board.knob_state() == before


# A run that restores in its own ``finally`` (as `edgetune search` and ``tune()`` do) and reports a failure.
RESTORING_CHANGER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from edgetune.power import open_device
from edgetune.power.base import DeviceError
device = open_device("jetson", detect_period_s=0)
try:
    device.apply({"gpu_freq": "408MHz"})
    print("changed", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
finally:
    if sys.argv[1] == "restores":
        try:
            device.restore()
        except DeviceError as exc:
            print(f"run: {exc}", file=sys.stderr)
"""


@pytest.mark.parametrize("run", ["restores", "swallows"])
def test_sigint_failing_restore_is_said_once(board, tmp_path, run):
    """Ctrl-C with a knob file gone: the KeyboardInterrupt unwinds the run through its own restore, which raises
    the failure to the user; the signal handler does not say it first. A run that swallows the interrupt and
    restores nothing still hears it, from the exit hook."""
    proc = subprocess.Popen([sys.executable, "-c", RESTORING_CHANGER, run], env=_env(board, tmp_path), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "changed", proc.stderr.read()
    (board.gpu / "min_freq").unlink()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    said = [line for line in err.splitlines() if "not restored on jetson: gpu_freq: cannot read" in line]
    assert len(said) == 1, err
    assert said[0].startswith("run: " if run == "restores" else "exit: ") and "interrupted" in err
    assert len(_state_files(tmp_path)) == 1  # kept for `edgetune restore`


@pytest.mark.parametrize("command", [["restore"], ["devices"]])
def test_kill_9_is_recovered_by_next_start(board, tmp_path, command):
    before = board.knob_state()
    proc = _start_changer(board, tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    assert board.knob_state() != before  # nothing could run
    assert len(_state_files(tmp_path)) == 1
    done = subprocess.run([sys.executable, "-m", "edgetune", *command], env=_env(board, tmp_path), cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "restored" in said and "interrupted edgetune run" in said and "power_mode=MODE_10W_DESKTOP" in said
    # the GPU's devfreq range was put back, not the clock it ran at when the run changed it (114.75 MHz)
    assert "gpu_freq 114.75 MHz..1.10925 GHz (the governor's range)" in said and "gpu_freq=" not in said
    assert board.knob_state() == before
    assert not _state_files(tmp_path)


# ------------------------------------------------------------------------------------------ in-process


def test_signal_handlers_chain_and_are_removed(board):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        before = board.knob_state()
        device = jetson.open(root=board.root, detect_period_s=0)
        assert signal.getsignal(signal.SIGTERM) is not state._handler  # none while nothing is changed
        device.knobs["gpu_freq"].set(408_000_000)
        assert signal.getsignal(signal.SIGTERM) is state._handler
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == [signal.SIGTERM]  # the handler found before was called after the restore
        assert board.knob_state() == before
        assert signal.getsignal(signal.SIGTERM) is not state._handler
        device.knobs["cpu_cores"].set(3)
        device.restore()
        assert signal.getsignal(signal.SIGTERM) is not state._handler  # removed once all is restored
        assert board.knob_state() == before
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_exception_inside_restoring_restores(board):
    before = board.knob_state()
    device = jetson.open(root=board.root, detect_period_s=0)
    with pytest.raises(RuntimeError), device.restoring():
        device.apply({"gpu_freq": 510_000_000, "emc_freq": 665_600_000})
        raise RuntimeError("training diverged")
    assert board.knob_state() == before


def test_close_restores(board):
    before = board.knob_state()
    device = jetson.open(root=board.root, detect_period_s=0)
    device.apply({"gpu_freq": 510_000_000})
    device.close()
    assert board.knob_state() == before


def _leave_state_behind(board, tmp_path) -> Path:
    """Change knobs in a process that is then killed, leaving its state file."""
    proc = _start_changer(board, tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    (path,) = _state_files(tmp_path)
    return path


def test_corrupt_state_file_is_reported_not_trusted(board, tmp_path):
    path = _leave_state_behind(board, tmp_path)
    changed = board.knob_state()
    path.write_text(path.read_text()[:-40])  # a torn write
    lines = state.recover(report=lambda line: None)
    assert len(lines) == 1 and "unreadable" in lines[0] and "not used" in lines[0]
    assert board.knob_state() == changed  # nothing applied from it
    assert not _state_files(tmp_path) and list((tmp_path / "state").glob("*.corrupt-*"))


def test_edited_state_file_fails_checksum(board, tmp_path):
    path = _leave_state_behind(board, tmp_path)
    data = json.loads(path.read_text())
    data["knobs"]["gpu_freq"]["snapshot"]["max"] = 9_999_999_999
    path.write_text(json.dumps(data))
    (line,) = state.recover(report=lambda line: None)
    assert "fails its checksum" in line


def test_values_the_device_rejects_are_not_applied(board, tmp_path):
    path = _leave_state_behind(board, tmp_path)
    data = json.loads(path.read_text())
    data.pop("sha256")
    data["knobs"]["gpu_freq"]["snapshot"] = {"min": 700_000_000, "max": 9_999_999_999}
    state._atomic_write_json(path, data)  # well-formed, but the values are not this GPU's
    lines = state.recover(report=lambda line: None)
    assert any("incomplete" in line and "gpu_freq" in line and "not accepted" in line for line in lines)
    assert int((board.gpu / "max_freq").read_text()) != 9_999_999_999
    assert path.exists()  # kept for the user to look at


def test_state_from_before_a_reboot_is_dropped(board, tmp_path):
    path = _leave_state_behind(board, tmp_path)
    (board.root / "proc/sys/kernel/random/boot_id").chmod(0o644)
    (board.root / "proc/sys/kernel/random/boot_id").write_text("00000000-new-boot\n")
    (line,) = state.recover(report=lambda line: None)
    assert "before the last reboot" in line and not path.exists()


def test_live_run_state_is_left_alone(board, tmp_path):
    proc = _start_changer(board, tmp_path)
    try:
        assert state.recover(report=lambda line: None) == []
        assert len(_state_files(tmp_path)) == 1
        device = jetson.open(root=board.root, detect_period_s=0)
        with pytest.raises(jetson.KnobWriteError, match=r"another edgetune run \(pid \d+\)"):
            device.knobs["gpu_freq"].set(510_000_000)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


def test_new_run_restores_leftover_before_recording(board, tmp_path):
    before = board.knob_state()
    _leave_state_behind(board, tmp_path)
    device = jetson.open(root=board.root, detect_period_s=0)
    device.knobs["gpu_freq"].set(510_000_000)  # must not record the killed run's 408 MHz as "original"
    device.restore()
    assert board.knob_state() == before


def test_state_dir_defaults_to_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("EDGETUNE_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state.state_dir() == tmp_path / "xdg" / "edgetune"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state.state_dir() == Path.home() / ".local" / "state" / "edgetune"


def test_state_file_is_written_atomically(board, tmp_path):
    device = jetson.open(root=board.root, detect_period_s=0)
    device.knobs["gpu_freq"].set(510_000_000)
    (path,) = _state_files(tmp_path)
    data = state.load_state(path)
    assert data["device"]["root"] == str(board.root.resolve()) and data["device"]["spec"] == "jetson"
    assert data["knobs"]["gpu_freq"]["snapshot"] == {"min": 114_750_000, "max": 1_109_250_000}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left
    t = time.time()
    device.restore()
    assert not path.exists() and time.time() - t < 1


# ------------------------------------------------------------------------------------------ restore exit status


def test_files_set_aside_in_the_same_second_keep_distinct_names(board, tmp_path):
    path = _leave_state_behind(board, tmp_path)
    bodies = [f"torn write {i}" for i in range(3)]
    for body in bodies:  # three damaged files at one path, set aside one after the other (well within a second)
        path.write_text(body)
        assert len(state.recover(report=lambda line: None)) == 1
    kept = sorted((tmp_path / "state").glob("*.corrupt-*"))
    assert len(kept) == 3 and sorted(p.read_text() for p in kept) == bodies


def _restore(board, tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "edgetune", "restore", *args], env=_env(board, tmp_path),
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_restore_with_a_state_file_failing_its_checksum_exits_1_naming_the_knobs(board, tmp_path):
    before = board.knob_state()
    path = _leave_state_behind(board, tmp_path)
    changed = board.knob_state()
    data = json.loads(path.read_text())
    data["written"] = "edited"  # any edit breaks the checksum
    path.write_text(json.dumps(data))
    done = _restore(board, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert "fails its checksum" in lines[0] and "not used" in lines[0]
    assert lines[-1].startswith("may still be changed on jetson: ")
    for knob in ("gpu_freq", "cpu_cores", "cpu_freq", "power_mode"):
        assert knob in lines[-1]
    assert "`edgetune restore --defaults --device jetson`" in lines[-1]
    assert board.knob_state() == changed  # nothing applied from an untrusted file
    # --defaults: every knob back to the platform's documented default (the board as it booted)
    done = _restore(board, tmp_path, "--defaults")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "put back to the defaults of jetson" in done.stdout
    emc = "sys/kernel/debug/bpmp/debug/clk/emc"
    now = board.knob_state()
    # the EMC's default is unlocked at its top rate (the firmware's DVFS then picks it): this board was found
    # at 1.6 GHz under its 10 W mode's cap, which a fake's rate file does not follow
    assert now.pop(f"{emc}/rate") == "1866000000\n" and now[f"{emc}/mrq_rate_locked"] == "0\n"
    assert now == {k: v for k, v in before.items() if k != f"{emc}/rate"}


def test_restore_exits_1_when_a_knob_cannot_be_written_back(board, tmp_path):
    path = _leave_state_behind(board, tmp_path)
    default_mode = re.search(r"PM_CONFIG DEFAULT=(\d+)", (board.root / "etc/nvpmodel.conf").read_text())[1]
    (board.root / "etc/nvpmodel.refuse").write_text(default_mode)  # the firmware refuses the original mode
    done = _restore(board, tmp_path)
    assert done.returncode == 1
    assert "incomplete" in done.stdout and "may still be changed on jetson: power_mode;" in done.stdout
    assert path.exists()  # kept for a later try
    done = _restore(board, tmp_path, "--defaults")
    assert done.returncode == 1 and "not reset on jetson" in done.stdout


def test_restore_defaults_on_nvml_unlocks_clocks_and_sets_the_default_power_limit(tmp_path):
    from fakes.nvml_gpus import read_gpus, rtx_a6000, write_gpus

    gpu = rtx_a6000()
    gpu.update(locked_gpu_mhz=1200, locked_mem_mhz=810, limit_mw=150_000)  # left by a run killed long ago
    path = tmp_path / "nvml.json"
    env = dict(os.environ, **write_gpus(path, [gpu]), EDGETUNE_STATE_DIR=str(tmp_path / "state"))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
    done = subprocess.run([sys.executable, "-m", "edgetune", "restore", "--defaults", "--device", "nvml:0"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu_freq" in done.stdout and "mem_freq" in done.stdout and "power_limit" in done.stdout
    (after,) = read_gpus(path)
    assert (after["locked_gpu_mhz"], after["locked_mem_mhz"], after["limit_mw"]) == (0, 0, 300_000)


def test_restore_with_an_nvpmodel_conf_that_cannot_be_read_exits_1_with_one_line_and_keeps_the_state(board,
                                                                                                  tmp_path):
    before = board.knob_state()
    path = _leave_state_behind(board, tmp_path)
    conf = board.root / "etc/nvpmodel.conf"
    text = conf.read_text()
    conf.unlink()
    conf.mkdir()  # as a failing update might leave it
    done = _restore(board, tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    first, last = done.stdout.strip().splitlines()
    assert f"power_mode: cannot read {conf} (EISDIR: Is a directory); reinstall L4T's nvpmodel" in first
    assert first.endswith(f"state file kept at {path}") and path.exists()
    assert last.startswith("may still be changed on jetson: ")
    conf.rmdir()
    conf.write_text(text)  # the board is back: the next restore finishes
    done = _restore(board, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert board.knob_state() == before and not path.exists()


@pytest.mark.parametrize(("how", "said"), [
    ("missing", "usr/sbin/nvpmodel found but no /etc/nvpmodel.conf"),
    ("# every mode block lost\n", "etc/nvpmodel.conf has no < POWER_MODEL ID=n NAME=... > block")])
def test_restore_after_nvpmodel_conf_went_missing_says_why_exits_1_and_keeps_the_power_mode(board, tmp_path,
                                                                                             how, said):
    """A run killed on a Xavier NX it had switched to MODE_15W_2CORE; then nvpmodel.conf went (a failed update),
    or lost its modes: the board opens without power_mode. The restore writes the clocks back, says why the power
    mode cannot be (the device's note: the file, and reinstalling nvpmodel), exits 1 and keeps the power mode's
    original in the state file, which the next restore, once the conf is back, writes."""
    from fakes.jetson_tree import break_file

    before = board.knob_state()
    path = _leave_state_behind(board, tmp_path)
    kept = json.loads(path.read_text())["knobs"]["power_mode"]
    conf = board.root / "etc/nvpmodel.conf"
    text = conf.read_text()
    break_file(conf, how)
    done = _restore(board, tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    incomplete, restored, last = done.stdout.strip().splitlines()
    assert incomplete.startswith("restore on jetson incomplete: power_mode (power_mode not tunable: ")
    assert said in incomplete and "no such knob" not in incomplete
    assert (f"reinstall L4T's nvpmodel (`sudo apt install --reinstall nvidia-l4t-nvpmodel`); then run `edgetune "
            f"restore` again); state file kept at {path}") in incomplete
    assert restored.startswith("restored ") and last.startswith("may still be changed on jetson: power_mode;")
    assert json.loads(path.read_text())["knobs"]["power_mode"] == kept  # the original is not dropped
    # --defaults cannot reset a knob the board lacks either: it says so and exits 1
    done = _restore(board, tmp_path, "--defaults")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"not reset on jetson: power_mode (power_mode not tunable: {board.root}/{said}" in done.stdout
    assert path.exists()
    conf.unlink(missing_ok=True)
    conf.write_text(text)  # nvpmodel reinstalled: the next restore finishes
    done = _restore(board, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert board.knob_state() == before and not path.exists()


# ------------------------------------------------------------------------------------------ a board that fails


def test_run_whose_knob_file_vanishes_exits_with_one_line_and_keeps_the_state_file(tmp_path, monkeypatch, capsys,
                                                                                   caplog):
    """The GPU's ``min_freq`` goes while ``edgetune run`` holds the clock: the restore on exit cannot read it."""
    from fakes.board import FakeJetsonBoard

    from edgetune.cli import main
    from edgetune.power.sim import Twin

    class VanishingBoard(FakeJetsonBoard):
        def step(self, cost, batch_size):
            if len(self.steps) == 3:
                (self.fake.gpu / "min_freq").rename(tmp_path / "min_freq")  # the devfreq node goes
            if not (self.fake.gpu / "min_freq").exists():
                return self.twin.expected(cost, batch_size)  # the silicon runs on; its files are gone
            return super().step(cost, batch_size)

    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    fake = build_jetson(tmp_path / "root", "orin-nano")
    before = fake.knob_state()
    VanishingBoard(fake, Twin("orin-nano", seed=0, compute=False), time_scale=0.01).install(monkeypatch)
    rc = main(["run", "--device", "jetson", "--torch-device", "cpu", "--batch-size", "8", "--set", "gpu_freq=max",
               "--steps", "6", "--warmup", "1"])
    err = capsys.readouterr().err
    (path,) = _state_files(tmp_path)
    assert rc != 0 and "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "error" in x]
    assert line.startswith("edgetune: error: not restored on jetson: gpu_freq: cannot read ")
    assert f"the state file {path} keeps the original of gpu_freq: run `edgetune restore` once the board" in line
    caplog.clear()
    state._restore_all_active("exit")  # the atexit hook: the same failure, already told, is not told again
    assert not caplog.records and path.exists()
    (tmp_path / "min_freq").rename(fake.gpu / "min_freq")  # the board is back
    state._restore_all_active("exit")  # the hook's retry now succeeds, and says so
    assert [r.getMessage() for r in caplog.records] == ["exit: restored gpu_freq on jetson"]
    assert fake.knob_state() == before and not _state_files(tmp_path) and not state._active
