"""Suite-wide isolation: no test reads or writes the user's state, sysfs or plots display."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory, monkeypatch):
    # The safe-restore state file lives here, never in the real ~/.local/state of whoever runs the tests.
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("EDGETUNE_SYSFS_ROOT", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")


def pytest_configure(config):
    # The suite runs with `-n 2` on 2 cores: one torch thread per worker avoids threads fighting over the
    # cores (a test file that trains models went from minutes to seconds).
    import torch

    torch.set_num_threads(1)
