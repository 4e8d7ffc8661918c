"""The guided sampler's hardware models: fitted per power mode on the settings measured so far.

:class:`ModelBank` turns the measured settings (:class:`Measured`) into a :class:`Fitted` set of
:class:`~edgetune.predictors.HardwareModel` fits and predicts step time and power, with their std, for any grid
points:

- one model per power mode (named-knob group) whose kin (:meth:`Grid.kin`: itself and the modes that run its
  settings alike) has ``min_group`` measurements, fitted on the kin's rows, clocks as they run;
- a pooled model (modes as ranks) for the modes with too few measurements of their own, until each has one;
- per mode whose own model rests on fewer than :data:`TRUSTED_GROUP_ROWS` rows, the best-measured mode's
  model corrected by this mode's rows (:class:`~edgetune.search.prior.Transfer`), whose step time is mixed with
  the mode's own (:func:`mixture`): where the two disagree, the doubt sends a measurement there;
- with a prior (an earlier study of another board), the prior's model corrected by this board's measurements,
  until this board has ``prior_handoff`` measurements of its own; after that, for the power modes the prior
  measured that have no model of their own yet, in place of the pooled model. The pooled model knows such a
  mode from a handful of this board's rows; the prior's from its own (a warm search capped at 15 settings on
  Orin NX 15W, mobilenet, from Orin Nano 10W: its 14th setting went to a 15W-mode setting at the slowest memory
  clock, 11x slower per step than the pick, and the search settled 3.28% from the oracle; with the prior's model there,
  2.09%; experiments/results/transfer.txt).

A mode whose rows did not change keeps its model (the fit is deterministic), so each new measurement refits
one mode, not all.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgetune.log import get_logger
from edgetune.search.samplers.grid import Grid

_log = get_logger(__name__)

__all__ = ["TRUSTED_GROUP_ROWS", "Fitted", "Measured", "ModelBank", "mixture"]

_MODEL_SEED = 0  # the hardware model's GP optimiser: the same fit for the same rows, whatever the sampler seed
_MIN_ROWS = 2  # the hardware model's fit needs at least two measured rows
#: a power mode's own model predicts its step time alone from this many measured settings of its own; below,
#: its step time is the mixture of that model and the best-measured mode's model corrected by the mode's rows
#: (ModelBank._borrow). A roofline of a dozen parameters fitted on 4-5 rows of one mode was sure of what it
#: never saw: Orin NX mobilenet 7.9 W, its 15W mode's optimum (b 16, top memory clock) predicted at 0.105 +-
#: 0.004 s for about 0.022 s, from three b 128 probes and two slow-memory settings, so it was never measured
#: (23.68% from the oracle), while MAXN's model, fitted on 30 rows, knew such settings. On 300 unmeasured
#: settings of that 15W mode (5 rows of its own, 20 of MAXN, 4 draws) the mixture's time error was 6-21%
#: against the own model's 8-54%, and 92-100% of the truths lay within its 2 std against 17-71%. Power stays
#: the mode's own (mixing it too widened the power doubt of modes over the budget everywhere, and the search
#: spent its settings there: Orin AGX mobilenet 12.1 W went from 0 to 15.77%). Rows are not spread alike: on
#: the energy benchmark's Orin Nano cnn at 8.3 W the 15W mode's 8 rows were the baseline's three probes (batch
#: 128, GPU clock alone varied) and five corners of the space-filling start (the slowest memory or CPU clock),
#: so its own model put the mode's optimum (batch 16, GPU 510 MHz, memory 2133 MHz) at 13.1 +- 1.7 ms for
#: 9.3 ms, and it was never measured (7.80% from the oracle); the borrowed model said 8.6 +- 2.0 ms. 12 against
#: 8 (seeds 0-2, experiments/results/oracle_gap*.txt): that row and Orin NX cnn 9.6 W (energy, 4.41%) at the
#: oracle, time's seed-0 knife edge (AGX Orin chartransformer 13.1 W) 4.73 -> 0.00%, for about half a measured
#: setting more per search (the time median 0.5-1 higher); always borrowing (no count of rows trusted) gave the
#: same energy rows at seed 0 and time's seed 2 the same gaps for 29 more settings in all
TRUSTED_GROUP_ROWS = 12


def mixture(m1: np.ndarray, s1: np.ndarray, m2: np.ndarray, s2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The equal mixture of two predictions (means and absolute std), in log space: the mean of the log means,
    and a variance of the mean relative variance plus the half-difference squared, so two models that disagree
    make the prediction as doubtful as their disagreement."""
    l1, l2 = np.log(m1), np.log(m2)
    var = 0.5 * ((s1 / m1) ** 2 + (s2 / m2) ** 2) + (0.5 * (l1 - l2)) ** 2
    mean = np.exp(0.5 * (l1 + l2))
    return mean, mean * np.sqrt(var)


@dataclass(frozen=True)
class Measured:
    """The measured settings a fit uses: grid indices with step time, judged and peak power (a setting
    measured more than once: the means of its windows, the highest peak); and the batch levels that ran out
    of memory."""

    idx: list[int]
    times: list[float]
    powers: list[float]  # judged power (moving-average maximum plus the guard band), W
    peaks: list[float]
    oom_batches: list[int]
    windows: tuple[int, ...] = ()  # windows pooled per setting (empty: one each)


@dataclass(frozen=True)
class Fitted:
    """Hardware models fitted on :attr:`measured`: one per named-knob group with enough rows, and a pooled
    model (None once every group has its own)."""

    measured: Measured
    per_group: dict[int, Any]
    pooled: Any | None
    transfer: Any | None = None  # with a prior: the prior model corrected by this board's measurements
    #: per power mode with a model of its own on few rows: the best-measured mode's model corrected by this
    #: mode's rows (a :class:`~edgetune.search.prior.Transfer`); its step time is mixed with the mode's own
    #: (ModelBank._borrow)
    borrowed: dict[int, Any] = dataclasses.field(default_factory=dict)
    #: with a prior, once this board's own models have taken over: the prior's model corrected by every
    #: measurement of this board, for the power modes the prior measured that have no model of their own yet
    #: (:attr:`prior_groups`), in place of the pooled model
    prior_fill: Any | None = None
    prior_groups: frozenset[int] = frozenset()


class ModelBank:
    """The hardware models of one search over ``grid``, refitted as measurements come (module docs).

    Args:
        grid: the search space by flat index.
        min_group: measured settings (its kin's) a power mode needs before it gets a model of its own.
        n_startup: measured settings before the first fit (without a prior).
        prior_idx: the grid indices of an earlier study's measured settings mapped to this space (empty: no
            prior), with their step times ``prior_times_s`` (s) and judged powers ``prior_powers_w`` (W);
            prior_handoff: this board's measured settings after which its own models replace the prior's
            corrected one.

    Attributes:
        key: what the last fit was fitted on (None before one): it changes whenever the fit may.
        last: the last fit (None before one).
    """

    def __init__(self, grid: Grid, *, min_group: int, n_startup: int, prior_idx: Sequence[int] = (),
                 prior_times_s: Sequence[float] = (), prior_powers_w: Sequence[float] = (),
                 prior_handoff: int = 0) -> None:
        self.grid = grid
        self.min_group = min_group
        self.n_startup = n_startup
        self.prior_idx = np.asarray(prior_idx, dtype=np.int64)
        self.prior_times_s = list(prior_times_s)
        self.prior_powers_w = list(prior_powers_w)
        self.prior_handoff = prior_handoff
        self.key: Any = None
        self.last: Fitted | None = None
        self._prior_model: Any = None
        self._models: dict[Any, Any] = {}  # the last fit's hardware models by their training rows
        self._borrowed: dict[int, tuple[Any, Any, Any]] = {}  # per mode: (its rows, the main model, the Transfer)
        self._failed_said = False  # a failed fit was warned of (once a search: the next ones name other rows)

    def fit(self, measured: Measured) -> Fitted | None:
        """Fitted models on ``measured`` (None before ``n_startup`` settings, or where a fit fails); the same
        object while the measured set is the same.

        Named knobs (power modes) change what the clocks mean: a mode caps the clocks under it and may gate
        GPU units. So one model is fitted per named-knob combination whose kin (:meth:`Grid.kin`: itself and
        the modes that run its settings alike) has enough measurements (its physics base then sees clocks
        only, as they run), and a pooled model (modes as ranks) covers the combinations that have too few yet.
        """
        idx, times, powers, peaks, oom = (measured.idx, measured.times, measured.powers, measured.peaks,
                                          measured.oom_batches)
        if self.prior_idx.size and len(idx) < self.prior_handoff:
            return self._fit_transfer(measured)
        if len(idx) < self.n_startup:
            return None
        key = (tuple(idx), measured.windows, tuple(oom), tuple(powers))  # powers: a new thermal reference
        if self.key == key:
            return self.last
        from edgetune.predictors.hardware_model import HardwareModel

        grid = self.grid
        previous, kept = self._models, {}

        def fit(members: list[int], names: list[str]):
            # a power mode whose measurements did not change keeps its model: the fit is deterministic, so
            # refitting it on the same rows (most modes, each time one new setting is measured) would give
            # the same model; modes of one kin share theirs
            data = (tuple(names), tuple((idx[k], times[k], powers[k], peaks[k]) for k in members))
            if data in kept:  # a mode's kin's model (Grid.kin), fitted already
                return kept[data]
            if data in previous:
                kept[data] = previous[data]
                return kept[data]
            rows = grid.rows(np.array([idx[k] for k in members]), names)
            kept[data] = HardwareModel(random_state=_MODEL_SEED).fit(
                rows, [times[k] for k in members], [powers[k] for k in members], [peaks[k] for k in members])
            return kept[data]

        groups = grid.group(np.array(idx))
        n_groups = grid.live_groups().size if grid.named else 1
        per_group: dict[int, Any] = {}
        pooled = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                for g in np.union1d(groups, grid.live_groups()):
                    # a mode's model is fitted on its kin's rows too: modes of the same fixed state run a
                    # setting alike, so their rows (clocks as they run) are measurements of one physics
                    members = np.flatnonzero(np.isin(groups, grid.kin(int(g)))).tolist()
                    if len(members) >= (self.min_group if grid.named else _MIN_ROWS):
                        per_group[int(g)] = fit(members, grid.numeric_names)
                unfitted = {int(g) for g in grid.live_groups()} if grid.named else {0}
                unfitted -= set(per_group)
                # ... a mode the prior measured keeps the prior's model, corrected by this board's rows
                prior_groups = frozenset(unfitted & set(self._prior().models)) if self.prior_idx.size else frozenset()
                prior_fill = self._transfer(measured) if prior_groups else None
                if len(per_group) < n_groups and unfitted - prior_groups:
                    # some power mode has too few measurements for a model of its own: the pooled model
                    # covers it (only until every mode has its own; a fit costs about a second)
                    pooled = fit(list(range(len(idx))), grid.pooled_names)
            except (ValueError, np.linalg.LinAlgError) as exc:
                self._say_failed(exc)
                return None
        value = Fitted(measured, per_group, pooled, borrowed=self._borrow(measured, groups, per_group),
                       prior_fill=prior_fill, prior_groups=prior_groups)
        self.key, self.last = key, value
        self._models = kept
        return value

    def _say_failed(self, exc: Exception) -> None:
        """A warning, the first time, that the search goes on without a model: it then proposes as before its
        first fit (space-filling), so a space the model cannot take (a table's knob at 0) is not searched on
        without a word."""
        if not self._failed_said:
            self._failed_said = True
            _log.warning("the guided sampler could not fit its hardware model (%s); it proposes without one, "
                         "space-filling, until a fit succeeds", str(exc) or type(exc).__name__)

    def _borrow(self, measured: Measured, groups: np.ndarray, per_group: dict[int, Any]) -> dict[int, Any]:
        """Per power mode whose own model has fewer than :data:`TRUSTED_GROUP_ROWS` rows (its kin's,
        :meth:`Grid.kin`): the model of the mode with the most rows, not of its kin, corrected by this mode's
        kin's measurements (a :class:`~edgetune.search.prior.Transfer`, as a prior study's model is corrected
        by a new board's). The modes share the physics of the workload (its kernels, memory traffic, host
        launches); what a mode changes (GPU units gated, the clocks' caps) is what the correction learns.
        :meth:`predict` mixes its step time with the mode's own model's (:func:`mixture`), so where the two
        disagree the search measures before trusting either."""
        kin = self.grid.kin
        counts = {g: int(np.isin(groups, kin(g)).sum()) for g in per_group}
        if len(counts) < 2:
            return {}
        from edgetune.search.prior import PriorModel

        main = max(counts, key=lambda g: (counts[g], -g))
        prior = PriorModel.of({main: per_group[main]}, main)
        idx = np.array(measured.idx, dtype=np.int64)
        out: dict[int, Any] = {}
        kept: dict[int, tuple[Any, Any, Any]] = {}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for g, n in counts.items():
                if g in kin(main) or n >= TRUSTED_GROUP_ROWS or n >= counts[main]:
                    continue  # the main model's own kin, or a model trusted on its own rows
                sel = np.flatnonzero(np.isin(groups, kin(g)))
                data = tuple((measured.idx[k], measured.times[k], measured.powers[k]) for k in sel)
                previous = self._borrowed.get(g)
                if previous is not None and previous[0] == data and previous[1] is per_group[main]:
                    out[g] = previous[2]  # neither this mode's rows nor the main mode's model changed
                else:
                    out[g] = self._corrected(prior, idx[sel], [measured.times[k] for k in sel],
                                             [measured.powers[k] for k in sel])
                kept[g] = (data, per_group[main], out[g])
        self._borrowed = kept
        return out

    def _corrected(self, prior: Any, idx: np.ndarray, times: Sequence[float], powers: Sequence[float]) -> Any:
        """``prior`` (a :class:`~edgetune.search.prior.PriorModel`) corrected by the measured settings ``idx``,
        their step times and judged powers: a :class:`~edgetune.search.prior.Transfer` over batch size and every
        knob, each scaled by the log span of its values."""
        from edgetune.search.prior import Transfer

        grid = self.grid
        names = ["batch_size", *grid.pooled_names]
        scale = np.array([np.ptp(np.log(np.maximum(t, 1e-12))) for t in grid.tables])
        return Transfer(prior, names, scale, grid.rows(idx, grid.numeric_names), grid.rows(idx, grid.pooled_names),
                        grid.group(idx), times, powers)

    def _prior(self) -> Any:
        """The prior's models, one per power mode it measured (fitted once; a
        :class:`~edgetune.search.prior.PriorModel`)."""
        from edgetune.search.prior import PriorModel

        if self._prior_model is None:
            grid, pidx = self.grid, self.prior_idx
            self._prior_model = PriorModel(
                grid.rows(pidx, grid.numeric_names), grid.group(pidx), self.prior_times_s,
                self.prior_powers_w, min_rows=self.min_group)
        return self._prior_model

    def _transfer(self, measured: Measured) -> Any:
        """The prior's model corrected by the measured settings."""
        return self._corrected(self._prior(), np.array(measured.idx, dtype=np.int64), measured.times,
                               measured.powers)

    def _fit_transfer(self, measured: Measured) -> Fitted:
        """The prior model (fitted once) corrected by the measured settings; the same object while the
        measured set is the same."""
        key = ("transfer", tuple(measured.idx), measured.windows, tuple(measured.oom_batches),
               tuple(measured.powers))
        if self.key == key and self.last is not None:
            return self.last
        value = Fitted(measured, {}, None, self._transfer(measured))
        self.key, self.last = key, value
        return value

    def predict(self, fitted: Fitted, cand: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step time (s), power (W) and their std for grid indices ``cand``, from ``fitted``."""
        grid = self.grid
        if fitted.transfer is not None:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                return fitted.transfer.predict(grid.rows(cand, grid.numeric_names),
                                               grid.rows(cand, grid.pooled_names), grid.group(cand))
        per_group, pooled = fitted.per_group, fitted.pooled
        out = [np.full(cand.size, np.nan) for _ in range(4)]
        groups = grid.group(cand)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            for g in np.unique(groups):
                sel = np.flatnonzero(groups == g)
                model = per_group.get(int(g))
                if model is None and int(g) in fitted.prior_groups:
                    got = fitted.prior_fill.predict(grid.rows(cand[sel], grid.numeric_names),
                                                    grid.rows(cand[sel], grid.pooled_names), groups[sel])
                else:
                    rows = grid.rows(cand[sel], grid.numeric_names if model is not None else grid.pooled_names)
                    pred = (model or pooled).predict(rows)
                    got = (pred.step_time_s, pred.power_w, pred.step_time_std, pred.power_std)
                    if int(g) in fitted.borrowed:
                        other = fitted.borrowed[int(g)].predict(rows, grid.rows(cand[sel], grid.pooled_names),
                                                                groups[sel])
                        t, t_std = mixture(got[0], got[2], other[0], other[2])
                        got = (t, got[1], t_std, got[3])
                for a, r in zip(out, got):
                    a[sel] = r
        return tuple(out)
