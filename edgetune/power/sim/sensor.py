"""The twin's INA3221 power monitor, read on the twin's virtual clock."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from edgetune.power.base import PowerReading

if TYPE_CHECKING:
    from edgetune.power.sim.twin import Twin

__all__ = ["TwinSensor"]

#: Sensor updates per block of noise draws. Noise is drawn in blocks indexed by the update number, so a
#: trace depends only on the seed and the load, never on how often somebody reads the sensor.
_NOISE_BLOCK = 4096
#: Stream id mixed into the twin's seed for the sensor noise (the step jitter has its own stream).
_NOISE_STREAM = 0x5E45
#: Slack (in update periods) that keeps an update instant which float rounding puts a hair below
#: k x period at update k.
_UPDATE_INDEX_SLACK = 1e-9
#: Decimals of a watt the readings keep: the INA3221 driver reports whole milliwatts.
_WATT_DECIMALS = 3


class TwinSensor:
    """The twin's INA3221 rails, read on its virtual clock.

    A new value appears every ``update_period_s``: the board power at that update instant (the 1.1 ms
    conversion is short against training phases), plus seeded Gaussian noise per channel, rounded to the
    milliwatt. Reads between updates return the held value. Where the module has an input rail it is the
    total; on AGX Orin the total is the sum of the rails (``derived: ...``).
    """

    def __init__(self, twin: Twin) -> None:
        self._twin = twin
        profile = twin.profile
        cal = profile.calibration
        self.rails: tuple[str, ...] = profile.rails.channels
        self.total_label: str = profile.rails.total_label
        self.update_period_s: float = cal.sensor_update_period_s
        self._input_index = (self.rails.index(profile.rails.input_rail)
                             if profile.rails.input_rail is not None else None)
        self._k = -1
        self._held: PowerReading | None = None
        self._block_index = -1
        self._block: list[list[float]] = []

    def _noise(self, k: int) -> list[float]:
        block = k // _NOISE_BLOCK
        if block != self._block_index:
            rng = np.random.default_rng([self._twin.seed, _NOISE_STREAM, block])
            self._block = rng.standard_normal((_NOISE_BLOCK, len(self.rails))).tolist()
            self._block_index = block
        return self._block[k % _NOISE_BLOCK]

    def read(self) -> PowerReading:
        now = self._twin.clock.now()
        k = math.floor(now / self.update_period_s + _UPDATE_INDEX_SLACK)
        if k != self._k or self._held is None:
            clean = self._twin.power_at(k * self.update_period_s)
            cal = self._twin.profile.calibration
            noisy = [max(0.0, round(p + (cal.sensor_noise_w + cal.sensor_noise_rel * p) * z, _WATT_DECIMALS))
                     for p, z in zip(clean, self._noise(k))]
            total = (noisy[self._input_index] if self._input_index is not None
                     else round(sum(noisy), _WATT_DECIMALS))
            self._k = k
            self._held = PowerReading(now, total, dict(zip(self.rails, noisy)))
            return self._held
        return PowerReading(now, self._held.total_w, self._held.rails)

    def energy_j(self) -> float | None:
        return None  # the INA3221 keeps no energy counter
