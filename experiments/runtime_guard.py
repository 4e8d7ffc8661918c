"""The runtime budget guard on the simulated twin, and the controller's overhead on real wall time.

Part 1 - scenarios on ``sim:orin-nano`` (the calibrated twin; every figure here is a simulation). A plain
PyTorch training loop runs through ``with edgetune.tune(...)`` while the script injects disturbances and
budget changes on the twin's clock: another process adding power (``twin.set_power_offset``), a thermal
throttle capping the GPU clock (``twin.set_throttle``), the budget lowered and raised through the API and
through a watched file (+ SIGUSR1). Beside it the same loop runs bare (the plan's fixed setting, no
controller) under the same script. The plan is what the twin's ground truth says is fastest under 10 W for
the ``cnn`` workload's step cost (the oracle a search approximates). The loop trains a small MLP on the CPU
(real steps, real loss); the twin times and powers each step with the cnn workload's measured cost, so a
40-s scenario runs in a few seconds of wall time.

Per event: the settle time is how long after the event the 1-s moving average of board power was last
above the budget (0 if never). "Over after settle" is the time over budget more than 2 s after an event.

Part 2 - overhead on real wall time. The twin's virtual clock says nothing about wall time, so the overhead
is measured on a device on the real clock: the cnn workload's real training step on this CPU, a 100 Hz
monitor thread reading a cheap sensor (a software power model from the process's CPU time) and the guard's
20 Hz thread with one writable knob (the model's power limit), i.e. all the controller's per-step and
background work. Bare and wrapped runs alternate; the medians of their step times are compared. The
threads' CPU time is read from /proc (Linux) per thread.

    python experiments/runtime_guard.py [--quick]

Last line: ``worst settle: X s | time over budget after settle: Y s | overhead: Z% | knobs restored: yes|no``
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

import edgetune
from edgetune.power import Device, Knob, PowerMonitor, PowerReading, RealClock, open_device
from edgetune.runtime import Plan
from edgetune.runtime.accounting import Accounting, SampleTap
from edgetune.workloads import load_workload

SETTLE_S = 2.0
BUDGET_W = 10.0


# ---------------------------------------------------------------------------------------------- part 1


def oracle_plan(twin, cost, budget_w: float) -> Plan:
    """Fastest samples/s whose true power is 5% under the budget, over batch size x GPU clock."""
    best = None
    for b in (16, 32, 64, 128):
        for f in twin.knob_grid()["gpu_freq"]:
            e = twin.expected(cost, b, {"gpu_freq": f})
            if e.power_w <= 0.95 * budget_w and (best is None or e.samples_per_s > best[0]):
                best = (e.samples_per_s, b, f)
    assert best is not None
    return Plan(best[1], {"gpu_freq": best[2]}, budget_w, "sim:orin-nano")


def make_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), data


def scenarios(budget_file: Path) -> dict[str, tuple[float, list]]:
    """name -> (duration s, [(t, description, action(twin, tuner_or_None, budget_setter))])."""

    def offset(w):
        return lambda twin, tuner, budget: twin.set_power_offset(w)

    def throttle(hz):
        return lambda twin, tuner, budget: twin.set_throttle(hz)

    def api_budget(w):
        return lambda twin, tuner, budget: budget(w)

    def file_budget(w, usr1=False):
        def act(twin, tuner, budget):
            budget_file.write_text(f"{w}\n")
            if tuner is None:  # the bare loop has no one reading the file (or the signal): only the judging
                budget(w)
            elif usr1:
                os.kill(os.getpid(), signal.SIGUSR1)
        return act

    return {
        "power offset +2.5 W": (30.0, [(5.0, "+2.5 W load", offset(2.5)), (17.0, "load gone", offset(0.0))]),
        # the budget rises while the clock is capped: a guard without anti-windup would climb to the top
        # rung (it draws nothing more while capped) and overshoot when the cap lifts
        "throttle, budget up": (30.0, [(5.0, "GPU capped 306 MHz", throttle(306e6)), (8.0, "set_budget(12)", api_budget(12.0)),
                                       (17.0, "cap lifted", throttle(None))]),
        "budget via API": (30.0, [(5.0, "set_budget(7)", api_budget(7.0)), (17.0, "set_budget(10)", api_budget(10.0))]),
        "budget via file": (30.0, [(5.0, "file: 7 W", file_budget(7.0)), (17.0, "file: 12 W + SIGUSR1", file_budget(12.0, True))]),
        "combined": (36.0, [(4.0, "+2 W load", offset(2.0)), (10.0, "GPU capped 408 MHz", throttle(408e6)),
                            (14.0, "set_budget(9)", api_budget(9.0)), (20.0, "cap lifted", throttle(None)),
                            (24.0, "load gone", offset(0.0)), (28.0, "set_budget(10)", api_budget(10.0))]),
    }


@dataclass
class Run:
    name: str
    settle_s: float
    over_s: float
    over_after_settle_s: float
    max_avg_w: float
    samples_per_s: float
    energy_per_sample_j: float
    moves: int
    restored: bool


def _score(name, acc: Accounting, events, duration, moves, restored) -> Run:
    t, avg, budget = np.array(acc.trace_t), np.array(acc.trace_avg), np.array(acc.trace_budget)
    over = avg > budget + 1e-9
    dt = np.diff(t, append=t[-1])
    starts = [0.0] + [e[0] for e in events]
    bounds = list(itertools.pairwise([*starts, duration + 1.0]))
    settle = 0.0
    for t0, t1 in bounds:
        sel = over & (t >= t0) & (t < t1)
        if sel.any():
            settle = max(settle, float(t[sel].max() - t0))
    since = np.full(t.shape, np.inf)
    for t0 in starts:
        since = np.where(t >= t0, np.minimum(since, t - t0), since)
    time_s, energy, samples = acc.totals()
    return Run(name, settle, float(dt[over].sum()), float(dt[over & (since > SETTLE_S)].sum()),
               float(avg.max()), samples / time_s, energy / samples, moves, restored)


def run_loop(tuner_or_none, dev, model, opt, loader, duration, script, budget_setter, bare_step=None):
    twin = dev.backend
    clock = dev.clock
    pending = list(script)

    def fire():
        while pending and pending[0][0] <= clock.now():
            pending.pop(0)[2](twin, tuner_or_none, budget_setter)

    tid = clock.add_ticker(0.01, fire)
    try:
        while clock.now() < duration:
            for x, y in loader():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if bare_step is not None:
                    bare_step(len(x))  # the bare loop: the device runs the step, nothing else
                if clock.now() >= duration:
                    break
    finally:
        clock.remove_ticker(tid)


def run_tuned(name, duration, script, plan, budget_file) -> Run:
    model, opt, data = make_loop()
    dev = open_device("sim:orin-nano", seed=0)
    budget_file.write_text(f"{plan.budget_w}\n")
    with edgetune.tune(model, opt, dataset=data, device=dev, plan=plan, cost=COST, budget_file=budget_file,
                       keep_trace=True, print_summary=False) as tuner:
        run_loop(tuner, dev, model, opt, lambda: tuner.loader, duration, script, tuner.set_budget)
    moves = sum(1 for _, text in tuner.events if text.startswith("guard"))
    return _score("edgetune", tuner.accounting, script, duration, moves, bool(tuner.summary.knobs_restored))


def run_bare(name, duration, script, plan) -> Run:
    model, opt, data = make_loop()
    dev = open_device("sim:orin-nano", seed=0)
    before = dev.settings()
    budgets = [(0.0, plan.budget_w)]

    def budget_at(t):
        return [w for t0, w in budgets if t0 <= t][-1]

    def set_budget(w):
        budgets.append((dev.clock.now(), w))

    g = torch.Generator().manual_seed(0)
    tap = SampleTap(dev.sensor)
    with dev.restoring(), PowerMonitor(tap, dev.clock) as mon:
        dev.apply(plan.setting)
        acc = Accounting(tap, budget_at, keep_trace=True)
        acc.start(dev.clock.now())
        tid = dev.clock.add_ticker(0.05, acc.update)

        def loader():
            order = torch.randperm(len(data), generator=g)
            for i in range(0, len(data), plan.batch_size):
                yield data[order[i:i + plan.batch_size]]

        def bare_step(batch_size):
            dev.run_step(lambda: None, batch_size, COST)
            acc.mark_step(dev.clock.now(), batch_size, "plan", 0)

        run_loop(None, dev, model, opt, loader, duration, script, set_budget, bare_step)
        dev.clock.remove_ticker(tid)
        mon.sample()
        acc.update()
        acc.finish()
    return _score("bare loop", acc, script, duration, 0, dev.settings() == before)


def part1(quick: bool, only: str = "") -> list[Run]:
    runs: list[Run] = []
    twin = open_device("sim:orin-nano", seed=0).backend
    plan = oracle_plan(twin, COST, BUDGET_W)
    truth = twin.expected(COST, plan.batch_size, plan.setting)
    print(f"sim:orin-nano (simulated twin), cnn step cost; plan: batch size {plan.batch_size}, "
          f"gpu_freq {plan.setting['gpu_freq'] / 1e6:g} MHz ({truth.power_w:.2f} W true, {truth.samples_per_s:.0f} "
          f"samples/s) for a {BUDGET_W:g} W budget")
    with tempfile.TemporaryDirectory() as tmp:
        budget_file = Path(tmp) / "budget"
        items = list(scenarios(budget_file).items())
        if quick:
            items = items[:2]
        if only:
            items = [(name, v) for name, v in items if only in name]
        for name, (duration, script) in items:
            print(f"\nscenario: {name} ({duration:g} s): " + "; ".join(f"{t:g} s {d}" for t, d, _ in script))
            print(f"{'run':<10} {'settle s':>8} {'over s':>7} {'over after settle s':>20} {'max 1s W':>9} "
                  f"{'samples/s':>10} {'mJ/sample':>10} {'guard moves':>12} {'restored':>9}")
            tuned = run_tuned(name, duration, script, plan, budget_file)
            bare = run_bare(name, duration, script, plan)
            for r in (tuned, bare):
                print(f"{r.name:<10} {r.settle_s:>8.2f} {r.over_s:>7.2f} {r.over_after_settle_s:>20.2f} "
                      f"{r.max_avg_w:>9.2f} {r.samples_per_s:>10.0f} {1e3 * r.energy_per_sample_j:>10.3f} "
                      f"{r.moves:>12} {'yes' if r.restored else 'no':>9}")
            runs.append(tuned)
    return runs


# ---------------------------------------------------------------------------------------------- part 2


class CpuTimeSensor:
    """A cheap software power model: idle + dynamic power from this process's CPU use since the last read,
    capped by the power limit knob. Not a measurement: it stands in for a cheap sysfs read."""

    rails = ("VDD_IN",)
    total_label = "VDD_IN (software model)"
    update_period_s = 0.01

    def __init__(self) -> None:
        self.limit_w = 10.0
        self._last = (time.monotonic(), time.process_time())

    def read(self) -> PowerReading:
        now, cpu = time.monotonic(), time.process_time()
        t0, c0 = self._last
        self._last = (now, cpu)
        util = (cpu - c0) / (now - t0) if now > t0 else 0.0
        return PowerReading(now, min(self.limit_w, 2.0 + 8.0 * util), {"VDD_IN": 0.0})

    def energy_j(self):
        return None


def wall_device() -> Device:
    sensor = CpuTimeSensor()

    def write(v):
        sensor.limit_w = float(v)

    limits = [3.0 + 0.5 * k for k in range(15)]  # 3 .. 10 W
    knob = Knob("power_limit", "W", limits, read=lambda: sensor.limit_w, write=write)
    return Device(name="cpu-wall", description="this CPU, real clock, software power model", simulated=True,
                  knobs={"power_limit": knob}, sensor=sensor, clock=RealClock(),
                  run_step=lambda fn, b, cost: fn(), idle_power=lambda: 2.0, max_power_w=10.0)


def thread_cpu_s(native_id: int | None) -> float:
    """CPU seconds one thread of this process has run (Linux /proc schedstat, nanoseconds)."""
    if native_id is None:
        return math.nan
    try:
        return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return math.nan


def part2(quick: bool) -> tuple[float, float, float, bool]:
    torch.manual_seed(0)
    w = load_workload("cnn", seed=0)
    x, y = w.make_batch(32)
    steps = 15 if quick else 30
    rounds = 2 if quick else 8

    def one_step():
        w.optimizer.zero_grad()
        w.loss_fn(w.model(x), y).backward()
        w.optimizer.step()

    for _ in range(5):
        one_step()  # warm up the allocator and kernels

    bare_times, wrapped_times, mon_cpu, guard_cpu, wall, hook_s, ratios = [], [], [], [], [], [], []
    restored = True
    for _ in range(rounds):
        for _ in range(steps):
            t = time.perf_counter()
            one_step()
            bare_times.append(time.perf_counter() - t)
        bare_round = statistics.median(bare_times[-steps:])
        dev = wall_device()
        with edgetune.tune(w.model, w.optimizer, batch_size=32, budget_w=5.0, device=dev, online=False, cost=w.cost,
                           monitor_rate_hz=100.0, print_summary=False) as tuner:
            # instrumentation of this benchmark only: time the controller's work at each step boundary
            on_step = tuner._on_step

            def timed_on_step(on_step=on_step):
                t = time.perf_counter()
                on_step()
                hook_s.append(time.perf_counter() - t)

            tuner._on_step = timed_on_step
            mon_id = tuner.monitor._thread.native_id
            guard_id = tuner._ticker.thread.native_id
            c_mon, c_guard, t0 = thread_cpu_s(mon_id), thread_cpu_s(guard_id), time.perf_counter()
            for _ in range(steps):
                t = time.perf_counter()
                one_step()
                wrapped_times.append(time.perf_counter() - t)
            elapsed = time.perf_counter() - t0
            mon_cpu.append(thread_cpu_s(mon_id) - c_mon)
            guard_cpu.append(thread_cpu_s(guard_id) - c_guard)
            wall.append(elapsed)
            ratios.append(statistics.median(wrapped_times[-steps:]) / bare_round)
        restored = restored and bool(tuner.summary.knobs_restored)
        rate = tuner.monitor.total_samples / max(1e-9, dev.clock.now() - tuner.accounting.steps[0].start_s) \
            if tuner.accounting.steps else math.nan
    bare, wrapped = statistics.median(bare_times), statistics.median(wrapped_times)
    # each wrapped round against the bare round just before it: slow drifts of the machine's load cancel
    overhead = 100.0 * (statistics.median(ratios) - 1.0)
    mon_pct = 100.0 * sum(mon_cpu) / sum(wall)
    guard_pct = 100.0 * sum(guard_cpu) / sum(wall)
    hook_us = 1e6 * statistics.median(hook_s)
    # the controller's CPU work per step if it all ran serially on the training core (an upper bound)
    serial_pct = 100.0 * (hook_us * 1e-6 + (mon_pct + guard_pct) / 100.0 * bare) / bare
    print("\noverhead on real wall time: cnn workload, batch 32, this CPU "
          f"({torch.get_num_threads()} torch thread(s)); {rounds} alternating rounds x {steps} steps")
    print(f"{'loop':<28} {'median step ms':>15} {'mean step ms':>13}")
    print(f"{'bare':<28} {1e3 * bare:>15.2f} {1e3 * statistics.mean(bare_times):>13.2f}")
    print(f"{'with edgetune.tune (100 Hz)':<28} {1e3 * wrapped:>15.2f} {1e3 * statistics.mean(wrapped_times):>13.2f}")
    print(f"monitor thread CPU: {mon_pct:.2f}% of one core (sampling at {rate:.0f} Hz); "
          f"guard thread CPU: {guard_pct:.2f}% of one core (20 Hz)")
    print(f"step boundary work (hook, device, accounting mark): {hook_us:.0f} us median; all controller work "
          f"serialised on the training core would be {serial_pct:.2f}% of a step")
    print(f"paired overhead per round: {', '.join(f'{100 * (r - 1):+.1f}%' for r in ratios)} "
          f"(machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    moves = sum(1 for _, text in tuner.events if text.startswith("guard"))
    print(f"guard moves in the last round: {moves} (5 W budget on the software power model)")
    return overhead, mon_pct, guard_pct, restored


COST = None


def main() -> int:
    global COST
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two scenarios and a shorter overhead run")
    ap.add_argument("--only", default="", help="run only the scenarios whose name contains this text")
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core for training, the other for the monitor and everything else
    COST = load_workload("cnn", seed=0).cost
    runs = part1(args.quick, args.only)
    overhead, _, _, restored_wall = part2(args.quick)
    worst = max(r.settle_s for r in runs)
    after = sum(r.over_after_settle_s for r in runs)
    restored = all(r.restored for r in runs) and restored_wall
    print(f"worst settle: {worst:.2f} s | time over budget after settle: {after:.2f} s | overhead: {overhead:.2f}% | "
          f"knobs restored: {'yes' if restored else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
