"""NVIDIA Jetson boards through the jtop service (jetson-stats, the ``jetson`` extra), for users without root.

On Jetsons, training usually runs in a container or as a user without root: sysfs writes are refused there.
The jtop service (``jtop.service``, a root daemon installed by jetson-stats) reads the INA3221 rails and runs
``nvpmodel`` and ``jetson_clocks`` for every client that can open its socket ``/run/jtop.sock``: users in the
``jtop`` group, and containers that mount the socket (``-v /run/jtop.sock:/run/jtop.sock``). This backend is
such a client (``from jtop import jtop``, jetson-stats 4.2 or later):

* power - ``jetson.power``: rails in mW, the board input rail (``VDD_IN``, ``POM_5V_IN``) as the total, else
  jtop's sum of the rails (labelled ``derived: ...``). Values change once per service interval (1 s by
  default), far coarser than sysfs (a few ms): the power monitor judges a budget over at least
  :data:`~edgetune.power.monitor.MIN_UPDATES_PER_WINDOW` updates, and the device's notes say so.
* ``power_mode`` - the nvpmodel modes the service can switch to without a reboot, set by id and confirmed
  by reading the mode back;
* ``jetson_clocks`` - ``off`` / ``on`` (on pins CPU, GPU and EMC clocks at the power mode's maximum).

GPU, CPU and memory clocks are not offered: the service has no request for them. Both knobs go through the
state file (:mod:`edgetune.power.state`) like every other backend's, so a killed run is restored by the next
start or ``edgetune restore`` through the service.

The socket is looked for under the sysfs root (``EDGETUNE_SYSFS_ROOT``, default ``/``) before the library is
imported, so machines without the service never load jetson-stats.
"""

from __future__ import annotations

import importlib
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.power.base import DERIVED_PREFIX, Capability, Device, DeviceError, KnobWriteError, PowerReading
from edgetune.power.clock import RealClock
from edgetune.power.jetson import COMBINED_RAILS, JETSON_COMPUTE, _run_step
from edgetune.power.jetson.thermal import board_temperature
from edgetune.power.monitor import MIN_UPDATES_PER_WINDOW, min_avg_window_s
from edgetune.power.registry import PlatformProbe
from edgetune.power.state import DeviceIdentity, RestorableKnob, StateTracker
from edgetune.power.sysfs import sysfs_root

__all__ = ["JTOP_SOCKET", "JtopBackend", "JtopPowerSensor", "open", "probe", "service_error"]

#: Where the jtop service listens, relative to the root (jetson-stats' ``JTOP_PIPE``, ``/run/jtop.sock``).
JTOP_SOCKET = "run/jtop.sock"
#: Interval the client asks the service for, in seconds: jetson-stats' own default. Each update reads every
#: sensor and runs ``nvpmodel -q`` on the board's CPU, so a faster one loads the cores the training uses.
#: The first client connected sets the service's interval; the device reports the one in force.
DEFAULT_INTERVAL_S = 1.0
#: How long a mode or jetson_clocks switch may take before it counts as refused, in seconds: jetson-stats
#: gives ``nvpmodel`` 4 s and switches jetson_clocks off and back on around it (up to 3 s each way), plus
#: an update interval or two for the new state to reach the client.
SWITCH_TIMEOUT_S = 15.0
#: How often a switch is checked while waiting for it, in seconds (a tenth of the default interval).
POLL_S = 0.1
#: The jetson_clocks knob's values, in ascending power.
JETSON_CLOCKS_VALUES = ("off", "on")

_INSTALL = "pip install 'edgetune[jetson]'"
_START = ("start the service on the board: `sudo systemctl start jtop` (installed by "
          "`sudo pip3 install -U jetson-stats`)")
_MOUNT = "in a container, mount the host's socket: `docker run -v /run/jtop.sock:/run/jtop.sock ...`"
_GROUP = ("add the user to the `jtop` group: `sudo usermod -aG jtop $USER` and log in again (in a container: "
          "run as root, or `--group-add` the host's jtop group id)")
_SAME_VERSION = "install the host's jetson-stats version here (`jtop -v` on the host)"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def socket_path(root: str | os.PathLike | None = None) -> Path:
    """The jtop service's socket under the sysfs root (``/run/jtop.sock`` on a board)."""
    return sysfs_root(root) / JTOP_SOCKET


def service_error(message: str, socket: Path) -> str:
    """One line for a client that could not reach the service: jetson-stats' message, then the fix."""
    said = _one_line(message)
    lowered = said.lower()
    if "not active" in lowered or "connection refused" in lowered:
        return f"the jtop service does not answer at {socket} ({said}); {_START}; {_MOUNT}"
    if "can't access" in lowered or "permission" in lowered:
        return f"no permission to use the jtop service at {socket}; {_GROUP}"
    if "mismatch" in lowered:
        return f"jetson-stats here does not match the jtop service ({said}); {_SAME_VERSION}"
    if "authentication" in lowered:
        return f"the jtop service refused this client ({said}); {_SAME_VERSION}"
    return f"the jtop service at {socket} failed ({said}); restart it: `sudo systemctl restart jtop`"


def _library() -> Any:
    try:
        return importlib.import_module("jtop")
    except ModuleNotFoundError as exc:
        if exc.name != "jtop":
            raise
        raise DeviceError(f"jetson-stats (the jtop client) is not installed; {_INSTALL}") from None


def connect(root: str | os.PathLike | None = None, interval_s: float = DEFAULT_INTERVAL_S) -> Any:
    """A started jtop client; :class:`DeviceError` (one line with the fix) when the service is unreachable."""
    socket = socket_path(root)
    if not socket.exists():
        raise DeviceError(f"no jtop service: {socket} does not exist; {_START}; {_MOUNT}")
    lib = _library()
    client = lib.jtop(interval=interval_s)
    try:
        client.start()
    except lib.JtopException as exc:
        _close_quietly(client)
        raise DeviceError(service_error(str(exc), socket)) from None
    except (OSError, EOFError, queue.Empty) as exc:  # errors the library passes through unmapped
        _close_quietly(client)
        raise DeviceError(service_error(f"{exc.__class__.__name__}: {exc}", socket)) from None
    return client


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001, S110 - the client failed already; its own error is the one to report
        pass


def _check_alive(client: Any) -> None:
    """Raise :class:`DeviceError` when the client lost the service (``ok(spin=True)`` re-raises its error)."""
    try:
        running = client.ok(spin=True)
    except Exception as exc:  # noqa: BLE001 - the library re-raises whatever its reader thread caught
        raise DeviceError(f"lost the jtop service: {_one_line(exc)}; {_START}") from None
    if not running:
        raise DeviceError(f"the jtop client stopped; {_START}")


# ---------------------------------------------------------------------------------------------- power


class JtopPowerSensor:
    """Board total and per-rail power from the jtop service (values change once per service interval).

    ``update_period_s`` is the service's interval (``jetson.interval``), the interval in force when another
    client connected first with its own.
    """

    def __init__(self, client: Any, clock: RealClock | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._client = client
        self._clock = clock or RealClock()
        power = client.power or {}
        rails, total = power.get("rail") or {}, power.get("tot") or {}
        if not rails and not total:
            raise DeviceError("the jtop service reports no power rails; check that the board's ina3221 "
                              "driver is loaded")
        #: the board input rail jtop takes the total from (``VDD_IN`` ...), None where it sums the rails
        self.input_rail: str | None = total.get("name") or None
        online = tuple(name for name, rail in rails.items() if rail.get("online", True))
        self.rails: tuple[str, ...] = ((self.input_rail,) if self.input_rail else ()) + online
        self.total_label = self.input_rail or DERIVED_PREFIX + " + ".join(online)
        served = float(getattr(client, "interval", 0.0) or 0.0)
        self.update_period_s = served if served > 0 else float(interval_s)
        self.period_source = "jtop service interval"

    def read(self) -> PowerReading:
        t = self._clock.now()
        _check_alive(self._client)
        power = self._client.power or {}
        try:
            total_w = float(power["tot"]["power"]) / 1e3
            rails = {name: float(rail["power"]) / 1e3 for name, rail in power["rail"].items()
                     if rail.get("online", True)}
        except (KeyError, TypeError) as exc:
            raise ValueError(f"jtop power data lacks {exc}: {str(power)[:80]}") from None
        if self.input_rail:
            rails = {self.input_rail: total_w, **rails}
        return PowerReading(t, total_w, rails)

    def energy_j(self) -> float | None:
        return None  # jtop keeps no energy counter: the monitor integrates


# ---------------------------------------------------------------------------------------------- knobs


def _wait(what: str, done: Callable[[], bool], client: Any, timeout_s: float, why: Callable[[], str]) -> None:
    """Poll until the service shows ``done()``; :class:`KnobWriteError` if not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _check_alive(client)
        except DeviceError as exc:
            raise KnobWriteError(f"{what}: {exc}") from None
        if done():
            return
        if time.monotonic() >= deadline:
            raise KnobWriteError(f"{what}: the jtop service did not make the change within {timeout_s:g} s"
                                 f"{why()}")
        time.sleep(POLL_S)


def _power_mode_knob(client: Any, tracker: StateTracker,
                     timeout_s: float) -> tuple[RestorableKnob | None, list[str]]:
    """``power_mode`` through the service, and notes on the modes it cannot switch to; no knob (None) with one
    note where the board has no nvpmodel."""
    nvp = client.nvpmodel
    if nvp is None:
        return None, ["no nvpmodel on this board: power_mode cannot be tuned"]
    models = [str(m) for m in nvp.models]
    status = list(nvp.status)
    current = str(nvp.name)
    # jetson-stats marks modes it cannot switch to without a reboot (another GPU power-gating mask), and
    # modes whose switch failed, False in ``status``
    offered = [m for i, m in enumerate(models) if m == current or i >= len(status) or status[i]]
    notes = []
    held_back = [m for m in models if m not in offered]
    if held_back:
        notes.append(f"power_mode {', '.join(held_back)} not offered: the jtop service cannot switch to them "
                     f"without a reboot (`sudo nvpmodel -m <id>` on the host)")

    def switch(mode_id: int) -> None:
        name = models[mode_id]
        try:
            client.nvpmodel.set_nvpmodel_id(mode_id)
        except Exception as exc:  # noqa: BLE001 - JtopException (the library's), ValueError
            raise KnobWriteError(f"power_mode: the jtop service refused {name}: {_one_line(exc)}") from None

        def why() -> str:
            failed = mode_id < len(client.nvpmodel.status) and not client.nvpmodel.status[mode_id]
            return (" (nvpmodel reported an error)" if failed else
                    f" (still {client.nvpmodel.name}); see `journalctl -u jtop` on the host")

        _wait(f"power_mode {name}", lambda: int(client.nvpmodel.id) == mode_id, client, timeout_s, why)

    def read() -> str:
        return str(client.nvpmodel.name)

    def write(value: str) -> None:
        switch(models.index(str(value)))

    def snapshot() -> dict[str, Any]:
        return {"id": int(client.nvpmodel.id), "name": str(client.nvpmodel.name)}

    def restore(snap: dict[str, Any]) -> None:
        mode_id, name = int(snap["id"]), str(snap["name"])
        if not (0 <= mode_id < len(models)) or models[mode_id] != name:
            raise ValueError(f"power_mode: saved mode {name!r} (id {mode_id}) is not one of this board's "
                             f"modes ({', '.join(models)})")
        switch(mode_id)

    unavailable = {m: (f"needs a reboot: the jtop service cannot switch to it (another GPU power-gating mask, or "
                       f"a failed switch); to use it, run `sudo nvpmodel -m {models.index(m)}` on the host, answer "
                       f"YES to reboot, and run edgetune again there") for m in held_back}
    knob = RestorableKnob("power_mode", "", offered, read=read, write=write, snapshot=snapshot,
                          restore_snapshot=restore, tracker=tracker, unavailable=unavailable,
                          description="nvpmodel power mode through the jtop service")
    return knob, notes


def _jetson_clocks_knob(client: Any, tracker: StateTracker, timeout_s: float) -> RestorableKnob | None:
    """``jetson_clocks`` (off/on) through the service."""
    if client.jetson_clocks is None:
        return None

    def is_on() -> bool:
        return bool(client.jetson_clocks)

    def switch(enable: bool) -> None:
        if is_on() == enable:
            return  # jetson-stats refuses "off" whenever it stored no clocks, even when already off
        try:
            client.jetson_clocks.set_enable(enable)
        except Exception as exc:  # noqa: BLE001 - JtopException (the library's), ValueError
            word = "on" if enable else "off"
            raise KnobWriteError(f"jetson_clocks: the jtop service cannot switch it {word}: "
                                 f"{_one_line(exc)}") from None

        def why() -> str:
            return f" (jtop reports it {client.jetson_clocks.status})"

        _wait(f"jetson_clocks {'on' if enable else 'off'}", lambda: is_on() == enable, client, timeout_s, why)

    def restore(snap: dict[str, Any]) -> None:
        enable = snap["enable"]
        if not isinstance(enable, bool):  # ValueError, as for every snapshot a device would not accept
            raise ValueError(f"jetson_clocks: saved state {enable!r} is not on or off")  # noqa: TRY004
        switch(enable)

    # jtop switches jetson_clocks off only to the clocks it stored when it switched them on itself
    jc = client.jetson_clocks
    uncontrolled = (is_on() and not jc.is_config()) or jc.status == "uncontrolled"
    why = ("jetson_clocks was switched on outside jtop, which has no stored clocks to return to and cannot "
           "switch it off; reboot, or `sudo jetson_clocks --restore` where its clocks were saved with "
           "`--store`") if uncontrolled else ""
    return RestorableKnob("jetson_clocks", "", JETSON_CLOCKS_VALUES, read=lambda: "on" if is_on() else "off",
                          write=lambda value: switch(value == "on"), writable=not uncontrolled,
                          why_read_only=why, snapshot=lambda: {"enable": is_on()}, restore_snapshot=restore,
                          tracker=tracker,
                          description="jetson_clocks through the jtop service (on: clocks at the mode's "
                                      "maximum)")


# ---------------------------------------------------------------------------------------------- device


@dataclass
class JtopBackend:
    """What :func:`open` found, kept on ``Device.backend`` for ``edgetune devices`` and tests."""

    client: Any
    socket: Path
    hardware: dict[str, Any]
    sensor: JtopPowerSensor
    tracker: StateTracker
    notes: list[str] = field(default_factory=list)


def _describe(hardware: dict[str, Any]) -> str:
    name = str(hardware.get("Model") or "NVIDIA Jetson (model unknown)")
    l4t, jetpack = hardware.get("L4T"), hardware.get("Jetpack")
    extra = ", ".join(x for x in (str(hardware.get("Module") or ""), f"L4T {l4t}" if l4t else "",
                                   f"JetPack {jetpack}" if jetpack else "") if x)
    return f"{name} ({extra})" if extra else name


def open(arg: str = "", *, root: str | os.PathLike | None = None, interval_s: float = DEFAULT_INTERVAL_S,
         switch_timeout_s: float = SWITCH_TIMEOUT_S, **_other: Any) -> Device:
    """Connect to the jtop service and build the device. ``arg`` is unused (one board per service).

    Args:
        root: the root the socket is looked for under (default ``EDGETUNE_SYSFS_ROOT``, else ``/``).
        interval_s: the update interval asked of the service (the first client's request is the one kept).
        switch_timeout_s: how long a power mode or jetson_clocks switch may take (:data:`SWITCH_TIMEOUT_S`).
    """
    base = sysfs_root(root)
    client = connect(base, interval_s)
    try:
        hardware = dict((client.board or {}).get("hardware") or {})
        sensor = JtopPowerSensor(client, interval_s=interval_s)
        description = _describe(hardware)
        identity = DeviceIdentity("jtop", description, root=str(base.resolve()),
                                  serial=str(hardware.get("Serial Number") or ""))
        tracker = StateTracker(identity)
        knobs: dict[str, RestorableKnob] = {}
        mode, notes = _power_mode_knob(client, tracker, switch_timeout_s)
        # a board without nvpmodel: its note says why a state file's power mode cannot be written back
        missing = {} if mode is not None else {"power_mode": notes[0]}
        if mode is not None:
            knobs["power_mode"] = mode
        clocks = _jetson_clocks_knob(client, tracker, switch_timeout_s)
        if clocks is not None:
            knobs["jetson_clocks"] = clocks
    except BaseException:
        _close_quietly(client)
        raise

    window_s = min_avg_window_s(sensor.update_period_s)
    notes.append(f"power from the jtop service, updated every {sensor.update_period_s:g} s (sysfs: every few "
                 f"ms): budgets are judged on a moving average of at least {window_s:g} s "
                 f"({MIN_UPDATES_PER_WINDOW} updates) and each measurement spans at least that; for 1-s "
                 f"budgets use --device jetson as root")
    notes.append("knobs through jtop: power_mode and jetson_clocks; GPU, CPU and memory clocks need "
                 "--device jetson as root")
    for rail in sensor.rails:
        if rail in COMBINED_RAILS:
            notes.append(f"{rail} is one rail for the {COMBINED_RAILS[rail]}")
    notes.append(f"board total is the input rail {sensor.total_label}" if sensor.input_rail else
                 "no board input rail reported: total is jtop's sum of the rails")
    backend = JtopBackend(client, socket_path(base), hardware, sensor, tracker, notes)

    def close() -> None:
        try:
            tracker.restore_all()
        finally:
            _close_quietly(client)

    # the thermal zones are world-readable: the board temperature needs no service (optional: a note, no error)
    temperature, temperature_note = board_temperature(base)
    if temperature_note:
        notes.append(temperature_note)
    return Device(name="jtop", description=description, simulated=False, knobs=dict(knobs), sensor=sensor,
                  clock=RealClock(), run_step=_run_step, temperature=temperature or (lambda: None), notes=notes,
                  close=close, backend=backend, compute=JETSON_COMPUTE,
                  capabilities=frozenset({Capability.WHOLE_MACHINE}), missing_knobs=missing)


def probe(root: str | os.PathLike | None = None) -> list[PlatformProbe]:
    """Whether a jtop service answers, without changing anything."""
    try:
        client = connect(root)
    except DeviceError as exc:
        return [PlatformProbe("jtop", False, summary=str(exc))]
    try:
        hardware = dict((client.board or {}).get("hardware") or {})
        interval = float(getattr(client, "interval", 0.0) or 0.0)
        controls = (("power_mode", client.nvpmodel), ("jetson_clocks", client.jetson_clocks))
        knobs = [name for name, control in controls if control is not None]
        details = [f"service interval {interval:g} s; knobs: {', '.join(knobs) or 'none'}"]
        return [PlatformProbe("jtop", True, spec="jtop", summary=_describe(hardware), details=details)]
    finally:
        _close_quietly(client)
