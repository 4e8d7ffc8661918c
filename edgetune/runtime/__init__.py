"""The runtime: ``with edgetune.tune(...)`` around an ordinary PyTorch training loop.

* :mod:`~edgetune.runtime.api` - :func:`tune`, the entry point (keyword arguments in, a :class:`Tuner` out);
* :mod:`~edgetune.runtime.controller` - the :class:`Tuner`: applies the plan and the decisions of the guard
  and the online tuner, marks steps, restores the knobs; its parts: :mod:`~edgetune.runtime.arguments`
  (``tune()``'s arguments checked), :mod:`~edgetune.runtime.one_run` (one tuner per run),
  :mod:`~edgetune.runtime.knob_state` (the knob values in force and the writes that change them),
  :mod:`~edgetune.runtime.lifecycle` (the run's setup and exit), :mod:`~edgetune.runtime.guard_drive` (the
  guard's ticks and moves), :mod:`~edgetune.runtime.steps` (the step boundaries, the online tuner's moves);
* :mod:`~edgetune.runtime.settings` - the groups of settings a :class:`Tuner` is built from;
* :mod:`~edgetune.runtime.processes` - several training processes on one machine (torchrun): what each tunes;
* :mod:`~edgetune.runtime.plan` - the plan (``best.json`` of ``edgetune search``) and its reader;
* :mod:`~edgetune.runtime.budget` - the budget over device time: API, watched file, SIGUSR1;
* :mod:`~edgetune.runtime.ticker` - the guard's periodic call on the device clock;
* :mod:`~edgetune.runtime.guard` - the budget guard's control law (pure) and the knob ladder;
* :mod:`~edgetune.runtime.ladder_guard` - the guard's state over a run (ladder, power model, law state);
* :mod:`~edgetune.runtime.online` - online tuning when there is no plan;
* :mod:`~edgetune.runtime.target` - the training target: steps, time and energy to it, the runs file;
* :mod:`~edgetune.runtime.accounting` - energy, time and power per step and epoch, budget violations;
* :mod:`~edgetune.runtime.loader` - the batch loader whose batch size can change between steps;
* :mod:`~edgetune.runtime.adapters` - PyTorch Lightning and Hugging Face Trainer callbacks.
"""

from edgetune.runtime.accounting import EpochRecord, RunSummary, StepRecord, Violation
from edgetune.runtime.api import tune
from edgetune.runtime.controller import Tuner
from edgetune.runtime.guard import GuardParams
from edgetune.runtime.online import OnlineOptions
from edgetune.runtime.plan import Plan, PlanError, load_plan
from edgetune.runtime.processes import LocalProcesses
from edgetune.runtime.settings import GuardSettings, LoaderSettings, RecordSettings, TargetSettings
from edgetune.runtime.target import Target, TargetOutcome

__all__ = ["EpochRecord", "GuardParams", "GuardSettings", "LoaderSettings", "LocalProcesses", "OnlineOptions", "Plan",
           "PlanError",
           "RecordSettings", "RunSummary", "StepRecord", "Target", "TargetOutcome", "TargetSettings", "Tuner",
           "Violation", "load_plan", "tune"]
