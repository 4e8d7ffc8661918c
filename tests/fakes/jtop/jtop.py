"""A fake ``jtop`` module (jetson-stats' client) for tests: the library's names, data shapes, units, errors.

Put this directory first on ``sys.path`` / ``PYTHONPATH`` and point ``FAKE_JTOP_STATE`` at a JSON file
written by ``fakes.jtop_service.write_state``. The JSON file plays the jtop *service* (the root daemon behind
``/run/jtop.sock``): the socket's path, whether the service listens and lets this user in, its version and
update interval, the board, the INA3221 rails, the nvpmodel modes and jetson_clocks. Being a file, its state
outlives a killed client, as the board's does; a test changes a rail or stops the service by rewriting it.

What follows the real client (jetson-stats 4.2 to 7.x, ``jtop/jtop.py`` and ``jtop/core``):

* ``from jtop import jtop, JtopException``; ``jtop(interval=1.0)``; ``start()`` / ``close()`` or ``with``;
  ``ok(spin=False)`` raises what the reader thread caught (here: the service went away);
* ``start()`` maps the socket's errors as the library does: a missing socket (ENOENT) or nobody listening
  (ECONNREFUSED) -> ``JtopException("The jtop.service is not active. ...")``; EACCES (the user is not in
  the ``jtop`` group) -> ``JtopException("I can't access jtop.service. ...")``; a service whose major.minor
  version differs -> ``JtopException("Mismatch version jtop service: ...")``;
* ``interval``: the service's interval in seconds, set by the first client (later clients' requests are
  ignored); ``interval_user``: what this client asked for;
* ``power``: ``{'rail': {name: {...}}, 'tot': {...}}``, integers in mV / mA / mW; the board input rail
  (``VIN``, ``POM_5V_IN``, ``VDD_IN``) is moved out of ``rail`` into ``tot`` with a ``name``; without one,
  ``tot`` is the sum of the rails (``power`` and ``avg`` only); ``avg`` is the service's running
  ``(power + previous avg) // 2``;
* ``nvpmodel``: ``None`` where the board has none, else an object with ``models``, ``name``, ``id``,
  ``status`` (per mode: settable without a reboot, False after a failed switch), ``get_default()``,
  ``is_running()``, ``set_nvpmodel_id(i, force=False)``, ``set_nvpmodel_name(name, force=False)`` and
  ``==`` with a name or id; ``jetson.nvpmodel = 1`` / ``= "7W"`` sets it. The service ignores a switch to a
  mode with another GPU power-gating mask (it would need a reboot) and marks a failed ``nvpmodel -m``;
* ``jetson_clocks``: ``None`` where absent, else an object that is truthy when on, with ``status``,
  ``is_config()``, ``boot`` and ``set_enable(bool)``; ``jetson.jetson_clocks = True`` sets it. It cannot be
  switched off unless jtop stored the clocks when it switched it on (the library raises then).

Requests take effect at once (the real service answers within an interval): tests assert on outcomes.
"""

from __future__ import annotations

import errno
import json
import os

__version__ = "4.2.12"

_NOT_ACTIVE = "The jtop.service is not active. Please run:\nsudo systemctl restart jtop.service"
_NO_ACCESS = "I can't access jtop.service.\nPlease logout or reboot this board."
_INPUT_RAILS = ("VIN", "POM_5V_IN", "VDD_IN")  # the order the library picks the total from


class JtopException(Exception):
    """As the library's: the message is the first argument; ``str()`` gives it."""

    def __init__(self, message, errors=""):
        super().__init__(message, errors)
        self.message = message
        self.errors = errors

    def __str__(self):
        return str(self.message)


# ---------------------------------------------------------------------------------------------- the service


def _path() -> str:
    path = os.environ.get("FAKE_JTOP_STATE")
    if not path:
        raise RuntimeError("fake jtop: FAKE_JTOP_STATE is not set (use fakes.jtop_service.write_state)")
    return path


def _load() -> dict:
    with open(_path()) as f:
        return json.load(f)


def _save(state: dict) -> None:
    path = _path()
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(tmp, path)


def _connect(state: dict) -> None:
    """What ``SyncManager.connect()`` to the unix socket raises, from the state of the socket file."""
    sock = state["socket"]
    if not os.path.exists(sock):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), sock)
    if state.get("access", "granted") != "granted":
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), sock)
    if state.get("service", "running") != "running":
        raise ConnectionRefusedError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _rails(state: dict) -> dict:
    rails = {}
    previous = state.setdefault("avg_mw", {})
    for name in sorted(state["rails"]):
        mv, ma = state["rails"][name]
        power = int(mv * (float(ma) / 1000))
        avg = (power + previous[name]) // 2 if name in previous else power
        previous[name] = avg
        rails[name] = {"type": "INA3221", "online": True, "volt": int(mv), "curr": int(ma), "power": power,
                       "avg": avg, "warn": 32760, "crit": 32760}
    return rails


def _power(state: dict) -> dict:
    rails = _rails(state)
    if not rails:
        return {}
    total_name = next((n for n in _INPUT_RAILS if n in rails), "")
    if total_name:
        total = rails.pop(total_name)
        total["name"] = total_name
    else:
        total = {"power": sum(r["power"] for r in rails.values()),
                 "avg": sum(r["avg"] for r in rails.values())}
    return {"rail": rails, "tot": total}


# ---------------------------------------------------------------------------------------------- controls


class NVPModel:
    """``jetson.nvpmodel``: the current mode and the switch request."""

    def __init__(self, client):
        self._client = client

    @property
    def _nvp(self) -> dict:
        return self._client._state()["nvpmodel"]

    @property
    def models(self):
        return list(self._nvp["models"])

    def get_all_nvpmodels(self):
        return self.models

    @property
    def id(self):
        return self._nvp["id"]

    def get_nvpmodel_id(self):
        return self.id

    @property
    def name(self):
        return self._nvp["models"][self._nvp["id"]]

    def get_nvpmodel_name(self):
        return self.name

    @property
    def status(self):
        return list(self._nvp["status"])

    def get_default(self):
        nvp = self._nvp
        return {"name": nvp["models"][nvp["default"]], "id": nvp["default"]}

    def is_running(self):
        return False

    def set_nvpmodel_id(self, nvpmodel_id, force=False):
        if not isinstance(nvpmodel_id, int):
            raise ValueError("Use an int")  # noqa: TRY004 - as the library
        models = self.models
        if nvpmodel_id < 0 or nvpmodel_id > len(models) - 1:
            raise JtopException(f"NV Power Model ID {nvpmodel_id} does not exists! "
                                f"Range [0, {len(models) - 1}]")
        if nvpmodel_id == self.id and not force:
            return
        self._client._request_nvpmodel(nvpmodel_id)

    def set_nvpmodel_name(self, nvpmodel_name, force=False):
        if not isinstance(nvpmodel_name, str):
            raise ValueError("Use a string")  # noqa: TRY004 - as the library
        if nvpmodel_name not in self.models:
            raise JtopException(f"NV Power Model {nvpmodel_name} does not exists! "
                                f"Check all NVPmode available")
        self.set_nvpmodel_id(self.models.index(nvpmodel_name), force)

    def __eq__(self, other):
        if isinstance(other, int):
            return self.id == other
        if isinstance(other, str):
            return self.name == other
        return isinstance(other, NVPModel) and self.id == other.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return self.name


class JetsonClocks:
    """``jetson.jetson_clocks``: truthy when on."""

    def __init__(self, client):
        self._client = client

    @property
    def _jc(self) -> dict:
        return self._client._state()["jetson_clocks"]

    def set_enable(self, enable):
        if not isinstance(enable, bool):
            raise ValueError("Use a boolean")  # noqa: TRY004 - as the library
        jc = self._jc
        if not jc["config"] and not enable:
            raise JtopException("I cannot set jetson_clocks.\nPlease shutdown manually jetson_clocks")
        if jc["thread"] in ("booting", "activating", "deactivating", "uncontrolled"):
            return
        if enable is not jc["enable"]:
            self._client._request_jetson_clocks(enable)

    def get_enable(self):
        return self._jc["enable"]

    def is_config(self):
        return self._jc["config"]

    @property
    def boot(self):
        return self._jc["boot"]

    @property
    def status(self):
        jc = self._jc
        return "running" if jc["enable"] else jc["thread"]

    def __bool__(self):
        return bool(self._jc["enable"])

    def __eq__(self, other):
        if isinstance(other, bool):
            return self._jc["enable"] == other
        return isinstance(other, JetsonClocks) and bool(self) == bool(other)

    def __hash__(self):
        return hash(bool(self))

    def __repr__(self):
        return str(self._jc["enable"])


# ---------------------------------------------------------------------------------------------- client


class jtop:  # the library's name
    """The client: connects to the service on ``start()``; reads go to the service's current state."""

    def __init__(self, interval=1.0):
        self._interval = float(interval)
        self._server_interval = None
        self._running = False
        self._error = None
        self._nvpmodel = None
        self._jetson_clocks = None
        self._board = {}

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self):
        state = _load()
        try:
            _connect(state)
        except FileNotFoundError as e:
            if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
                raise JtopException(_NOT_ACTIVE) from None
            raise
        except ConnectionRefusedError as e:
            if e.errno == errno.ECONNREFUSED:
                raise JtopException(_NOT_ACTIVE) from None
            raise
        except PermissionError as e:
            if e.errno == errno.EACCES:
                raise JtopException(_NO_ACCESS) from None
            raise
        service_version = state.get("version", __version__)
        if _major_minor(service_version) != _major_minor(__version__):
            raise JtopException(f"Mismatch version jtop service: [{service_version}] and client: "
                                f"[{__version__}]. Please run:\n\nsudo jtop --install-service")
        if state.get("interval_s") is None:  # the first client sets the service's speed
            state["interval_s"] = self._interval
        state["clients"] = state.get("clients", 0) + 1
        _save(state)
        self._server_interval = state["interval_s"]
        self._board = {"hardware": dict(state["board"])}
        if state.get("jetson_clocks") is not None:
            self._jetson_clocks = JetsonClocks(self)
        if state.get("nvpmodel") is not None:
            self._nvpmodel = NVPModel(self)
        self._running = True

    def close(self):
        if self._running:
            state = _load()
            state["clients"] = max(0, state.get("clients", 1) - 1)
            _save(state)
        self._running = False

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.close()
        return exc_tb is None

    def ok(self, spin=False):
        if self._running and self._error is None and _load().get("service", "running") != "running":
            self._error = JtopException("Lost connection with jtop server")
            self._running = False
        if self._error is not None:
            raise self._error
        return self._running

    # -- data -------------------------------------------------------------------------------------
    def _state(self) -> dict:
        if self._server_interval is None:
            raise JtopException("fake jtop: read before start()")
        return _load()

    @property
    def interval(self):
        return self._server_interval

    @property
    def interval_user(self):
        return self._interval

    @property
    def board(self):
        return self._board

    @property
    def power(self):
        state = self._state()
        power = _power(state)
        _save(state)  # the running average lives in the service
        return power

    @property
    def gpu(self):
        return {"gpu": {"type": "integrated", "status": {"load": 0.0, "railgate": False, "3d_scaling": True},
                        "freq": {"governor": "nvhost_podgov", "cur": 306000, "min": 306000, "max": 624750}}}

    @property
    def cpu(self):
        n = self._state().get("cpus", 6)
        core = {"online": True, "governor": "schedutil",
                "freq": {"min": 115200, "max": 1510400, "cur": 729600},
                "user": 1.0, "nice": 0.0, "system": 1.0, "idle": 98.0, "model": "ARMv8 Processor rev 1 (v8l)"}
        return {"total": {"user": 1.0, "nice": 0.0, "system": 1.0, "idle": 98.0},
                "cpu": [dict(core) for _ in range(n)]}

    @property
    def nvpmodel(self):
        return self._nvpmodel

    @nvpmodel.setter
    def nvpmodel(self, value):
        if self._nvpmodel is None:
            raise JtopException("nvpmodel not available on this board")
        if isinstance(value, int):
            self._nvpmodel.set_nvpmodel_id(value)
        elif isinstance(value, str):
            self._nvpmodel.set_nvpmodel_name(value)

    @property
    def jetson_clocks(self):
        return self._jetson_clocks

    @jetson_clocks.setter
    def jetson_clocks(self, value):
        if self._jetson_clocks is None:
            raise JtopException("jetson_clocks not available on this board")
        self._jetson_clocks.set_enable(value)

    # -- the service acting on requests ----------------------------------------------------------
    def _request_nvpmodel(self, mode_id):
        state = _load()
        nvp = state["nvpmodel"]
        if nvp["masks"][mode_id] != nvp["masks"][nvp["id"]]:
            _save(state)  # another GPU power-gating mask: the service refuses without force (a reboot)
            return
        if mode_id in nvp.get("fail", []):
            nvp["status"][mode_id] = False  # nvpmodel -m printed NVPM ERROR
        else:
            nvp["id"] = mode_id
            nvp["status"][mode_id] = True
            nvp.setdefault("switches", []).append(mode_id)
        _save(state)

    def _request_jetson_clocks(self, enable):
        state = _load()
        jc = state["jetson_clocks"]
        if enable:
            jc["config"] = True  # jtop stores the clocks (jetson_clocks --store) before it switches them on
        jc["enable"] = bool(enable)
        jc["thread"] = "running" if enable else "inactive"
        jc.setdefault("switches", []).append(bool(enable))
        _save(state)
