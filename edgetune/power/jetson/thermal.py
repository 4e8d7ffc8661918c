"""The board temperature a Jetson reports: its thermal zones (``/sys/devices/virtual/thermal``).

Each ``thermal_zoneN`` has a ``type`` and a ``temp`` in millidegrees Celsius. Orin modules (JetPack 5 and 6)
name theirs ``cpu-thermal``, ``gpu-thermal``, ``cv0-thermal``, ``soc0-thermal`` ... and ``tj-thermal`` (the
hottest junction), older releases and Xavier ``CPU-therm``, ``GPU-therm`` ... The junction zone is read
where there is one (it is valid on every Orin; the AGX Orin's GPU zone reads -25.6 C while the GPU is rail
gated), else the GPU's. A reading below :data:`LOWEST_VALID_C` is a sensor that is off, not a temperature.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgetune.power.sysfs import read_text

__all__ = ["LOWEST_VALID_C", "find_thermal_zone", "temperature_reader"]

#: zone types in order of preference (compared in lower case)
_ZONE_TYPES = ("tj-thermal", "tj-therm", "gpu-thermal", "gpu-therm")
#: readings below this are a sensor that is off (the AGX Orin's gated GPU zone reads -25.6 C)
LOWEST_VALID_C = -20.0


def find_thermal_zone(base: Path) -> Path | None:
    """The thermal zone edgetune reads (module docs), or None where the tree has none."""
    zones: dict[str, Path] = {}
    for d in sorted((base / "sys/devices/virtual/thermal").glob("thermal_zone*")):
        try:
            zones.setdefault(read_text(d / "type").lower(), d)
        except OSError:
            continue
    return next((zones[t] for t in _ZONE_TYPES if t in zones), None)


def temperature_reader(base: Path) -> Callable[[], float | None] | None:
    """A function reading the board temperature in degC (None for a reading that failed or is not valid),
    or None where the tree has no zone edgetune reads."""
    zone = find_thermal_zone(base)
    if zone is None:
        return None
    path = zone / "temp"

    def read() -> float | None:
        try:
            value = int(read_text(path).split()[0]) / 1000.0
        except (OSError, ValueError, IndexError):
            return None
        return value if value >= LOWEST_VALID_C else None

    return read
