"""A fake Jetson *board*: the simulated twin playing the hardware behind a fake sysfs tree.

The Jetson backend writes knob files (devfreq ``min_freq``/``max_freq``, cpufreq limits, CPU ``online``,
BPMP ``rate``/``mrq_rate_locked``, nvpmodel's status) and reads INA3221 rail files. This driver closes the
loop the way silicon does: at each training step it reads the knob files the backend wrote, maps them to
the twin's knob values, asks the twin (:meth:`Twin.expected`) what the board draws for that step, and
publishes it as rail readings in mV and mA; the step lasts the twin's step time (in real time, scaled by
``time_scale``). So a test exercises the whole real code path - sysfs write, rail read, the monitor's
integration - and can compare what was measured with the twin's ground truth.

Use :meth:`FakeJetsonBoard.drive` on a device opened from the tree, or :meth:`install` (with pytest's
``monkeypatch``) so that every ``open_device("jetson")`` - the one ``edgetune search --device jetson``
makes - comes back driven.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from edgetune.power.base import Device, DeviceOutOfMemoryError, KnobValue, WorkloadCost

from .jetson_tree import FakeJetson

#: fake tree board -> twin profile
TWIN_PROFILE = {"orin-nano": "orin-nano", "agx-orin-jp6": "orin-agx", "agx-orin-jp5": "orin-agx",
                "xavier-nx": "xavier-nx"}
#: the supply each rail's monitor sees (mV): a 5 V input on these modules
RAIL_MV = 5080


def _at_most(table: tuple[KnobValue, ...], value: float) -> KnobValue:
    below = [v for v in table if float(v) <= value]
    return below[-1] if below else table[0]


class FakeJetsonBoard:
    """Plays the board behind ``fake`` with ``twin``: knob files in, rail files out.

    Args:
        fake: the fake tree (``fakes.jetson_tree.build_jetson``).
        twin: an ``edgetune.power.sim.Twin`` of the same module (``TWIN_PROFILE``).
        time_scale: real seconds per simulated second of step time (shorter tests with < 1).
    """

    def __init__(self, fake: FakeJetson, twin: Any, time_scale: float = 1.0) -> None:
        self.fake = fake
        self.twin = twin
        self.time_scale = time_scale
        self.steps: list[Any] = []  # the twin's Expected for every step run
        self.settings: list[dict[str, KnobValue]] = []  # the knob files' setting each step ran at (as steps)
        self.idle()

    # -- knob files -> twin ------------------------------------------------------------------------
    def knob_setting(self) -> dict[str, KnobValue]:
        """The setting the knob files describe, in the twin's values."""
        root, grid = self.fake.root, self.twin.knob_grid()
        setting: dict[str, KnobValue] = {}
        status = root / "var/lib/nvpmodel/status"
        conf = root / "etc/nvpmodel.conf"
        if status.exists() and conf.exists():
            modes = dict(re.findall(r"POWER_MODEL ID=(\d+) NAME=(\S+) >", conf.read_text()))
            mode = modes.get(str(int(re.search(r"pmode:(\d+)", status.read_text()).group(1))))
            if mode in grid["power_mode"]:
                setting["power_mode"] = mode
        # under load the GPU governor runs at the top of its (min, max) range
        setting["gpu_freq"] = _at_most(grid["gpu_freq"], int((self.fake.gpu / "max_freq").read_text()))
        policy = self.fake.policies[0]
        setting["cpu_freq"] = _at_most(grid["cpu_freq"], int((policy / "scaling_max_freq").read_text()))
        online = 1 + sum(int(p.read_text()) == 1
                         for p in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/online"))
        setting["cpu_cores"] = _at_most(grid["cpu_cores"], online)
        if self.fake.emc is not None:
            emc = self.fake.emc
            locked = int((emc / "mrq_rate_locked").read_text()) == 1
            rate = int((emc / ("rate" if locked else "max_rate")).read_text())
            setting["emc_freq"] = _at_most(grid["emc_freq"], rate)
        return setting

    def sync(self) -> dict[str, KnobValue]:
        """Apply the knob files to the twin, and let the governors settle (``cur_freq``)."""
        setting = self.knob_setting()
        self.twin.device().apply(setting)
        self.fake.settle()
        return setting

    # -- twin -> rail files ------------------------------------------------------------------------
    def publish(self, rails_w: dict[str, float]) -> None:
        for rail, watts in rails_w.items():
            if rail in self.fake.rail_files:
                self.fake.set_rail(rail, RAIL_MV, watts * 1e6 / RAIL_MV)

    def idle(self) -> None:
        """Rails at rest for the current knob files."""
        self.sync()
        self.publish(dict(self.twin.sensor.read().rails))

    def step(self, cost: WorkloadCost, batch_size: int) -> Any:
        """One training step's load: rails at the twin's power for the step time. Raises out-of-memory
        (the twin's error, which ``is_out_of_memory`` recognises like torch's) when the batch does not fit."""
        setting = self.sync()
        expected = self.twin.expected(cost, batch_size)
        if not expected.fits:
            raise DeviceOutOfMemoryError(f"CUDA out of memory: batch size {batch_size} needs "
                                         f"{expected.memory_bytes / 2**30:.2f} GiB (fake board)")
        self.publish(dict(expected.rails_w))
        time.sleep(expected.step_time_s * self.time_scale)
        self.steps.append(expected)
        self.settings.append(setting)
        return expected

    # -- wiring --------------------------------------------------------------------------------------
    def drive(self, device: Device) -> Device:
        """Make ``device.run_step`` load the board: the twin's power shows on the rails during ``fn``."""
        inner: Callable[..., Any] = device.run_step

        def run_step(fn: Callable[[], Any], batch_size: int, cost: WorkloadCost | None) -> Any:
            if cost is None:
                raise ValueError("the fake board needs the workload's cost to know the load")

            def loaded() -> Any:
                self.step(cost, batch_size)
                return fn()

            return inner(loaded, batch_size, cost)

        device.run_step = run_step
        return device

    def install(self, monkeypatch: Any) -> None:
        """Every Jetson device opened from now on (in this process) is driven by this board."""
        from edgetune.power import jetson

        real_open = jetson.open

        def open_driven(arg: str = "", **options: Any) -> Device:
            return self.drive(real_open(arg, **options))

        monkeypatch.setattr(jetson, "open", open_driven)
        monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(self.fake.root))
