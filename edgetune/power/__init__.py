"""The hardware layer: one module per platform behind one interface (see :mod:`edgetune.power.base`).

A device is named by a spec string:

==========================  ===============================================================
``sim:<profile>``            the simulated Jetson twin (``sim:orin-nano``, ``sim:orin-agx`` ...)
``jetson``                   a real Jetson board (INA3221 rails, devfreq/cpufreq/EMC, nvpmodel)
``jtop``                     a Jetson through the jtop service (rails, nvpmodel, jetson_clocks; no root)
``nvml`` / ``nvml:<index>``  an NVIDIA GPU through NVML
``rapl``                     an x86 CPU package through RAPL
``trace:<table.csv>``        replay of a measurement table
``auto``                     the first real platform found, else the embedded default twin
==========================  ===============================================================

This package knows nothing of tuning.
"""

from edgetune.power.base import (
    ApplyError,
    Device,
    DeviceError,
    DeviceOutOfMemoryError,
    Knob,
    KnobValueError,
    KnobWriteError,
    PowerReading,
    PowerSensor,
    SensorError,
    WorkloadCost,
    is_out_of_memory,
)
from edgetune.power.clock import Clock, RealClock, VirtualClock
from edgetune.power.monitor import PowerMonitor, WindowStats, window_stats
from edgetune.power.registry import DEFAULT_DEVICE, PlatformProbe, open_device, probe_platforms

__all__ = [
    "DEFAULT_DEVICE",
    "ApplyError",
    "Clock",
    "Device",
    "DeviceError",
    "DeviceOutOfMemoryError",
    "Knob",
    "KnobValueError",
    "KnobWriteError",
    "PlatformProbe",
    "PowerMonitor",
    "PowerReading",
    "PowerSensor",
    "RealClock",
    "SensorError",
    "VirtualClock",
    "WindowStats",
    "WorkloadCost",
    "is_out_of_memory",
    "open_device",
    "probe_platforms",
    "window_stats",
]
