"""Online tuning: without a plan, try a few (batch size, GPU frequency) settings on the real training run,
then settle on the one that reaches the target fastest under the budget.

Every step of the exploration is a real training step of the user's loop: nothing is thrown away, the
model trains throughout. Each candidate runs ``steps_per_candidate`` steps (the first ``warmup_steps`` are
not measured: a batch-size change has its own first-step costs); its window of the power monitor gives the
measured step time and power, hardware in the loop.

Which candidates
    An initial design spreads over the space: the corners of (log batch size, GPU frequency) and its centre.
    Once three are measured, the predictors' :class:`~edgetune.predictors.HardwareModel` is fitted and
    predicts the whole grid; the next candidate is the best predicted one not yet measured whose predicted
    power (plus one standard deviation) stays under the budget. At most ``max_candidates`` are measured.

What "best" means
    Time to target = steps(b) x step time, with steps(b) = S_min (1 + B_noise / b) (McCandlish et al. 2018;
    S_min is the same for every setting, so it drops out). ``B_noise`` is measured on the real gradients:
    at each explored step an optimizer pre-step hook reads the squared norm of the gradient |G_b|^2 at that
    batch size (E|G_b|^2 = |G|^2 + tr(Sigma) / b); every pair of explored batch sizes gives McCandlish et
    al.'s two-point estimates of |G|^2 and tr(Sigma) (appendix A), averaged by the predictors'
    :class:`~edgetune.predictors.GradientNoiseScale`; B_noise = tr(Sigma) / |G|^2. The explored batch
    sizes come from different steps, so this is the noise scale of the exploration's stretch of training.
    A given ``b_noise`` overrides it.

Safety
    The budget guard stays on during the exploration. A candidate whose power trips the guard is recorded
    as over budget and left at once; a candidate whose batch does not fit in device memory is recorded as
    such. The settled setting is the best measured one that held the budget with the guard's margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from edgetune.power.base import KnobValue
from edgetune.runtime.guard import PRIMARY_KNOBS, Decision, LadderModel, frequency_prior, primary_steps

if TYPE_CHECKING:
    from edgetune.runtime.controller import Tuner

__all__ = ["Candidate", "Measurement", "OnlineTuner", "noise_scale_from_norms"]


@dataclass(frozen=True)
class Candidate:
    batch_size: int
    setting: tuple[tuple[str, KnobValue], ...]  # hashable knob -> value

    @property
    def knobs(self) -> dict[str, KnobValue]:
        return dict(self.setting)


@dataclass
class Measurement:
    """One explored candidate: what its window measured, or why it has none."""

    candidate: Candidate
    steps: int = 0
    step_time_s: float = math.nan
    power_w: float = math.nan
    peak_power_w: float = math.nan
    status: str = "ok"  # ok | over budget | out of memory

    def time_to_target(self, b_noise: float) -> float:
        """Relative time to target: step time x (1 + B_noise / b) (S_min drops out)."""
        return self.step_time_s * (1.0 + b_noise / self.candidate.batch_size)


def noise_scale_from_norms(norms: dict[int, list[float]]) -> tuple[float, float, float] | None:
    """(|G|^2, tr(Sigma), B_noise) from squared gradient norms per batch size; None if not estimable.

    Every pair of batch sizes b_small < b_big gives McCandlish et al.'s unbiased two-point estimates from the
    mean |G_b|^2 at each; :class:`~edgetune.predictors.GradientNoiseScale` averages them (its EMA with
    beta near 1 and bias correction is a plain mean over these few pairs) and takes the ratio. Needs at least
    two batch sizes, and positive averages.
    """
    from edgetune.predictors import GradientNoiseScale

    sizes = sorted(b for b, v in norms.items() if v)
    if len(sizes) < 2:
        return None
    means = {b: float(np.mean(norms[b])) for b in sizes}
    gns = GradientNoiseScale(beta=0.999)
    for i, small in enumerate(sizes):
        for big in sizes[i + 1:]:
            gns.update(means[small], means[big], small, big)
    if not math.isfinite(gns.noise_scale):
        return None
    return gns.grad_sq, gns.trace_cov, gns.noise_scale


def _grad_norm_sq(optimizer: torch.optim.Optimizer) -> float:
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not grads:
        return math.nan
    return float(sum(n.item() ** 2 for n in torch._foreach_norm(grads)))


@dataclass
class _Window:
    candidate: Candidate
    steps: int = 0
    open: bool = False
    first_t: float = math.nan  # end of the candidate's first step
    last_t: float = math.nan

    def step_time(self) -> float:
        return (self.last_t - self.first_t) / (self.steps - 1) if self.steps >= 2 else math.nan


class OnlineTuner:
    """Explores a bounded number of settings during the real run, then settles (see the module docs).

    Args:
        tuner: the controller (gives the device, the monitor, the budget and applies the moves).
        batch_sizes: candidate batch sizes (default: powers of two from a quarter to four times the start,
            at most a quarter of the dataset).
        steps_per_candidate: training steps per candidate (all of them train the model).
        warmup_steps: of those, the first ones not measured.
        max_candidates: most candidates measured.
        b_noise: the gradient noise scale in samples, instead of measuring it.
        margin: a candidate holds the budget when its mean power is this fraction under it (the guard's
            target margin).
    """

    def __init__(self, tuner: Tuner, *, batch_sizes: list[int] | None = None, steps_per_candidate: int = 20,
                 warmup_steps: int = 3, max_candidates: int = 6, b_noise: float | None = None,
                 margin: float | None = None) -> None:
        if steps_per_candidate <= warmup_steps:
            raise ValueError("steps_per_candidate must exceed warmup_steps")
        if max_candidates < 1:
            raise ValueError("max_candidates must be at least 1")
        self.tuner = tuner
        self.steps_per_candidate = steps_per_candidate
        self.warmup_steps = warmup_steps
        self.max_candidates = max_candidates
        self.fixed_b_noise = b_noise
        self.margin = tuner.guard_params.target_margin if margin is None else margin
        self._batch_sizes_arg = batch_sizes
        self.measurements: list[Measurement] = []
        self.norms: dict[int, list[float]] = {}
        self.model: Any = None
        self.chosen: Measurement | None = None
        self._window: _Window | None = None
        self._queue: list[Candidate] = []
        self._t_open = 0.0

    # -- the space ---------------------------------------------------------------------------------
    def _space(self) -> tuple[list[int], str | None, list[KnobValue]]:
        t = self.tuner
        start = t._requested_batch or 32
        if self._batch_sizes_arg:
            sizes = sorted({int(b) for b in self._batch_sizes_arg})
        else:
            sizes = [2 ** k for k in range(16) if start / 4 <= 2 ** k <= start * 4]
            if t._dataset is not None:
                cap = max(1, len(t._dataset) // 4)
                sizes = [b for b in sizes if b <= cap] or [min(start, cap)]
        knobs = t.device.writable_knobs
        primary = next((k for k in PRIMARY_KNOBS if k in knobs and knobs[k].numeric), None)
        values = list(knobs[primary].values) if primary else []
        return sizes, primary, values

    def _candidate(self, b: int, value: KnobValue | None) -> Candidate:
        base = {k: v for k, v in self.tuner.setting.items() if k in self.tuner.device.writable_knobs}
        if self.primary is not None and value is not None:
            base[self.primary] = value
        return Candidate(b, tuple(sorted(base.items())))

    def start(self) -> tuple[int, dict[str, KnobValue]]:
        """The first candidate's batch size and setting (the controller applies them)."""
        self.sizes, self.primary, self.values = self._space()
        lo, hi = self.sizes[0], self.sizes[-1]
        mid = self.sizes[len(self.sizes) // 2]
        vals = self.values or [None]
        f_lo, f_hi, f_mid = vals[0], vals[-1], vals[len(vals) // 2]
        design = [(mid, f_mid), (hi, f_lo), (lo, f_hi), (hi, f_hi), (lo, f_lo)]
        seen: set[Candidate] = set()
        for b, f in design:
            c = self._candidate(b, f)
            if c not in seen:
                seen.add(c)
                self._queue.append(c)
        first = self._queue.pop(0)
        self._window = _Window(first)
        self.tuner._event(f"online tuning: batch sizes {self.sizes}"
                          + (f", {self.primary} {len(self.values)} values" if self.primary else "")
                          + f"; up to {self.max_candidates} candidates x {self.steps_per_candidate} steps")
        return first.batch_size, first.knobs

    @property
    def exploring(self) -> bool:
        return self._window is not None

    @property
    def b_noise(self) -> float | None:
        if self.fixed_b_noise is not None:
            return self.fixed_b_noise
        est = noise_scale_from_norms(self.norms)
        return est[2] if est else None

    # -- hooks from the controller ----------------------------------------------------------------
    def before_step(self) -> None:
        """Optimizer pre-step hook: the gradient of this step at this batch size (exploration only)."""
        w = self._window
        if w is not None and self.tuner.batch_size == w.candidate.batch_size:
            g = _grad_norm_sq(self.tuner.optimizer)
            if math.isfinite(g):
                self.norms.setdefault(w.candidate.batch_size, []).append(g)

    def after_step(self, t: float) -> None:
        w = self._window
        if w is None:
            return
        if self.tuner.batch_size != w.candidate.batch_size:
            return  # the new batch size reaches the loop with the next batch
        w.steps += 1
        if w.steps == 1:
            w.first_t = t
        w.last_t = t
        mon = self.tuner.monitor
        if w.steps == self.warmup_steps:
            mon.begin_window("online")
            w.open = True
            self._t_open = t
        elif w.steps >= self.steps_per_candidate and w.open:
            stats = mon.end_window("online")
            w.open = False
            n = w.steps - self.warmup_steps
            m = Measurement(w.candidate, n, (t - self._t_open) / n, stats.mean_w, stats.peak_w)
            if stats.mean_w > self.tuner.budget_w * (1 - self.margin / 2):
                m.status = "over budget"
            self._record(m)

    def on_guard_move(self, decision: Decision) -> None:
        """The guard tripped during a candidate: it does not hold the budget. What it drew until then and
        its step time still inform the hardware model."""
        w = self._window
        if w is not None and decision.reason.startswith("trip"):
            if w.open:
                self.tuner.monitor.end_window("online")
                w.open = False
            power = self.tuner.tap.average(self.tuner.guard_params.fast_window_s)
            self._record(Measurement(w.candidate, w.steps, w.step_time(), power, power, status="over budget"))

    def on_out_of_memory(self) -> None:
        w = self._window
        if w is None:
            raise RuntimeError("out of memory outside exploration")
        if w.open:
            self.tuner.monitor.end_window("online")
            w.open = False
        self._record(Measurement(w.candidate, 0, status="out of memory"))

    def on_epoch_end(self, epoch: int) -> None:
        return None

    # -- choosing ---------------------------------------------------------------------------------
    def _record(self, m: Measurement) -> None:
        self.measurements.append(m)
        figures = f"{m.step_time_s * 1e3:.2f} ms/step, {m.power_w:.2f} W"
        what = figures if m.status == "ok" else (f"{m.status} ({figures})" if self._usable(m) else m.status)
        self.tuner._event(f"online: candidate batch size {m.candidate.batch_size}, {self._describe(m.candidate)}: "
                          f"{what}")
        nxt = self._next_candidate()
        if nxt is None:
            self._settle()
        else:
            self._window = _Window(nxt)
            self._move(nxt, "online tuning: next candidate")

    def _describe(self, c: Candidate) -> str:
        if self.primary is None:
            return "knobs as found"
        from edgetune.power.base import format_value

        return f"{self.primary}={format_value(c.knobs[self.primary], self.tuner.device.knobs[self.primary].unit)}"

    def _ok(self) -> list[Measurement]:
        return [m for m in self.measurements if m.status == "ok"]

    @staticmethod
    def _usable(m: Measurement) -> bool:
        return math.isfinite(m.step_time_s) and math.isfinite(m.power_w) and m.step_time_s > 0

    def _fit(self) -> None:
        from edgetune.predictors import HardwareModel

        ok = [m for m in self.measurements if self._usable(m)]
        names = [self.primary] if self.primary else []
        X = [{**{k: float(m.candidate.knobs[k]) for k in names}, "batch_size": m.candidate.batch_size} for m in ok]
        if len(ok) < 3 or len({tuple(x.values()) for x in X}) < 3:
            self.model = None
            return
        self.model = HardwareModel(random_state=self.tuner.seed).fit(
            X, [m.step_time_s for m in ok], [m.power_w for m in ok], [m.peak_power_w for m in ok])

    def _next_candidate(self) -> Candidate | None:
        done = {m.candidate for m in self.measurements}
        if len(self.measurements) >= self.max_candidates:
            return None
        # over budget or out of memory rules out what is surely worse: power rises with the clock and with
        # the batch size (the GPU is busier), memory with the batch size
        blocked = set()
        for m in self.measurements:
            if m.status == "over budget":
                v = m.candidate.knobs.get(self.primary) if self.primary else None
                blocked |= {c for c in self._grid() if c.batch_size >= m.candidate.batch_size
                            and (v is None or c.knobs[self.primary] >= v)}
            elif m.status == "out of memory":
                blocked |= {c for c in self._grid() if c.batch_size >= m.candidate.batch_size}
        self._fit()
        if self.model is None:
            while self._queue:
                c = self._queue.pop(0)
                if c not in done and c not in blocked:
                    return c
            # too few measurements to fit (the design was mostly over budget): the fastest-looking of the
            # rest, highest clock first, then the largest batch
            rest = [c for c in self._grid() if c not in done and c not in blocked]
            key = (lambda c: (-float(c.knobs[self.primary]), -c.batch_size)) if self.primary else \
                (lambda c: -c.batch_size)
            return min(rest, key=key) if rest else None
        grid = [c for c in self._grid() if c not in done and c not in blocked]
        if not grid:
            return None
        pred = self._predict(grid)
        b_noise = self.b_noise if self.b_noise is not None else float(np.median(self.sizes))
        budget = self.tuner.budget_w * (1 - self.margin)
        best_known = min((m.time_to_target(b_noise) for m in self._ok()
                          if m.power_w <= budget), default=math.inf)
        scored = []
        for c, t, p, ps in zip(grid, pred.step_time_s, pred.power_w, pred.power_std):
            if p + ps <= budget:
                scored.append((t * (1 + b_noise / c.batch_size), c))
        scored.sort(key=lambda x: x[0])
        if not scored or scored[0][0] >= best_known:
            return None  # nothing predicted to beat the best measured: stop exploring
        return scored[0][1]

    def _grid(self) -> list[Candidate]:
        return [self._candidate(b, v) for b in self.sizes for v in (self.values or [None])]

    def _predict(self, cands: list[Candidate]):
        names = [self.primary] if self.primary else []
        X = [{**{k: float(c.knobs[k]) for k in names}, "batch_size": c.batch_size} for c in cands]
        return self.model.predict(X)

    def _settle(self) -> None:
        self._window = None
        b_noise = self.b_noise if self.b_noise is not None else float(np.median(self.sizes))
        budget = self.tuner.budget_w * (1 - self.margin)
        ok = [m for m in self._ok() if m.power_w <= budget]
        source = "measured" if self.fixed_b_noise is None and noise_scale_from_norms(self.norms) else "assumed"
        if not ok:
            # nothing held the budget: the lowest-power measurement, and the guard takes it from there
            candidates = [m for m in self._ok()] or None
            if candidates is None:
                self.tuner._event("online: no candidate could be measured; keeping the current setting")
                return
            best = min(candidates, key=lambda m: m.power_w)
        else:
            best = min(ok, key=lambda m: m.time_to_target(b_noise))
        self.chosen = best
        if self.tuner.loader is not None and self.b_noise is not None:
            self.tuner.loader.b_noise = self.b_noise
        self.tuner._event(f"online: settled on batch size {best.candidate.batch_size}, {self._describe(best.candidate)} "
                          f"after {len(self.measurements)} candidates (B_noise {b_noise:.0f} samples, {source})")
        self._move(best.candidate, "online tuning: settled")

    def _move(self, c: Candidate, why: str) -> None:
        t = self.tuner
        if c.batch_size != t.batch_size:
            t.set_batch_size(c.batch_size, at="step")
        t.apply_setting(c.knobs, f"{why}: batch size {c.batch_size}")

    def ladder_prior(self, ladder: list[dict[str, KnobValue]]) -> LadderModel | None:
        """Rung powers predicted by the fitted hardware model at the batch size in force, if fitted."""
        if self.model is None or self.primary is None:
            return None
        b = self.tuner.batch_size
        try:
            pred = self.model.predict([{self.primary: float(r[self.primary]), "batch_size": b} for r in ladder])
        except (ValueError, KeyError):
            return None
        dev = self.tuner.device
        idle = dev.idle_power_w or 0.0
        # rungs below the primary knob's lowest value (CPU, EMC clocks down) keep the frequency prior's
        # shape, anchored at the model's prediction for the lowest primary rung
        shape = frequency_prior(ladder, dev.knobs, idle, float(np.max(pred.power_w))).prior_w
        lowest = ladder[0][self.primary]
        first_main = max(i for i, r in enumerate(ladder) if r[self.primary] == lowest)
        prior = np.array(pred.power_w, dtype=float)
        for i in range(first_main):
            prior[i] = idle + (prior[first_main] - idle) * (shape[i] - idle) / max(shape[first_main] - idle, 1e-9)
        prior = np.maximum.accumulate(np.maximum(prior, idle + 1e-3))  # rungs ascend in power
        return LadderModel(tuple(float(p) for p in prior), idle_w=float(idle), primary_steps=primary_steps(ladder))
