"""The search: co-select batch size and device knobs under a power budget, hardware in the loop.

* :mod:`edgetune.search.trial` - :func:`measure_setting`: one setting measured on the device;
* :mod:`edgetune.search.space` - the search space (batch sizes x knob values) and its grid;
* :mod:`edgetune.search.efficiency` - time and energy to target from the gradient noise scale;
* :mod:`edgetune.search.study` - :class:`Search`: the loop (ask, measure, tell; stop rules);
* :mod:`edgetune.search.records` - the one reader and writer of trial attributes (:class:`TrialRecord`,
  :class:`Observation`);
* :mod:`edgetune.search.baseline` - the baseline of common practice (probing, then bisection);
* :mod:`edgetune.search.storage` - storages (SQLite WAL, PostgreSQL, journal), heartbeat, dead workers;
* :mod:`edgetune.search.samplers` - :func:`make_sampler`, the guided and power-cap samplers;
* :mod:`edgetune.search.oracle` - searching a measurement table, and the gap to its oracle;
* :mod:`edgetune.search.results` - :class:`SearchResult`, ``best.json`` and ``trials.csv``.

Importing this package does not import Optuna; the names below from the modules that do are imported on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from edgetune.search.measurement import Measurement, MeasurementProtocol
from edgetune.search.trial import measure_setting

_LAZY = {
    "Search": "edgetune.search.study",
    "SearchError": "edgetune.search.storage",
    "open_storage": "edgetune.search.storage",
    "SearchResult": "edgetune.search.results",
    "TrialRecord": "edgetune.search.records",
    "Observation": "edgetune.search.records",
    "make_sampler": "edgetune.search.samplers",
    "GuidedSampler": "edgetune.search.samplers",
    "PowerCapSampler": "edgetune.search.samplers",
}

__all__ = ["GuidedSampler", "Measurement", "MeasurementProtocol", "Observation", "PowerCapSampler", "Search",
           "SearchError", "SearchResult", "TrialRecord", "make_sampler", "measure_setting", "open_storage"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
