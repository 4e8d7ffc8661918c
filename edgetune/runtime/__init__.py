"""The runtime: ``with edgetune.tune(...)`` around an ordinary PyTorch training loop.

* :mod:`~edgetune.runtime.controller` - :func:`tune` and the :class:`Tuner` it gives;
* :mod:`~edgetune.runtime.guard` - the budget guard's control law (pure) and the knob ladder;
* :mod:`~edgetune.runtime.accounting` - energy, time and power per step and epoch, budget violations;
* :mod:`~edgetune.runtime.loader` - the batch loader whose batch size can change between steps;
* :mod:`~edgetune.runtime.online` - online tuning when there is no plan;
* :mod:`~edgetune.runtime.adapters` - PyTorch Lightning and Hugging Face Trainer callbacks.
"""

from edgetune.runtime.accounting import EpochRecord, RunSummary, StepRecord, Violation
from edgetune.runtime.controller import Tuner, tune
from edgetune.runtime.guard import GuardParams
from edgetune.runtime.online import OnlineOptions
from edgetune.runtime.plan import Plan, PlanError, load_plan
from edgetune.runtime.settings import GuardSettings, LoaderSettings, RecordSettings

__all__ = ["EpochRecord", "GuardParams", "GuardSettings", "LoaderSettings", "OnlineOptions", "Plan", "PlanError",
           "RecordSettings", "RunSummary", "StepRecord", "Tuner", "Violation", "load_plan", "tune"]
