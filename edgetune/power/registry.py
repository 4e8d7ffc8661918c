"""Device specs to platform modules.

Each platform module (``edgetune.power.<platform>``) offers two functions:

* ``open(arg: str, **options) -> Device`` - build the device; ``arg`` is what follows the colon in the
  spec (``sim:orin-nano`` -> ``"orin-nano"``; empty where there is none). Raises :class:`DeviceError` with
  a one-line message when the device cannot be opened.
* ``probe() -> list[PlatformProbe]`` - look for the hardware without changing anything; used by
  ``edgetune devices`` and by ``auto``.

``auto`` (:func:`choose_auto`) prefers, on a Jetson, sysfs (``jetson``) where this process can write the
knobs, else the jtop service (``jtop``) where it answers, else ``jetson`` measure-only; elsewhere the first
NVML GPU, then RAPL, then the simulated default. ``edgetune devices`` prints the choice and why.

Modules are imported lazily so that a missing optional dependency of one platform never breaks another.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from edgetune.power.base import Device, DeviceError

#: The embedded default where no power hardware is present: a simulated Jetson Orin Nano 8GB.
DEFAULT_DEVICE = "sim:orin-nano"

# platform name -> module; the order is the order ``auto`` tries real hardware in
PLATFORMS: dict[str, str] = {
    "jetson": "edgetune.power.jetson",
    "jtop": "edgetune.power.jtop",
    "nvml": "edgetune.power.nvml",
    "rapl": "edgetune.power.rapl",
    "sim": "edgetune.power.sim",
    "trace": "edgetune.power.trace",
}
REAL_PLATFORMS = ("jetson", "jtop", "nvml", "rapl")


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


@dataclass(frozen=True)
class AutoChoice:
    """What ``--device auto`` opens, and why.

    Attributes:
        spec: the device spec it opens (``jetson``, ``jtop``, ``nvml:0``, ``rapl`` or :data:`DEFAULT_DEVICE`).
        reason: one line saying why, for ``edgetune devices``.
        measure_only: True where no knob of that device can be set (the search tunes batch size alone).
    """

    spec: str
    reason: str
    measure_only: bool = False


def _probe(platform: str, probes: Sequence[PlatformProbe] | None) -> list[PlatformProbe]:
    if probes is not None:
        return [p for p in probes if p.platform == platform]
    try:
        return _module(platform).probe()
    except DeviceError as exc:
        return [PlatformProbe(platform, False, summary=str(exc))]


def _first_found(found: list[PlatformProbe]) -> PlatformProbe | None:
    return next((p for p in found if p.found), None)


def _why_not(found: list[PlatformProbe]) -> str:
    return next((p.summary for p in found if p.summary), "not found")


def _sysfs_read_only(spec: str, options: dict) -> str | None:
    """Why no knob of the sysfs device ``spec`` can be written here; None where one can."""
    device = open_device(spec, **options)
    try:
        if not device.measure_only:
            return None
        return next((k.why_read_only for k in device.knobs.values() if k.why_read_only), "it has no knobs")
    finally:
        device.close()


def choose_auto(probes: Sequence[PlatformProbe] | None = None, **options) -> AutoChoice:
    """The device ``--device auto`` opens, and why (see the module docs for the order).

    ``probes`` (from :func:`probe_platforms`) spares probing again; without them, platforms are probed in
    order and only as far as needed. ``options`` as for :func:`open_device` (a sysfs ``root``).
    """
    jetson = _probe("jetson", probes)
    board = _first_found(jetson)
    read_only: str | None = None
    if board is not None:
        try:
            read_only = _sysfs_read_only(board.spec, options)
        except DeviceError as exc:
            board, jetson = None, [PlatformProbe("jetson", False, summary=str(exc))]
        else:
            if read_only is None:
                return AutoChoice(board.spec, "this process can write the Jetson's sysfs knobs")
    jtop = _probe("jtop", probes)
    service = _first_found(jtop)
    if service is not None:
        if board is not None:
            why = (f"the Jetson's sysfs knobs are read-only here ({read_only}); the jtop service answers and "
                   f"sets power_mode and jetson_clocks")
        else:
            why = (f"the jtop service answers ({service.summary}); no Jetson sysfs tree here "
                   f"({_why_not(jetson)})")
        return AutoChoice(service.spec, why)
    if board is not None:
        why = (f"measure-only: the Jetson's sysfs knobs are read-only here ({read_only}) and the jtop "
               f"service does not answer ({_why_not(jtop)})")
        return AutoChoice(board.spec, why, measure_only=True)
    for name in REAL_PLATFORMS:
        if name in ("jetson", "jtop"):
            continue
        found = _first_found(_probe(name, probes))
        if found is not None:
            return AutoChoice(found.spec, f"the first power hardware found: {found.summary}")
    return AutoChoice(DEFAULT_DEVICE, "no power hardware found (no Jetson, jtop service, NVML GPU or RAPL "
                                      "package): the simulated default")


def open_device(spec: str = "auto", **options) -> Device:
    """Open the device named by ``spec`` (see :mod:`edgetune.power`).

    ``auto`` opens what :func:`choose_auto` picks: on a Jetson, sysfs where it can write, the jtop service
    where it answers, else sysfs measure-only; elsewhere the first real platform found, else
    :data:`DEFAULT_DEVICE`. Options are passed to the platform (for the twin: ``seed``, ``compute``; for
    sysfs platforms and jtop: ``root``).
    """
    spec = (spec or "auto").strip()
    if spec == "auto":
        return open_device(choose_auto(**options).spec, **options)
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
