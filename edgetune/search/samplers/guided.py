"""The predictor-guided sampler: measure only where the hardware model says it could pay.

After a small space-filling start, every proposal is made from the whole space at once: the
:class:`~edgetune.predictors.HardwareModel` is fitted on the settings measured so far (step time and the
budget's moving-average power, with uncertainty), predicts the candidates, and the sampler proposes the
unmeasured setting with the largest *constrained expected improvement*: the expected improvement of the
objective (in log space, where the model's errors are relative) times the probability that the setting
holds the budget. So measurements go where the prediction could beat the incumbent, or where feasibility
is uncertain (power near the budget) and the prize is large.

The start is space-filling: ``n_startup`` settings (baseline probes included) spread over the grid, then
``n_spread`` more spread over the settings the first fit finds plausibly within the budget. Predicted power
is kept within what the measurements imply (board power does not fall as the batch or a numeric knob rises
in one power mode), whatever the fit says, and its uncertainty is doubled: the fit is confident far from its
measurements, where it can be wrong by several of its standard errors.

Power modes of the same fixed state (:meth:`ModeCaps.peer`: the same GPU units, the same caps on knobs not
tuned) run a setting within their caps alike, so their measurements are of one physics and each such mode's
model is fitted on all their rows, clocks as they run (:meth:`Grid.kin`). Fitted on its own mode's rows only,
Xavier NX mobilenet's model at 5.8 W (energy) had its optimum (204 MHz GPU, 1066 MHz memory, 192 MHz CPU, one
core, in a mode it had 14 rows of) 34% slower than it is, because the rows that showed the GPU clock matters
little there were measured in a peer mode with a higher CPU cap; it settled 15.99% from the oracle. Modes that
gate GPU units apart (AGX Orin's, Orin NX's and Orin Nano's live modes) keep models of their own.

A power mode with a model on fewer than :data:`TRUSTED_GROUP_ROWS` measured settings has its
step time predicted by an equal mixture (in log space) of that model and the best-measured mode's model
corrected by the mode's own rows: a roofline fitted on a handful of one mode's rows is sure of settings it
never saw, and the disagreement of the two becomes doubt that sends a measurement there. The models live in
:mod:`~edgetune.search.samplers.models` (:class:`ModelBank`), the grid and what its power modes cap in
:mod:`~edgetune.search.samplers.grid` (:class:`Grid`), a candidate's score (the log objective, the probability
of holding the budget, the constrained expected improvement, the safe-profiling limits) in
:mod:`~edgetune.search.samplers.acquisition`; this module is the policy: where to measure, and when to stop.

Where the space knows what each power mode caps (:attr:`SearchSpace.mode_caps`), the sampler searches the
settings as they run: a clock set at or above its mode's cap is that cap, and a setting two modes of the
same fixed state run alike (within both modes' caps) is one candidate, in the highest mode that runs it. So a
mode all of whose settings another mode runs too (Orin NX 10W inside 15W; Xavier NX's nine modes hold three
of their own) has no candidates and needs no probes, and a setting of one mode that another runs as well is
not measured twice (Xavier NX's 10W desktop and 20W 2-core modes at the lowest clocks and one core: a third
of the candidates of its full grid were such twins). A neighbour (one level in one knob) is taken as it runs
too, so a step into a power mode that caps the setting lands on the capped setting.

On a rows space (a table replay: :attr:`SearchSpace.rows`) the candidates are its rows only. The
candidates are the whole grid when it has at most ``max_candidates`` settings (Orin Nano with every
knob: 24k). Larger grids (AGX Orin: 429k) are searched the way discrete Bayesian optimisation usually is:
a fresh random sample of the grid plus the neighbours (one level up or down in one knob) of the best
measured settings, then the neighbours of the best candidates of that first pass.

:meth:`GuidedSampler.should_stop` ends the search when no unmeasured setting is expected to pay: its
expected relative improvement over the best times its probability of holding the budget stays under half
the search's margin (0.5%) everywhere for two fits in a row (one where the score is step time alone:
:data:`TIME_STOP_CONFIRMATIONS`), and every power mode (a knob whose role caps the others) that could hold the
budget has measurements of its own. (The rule it replaces, a 0.6%
probability of improving by the margin, rarely fired on grids of 10^4-10^5 settings, where some corner of
the model always kept that much doubt: 29 of the oracle benchmark's 36 searches ran to the 40-setting cap.
Replayed on the logged acquisitions of 36 searches, the expected-gain rule ended the median one at 30.5
settings and moved no pick that was within 3% out of it; the benchmark's median is now 31,
``experiments/results/oracle_gap.txt``.) Before it agrees to stop, the best measured setting's knobs are
measured at one batch size level down and up where that is plausibly within the budget (``polish``): the
S(b) law ranks adjacent batch sizes within a few percent of each other where the optimum is flat, so the
step times decide, and the model can be sure of a batch size it measured only at other clocks. Where a
setting that held the budget but not by the sensor's accuracy beats the best, its settings one level down in
the batch size or a numeric knob are measured too (one of them may hold it by that much).

For ``pareto`` the proposals alternate: one aims at the fastest setting (the time objective's expected
improvement), the next at the whole time-energy front under the budget, by the hypervolume it is expected to
add to the measured front (:mod:`~edgetune.search.samplers.hypervolume`: in log space, over draws from the
model's step time and power, a draw over the budget adding nothing, as a relative gain). The stopping rule
asks both to fall under its threshold, half the other objectives' (a front's hypervolume reads a shift of its
ends several times over). Aiming the second at the least energy instead, as the first did, left
the front between its two ends to chance: on the pareto benchmark (at b0b376a), 23 of 36 rows reached a
hypervolume ratio of 0.95 against 21, 5 stayed under 0.9 against 8 (``experiments/results/oracle_gap_pareto.txt``
and its earlier headers). Every proposal
on the hypervolume alone settled on a narrow stretch of front it could refine by fractions of a percent, and
one search never found the fast settings (ratio 0).

Safe profiling: once the model is fitted, a setting predicted over the budget with confidence (less than
``min_feasible_p`` probability of holding it) is never proposed, nor one whose expected device seconds
clearly over the budget (its probability of drawing 2% more than the budget times its predicted step time:
such a trial runs about a step before it is stopped) exceed ``over_budget_allowance_s`` (0.1 s). In a power mode
whose every measured setting was over the budget, the next setting measured is the mode's least one (the
smallest batch size, every numeric knob at its lowest): over the budget there, the whole mode is ruled out
by one measurement instead of being probed lower setting by setting (:meth:`GuidedSampler._floor_first`). The
space-filling start obeys the same rule: blind to the model, it is not blind to what it measured. Nor does it
propose a setting certain to be over (at or above a measured over-budget one) or to run out of memory (at or
above a batch size that ran out, whatever the knobs): where its sample of the grid holds only such settings, it
draws from every other candidate of the grid, and where none is left the search stops before any model
(:meth:`GuidedSampler._none_left_below`; Orin Nano cnn at 4.6 W: 4 settings and 0.2 device-s over the budget,
against 6 and 1.7 s of blind guesses up to batch 1024, for the same pick). (Before, it
went on probing such a mode at random: on the energy benchmark's seed 1, 4.1 of xavier-nx chartransformer 5.1 W's
5.2 device-seconds over the budget came from the start. With the rule: the largest over-budget total of one search
went 3.7 -> 2.9 s (time, seed 0) and 5.2 -> 4.2 s (energy, seed 1); the time median 25 -> 24 settings, rows
within 3% summed over both objectives and two seeds 128 -> 133; ``experiments/results/oracle_gap.txt``.)

It is an ordinary Optuna sampler: trials, storage, resume and fleets work as with any other; a fleet's
workers see each other's trials and avoid settings another worker is measuring or has queued.

What was measured reaches it through ``observations_func(frozen_trial) -> Observation | None`` (the way
Optuna's samplers take a ``constraints_func``); the default, :func:`edgetune.search.records.read_observation`,
reads what :class:`~edgetune.search.study.Search` records. It works under a plain ``study.optimize`` too,
given an ``observations_func`` that knows the objective's measurements.

With ``prior`` observations (an earlier study of another board, mapped to this space by
:mod:`edgetune.search.prior`) the model is the prior's hardware model corrected by this board's own
measurements (:class:`~edgetune.search.prior.Transfer`): it is used from the first proposal until this board
has :data:`PRIOR_HANDOFF` measurements of its own, when this board's own models take over (a power mode the
prior measured keeps the corrected prior model until it has a model of its own); a power mode the
prior measured needs no measurements of its own (one it never saw does); and the stopping rule may end the
search after :data:`PRIOR_MIN_TRIALS_TO_STOP` measurements. The prior is never a measurement: the incumbent
and the budget are this board's measurements alone (before one holds the budget, expected improvement is taken
over the best setting the model predicts to hold it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from edgetune.search.efficiency import TargetModel, ZeusCost
from edgetune.search.records import Observation, read_observation
from edgetune.search.samplers.acquisition import (
    POWER_STD_SCALE,
    Aim,
    Prediction,
    Scores,
    best_measured,
    score,
)
from edgetune.search.samplers.grid import Grid
from edgetune.search.samplers.models import TRUSTED_GROUP_ROWS, Fitted, Measured, ModelBank
from edgetune.search.space import SearchSpace
from edgetune.search.thermal import ThermalReference

__all__ = ["TRUSTED_GROUP_ROWS", "GuidedSampler", "ObservationsFunc"]

#: what a sampler learns from a trial (None: nothing, e.g. a trial told another's result)
ObservationsFunc = Callable[[FrozenTrial], Observation | None]

_STARTUP_POOL = 4096  # grid points drawn per space-filling proposal: spread enough, cheap to score
_TIE = 1e-12  # distances (normalised levels) this close are a tie, broken by the seeded generator
_FIRST_PASS_SHARE = 2  # a sampled first pass scores 1/2 of max_candidates at random; neighbourhoods fill the rest
_REFINE_TOP = 32  # candidates of a sampled first pass whose neighbourhoods the second pass scores
#: the stopping rule's threshold as a share of the search's margin (GuidedSampler.stop_gain): an expected gain
#: under half the improvement the search counts is not worth a measurement
_STOP_GAIN_SHARE = 0.5
#: ... and for ``pareto``, a further share: a front's hypervolume reads a shift of its ends several times over
#: (against a reference 25% past the ideal point, the benchmark's, a front 1% slower at its fast end loses about
#: 4% of its area), so its turns stop at a quarter of the margin. On the pareto benchmark (36 rows, seeds 0 and
#: 1) rows at a hypervolume ratio of 0.95 or more went 23 -> 24 and 24 -> 26, the mean 0.953 -> 0.963 and 0.961
#: -> 0.964, for a median of 29.5 -> 34 and 28.5 -> 30.5 measured settings (experiments/results/oracle_gap_pareto.txt)
_PARETO_STOP_SHARE = 0.5
#: expected device seconds clearly over the budget one proposal may cost (GuidedSampler's
#: over_budget_allowance_s): 40 measurements at this much stay within a few seconds in all
OVER_BUDGET_ALLOWANCE_S = 0.1
#: measured settings before the stopping rule may end a search that has no prior (see min_trials_to_stop),
#: where power enters the objective (``energy``, ``cost``, ``pareto``): its score carries the power model's
#: error as well as the time model's, and on the energy benchmark (seed 0) a stop from 16 settings on left
#: three rows 3.07-5.91% from the oracle that the settings up to 20 had found (the model's expected gain
#: there was under the threshold, and wrong); once, a model fitted on 16 settings of a 5-D space stopped
#: searches 10-22% from the oracle (experiments/results/oracle_gap.txt)
MIN_TRIALS_TO_STOP = 20
#: ... and where the objective is step time alone (``time``, ``throughput``): on the time benchmark (seeds
#: 0-4) a stop from 16 settings on kept 178 of 180 rows within 3% against 177 (it lost one at seed 2, 5.77%,
#: a path that earlier soaks also take) for 0.3-1.6 fewer settings per search
#: (experiments/results/oracle_gap.txt)
TIME_MIN_TRIALS_TO_STOP = 16
#: the objectives whose score is step time alone (TIME_MIN_TRIALS_TO_STOP, TIME_STOP_CONFIRMATIONS)
_TIME_OBJECTIVES = ("time", "throughput")
#: successive fits that must find nothing left worth measuring before a search stops (``stop_confirmations``):
#: one fit's step-time and power models can both be sure and wrong, and a search whose best expected gain
#: hovers at the threshold stopped on one quiet fit short of its pick (energy benchmark, seed 0: orin-nano
#: chartransformer 7.2 W 0.00 -> 3.16%; experiments/results/oracle_gap_energy.txt)
STOP_CONFIRMATIONS = 2
#: ... and where the objective is step time alone and there is no prior: one quiet fit. A time score carries
#: the step-time model's error alone, and on the time benchmark the second fit mostly confirmed the first: at
#: seeds 0 and 2-6 each kept its rows within 3% and its worst gap, with 0.6-1.3 fewer settings per
#: search, and every median fell under 25 (23-24, from 23.5-25; experiments/results/oracle_gap.txt)
TIME_STOP_CONFIRMATIONS = 1
#: measured settings after the space-filling start that are still placed space-filling, among the settings
#: the first fit finds plausibly within the budget (GuidedSampler.n_spread): the start alone left whole
#: regions unseen, and blind guesses there would run the board over the budget
N_SPREAD = 4
#: measured settings before the stopping rule may end a search with a prior: the prior model has seen the
#: space, so a few measurements of this board that agree with it (baseline probes included) are enough to
#: trust its corrected predictions
PRIOR_MIN_TRIALS_TO_STOP = 6
#: with a prior, this board's measurements after which its own hardware model takes over from the prior's
#: corrected one (GuidedSampler.prior_handoff): a sibling module's or another mode's model is wrong in places a
#: dozen corrections cannot mend (orin-nano 10W -> orin-nx 10W, cnn: warm 6.2% behind the oracle with 40
#: settings without the handoff, 1.8% with 25 with it; experiments/transfer.py), while the settings the prior
#: steered to are what a cold model needs to be trusted
PRIOR_HANDOFF = 12

class GuidedSampler(BaseSampler):
    """Constrained expected improvement over the grid, from the hardware model's predictions.

    Args:
        space: the search space.
        objective: ``time``, ``energy``, ``throughput``, ``pareto`` (alternates the time objective's expected
            improvement and the front's expected hypervolume improvement, module docs) or ``cost``
            (Zeus's ``eta x energy + (1 - eta) x max power x time``; needs ``cost``).
        budget_w: the budget (None: unconstrained); tolerance: allowed overshoot fraction.
        accuracy_w: the power sensor's accuracy at the budget, W: the search picks a setting that holds the
            budget by this much (:func:`~edgetune.search.results.choose_best`), so the model aims there (the
            budget less it) and counts only such settings as the best so far.
        target: steps to target per batch size.
        seed: seed of the space-filling start, the candidate samples and ties.
        n_startup: measured settings (baseline probes included) before the model is used.
        n_spread: measured settings after those still placed space-filling, among the settings the model
            finds plausibly within the budget (safe exploration; not with a prior).
        min_group: measured settings a power mode needs before it gets a model of its own.
        stop_gain: the stopping rule's threshold (:meth:`should_stop`): the search stops when no unmeasured
            setting's expected relative improvement times its probability of holding the budget reaches it;
            None: half the search's margin (0.5% at the default 1%), a quarter for ``pareto``
            (:data:`_PARETO_STOP_SHARE`).
        stop_confirmations: successive fits that must agree there is nothing left before stopping; None:
            :data:`STOP_CONFIRMATIONS` (:data:`TIME_STOP_CONFIRMATIONS` for ``time`` and ``throughput`` without
            a prior).
        min_feasible_p: settings less likely than this to hold the budget are not worth a measurement.
        over_budget_allowance_s: nor are settings whose probability of being clearly (2%) over the budget
            times their predicted step time exceeds this many seconds (safe profiling: such a setting runs
            about one step before it is stopped); default :data:`OVER_BUDGET_ALLOWANCE_S`.
        max_candidates: grids up to this size are scored whole; larger ones by sampling (module docs).
        guard_sigma: standard errors added to measured power before it is compared with the budget.
        min_trials_to_stop: measured settings before the stopping rule may end the search (a model fitted on
            a handful of points is over-confident about the regions it has not seen); None:
            :data:`MIN_TRIALS_TO_STOP` (:data:`TIME_MIN_TRIALS_TO_STOP` for ``time`` and ``throughput``), with
            a prior :data:`PRIOR_MIN_TRIALS_TO_STOP`.
        cost: the weights of the ``cost`` objective.
        prior: observations of an earlier study mapped to this space (module docs).
        prior_handoff: with a prior, this board's measured settings after which its own model replaces the
            prior's corrected one (:data:`PRIOR_HANDOFF`).
        observations_func: what each trial measured (:data:`ObservationsFunc`); default
            :func:`~edgetune.search.records.read_observation`, the search's records.
        polish: before agreeing to stop, measure the best setting's unmeasured neighbours that are plausibly
            within the budget (:meth:`_polish_near`: one batch size level up and down at its knobs), and one
            step below an uncertified edge that beats it (:meth:`_below`).
    """

    def __init__(self, space: SearchSpace, *, objective: str = "time", budget_w: float | None = None,
                 tolerance: float = 0.0, target: TargetModel | None = None, seed: int | None = None,
                 n_startup: int = 6, n_spread: int = N_SPREAD, min_group: int = 4, stop_gain: float | None = None,
                 stop_confirmations: int | None = None,
                 min_feasible_p: float = 0.05, over_budget_allowance_s: float = OVER_BUDGET_ALLOWANCE_S,
                 prior_handoff: int = PRIOR_HANDOFF,
                 max_candidates: int = 30_000, guard_sigma: float = 0.0,
                 min_trials_to_stop: int | None = None, observations_func: ObservationsFunc | None = None,
                 cost: ZeusCost | None = None, prior: Sequence[Observation] = (), accuracy_w: float = 0.0,
                 polish: bool = True) -> None:
        if objective == "cost" and cost is None:
            raise ValueError("the cost objective needs its weights: cost=ZeusCost(eta, max_power_w)")
        self.space = space
        self.objective = objective
        self.budget_w = budget_w
        self.tolerance = tolerance
        self.accuracy_w = float(accuracy_w)
        self.thermal: ThermalReference | None = None
        self.target = target or TargetModel()
        self.n_startup = n_startup
        self.n_spread = n_spread
        self.min_group = min_group
        self.stop_gain = stop_gain
        self.min_feasible_p = min_feasible_p
        self.over_budget_allowance_s = over_budget_allowance_s
        self.prior_handoff = prior_handoff
        self.max_candidates = max_candidates
        self.guard_sigma = guard_sigma
        self.prior = tuple(o for o in prior if o.ok and space.contains(o.candidate))
        self.cost = cost
        self.polish = polish
        # the stopping rule's defaults: a prior's, else by whether the score is step time alone
        time_only = objective in _TIME_OBJECTIVES and not self.prior
        if min_trials_to_stop is None and self.prior:
            min_trials_to_stop = PRIOR_MIN_TRIALS_TO_STOP
        elif min_trials_to_stop is None:
            min_trials_to_stop = TIME_MIN_TRIALS_TO_STOP if time_only else MIN_TRIALS_TO_STOP
        self.min_trials_to_stop = min_trials_to_stop
        if stop_confirmations is None:
            stop_confirmations = TIME_STOP_CONFIRMATIONS if time_only else STOP_CONFIRMATIONS
        self.stop_confirmations = stop_confirmations
        self.observations_func = observations_func or read_observation
        self._seed = seed
        self._rng = np.random.RandomState(seed)
        self._random = RandomSampler(seed=seed)
        #: the space by flat grid index (levels, the settings as they run, power modes, neighbours)
        self.grid = Grid(space)
        self._score_key: Any = None  # what the last scores were computed for (_score)
        self._scores: Scores | None = None
        self._stop_streak: list[Any] = []
        prior_idx = np.array([self._candidate_index(o) for o in self.prior], dtype=np.int64)
        #: the hardware models, refitted as measurements come
        self.models = ModelBank(self.grid, min_group=min_group, n_startup=n_startup, prior_idx=prior_idx,
                                prior_times_s=[o.step_time_s for o in self.prior],
                                prior_powers_w=[o.judged_power_w(guard_sigma) for o in self.prior],
                                prior_handoff=prior_handoff)
        if self.prior:
            per_group = np.bincount(self.grid.group(prior_idx))
            if per_group.max() < min_group:
                raise ValueError(f"the prior has {len(self.prior)} measured settings in this space, at most "
                                 f"{int(per_group.max())} in one power mode; a warm start needs {min_group} in one: "
                                 f"search the earlier board longer (--n-trials), or drop --prior")

    def _candidate_index(self, obs: Observation) -> int:
        """Flat grid index of an observation's setting, as it runs."""
        return self.grid.index(self.space.params(obs.candidate))

    @property
    def _steps_table(self) -> np.ndarray:
        """Steps to target per batch level, asked of the target each time: a table's target learns a batch
        size's convergence once it is measured."""
        return np.array([float(self.target.steps(b)) for b in self.space.batch_sizes])

    # -- Optuna sampler interface -------------------------------------------------------------------
    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.space.distributions()

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        scores = self._score(study, trial.number)
        # the space-filling start before the first fit; a power mode measured only over the budget: its least
        # setting, whichever proposed it
        proposal = self._startup(study) if scores is None else self._propose(study, trial, scores)
        return self.grid.params(self._floor_first(study, self.grid.index(proposal)))

    def _propose(self, study: Study, trial: FrozenTrial, scores: Scores) -> dict[str, Any]:
        """The model's proposal (module docs), as Optuna params."""
        if not self.prior and len(self._measured(study).idx) < self.n_startup + self.n_spread:
            # the safe spread: space-filling still, among the settings the first fit finds plausibly
            # within the budget (no blind guess that could be anywhere over it)
            safe = scores.idx[scores.plausible & scores.possible]
            if safe.size:
                return self._startup(study, safe)
        if self._stop_streak:  # the model finds nothing left to pay: the best setting's neighbours first
            polish = self._polish_candidates(study)
            if polish:
                return self.grid.params(polish[0])
        acq = scores.acquisition
        lacking = self._lacking_groups(study, scores)
        if lacking and trial.number % 2 == 1:
            # every other proposal goes to the power mode measured least, until each has a model of its
            # own: a mode caps the clocks, so the pooled model cannot tell what a mode it barely saw does
            in_group = self.grid.group(scores.idx) == lacking[0]
            focused = np.where(in_group, acq, -np.inf)
            if np.any(np.isfinite(focused)):
                acq = focused
        if not np.any(np.isfinite(acq)):
            # nothing left that is both unmeasured and plausibly within the budget: the free setting most
            # likely to hold it (never a space-filling guess, which could be anywhere over the budget)
            safest = np.where(scores.possible if scores.possible.any() else scores.free,
                              scores.p_feas, -np.inf)
            if not np.any(np.isfinite(safest)):
                return self._startup(study)
            return self.grid.params(int(scores.idx[int(np.argmax(safest))]))
        k = int(np.argmax(np.where(np.isfinite(acq), acq, -np.inf)))
        return self.grid.params(int(scores.idx[k]))

    def _floor_first(self, study: Study, i: int) -> int:
        """``i``, or its power mode's least setting where every setting measured in that mode was over the
        budget: the smallest batch size with every numeric knob at its lowest level.

        Board power does not fall as those rise within a mode, so one measurement of the least setting
        settles the whole mode: over the budget, every other setting of the mode is too
        (:meth:`_power_bounds` rules them out); within it, the mode has a setting that holds. Without it
        a mode whose probes all ran over was probed setting by setting, each a little lower and each over
        (the energy benchmark's Orin Nano mobilenet at 5.0 W: ten settings of the 15W mode, 4.9 device-s
        over the budget, where the mode's least setting draws 5.65 W).
        """
        if self.budget_w is None or not self.grid.named:
            return i
        measured = self._measured(study)
        if not measured.idx:
            return i
        group = self.grid.group(np.array([i]))[0]
        in_mode = self.grid.group(np.array(measured.idx, dtype=np.int64)) == group
        if not in_mode.any() or np.any(np.array(measured.powers)[in_mode] <= self._budget_limit_w):
            return i
        floor = self.grid.floor(i)
        if floor == i or floor in self._taken(study) or not np.isin(floor, self.grid.candidates()):
            return i
        return floor

    def _lacking_groups(self, study: Study, scores: Scores | None = None) -> list[int]:
        """Named-knob groups (power modes) with fewer than ``min_group`` measurements, fewest first. With a
        prior, its observations count too: a mode the earlier study measured is covered by its model, a mode
        it never saw (a sibling module's extra power modes) needs measurements of this board's own.

        With ``scores``, a group none of whose scored unmeasured settings is plausibly within the budget
        (probability at least ``min_feasible_p``, and within the over-budget allowance) lacks nothing: probing
        it would only run the board over the budget.
        """
        if not self.grid.named:
            return []
        idx = list(self._measured(study).idx) + (self.models.prior_idx.tolist() if self.prior else [])
        groups = self.grid.group(np.array(idx, dtype=np.int64)) if idx else np.array([], dtype=np.int64)
        counts = {int(g): int(np.sum(groups == g)) for g in self.grid.live_groups()}
        lacking = [g for g, c in counts.items() if c < self.min_group]
        if scores is not None and lacking:
            open_ = scores.free & scores.plausible
            plausible = set(np.unique(self.grid.group(scores.idx[open_])).tolist())
            lacking = [g for g in lacking if g in plausible]
        return sorted(lacking, key=lambda g: (counts[g], g))

    # -- what is known ------------------------------------------------------------------------------
    def _taken(self, study: Study) -> set[int]:
        """Grid points measured, being measured, or queued (a queued trial's setting: its observation)."""
        taken: set[int] = set()
        for t in study.get_trials(deepcopy=False):
            if t.params and all(n in t.params for n in self.grid.names):
                taken.add(self.grid.index(t.params))
            elif t.state == TrialState.WAITING:
                obs = self.observations_func(t)
                if obs is not None and self.space.contains(obs.candidate):
                    taken.add(self._candidate_index(obs))
        return taken

    def _startup(self, study: Study, among: np.ndarray | None = None) -> dict[str, Any]:
        """A space-filling point: the sampled free setting (of ``among``, default every candidate) farthest
        (in normalised levels) from all taken."""
        taken = self._taken(study)
        every = self.grid.candidates() if among is None else among
        measured = self._measured(study)
        pool = self._rng.choice(every, min(every.size, _STARTUP_POOL), replace=False)
        safe = pool[~self._certain_to_fail(pool, measured)]  # never one certain to be over or out of memory
        if not safe.size:  # none in the sample: from every candidate not certain to fail, if any
            rest = every[~self._certain_to_fail(every, measured)]
            safe = self._rng.choice(rest, min(rest.size, _STARTUP_POOL), replace=False) if rest.size else rest
        pool = safe if safe.size else pool
        free = np.array([i for i in pool if int(i) not in taken], dtype=np.int64)
        if free.size == 0:
            free = pool
        scale = np.maximum(np.array(self.grid.sizes, dtype=float) - 1, 1)
        if taken:
            done = self.grid.levels(np.array(sorted(taken))) / scale
            cand = self.grid.levels(free) / scale
            d = np.min(np.abs(cand[:, None, :] - done[None, :, :]).sum(axis=2), axis=1)
            best = free[d >= np.max(d) - _TIE]
            i = int(self._rng.choice(best))
        else:
            i = int(self._rng.choice(free))
        return self.grid.params(i)

    def _measured(self, study: Study) -> Measured:
        oom_batches: list[int] = []
        windows: dict[int, list[tuple[float, float, float]]] = {}  # by grid index, in order of measurement
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            obs = self.observations_func(t)
            if obs is None or not obs.measured:
                continue
            if obs.oom:
                oom_batches.append(self.space.batch_sizes.index(obs.candidate.batch_size))
                continue
            if not obs.ok:
                continue
            # the power the budget is judged by, referred to the study's board temperature (a soak's)
            offset_w = self.thermal.offset_w(obs.temperature_c) if self.thermal is not None else 0.0
            windows.setdefault(self._candidate_index(obs), []).append(
                (obs.step_time_s, obs.judged_power_w(self.guard_sigma) - offset_w, obs.peak_power_w))
        idx = list(windows)
        times = [float(np.mean([w[0] for w in windows[i]])) for i in idx]
        powers = [float(np.mean([w[1] for w in windows[i]])) for i in idx]
        peaks = [max(w[2] for w in windows[i]) for i in idx]
        return Measured(idx, times, powers, peaks, oom_batches, tuple(len(windows[i]) for i in idx))

    # -- the model ----------------------------------------------------------------------------------
    def _fit(self, study: Study) -> Fitted | None:
        """The hardware models fitted on the measured settings (:meth:`ModelBank.fit`: None before
        ``n_startup``; the same object while the measured set is the same)."""
        return self.models.fit(self._measured(study))

    def _predict(self, fitted: Fitted, cand: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step time, power and their std for grid indices ``cand`` (:meth:`ModelBank.predict`)."""
        return self.models.predict(fitted, cand)

    # -- scoring ------------------------------------------------------------------------------------
    def _objective(self, number: int) -> str:
        if self.objective == "pareto":
            return "time" if number % 2 == 0 else "energy"
        return self.objective

    def _aim(self, objective: str) -> Aim:
        """What candidates are scored against for ``objective`` (the turn's: pareto alternates time and energy)."""
        return Aim(objective, None if self.budget_w is None else self._budget_limit_w, self.accuracy_w, self.cost,
                   self.min_feasible_p, self.over_budget_allowance_s)

    def _evaluate(self, fitted: Fitted, cand: np.ndarray, objective: str, taken: set[int]) -> Scores:
        """Candidates ``cand``'s scores (:func:`~edgetune.search.samplers.acquisition.score`) for ``objective``."""
        m = fitted.measured
        p_lo, p_hi = self._power_bounds(cand, m)
        # the widening is for this board's own fit; a prior corrected by it (Transfer) carries the prior
        # model's doubt and the discrepancy's already
        pred = Prediction.of(*self._predict(fitted, cand), p_lo, p_hi,
                             power_std_scale=1.0 if fitted.transfer is not None else POWER_STD_SCALE)
        lv = self.grid.levels(cand)
        aim = self._aim(objective)
        # settings certain to fail without a model: out of memory (memory grows with the batch, whatever the
        # clocks, so larger batches fail too) or at or above a measured over-budget one
        certain = (p_lo > aim.limit_w) if self.budget_w is not None else np.zeros(cand.size, dtype=bool)
        certain |= self._out_of_memory(cand, m)
        front = None
        if self.objective == "pareto" and objective == "energy":  # the front's turn (module docs)
            total_s = self._steps_table[self.grid.levels(np.array(m.idx, dtype=np.int64))[:, 0]] * np.array(m.times)
            front = (total_s, np.array(m.powers, dtype=float))
        return score(aim, cand, pred, self._steps_table[lv[:, 0]], self.grid.tables[0][lv[:, 0]], certain=certain,
                     free=np.array([int(i) not in taken for i in cand]),
                     best=self._incumbent(m.idx, m.times, m.powers, objective), prior=bool(self.prior), front=front)

    @property
    def _budget_limit_w(self) -> float:
        """The budget with its tolerance (only asked where there is a budget)."""
        assert self.budget_w is not None
        return self.budget_w * (1.0 + self.tolerance)

    @property
    def _limit_w(self) -> float:
        """What the model aims under: the budget with its tolerance, less the sensor's accuracy."""
        return self._budget_limit_w - self.accuracy_w

    def _power_bounds(self, cand: np.ndarray, measured: Measured) -> tuple[np.ndarray, np.ndarray]:
        """What the measurements imply of the candidates' power, W (:meth:`Grid.power_bounds`; a setting
        stopped over the budget bounds from below only): lower and upper bounds, -inf and inf where nothing
        bounds."""
        held_w = None if self.budget_w is None else self._budget_limit_w
        return self.grid.power_bounds(cand, measured.idx, measured.powers, held_w)

    def _dominates_over(self, cand: np.ndarray, measured: Measured) -> np.ndarray:
        """Candidates certain to be over the budget without a model: at or above a measured setting that was
        over it in batch size and every numeric knob, in the same power mode or one that runs that setting
        alike (:meth:`_power_bounds`)."""
        if self.budget_w is None:
            return np.zeros(cand.size, dtype=bool)
        return self._power_bounds(cand, measured)[0] > self._limit_w

    def _out_of_memory(self, cand: np.ndarray, measured: Measured) -> np.ndarray:
        """Candidates certain to run out of memory: at or above a batch size that ran out (memory grows with
        the batch, whatever the knobs: :mod:`edgetune.search.memory`)."""
        if not measured.oom_batches:
            return np.zeros(cand.size, dtype=bool)
        return self.grid.levels(cand)[:, 0] >= min(measured.oom_batches)

    def _certain_to_fail(self, cand: np.ndarray, measured: Measured) -> np.ndarray:
        """Candidates certain to fail without a model: over the budget (:meth:`_dominates_over`) or out of
        memory (:meth:`_out_of_memory`)."""
        return self._dominates_over(cand, measured) | self._out_of_memory(cand, measured)

    def _incumbent(self, idx, times, powers, objective: str) -> float:
        """Log objective of the best measured setting that held the budget (inf: none)."""
        return self._best_measured(idx, times, powers, objective)[1]

    def _best_measured(self, idx, times, powers, objective: str, held_only: bool = False
                       ) -> tuple[int | None, float]:
        """Grid index and log objective of the best measured setting that held the budget by the sensor's
        accuracy (``held_only``: one that held the budget but not by that much), (None, inf) for none."""
        b = self.grid.levels(np.array(idx, dtype=np.int64))[:, 0] if len(idx) else np.array([], dtype=np.int64)
        steps, batches = self._steps_table, self.grid.tables[0]
        k, best = best_measured(self._aim(objective), ((steps[j], batches[j], tt, pp) for j, tt, pp in
                                                       zip(b.tolist(), times, powers)), held_only)
        return (None, best) if k is None else (int(idx[k]), best)

    # -- polish -------------------------------------------------------------------------------------
    def _polish_near(self, best: int, measured: Sequence[int] = ()) -> np.ndarray:
        """The settings polished around the best measured one (grid index ``best``): the same knobs at one
        batch size level down and up, unless a setting ``measured`` at that batch size lies within one level of
        them in every knob (the model has a row of that batch size there already).

        The S(b) law ranks adjacent batch sizes within a few percent of each other where the optimum is flat,
        so which one wins is the step times' call, and the model's step time at a batch size it measured only
        at other clocks is an extrapolation it can be sure of and wrong about (a transfer to Orin NX 15W, cnn:
        batch 32 at the top clocks predicted 0.0082 +- 0.0000 s from one batch-32 row at the lowest clocks,
        true 0.0064 s, so the search stopped at batch 16, 8.6% from the oracle)."""
        near = np.concatenate([self.grid.shifted(best, [0], step) for step in (-1, 1)])
        done = self.grid.levels(np.asarray(measured, dtype=np.int64))

        def anchored(i: int) -> bool:
            lv = self.grid.levels(np.array([i]))[0]
            at = done[done[:, 0] == lv[0]]
            return bool(np.any(np.all(np.abs(at[:, 1:] - lv[1:]) <= 1, axis=1)))

        return np.array([i for i in near.tolist() if not anchored(i)], dtype=np.int64)

    def _polish_candidates(self, study: Study) -> list[int]:
        """Unmeasured settings near the best measured one (:meth:`_polish_near`; for ``pareto``, near the best
        in time and the best in energy), and one step below the edge where it beats the best (:meth:`_below`,
        those within one standard error of beating the best), that are plausibly within the budget and not
        certain to fail, most promising first."""
        if not self.polish:
            return []
        taken = self._taken(study)
        out: list[tuple[float, int]] = []
        for k in range(2 if self.objective == "pareto" else 1):
            scores = self._score(study, k)  # k's parity picks the pareto objective
            fitted = self.models.last
            if scores is None or fitted is None:
                continue
            m = fitted.measured
            best, value = self._best_measured(m.idx, m.times, m.powers, self._objective(k))
            if best is None:
                continue
            edge, edge_value = self._best_measured(m.idx, m.times, m.powers, self._objective(k), held_only=True)
            near = [(i, math.inf) for i in self._polish_near(best, m.idx).tolist()]
            if edge is not None and edge_value < value:  # ... and where the edge beats it, a step back from it
                near += [(i, value) for i in self._below(edge).tolist()]
            pos = {int(i): j for j, i in enumerate(scores.idx)}
            for i, beat in near:
                j = pos.get(int(i))
                if (int(i) not in taken and j is not None and scores.plausible[j] and scores.possible[j]
                        and scores.log_score[j] - scores.s_log[j] < beat):
                    out.append((float(scores.log_score[j]), int(i)))
        return [i for _, i in sorted(set(out))]

    def _below(self, edge: int) -> np.ndarray:
        """The settings one level down from ``edge`` in the batch size or one numeric knob (each draws less): a
        setting that held the budget but not by the sensor's accuracy is a step from one that may (transfer to
        Orin Nano 7W, chartransformer: batch 8 at the lowest GPU clock and CPU 192 MHz held 7 W at a true 6.90 W,
        short of the certifiable line; CPU 115 MHz, never measured, was the oracle at 6.81 W, and the pick
        3.11% from it)."""
        return self.grid.shifted(edge, self.grid.numeric_dims, -1)

    def _score(self, study: Study, number: int) -> Scores | None:
        fitted = self._fit(study)
        if fitted is None:
            return None
        objective = self._objective(number)
        key = (self.models.key, objective, self.accuracy_w)  # a soak moves the aim
        if self._score_key == key:
            return self._scores
        taken = self._taken(study)
        if self.grid.candidates().size <= self.max_candidates:
            scores = self._evaluate(fitted, self.grid.candidates(), objective, taken)
        else:
            idx = np.array(fitted.measured.idx, dtype=np.int64)
            # a fresh sample per measured set, reproducible from the seed
            rng = np.random.RandomState(None if self._seed is None else self._seed + len(idx))
            seeds = np.concatenate([idx, self.models.prior_idx]) if self.prior else idx  # the prior's too
            first = np.unique(np.concatenate([rng.choice(self.grid.candidates(), self.max_candidates // _FIRST_PASS_SHARE, replace=False),
                                              self.grid.neighbours(seeds)]))
            s1 = self._evaluate(fitted, first, objective, taken)
            top = first[np.argsort(-s1.acquisition)[:_REFINE_TOP]]
            second = np.setdiff1d(self.grid.neighbours(self.grid.neighbours(top)), first)
            if second.size:
                s2 = self._evaluate(fitted, second, objective, taken)
                scores = s1 + s2
            else:
                scores = s1
        self._score_key, self._scores = key, scores
        return scores

    def should_stop(self, study: Study, margin: float) -> str | None:
        """A reason to stop when no unmeasured setting is expected to improve the best by a meaningful share.

        The expected gain of a setting is the model's expected improvement of the log objective over the best
        measured setting that held the budget (a relative gain: 0.005 is half a percent), times its
        probability of holding the budget: a setting whose feasibility is uncertain near the budget counts by
        how likely it holds, and one far from the incumbent in the model's eyes counts by its uncertainty
        only as much as it could pay. The search goes on while any unmeasured, plausible setting's expected
        gain is at least ``stop_gain`` (None: half of ``margin``; a quarter for ``pareto``). Before that, each power mode (a knob that
        caps the others) must have ``min_group`` measurements of its own, unless none of its settings is
        plausibly within the budget. The condition must hold for ``stop_confirmations`` successive fits, so
        one over-confident fit does not end the search. For ``pareto`` the gain is asked of both of its turns:
        the fastest setting's expected improvement and the front's expected hypervolume improvement.
        """
        s = self._score(study, 0)
        if s is not None and s.idx.size == self.grid.candidates().size and not s.possible.any():
            return "every setting that could hold the budget has been measured"
        if s is None and self._none_left_below(study):
            return "every setting that could hold the budget has been measured"
        if len(self._measured(study).idx) < self.min_trials_to_stop:
            return None
        share = _STOP_GAIN_SHARE * (_PARETO_STOP_SHARE if self.objective == "pareto" else 1.0)
        threshold = margin * share if self.stop_gain is None else self.stop_gain
        objectives = ["time", "energy"] if self.objective == "pareto" else [self.objective]
        for k, _ in enumerate(objectives):
            s = self._score(study, k)  # k's parity picks the pareto objective
            if s is None or not math.isfinite(s.best) or self._lacking_groups(study, s):
                self._stop_streak = []
                return None
            gain = s.acquisition[np.isfinite(s.acquisition)]
            if gain.size and float(np.max(gain)) >= threshold:
                self._stop_streak = []
                return None
        key = self.models.key
        if key not in self._stop_streak:
            self._stop_streak.append(key)
        if len(self._stop_streak) < self.stop_confirmations or self._polish_candidates(study):
            return None
        polished = "; its neighbours measured" if self.polish else ""
        fits = "one fit" if self.stop_confirmations == 1 else f"{self.stop_confirmations} fits in a row"
        what = ("improve the fastest or the front's hypervolume by" if self.objective == "pareto" else
                "improve the best by")
        return (f"no unmeasured setting is expected to {what} {threshold:.2%} within the budget "
                f"(hardware model; {fits}){polished}")

    def _none_left_below(self, study: Study) -> bool:
        """Before the first fit: whether every unmeasured candidate is certain to fail without a model (at or
        above a measured setting that was over the budget, or out of memory: :meth:`_certain_to_fail`). The
        space-filling start has nothing left to learn then; measuring on would only run the board over the budget (Orin
        Nano cnn at 4.6 W: both modes' least settings measured over what the sensor can certify, the start
        went on to batch 1024 at 15W, 6.8 W, and batch 64 at 8.5 W)."""
        if self.budget_w is None or self.prior:
            return False
        measured = self._measured(study)
        if not measured.idx or not np.any(np.array(measured.powers) > self._limit_w):
            return False
        every = self.grid.candidates()
        free = every[~np.isin(every, np.array(sorted(self._taken(study)), dtype=np.int64))]
        return bool(np.all(self._certain_to_fail(free, measured)))

    def __repr__(self) -> str:
        return f"GuidedSampler(grid={self.grid.n}, objective={self.objective!r})"
