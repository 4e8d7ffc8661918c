"""End to end: ``edgetune search --device jetson`` on a fake Orin Nano whose rails the simulated twin drives.

Nothing between the CLI and the sysfs files is replaced: the CLI opens the Jetson backend on the fake tree
(``EDGETUNE_SYSFS_ROOT``), the search writes the knob files (devfreq, cpufreq, CPU ``online``, BPMP EMC; the
power mode stays 15W, since 7W gates other GPU TPCs and needs a reboot), every training step is a real torch step of the built-in CNN, and the power monitor reads the
INA3221 files. Only the silicon is simulated: at each step :class:`fakes.board.FakeJetsonBoard` reads the knob
files back, asks the twin what the board draws at that setting, and writes it to the rail files in mV and
mA. So the twin's noise-free power for the setting found in the files is the ground truth the measurement
must reproduce, and the files it saw prove what the backend wrote.
"""

from __future__ import annotations

import csv
import json

import pytest
from fakes.board import FakeJetsonBoard
from fakes.jetson_tree import MODES, build_jetson

from edgetune.cli import main
from edgetune.power.sim import Twin
from edgetune.workloads import load_workload

# Binding: the CNN at batch size 16 draws 8.6 W at the Orin Nano's top GPU clock with the board's CPU clock as
# found (the baseline) and 4.5 W at its lowest setting, so the search must find the budget broken and step down.
BUDGET_W = 8.0
WARMUP_STEPS = 1
SEED = 0
#: the fake Orin Nano boots in 15W; its 7W mode gates other GPU TPCs, so the search cannot switch to it
BOOT_MODE = "15W"


class RecordingBoard(FakeJetsonBoard):
    """The board, also keeping the raw knob files as they stood at each step (for exact checks)."""

    def __init__(self, *args, **kwargs) -> None:
        self.knob_files: list[dict[str, str]] = []
        super().__init__(*args, **kwargs)

    def step(self, cost, batch_size):
        expected = super().step(cost, batch_size)
        self.knob_files.append(self.fake.knob_state())  # after the step: an out-of-memory step logs nothing
        return expected


def _twin_values(row: dict[str, str], grid: dict[str, tuple]) -> dict:
    """A trials.csv setting in the twin's values: the backend's step at or below (the Orin Nano's cpufreq
    table ends at 1510.4 MHz, the twin's at 1497.6 MHz), as the board maps the files. The power mode is the
    one the board booted in where the search could not change it (7W needs a reboot from 15W)."""
    setting = {}
    for knob, values in grid.items():
        if isinstance(values[0], str):
            setting[knob] = row.get(knob, BOOT_MODE)
        else:
            value = float(row[knob])
            setting[knob] = max((v for v in values if v <= value), default=values[0])
    return setting


def _files_hold(files: dict[str, str], setting: dict, mode_ids: dict[str, int]) -> None:
    """The raw knob files say ``setting`` (JetPack 6 Orin Nano layout)."""
    gpu = "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    assert files[f"{gpu}/min_freq"] == files[f"{gpu}/max_freq"] == f"{setting['gpu_freq']}\n"
    cpu0 = "sys/devices/system/cpu/cpufreq/policy0"
    cpu_khz = f"{setting['cpu_freq']}\n"
    assert files[f"{cpu0}/scaling_min_freq"] == files[f"{cpu0}/scaling_max_freq"] == cpu_khz
    online = [name for name, text in files.items() if name.endswith("/online") and text.strip() == "1"]
    assert 1 + len(online) == setting["cpu_cores"]  # cpu0 has no online file: it is always on
    emc = "sys/kernel/debug/bpmp/debug/clk/emc"
    assert files[f"{emc}/mrq_rate_locked"].strip() == "1"
    assert files[f"{emc}/rate"] == f"{setting['emc_freq']}\n"
    assert files["var/lib/nvpmodel/status"].startswith(f"pmode:{mode_ids[setting.get('power_mode', BOOT_MODE)]:04d} ")


def test_search_on_fake_orin_nano_driven_by_the_twin(tmp_path, monkeypatch, capsys):
    fake = build_jetson(tmp_path / "root", "orin-nano")  # JetPack 6 layout (hwmon INA3221, L4T R36)
    twin = Twin("orin-nano", seed=SEED, compute=False)
    board = RecordingBoard(fake, twin, time_scale=1.0)  # each step lasts the twin's step time, plus torch's
    original = fake.knob_state()
    cpu0 = fake.root / "sys/devices/system/cpu/cpufreq/policy0"
    assert (cpu0 / "scaling_cur_freq").read_text() == "883200\n"  # the governor's choice when the search starts
    board.install(monkeypatch)  # the CLI's open_device("jetson") comes back driven by the board

    out = tmp_path / "out"
    rc = main(["search", "--device", "jetson", "--workload", "cnn", "--budget", f"{BUDGET_W:g}",
               "--batch-sizes", "8,16", "--n-trials", "6", "--warmup-steps", str(WARMUP_STEPS),
               "--measure-steps", "3", "--measure-s", "0.3", "--window", "0.25", "--seed", str(SEED),
               "--soak-s", "0", "--output", str(out), "--quiet",  # real time: no 3-min soak
               "--torch-device", "cpu"])  # this machine's torch has no CUDA; the board's power is the twin's
    printed = capsys.readouterr()
    assert rc == 0, printed.out + printed.err
    assert "Orin Nano 8GB" in printed.err and "JetPack 6" in printed.err  # the real backend saw the board
    assert "objective time, training on cpu" in printed.err  # where training ran, and that it is not the GPU
    assert "note: training on the CPU (--torch-device cpu), not on jetson's GPU (cuda:0)" in printed.err

    best = json.loads((out / "best.json").read_text())
    with open(out / "trials.csv", newline="") as f:
        trials = list(csv.DictReader(f))
    assert best["device"] == "jetson" and best["simulated"] is False
    assert "simulated" not in trials[0]  # a real board's rows carry no simulation mark
    # the power mode was not searched (7W needs a reboot): the plan says which one its figures hold in
    assert best["untuned_knobs"] == {"power_mode": {"value": BOOT_MODE, "unit": "", "text": BOOT_MODE}}
    assert best["torch_device"] == "cpu"  # where its figures were trained (--torch-device cpu, above)
    # 6 settings, and the pick's contenders measured again (a row per window)
    assert sum(t["role"] != "confirm" for t in trials) == 6 and all(t["ok"] == "True" for t in trials)
    assert best["study"]["settings_measured"] == 6 and best["study"]["trials_measured"] == len(trials)
    assert {t["role"] for t in trials} >= {"baseline", "search"}  # the sampler chose settings too
    # common practice leaves the CPU to its governor, which runs it at the top of its range under training load:
    # the baseline takes that, not the 883.2 MHz it read at the start (which would have locked it there)
    top_khz = int((cpu0 / "scaling_available_frequencies").read_text().split()[-1])
    assert {int(float(t["cpu_freq"])) for t in trials if t["role"] == "baseline"} == {top_khz}

    # The board's log splits into trials: warm-up plus measured steps each, and no other step ran.
    spans, start = [], 0
    for t in trials:
        # a trial stopped over the budget reports every step since its knobs were set, warm-up included
        n = int(t["steps"]) + (0 if t["aborted_over_budget"] == "True" else WARMUP_STEPS)
        spans.append(range(start, start + n))
        start += n
    assert len(board.steps) == len(board.settings) == len(board.knob_files) == start

    grid = twin.knob_grid()
    cost = load_workload("cnn", seed=SEED).cost
    for t, span in zip(trials, spans):
        setting = _twin_values(t, grid)
        # every step of the trial ran at the setting the trial reports, as read back from the knob files
        assert all(board.settings[i] == setting for i in span), (t, [board.settings[i] for i in span])
        truth = twin.expected(cost, int(t["batch_size"]), setting)
        assert float(t["mean_power_w"]) == pytest.approx(truth.power_w, rel=0.02), t
        assert float(t["max_avg_power_w"]) == pytest.approx(truth.power_w, rel=0.02), t
        # judged as the search judges: the measured 1-s maximum plus the guard band (2 standard errors, the
        # default); a trial stopped over the budget never holds it
        judged_w = float(t["max_avg_power_w"]) + 2.0 * float(t["power_se_w"])
        assert (t["feasible"] == "True") == (judged_w <= BUDGET_W and t["aborted_over_budget"] == "False"), t
        # and against the truth, away from the budget by more than the guard band and the rails' mA rounding
        if abs(truth.power_w - BUDGET_W) > 0.05 + 2.0 * float(t["power_se_w"]):
            assert (t["feasible"] == "True") == (truth.power_w <= BUDGET_W), t
    assert len({tuple(sorted(s.items())) for s in board.settings}) > 1  # the search moved the knobs
    assert {t["feasible"] for t in trials} == {"True", "False"}  # the budget bound: some held it, some not

    # The chosen setting respects the budget, measured and in truth, and was written to the files exactly.
    chosen = next(i for i, t in enumerate(trials)
                  if int(t["batch_size"]) == best["batch_size"]
                  and all(t[k] == str(v["value"]) for k, v in best["setting"].items()))
    assert best["measured"]["max_avg_power_w"] <= BUDGET_W
    assert twin.expected(cost, best["batch_size"], _twin_values(trials[chosen], grid)).power_w <= BUDGET_W
    mode_ids = {name: i for i, name in MODES["orin-nano"][0]}
    for i in spans[chosen]:
        _files_hold(board.knob_files[i], {k: v["value"] for k, v in best["setting"].items()}, mode_ids)

    # Afterwards every knob file is back at what the board started with.
    assert fake.knob_state() == original
