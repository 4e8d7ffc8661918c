"""What each platform says it can do (``Device.capabilities``): the platforms without a test file of their
own here (trace replay); the twin, Jetson, NVML and RAPL are checked in their own test files."""

from __future__ import annotations

import os

from edgetune.power import open_device
from edgetune.power.base import Capability

ZEUS_TABLES = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23", "tables")
V100_SQUAD = os.path.join(ZEUS_TABLES, "v100_squad_bert_base_uncased.csv")


def test_trace_replay_capabilities_and_idle_power_read_when_asked():
    dev = open_device(f"trace:{V100_SQUAD}")
    assert dev.capabilities == {Capability.VIRTUAL_CLOCK, Capability.TABLE_REPLAY, Capability.SKIPS_STEP}
    assert dev.has(Capability.TABLE_REPLAY) and not dev.has(Capability.GROUND_TRUTH)
    replay = dev.backend
    assert dev.idle_power_w == replay.idle_power_w == float(replay.table.power_w.min())
    replay.idle_power_w = 42.0  # the replay's idle power is the device's, whenever it is read
    assert dev.idle_power_w == 42.0
