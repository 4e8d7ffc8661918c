"""Plots of a search: PNGs written without pyplot, the caller's matplotlib backend left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgetune.report import _moving_average

REPO = Path(__file__).resolve().parents[1]

# a tiny search on the twin (the training step not run, no thermal soak), then the plots, in a process whose
# backend is svg
SCRIPT = textwrap.dedent("""
    import sys
    import matplotlib
    matplotlib.use("svg")
    import optuna, torch
    from edgetune.power import open_device
    from edgetune.report import write_plots
    from edgetune.search.space import build_space
    from edgetune.search.study import Search
    from edgetune.search.trial import MeasurementProtocol
    from edgetune.workloads import Workload

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    make = lambda b, g: (torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g))
    workload = Workload.from_model("tiny", model, make, default_batch_size=32)
    device = open_device("sim:orin-nano", compute=False)
    space = build_space(device, 32, (16, 32), ["gpu_freq"])
    result = Search(device, workload, space, budget_w=9.0, n_trials=4, storage=optuna.storages.InMemoryStorage(),
                    protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=1.5), soak_s=0.0).run()
    paths = write_plots(result, sys.argv[1])
    print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, *paths)
""")


def test_plots_are_png_and_leave_the_callers_backend_alone(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    backend, pyplot, *paths = proc.stdout.split()
    assert backend == "svg" and pyplot == "False"
    assert [Path(p).name for p in paths] == ["time_vs_energy.png", "power.png"]
    for p in paths:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_moving_average_is_the_trailing_window_mean():
    t = np.linspace(0.0, 3.0, 31)
    w = 5.0 + 2.0 * t  # a ramp: the mean over [x - 1, x] is 5 + 2 (x - 0.5)
    at, avg = _moving_average(t, w, 1.0)
    assert at[0] == pytest.approx(1.0) and at[-1] == pytest.approx(3.0)
    assert avg == pytest.approx(5.0 + 2.0 * (at - 0.5))
    assert _moving_average(t[:5], w[:5], 1.0)[0].size == 0  # shorter than the window: none


def _held(number: int, batch: int, step_s: float, power_w: float):
    """A measured window of ``batch`` at ``gpu_freq`` ``number`` + 1 GHz that held a 10-W budget (1000 steps to
    target)."""
    from edgetune.search.efficiency import Outcome, TargetModel
    from edgetune.search.records import Role, TrialRecord
    from edgetune.search.space import Candidate

    e = step_s * power_w / batch
    m = {"batch_size": batch, "ok": True, "oom": False, "step_time_s": step_s, "samples_per_s": batch / step_s,
         "mean_power_w": power_w, "peak_power_w": power_w, "max_avg_power_w": power_w, "power_se_w": 0.01,
         "energy_j": e * batch * 10, "energy_per_sample_j": e, "steps": 10, "duration_s": 10 * step_s}
    outcome = Outcome.of(batch, step_s, e, TargetModel(s_min=1000.0, b_noise=0.0))
    return TrialRecord(number, "COMPLETE", Candidate(batch, (("gpu_freq", (number + 1) * 1e9),)), Role.SEARCH, True, m, outcome,
                       True)


def test_a_pareto_summary_says_what_front_its_one_chosen_row_stands_for():
    from edgetune.power import open_device
    from edgetune.report import summary_table
    from edgetune.search.efficiency import TargetModel
    from edgetune.search.results import SearchResult, pareto_front
    from edgetune.search.space import build_space

    fast, frugal, dominated = _held(0, 16, 0.010, 9.0), _held(1, 32, 0.030, 2.0), _held(2, 32, 0.040, 6.0)
    space = build_space(open_device("sim:orin-nano", seed=0), 16, [16, 32])

    def summary(records, objective="pareto"):
        front = pareto_front(records)
        best = min(front, key=lambda r: r.outcome.time_to_target_s * r.outcome.energy_to_target_j)
        return summary_table(SearchResult(
            study_name="s", storage_url="sqlite:///s.db", objective=objective, budget_w=10.0, constrained=True,
            tolerance=0.0, space=space, target=TargetModel(s_min=1000.0, b_noise=0.0), records=records, best=best,
            baseline=None, pareto=front, stop_reason="test", protocol="", device_name="d", device_description="",
            simulated=True, workload="cnn", guard_sigma=2.0))

    text = summary([fast, frugal, dominated])
    assert ("Pareto front: 2 settings within the budget, 10-30 s and 60-90 J to target (best.json: pareto_front; "
            "time_vs_energy.png); chosen: its lowest energy x time") in text
    assert "Pareto front: 1 setting, the chosen one" in summary([fast, dominated])
    assert "Pareto front" not in summary([fast, frugal], objective="time")


@pytest.mark.parametrize("objective", ["time", "energy"])
def test_a_baseline_that_never_reaches_the_target_states_no_ratio(objective):
    """Runs to the target where the baseline's batch size never reached it: its time and energy to the target
    are infinite, best.json's speedup is null, and the summary says why instead of 'infx' (time) or
    '100% less energy (... = infx)' (energy)."""
    from dataclasses import replace

    from edgetune.power import open_device
    from edgetune.report import summary_table
    from edgetune.search.efficiency import TargetModel
    from edgetune.search.results import SearchResult, best_json
    from edgetune.search.space import build_space

    pick, never = _held(0, 16, 0.010, 9.0), _held(1, 32, 0.020, 8.0)
    never = replace(never, outcome=replace(never.outcome, time_to_target_s=float("inf"),
                                           energy_to_target_j=float("inf"), steps_to_target=float("inf")))
    result = SearchResult(
        study_name="s", storage_url="sqlite:///s.db", objective=objective, budget_w=10.0, constrained=True,
        tolerance=0.0, space=build_space(open_device("sim:orin-nano", seed=0), 16, [16, 32]),
        target=TargetModel(s_min=1000.0, b_noise=0.0), records=[pick, never], best=pick, baseline=never, pareto=[pick],
        stop_reason="test", protocol="", device_name="d", device_description="", simulated=True, workload="cnn",
        guard_sigma=2.0)
    text = summary_table(result)
    assert "infx" not in text and "inf" not in text.split("\n\n", 1)[1], text
    measure = "time to target" if objective == "time" else "energy to target"
    assert (f"{measure} vs baseline: no ratio to state, the baseline (batch 32) never reaches the target by the "
            f"convergence law (best.json: speedup_over_baseline is null)") in text
    assert best_json(result)["speedup_over_baseline"] is None
