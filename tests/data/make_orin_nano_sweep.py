"""Write orin_nano_clock_sweep.csv: a sparse, repeated clock sweep without batch sizes, measured on the twin.

What a user brings from a board: one job (the built-in ``cnn`` at its default batch size, not recorded in
the table) measured at 60 random settings of the Orin Nano's four clock knobs (online cores, CPU, GPU and
EMC clocks: 60 of the 1,710 settings the twin offers), in three passes over the settings (each pass a
repeat), under the names a tegrastats-style log uses (``gpu_freq_hz``, ``emc_freq_hz``, ``cpu_freq_khz``,
``cpu_cores``). Each measurement: apply the setting, one warm-up step, then a window of at least 5 steps
and 2 s on the twin's virtual clock, read by a power monitor at the twin's INA3221 update period.

Run from the repository root (the CSV is committed; rerun only if the twin changes):

    PYTHONPATH=. python tests/data/make_orin_nano_sweep.py
"""

from __future__ import annotations

import csv
import os

import numpy as np

from edgetune.power import PowerMonitor
from edgetune.power.sim import Twin
from edgetune.workloads import load_workload

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "orin_nano_clock_sweep.csv")
SETTINGS = 60  # a sweep of about the size issue 11 measured on a real Jetson (58 rows)
PASSES = 3  # repeats of every setting
WINDOW_S = 2.0  # the search's default window length
KNOBS = ("cpu_cores", "cpu_freq", "gpu_freq", "emc_freq")
COLUMNS = {"cpu_cores": "cpu_cores", "cpu_freq": "cpu_freq_khz", "gpu_freq": "gpu_freq_hz",
           "emc_freq": "emc_freq_hz"}


def main() -> None:
    workload = load_workload("cnn", seed=0)
    twin = Twin("orin-nano", seed=0, compute=False)
    device = twin.device()
    grid = twin.knob_grid()
    rng = np.random.default_rng(11)
    every = [(c, f, g, e) for c in grid["cpu_cores"] for f in grid["cpu_freq"] for g in grid["gpu_freq"]
             for e in grid["emc_freq"]]
    picked = [every[i] for i in sorted(rng.choice(len(every), SETTINGS, replace=False))]
    b = workload.default_batch_size
    rows = []
    with PowerMonitor(device.sensor, device.clock, rate_hz=1.0 / twin.sensor.update_period_s) as monitor:
        for _ in range(PASSES):
            for values in picked:
                device.apply(dict(zip(KNOBS, values)))
                device.run_step(lambda: None, b, workload.cost)
                monitor.begin_window("w")
                t0, steps = device.clock.now(), 0
                while steps < 5 or device.clock.now() - t0 < WINDOW_S:
                    device.run_step(lambda: None, b, workload.cost)
                    steps += 1
                stats = monitor.end_window("w")
                rows.append([*values, stats.duration_s / steps, stats.mean_w, stats.peak_w])
    device.restore()
    with open(OUT, "w", newline="") as f:
        f.write(f"# Orin Nano clock sweep measured on edgetune's twin (sim:orin-nano, seed 0): {workload.name} at "
                f"its default batch size, {SETTINGS} settings x {PASSES} passes; made by "
                f"tests/data/make_orin_nano_sweep.py\n")
        f.write(f"# edgetune: sensor_period_s={twin.sensor.update_period_s:g}\n")
        w = csv.writer(f, lineterminator="\n")
        w.writerow([COLUMNS[k] for k in KNOBS] + ["step_time_s", "power_w", "peak_power_w"])
        for r in rows:
            w.writerow([int(v) for v in r[:4]] + [f"{v:.6g}" for v in r[4:]])
    print(f"wrote {OUT}: {len(rows)} rows")


if __name__ == "__main__":
    main()
