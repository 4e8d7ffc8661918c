"""Suite-wide isolation: no test reads or writes the user's state, sysfs or plots display."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory, monkeypatch):
    # The safe-restore state file lives here, never in the real ~/.local/state of whoever runs the tests.
    monkeypatch.setenv("EDGETUNE_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("EDGETUNE_SYSFS_ROOT", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")


@pytest.fixture
def postgres_url() -> str:
    """The test PostgreSQL server's URL, with its password (``.ci/run`` starts the server and sets it; under
    ``CI=true`` a missing URL fails the test rather than skipping it)."""
    url = os.environ.get("EDGETUNE_TEST_POSTGRES_URL")
    if not url:
        message = "EDGETUNE_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return url


def pytest_configure(config):
    # The suite runs with `-n 2` on 2 cores: one torch thread per worker avoids threads fighting over the
    # cores (a test file that trains models went from minutes to seconds).
    import torch

    torch.set_num_threads(1)
