"""The search: co-select batch size and device knobs under a power budget, hardware in the loop.

* :mod:`edgetune.search.trial` - :func:`measure_setting`: one setting measured on the device;
* :mod:`edgetune.search.space` - the search space (batch sizes x knob values) and its grid;
* :mod:`edgetune.search.efficiency` - time and energy to target from the gradient noise scale;
* :mod:`edgetune.search.study` - the Optuna study (ask-and-tell, budget constraint, storage, resume);
* :mod:`edgetune.search.guided` - the predictor-guided sampler;
* :mod:`edgetune.search.results` - ``best.json`` and ``trials.csv``.

Importing this package does not import Optuna; :mod:`edgetune.search.study` does.
"""

from edgetune.search.trial import Measurement, MeasurementProtocol, measure_setting

__all__ = ["Measurement", "MeasurementProtocol", "measure_setting"]
