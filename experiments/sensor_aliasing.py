"""How far a one-second power window strays from the truth when the sensor samples a step at its own rate.

A Jetson's INA3221 updates every 6.6 ms and the monitor reads it at 100 Hz; a small model's training step
takes 6-10 ms. Sampled at a rate close to the step rate, the readings drift slowly through the step's phases
(forward low, backward high) instead of landing on them at random, so a window's mean depends on the phase
its readings happened to hold, and the readings' own spread, from which every window's standard error is
computed (``Measurement.power_se_w``), does not see it.

On each simulated Jetson (the twin: the same sensor rate, step phases and jitter as the search measures) this
measures every power mode's GPU clocks at the mode's memory and CPU caps, for each workload's batch sizes,
with ``--windows`` one-second windows each (``measure_setting``, as the search measures), and compares each
window's mean with the twin's true mean power at that moment (``Twin.expected``: ground truth, for scoring
only). Per setting it reports the step time, the time the readings take to sweep every phase of the step
(:func:`edgetune.search.window.phase_sweep_s`), the spread of the windows' errors and the mean standard error
the windows reported; the ratio of the two is 1 for an honest standard error.

Run: ``python experiments/sensor_aliasing.py`` (about a minute on one core). Output kept in
``experiments/results/sensor_aliasing.txt``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgetune.power import PowerMonitor, open_device
from edgetune.search.trial import MeasurementProtocol, measure_setting
from edgetune.search.window import SWEEP_WINDOW_CAP_S, phase_sweep_s
from edgetune.workloads import load_workload

PROFILES = ("orin-agx", "orin-nx", "orin-nano", "xavier-nx")
WORKLOADS = ("cnn", "mobilenet", "chartransformer")
BATCH_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
#: a standard error is called honest here when the windows' errors spread by at most this multiple of it
HONEST_RATIO = 2.0


def settings_of(device) -> list[dict]:
    """Every power mode's GPU clocks (at most its cap) with memory, CPU clock and cores at the mode's caps."""
    grid = device.backend.knob_grid()
    out = []
    for mode, caps in device.backend.mode_caps().items():
        cap = dict(caps.max_values)
        for gpu_hz in grid["gpu_freq"]:
            if gpu_hz <= cap["gpu_freq"]:
                out.append({**cap, "gpu_freq": gpu_hz, "power_mode": mode})
    return out


@dataclass(frozen=True)
class SettingErrors:
    """One setting's windows: their errors against the twin's true power and the standard error they reported."""

    step_s: float
    sweep_s: float  # phase_sweep_s of the step: the readings' time to see every phase of it
    error_sd_w: float  # spread of the windows' mean power about the truth
    se_w: float  # the mean standard error the windows reported
    mean_error_w: float
    power_mode: str
    gpu_hz: int
    batch_size: int
    span_s: float  # the span the windows' power was judged over (Measurement.judged_span_s)

    @property
    def swept(self) -> bool:
        """Whether the readings sweep the step's phases within one 1-s window."""
        return self.sweep_s <= 1.0

    @property
    def extended(self) -> bool:
        """Whether the windows' power was judged over a span longer than 1 s (one sweep of the step's phases by
        its measured, jittered mean time; the window ran that long)."""
        return self.span_s > 1.0 + 1e-9

    @property
    def ratio(self) -> float:
        """The errors' spread in reported standard errors (1 for an honest one)."""
        return self.error_sd_w / self.se_w


def measure(profile: str, workload_name: str, windows: int, seed: int) -> list[SettingErrors]:
    """Each setting of :func:`settings_of` at each batch size that fits, measured ``windows`` times."""
    workload = load_workload(workload_name, seed=seed)
    device = open_device(f"sim:{profile}", compute=False, seed=seed)
    protocol = MeasurementProtocol(warmup_steps=1, measure_steps=1, measure_s=1.0, real_steps=0)
    rows = []
    with device.restoring(), PowerMonitor(device.sensor, device.clock, rate_hz=100.0) as monitor:
        for setting in settings_of(device):
            for b in BATCH_SIZES:
                expected = device.backend.expected(workload.cost, b, setting)
                if not expected.fits or expected.step_time_s > 0.5:  # a window holds two steps at least
                    continue
                errors, ses, spans = [], [], []
                for _ in range(windows):
                    m = measure_setting(device, workload, b, setting, protocol, monitor)
                    if not m.ok:
                        break
                    truth_w = device.backend.expected(workload.cost, b, setting).power_w  # at this temperature
                    errors.append(m.mean_power_w - truth_w)
                    ses.append(m.power_se_w)
                    spans.append(m.judged_span_s)
                if len(errors) < windows:
                    continue
                sweep_s = phase_sweep_s(expected.step_time_s, monitor.rate_hz, device.sensor.update_period_s)
                rows.append(SettingErrors(expected.step_time_s, sweep_s, float(np.std(errors, ddof=1)),
                                          statistics.fmean(ses), statistics.fmean(errors), setting["power_mode"],
                                          setting["gpu_freq"], b, statistics.fmean(spans)))
    return rows


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}" if xs else "-"


def _pct(xs: list[float], q: float) -> str:
    return f"{np.percentile(xs, q):.2f}" if xs else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=8, help="one-second windows per setting (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    t0, c0 = time.perf_counter(), time.process_time()
    print(f"sensor aliasing: {args.windows} one-second windows per setting, seed {args.seed}; monitor 100 Hz")
    print(f"{'board':<10} {'workload':<16} {'settings':>8} {'swept in 1 s':>12} {'ratio, swept':>13} "
          f"{'ratio, not swept':>16} {'worst sd W':>10} {'its step ms':>11} {'its sweep s':>11}")
    swept_ratios, slow_ratios, total, dishonest, dishonest_slow = [], [], 0, 0, 0
    extended_ratios, never_ratios = [], []  # not swept in 1 s: the windows extended to one sweep, and the rest
    spans = []  # the mean judged span of the settings whose windows were extended
    for profile in PROFILES:
        for name in WORKLOADS:
            rows = [r for r in measure(profile, name, args.windows, args.seed) if r.se_w > 0]
            if not rows:
                continue
            total += len(rows)
            swept = [r.ratio for r in rows if r.swept]
            slow = [r.ratio for r in rows if not r.swept]
            dishonest += sum(1 for r in rows if r.swept and r.ratio > HONEST_RATIO)
            dishonest_slow += sum(1 for r in rows if not r.swept and r.ratio > HONEST_RATIO)
            swept_ratios += swept
            extended_ratios += [r.ratio for r in rows if not r.swept and r.extended]
            never_ratios += [r.ratio for r in rows if not r.swept and not r.extended]
            spans += [r.span_s for r in rows if r.extended]
            slow_ratios += slow
            worst = max(rows, key=lambda r: r.error_sd_w)
            print(f"{profile:<10} {name:<16} {len(rows):>8} {len(swept):>12} {_median(swept):>13} {_median(slow):>16} "
                  f"{worst.error_sd_w:>10.3f} {worst.step_s * 1e3:>11.2f} {worst.sweep_s:>11.2f}")
    print(f"windows' error sd / their reported standard error (median, 90th percentile): readings that sweep the "
          f"step's phases within the window {_pct(swept_ratios, 50)}, {_pct(swept_ratios, 90)} ({len(swept_ratios)} "
          f"settings); readings that do not {_pct(slow_ratios, 50)}, {_pct(slow_ratios, 90)} ({len(slow_ratios)} settings)")
    print(f"of those not swept in 1 s: judged over one sweep, the window extended to it, {_pct(extended_ratios, 50)}, "
          f"{_pct(extended_ratios, 90)} ({len(extended_ratios)} settings; mean spans {min(spans, default=1.0):.2f}-"
          f"{max(spans, default=1.0):.2f} s, at most {SWEEP_WINDOW_CAP_S:g} s); judged over 1 s (their measured steps sweep in it) {_pct(never_ratios, 50)}, "
          f"{_pct(never_ratios, 90)} ({len(never_ratios)} settings)")
    print(f"timing: {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU")
    print(f"settings: {total} | not swept in 1 s: {len(slow_ratios)} | standard error under half the error's "
          f"spread: {dishonest} of {len(swept_ratios)} swept, {dishonest_slow} of {len(slow_ratios)} not swept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
