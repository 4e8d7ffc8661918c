"""`edgetune run` as a user runs it: figures printed, bad input answered in one line with exit code 2."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys

import pytest
import torch

from edgetune.cli import main

RUN = ["run", "--device", "sim:orin-nano", "--workload", "cnn", "--batch-size", "16", "--steps", "8", "--warmup", "1"]


def test_run_prints_figures_as_json(capsys):
    assert main(RUN + ["--set", "gpu_freq=max", "--set", "emc_freq=min", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] is True and out["device"] == "sim:orin-nano" and out["torch_device"] == "cpu"
    assert out["batch_size"] == 16 and out["steps"] == 8
    assert out["setting"]["gpu_freq"] == max(out["setting"]["gpu_freq"], 1)
    for key in ("step_time_s", "samples_per_s", "mean_power_w", "peak_power_w", "max_avg_power_w",
                "energy_per_sample_j"):
        assert out[key] > 0, key
    assert out["peak_power_w"] >= out["mean_power_w"]
    assert out["energy_per_sample_j"] == pytest.approx(out["energy_j"] / (16 * 8))


def test_run_table_says_simulation_and_restores(capsys):
    assert main(RUN + ["--set", "power_mode=7W"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SIMULATION: cnn on sim:orin-nano")
    assert "-s avg max" in out and "energy/sample" in out and "knobs restored" in out


def test_a_step_read_at_a_few_of_its_phases_runs_one_sweep_and_says_so(monkeypatch, capsys):
    """13.2-ms steps read from 6.6-ms updates (twin Orin AGX, mobilenet b 8 in MAXN at 1122 MHz): the window
    runs past the steps asked for, until the readings have swept the step's phases; the table says its power
    is averaged over that sweep, not over the budget's 1 s, and the progress lines say why the count runs on.
    (One run, its table read: some 300 steps, two of them real mobilenet steps: the twin times every one.)"""
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: progress lines, no bar
    args = ["run", "--device", "sim:orin-agx", "--workload", "mobilenet", "--batch-size", "8", "--steps", "80",
            "--warmup", "1", "--set", "power_mode=MAXN", "--set", "gpu_freq=1122000000", "--set", "emc_freq=max",
            "--set", "cpu_freq=max", "--set", "cpu_cores=max", "--real-steps", "2"]  # the twin times the steps
    assert main(args) == 0
    table = capsys.readouterr().out
    steps = int(re.search(r"steps\s+(\d+) measured after 1 warm-up", table).group(1))
    span_s, note = re.search(r"([\d.]+)-s avg max\s+[\d.]+ W(.*)", table).groups()
    duration_s = float(re.search(r"energy\s+[\d.]+ J over ([\d.]+) s", table).group(1))
    assert steps > 80 and duration_s >= float(span_s) > 1.0
    assert note == " (averaged over one sweep of the step's phases, not 1 s)"
    lines = sys.stderr.getvalue().splitlines()
    what = "edgetune: mobilenet b=8 on sim:orin-agx: "
    assert lines[9] == what + "step 80/80"
    assert lines[10] == what + "step 88 (80 asked; measuring on until the power readings have swept the step's phases)"
    assert lines[-1] == what + f"step {steps} (past the 80 asked)"


def test_real_steps_run_fewer_training_steps_and_leave_the_twins_figures_alone(capsys):
    """On the twin ``--real-steps`` bounds the measured steps that run the workload: the twin times every step
    from the workload's cost, so every figure but the loss and the wall time is the one of a run of real steps."""
    runs = {}
    for real in ("all", "2"):
        assert main(RUN + ["--real-steps", real, "--json"]) == 0
        runs[real] = json.loads(capsys.readouterr().out)
    assert runs["all"]["real_steps"] == 8 and runs["2"]["real_steps"] == 2
    skip = {"real_steps", "loss", "wall_s"}
    assert {k: v for k, v in runs["2"].items() if k not in skip} == {k: v for k, v in runs["all"].items()
                                                                     if k not in skip}
    assert main(RUN + ["--real-steps", "2"]) == 0
    assert "8 measured after 1 warm-up (2 ran the training step, the twin timed the rest)" in capsys.readouterr().out


def test_real_steps_on_a_board_is_said_to_change_nothing(tmp_path, monkeypatch, capsys):
    """A board times its steps by running them: every step is real, and a --real-steps given is named so."""
    from fakes.jetson_tree import build_jetson

    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(build_jetson(tmp_path, "orin-nano").root))
    assert main(["run", "--device", "jetson", "--torch-device", "cpu", "--batch-size", "8", "--steps", "3",
                 "--warmup", "0", "--real-steps", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "note: --real-steps is for simulated devices; on jetson every step runs the training step" in captured.err
    assert json.loads(captured.out)["real_steps"] == 3


def test_a_run_shorter_than_the_budget_window_does_not_call_its_mean_a_1_s_average(capsys):
    """8 steps of cnn b 16 are some 0.06 s: the monitor judges so short a record on its mean, which the table
    and the JSON must not present as the maximum of a 1-s average."""
    assert main(RUN + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["duration_s"] < out["avg_window_s"] == 1.0
    assert out["judged_span_s"] == out["duration_s"]
    assert main(RUN) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "avg max" in ln)
    assert not line.strip().startswith("1-s avg max") and "shorter than the 1-s window" in line


def test_lower_gpu_clock_draws_less_power(capsys):
    figures = {}
    for value in ("min", "max"):
        assert main(RUN + ["--set", f"gpu_freq={value}", "--json"]) == 0
        figures[value] = json.loads(capsys.readouterr().out)
    assert figures["min"]["mean_power_w"] < figures["max"]["mean_power_w"]
    assert figures["min"]["step_time_s"] > figures["max"]["step_time_s"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--device", "sim:orin-pico"], "unknown"),
        (["run", "--device", "sim:orin-nano", "--workload", "resnet9000"], "resnet9000"),
        (["run", "--device", "sim:orin-nano", "--set", "gpu_freq=500MHz"], "nearest allowed"),
        (["run", "--device", "sim:orin-nano", "--set", "turbo=1"], "no knob 'turbo'"),
        (["run", "--device", "sim:orin-nano", "--set", "gpu_freq"], "KNOB=VALUE"),
        (["run", "--batch-size", "0"], "positive integer"),
        (["run", "--real-steps", "some"], 'argument --real-steps: expected a whole number >= 0 or "all", got \'some\''),
        (["run", "--steps", "-3"], "positive integer"),
        (["run", "--device", "sim:orin-nano", "--workload", "no_such_module_xyz:build"], "no_such_module_xyz"),
        (["run", "--steps", "1000000"], "use at most 100000"),
        (["run", "--device", "sim:orin-nano", "--set", "gpu_freq=408000000W"], "gpu_freq is set in Hz, not W"),
        (["run", "--device", "sim:orin-nano", "--set", "power_limit=10MHz"], "no knob 'power_limit'"),
        (["run", "--device", "sim:orin-nano", "--set", "cpu_freq=1.5W"], "cpu_freq is set in kHz, not W"),
        (["run", "--device", "sim:orin-nano", "--set", "gpu_freq=min", "--set", "gpu_freq=max"],
         "--set gpu_freq is given twice (gpu_freq=min and gpu_freq=max)"),
        (["run", "--device", "sim:orin-nano", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        (["run", "--device", "sim:orin-nano", "--seed", str(2**64)], "argument --seed: must be <= 2147483647"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc_info:
        code = main(argv)
        raise SystemExit(code)
    assert exc_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, help_of", [(["run", "--stepz", "5"], "edgetune run"),
                                           (["devices", "--bogus"], "edgetune devices"),
                                           (["--bogus"], "edgetune")])
def test_an_argument_no_command_takes_points_at_the_commands_own_help(argv, help_of, capsys):
    """`edgetune run --stepz 5` said to see `edgetune --help`, which lists the commands, not run's flags."""
    with pytest.raises(SystemExit) as exc_info:
        main(argv)
    assert exc_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"edgetune: error: unrecognized arguments: {' '.join(argv[1:] or argv)} (see `{help_of} --help`)"


def test_out_of_memory_batch_is_reported_not_raised(capsys):
    code = main(["run", "--device", "sim:orin-nano", "--workload", "cnn", "--batch-size", "400000",
                 "--steps", "1", "--warmup", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "out of memory" in err and "smaller --batch-size" in err


def test_console_entry_point_runs_as_a_process():
    proc = subprocess.run([sys.executable, "-m", "edgetune", "run", "--device", "sim:orin-nano", "--steps", "3",
                           "--warmup", "0", "--batch-size", "8", "--json"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["steps"] == 3


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere(monkeypatch, capsys):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(RUN + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 8  # stdout holds the JSON alone
    drawn = terminal.getvalue()
    assert "cnn b=16" in drawn and "/8" in drawn
    assert "\r" in drawn  # a bar redraws itself
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file, CI, nohup: lines, no bar
    assert main(RUN + ["--json"]) == 0
    lines = sys.stderr.getvalue().splitlines()
    assert "\r" not in sys.stderr.getvalue()
    assert lines == [f"edgetune: cnn b=16 on sim:orin-nano: step {k}/8" for k in range(1, 9)]


WORKLOAD_THAT_LOGS = '''
import torch

from edgetune.log import get_logger
from edgetune.workloads import Workload


def build():
    get_logger("edgetune.workloads.user").info("built the user's workload")
    model = torch.nn.Linear(4, 2)
    make = lambda b, g: (torch.randn(b, 4, generator=g), torch.randint(0, 2, (b,), generator=g))
    return Workload.from_model("user", model, make, default_batch_size=4)
'''


def test_library_log_records_reach_stderr_as_edgetune_lines(tmp_path, monkeypatch, capsys):
    (tmp_path / "logging_workload.py").write_text(WORKLOAD_THAT_LOGS)
    monkeypatch.syspath_prepend(str(tmp_path))
    root = logging.getLogger("edgetune")
    before = (list(root.handlers), root.level, root.propagate)
    assert main(["run", "--device", "sim:orin-nano", "--workload", "logging_workload:build", "--steps", "1",
                 "--warmup", "0", "--json"]) == 0
    assert "edgetune: built the user's workload" in capsys.readouterr().err.splitlines()
    assert (list(root.handlers), root.level, root.propagate) == before  # main leaves logging as it found it


DROPOUT_WORKLOAD = """
import torch
from torch import nn
from edgetune.workloads import Workload

def build(seed=0):
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))
    def make_batch(batch_size, generator):
        return torch.randn(batch_size, 16, generator=generator), torch.randint(0, 4, (batch_size,), generator=generator)
    return Workload.from_model("dropout-mlp", model, make_batch, default_batch_size=8, seed=seed)
"""


def test_a_seed_repeats_a_models_dropout_masks_and_so_its_losses(tmp_path, capsys):
    # dropout draws its masks from torch's global generator, which the runs left as the process found it
    # (seeded at random in each process): one seed, two runs, two losses
    path = tmp_path / "dropout.py"
    path.write_text(DROPOUT_WORKLOAD)
    argv = ["run", "--device", "sim:orin-nano", "--workload", f"{path}:build", "--steps", "3", "--warmup", "2",
            "--seed", "4", "--json"]
    losses = []
    for _ in range(2):
        torch.rand(7)  # whatever the process drew before
        assert main(argv) == 0
        losses.append(json.loads(capsys.readouterr().out)["loss"])
    assert losses[0] == losses[1]
