"""Predictors: data in, models out (imports only ``edgetune.tables``, numpy, scikit-learn, torch).

* :class:`HardwareModel` - step time, mean and peak power for any batch size and knob setting, from a
  handful of measured rows, with an uncertainty estimate.
* :class:`GradientNoiseScale` - online gradient noise scale (McCandlish et al. 2018) and the batch-size
  law S(b) = S_min (1 + B_noise / b); learning-rate scaling when the batch size changes.
"""

from edgetune.predictors.hardware_model import BASES, FREQUENCY_KNOBS, HardwareModel, Prediction
from edgetune.predictors.noise_scale import (
    LR_RULES,
    GradientNoiseScale,
    MicroBatchProbe,
    StepsFit,
    adascale_gain,
    epochs_to_target,
    fit_steps_to_target,
    measure_noise_scale_step,
    scale_lr,
    steps_to_target,
)

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
    "measure_noise_scale_step",
    "scale_lr",
    "steps_to_target",
]
