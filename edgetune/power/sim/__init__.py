"""The simulated Jetson twin: ``sim:<profile>``, the embedded default where no power hardware is present.

A :class:`Twin` behaves like a Jetson module closely enough that the tuning decisions made on it are the
ones the real board needs. Everything runs on a :class:`~edgetune.power.base.VirtualClock`, so a ten-minute
on-device search takes seconds of wall time.

Profiles (:data:`PROFILES`): ``orin-agx`` (AGX Orin 64GB, JetPack 6 tables), ``orin-nx`` (Orin NX 16GB),
``orin-nano`` (Orin Nano 8GB, the embedded default), ``xavier-nx``. Their value tables and every model
constant live in ``edgetune/power/profiles/`` with their sources (``SOURCES.md``).

Knobs, as on the board: ``gpu_freq`` (Hz, the module's devfreq table), ``emc_freq`` (Hz), ``cpu_freq``
(kHz), ``cpu_cores`` (online cores, 1..N) and ``power_mode`` (nvpmodel modes in ascending power); a power
mode applies its caps and sets the clocks to its maximum, as ``nvpmodel -m`` does.

The package, one concern per module:

* :mod:`~edgetune.power.sim.profiles` - :class:`Profile`, :class:`PowerMode`, :class:`Calibration`,
  :class:`RailLayout` and :data:`PROFILES`, loaded from the CSV tables;
* :mod:`~edgetune.power.sim.physics` - the models as pure functions: :func:`effective_clocks`,
  :func:`step_model` (roofline step time and DVFS power), :func:`idle_power`, the V/f curve and the
  component-to-rail matrix;
* :mod:`~edgetune.power.sim.sensor` - :class:`TwinSensor`, the INA3221 rails: refreshed every
  ``sensor_update_period_s`` (held in between), seeded Gaussian noise, rounded to the milliwatt;
* :mod:`~edgetune.power.sim.twin` - :class:`Twin` (knobs, ground truth, the step on the virtual clock,
  disturbances, out-of-memory like torch's), and the platform functions :func:`open` and :func:`probe`.

* :mod:`~edgetune.power.sim.ratios` - the batch-size and clock ratios beside the published ranges
  (calibration v2's acceptance table, ``profiles/SOURCES.md``).

Noise-free ground truth for any batch size and setting: :meth:`Twin.expected` (at the board's temperature
now, or a ``temperature_c`` given), :meth:`Twin.steady_state` (after minutes of that load, the board warm).
The board temperature (:attr:`Twin.temperature_c`) follows the load over minutes and GPU leakage with it;
the low GPU clock steps share one voltage. Neither is in the predictors' physics. Disturbances for tests
and benchmarks of the runtime controller: :meth:`Twin.set_power_offset` (another process's load, on the CPU
rail, from the current virtual time) and :meth:`Twin.set_throttle` (a thermal cap on the GPU clock, from the
next step).
"""

from edgetune.power.sim.physics import (
    Clocks,
    Expected,
    StepPower,
    effective_clocks,
    idle_power,
    step_model,
)
from edgetune.power.sim.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    Calibration,
    PowerMode,
    Profile,
    RailLayout,
)
from edgetune.power.sim.sensor import TwinSensor
from edgetune.power.sim.twin import Twin, TwinBatchSizeError, open, probe

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILES",
    "Calibration",
    "Clocks",
    "Expected",
    "PowerMode",
    "Profile",
    "RailLayout",
    "StepPower",
    "Twin",
    "TwinBatchSizeError",
    "TwinSensor",
    "effective_clocks",
    "idle_power",
    "open",
    "probe",
    "step_model",
]
