"""Predictors: data in, models out (imports only ``edgetune.tables``, numpy, scikit-learn, torch).

* :class:`HardwareModel` - step time, mean and peak power for any batch size and knob setting, from a
  handful of measured rows, with an uncertainty estimate.
* :class:`GradientNoiseScale` - online gradient noise scale (McCandlish et al. 2018) and the batch-size
  law S(b) = S_min (1 + B_noise / b); learning-rate scaling when the batch size changes.

The names below are imported on first use (PEP 562), so a module that needs one of them, or
``edgetune.predictors.convergence``, does not pay for the others: the runtime on a board imports the
noise-scale law and the runs file, never scikit-learn (about 0.9 s of CPU and 70 MiB on a 2-core x86 VM,
more on an edge CPU), which only :class:`HardwareModel` needs.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgetune.predictors.hardware_model import BASES, FREQUENCY_KNOBS, HardwareModel, Prediction
    from edgetune.predictors.noise_scale import (
        LR_RULES,
        GradientNoiseScale,
        MicroBatchProbe,
        StepsFit,
        adascale_gain,
        epochs_to_target,
        fit_steps_to_target,
        measure_noise_scale_parts,
        measure_noise_scale_step,
        scale_lr,
        steps_to_target,
    )

_HOME = {
    **dict.fromkeys(("BASES", "FREQUENCY_KNOBS", "HardwareModel", "Prediction"), "hardware_model"),
    **dict.fromkeys(("LR_RULES", "GradientNoiseScale", "MicroBatchProbe", "StepsFit", "adascale_gain",
                     "epochs_to_target", "fit_steps_to_target", "measure_noise_scale_parts", "measure_noise_scale_step", "scale_lr",
                     "steps_to_target"), "noise_scale"),
}

__all__ = [
    "BASES",
    "FREQUENCY_KNOBS",
    "LR_RULES",
    "GradientNoiseScale",
    "HardwareModel",
    "MicroBatchProbe",
    "Prediction",
    "StepsFit",
    "adascale_gain",
    "epochs_to_target",
    "fit_steps_to_target",
    "measure_noise_scale_parts",
    "measure_noise_scale_step",
    "scale_lr",
    "steps_to_target",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'edgetune.predictors' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"edgetune.predictors.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
