"""Where a workload trains: on the processor whose power the device measures.

A GPU's power sensor and clocks see training only where its steps run on that GPU. Left on the CPU, a
step draws CPU power, the GPU's clocks change nothing in it, and a search tunes the wrong processor. So
``edgetune search`` and ``edgetune run`` put the workload where the device says its steps run
(:class:`~edgetune.power.base.ComputeDevice`: ``cuda:0`` on a Jetson, CUDA's number of the GPU for
``nvml``, ``cpu`` for RAPL, the twin and trace replay), unless the user names a torch device
(``--torch-device``, the config's ``torch_device``).

The commonest way to lose the GPU is a PyTorch without CUDA (``pip install torch`` on a Jetson gets the
CPU build): that is refused in one line, with the fix, rather than measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgetune.power.base import ComputeDevice
from edgetune.workloads.core import WorkloadError

__all__ = ["AUTO", "TRAINING_DEVICE_TYPES", "Placement", "place"]

#: ``torch_device`` value: where the device measures
AUTO = "auto"
#: torch device types a workload can train on (ROCm's GPUs are ``cuda`` in torch)
TRAINING_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")

_CUDA_BUILD = "install a CUDA build of PyTorch (on a Jetson, NVIDIA's wheel for your JetPack; see the README)"
#: the other way out, by whether the device's power includes the CPU's (ComputeDevice.measures_cpu)
_ON_THE_CPU = {True: "or train on the CPU on purpose with --torch-device cpu",
               False: "or, to tune training on the CPU, open a device that measures the CPU (--device rapl on x86)"}


@dataclass(frozen=True)
class Placement:
    """The torch device a workload trains on, and a note where it is not the one the power is measured on.

    Attributes:
        torch_device: where the workload's model and batches live.
        note: one line where training runs elsewhere than the device measures (the user chose it), else None.
    """

    torch_device: torch.device
    note: str | None = None


def _parse(requested: str, source: str) -> torch.device:
    try:
        where = torch.device(requested.lower())
    except (RuntimeError, ValueError, TypeError):
        where = None
    if where is None or where.type not in TRAINING_DEVICE_TYPES:  # meta, lazy ...: no data to train on
        raise WorkloadError(f"{source} {requested}: not a torch device that trains; use {AUTO}, cpu, cuda or "
                            f"cuda:<n>")
    return where


def _check_available(where: torch.device, why: str, measures_cpu: bool = True) -> None:
    """One line if this PyTorch cannot use ``where``; ``why`` says who asked for it, ``measures_cpu`` whether
    the device measures training on the CPU (the way out it names)."""
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise WorkloadError(f"{why}, but this PyTorch ({torch.__version__}) cannot use CUDA; {_CUDA_BUILD}, "
                                f"{_ON_THE_CPU[measures_cpu]}")
        count = torch.cuda.device_count()
        if where.index is not None and where.index >= count:
            raise WorkloadError(f"{why}, but this PyTorch sees {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif where.type == "mps" and not torch.backends.mps.is_available():
        raise WorkloadError(f"{why}, but this PyTorch cannot use Apple's MPS on this machine")
    elif where.type == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise WorkloadError(f"{why}, but this PyTorch cannot use an Intel GPU (xpu) on this machine")


def place(requested: str, compute: ComputeDevice, device_name: str, *, simulated: bool = False,
          source: str = "--torch-device") -> Placement:
    """Where to train: ``requested`` (``auto``: where ``device_name`` measures, ``compute``), checked.

    ``simulated``: the device models the step (the twin, trace replay): where it trains changes the loss
    only, so training elsewhere gets no note. ``source`` names the choice in messages (the flag, or the
    config file's key).

    Raises:
        WorkloadError: one line: ``requested`` is no torch device; the device's GPU has no CUDA number known
            here; this PyTorch cannot use the device wanted (a CPU build on a GPU device).
    """
    requested = (requested or AUTO).strip()
    measured = compute.torch_device
    if requested.lower() == AUTO:
        if measured is None:
            raise WorkloadError(f"{device_name}: {compute.why_unknown}; or name where training runs with "
                                f"--torch-device cuda:<n>")
        where = torch.device(measured)
        _check_available(where, f"{device_name} measures its GPU ({measured}), where training must run to be "
                                f"measured", compute.measures_cpu)
        return Placement(where)
    where = _parse(requested, source)
    _check_available(where, f"{source} {requested}", compute.measures_cpu)
    if where.type == "cuda" and where.index is None:  # "cuda": torch's current CUDA device
        where = torch.device("cuda", torch.cuda.current_device())
    if simulated or measured is None or torch.device(measured) == where:
        return Placement(where)
    if where.type == "cpu" and compute.measures_cpu:
        note = (f"note: training on the CPU ({source} cpu), not on {device_name}'s GPU ({measured}): the GPU's "
                f"knobs change nothing in the training step")
    elif where.type == "cpu":
        note = (f"note: training on the CPU ({source} cpu), not on {device_name}'s GPU ({measured}), which is "
                f"all it measures: the power measured is not the training's")
    else:
        note = (f"note: training on {where} while {device_name} measures {measured}: the power measured is not "
                f"the training's")
    return Placement(where, note)
