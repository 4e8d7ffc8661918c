"""The runtime: ``with edgetune.tune(...)`` around an ordinary PyTorch training loop.

* :mod:`~edgetune.runtime.controller` - :func:`tune` and the :class:`Tuner` it gives;
* :mod:`~edgetune.runtime.guard` - the budget guard's control law (pure) and the knob ladder;
* :mod:`~edgetune.runtime.accounting` - energy, time and power per step and epoch, budget violations;
* :mod:`~edgetune.runtime.loader` - the batch loader whose batch size can change between steps;
* :mod:`~edgetune.runtime.online` - online tuning when there is no plan;
* :mod:`~edgetune.runtime.adapters` - PyTorch Lightning and Hugging Face Trainer callbacks.
"""

from edgetune.runtime.accounting import EpochRecord, RunSummary, StepRecord, Violation
from edgetune.runtime.controller import Plan, PlanError, Tuner, load_plan, tune
from edgetune.runtime.guard import GuardParams

__all__ = ["EpochRecord", "GuardParams", "Plan", "PlanError", "RunSummary", "StepRecord", "Tuner", "Violation",
           "load_plan", "tune"]
