"""What the runtime controller takes into account of a real board: where the model trains, and how the clocks
it does not set run.

Pure functions of the device and the values in force, and :func:`device_spec`, which resolves ``auto`` to the
device a run opens for its model; the controller applies what they say (:mod:`edgetune.runtime.controller`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch

from edgetune.power.base import Device, KnobValue
from edgetune.power.knobs import KnobRole, governed_value, knob_of_role, reads_running_clock

__all__ = ["device_spec", "governed_setting", "model_device", "model_gpu_spec", "placement_warning"]


def governed_setting(device: Device, setting: Mapping[str, KnobValue],
                     written: Collection[str]) -> dict[str, KnobValue]:
    """``setting`` with each clock not in ``written`` as its governor runs it under training load: its highest
    value under the power mode in force (:func:`~edgetune.power.knobs.governed_value`).

    On a real board a clock reads the frequency running now (an idle CPU's low step), and a setting built on
    that reading would lock it there. A simulated device reads the values set: ``setting`` as it is.
    """
    out = dict(setting)
    if device.simulated:
        return out
    mode = knob_of_role(device.knobs, KnobRole.POWER_MODE)
    caps = device.knobs[mode].caps.get(setting.get(mode)) if mode is not None else None
    for name, knob in device.knobs.items():
        if reads_running_clock(name) and name not in written and knob.numeric:
            out[name] = governed_value(knob.values, caps.cap(name) if caps is not None else None)
    return out


def placement_warning(model_device: torch.device | None, device: Device) -> str | None:
    """Why a model on ``model_device`` is not where ``device`` measures (one line), or None: on the board's CPU
    its steps draw CPU power and the GPU's knobs change nothing in them; on another GPU they are not measured.
    A simulated device models the step: where the model sits changes only the loss."""
    measured = device.compute.torch_device
    if model_device is None or device.simulated or measured in (None, "cpu"):
        return None
    if model_device == torch.device(measured):
        return None
    if model_device.type == "cpu":
        return (f"the model is on the CPU, but {device.name} measures its GPU ({measured}): move it there before "
                f"tune() (model.to({measured!r})), or the GPU's knobs change nothing in the training step")
    return (f"the model is on {model_device}, but {device.name} measures {measured}: move it there before tune() "
            f"(model.to({measured!r})), or open the device that measures {model_device}; the power measured is not "
            f"the training's")


def model_device(model: torch.nn.Module | None) -> torch.device | None:
    """Where ``model`` is (its first parameter's device); None without a model or parameters."""
    return next((p.device for p in model.parameters()), None) if model is not None else None


def model_gpu_spec(spec: str, model_device: torch.device | None) -> str | None:
    """The GPU a model on ``model_device`` trains on, as a device spec, for an NVIDIA GPU ``spec`` that the
    user did not number (``nvml``, or the ``nvml:<k>`` that ``auto`` picked): ``nvml:<k>`` for a model on
    ``cuda:<k>`` (``nvml:<k>`` is the GPU torch calls ``cuda:<k>``), so that a process training on one of
    several GPUs, a DDP rank among them, measures and tunes its own. None for any other platform, a GPU named
    by UUID (CUDA's numbering unknown), or a model not on a CUDA GPU."""
    platform, _, arg = spec.partition(":")
    if platform != "nvml" or not (arg == "" or arg.isdigit()):
        return None
    if model_device is None or model_device.type != "cuda":
        return None
    index = model_device.index if model_device.index is not None else torch.cuda.current_device()
    return f"nvml:{index}"


def device_spec(spec: str, model_device: torch.device | None, **options: Any) -> tuple[str, bool]:
    """The device spec ``tune(device=spec)`` opens for a model on ``model_device``, and whether it is the
    model's own GPU (:func:`model_gpu_spec`: ``nvml``, and ``auto`` where it picks an NVIDIA GPU, name the GPU
    the model trains on). ``auto`` is resolved by :func:`~edgetune.power.registry.choose_auto` (``options`` as
    for ``open_device``)."""
    from edgetune.power.registry import choose_auto

    spec = (spec or "auto").strip()
    if spec == "auto":
        spec = choose_auto(**options).spec
    elif spec != "nvml":  # a GPU the user numbered, a board, the twin: as given
        return spec, False
    own = model_gpu_spec(spec, model_device)
    return (own, True) if own is not None else (spec, False)
