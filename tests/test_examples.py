"""The example scripts run as a user runs them (``examples/``; the README links them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fakes.jetson_tree import build_jetson

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_with_edgetune.py"


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TRAIN), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "EDGETUNE_STATE_DIR": str(cwd / "state"), **env}, check=False)


def test_train_with_edgetune_trains_under_the_budget_on_the_twin(tmp_path):
    done = _run(["--epochs", "1"], tmp_path)
    assert done.returncode == 0, done.stderr
    epoch, summary = done.stdout.strip().splitlines()[-2:]
    assert epoch.startswith("epoch 0: loss ") and epoch.endswith("budget 10 W")
    assert summary.startswith("energy ") and summary.endswith("0 budget violation(s)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build of torch: the CPU build's refusal is not reached")
def test_train_with_edgetune_on_a_board_with_a_cpu_build_of_torch_is_one_line(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    before = fake.knob_state()
    done = _run(["--device", "jetson", "--budget", "8"], tmp_path, EDGETUNE_SYSFS_ROOT=str(fake.root))
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert done.stderr.startswith("train_with_edgetune: jetson measures its GPU (cuda:0), where training must run")
    assert fake.knob_state() == before


@pytest.mark.parametrize(("args", "line"), [
    (["--device", "bogus"], "train_with_edgetune: unknown device 'bogus'; use auto"),
    (["--plan", "missing/best.json"], "train_with_edgetune: plan missing/best.json: no such file; run `edgetune search"),
])
def test_train_with_edgetune_refuses_bad_input_in_one_line(tmp_path, args, line):
    done = _run(args, tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(line) and done.stdout == ""
