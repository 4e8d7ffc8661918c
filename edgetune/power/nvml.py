"""NVIDIA GPUs through NVML (``pynvml`` from the nvidia-ml-py package).

* power: the instantaneous reading (``nvmlDeviceGetFieldValues`` with ``NVML_FI_DEV_POWER_INSTANT``, mW, at
  GPU scope) where the driver gives one, else ``nvmlDeviceGetPowerUsage`` (mW), which on Ampere (except
  GA100) and newer is itself an average over 1 s (NVML's documentation): a budget's 1-s moving average of
  such readings spans about 2 s of the board and flattens a peak shorter than that further, and a trial
  over the budget is stopped about a second late; the device's notes say which one is read. The total
  energy counter ``nvmlDeviceGetTotalEnergyConsumption`` (mJ, Volta and newer) is read where the GPU keeps
  one (``WindowStats.hardware_energy_j``);
* knobs: ``gpu_freq`` (Hz; NVML speaks MHz) locked with ``nvmlDeviceSetGpuLockedClocks`` from the
  supported-clocks table and reset with ``nvmlDeviceResetGpuLockedClocks``; ``mem_freq`` (Hz) likewise
  with the memory locked clocks; ``power_limit`` (W) within the management-limit constraints, restored to
  the limit found. NVML locks GPU clocks on Volta and newer, memory clocks on Ampere and newer: on older
  GPUs (``nvmlDeviceGetArchitecture``) the knob is read-only and says why, so a search never meets
  NVML's NotSupported at its first trial (a Turing card lists several memory clocks it cannot lock);
* devices: ``nvml`` is the first visible GPU, ``nvml:<i>`` the i-th, ``nvml:<UUID>`` one GPU by UUID. Numbers
  are CUDA's (:class:`~edgetune.power.cuda_order.CudaNumbering`): ``CUDA_DEVICE_ORDER`` and
  ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs/prefixes) are read as CUDA reads them, so ``nvml:i`` is the GPU
  that ``cuda:i`` names in torch, and the device's :class:`~edgetune.power.base.ComputeDevice` is ``cuda:i``.
  NVML lists GPUs in PCI order, CUDA by default fastest first: on a machine with unlike GPUs (a display GPU
  beside a compute GPU) and no ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, a number is refused in one line rather than
  guessed.

NVML cannot report whether clocks were locked before edgetune ran: restore resets them to the default
(unlocked) state, which is the state of nearly every machine. Setting anything needs root; without it the
knobs are read-only with the fix in one line, and the device is in measure-only mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgetune.power.base import (
    Capability,
    ComputeDevice,
    Device,
    DeviceError,
    KnobWriteError,
    PowerReading,
)
from edgetune.power.clock import RealClock
from edgetune.power.cuda_order import PCI_BUS_ORDER, CudaNumbering, cuda_numbering, cuda_step_runner
from edgetune.power.cuda_order import nvml_text as _text
from edgetune.power.knobs import knob_unit
from edgetune.power.registry import PlatformProbe
from edgetune.power.state import DeviceIdentity, RestorableKnob, StateTracker
from edgetune.power.sysfs import ROOT_FIX, is_root

__all__ = ["CudaNumbering", "NvmlGpu", "NvmlPowerSensor", "cuda_numbering", "nvml_message", "open", "probe"]

#: NVML refreshes the power reading about every 20-100 ms depending on the GPU; sampling at 50 Hz is plenty.
NVML_UPDATE_PERIOD_S = 0.02
#: NVML speaks milliwatts and millijoules; edgetune watts and joules.
_MILLI_PER_UNIT = 1e3
#: NVML speaks MHz; clock knobs are in Hz.
_HZ_PER_MHZ = 1_000_000
#: Power-limit grid: 5 W steps on GPUs whose limit reaches 100 W (fine enough for a budget, few enough to
#: search), 1 W steps below.
_LIMIT_STEP_W = 5
_SMALL_LIMIT_STEP_W = 1
_LARGE_LIMIT_MW = 100_000
#: nvmlDeviceArchitecture_t values (nvml.h): locked GPU clocks need Volta or newer, locked memory clocks
#: Ampere or newer (nvmlDeviceSetGpuLockedClocks, nvmlDeviceSetMemoryLockedClocks).
_NVML_ARCH_VOLTA = 5
_NVML_ARCH_AMPERE = 7
_NVML_ARCH_UNKNOWN = 0xFFFFFFFF
_ARCH_NAMES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing"}
#: nvml.h's success code (a field value's ``nvmlReturn``).
_NVML_SUCCESS = 0
#: nvml.h codes of a missing library and an unloaded driver, for pynvml versions without the names.
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_DRIVER_NOT_LOADED = 9

_ERROR_NAMES = {  # NVML return codes (nvml.h) -> what the user should know
    3: "not supported on this GPU",
    4: f"not permitted: {ROOT_FIX}",
    999: "NVML reported an unknown error (code 999); check `nvidia-smi` and the kernel log (dmesg)",
    15: "the GPU has fallen off the bus (GPU is lost); check `nvidia-smi` and reboot",
    2: "NVML rejected the value (invalid argument)",
}


def _pynvml():
    try:
        import pynvml
    except ImportError:
        raise DeviceError("NVML: the nvidia-ml-py package is not installed; pip install nvidia-ml-py") from None
    return pynvml


def nvml_message(exc: BaseException, what: str) -> str:
    """One line for an NVML error: what was attempted, what NVML said, the fix where there is one."""
    code = getattr(exc, "value", None)
    return f"{what}: {_ERROR_NAMES.get(code, f'NVML error {code}: {exc}')}"


def _call(what: str, fn: Callable[..., Any], *args: Any, error: type[DeviceError] = DeviceError) -> Any:
    nvml = _pynvml()
    try:
        return fn(*args)
    except nvml.NVMLError as exc:
        raise error(nvml_message(exc, what)) from None


@dataclass
class NvmlGpu:
    """One GPU: its physical NVML index, handle, name and UUID."""

    index: int
    handle: Any
    name: str
    uuid: str


class NvmlPowerSensor:
    """GPU board power, instantaneous where the driver reads it (module docs), and the hardware energy
    counter where present.

    Attributes:
        instant: the readings are NVML's instantaneous power (``NVML_FI_DEV_POWER_INSTANT``); False: they are
            ``nvmlDeviceGetPowerUsage``'s, averaged over 1 s on Ampere (except GA100) and newer.
    """

    update_period_s = NVML_UPDATE_PERIOD_S
    period_source = "NVML refresh interval"

    def __init__(self, gpu: NvmlGpu, label: str, clock: RealClock | None = None) -> None:
        self._nvml = _pynvml()
        self._gpu = gpu
        self._clock = clock or RealClock()
        self.rails = (label,)
        self.total_label = f"{label} board power (NVML)"
        try:
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(gpu.handle)
            self.has_energy_counter = True
        except self._nvml.NVMLError:
            self.has_energy_counter = False
        self._instant_field = _instant_power_field(self._nvml)
        self.instant = self._reads_instant()

    def _instant_mw(self) -> int:
        """NVML's instantaneous power (mW); raises NVMLError (a failed call or field)."""
        value = self._nvml.nvmlDeviceGetFieldValues(self._gpu.handle, [self._instant_field])[0]
        if value.nvmlReturn != _NVML_SUCCESS:
            raise self._nvml.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal)

    def _reads_instant(self) -> bool:
        if self._instant_field is None:
            return False
        try:
            self._instant_mw()
        except (self._nvml.NVMLError, AttributeError, TypeError):  # this GPU, driver or pynvml has none
            return False
        return True

    def read(self) -> PowerReading:
        t = self._clock.now()
        try:  # the instantaneous reading is never mixed with the averaged one: a failed read is a dropped sample
            mw = self._instant_mw() if self.instant else self._nvml.nvmlDeviceGetPowerUsage(self._gpu.handle)
        except self._nvml.NVMLError as exc:
            raise DeviceError(nvml_message(exc, f"power reading of GPU {self._gpu.index}")) from None
        w = mw / _MILLI_PER_UNIT
        return PowerReading(t, w, {self.rails[0]: w})

    @property
    def reading_note(self) -> str:
        """One line on what a power reading is (the device's notes)."""
        if self.instant:
            return "power: NVML's instantaneous reading (NVML_FI_DEV_POWER_INSTANT, GPU scope)"
        return ("power: nvmlDeviceGetPowerUsage, no instantaneous reading on this GPU or driver; on Ampere "
                "(except GA100) and newer it is an average over 1 s, so a budget's 1-s average spans about 2 s "
                "and a trial over the budget stops about a second late")

    def energy_j(self) -> float | None:
        if not self.has_energy_counter:
            return None
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._gpu.handle) / _MILLI_PER_UNIT
        except self._nvml.NVMLError:
            return None


def _instant_power_field(nvml: Any) -> Any:
    """The field request for instantaneous GPU power in this pynvml: (field, GPU scope) where it has power
    scopes, the bare field where it has the field alone, None where it has neither."""
    field = getattr(nvml, "NVML_FI_DEV_POWER_INSTANT", None)
    if field is None or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
        return None
    scope = getattr(nvml, "NVML_POWER_SCOPE_GPU", None)
    return field if scope is None else (field, scope)


def _architecture(nvml: Any, gpu: NvmlGpu) -> int | None:
    """The GPU's ``nvmlDeviceArchitecture_t``; None where NVML or pynvml cannot say."""
    try:
        arch = int(nvml.nvmlDeviceGetArchitecture(gpu.handle))
    except (nvml.NVMLError, AttributeError):
        return None
    return None if arch == _NVML_ARCH_UNKNOWN else arch


def _lock_support(arch: int | None, since: int, what: str, since_name: str) -> str:
    """Why ``what`` cannot be locked on a GPU of ``arch`` (NVML: ``since`` and newer), or ``""``."""
    if arch is None or arch >= since:
        return ""
    name = _ARCH_NAMES.get(arch, f"architecture {arch}")
    return f"NVML locks {what} on {since_name} and newer GPUs; this one is {name}"


def _clock_knobs(nvml: Any, gpu: NvmlGpu, tracker: StateTracker, writable: bool, why: str) -> dict[str, RestorableKnob]:
    h = gpu.handle
    knobs: dict[str, RestorableKnob] = {}
    try:
        mem_mhz = sorted(nvml.nvmlDeviceGetSupportedMemoryClocks(h))
    except nvml.NVMLError:
        return knobs  # no clock tables (NotSupported): nothing to lock
    gfx_mhz = sorted({int(f) for m in mem_mhz for f in nvml.nvmlDeviceGetSupportedGraphicsClocks(h, m)})
    arch = _architecture(nvml, gpu)
    gpu_unsupported = _lock_support(arch, _NVML_ARCH_VOLTA, "GPU clocks", "Volta")
    mem_unsupported = _lock_support(arch, _NVML_ARCH_AMPERE, "memory clocks", "Ampere")

    def _reset(what: str, fn: Callable[[Any], None]) -> None:
        try:
            fn(h)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_NOT_SUPPORTED:
                return  # a GPU that cannot lock clocks never had them locked: nothing to undo
            raise KnobWriteError(nvml_message(exc, what)) from None

    def gpu_read() -> int:
        return int(_call("GPU clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_GRAPHICS)) * _HZ_PER_MHZ

    def gpu_write(hz: int) -> None:
        mhz = round(hz / 1e6)
        _call("gpu_freq", nvml.nvmlDeviceSetGpuLockedClocks, h, mhz, mhz, error=KnobWriteError)

    def gpu_reset(snap: dict[str, Any]) -> None:
        if snap.get("locked") is not False:
            raise ValueError(f"gpu_freq: unexpected saved state {snap!r}")
        _reset("gpu_freq reset", nvml.nvmlDeviceResetGpuLockedClocks)

    knobs["gpu_freq"] = RestorableKnob(
        "gpu_freq", knob_unit("gpu_freq"), [f * _HZ_PER_MHZ for f in gfx_mhz], read=gpu_read, write=gpu_write,
        writable=writable and not gpu_unsupported, why_read_only=gpu_unsupported or why,
        snapshot=lambda: {"locked": False}, restore_snapshot=gpu_reset, tracker=tracker,
        description="GPU locked clocks (nvmlDeviceSetGpuLockedClocks)",
        default_snapshot=lambda: {"locked": False})  # unlocked: nvmlDeviceResetGpuLockedClocks

    if len(mem_mhz) > 1:
        def mem_read() -> int:
            return int(_call("memory clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)) * _HZ_PER_MHZ

        def mem_write(hz: int) -> None:
            mhz = round(hz / 1e6)
            _call("mem_freq", nvml.nvmlDeviceSetMemoryLockedClocks, h, mhz, mhz, error=KnobWriteError)

        def mem_reset(snap: dict[str, Any]) -> None:
            if snap.get("locked") is not False:
                raise ValueError(f"mem_freq: unexpected saved state {snap!r}")
            _reset("mem_freq reset", nvml.nvmlDeviceResetMemoryLockedClocks)

        knobs["mem_freq"] = RestorableKnob(
            "mem_freq", knob_unit("mem_freq"), [m * _HZ_PER_MHZ for m in mem_mhz], read=mem_read, write=mem_write,
            writable=writable and not mem_unsupported, why_read_only=mem_unsupported or why,
            snapshot=lambda: {"locked": False}, restore_snapshot=mem_reset, tracker=tracker,
            description="memory locked clocks (nvmlDeviceSetMemoryLockedClocks)",
            default_snapshot=lambda: {"locked": False})  # unlocked: nvmlDeviceResetMemoryLockedClocks
    return knobs


def _power_limit_knob(nvml: Any, gpu: NvmlGpu, tracker: StateTracker, writable: bool,
                      why: str) -> RestorableKnob | None:
    h = gpu.handle
    try:
        lo_mw, hi_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
        default_mw = nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
        current_mw = nvml.nvmlDeviceGetPowerManagementLimit(h)
    except nvml.NVMLError:
        return None
    step = _LIMIT_STEP_W if hi_mw >= _LARGE_LIMIT_MW else _SMALL_LIMIT_STEP_W
    lo_w, hi_w = lo_mw / _MILLI_PER_UNIT, hi_mw / _MILLI_PER_UNIT
    grid = {float(w) for w in range(int(-(-lo_w // step) * step), int(hi_w) + 1, step)}
    values = sorted(grid | {lo_w, hi_w, default_mw / _MILLI_PER_UNIT, current_mw / _MILLI_PER_UNIT})

    def read() -> float:
        return _call("power limit", nvml.nvmlDeviceGetPowerManagementLimit, h) / _MILLI_PER_UNIT

    def write(watts: float) -> None:
        _call("power_limit", nvml.nvmlDeviceSetPowerManagementLimit, h, round(watts * _MILLI_PER_UNIT), error=KnobWriteError)

    def restore(snap: dict[str, Any]) -> None:
        mw = int(snap["limit_mw"])
        if not lo_mw <= mw <= hi_mw:
            raise ValueError(f"power_limit: saved {mw / _MILLI_PER_UNIT:g} W is outside {lo_w:g}..{hi_w:g} W")
        _call("power_limit", nvml.nvmlDeviceSetPowerManagementLimit, h, mw, error=KnobWriteError)

    return RestorableKnob(
        "power_limit", knob_unit("power_limit"), values, read=read, write=write, writable=writable, why_read_only=why,
        snapshot=lambda: {"limit_mw": int(nvml.nvmlDeviceGetPowerManagementLimit(h))}, restore_snapshot=restore,
        tracker=tracker, description=f"board power limit (default {default_mw / _MILLI_PER_UNIT:g} W)",
        default_snapshot=lambda: {"limit_mw": int(default_mw)})  # nvmlDeviceGetPowerManagementDefaultLimit


def _init() -> Any:
    nvml = _pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code in (getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", _NVML_ERROR_LIBRARY_NOT_FOUND),
                    getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", _NVML_ERROR_DRIVER_NOT_LOADED)):
            raise DeviceError("NVML: no NVIDIA driver on this machine (libnvidia-ml not found or driver not "
                              "loaded)") from None
        raise DeviceError(nvml_message(exc, "NVML initialisation")) from None
    return nvml


def _select(nvml: Any, arg: str) -> tuple[NvmlGpu, CudaNumbering]:
    """The GPU ``arg`` names (``''`` or a CUDA number among the visible GPUs, or a UUID) and CUDA's
    numbering of the machine's GPUs."""
    count = _call("GPU count", nvml.nvmlDeviceGetCount)
    numbering = _call("GPU names and PCI bus ids", cuda_numbering, nvml, count)
    arg = arg.strip()
    if arg.startswith("GPU-"):
        for i in range(count):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            if _text(nvml.nvmlDeviceGetUUID(h)) == arg:
                return NvmlGpu(i, h, _text(nvml.nvmlDeviceGetName(h)), arg), numbering
        raise DeviceError(f"no NVIDIA GPU with UUID {arg}; list them with `edgetune devices`")
    if arg and not arg.isdigit():
        raise DeviceError(f"nvml:{arg} is not a GPU index or UUID; use nvml:0, nvml:1 ... or nvml:GPU-<uuid>")
    want = int(arg or 0)
    visible = numbering.visible
    if visible is None:
        raise DeviceError(f"nvml:{want}: which GPU CUDA numbers {want} is unknown here: {numbering.why_unknown}")
    if not visible:
        raise DeviceError("no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES hides them all, or none is installed)")
    if want >= len(visible):
        raise DeviceError(f"nvml:{want}: only {len(visible)} GPU(s) visible (nvml:0..nvml:{len(visible) - 1})")
    i = visible[want]
    h = _call(f"GPU {i}", nvml.nvmlDeviceGetHandleByIndex, i)
    return NvmlGpu(i, h, _text(nvml.nvmlDeviceGetName(h)), _text(nvml.nvmlDeviceGetUUID(h))), numbering


def _compute(gpu: NvmlGpu, numbering: CudaNumbering) -> ComputeDevice:
    """Where training on ``gpu`` runs in torch's words: ``cuda:<its CUDA number>``."""
    k = numbering.cuda_index(gpu.index)
    if k is not None:
        return ComputeDevice(f"cuda:{k}", measures_cpu=False)
    if numbering.visible is None:
        return ComputeDevice(None, f"{gpu.name} ({gpu.uuid}) has no CUDA number known here: "
                                   f"{numbering.why_unknown}", measures_cpu=False)
    return ComputeDevice(None, f"{gpu.name} ({gpu.uuid}) is hidden from CUDA by CUDA_VISIBLE_DEVICES, so "
                               f"training cannot run on it; add its UUID there", measures_cpu=False)


def _temperature_reader(nvml: Any, gpu: Any) -> Callable[[], float | None]:
    """The GPU's temperature in whole degC (``nvmlDeviceGetTemperature``; None where it cannot be read)."""
    sensor_type = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)

    def read() -> float | None:
        try:
            return float(nvml.nvmlDeviceGetTemperature(gpu.handle, sensor_type))
        except nvml.NVMLError:
            return None

    return read


def open(arg: str = "", **_other: Any) -> Device:
    """Open a GPU through NVML: ``arg`` is a visible index (default 0) or a UUID."""
    nvml = _init()
    try:
        gpu, numbering = _select(nvml, arg)
        cuda_index = numbering.cuda_index(gpu.index)
        label = f"GPU{cuda_index if cuda_index is not None else gpu.index}"
        try:
            nvml.nvmlDeviceGetPowerUsage(gpu.handle)
        except nvml.NVMLError as exc:
            raise DeviceError(nvml_message(exc, f"power reading of {gpu.name}")
                              + "; on Jetson before Thor use --device jetson") from None
        sensor = NvmlPowerSensor(gpu, label)
        description = f"{gpu.name} ({gpu.uuid}, NVML index {gpu.index})"
        tracker = StateTracker(DeviceIdentity(f"nvml:{gpu.uuid}", description, serial=gpu.uuid))
        writable = is_root()
        why = "" if writable else f"NVML clock and power-limit settings need root; {ROOT_FIX}"
        knobs = _clock_knobs(nvml, gpu, tracker, writable, why)
        limit = _power_limit_knob(nvml, gpu, tracker, writable, why)
        if limit is not None:
            knobs["power_limit"] = limit
    except BaseException:
        nvml.nvmlShutdown()
        raise
    compute = _compute(gpu, numbering)
    notes = [sensor.reading_note]
    if compute.torch_device is None:
        notes.append(compute.why_unknown)
    notes.append("energy from the GPU's own counter (nvmlDeviceGetTotalEnergyConsumption)"
                 if sensor.has_energy_counter else "no hardware energy counter on this GPU: energy is integrated")
    notes.append("restore resets locked clocks to the driver default (NVML cannot read earlier locks)")
    if not any(k.writable for k in knobs.values()):
        notes.append(f"measure-only: {why or 'no settable clocks or power limit on this GPU'}; "
                     f"the search tunes batch size alone")

    def close() -> None:
        try:
            tracker.restore_all()
        finally:
            nvml.nvmlShutdown()

    return Device(name=f"nvml:{cuda_index}" if cuda_index is not None else f"nvml:{gpu.uuid}",
                  description=description, simulated=False, knobs=dict(knobs), sensor=sensor, clock=RealClock(),
                  run_step=cuda_step_runner(cuda_index), temperature=_temperature_reader(nvml, gpu), notes=notes,
                  close=close, backend=gpu,
                  capabilities=frozenset({Capability.ENERGY_COUNTER}) if sensor.has_energy_counter else frozenset(),
                  compute=compute)


def probe() -> list[PlatformProbe]:
    """One entry per visible GPU; none found when NVML or the driver is missing."""
    try:
        nvml = _init()
    except DeviceError as exc:
        return [PlatformProbe("nvml", False, summary=str(exc))]
    try:
        count = nvml.nvmlDeviceGetCount()
        numbering = cuda_numbering(nvml, count)
        found = []
        if numbering.visible is None:  # CUDA's numbers unknown: each GPU by UUID
            for i in range(count):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                found.append(PlatformProbe("nvml", True, spec=f"nvml:{_text(nvml.nvmlDeviceGetUUID(h))}",
                                           summary=f"{_text(nvml.nvmlDeviceGetName(h))} (NVML index {i}; CUDA's "
                                                   f"number unknown: export CUDA_DEVICE_ORDER={PCI_BUS_ORDER})"))
            return found
        for k, i in enumerate(numbering.visible):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            found.append(PlatformProbe("nvml", True, spec=f"nvml:{k}",
                                       summary=f"{_text(nvml.nvmlDeviceGetName(h))} (NVML index {i})"))
        return found or [PlatformProbe("nvml", False, summary="NVML found no visible GPU")]
    except nvml.NVMLError as exc:
        return [PlatformProbe("nvml", False, summary=nvml_message(exc, "NVML"))]
    finally:
        nvml.nvmlShutdown()
