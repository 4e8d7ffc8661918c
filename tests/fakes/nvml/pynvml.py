"""A fake ``pynvml`` (nvidia-ml-py) for tests: the real names, constants, return units and error classes.

Put this directory first on ``sys.path`` / ``PYTHONPATH`` and point ``FAKE_NVML_STATE`` at a JSON file
written by ``fakes.nvml_gpus.write_gpus``. The JSON file is the "driver": the GPUs, their clock tables
and limits, their locked clocks and power limit, which calls fail with which NVML return code, and
whether this process has the privilege to change settings. Being a file, its state outlives a killed
process, as a real GPU's does.

Units as NVML's: clocks in MHz, power in mW, energy in mJ. Return codes as nvml.h.
"""

from __future__ import annotations

import json
import os
import time

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3

NVML_TEMPERATURE_GPU = 0

NVML_DEVICE_ARCH_PASCAL = 4
NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_TURING = 6
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF

NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_POWER_SCOPE_GPU = 0
NVML_POWER_SCOPE_MODULE = 1
NVML_POWER_SCOPE_MEMORY = 2

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As in pynvml: ``NVMLError(code)`` builds the subclass for that code; ``.value`` is the code."""

    _valClassMapping: dict[int, type] = {}  # noqa: RUF012 - the name and shape pynvml uses

    def __new__(cls, value):
        typ = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __init__(self, value):
        self.value = value

    def __str__(self):
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _subclass(name, code):
    cls = type(name, (NVMLError,), {"__new__": lambda c, v=code: NVMLError.__new__(c, v),
                                    "__init__": lambda self, v=code: setattr(self, "value", v)})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _subclass("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_Unknown = _subclass("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

_initialised = 0


def _path():
    return os.environ["FAKE_NVML_STATE"]


def _load():
    with open(_path()) as f:
        return json.load(f)


def _save(state):
    tmp = _path() + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, _path())


def _check(name, gpu=None):
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    state = _load()
    code = state.get("fail", {}).get(name)
    if gpu is not None:
        code = state["gpus"][gpu].get("fail", {}).get(name, code)
    if code:
        raise NVMLError(int(code))
    return state


def _privileged(state):
    if not state.get("privileged", True):
        raise NVMLError(NVML_ERROR_NO_PERMISSION)


def nvmlInit():
    global _initialised
    if not os.environ.get("FAKE_NVML_STATE") or not os.path.exists(_path()):
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    state = _load()
    if state.get("fail", {}).get("nvmlInit"):
        raise NVMLError(int(state["fail"]["nvmlInit"]))
    _initialised += 1


def nvmlShutdown():
    global _initialised
    if not _initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _initialised -= 1


def nvmlErrorString(result):
    return _STRINGS.get(result, "Unknown Error")


def nvmlDeviceGetCount():
    return len(_check("nvmlDeviceGetCount")["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    state = _check("nvmlDeviceGetHandleByIndex")
    if not 0 <= index < len(state["gpus"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index  # real handles are opaque c_void_p; an index serves the same purpose here


def nvmlDeviceGetName(handle):
    return _check("nvmlDeviceGetName", handle)["gpus"][handle]["name"]


def nvmlDeviceGetUUID(handle):
    return _check("nvmlDeviceGetUUID", handle)["gpus"][handle]["uuid"]


class c_nvmlPciInfo_t:
    """The fields of nvmlPciInfo_t edgetune reads: ``busId`` as bytes, as pynvml returns C strings."""

    def __init__(self, bus_id):
        self.busId = bus_id.encode()


def nvmlDeviceGetPciInfo(handle):
    return c_nvmlPciInfo_t(_check("nvmlDeviceGetPciInfo", handle)["gpus"][handle]["pci_bus_id"])


def nvmlDeviceGetArchitecture(handle):
    return _check("nvmlDeviceGetArchitecture", handle)["gpus"][handle]["arch"]


def _power_mw(gpu):
    clock = gpu["locked_gpu_mhz"] or max(gpu["graphics_mhz"])
    draw = gpu["idle_mw"] + (gpu["busy_mw"] - gpu["idle_mw"]) * (clock / max(gpu["graphics_mhz"])) ** 2
    return int(min(draw, gpu["limit_mw"]))


def _energy_mj(gpu):
    return int(gpu["energy_mj"] + (time.time() - gpu["energy_t"]) * _power_mw(gpu))


def _settle_energy(gpu):  # before the power changes, bank the energy spent so far
    gpu["energy_mj"] = _energy_mj(gpu)
    gpu["energy_t"] = time.time()


def nvmlDeviceGetPowerUsage(handle):
    return _power_mw(_check("nvmlDeviceGetPowerUsage", handle)["gpus"][handle])


class c_nvmlValue_t:  # pynvml's name (a ctypes union there)
    def __init__(self, ui=0):
        self.uiVal = ui


class c_nvmlFieldValue_t:  # pynvml's name (a ctypes structure there)
    def __init__(self, field_id, scope_id):
        self.fieldId, self.scopeId = field_id, scope_id
        self.timestamp = int(time.time() * 1e6)
        self.latencyUsec = 0
        self.valueType = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
        self.nvmlReturn = NVML_SUCCESS
        self.value = c_nvmlValue_t()


def nvmlDeviceGetFieldValues(handle, fieldIds):
    """Per-field results as NVML gives them: each request a field id or (field id, scope id); a field this
    GPU does not give comes back with its ``nvmlReturn`` set (a GPU's ``fail`` map: ``"field:<id>": code``),
    the call itself succeeding. The power fields read the GPU's power now (the fake's power is steady)."""
    gpu = _check("nvmlDeviceGetFieldValues", handle)["gpus"][handle]
    out = []
    for request in fieldIds:
        field_id, scope_id = request if isinstance(request, tuple) else (request, NVML_POWER_SCOPE_GPU)
        value = c_nvmlFieldValue_t(field_id, scope_id)
        code = gpu.get("fail", {}).get(f"field:{field_id}")
        if code:
            value.nvmlReturn = int(code)
        elif field_id in (NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT) and scope_id == NVML_POWER_SCOPE_GPU:
            value.value.uiVal = _power_mw(gpu)
        else:
            value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        out.append(value)
    return out


def nvmlDeviceGetTemperature(handle, sensor):
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(_check("nvmlDeviceGetTemperature", handle)["gpus"][handle].get("temperature_c", 35))  # whole degC


def nvmlDeviceGetTotalEnergyConsumption(handle):
    return _energy_mj(_check("nvmlDeviceGetTotalEnergyConsumption", handle)["gpus"][handle])


def nvmlDeviceGetSupportedMemoryClocks(handle):
    return list(_check("nvmlDeviceGetSupportedMemoryClocks", handle)["gpus"][handle]["memory_mhz"])


def nvmlDeviceGetSupportedGraphicsClocks(handle, memoryClockMHz):
    gpu = _check("nvmlDeviceGetSupportedGraphicsClocks", handle)["gpus"][handle]
    if memoryClockMHz not in gpu["memory_mhz"]:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return sorted(gpu["graphics_mhz"], reverse=True)  # NVML lists fastest first


def nvmlDeviceGetClockInfo(handle, type):
    gpu = _check("nvmlDeviceGetClockInfo", handle)["gpus"][handle]
    if type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
        return gpu["locked_gpu_mhz"] or gpu["boost_mhz"]
    if type == NVML_CLOCK_MEM:
        return gpu["locked_mem_mhz"] or max(gpu["memory_mhz"])
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def _set(name, handle, key, value):
    state = _check(name, handle)
    _privileged(state)
    gpu = state["gpus"][handle]
    _settle_energy(gpu)
    gpu[key] = value
    _save(state)


def nvmlDeviceSetGpuLockedClocks(handle, minGpuClockMHz, maxGpuClockMHz):
    gpu = _load()["gpus"][handle]
    if minGpuClockMHz > maxGpuClockMHz or minGpuClockMHz < min(gpu["graphics_mhz"]):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set("nvmlDeviceSetGpuLockedClocks", handle, "locked_gpu_mhz", maxGpuClockMHz)


def nvmlDeviceResetGpuLockedClocks(handle):
    _set("nvmlDeviceResetGpuLockedClocks", handle, "locked_gpu_mhz", 0)


def nvmlDeviceSetMemoryLockedClocks(handle, minMemClockMHz, maxMemClockMHz):
    if minMemClockMHz not in _load()["gpus"][handle]["memory_mhz"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set("nvmlDeviceSetMemoryLockedClocks", handle, "locked_mem_mhz", maxMemClockMHz)


def nvmlDeviceResetMemoryLockedClocks(handle):
    _set("nvmlDeviceResetMemoryLockedClocks", handle, "locked_mem_mhz", 0)


def nvmlDeviceGetPowerManagementLimitConstraints(handle):
    gpu = _check("nvmlDeviceGetPowerManagementLimitConstraints", handle)["gpus"][handle]
    return [gpu["limit_min_mw"], gpu["limit_max_mw"]]


def nvmlDeviceGetPowerManagementDefaultLimit(handle):
    return _check("nvmlDeviceGetPowerManagementDefaultLimit", handle)["gpus"][handle]["limit_default_mw"]


def nvmlDeviceGetPowerManagementLimit(handle):
    return _check("nvmlDeviceGetPowerManagementLimit", handle)["gpus"][handle]["limit_mw"]


def nvmlDeviceSetPowerManagementLimit(handle, limit):
    gpu = _load()["gpus"][handle]
    if not gpu["limit_min_mw"] <= limit <= gpu["limit_max_mw"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _set("nvmlDeviceSetPowerManagementLimit", handle, "limit_mw", int(limit))
