"""Device specs to platform modules.

Each platform module (``edgetune.power.<platform>``) offers two functions:

* ``open(arg: str, **options) -> Device`` - build the device; ``arg`` is what follows the colon in the
  spec (``sim:orin-nano`` -> ``"orin-nano"``; empty where there is none). Raises :class:`DeviceError` with
  a one-line message when the device cannot be opened.
* ``probe() -> list[PlatformProbe]`` - look for the hardware without changing anything; used by
  ``edgetune devices`` and by ``auto``.

Modules are imported lazily so that a missing optional dependency of one platform never breaks another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from edgetune.power.base import Device, DeviceError

#: The embedded default where no power hardware is present: a simulated Jetson Orin Nano 8GB.
DEFAULT_DEVICE = "sim:orin-nano"

# platform name -> module; the order is the order ``auto`` tries real hardware in
PLATFORMS: dict[str, str] = {
    "jetson": "edgetune.power.jetson",
    "nvml": "edgetune.power.nvml",
    "rapl": "edgetune.power.rapl",
    "sim": "edgetune.power.sim",
    "trace": "edgetune.power.trace",
}
REAL_PLATFORMS = ("jetson", "nvml", "rapl")


@dataclass
class PlatformProbe:
    """What a platform's probe found.

    Attributes:
        platform: platform name (``jetson``, ``nvml`` ...).
        found: whether the hardware is present.
        spec: the device spec that opens it (``nvml:0``), when found.
        summary: one line: the hardware found, or why none was.
        details: further lines (rails, knobs, permissions) for ``edgetune devices``.
    """

    platform: str
    found: bool
    spec: str = ""
    summary: str = ""
    details: list[str] = field(default_factory=list)


def _module(platform: str):
    try:
        return importlib.import_module(PLATFORMS[platform])
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("edgetune.power."):
            raise DeviceError(f"platform {platform!r} is not available in this build of edgetune") from exc
        raise


def open_device(spec: str = "auto", **options) -> Device:
    """Open the device named by ``spec`` (see :mod:`edgetune.power`).

    ``auto`` opens the first real platform whose probe finds hardware, else :data:`DEFAULT_DEVICE`.
    Options are passed to the platform (for the twin: ``seed``, ``compute``; for sysfs platforms: ``root``).
    """
    spec = (spec or "auto").strip()
    if spec == "auto":
        for name in REAL_PLATFORMS:
            try:
                found = [p for p in _module(name).probe() if p.found]
            except DeviceError:
                continue
            if found:
                return open_device(found[0].spec, **options)
        return open_device(DEFAULT_DEVICE, **options)
    platform, _, arg = spec.partition(":")
    if platform not in PLATFORMS:
        raise DeviceError(
            f"unknown device {spec!r}; use auto, {', '.join(p + (':<profile>' if p == 'sim' else '') for p in PLATFORMS)}"
        )
    return _module(platform).open(arg, **options)


def probe_platforms() -> list[PlatformProbe]:
    """Probe every platform; never raises for missing hardware."""
    results: list[PlatformProbe] = []
    for name in PLATFORMS:
        try:
            results.extend(_module(name).probe())
        except DeviceError as exc:
            results.append(PlatformProbe(name, False, summary=str(exc)))
    return results
