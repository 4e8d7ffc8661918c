"""The thermal soak: the pick measured for minutes, and the power it will draw once the board is warm.

A search measures each setting for a second or two, on a board near its idle temperature. A training run
then holds the load for hours: the board warms by 10-20 K over minutes (its heatsink's time constant,
R_th x C_th, is 5-6 minutes on a developer kit) and the GPU's leakage rises with it, so the same setting
draws more. On the simulated AGX Orin the 24.5 W cnn pick read 23.6 W in its window and draws 25.6 W at its
thermal steady state. A budget that protects a battery or a supply has to hold then, not only in the window.

So before the search stops, its pick is *soaked*: trained at for :data:`SOAK_S` seconds in windows of
:data:`SOAK_CHUNK_S`, the board temperature read after each (:attr:`~edgetune.power.base.Device.temperature_c`,
a thermal zone on a Jetson, NVML on a GPU). :func:`fit_soak` extrapolates what the soak saw to the steady
state:

1. the temperature approaches its steady value exponentially (first-order heat balance at a constant
   load): ``T(t) = T_ss - (T_ss - T_0) exp(-t / tau)``, fitted by least squares (``tau`` on a log grid up to
   four times the soak and :data:`_MAX_TAU_S`, ``T_ss`` and ``T_0`` linear given ``tau``). A thermal zone
   reads in steps (1/32 K on Orin, 1/2 K on Xavier, 1 K through NVML), and a board warming by a few of them
   shows where the temperature crossed from one step to the next far better than where it lay within one, so
   the fit is made on those crossings where the readings are coarse (:func:`_crossings`). A temperature with no curvature at all is
   extrapolated as far as the bound lets it (:attr:`SoakFit.tau_bounded`, said in the report);
2. the power rises linearly with the temperature over a few kelvin (leakage): ``P = c + slope x T``, fitted
   over the windows, ``slope >= 0``;
3. the steady power is ``c + slope x T_ss``; the thermal rise is that minus the setting's mean power over its
   earlier windows (what the search certified it on).

Every later judgement of the budget asks a setting to hold it by the sensor's accuracy *plus* the rise
(:attr:`~edgetune.search.results.SearchResult.required_margin_w`), and the search goes on where that moves
its pick. The rise grows with the power a setting draws (its heat warms the board, and the warmth raises the
leakage), so it is carried to the settings that compete at the budget per watt: the margin counts the rise of
a setting that would reach the limit less the sensor's accuracy once warm, at the largest rise per watt of
cool power a soak measured (:func:`thermal_rise_w`). A setting drawing less than the soaked one warms the
board less, so for it the rise is on the safe side. One drawing more is not: the rise grows faster than the
power, since the hotter setting runs its rails at higher voltages, whose leakage rises more per kelvin. On
the simulated AGX Orin (cnn, energy at 22.1 W) a 14.9-W pick soaked 0.25 W of rise, carried per watt as
0.36 W to a 21.1-W pick whose own rise was 1.14 W, and the pick drew 22.26 W warm. So a pick drawing more
than every setting soaked to its end (:func:`hottest_soaked_w`), by more than the sensor's accuracy, is
soaked itself before the search stops; for ``pareto``, whose whole front is offered, the hottest such point
of the front. Where the device reads no temperature, the rise is what the soak saw
(a lower bound: the board had minutes more to warm), and the result says so. A soak that crosses the budget
is stopped like any trial (safe profiling): its rise is at least what takes the setting to the budget (its mean to the budget less
the step's ripple, once the soak ran half its length and its fit so had windows to read the rise:
:func:`_stopped_floor_w`), and the search soaks its next
pick too, on the board the first one warmed (:data:`MAX_SOAKS` in all), since a few windows are too few to
extrapolate from. A setting soaked itself is judged by its own rise, not the carried one
(:func:`rise_for_w`), and one whose own soak crossed the budget by no margin at all (:func:`crossed_warm`): once a
soak ran to its end, the search soaks at its stop the best setting that only the carried rise rules out, so that
a soak of another setting does not decide a knife edge.
The stretch that was stopped is not fitted: it is not a window but the moment before the stop. Once a soak
ran to its end, a stopped one counts what it proved (up to the highest mean power of its windows), or what its
fit extrapolated where that is more and the soak ran a minute or more (:func:`_stopped_rise_w`: what it proved is
a lower bound, and carried per watt it understates the settings as hot as it); one stopped in its first window
proved a mean of at least the limit less how far its setting's judged power read over its mean in the search's
windows (:attr:`ThermalSoak.cool_excess_w`).

The rise is counted from the board temperature of the pick's search windows. After a soak the board stays
warm for minutes, so the windows measured then read high by the leakage of those extra kelvin, and judged
as they read they would pay the rise twice. So every window records the board temperature at its end
(:attr:`~edgetune.search.trial.Measurement.temperature_c`) and, once a soak measured how power follows the
temperature, the search refers each window's power to one reference temperature, the coolest a soaked pick
was measured at (:class:`ThermalReference`, :func:`thermal_reference`): ``P_ref = P - slope x (T_window -
T_ref)``. Each soak's rise is counted from there too: a pick measured on a board an earlier soak had warmed
rose from the reference by ``slope x (T_cool - T_ref)`` more than its own soak saw. Energy figures stay as
measured. The search also soaks its pick before its last :data:`SOAK_RESERVE` share of the
settings, or after :data:`SOAK_AFTER` settings where that comes first (:func:`soak_reserve`), so that settings
remain to re-aim with once the margin moved.

Pure functions but :func:`soak`, which runs the windows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgetune.log import get_logger
from edgetune.power.base import Device, KnobValue
from edgetune.power.knobs import Candidate
from edgetune.power.monitor import PowerMonitor
from edgetune.search.measurement import MeasurementProtocol
from edgetune.search.trial import measure_setting

__all__ = ["MAX_SOAKS", "SOAK_AFTER", "SOAK_CHUNK_S", "SOAK_RESERVE", "SOAK_S", "STOPPED_FIT_S", "SoakFit", "ThermalReference",
           "ThermalSoak", "crossed_warm", "fit_soak", "governing", "hottest_soaked_w", "required_margin_w",
           "rise_for_w", "soak", "soak_reserve", "soaked_rise_w", "thermal_reference", "thermal_rise_w"]

_log = get_logger(__name__)

#: how long the pick is trained at before the search stops, s of device time: about one time constant of a
#: developer kit's heatsink (5-6 minutes), so that the temperature's approach bends enough to extrapolate
#: through a thermal zone's steps. Soaked for half of it (180 s), the twins' boards read their rise 0.19-2.07x
#: the truth (worst error 0.090 W, mean 0.016 W; Xavier NX's half kelvins a straight line to the fit); for 360 s,
#: 0.96-1.53x (worst 0.026 W, mean 0.004 W): experiments/results/soak_fit.txt
SOAK_S = 360.0
#: a soak stopped over the budget after this many device seconds or more counts its fit's rise where that is more
#: than it proved (:func:`_stopped_rise_w`): twelve windows. On the pareto benchmark (seed 1, AGX Orin mobilenet at
#: 33.3 W) soaks of the front's hottest points stopped after 117 and 178 s fitted 2.54 and 2.66 W of rise (the
#: truth about 3 W) and proved 1.3 and 0.7 W; trusted only from half the soak (180 s), the proven rise was carried
#: per watt (1.55 W) and three front points drew 33.8-34.6 W warm
STOPPED_FIT_S = 60.0
#: one window of the soak, s: the temperature is read after each
SOAK_CHUNK_S = 5.0
#: soaks per study at most: a soak stopped over the budget is followed by one of the next pick, on the warm
#: board (the first saw too little to extrapolate from); once one ran to its end, the stop soaks a setting that
#: only the carried rise rules out (:func:`rise_for_w`)
MAX_SOAKS = 3
#: the share of a search's settings kept for after its first soak: the pick is soaked once the search has
#: measured all but this share of ``n_trials`` (11 of 15), so that the moved margin can still re-aim it ...
SOAK_RESERVE = 0.25
#: ... or once it has measured this many settings, where that comes first: where the guided sampler's stopping
#: rule may first end a search without a prior whose objective involves power (``MIN_TRIALS_TO_STOP``; a
#: ``time`` search may stop from 16 on, and one that stops before 20 soaks its pick at the stop), so that the
#: moved margin re-aims the search while it goes on. Soaked at 30 of 40 (or at the stop where that came
#: first), the re-aim came after the first stop: on the oracle benchmark the median search measured 3 more
#: settings after it, up to 15 more.
#: Soaked at 7 of a warm start's 15 settings (half), a transfer case lost its way (experiments/results/transfer.txt)
SOAK_AFTER = 20
#: the time constants the temperature fit tries, s (log grid): a few seconds to hours
_TAU_GRID_S = np.geomspace(10.0, 20_000.0, 240)
#: at most this many times the soak's length is extrapolated, and at most :data:`_MAX_TAU_S`: a temperature that
#: still rises in a straight line at the end of the soak (no curvature to fit) is taken to settle no later than
#: this (a soak stopped over the budget after a minute is extrapolated over four minutes, not twelve)
_MAX_TAU_PER_SOAK = 4.0
#: ... s: twice a developer kit's time constant
_MAX_TAU_S = 720.0
#: the fewest changes of a coarse reading the temperature fit is made on (:func:`_crossings`): three points for
#: its three parameters
_MIN_CROSSINGS = 3


@dataclass(frozen=True)
class SoakFit:
    """What :func:`fit_soak` extrapolated.

    Attributes:
        steady_power_w: mean power at the thermal steady state, W.
        steady_temperature_c: the fitted steady temperature, degC (None: no temperature read).
        tau_s: the fitted time constant, s (None: no temperature read).
        slope_w_per_k: power per kelvin of board temperature over the soak, W/K (None: no temperature read).
        extrapolated: False where the steady power is only what the soak saw at its end.
        tau_bounded: the fitted time constant is the longest the fit allows: the temperature showed no
            curvature, so the steady state is extrapolated as far as the bound lets it (an upper estimate).
    """

    steady_power_w: float
    steady_temperature_c: float | None = None
    tau_s: float | None = None
    slope_w_per_k: float | None = None
    extrapolated: bool = False
    tau_bounded: bool = False


def _fit_temperature(t: np.ndarray, temp: np.ndarray, max_tau_s: float) -> tuple[float, float, bool]:
    """``(T_ss, tau, bounded)`` of ``T(t) = T_ss + b exp(-t / tau)`` by least squares, ``tau`` at most
    ``max_tau_s`` (``bounded``: the fit took the longest ``tau`` it allows)."""
    grid = _TAU_GRID_S[_TAU_GRID_S <= max_tau_s]
    best = (math.inf, float(temp[-1]), max_tau_s)
    for tau in grid:
        x = np.exp(-t / tau)
        design = np.column_stack([np.ones_like(x), x])
        coef, *_ = np.linalg.lstsq(design, temp, rcond=None)
        sse = float(np.sum((design @ coef - temp) ** 2))
        if sse < best[0]:
            best = (sse, float(coef[0]), float(tau))
    return best[1], best[2], bool(grid.size == 0 or best[2] >= grid[-1])


def _crossings(t: np.ndarray, temp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The points the temperature fit is made on: where the readings are coarse steps (a reading repeats over
    at least half the windows, and changes :data:`_MIN_CROSSINGS` times or more), the crossings between steps:
    a reading that moves from one step to the next says the temperature passed the midpoint of the two between
    the windows, which is known far better than where it lay within a step (five boards 2.5 K under their
    steady temperature, read in Xavier's half kelvins for 360 s: fitted as read, their steady temperature came
    out 0.65 K low to 0.84 K high, fitted at the crossings within 0.3 K; tests/test_thermal.py); else the
    readings as they are."""
    moved = np.flatnonzero(np.diff(temp) != 0.0) + 1
    if moved.size < _MIN_CROSSINGS or moved.size > (temp.size - 1) / 2:
        return t, temp
    return (t[moved - 1] + t[moved]) / 2.0, (temp[moved - 1] + temp[moved]) / 2.0


def fit_soak(t_s: Sequence[float], power_w: Sequence[float], temperature_c: Sequence[float | None]) -> SoakFit:
    """The steady state a soak's windows lead to (module docs).

    Args:
        t_s: each window's end, s from the soak's start.
        power_w: each window's mean power, W.
        temperature_c: the board temperature read at each window's end, degC (None where not read).
    """
    t = np.asarray(t_s, dtype=float)
    p = np.asarray(power_w, dtype=float)
    if t.size == 0 or t.size != p.size or t.size != len(temperature_c):
        raise ValueError("a soak fit needs one time, power and temperature per window")
    if t.size < 4 or any(v is None for v in temperature_c):
        return SoakFit(steady_power_w=float(p[-1]))
    temp = np.asarray(temperature_c, dtype=float)
    if float(np.ptp(temp)) <= 0.0:  # the temperature did not move: the board is at its steady state
        return SoakFit(float(np.mean(p)), float(np.mean(temp)), None, 0.0, True)
    t_fit, temp_fit = _crossings(t, temp)
    max_tau_s = min(_MAX_TAU_PER_SOAK * max(float(t[-1] - t[0]), 1.0), _MAX_TAU_S)
    t_ss, tau, bounded = _fit_temperature(t_fit - t[0], temp_fit, max_tau_s)
    slope, intercept = np.polyfit(temp, p, 1)
    slope = max(float(slope), 0.0)
    if slope == 0.0:
        intercept = float(np.mean(p))
    else:
        intercept = float(np.mean(p) - slope * np.mean(temp))
    t_ss = max(t_ss, float(temp[-1])) if temp[-1] >= temp[0] else min(t_ss, float(temp[-1]))
    return SoakFit(steady_power_w=intercept + slope * t_ss, steady_temperature_c=t_ss, tau_s=tau,
                   slope_w_per_k=slope, extrapolated=True, tau_bounded=bounded)


@dataclass
class ThermalSoak:
    """One soak of the pick and the thermal rise it measured (kept in the study, reported in best.json).

    Attributes:
        batch_size, setting: the setting soaked.
        cool_power_w: its mean power over the windows the search measured before the soak, W.
        duration_s: device seconds the soak ran.
        t_s, power_w, temperature_c: each window's end (s from the soak's start), mean power (W) and the board
            temperature read then (degC; None where the device reads none).
        steady_power_w, steady_temperature_c, tau_s, slope_w_per_k, extrapolated, tau_bounded: :class:`SoakFit`'s.
        stopped_over_budget: a window crossed the budget and the soak was stopped there (safe profiling).
        over_budget_s: device seconds the board's moving average was over the budget during the soak.
        cool_temperature_c: the mean board temperature of the search's windows of the setting, degC (None:
            not read): the temperature ``cool_power_w`` and so the rise are counted from.
        limit_w: the budget the soak ran under, W (None: none).
        after_settings: settings the search had measured when it soaked.
        cool_excess_w: how far the setting's judged power (its 1-s maximum with the guard band) read over its
            mean power in the search's windows, W, their mean (None: not known): the most its mean can lie
            below the limit when a 1-s average crosses it (what a soak stopped in its first window proves).
    """

    batch_size: int
    setting: dict[str, KnobValue]
    cool_power_w: float
    duration_s: float
    t_s: list[float] = field(default_factory=list)
    power_w: list[float] = field(default_factory=list)
    temperature_c: list[float | None] = field(default_factory=list)
    steady_power_w: float = math.nan
    steady_temperature_c: float | None = None
    tau_s: float | None = None
    slope_w_per_k: float | None = None
    extrapolated: bool = False
    tau_bounded: bool = False
    stopped_over_budget: bool = False
    over_budget_s: float = 0.0
    cool_temperature_c: float | None = None
    limit_w: float | None = None
    after_settings: int = 0
    cool_excess_w: float | None = None

    @property
    def rise_w(self) -> float:
        """How much more the setting draws at the thermal steady state than the search measured, W (>= 0)."""
        if not (math.isfinite(self.steady_power_w) and math.isfinite(self.cool_power_w)):
            return 0.0
        return max(0.0, self.steady_power_w - self.cool_power_w)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rise_w": self.rise_w}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThermalSoak:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})

    def describe(self, counted_rise_w: float | None = None) -> str:
        """One line for reports; ``counted_rise_w``: the rise the margin counts (default :attr:`rise_w`)."""
        counted = self.rise_w if counted_rise_w is None else counted_rise_w
        bound = ", the longest the fit allows: no curvature seen, an upper estimate" if self.tau_bounded else ""
        how = (f"extrapolated to the steady state ({self.steady_temperature_c:.1f} C, time constant "
               f"{self.tau_s:.0f} s{bound})" if self.extrapolated and self.tau_s is not None else
               "at the board's steady temperature" if self.extrapolated else
               "as seen at the soak's end (no board temperature read: a lower bound)")
        stopped = "; stopped over the budget" if self.stopped_over_budget else ""
        when = f" after {self.after_settings} settings" if self.after_settings else ""
        return (f"thermal soak of batch {self.batch_size}{when} for {self.duration_s:.0f} s: {self.cool_power_w:.2f} W "
                f"in the search's windows, {self.steady_power_w:.2f} W {how}; every setting not soaked itself must "
                f"hold the budget by {counted:.2f} W more than the sensor's accuracy{stopped}")


def _proven_w(soak: ThermalSoak) -> float:
    """The rise a soak stopped over the budget proved, W: up to the highest mean power of its windows, from its
    cool power (its steady mean power is at least that; the rest of :attr:`ThermalSoak.rise_w` is extrapolated
    from the few windows before the stop). The limit it crossed bounds the 1-s average, which runs above the
    mean by the step's ripple, so it proves less of the mean.

    A soak stopped in its first window has no window: what it proved is the stop itself, a 1-s average (with
    the guard band) at the limit, so a mean at least the limit less how far the setting's judged power read
    over its mean in the search's windows (:attr:`ThermalSoak.cool_excess_w`; the soak's 5-s windows take
    their maximum over more 1-s averages, so they read further over the mean, and this bound is the higher).
    Taken as the limit itself, such a stop governed every setting's margin: the stop's ripple and guard band
    were counted as rise. On the oracle benchmark (time, seed 0) a third soak, of a knife-edge setting that
    drew 10.25 W warm at a 10.4-W budget, started on the board the soak before had warmed and was stopped after
    4 s. Counted up to the limit, its 0.28 W (0.35 W from the reference temperature) ruled out the optimum,
    whose own rise was 0.17 W and whose margin was 0.41 W, for a pick 3.2% slower (Orin NX
    chartransformer). Where the excess is not known (a study stored before it was kept), the rise stands."""
    seen = [float(p) for p in soak.power_w if math.isfinite(float(p))]
    if not seen:
        if soak.limit_w is None or soak.cool_excess_w is None or not math.isfinite(soak.cool_excess_w):
            return soak.rise_w
        stop_w = float(soak.limit_w) - max(0.0, float(soak.cool_excess_w))
        return max(0.0, min(stop_w, soak.steady_power_w) - soak.cool_power_w)
    return max(0.0, min(max(seen), soak.steady_power_w) - soak.cool_power_w)


def _counted_w(soaks: Sequence[ThermalSoak]) -> list[tuple[float, float]]:
    """Each soak's rise as the margin counts it, W, and the cool power it rose from, W, both from the reference
    temperature (:func:`thermal_reference`), the coolest any soaked pick was measured at: a pick measured on a
    board an earlier soak warmed read high by its extra kelvin, and from the reference it rose by as much more.
    Once a soak ran to its end, a soak stopped over the budget counts what it proved (:func:`_proven_w`), not
    what it extrapolated from the windows before its stop."""
    ref = thermal_reference(soaks)
    complete = any(not s.stopped_over_budget for s in soaks)
    out = []
    for s in soaks:
        offset = ref.offset_w(s.cool_temperature_c) if ref is not None else 0.0
        rise = _stopped_rise_w(s) if s.stopped_over_budget and complete else s.rise_w
        out.append((rise + offset, s.cool_power_w - offset))
    return out


def _stopped_rise_w(soak: ThermalSoak) -> float:
    """The rise a soak stopped over the budget counts once another soak ran to its end: what it proved
    (:func:`_proven_w`), or its fit's extrapolation where that is more and the soak ran :data:`STOPPED_FIT_S` or
    more, so its fit had the windows to read the rise. What it proved is a
    lower bound, and carried per watt it let settings as hot as the stopped one through: on the pareto benchmark
    (seed 0, AGX Orin mobilenet at 33.3 W) a soak of the front's hottest point stopped after 186 s, its fit at
    2.56 W of rise (the truth about 3 W), counted 1.41 W; carried to its neighbours at 31.5-31.7 W, that certified
    three front points which drew 34.6-34.8 W warm. A soak stopped sooner counts what it proved."""
    proven = _proven_w(soak)
    if soak.duration_s >= STOPPED_FIT_S and soak.extrapolated and not soak.tau_bounded:
        return max(proven, soak.rise_w)
    return proven


def _relative(counted: tuple[float, float]) -> float:
    """A counted rise per watt of the power it rose from (0 where that power is not positive)."""
    rise_w, cool_w = counted
    return rise_w / cool_w if cool_w > 0.0 else 0.0


def governing(soaks: Sequence[ThermalSoak]) -> ThermalSoak | None:
    """The soak whose rise every setting's margin includes: the largest per watt as counted (None: no soak)."""
    if not soaks:
        return None
    counted = _counted_w(soaks)
    return soaks[max(range(len(soaks)), key=lambda i: _relative(counted[i]))]


def thermal_rise_w(soaks: Sequence[ThermalSoak], edge_w: float | None = None) -> float:
    """The thermal rise every setting's margin includes, W (0: no soak; module docs).

    The rise grows with the power a setting draws (its heat warms the board, the warmth raises the leakage), so
    a soak's rise is carried to other settings per watt: with ``edge_w`` (the limit less the sensor's
    accuracy, W), the rise of a setting that reaches ``edge_w`` once warm, ``rho x edge_w / (1 + rho)``, where
    ``rho`` is the largest rise per watt of cool power any soak measured as counted. A pick soaked below the
    edge so does not set too small a margin for the settings at it, nor a hotter one too large a margin. Without
    ``edge_w``, the largest rise as counted."""
    counted = _counted_w(soaks)
    if not counted:
        return 0.0
    if edge_w is None:
        return max(rise for rise, _ in counted)
    rho = max(_relative(c) for c in counted)
    return rho * edge_w / (1.0 + rho) if edge_w > 0.0 else 0.0


def hottest_soaked_w(soaks: Sequence[ThermalSoak]) -> float | None:
    """The largest cool power a soak that ran to its end rose from, counted from the reference temperature
    (:func:`thermal_reference`), W (None: no soak ran to its end). A setting drawing more than that has its rise
    carried upward per watt, which understates it (module docs): the search soaks such a pick itself."""
    full = [cool for (_, cool), s in zip(_counted_w(soaks), soaks) if not s.stopped_over_budget]
    return max(full, default=None)


def _own(soaks: Sequence[ThermalSoak], candidate: Candidate) -> list[ThermalSoak]:
    """The soaks of ``candidate`` itself, oldest first."""
    return [s for s in soaks if s.batch_size == candidate.batch_size and s.setting == candidate.knobs]


def soaked_rise_w(soaks: Sequence[ThermalSoak], candidate: Candidate) -> float | None:
    """The rise ``candidate``'s own soak measured, W, counted from the reference temperature (the last soak
    of it; None: never soaked). A soak stopped over the budget counts its full rise, whatever another soak
    proved; and the setting crossed the budget warm, so no margin certifies it (:func:`crossed_warm`)."""
    own = _own(soaks, candidate)
    if not own:
        return None
    ref = thermal_reference(soaks)
    return own[-1].rise_w + (ref.offset_w(own[-1].cool_temperature_c) if ref is not None else 0.0)


def crossed_warm(soaks: Sequence[ThermalSoak], candidate: Candidate) -> bool:
    """Whether ``candidate``'s own soak (its last) was stopped over the budget: warm, its 1-s average (with the
    guard band) reached the limit, so it holds the budget by no margin at all, let alone the sensor's accuracy,
    and no counted rise may certify it (:func:`required_margin_w`). Counted as a rise, the fit's could fall
    short of what the stop proved: on the pareto benchmark (seed 1, Orin NX chartransformer at 14.4 W) a soak
    stopped after 185 s fitted 0.44 W of rise (the truth 0.55 W); the setting's search windows read 0.64 W under
    the limit, their noise excess taken off, and it was certified by 0.006 W and offered on the front, drawing
    14.45 W warm."""
    own = _own(soaks, candidate)
    return bool(own) and own[-1].stopped_over_budget


def required_margin_w(soaks: Sequence[ThermalSoak], candidate: Candidate, accuracy_w: float,
                      edge_w: float | None = None) -> float:
    """The margin ``candidate`` must hold the limit by to be certified, W: the sensor's accuracy plus the rise
    :func:`rise_for_w` counts for it; infinite where its own soak crossed the budget (:func:`crossed_warm`)."""
    if crossed_warm(soaks, candidate):
        return math.inf
    return accuracy_w + rise_for_w(soaks, candidate, edge_w)


def rise_for_w(soaks: Sequence[ThermalSoak], candidate: Candidate, edge_w: float | None = None) -> float:
    """The thermal rise ``candidate``'s margin includes, W: its own soak's where it was soaked
    (:func:`soaked_rise_w`: measured on the setting itself, for minutes), else the rise carried to the budget's
    edge per watt (:func:`thermal_rise_w`). So a setting soaked itself is not ruled out by another setting's
    larger rise per watt, nor let through by a smaller one."""
    own = soaked_rise_w(soaks, candidate)
    return thermal_rise_w(soaks, edge_w) if own is None else own


def soak_reserve(n_trials: int) -> int:
    """Measured settings after which a search soaks its pick even before a stopping rule asks: all but
    :data:`SOAK_RESERVE` of ``n_trials``, or :data:`SOAK_AFTER` where that is fewer (at least one)."""
    return max(1, min(n_trials - round(SOAK_RESERVE * n_trials), SOAK_AFTER))


@dataclass(frozen=True)
class ThermalReference:
    """The board temperature every window's power is referred to, and how power follows it (module docs).

    Attributes:
        temperature_c: the coolest board temperature a soaked pick was measured at, degC.
        slope_w_per_k: power per kelvin of board temperature, W/K (> 0).
    """

    temperature_c: float
    slope_w_per_k: float

    def offset_w(self, temperature_c: float | None) -> float:
        """How much a window read at ``temperature_c`` reads above its power at the reference, W (0 where
        the window read no temperature)."""
        if temperature_c is None or not math.isfinite(float(temperature_c)):
            return 0.0
        return self.slope_w_per_k * (float(temperature_c) - self.temperature_c)


def thermal_reference(soaks: Sequence[ThermalSoak]) -> ThermalReference | None:
    """The reference of the study's soaks: the coolest board temperature a soaked pick was measured at, and
    the W/K slope of the last soak that ran to its end (of the last with a slope where none did); None where
    no soak read a temperature or power did not follow it."""
    temps = [s.cool_temperature_c for s in soaks if s.cool_temperature_c is not None]
    with_slope = [s for s in soaks if s.slope_w_per_k is not None and s.slope_w_per_k > 0.0]
    complete = [s for s in with_slope if not s.stopped_over_budget]
    if not temps or not with_slope:
        return None
    return ThermalReference(float(min(temps)), float((complete or with_slope)[-1].slope_w_per_k))


def soak(device: Device, workload: Any, batch_size: int, setting: Mapping[str, KnobValue], monitor: PowerMonitor,
         *, cool_power_w: float, limit_w: float | None, guard_sigma: float = 0.0, duration_s: float = SOAK_S,
         chunk_s: float = SOAK_CHUNK_S, real_steps: int | None = 0,
         cool_temperature_c: float | None = None, cool_excess_w: float | None = None) -> ThermalSoak:
    """Train at ``setting`` for ``duration_s`` device seconds in windows of ``chunk_s``, reading the board
    temperature after each, and fit the steady state (module docs). Each window is a
    :func:`~edgetune.search.trial.measure_setting` under ``limit_w``: one that crosses the budget ends the
    soak. The windows after the first continue the setting (``running_since_s``): the early stop reads its
    power over the last budget window, not over the first steps of each window. ``real_steps``: steps of each
    window that run the real training step on a virtual clock (the soak's figures are the device's; the step
    itself was run by the search's windows already).
    ``cool_power_w``, ``cool_temperature_c``: the setting's mean power and board temperature over the search's
    windows (what the rise is counted from); ``cool_excess_w``: how far its judged power read over its mean
    there (:attr:`ThermalSoak.cool_excess_w`)."""
    protocol = MeasurementProtocol(warmup_steps=0, measure_steps=1, measure_s=chunk_s, real_steps=real_steps)
    start = device.clock.now()
    out = ThermalSoak(batch_size=int(batch_size), setting=dict(setting), cool_power_w=float(cool_power_w),
                      duration_s=0.0, cool_temperature_c=cool_temperature_c, limit_w=limit_w,
                      cool_excess_w=cool_excess_w)
    above_mean_w: list[float] = []  # how far each window's judged power (1-s maximum, guard band) read over its mean
    running_since_s: float | None = None  # when the setting was applied: every later window continues it
    while device.clock.now() - start < duration_s:
        t_window = device.clock.now()
        m = measure_setting(device, workload, batch_size, setting, protocol, monitor, limit_w=limit_w,
                            guard_sigma=guard_sigma, running_since_s=running_since_s)
        if running_since_s is None:
            running_since_s = t_window + m.settle_s
        out.over_budget_s += m.over_budget_s
        if not m.ok:
            _log.warning("thermal soak stopped: %s", m.error)
            break
        if m.aborted_over_budget:
            # stopped as its average crossed the budget: its figures cover only the moment before the stop (often
            # part of one step, whose phases draw more or less than the step's mean), not a window, so they are
            # not fitted; what it proves is that the setting crosses the budget warm (below). Fitted, such a
            # stretch read 0.4-1.3 W above the windows before it at the same temperature, and the fit made it a
            # steep slope: 0.97 W of rise extrapolated where the pick's true rise was 0.22 W
            out.stopped_over_budget = True
            break
        out.t_s.append(device.clock.now() - start)
        out.power_w.append(float(m.mean_power_w))
        out.temperature_c.append(device.temperature_c)
        above_mean_w.append(m.judged_power_w(guard_sigma) - float(m.mean_power_w))
    out.duration_s = device.clock.now() - start
    if out.t_s:
        fit = fit_soak(out.t_s, out.power_w, out.temperature_c)
        out.steady_power_w = max(fit.steady_power_w, out.power_w[-1])
        out.steady_temperature_c, out.tau_s = fit.steady_temperature_c, fit.tau_s
        out.slope_w_per_k, out.extrapolated = fit.slope_w_per_k, fit.extrapolated
        out.tau_bounded = fit.tau_bounded
    if out.stopped_over_budget and limit_w is not None:
        floor_w = _stopped_floor_w(out, limit_w, above_mean_w, duration_s)
        out.steady_power_w = max(out.steady_power_w, floor_w) if out.t_s else floor_w
    return out


def _stopped_floor_w(stopped: ThermalSoak, limit_w: float, above_mean_w: Sequence[float], duration_s: float) -> float:
    """The least steady mean power a soak stopped over the budget proved, W.

    Its 1-s average (with the guard band) crossed ``limit_w``, which runs above the mean by the step's ripple, so
    the mean reached at least the limit less that ripple as the soak's windows read it (their median excess of
    judged over mean power). That is trusted only once the soak ran half of ``duration_s`` or more: then its fit
    had the windows to read the rise, and taken as the limit itself, the mean of a setting whose ripple alone
    crossed was counted up to 0.15 W high (a 0.37-W rise against the twin's 0.21 W, carried per watt to every
    setting). A soak stopped sooner keeps the limit: a five-window fit read 0.27 W of a 1.93-W rise, and its
    floor let a pick through at 1.1 W over the budget warm (orin-agx chartransformer 25.3 W)."""
    if not above_mean_w or stopped.duration_s < duration_s / 2.0:
        return float(limit_w)
    return float(limit_w) - max(0.0, float(np.median(above_mean_w)))
