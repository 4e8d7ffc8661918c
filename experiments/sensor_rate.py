"""How fast the hardware backends read power, and what rate the monitor holds, on fake board trees.

For each fake tree (five Jetsons in both INA3221 layouts, and an x86 RAPL package) this measures:

* the raw read rate of the backend's sensor (``sensor.read()`` back to back: open files + ``os.pread``),
* the rate the :class:`~edgetune.power.PowerMonitor` thread actually holds when asked for 100 and 500 Hz.

Files in a fake tree live in the page cache, like sysfs attributes, but a real INA3221 read also crosses
the I2C bus inside the kernel driver (the driver caches values between conversions), so real boards read
somewhat slower; the target is >= 100 Hz with a wide margin. Run: ``python experiments/sensor_rate.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes.jetson_tree import BOARDS, build_jetson
from fakes.rapl_tree import build_rapl

from edgetune.power import PowerMonitor, RealClock, jetson, rapl

TARGET_HZ = 100.0


def raw_rate(sensor, seconds: float = 0.5) -> float:
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sensor.read()
        n += 1
    return n / (time.perf_counter() - start)


def monitor_rate(sensor, hz: float, seconds: float = 1.0) -> tuple[float, int]:
    monitor = PowerMonitor(sensor, RealClock(), rate_hz=hz)
    with monitor:
        time.sleep(seconds)
    t, _ = monitor.records()
    held = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 else 0.0
    return held, monitor.dropped


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for board in sorted(BOARDS):
            fake = build_jetson(Path(tmp) / board, board)
            sensor = jetson.JetsonPowerSensor(jetson.find_rails(fake.root), fake.root, detect_s=0)
            rows.append((f"jetson {board}", len(sensor.rails), raw_rate(sensor), *monitor_rate(sensor, 100),
                         *monitor_rate(sensor, 500)))
            sensor.close()
        fake = build_rapl(Path(tmp) / "rapl", packages=2)
        sensor = rapl.RaplSensor(rapl.find_zones(fake.root))
        rows.append(("rapl 2 packages", len(sensor.rails), raw_rate(sensor), *monitor_rate(sensor, 100),
                     *monitor_rate(sensor, 500)))
        sensor.close()
    print(f"{'tree':<22} {'rails':>5} {'raw reads/s':>12} {'@100 Hz held':>13} {'dropped':>8} "
          f"{'@500 Hz held':>13} {'dropped':>8}")
    for name, n, raw, h100, d100, h500, d500 in rows:
        print(f"{name:<22} {n:>5} {raw:>12.0f} {h100:>13.1f} {d100:>8} {h500:>13.1f} {d500:>8}")
    slowest = min(rows, key=lambda r: r[2])
    ok = slowest[2] >= TARGET_HZ and all(r[3] >= 0.95 * 100 for r in rows)
    print(f"summary: slowest raw read {slowest[2]:.0f}/s ({slowest[0]}), {slowest[2] / TARGET_HZ:.0f}x the "
          f"{TARGET_HZ:.0f} Hz target; monitor held >= {min(r[3] for r in rows):.1f} Hz at 100 Hz and "
          f">= {min(r[5] for r in rows):.1f} Hz at 500 Hz; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
