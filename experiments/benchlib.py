"""The honest oracle benchmark's scorer, shared by ``oracle_gap.py`` and ``sampler_comparison.py``.

The search runs on the simulated twin and measures as it would on a board; this module scores what it
picks with what the search never sees:

* **Steps to target** come from the measured convergence table (``experiments/data/convergence/steps.csv``,
  :func:`edgetune.predictors.convergence.load_convergence`): the median steps over seeds at each measured
  batch size, interpolated linearly in log steps against log batch size in between (:func:`steps_at`). A
  batch size outside the measured range is not scored (no extrapolation): the benchmark's search space keeps
  only the batch sizes of the search's default space that lie within the measured range and whose
  measured median reached the target (:func:`benchmark_batch_sizes`).
* **Step time and power** are the twin's noise-free ground truth at the thermal steady state of training at
  each setting (``Twin.steady_state``, :func:`steady_mean_w`): a board trained on for minutes is warmer than
  the idle one a search starts on, and leaks more. Time to target = steps x step time; energy to target =
  steps x step time x mean power.
* **The budget** is judged on the true 1-s moving average at its highest (:func:`max_window_average_w`: the
  step's forward and backward phases draw different power, so for steps not much shorter than the window
  the highest 1-s average exceeds the mean).
* **The honest oracle** is the best setting whose true 1-s average stays under the budget by the power
  sensor's stated accuracy (:data:`INA3221_ACCURACY`): a search that certifies the budget from readings
  can reach no setting closer to it. The plain oracle (true power under the budget) is shown beside it.

Enumerating the grid: the twin's ground truth depends on the *effective* clocks only (a knob above the power
mode's cap runs at the cap), so every knob setting of the space is mapped to its effective clocks
(``Twin.effective_clocks``) once per device and each distinct one is evaluated once per batch size
(AGX Orin: 61,248 knob settings, 18,464 distinct clocks).
"""

from __future__ import annotations

import os

# One BLAS / OpenMP thread: on a shared 2-core machine the GP fits' thread pools spin against each other
# (a search costs 3x the CPU time with the default pools); set before numpy, scipy and torch load.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import functools
import itertools
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from edgetune.power import open_device
from edgetune.power.sim.physics import FORWARD_SHARE, leak_scale, steady_temperature_c
from edgetune.power.sim.twin import Twin
from edgetune.predictors.convergence import MeasuredCurve, load_convergence, read_convergence_rows
from edgetune.search.efficiency import TargetModel, scalar_score
from edgetune.search.space import SearchSpace, build_space, default_batch_sizes
from edgetune.search.study import Search
from edgetune.search.trial import MeasurementProtocol

__all__ = [
    "CONVERGENCE_TABLE",
    "DEVICES",
    "INA3221_ACCURACY",
    "OBJECTIVES",
    "WORKLOADS",
    "Bench",
    "Case",
    "GridTruth",
    "Point",
    "Row",
    "SensorAccuracy",
    "benchmark_batch_sizes",
    "choose_budgets",
    "hv_ratio",
    "hv_reference",
    "hypervolume_2d",
    "knife_edge_line",
    "machine_state",
    "make_cases",
    "max_window_average_w",
    "median",
    "pareto_points",
    "run_case",
    "span",
    "split_runs",
    "steps_at",
]

HERE = Path(__file__).resolve().parent
#: The measured convergence table (experiments/convergence_truth.py writes it).
CONVERGENCE_TABLE = HERE / "data" / "convergence" / "steps.csv"
#: Every simulated module, in the order rows are printed.
DEVICES = ("orin-agx", "orin-nx", "orin-nano", "xavier-nx")
WORKLOADS = ("cnn", "mobilenet", "chartransformer")
OBJECTIVES = ("time", "energy", "pareto")
#: The window the budget is judged over (the search's and the runtime guard's default), seconds.
BUDGET_WINDOW_S = 1.0
#: Where the three budgets sit between the lowest feasible budget (0) and the power of the unconstrained
#: optimum (1): one near the floor, one in the middle, one close under the optimum, so all three bind.
BUDGET_FRACTIONS = (0.05, 0.4, 0.75)
#: Budgets are rounded to this many watts where the rounded figure stays inside the binding range.
BUDGET_STEP_W = 0.1
#: The hypervolume's reference point: this factor times the exhaustive front's nadir (a common convention
#: that lets the front's end points count) ...
HV_NADIR_FACTOR = 1.1
#: ... but at least this factor times its ideal point in each objective: a front of one setting (the
#: fastest is also the most frugal) or a narrow one still spans an area, and a point this much worse than
#: the ideal in either objective counts nothing.
HV_IDEAL_FACTOR = 1.25
#: The search's measurement protocol in the benchmark: the twin times every step (``compute=False``,
#: ``real_steps=0``); one warm-up step; the default window otherwise (2 s, >= 5 steps).
PROTOCOL = MeasurementProtocol(warmup_steps=1, real_steps=0)


# ---------------------------------------------------------------------------------------------- sensor


@dataclass(frozen=True)
class SensorAccuracy:
    """A power sensor's worst-case error: a fixed part per channel plus a part proportional to the power.

    ``bound_w(p, channels)`` = ``channels x offset_w + relative x p``; ``channels`` is how many channels are
    summed into the total (1 where the board has an input rail, 4 on the AGX Orin's derived total).
    """

    offset_w: float
    relative: float
    source: str

    def bound_w(self, power_w: float | np.ndarray, channels: int = 1) -> float | np.ndarray:
        return channels * self.offset_w + self.relative * power_w


# TI INA3221 data sheet (SBOS576, "Electrical Characteristics", V_S = 3.3 V, T_A = 25 C), maximum figures.
#: Shunt offset voltage, referred to input: +-80 uV max.
INA3221_SHUNT_OFFSET_V = 80e-6
#: Shunt-voltage gain error: +-0.25 % max.
INA3221_SHUNT_GAIN_ERROR = 0.0025
#: Bus-voltage gain error: +-0.25 % max.
INA3221_BUS_GAIN_ERROR = 0.0025
#: Bus offset voltage, referred to input: +-16 mV max.
INA3221_BUS_OFFSET_V = 16e-3
#: Shunt resistance and rail voltage the twin's sensor assumes (edgetune/power/profiles/SOURCES.md,
#: "Sensor": one shunt LSB is 40 uV over a 5 mOhm shunt at 5 V).
JETSON_SHUNT_OHM = 5e-3
JETSON_RAIL_V = 5.0

#: Power = bus voltage x shunt current: the shunt offset gives a fixed error per channel
#: (80 uV / 5 mOhm x 5 V = 0.08 W); the two gain errors and the bus offset (16 mV of 5 V) add relatively
#: (0.25 % + 0.25 % + 0.32 % = 0.82 %).
INA3221_ACCURACY = SensorAccuracy(
    offset_w=INA3221_SHUNT_OFFSET_V / JETSON_SHUNT_OHM * JETSON_RAIL_V,
    relative=INA3221_SHUNT_GAIN_ERROR + INA3221_BUS_GAIN_ERROR + INA3221_BUS_OFFSET_V / JETSON_RAIL_V,
    source="TI INA3221 data sheet SBOS576 (max: shunt offset 80 uV, shunt and bus gain error 0.25 % each, "
           "bus offset 16 mV) at a 5 mOhm shunt and 5 V rail (profiles/SOURCES.md)",
)


def max_window_average_w(step_time_s: float | np.ndarray, mean_w: float | np.ndarray,
                         peak_w: float | np.ndarray, window_s: float = BUDGET_WINDOW_S,
                         forward_share: float = FORWARD_SHARE) -> float | np.ndarray:
    """The highest moving average over ``window_s`` of steady training, steps back to back.

    A step draws ``peak_w`` for its last ``1 - forward_share`` (backward) and less before it, so that its
    mean is ``mean_w`` (the twin's ripple, ``physics.phase_gpu_scales``). A window of ``n`` whole steps
    plus ``r`` seconds averages ``n`` step means plus the best ``r`` seconds: as much of the high phase as
    fits, then the low phase.
    """
    t = np.asarray(step_time_s, dtype=float)
    mean = np.asarray(mean_w, dtype=float)
    peak = np.asarray(peak_w, dtype=float)
    if np.any(t <= 0) or not window_s > 0 or not 0 < forward_share < 1:
        raise ValueError("step times and the window must be positive and the forward share in (0, 1)")
    high_s = (1.0 - forward_share) * t
    low_w = (mean - (1.0 - forward_share) * peak) / forward_share
    whole = np.floor(window_s / t)
    rest = window_s - whole * t
    partial = np.where(rest <= high_s, rest * peak, high_s * peak + (rest - high_s) * low_w)
    out = (whole * t * mean + partial) / window_s
    return float(out) if out.ndim == 0 else out


def _window_max_w(e: Any) -> float:
    """:func:`max_window_average_w` of one of the twin's ``Expected`` figures, W."""
    return float(max_window_average_w(e.step_time_s, e.power_w, e.peak_power_w))


# ---------------------------------------------------------------------------------------------- steps


def steps_at(batch_sizes: Sequence[int], steps: Sequence[float], batch_size: float) -> float:
    """Steps to target at ``batch_size`` from a measured curve: exact at a measured batch size, linear in
    log steps against log batch size in between (a power law between neighbours); ``nan`` where a
    neighbour never reached the target.

    Raises:
        ValueError: ``batch_size`` outside the measured range (no extrapolation), or a malformed curve.
    """
    b = np.asarray(batch_sizes, dtype=float)
    s = np.asarray(steps, dtype=float)
    if b.ndim != 1 or b.shape != s.shape or b.size == 0 or np.any(np.diff(b) <= 0) or np.any(b <= 0):
        raise ValueError("batch sizes must be positive, strictly increasing and match the steps")
    if not b[0] <= batch_size <= b[-1]:
        raise ValueError(f"batch size {batch_size} is outside the measured range {b[0]:g}..{b[-1]:g}")
    k = int(np.searchsorted(b, batch_size))
    if b[k] == batch_size:
        return float(s[k])
    lo, hi = s[k - 1], s[k]
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return math.nan
    x = (math.log(batch_size) - math.log(b[k - 1])) / (math.log(b[k]) - math.log(b[k - 1]))
    return float(math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo))))


def seed_steps(path: Path, curve: MeasuredCurve) -> dict[int, tuple[float, ...]]:
    """Each seed's own steps to target at the curve's batch sizes (``nan`` where that run missed the target),
    from the table ``path`` the median curve came from."""
    runs = [r for r in read_convergence_rows(path) if r.workload == curve.workload]
    by_seed: dict[int, dict[int, float]] = {}
    for r in runs:
        by_seed.setdefault(r.seed, {})[r.batch_size] = r.steps
    return {seed: tuple(float(got.get(b, math.nan)) for b in curve.batch_sizes) for seed, got in sorted(by_seed.items())}


def seed_spread(truth: GridTruth, table: Path, objective: str, budget_w: float, batch_size: int,
                setting: Mapping[str, Any]) -> str:
    """A pick's gap rescored with each seed's measured steps (:func:`seed_steps`) and with the seeds' mean, in
    place of their median (:meth:`GridTruth.rescored_gap_pct`): ``seed 0 x%, ...; the seeds' mean y%``."""
    per_seed = seed_steps(table, truth.curve)
    mean = tuple(float(np.mean(col)) for col in zip(*per_seed.values()))
    gaps = [truth.rescored_gap_pct(steps, objective, budget_w, batch_size, setting)
            for steps in (*per_seed.values(), mean)]
    return ", ".join(f"seed {k} {g:.2f}%" for k, g in zip(per_seed, gaps)) + f"; the seeds' mean {gaps[-1]:.2f}%"


def benchmark_batch_sizes(default_batch_size: int, curve: MeasuredCurve) -> tuple[int, ...]:
    """The search's default batch sizes that the measured curve can score (inside its range, target
    reached); the default batch size is always among them or the benchmark refuses the workload."""
    lo, hi = curve.batch_sizes[0], curve.batch_sizes[-1]
    sizes = tuple(b for b in default_batch_sizes(default_batch_size)
                  if lo <= b <= hi and math.isfinite(steps_at(curve.batch_sizes, curve.median_steps, b)))
    if default_batch_size not in sizes:
        raise ValueError(f"{curve.workload}: the default batch size {default_batch_size} has no measured steps "
                         f"to target (measured {lo}..{hi}); rerun experiments/convergence_truth.py")
    return sizes


# ---------------------------------------------------------------------------------------------- budgets


def choose_budgets(floor_w: float, optimum_w: float, fractions: Sequence[float] = BUDGET_FRACTIONS,
                   step_w: float = BUDGET_STEP_W) -> tuple[float, ...]:
    """Budgets that bind: inside ``[floor_w, optimum_w)`` at ``fractions`` of the way up.

    ``floor_w``: the lowest budget under which some setting is certifiably feasible; ``optimum_w``: the
    true power of the unconstrained optimum (any budget at or above it binds nothing). Each budget is the
    nearest multiple of ``step_w`` when that stays in range, else the exact figure. Empty when
    ``optimum_w <= floor_w`` (no budget binds and is feasible).
    """
    if not optimum_w > floor_w:
        return ()
    out = []
    for f in fractions:
        exact = floor_w + f * (optimum_w - floor_w)
        rounded = round(round(exact / step_w) * step_w, 6)
        out.append(rounded if floor_w <= rounded < optimum_w else exact)
    return tuple(out)


# ---------------------------------------------------------------------------------------------- pareto


def pareto_points(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated (minimise both) points among ``points``, by the first coordinate."""
    front: list[tuple[float, float]] = []
    best_y = math.inf
    for x, y in sorted(points):
        if y < best_y:
            front.append((x, y))
            best_y = y
    return front


def hypervolume_2d(points: Sequence[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by ``points`` (minimise both) and bounded by ``reference``; points not better than
    the reference in both coordinates add nothing."""
    rx, ry = reference
    inside = [(x, y) for x, y in points if x < rx and y < ry]
    area = 0.0
    prev_y = ry
    for x, y in pareto_points(inside):
        area += (rx - x) * (prev_y - y)
        prev_y = y
    return area


def hv_reference(front: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The reference point of a front's hypervolume: per objective, the larger of
    :data:`HV_NADIR_FACTOR` x the nadir and :data:`HV_IDEAL_FACTOR` x the ideal."""
    if not front:
        raise ValueError("an empty front has no reference point")
    xs, ys = [x for x, _ in front], [y for _, y in front]
    return (max(HV_NADIR_FACTOR * max(xs), HV_IDEAL_FACTOR * min(xs)),
            max(HV_NADIR_FACTOR * max(ys), HV_IDEAL_FACTOR * min(ys)))


def hv_ratio(points: Sequence[tuple[float, float]], front: Sequence[tuple[float, float]]) -> float:
    """The hypervolume of ``points`` over that of ``front``, both bounded by ``front``'s reference point
    (:func:`hv_reference`)."""
    reference = hv_reference(front)
    return hypervolume_2d(points, reference) / hypervolume_2d(front, reference)


# ---------------------------------------------------------------------------------------------- truth


@dataclass(frozen=True)
class Point:
    """The truth of one setting: time and energy to target, the highest true 1-s average, the mean."""

    time_s: float
    energy_j: float
    max_avg_w: float
    mean_w: float
    fits: bool

    def value(self, objective: str) -> float:
        return self.energy_j if objective == "energy" else self.time_s


def _knob_classes(twin: Twin, space: SearchSpace) -> list[dict[str, Any]]:
    """One representative setting per distinct effective clocks over the space's knob settings."""
    names = space.knob_names
    reps: dict[Any, dict[str, Any]] = {}
    for combo in itertools.product(*(v for _, v in space.knobs)):
        setting = dict(zip(names, combo))
        reps.setdefault(twin.effective_clocks(setting), setting)
    return list(reps.values())


_CLASSES: dict[tuple[str, tuple], list[dict[str, Any]]] = {}


def steady_mean_w(profile: Any, mean_w: np.ndarray, leak_w: np.ndarray, temperature_c: float,
                  iterations: int = 20) -> np.ndarray:
    """Mean power at the thermal steady state of each setting, W, from its mean ``mean_w`` and leakage
    ``leak_w`` at ``temperature_c``: the fixed point of heat balance (``steady_temperature_c``) and leakage
    (``leak_scale``), as :meth:`Twin.steady_state` finds it one setting at a time (vectorised: the grid has
    up to 110,000 settings; each iteration shrinks the error about tenfold)."""
    base = leak_scale(profile, temperature_c)
    t = np.full_like(mean_w, temperature_c)
    for _ in range(iterations):
        power = mean_w + leak_w * (leak_scale(profile, t) / base - 1.0)
        t = steady_temperature_c(profile, power)
    return mean_w + leak_w * (leak_scale(profile, t) / base - 1.0)


@dataclass
class GridTruth:
    """The truth of every setting of one device's space for one workload (distinct effective clocks), at the
    thermal steady state of training at each (:func:`steady_mean_w`): a budget must hold over hours of
    training, not only over a short window on a cool board (the AGX Orin draws 8.8% more at 24.5 W after
    minutes, its leakage up with 11 K). ``mean_w``, ``max_avg_w`` and ``energy_j`` are steady-state figures;
    step times do not depend on temperature."""

    twin: Twin
    cost: Any
    curve: MeasuredCurve
    channels: int
    batch_size: np.ndarray
    settings: list[dict[str, Any]]
    step_time_s: np.ndarray
    mean_w: np.ndarray
    max_avg_w: np.ndarray
    fits: np.ndarray
    #: the same 1-s maxima on the board at its idle temperature, W (for reports: what a cool board reads)
    idle_max_avg_w: np.ndarray
    time_s: np.ndarray = field(init=False)
    energy_j: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        per_batch = {int(b): steps_at(self.curve.batch_sizes, self.curve.median_steps, int(b))
                     for b in np.unique(self.batch_size)}
        self.time_s = np.array([per_batch[int(b)] for b in self.batch_size]) * self.step_time_s
        self.energy_j = self.time_s * self.mean_w

    @classmethod
    def build(cls, profile: str, space: SearchSpace, cost: Any, curve: MeasuredCurve) -> GridTruth:
        twin = Twin(profile, compute=False)
        key = (profile, space.knobs)
        if key not in _CLASSES:
            _CLASSES[key] = _knob_classes(twin, space)
        reps = _CLASSES[key]
        t_idle = twin.temperature_c
        t_warm = t_idle + twin.profile.calibration.leak_doubling_k
        rows = [(b, s, twin.expected(cost, b, s), twin.expected(cost, b, s, temperature_c=t_warm))
                for b in space.batch_sizes for s in reps]
        step = np.array([e.step_time_s for _, _, e, _ in rows])
        idle_mean = np.array([e.power_w for _, _, e, _ in rows])
        idle_peak = np.array([e.peak_power_w for _, _, e, _ in rows])
        # leakage at the idle board's temperature: it doubles over leak_doubling_k, so the difference of the
        # two evaluations is the leakage at the first (the only power that depends on temperature)
        leak = np.array([w.power_w for _, _, _, w in rows]) - idle_mean
        mean = steady_mean_w(twin.profile, idle_mean, leak, t_idle)
        peak = idle_peak + (mean - idle_mean)  # leakage draws alike in the forward and backward phases
        rails = twin.profile.rails
        return cls(twin=twin, cost=cost, curve=curve,
                   channels=1 if rails.input_rail is not None else len(rails.channels),
                   batch_size=np.array([b for b, _, _, _ in rows]), settings=[s for _, s, _, _ in rows],
                   step_time_s=step, mean_w=mean, max_avg_w=max_window_average_w(step, mean, peak),
                   fits=np.array([e.fits for _, _, e, _ in rows]),
                   idle_max_avg_w=max_window_average_w(step, idle_mean, idle_peak))

    def point(self, batch_size: int, setting: Mapping[str, Any]) -> Point:
        """The truth of any setting (the search's pick, the common-practice baseline): at the thermal steady
        state of training at it (:meth:`Twin.steady_state`)."""
        e = self.twin.steady_state(self.cost, batch_size, dict(setting))
        t = steps_at(self.curve.batch_sizes, self.curve.median_steps, batch_size) * e.step_time_s
        return Point(t, t * e.power_w, _window_max_w(e), e.power_w, bool(e.fits))

    def idle_max_avg_w_of(self, batch_size: int, setting: Mapping[str, Any]) -> float:
        """The 1-s maximum of ``setting`` on the board at its idle temperature (a short window on a cool
        board: what the search's first window of it reads), W."""
        return _window_max_w(self.twin.expected(self.cost, batch_size, dict(setting)))

    def _at(self, i: int) -> Point:
        return Point(float(self.time_s[i]), float(self.energy_j[i]), float(self.max_avg_w[i]),
                     float(self.mean_w[i]), bool(self.fits[i]))

    def margin_w(self, power_w: float | np.ndarray) -> float | np.ndarray:
        return INA3221_ACCURACY.bound_w(power_w, self.channels)

    def feasible(self, budget_w: float, honest: bool) -> np.ndarray:
        """Settings that fit and whose true 1-s average holds the budget (honest: by the sensor's accuracy)."""
        power = self.max_avg_w + (self.margin_w(self.max_avg_w) if honest else 0.0)
        return self.fits & np.isfinite(self.time_s) & (power <= budget_w)

    def floor_w(self) -> float:
        """The lowest budget with an honest oracle."""
        ok = self.fits & np.isfinite(self.time_s)
        return float(np.min((self.max_avg_w + self.margin_w(self.max_avg_w))[ok]))

    def _least(self, values: np.ndarray, mask: np.ndarray) -> Point | None:
        """The truth of the setting of ``mask`` with the least ``values`` (None: empty mask)."""
        if not mask.any():
            return None
        return self._at(int(np.flatnonzero(mask)[np.argmin(values[mask])]))

    def best(self, objective: str, mask: np.ndarray) -> Point | None:
        return self._least(self.energy_j if objective == "energy" else self.time_s, mask)

    def law_best(self, objective: str, mask: np.ndarray, target: TargetModel) -> Point | None:
        """The setting of ``mask`` that ``target``'s law of steps (the search's own S(b)) ranks best on the
        twin's true step time and power, with its truth: what a search that knew the hardware exactly but
        not the measured steps would pick (the part of a gap that is the law's, not the measurements')."""
        law_time = np.array([target.steps(int(b)) for b in self.batch_size]) * self.step_time_s
        return self._least(law_time * self.mean_w if objective == "energy" else law_time, mask)

    def rescored_gap_pct(self, steps: Sequence[float], objective: str, budget_w: float, batch_size: int,
                         setting: Mapping[str, Any]) -> float:
        """A pick's gap against the honest oracle, in percent, with another curve of steps to target in place of
        the median over seeds (``steps``: one per measured batch size of :attr:`curve`, e.g. one seed's own):
        how far the measured truth itself can tell settings apart (its seeds disagree by 10-25% at a batch
        size). Power, the budget and the honest mask are as in every other figure."""
        per_batch = {int(b): steps_at(self.curve.batch_sizes, steps, int(b)) for b in np.unique(self.batch_size)}
        time_s = np.array([per_batch[int(b)] for b in self.batch_size]) * self.step_time_s
        values = time_s * self.mean_w if objective == "energy" else time_s
        mask = self.feasible(budget_w, honest=True) & np.isfinite(values)
        e = self.twin.steady_state(self.cost, batch_size, dict(setting))
        chosen = per_batch[int(batch_size)] * e.step_time_s * (e.power_w if objective == "energy" else 1.0)
        if not mask.any() or not math.isfinite(chosen):
            return math.nan
        return (chosen / float(np.min(values[mask])) - 1.0) * 100.0

    def front(self, mask: np.ndarray) -> list[tuple[float, float]]:
        return pareto_points(list(zip(self.time_s[mask].tolist(), self.energy_j[mask].tolist())))

    def unconstrained_power_w(self, objective: str) -> float:
        ok = self.fits & np.isfinite(self.time_s)
        best = self.best("time" if objective == "pareto" else objective, ok)
        assert best is not None
        return best.max_avg_w


# ---------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One benchmark row: device, workload, budget and the objective's truth."""

    profile: str
    workload: str
    budget_w: float
    objective: str
    budget_rank: int  # 0: near the floor, 1: middle, 2: under the optimum


def make_cases(truths: Mapping[tuple[str, str], GridTruth], objective: str) -> tuple[list[Case], list[str]]:
    """Three binding budgets per (device, workload); the pairs where none binds are returned as notes."""
    cases, notes = [], []
    for (profile, name), truth in truths.items():
        budgets = choose_budgets(truth.floor_w(), truth.unconstrained_power_w(objective))
        if not budgets:
            notes.append(f"{profile} {name}: no budget binds (the unconstrained {objective} optimum draws "
                         f"{truth.unconstrained_power_w(objective):.2f} W, the floor is {truth.floor_w():.2f} W)")
        cases += [Case(profile, name, b, objective, k) for k, b in enumerate(budgets)]
    return cases, notes


@dataclass
class Row:
    """A scored search."""

    case: Case
    floor_w: float
    common: Point | None  # (i) default batch, mode as found, highest GPU clock that holds the budget
    default_best: Point | None  # (ii) default batch, best of the other knobs
    oracle: Point | None  # plain: true 1-s average <= budget
    honest: Point | None  # true 1-s average + sensor accuracy <= budget
    chosen: Point | None
    chosen_batch: int | None
    law: Point | None  # the honest setting the search's own S(b) law ranks best (GridTruth.law_best)
    measured: int  # settings measured
    stop: str
    wall_s: float
    cpu_s: float
    #: device seconds the board's 1-s average spent over the budget while this search measured (safe profiling)
    over_budget_s: float = 0.0
    #: windows measured (settings measured again before the pick included)
    windows: int = 0
    #: pareto only: the reported front's hypervolume (its points that truly hold the budget) over the
    #: certifiable front's (the settings that hold it by the sensor's stated accuracy, as the honest oracle;
    #: above 1 where reported points under the budget by less than that accuracy beat it)
    hv_ratio: float = math.nan
    #: pareto only: the same against the plain front (every setting whose true 1-s average holds the budget,
    #: points no reading can certify included; at most 1)
    hv_plain: float = math.nan
    front_violations: int = 0  # pareto only: points of the reported front over the budget
    #: the search's thermal soaks: the rise its margin carries (W), how long they ran in all (device seconds)
    #: and how many ran
    soak_rise_w: float = 0.0
    soak_s: float = 0.0
    soaks: int = 0
    #: after each measured setting, in order: the search's own score of its incumbent (what it measured) and
    #: that incumbent's truth (the objective's value; inf before one held the budget): how soon the search
    #: had its pick, and what a shorter search would have scored
    trajectory: list[tuple[float, float]] = field(default_factory=list)
    #: the pick's knob setting (None: nothing held the budget)
    chosen_setting: dict[str, Any] | None = None
    #: the batch-size tie the search reported (best.json ``batch_size_tie``; None: none): the runner-up's batch
    #: size, how far behind the pick the search's law put it (%), and the runner-up's truth
    tie_batch: int | None = None
    tie_cost_pct: float = math.nan
    tie_point: Point | None = None
    #: the knife edge the search reported (best.json ``knife_edge``: its best held setting holds the budget by
    #: less than the sensor's accuracy and the thermal rise, so the pick is a safer one; None: none, or no safer
    #: setting, so the pick is the edge): the edge's truth
    edge_point: Point | None = None

    @property
    def pick_at(self) -> int:
        """Measured settings until the search's incumbent reached its final truth (0: never held)."""
        final = self.trajectory[-1][1] if self.trajectory else math.inf
        if not math.isfinite(final):
            return 0
        return next(k + 1 for k, (_, v) in enumerate(self.trajectory) if v == final)

    @property
    def objective(self) -> str:
        return self.case.objective

    def _value(self, p: Point | None) -> float:
        return p.value(self.objective) if p is not None else math.nan

    @property
    def gap_pct(self) -> float:
        """Chosen against the honest oracle (inf: nothing chosen or the pick never reaches the target)."""
        if self.chosen is None or self.honest is None or not math.isfinite(self._value(self.chosen)):
            return math.inf
        return (self._value(self.chosen) / self._value(self.honest) - 1.0) * 100.0

    @property
    def law_gap_pct(self) -> float:
        """The law's pick against the honest oracle: the gap no measurement of the hardware removes."""
        if self.law is None or self.honest is None:
            return math.nan
        return (self._value(self.law) / self._value(self.honest) - 1.0) * 100.0

    def _taken_gap_pct(self, point: Point | None) -> float:
        """``point`` against the honest oracle, as a user who takes it instead of the pick gets it (nan: none;
        inf: its true 1-s average is over the budget, so it is no choice)."""
        if point is None or self.honest is None:
            return math.nan
        if point.max_avg_w > self.case.budget_w:
            return math.inf
        return (self._value(point) / self._value(self.honest) - 1.0) * 100.0

    @property
    def tie_gap_pct(self) -> float:
        """The reported tie's runner-up against the honest oracle (nan: no tie reported; inf: its true 1-s
        average is over the budget, so it is no choice): what training both batch sizes to the target, as the
        report advises, would give, taking the better."""
        return self._taken_gap_pct(self.tie_point)

    @property
    def edge_over(self) -> bool:
        """The reported knife edge's true 1-s average is over the budget: taken instead of the pick, it would
        violate the budget (False: no edge reported)."""
        return self.edge_point is not None and self.edge_point.max_avg_w > self.case.budget_w

    @property
    def edge_gap_pct(self) -> float:
        """The reported knife edge against the honest oracle, as a user who takes it instead of the pick gets
        it (nan: no edge reported; inf: its true 1-s average is over the budget, so taking it violates it)."""
        return self._taken_gap_pct(self.edge_point)

    @property
    def violation(self) -> bool:
        if self.objective == "pareto":
            return self.front_violations > 0
        return self.chosen is not None and self.chosen.max_avg_w > self.case.budget_w

    def ratio(self, reference: Point | None, of: Point | None = None) -> float:
        """How many times less time (energy) ``of`` (default: the pick) takes than ``reference``."""
        of = self.chosen if of is None else of
        if reference is None or of is None:
            return math.nan
        return self._value(reference) / self._value(of)


def _search(case: Case, space: SearchSpace, workload: Any, sampler: str, n_trials: int, seed: int,
            target: TargetModel):
    device = open_device(f"sim:{case.profile}", seed=seed, compute=False)
    try:
        s = Search(device, workload, space, budget_w=case.budget_w, objective=case.objective,
                   target=target, protocol=PROTOCOL, sampler=sampler, n_trials=n_trials,
                   seed=seed,
                   study_name=f"{case.profile}-{case.workload}-{case.budget_w}",
                   storage=optuna.storages.InMemoryStorage())
        return s.run()
    finally:
        device.close()


def common_practice(truth: GridTruth, start: Mapping[str, Any], default_batch: int, budget_w: float
                    ) -> Point | None:
    """The seed paper's common practice: the default batch size, the power mode as the board was found,
    the highest GPU clock whose true 1-s average holds the budget."""
    for f in sorted(truth.twin.knob_grid()["gpu_freq"], reverse=True):
        p = truth.point(default_batch, {**start, "gpu_freq": f})
        if p.fits and p.max_avg_w <= budget_w:
            return p
    return None


def trajectory(truth: GridTruth, result: Any, objective: str) -> list[tuple[float, float]]:
    """:attr:`Row.trajectory` of a search result."""
    out, own, value = [], math.inf, math.inf
    for r in sorted(result.measured, key=lambda r: r.number):
        if r.feasible and r.outcome is not None:
            score = scalar_score(r.outcome, objective, result.cost)
            if score < own:
                own = score
                value = truth.point(r.candidate.batch_size, r.candidate.knobs).value(objective)
        out.append((own, value))
    return out


def run_case(case: Case, truth: GridTruth, space: SearchSpace, workload: Any, start: Mapping[str, Any],
             sampler: str = "auto", n_trials: int = 40, seed: int = 0, target: TargetModel | None = None) -> Row:
    """Run one search and score it; ``target``: the search's steps to target (default: the law with the
    workload's measured B_noise). The ``law`` reference is that target's own best on the true hardware."""
    target = TargetModel.for_workload(workload) if target is None else target
    budget = case.budget_w
    default_b = workload.default_batch_size
    plain = truth.feasible(budget, honest=False)
    honest_mask = truth.feasible(budget, honest=True)
    at_default = plain & (truth.batch_size == default_b)
    objective = "time" if case.objective == "pareto" else case.objective
    t0, c0 = time.perf_counter(), time.process_time()
    res = _search(case, space, workload, sampler, n_trials, seed, target)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    chosen = truth.point(res.best.candidate.batch_size, res.best.candidate.knobs) if res.best else None
    row = Row(case=case, floor_w=truth.floor_w(),
              common=common_practice(truth, start, default_b, budget),
              default_best=truth.best(objective, at_default), oracle=truth.best(objective, plain),
              honest=truth.best(objective, honest_mask), chosen=chosen,
              chosen_batch=res.best.candidate.batch_size if res.best else None,
              law=truth.law_best(objective, honest_mask, target),
              measured=len(res.settings), windows=len(res.measured), stop=res.stop_reason, wall_s=wall, cpu_s=cpu,
              over_budget_s=res.over_budget_s, trajectory=trajectory(truth, res, objective),
              soak_rise_w=res.thermal_rise_w, soak_s=sum(s.duration_s for s in res.thermal_soaks),
              soaks=len(res.thermal_soaks),
              chosen_setting=dict(res.best.candidate.knobs) if res.best else None)
    tie = res.batch_tie
    if tie is not None:
        row.tie_batch, row.tie_cost_pct = tie.runner_up.candidate.batch_size, tie.cost_pct
        row.tie_point = truth.point(tie.runner_up.candidate.batch_size, tie.runner_up.candidate.knobs)
    edge = res.knife_edge
    if edge is not None and edge.safer is not None:
        row.edge_point = truth.point(edge.edge.candidate.batch_size, edge.edge.candidate.knobs)
    if case.objective == "pareto":
        # the reported points that truly hold the budget, against the certifiable front (as the gaps are
        # against the honest oracle) and against the plain one, each with its own reference point
        picked = [truth.point(r.candidate.batch_size, r.candidate.knobs) for r in res.pareto]
        held = [(p.time_s, p.energy_j) for p in picked if p.max_avg_w <= budget and math.isfinite(p.time_s)]
        row.front_violations = sum(p.max_avg_w > budget for p in picked)
        row.hv_ratio = hv_ratio(held, truth.front(honest_mask))
        row.hv_plain = hv_ratio(held, truth.front(plain))
    return row


# ---------------------------------------------------------------------------------------------- setup


def split_runs(table: Path, held_out: int, scorer_path: Path) -> dict[str, dict[int, list[float]]]:
    """Split the measured convergence table by seed: the runs of each workload's first ``held_out`` seeds
    (sorted) are returned per batch size, what a user who trained that many runs per batch size would hand the
    search (``efficiency.steps_to_target``); the other seeds' runs are written to ``scorer_path``, the truth
    the search is scored on. The two share no run."""
    from edgetune.predictors.convergence import read_comment, save_convergence_rows

    rows = read_convergence_rows(table)
    given: dict[str, dict[int, list[float]]] = {}
    kept = []
    for name in sorted({r.workload for r in rows}):
        seeds = sorted({r.seed for r in rows if r.workload == name})
        if len(seeds) <= held_out:
            raise ValueError(f"{table}: {name} has {len(seeds)} seeds; hold out fewer than that")
        first = set(seeds[:held_out])
        for r in rows:
            if r.workload != name:
                continue
            if r.seed in first:
                given.setdefault(name, {}).setdefault(r.batch_size, []).append(r.steps)
            else:
                kept.append(r)
    save_convergence_rows(scorer_path, kept, [*read_comment(table),
                                              f"scorer's part: every workload's seeds after its first {held_out}"])
    return given


@dataclass
class Bench:
    """Everything the cases of one run share: workloads, curves, spaces, truths, start settings."""

    workloads: dict[str, Any]
    curves: dict[str, MeasuredCurve]
    spaces: dict[tuple[str, str], SearchSpace]
    truths: dict[tuple[str, str], GridTruth]
    starts: dict[str, dict[str, Any]]
    #: the searches' steps to target per workload where not the law (``RunsTarget``: held-out runs)
    targets: dict[str, TargetModel] = field(default_factory=dict)

    @classmethod
    def load(cls, devices: Sequence[str], workload_names: Sequence[str], table: Path, seed: int = 0) -> Bench:
        from edgetune.workloads import load_workload

        curves = load_convergence(table)
        missing = [n for n in workload_names if n not in curves]
        if missing:
            raise ValueError(f"{table}: no measured steps for {', '.join(missing)}; rerun "
                             f"experiments/convergence_truth.py")
        workloads = {n: load_workload(n, seed=seed) for n in workload_names}
        spaces, truths, starts = {}, {}, {}
        for profile in devices:
            device = open_device(f"sim:{profile}", seed=seed, compute=False)
            starts[profile] = device.settings()
            for name, wl in workloads.items():
                sizes = benchmark_batch_sizes(wl.default_batch_size, curves[name])
                space = build_space(device, wl.default_batch_size, batch_sizes=sizes)
                spaces[profile, name] = space
                truths[profile, name] = GridTruth.build(profile, space, wl.cost, curves[name])
            device.close()
        return cls(workloads, curves, spaces, truths, starts)

    def run(self, case: Case, sampler: str, n_trials: int, seed: int) -> Row:
        key = (case.profile, case.workload)
        return run_case(case, self.truths[key], self.spaces[key], self.workloads[case.workload],
                        self.starts[case.profile], sampler, n_trials, seed, self.targets.get(case.workload))

    def run_all(self, cases: Sequence[Case], sampler: str, n_trials: int, seed: int, jobs: int = 1,
                on_row: Any = None) -> list[Row]:
        """Every case, in ``jobs`` forked processes (each search is seeded on its own: the rows are the same
        whatever ``jobs``); ``on_row(row)`` as each finishes; rows in the order of ``cases``."""
        if jobs <= 1:
            rows = []
            for case in cases:
                rows.append(self.run(case, sampler, n_trials, seed))
                if on_row is not None:
                    on_row(rows[-1])
            return rows
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        global _FORKED
        _FORKED = self  # the children inherit the grids through fork instead of rebuilding them
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_run_forked, case, sampler, n_trials, seed): i for i, case in enumerate(cases)}
            out: list[Row | None] = [None] * len(cases)
            for future in as_completed(futures):
                out[futures[future]] = row = future.result()
                if on_row is not None:
                    on_row(row)
        return [r for r in out if r is not None]


_FORKED: Bench | None = None


def _run_forked(case: Case, sampler: str, n_trials: int, seed: int) -> Row:
    assert _FORKED is not None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return _FORKED.run(case, sampler, n_trials, seed)


def knife_edge_line(rows: Sequence[tuple[str, float, float | None]], noun: str = "rows",
                    over_noun: str = "rows ", lead: str = "knife edges reported") -> str:
    """The summary line on the knife edges the searches reported (best.json ``knife_edge``: the best held setting
    short of the sensor's accuracy and the thermal rise, the pick a safer one).

    ``rows``: per search, its label, its pick's gap (%) and its reported edge's gap as a user who takes the edge
    instead of the pick gets it (%; inf: the edge's true 1-s average is over the budget; None: no edge
    reported). ``noun`` names the searches (``rows``, ``cases``); ``over_noun`` is said before "over 3%", ``lead``
    first."""
    edged = [r for r in rows if r[2] is not None]
    over = [r for r in rows if r[1] > 3.0]
    told = [r for r in over if r[2] is not None]
    taken = [r[2] if r[2] is not None else r[1] for r in rows]
    held = [g for g in taken if math.isfinite(g)]
    return (f"{lead} (best.json knife_edge: the best held setting short of the sensor's accuracy and "
            f"the thermal rise, the pick a safer one): {len(edged)} of {len(rows)} {noun}; of the {len(over)} "
            f"{over_noun}over 3%, {len(told)}"
            + (" (" + ", ".join(f"{label}: the edge " + ("over the budget" if math.isinf(edge) else f"at {edge:.2f}%")
                                for label, _, edge in told) + ")" if told else "")
            + f"; each edge taken instead of its pick, as the report lets a user: over the budget in "
              f"{sum(math.isinf(r[2]) for r in edged)} of {len(edged)}"
            + (f"; the {noun} then within the budget and within 3% of the oracle: {sum(g <= 3.0 for g in held)} of "
               f"{len(rows)} (worst gap among those within the budget {max(held):.2f}%)" if held else ""))


@functools.cache
def git_commit() -> str:
    """The checkout's commit when first asked (at a run's start), ``-dirty`` when tracked files differed."""
    root = HERE.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def machine_state() -> str:
    """Load average and cores, for the figures' context."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def span(values: Sequence[float]) -> str:
    """``A-Bx`` over the finite values ('-' when none)."""
    finite = [v for v in values if math.isfinite(v)]
    return f"{min(finite):.2f}-{max(finite):.2f}x" if finite else "-"


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan
