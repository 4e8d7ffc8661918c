"""Safe restore: state file, signal handlers, recovery after kill -9, corrupt files."""

from __future__ import annotations

import json
import os
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
device.apply({"gpu_freq": "408MHz", "cpu_cores": 2, "cpu_freq": "729.6MHz", "power_mode": "7W"})
print("changed", flush=True)
time.sleep(60)
"""


@pytest.fixture
def board(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    return build_jetson(tmp_path / "root", "orin-nano")


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
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGTERM  # still dies of the signal, as without edgetune
    assert "SIGTERM: restored" in err
    assert board.knob_state() == before
    assert not _state_files(tmp_path)


def test_sigint_restores(board, tmp_path):
    before = board.knob_state()
    proc = _start_changer(board, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert "SIGINT: restored" in err and "KeyboardInterrupt" in err  # chained to Python's handler
    assert board.knob_state() == before


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
    assert "restored" in said and "interrupted edgetune run" in said and "gpu_freq=306 MHz" in said and "power_mode=15W" in said
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
        proc.communicate(timeout=20)


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
    assert data["knobs"]["gpu_freq"]["snapshot"] == {"min": 306_000_000, "max": 624_750_000}
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left
    t = time.time()
    device.restore()
    assert not path.exists() and time.time() - t < 1
