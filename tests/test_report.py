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

# a tiny search on the twin (the training step not run), then the plots, in a process whose backend is svg
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
                    protocol=MeasurementProtocol(warmup_steps=0, measure_steps=3, measure_s=1.5)).run()
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
