"""`edgetune devices`, `monitor` and `restore`, run as a user runs them, against fake trees."""

from __future__ import annotations

import csv
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from fakes.jetson_tree import break_file, build_jetson
from fakes.rapl_tree import build_rapl
from fakes.terminal import edgetune_argv

from edgetune.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("FAKE_NVML_STATE", raising=False)


def _env(root: Path, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, EDGETUNE_SYSFS_ROOT=str(root), EDGETUNE_STATE_DIR=str(tmp_path / "state"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.pop("FAKE_NVML_STATE", None)
    return env


def _edgetune(args, root, tmp_path, timeout=60):
    return subprocess.run([sys.executable, "-m", "edgetune", *args], env=_env(root, tmp_path), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


# ------------------------------------------------------------------------------------------ devices


def test_devices_without_hardware_points_to_the_twin(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(tmp_path / "empty"))
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "no power hardware found" in out and "sim:orin-nano" in out


def test_devices_on_a_jetson_tree(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    done = _edgetune(["devices"], fake.root, tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "jetson: found (jetson)" in out and "Orin Nano 8GB" in out and "JetPack 6" in out
    assert "total = VDD_IN; rails: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC; updates every 8 ms" in out
    assert "gpu_freq    306 MHz .. 624.75 MHz (5 steps); now 306 MHz; writable" in out
    assert "cpu_freq    115.2 MHz .. 1.5104 GHz (20 steps)" in out
    assert "emc_freq    204 MHz .. 2.133 GHz (3 steps)" in out
    assert "power_mode  15W; now 15W; writable" in out
    assert "power_mode 7W not offered: switching to it needs a reboot" in out
    if not torch.cuda.is_available():  # this machine's torch is the CPU build: said before any search
        assert ("    training: cannot run here: jetson measures its GPU (cuda:0), where training must run to be "
                f"measured, but this PyTorch ({torch.__version__}) cannot use CUDA;") in out
    done = _edgetune(["devices", "--json"], fake.root, tmp_path)
    jetson = next(p for p in json.loads(done.stdout)["platforms"] if p["platform"] == "jetson")
    mode = next(k for k in jetson["device"]["knobs"] if k["name"] == "power_mode")
    assert mode["values"] == ["15W"] and "needs a reboot" in mode["unavailable"]["7W"]
    assert "not the GPU alone" in out


def test_devices_json(tmp_path, monkeypatch, capsys):
    fake = build_jetson(tmp_path / "root", "agx-orin-jp6")
    build_rapl(fake.root)  # an x86 tree beside it: both platforms are listed
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hardware_found"] is True
    by_platform = {p["platform"]: p for p in report["platforms"] if p["found"]}
    jet = by_platform["jetson"]["device"]
    assert jet["sensor"]["total"].startswith("derived: VDD_GPU_SOC")
    gpu = next(k for k in jet["knobs"] if k["name"] == "gpu_freq")
    assert gpu["values"][0] == 306_000_000 and gpu["writable"] is True and gpu["unit"] == "Hz"
    assert by_platform["rapl"]["device"]["sensor"]["energy_counter"] is True
    assert by_platform["rapl"]["device"]["training"] == {"torch_device": "cpu", "problem": ""}
    assert jet["training"]["torch_device"] == "cuda:0"
    assert "sim:orin-nano" in report["simulated"]


def test_devices_read_only_tree_says_why(tmp_path):
    fake = build_jetson(tmp_path / "root", "xavier-nx", nvpmodel=False)
    fake.make_read_only()
    out = _edgetune(["devices"], fake.root, tmp_path).stdout
    assert "read-only: the kernel exposes" in out
    assert "measure-only" in out and "batch size alone" in out


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="drops root to show the non-root view")
def test_devices_without_root_names_the_fix(tmp_path):
    tree = Path(tempfile.mkdtemp(prefix="edgetune-nonroot-"))  # readable by an unprivileged user
    try:
        tree.chmod(0o755)
        fake = build_jetson(tree / "root", "orin-nano")
        code = ("import os, sys\n"
                "from edgetune.cli import main, build_parser\n"
                "import edgetune.power.jetson, edgetune.power.nvml, edgetune.power.rapl, edgetune.power.sim\n"
                "import edgetune.workloads\n"
                "from edgetune.power import registry\n"
                "build_parser(); registry.probe_platforms()  # load every lazy import while still root\n"
                "os.setegid(65534); os.seteuid(65534)\n"
                "sys.exit(main(['devices']))\n")
        env = _env(fake.root, tmp_path)
        env["EDGETUNE_STATE_DIR"] = str(tree / "state")
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "read-only: knob files are root-only; run edgetune as root (sudo edgetune ...)" in done.stdout
        assert "power_mode" in done.stdout and "nvpmodel needs root" in done.stdout
        assert "measure-only" in done.stdout
    finally:
        shutil.rmtree(tree)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="drops root to show the non-root view")
def test_nvml_without_root_is_measure_only(tmp_path):
    from fakes.nvml_gpus import FAKE_NVML_DIR, a100, write_gpus

    shared = Path(tempfile.mkdtemp(prefix="edgetune-nonroot-"))
    try:
        shared.chmod(0o755)
        (shared / "empty").mkdir()
        env = _env(shared / "empty", tmp_path)
        env.update(write_gpus(shared / "nvml.json", [a100()], privileged=False))
        env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)])
        env["EDGETUNE_STATE_DIR"] = str(shared / "state")
        code = ("import os, sys, pynvml\n"
                "from edgetune.cli import main, build_parser\n"
                "from edgetune.power import registry\n"
                "build_parser(); registry.probe_platforms()  # load every lazy import while still root\n"
                "os.setegid(65534); os.seteuid(65534)\n"
                "sys.exit(main(['devices']))\n")
        done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert "nvml: found (nvml:0)" in out and "NVIDIA A100-SXM4-40GB" in out
        assert "gpu_freq    210 MHz .. 1.41 GHz (81 steps); now 1.41 GHz; read-only: NVML clock and power-limit " \
               "settings need root; run edgetune as root (sudo edgetune ...)" in out
        assert "power_limit 100 W .. 400 W" in out
        assert "measure-only" in out and "batch size alone" in out
    finally:
        shutil.rmtree(shared)


# ------------------------------------------------------------------------------------------ monitor


def test_monitor_logs_csv_and_summarises(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    out_csv = tmp_path / "power.csv"
    done = _edgetune(["monitor", "--device", "jetson", "--rate", "200", "--duration", "1", "--csv", str(out_csv)],
                     fake.root, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "monitoring NVIDIA Jetson Orin Nano" in done.stdout and "total = VDD_IN" in done.stdout
    assert "VDD_IN" in done.stdout and "1-s avg" in done.stdout
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary:"))
    assert "dropped samples 0" in summary and "mean 4.75 W" in summary and "peak 4.75 W" in summary
    rows = list(csv.DictReader(out_csv.open()))
    assert set(rows[0]) == {"t_s", "total_w", "VDD_IN_w", "VDD_CPU_GPU_CV_w", "VDD_SOC_w"}
    # the rate is a ceiling the due-time stepping guarantees; how many samples a loaded machine lets the
    # thread take is the scheduler's business, so only "some, in time order, never above 200 Hz" is asserted
    t_s = [float(row["t_s"]) for row in rows]
    assert 2 <= len(rows) <= 205
    assert all(b > a for a, b in itertools.pairwise(t_s))
    assert float(rows[-1]["total_w"]) == pytest.approx(5.080 * 0.936, abs=1e-3)


def test_monitor_live_energy_is_the_integral_of_the_power_shown(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")  # a constant 4.75 W on VDD_IN
    done = _edgetune(["monitor", "--device", "jetson", "--rate", "200", "--duration", "1.6"], fake.root, tmp_path)
    assert done.returncode == 0, done.stderr
    live = [line for line in done.stdout.splitlines() if line.rstrip().endswith(" J") and "| total" in line]
    assert len(live) >= 2
    for line in live:
        elapsed_s = float(line.split(" s ", 1)[0])
        energy = float(line.rsplit("E ", 1)[1].split()[0])
        # both printed to 0.1; the first sample is taken a few ms after the clock's zero
        assert energy == pytest.approx(4.75 * elapsed_s, abs=4.75 * 0.05 + 0.05 + 0.1), line


def test_monitor_survives_bad_reads_and_counts_them(tmp_path):
    fake = build_jetson(tmp_path / "root", "orin-nano")
    proc = subprocess.Popen([sys.executable, "-m", "edgetune", "monitor", "--device", "jetson", "--rate", "100",
                             "--duration", "2"], env=_env(fake.root, tmp_path), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "monitoring" in proc.stdout.readline()
    time.sleep(0.4)
    fake.set_rail_text("VDD_IN", "garbage\n")
    time.sleep(0.3)
    fake.set_rail("VDD_IN", 5080, 2000)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    summary = next(line for line in out.splitlines() if line.startswith("summary:"))
    dropped = int(summary.rsplit("dropped samples ", 1)[1].split(";")[0])
    assert 5 <= dropped <= 40
    assert "peak 10.16 W" in summary  # the run went on and saw the new load
    assert "last bad read:" in out and "expected a number" in out


def test_monitor_ctrl_c_prints_summary(tmp_path):
    fake = build_jetson(tmp_path / "root", "nano")
    # `python -m edgetune monitor`, with Ctrl-C delivered as in a terminal (fakes/terminal.py)
    proc = subprocess.Popen(edgetune_argv("monitor", "--device", "jetson"), env=_env(fake.root, tmp_path), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "monitoring" in proc.stdout.readline()
    # the first live line says the loop runs and has samples: Ctrl-C then, however slow the machine is
    assert " s  " in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "summary:" in out and "energy" in out and "max 1-s avg" in out and "POM_5V_IN" in out


def test_monitor_never_overwrites_samples_unless_forced(tmp_path, capsys):
    out_csv = tmp_path / "power.csv"
    out_csv.write_text("t_s,total_w\n0.0,5.0\n")  # an earlier run's samples
    args = ["monitor", "--device", "sim:orin-nano", "--duration", "0.1", "--csv", str(out_csv)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"--csv {out_csv} exists" in err and "--force" in err
    assert out_csv.read_text() == "t_s,total_w\n0.0,5.0\n"
    assert main([*args, "--force"]) == 0
    rows = list(csv.DictReader(out_csv.open()))
    assert rows and "VDD_IN_w" in rows[0]


def test_monitor_of_a_simulated_device_says_simulation_on_screen_and_in_the_csv(tmp_path, capsys):
    out_csv = tmp_path / "power.csv"
    assert main(["monitor", "--device", "sim:orin-nano", "--duration", "0.3", "--csv", str(out_csv)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("SIMULATION: monitoring NVIDIA Jetson Orin Nano")
    assert any(line.startswith("SIMULATION: summary: ") for line in lines)
    rows = list(csv.DictReader(out_csv.open()))  # still read as the samples a board gives, plus the mark
    assert len(rows) >= 2 and set(rows[0]) == {"t_s", "total_w", "VDD_IN_w", "VDD_CPU_GPU_CV_w", "VDD_SOC_w",
                                               "simulated"}
    assert all(row["simulated"] == "True" and float(row["total_w"]) > 0 for row in rows)


@pytest.mark.parametrize(("args", "message"), [
    (["monitor", "--rate", "0"], "--rate 0 is out of range"),
    (["monitor", "--duration", "-1"], "--duration -1 must be positive"),
    (["monitor", "--device", "tpu:7"], "unknown device 'tpu:7'"),
    (["monitor", "--device", "jetson"], "no Jetson board under"),
    (["monitor", "--device", "sim:orin-nano", "--duration", "0.1", "--csv", "/nonexistent/x.csv"],
     "--csv /nonexistent/x.csv: cannot write the samples there (no such file or directory)"),
    (["monitor", "--device", "sim:orin-nano", "--duration", "0.1", "--csv", "."],
     "--csv .: cannot write the samples there (is a folder)"),
    (["monitor", "--device", "sim:orin-nano", "--duration", "0.1", "--force"],
     "--force overwrites the --csv file, and no --csv is given; add --csv FILE, or drop --force"),
])
def test_monitor_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, args, message):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(tmp_path / "empty"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_monitor_rapl(tmp_path, monkeypatch, capsys):
    fake = build_rapl(tmp_path / "root")
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    assert main(["monitor", "--device", "rapl", "--duration", "0.3", "--rate", "50"]) == 0
    out = capsys.readouterr().out
    assert "derived: package-0 + dram-0" in out and "hardware energy counter: 0.00 J" in out


def test_devices_json_into_a_closed_pipe_is_one_line_exit_2(tmp_path):
    """`edgetune devices --json | head -1`: the reader is gone before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # a pipe without a reader: every write fails with EPIPE, as after `head` exits
    try:
        proc = subprocess.run([sys.executable, "-m", "edgetune", "devices", "--json"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=_env(tmp_path / "none", tmp_path), cwd=REPO,
                              timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "edgetune: error: standard output was closed before the output was written (broken pipe)"]


# ------------------------------------------------------------------------------------------ a broken board

#: a board file broken when a command starts -> (board, the file under the root, how, the line it gives)
BROKEN_AT_START = {
    "rail input gone": ("orin-nano", "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/in1_input", "missing",
                        "power rail VDD_IN: cannot read "),
    "rail label a directory": ("orin-nano", "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/in2_label", "directory",
                               "power rail in2: cannot read "),
    "nvpmodel.conf a directory": ("xavier-nx", "etc/nvpmodel.conf", "directory", "power_mode: cannot read "),
    "GPU table garbage": ("orin-nano", "sys/class/devfreq/17000000.gpu/available_frequencies", "N/A\n",
                          "gpu_freq: "),
}


@pytest.mark.parametrize("case", sorted(BROKEN_AT_START))
def test_a_board_file_broken_at_start_is_one_line_exit_2_for_each_command_and_the_api(tmp_path, monkeypatch,
                                                                                     capsys, case):
    import edgetune
    from edgetune.power import DeviceError

    board, rel, how, line = BROKEN_AT_START[case]
    fake = build_jetson(tmp_path / "root", board)
    before = fake.knob_state()
    break_file(fake.root / rel, how)
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    monkeypatch.chdir(tmp_path)
    for command in (["monitor", "--device", "jetson", "--duration", "0.1"],
                    ["search", "--device", "jetson", "--workload", "cnn", "--budget", "8", "--n-trials", "2",
                     "--torch-device", "cpu", "--output", "out"]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"edgetune: error: {line}") and err.count("\n") == 1, err
        assert str(fake.root / rel) in err
    assert main(["devices"]) == 0
    assert f"jetson: not found - {line}" in capsys.readouterr().out
    model = torch.nn.Linear(4, 2)
    tuner = edgetune.tune(model, torch.optim.SGD(model.parameters(), lr=0.1), batch_size=4, budget_w=8.0,
                          device="jetson", online=False, print_summary=False)
    with pytest.raises(DeviceError, match=f"^{line}"), tuner:  # the device opens as the run starts
        pass
    assert fake.knob_state() == before and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ restore


def test_restore_with_nothing_to_do(tmp_path, capsys):
    assert main(["restore"]) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_restore_device_without_defaults_is_refused_not_ignored(tmp_path, capsys):
    """--device chooses what --defaults resets; alone it did nothing, and restore said nothing of it."""
    assert main(["restore", "--device", "sim:orin-nano"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("edgetune: error: --device names the device --defaults resets; without --defaults, restore puts "
                   "back what the state files recorded, on the devices they name: add --defaults, or drop --device")


# ------------------------------------------------------------------------------------------ where training runs


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build of torch: the CPU build's refusal is not reached")
@pytest.mark.parametrize("sub", [["run", "--steps", "2"], ["search", "--budget", "8", "--n-trials", "2"]])
def test_a_gpu_board_with_a_cpu_build_of_torch_is_refused_before_anything_changes(tmp_path, monkeypatch, capsys,
                                                                                  sub):
    # `pip install torch` on a Jetson gets the CPU build: training would run on the CPU while the search
    # tuned and measured the GPU. Refused in one line with the fix; no knob written, no result folder.
    fake = build_jetson(tmp_path / "root", "orin-nano")
    monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root))
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    before = fake.knob_state()
    assert main([*sub[:1], "--device", "jetson", "--workload", "cnn", *sub[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("edgetune: error: jetson measures its GPU (cuda:0), where training must run to be measured, "
                          f"but this PyTorch ({torch.__version__}) cannot use CUDA")
    assert fake.knob_state() == before and not (tmp_path / "edgetune-out").exists()


def test_a_config_file_that_names_the_torch_device_is_named_in_the_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "edgetune.toml").write_text('device = "sim:orin-nano"\ntorch_device = "tpu"\n')
    assert main(["search", "--config", "edgetune.toml", "--budget", "10", "--n-trials", "2"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("edgetune: error: edgetune.toml: torch_device = tpu: not a torch device that trains; use "
                           "auto, cpu, cuda or cuda:<n>")
