"""CUDA's view of the GPUs a backend measures: which GPU ``cuda:<i>`` is, and when its step is done.

NVML lists GPUs in PCI bus order; CUDA numbers them by ``CUDA_DEVICE_ORDER`` and picks among them with
``CUDA_VISIBLE_DEVICES``. :mod:`edgetune.power.nvml` opens ``nvml:<i>`` as the GPU torch calls ``cuda:<i>``
through :func:`cuda_numbering`, and refuses a number it cannot know rather than guess it. Every GPU backend
(NVML, the Jetson's sysfs and jtop) runs a training step with :func:`cuda_step_runner`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgetune.power.base import WorkloadCost

__all__ = ["PCI_BUS_ORDER", "CudaNumbering", "cuda_numbering", "cuda_step_runner", "nvml_text"]

#: CUDA_DEVICE_ORDER's value that numbers GPUs by PCI bus id, as NVML and nvidia-smi list them
PCI_BUS_ORDER = "PCI_BUS_ID"


def nvml_text(value: Any) -> str:
    """A string pynvml returns: bytes in older versions, str in newer."""
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_step_runner(cuda_index: int | None) -> Callable[[Callable[[], Any], int, WorkloadCost | None], Any]:
    """A device's ``run_step`` for a GPU: run the step, then wait for the GPU to finish it (CUDA work is
    asynchronous), the GPU measured where its CUDA number is known (``cuda_index``), else every GPU torch sees.
    torch is never imported here: a workload that does not use it has nothing to wait for."""

    def run_step(fn: Callable[[], Any], batch_size: int, cost: WorkloadCost | None) -> Any:
        result = fn()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            for k in ([cuda_index] if cuda_index is not None else range(torch.cuda.device_count())):
                torch.cuda.synchronize(k)
        return result

    return run_step


@dataclass(frozen=True)
class CudaNumbering:
    """How CUDA numbers this machine's GPUs, as far as NVML and the environment tell.

    CUDA numbers every GPU by ``CUDA_DEVICE_ORDER``: ``PCI_BUS_ID`` by PCI bus id (NVML's and nvidia-smi's
    order), the default ``FASTEST_FIRST`` fastest first by its own heuristic. ``CUDA_VISIBLE_DEVICES`` then
    picks from that numbering (indices) or names GPUs (UUIDs and their prefixes), in the order given, and
    CUDA stops reading it at the first entry that names no GPU. A MIG instance (``MIG-<uuid>``) is a slice of
    a GPU whose power and clocks NVML knows only for the whole GPU: its number is left unknown, with why.
    Where every GPU is the same model, fastest first keeps PCI order (ties); between different models its
    ranking is CUDA's own, and an index there names a GPU that cannot be known from here (a workstation's
    display GPU beside its compute GPU).

    Attributes:
        visible: NVML indices of ``cuda:0``, ``cuda:1`` ..., or None where CUDA's order is unknown here.
        why_unknown: with ``visible`` None, why, and the two ways to fix it (one line).
    """

    visible: tuple[int, ...] | None
    why_unknown: str = ""

    def cuda_index(self, nvml_index: int) -> int | None:
        """The CUDA number of the GPU at ``nvml_index``; None where hidden or unknown."""
        if self.visible is None or nvml_index not in self.visible:
            return None
        return self.visible.index(nvml_index)


def _bus_key(bus_id: str) -> tuple[int, ...]:
    """``00000000:65:00.0`` (domain:bus:device.function, hex) as numbers, for ordering."""
    return tuple(int(part, 16) for part in re.split(r"[:.]", bus_id.strip()) if part)


def cuda_numbering(nvml: Any, count: int) -> CudaNumbering:
    """CUDA's numbering of the ``count`` GPUs NVML lists (:class:`CudaNumbering`)."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    names = [nvml_text(nvml.nvmlDeviceGetName(h)) for h in handles]
    buses = [_bus_key(nvml_text(nvml.nvmlDeviceGetPciInfo(h).busId)) for h in handles]
    by_bus = sorted(range(count), key=buses.__getitem__)
    numbered = by_bus if os.environ.get("CUDA_DEVICE_ORDER") == PCI_BUS_ORDER or len(set(names)) <= 1 else None
    unknown = CudaNumbering(None, f"CUDA numbers unlike GPUs ({', '.join(sorted(set(names)))}) fastest first by "
                                  f"its own ranking, not in NVML's PCI order; export "
                                  f"CUDA_DEVICE_ORDER={PCI_BUS_ORDER} (nvidia-smi's order), or name the GPU in "
                                  f"CUDA_VISIBLE_DEVICES by its UUID")
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return unknown if numbered is None else CudaNumbering(tuple(numbered))
    uuids = None
    chosen: list[int] = []
    for item in (x.strip() for x in env.split(",")):
        if not item:
            break
        if item.isdigit() or (item.startswith("-") and item[1:].isdigit()):
            i = int(item)
            if not 0 <= i < count:
                break  # CUDA stops at the first invalid entry
            if numbered is None:
                return unknown
            chosen.append(numbered[i])
            continue
        if item.startswith("MIG-"):
            return CudaNumbering(None, f"CUDA_VISIBLE_DEVICES names a MIG instance ({item}): NVML reads the power "
                                       f"and sets the clocks of the whole GPU, not of one instance; give edgetune a "
                                       f"whole GPU (its index or GPU- UUID)")
        if uuids is None:
            uuids = [nvml_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        key = item if item.startswith("GPU-") else f"GPU-{item}"
        matches = [i for i, u in enumerate(uuids) if u.startswith(key)]
        if len(matches) != 1:
            break
        chosen.append(matches[0])
    return CudaNumbering(tuple(dict.fromkeys(chosen)))
