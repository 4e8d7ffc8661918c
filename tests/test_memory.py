"""A batch size that ran out of device memory is never measured again, at any knobs (edgetune.search.memory)."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import optuna
import pytest

from edgetune.power import open_device
from edgetune.power.base import is_out_of_memory
from edgetune.power.knobs import Candidate
from edgetune.report import _no_baseline_why
from edgetune.search import records
from edgetune.search.baseline import Baseline
from edgetune.search.efficiency import DIRECTIONS
from edgetune.search.memory import OutOfMemory, known_out_of_memory
from edgetune.search.records import Role, TrialRecord
from edgetune.search.results import best_json, write_trials_csv
from edgetune.search.space import build_space
from edgetune.search.trial import MeasurementProtocol
from tests.test_search import search, tiny_workload

#: the tiny workload's batch sizes on the simulated Orin Nano: the two largest run out of memory (12 KB a sample)
BATCH_SIZES = (16, 32, 2**19, 2**20)
FITS = 32  # the largest that fits
QUICK = MeasurementProtocol(warmup_steps=1, measure_steps=5, measure_s=1.0)


@pytest.fixture(scope="module")
def workload():
    return tiny_workload()


def spy_steps(device) -> list[tuple[int, bool]]:
    """Every step ``device`` runs from now on: its batch size, and whether it ran out of memory."""
    steps: list[tuple[int, bool]] = []
    run = device.run_step

    def run_step(fn, batch_size, cost):
        try:
            out = run(fn, batch_size, cost)
        except Exception as exc:
            steps.append((batch_size, is_out_of_memory(exc)))
            raise
        steps.append((batch_size, False))
        return out

    device.run_step = run_step
    return steps


def assert_no_step_at_or_above_an_earlier_oom(steps: list[tuple[int, bool]], known_oom: int | None = None) -> None:
    smallest = known_oom
    for batch_size, oom in steps:
        assert smallest is None or batch_size < smallest, (batch_size, smallest)
        if oom:
            smallest = batch_size


def space_of(device, batch_sizes=BATCH_SIZES):
    return build_space(device, FITS, batch_sizes, ["gpu_freq", "emc_freq"])


def assert_recorded_as_known(recs: list[TrialRecord]) -> list[TrialRecord]:
    """Each trial told out of memory without a measurement names a measured one at a batch size no larger."""
    by_number = {r.number: r for r in recs}
    known = [r for r in recs if r.oom_of is not None]
    for r in known:
        source = by_number[r.oom_of]
        assert source.measured and source.oom and source.candidate.batch_size <= r.candidate.batch_size
        assert r.error == (f"out of memory: batch size {source.candidate.batch_size} ran out of memory at trial "
                           f"{source.number}; not measured")
        assert not r.measured and r.measurement is None and r.state == "FAIL" and r.oom
    return known


def test_a_batch_size_that_ran_out_of_memory_is_not_run_again_at_other_knobs(workload, tmp_path):
    device = open_device("sim:orin-nano", compute=False)
    steps = spy_steps(device)
    s = search(device, workload, space_of(device), None, sampler="random", n_trials=12, patience=0,
               protocol=QUICK)
    result = s.run()
    assert_no_step_at_or_above_an_earlier_oom(steps)
    recs = s.records()
    known = assert_recorded_as_known(recs)
    assert known  # the random sampler proposed such batch sizes: told, not measured
    # out of memory at most once per batch size, each smaller than the one before
    oom_batches = [r.candidate.batch_size for r in sorted(result.measured, key=lambda r: r.number) if r.oom]
    assert oom_batches and oom_batches == sorted(set(oom_batches), reverse=True)
    # not measured settings: n_trials counts measured ones, best.json and trials.csv leave them out
    assert len(result.settings) == 12 and len(recs) > 12 + len(known) - 1
    doc = best_json(result)
    assert doc["study"]["settings_measured"] == 12 == doc["study"]["trials_measured"] - sum(
        r.role == Role.CONFIRM for r in result.measured)
    rows = list(csv.DictReader(write_trials_csv(result, tmp_path / "trials.csv").open()))
    assert {int(row["trial"]) for row in rows} == {r.number for r in result.measured}


def test_a_resumed_study_or_another_worker_knows_what_ran_out_of_memory(workload):
    storage = optuna.storages.InMemoryStorage()
    device = open_device("sim:orin-nano", compute=False)
    space = space_of(device)
    study = optuna.create_study(storage=storage, study_name="test", directions=DIRECTIONS["time"])
    big = Candidate(2**19, tuple((name, values[-1]) for name, values in space.knobs))
    records.enqueue(study, space, big)  # the first trial: out of memory
    first = search(device, workload, space, None, sampler="random", n_trials=2, patience=0, confirm_settings=0,
                   storage=storage, protocol=QUICK)
    first.run()
    assert [r.number for r in first.records() if r.oom] == [0]
    # the storage is all a resume, or another worker of the fleet, has
    other = open_device("sim:orin-nano", compute=False, seed=1)
    steps = spy_steps(other)
    again = search(other, workload, space_of(other), None, sampler="random", n_trials=10, patience=0, seed=1,
                   storage=storage, protocol=QUICK)
    result = again.run()
    assert_no_step_at_or_above_an_earlier_oom(steps, known_oom=2**19)
    known = assert_recorded_as_known(again.records())
    assert known and {r.oom_of for r in known} == {0}
    assert len(result.settings) == 10


def test_a_sampler_that_keeps_proposing_them_neither_loops_nor_counts_them(workload):
    """A space of four settings, two at a batch size that runs out of memory: one of them is measured, the
    other told; the random sampler's repeats stall, and the search ends with nothing left to measure."""
    device = open_device("sim:orin-nano", compute=False)
    steps = spy_steps(device)
    space = build_space(device, 16, [16, 2**20], ["gpu_freq"], {"gpu_freq": ["min", "max"]})
    s = search(device, workload, space, None, sampler="random", n_trials=10, patience=0, protocol=QUICK)
    result = s.run()
    assert result.stop_reason == "every setting of the space measured or known to run out of memory"
    assert sum(oom for _, oom in steps) == 1
    assert len(result.settings) == 3 and len(assert_recorded_as_known(s.records())) >= 1


def test_the_guided_sampler_proposes_no_batch_size_at_or_above_one_that_ran_out(workload):
    """The guided sampler reads the out of memory from the trial's observation: its space-filling start
    (which went to batch 2**20 twice after the first trial's 2**19 ran out) proposes no such setting, so the
    search has nothing to tell (the model's proposals: test_acquisition's certain failures)."""
    storage = optuna.storages.InMemoryStorage()
    device = open_device("sim:orin-nano", compute=False)
    steps = spy_steps(device)
    space = space_of(device)
    study = optuna.create_study(storage=storage, study_name="test", directions=DIRECTIONS["time"])
    records.enqueue(study, space, Candidate(2**19, tuple((name, values[0]) for name, values in space.knobs)))
    s = search(device, workload, space, None, sampler="guided", n_trials=8, storage=storage, protocol=QUICK)
    s.run()
    assert_no_step_at_or_above_an_earlier_oom(steps)
    assert [r.number for r in s.records() if r.oom] == [0]  # proposed none: nothing told


def test_a_search_whose_smallest_batch_size_ran_out_stops_at_once(workload):
    device = open_device("sim:orin-nano", compute=False)
    steps = spy_steps(device)
    s = search(device, workload, space_of(device, (2**19, 2**20)), None, sampler="random", n_trials=10,
               patience=0, protocol=QUICK)
    result = s.run()
    assert result.stop_reason == f"every batch size runs out of memory: the smallest, {2**19}, ran out at trial 0"
    assert [oom for _, oom in steps] == [True] and len(s.records()) == 1 and result.best is None


def test_a_baseline_probe_known_to_run_out_of_memory_ends_the_baseline_unmeasured():
    """Not measured, it still settles the baseline as a probe that ran out would: no baseline (asked again,
    the probe would be told again, and the search would queue it for ever)."""
    device = open_device("sim:orin-nano", compute=False)
    baseline = Baseline(space_of(device), 2**19, device.settings())
    probe = baseline.state([]).next_probe
    told = TrialRecord(5, "FAIL", probe, Role.BASELINE, False, None, None, False,
                       "out of memory: batch size 2**19 ran out of memory at trial 2; not measured", oom_of=2)
    state = baseline.state([told])
    assert state.done and state.found is None
    assert _no_baseline_why(SimpleNamespace(records=[told])) == f"none (its batch size {2**19} out of memory)"


def test_only_knobs_the_registry_knows_to_keep_memory_may_differ():
    oom = OutOfMemory(3, Candidate(64, (("gpu_freq", 510), ("seq_len", 128))))
    assert oom.covers(Candidate(64, (("gpu_freq", 306), ("seq_len", 128))))
    assert oom.covers(Candidate(128, (("gpu_freq", 918), ("seq_len", 128))))
    assert not oom.covers(Candidate(32, (("gpu_freq", 510), ("seq_len", 128))))
    assert not oom.covers(Candidate(128, (("gpu_freq", 510), ("seq_len", 256))))  # a knob with no role
    measured = TrialRecord(3, "FAIL", oom.candidate, Role.SEARCH, True, {"ok": False, "oom": True}, None, False)
    smaller = TrialRecord(7, "FAIL", Candidate(32, oom.candidate.setting), Role.SEARCH, True,
                          {"ok": False, "oom": True}, None, False)
    assert known_out_of_memory([measured, smaller], Candidate(64, oom.candidate.setting)) == OutOfMemory(
        7, smaller.candidate)  # the smallest batch size that ran out is the one named
