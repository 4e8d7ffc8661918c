"""How well does the thermal soak read the power a setting draws once the board is warm?

The search soaks its pick (``edgetune/search/thermal.py``): it trains at it for ``SOAK_S`` device seconds in 5-s
windows, reads the board temperature after each, and extrapolates the steady state from a first-order fit.
Here each simulated module trains the built-in CNN at batch 32 and a mid GPU clock, the board starting
``dk`` kelvin under that setting's steady temperature (a board the search's windows left warm: 0.25-1 K; one
near idle: 2.5-5 K), three seeds each, soaked for ``SOAK_S`` and for half of it. The soak sees only what a
board gives: noisy power windows and the thermal zone's steps (1/32 K on Orin, 1/2 K on Xavier). It is scored
with the twin's truth, which it never sees: the rise the fit reads over the setting's power on the cool board
(``Twin.expected`` at the start), against the rise to the warm board's (``Twin.steady_state``). A ratio over 1
costs the search settings it could have certified (a larger margin), under 1 risks the budget.

What this does not test: the twin's board temperature is itself first order (one time constant, the law the fit
assumes), so the study measures how the fit reads that law through noisy windows and a thermal zone's steps, not
whether a real board follows it. A real heatsink has a faster die-to-case stage beside the minutes-long one; its
readings would bend earlier and the fit would read a shorter time constant.

    python experiments/soak_fit.py [--seeds 3]

Ends with ``at SOAK_S s: rise read A-Bx the truth (rises of 0.02 W or more), worst error E W, mean M W, N of
K fits at the time-constant bound | at SOAK_S/2 s: ...``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgetune.power import PowerMonitor, open_device
from edgetune.search.thermal import SOAK_S, soak
from edgetune.workloads import load_workload

MODULES = ("orin-agx", "orin-nx", "orin-nano", "xavier-nx")
#: how far under the setting's steady temperature the board starts, K
BELOW_K = (0.25, 1.0, 2.5, 5.0)
BATCH = 32
#: the summary's ratios count rises of at least this much, W (a ratio of a few milliwatts says little)
MIN_RISE_W = 0.02


def one(module: str, below_k: float, duration_s: float, seed: int, workload) -> tuple[float, float, bool, float]:
    """(fitted rise / true rise, fitted - true steady power in W, fit at its time-constant bound, true rise
    in W)."""
    device = open_device(f"sim:{module}", compute=False, seed=seed)
    twin = device.backend
    clocks = sorted(device.knobs["gpu_freq"].values)
    setting = {"gpu_freq": clocks[len(clocks) // 2]}
    warm = twin.steady_state(workload.cost, BATCH, setting)
    twin.set_temperature(warm.temperature_c - below_k)
    cool_w = twin.expected(workload.cost, BATCH, setting).power_w  # scoring only: the soak is handed it to
    # count its rise from, as the search hands it the setting's measured windows
    with device.restoring(), PowerMonitor(device.sensor, device.clock) as monitor:
        s = soak(device, workload, BATCH, setting, monitor, cool_power_w=cool_w, limit_w=None,
                 duration_s=duration_s)
    true_rise = warm.power_w - cool_w
    return s.rise_w / true_rise, s.steady_power_w - warm.power_w, s.tau_bounded, true_rise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    workload = load_workload("cnn")
    durations = (SOAK_S, SOAK_S / 2)
    summary: dict[float, list[tuple[float, float, bool, float]]] = {d: [] for d in durations}
    print(f"{'module':10s} {'below K':>7s} {'true rise W':>11s} "
          + " ".join(f"{f'{d:.0f} s: rise x truth (min-max)':>30s} {'worst mW':>8s} {'bound':>5s}" for d in durations))
    for module in MODULES:
        for below_k in BELOW_K:
            cells = []
            for d in durations:
                runs = [one(module, below_k, d, seed, workload) for seed in range(args.seeds)]
                summary[d].extend(runs)
                ratios = [r[0] for r in runs]
                true_rise_w = statistics.median(r[3] for r in runs)
                worst_mw = 1000.0 * max(abs(r[1]) for r in runs)
                cells.append(f"{statistics.median(ratios):>17.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
                             f"{worst_mw:>8.1f} {sum(r[2] for r in runs):>5d}")
            print(f"{module:10s} {below_k:>7.2f} {true_rise_w:>11.3f} " + " ".join(cells), flush=True)
    parts = []
    for d in durations:
        runs = summary[d]
        ratios = [r[0] for r in runs if r[3] >= MIN_RISE_W]
        parts.append(f"at {d:.0f} s: rise read {min(ratios):.2f}-{max(ratios):.2f}x the truth (rises of "
                     f"{MIN_RISE_W} W or more), worst error {max(abs(r[1]) for r in runs):.3f} W, mean "
                     f"{statistics.mean(abs(r[1]) for r in runs):.3f} W, {sum(r[2] for r in runs)} of {len(runs)} fits "
                     f"at the time-constant bound")
    print(" | ".join(parts))


if __name__ == "__main__":
    main()
