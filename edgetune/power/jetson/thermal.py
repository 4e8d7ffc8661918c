"""The board temperature a Jetson reports: its thermal zones (``/sys/devices/virtual/thermal``).

Each ``thermal_zoneN`` has a ``type`` and a ``temp`` in millidegrees Celsius. Orin modules (JetPack 5 and 6)
name theirs ``cpu-thermal``, ``gpu-thermal``, ``cv0-thermal``, ``soc0-thermal`` ... and ``tj-thermal`` (the
hottest junction), older releases and Xavier ``CPU-therm``, ``GPU-therm`` ... The junction zone is read
where there is one (it is valid on every Orin; the AGX Orin's GPU zone reads -25.6 C while the GPU is rail
gated), else the GPU's. A reading below :data:`LOWEST_VALID_C` is a sensor that is off, not a temperature.

The temperature is optional (``Device.temperature_c`` is None where it is not read; the thermal soak then
sees power only): a zone whose ``temp`` cannot be read when the board is opened (gone, a directory, not a
number) is passed over for the next one, and :func:`board_temperature` says so once, in a note, never as
an error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgetune.power.sysfs import knob_read_error, read_int, read_text

__all__ = ["LOWEST_VALID_C", "NO_TEMPERATURE", "board_temperature", "find_thermal_zone"]

#: zone types in order of preference (compared in lower case)
_ZONE_TYPES = ("tj-thermal", "tj-therm", "gpu-thermal", "gpu-therm")
#: readings below this are a sensor that is off (the AGX Orin's gated GPU zone reads -25.6 C)
LOWEST_VALID_C = -20.0
#: what a board without a temperature loses, said in the device's notes
NO_TEMPERATURE = "the thermal soak sees power only (a lower bound of the warm board's)"


def _zones(base: Path) -> list[tuple[str, Path]]:
    """The zones edgetune may read, as (type, directory), in order of preference."""
    zones: dict[str, Path] = {}
    for d in sorted((base / "sys/devices/virtual/thermal").glob("thermal_zone*")):
        try:
            zones.setdefault(read_text(d / "type").lower(), d)
        except OSError:
            continue
    return [(t, zones[t]) for t in _ZONE_TYPES if t in zones]


def find_thermal_zone(base: Path) -> Path | None:
    """The thermal zone edgetune prefers (module docs), or None where the tree has none."""
    return next((d for _, d in _zones(base)), None)


def board_temperature(base: Path) -> tuple[Callable[[], float | None] | None, str]:
    """A function reading the board temperature in degC (None for a reading that failed or is not valid)
    from the first zone whose ``temp`` reads a number now, or None; and a note where the preferred zone is
    not the one read (none found; its ``temp`` unreadable: the file, the reason, and what the run loses),
    else ``""``."""
    zones = _zones(base)
    if not zones:
        return None, f"no tj or GPU thermal zone found: {NO_TEMPERATURE}"
    unread: tuple[str, Path, OSError | ValueError] | None = None  # the first zone passed over
    for kind, zone in zones:
        try:
            read_int(zone / "temp")
        except (OSError, ValueError) as exc:
            unread = unread or (kind, zone / "temp", exc)
            continue
        then = f"the board temperature is {kind}'s"
        return _reader(zone / "temp"), "" if unread is None else _unread_note(*unread, then)
    assert unread is not None
    return None, _unread_note(*unread, f"no board temperature: {NO_TEMPERATURE}")


def _unread_note(kind: str, path: Path, exc: OSError | ValueError, then: str) -> str:
    """``thermal zone tj-thermal: cannot read <path> (ENOENT: ...); <then>``: one line, as a knob file's."""
    return str(knob_read_error(path, f"thermal zone {kind}", exc, then))


def _reader(path: Path) -> Callable[[], float | None]:
    def read() -> float | None:
        try:
            value = int(read_text(path).split()[0]) / 1000.0
        except (OSError, ValueError, IndexError):
            return None
        return value if value >= LOWEST_VALID_C else None

    return read
