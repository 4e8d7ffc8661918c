"""Transfer between boards (``--prior``) and Zeus's cost objective (``--objective cost --eta``), on the twin.

Searches run on small spaces with ``compute=False`` (the twin times the steps); the ground truth for scoring
is ``Twin.expected``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import re

import numpy as np
import optuna
import pytest

from edgetune.cli import main
from edgetune.power import open_device
from edgetune.power.knobs import Candidate
from edgetune.search.efficiency import Outcome, TargetModel, ZeusCost, cost_max_power_w
from edgetune.search.prior import PriorError, load_prior, map_to_space, moved_count, snap
from edgetune.search.records import Observation
from edgetune.search.results import best_json
from edgetune.search.space import build_space
from edgetune.search.study import Search
from edgetune.search.trial import MeasurementProtocol
from edgetune.workloads import load_workload

optuna.logging.set_verbosity(optuna.logging.WARNING)

PROTOCOL = MeasurementProtocol(warmup_steps=1, real_steps=0)
BATCHES = (16, 32, 64, 128, 256)
KNOBS = ["gpu_freq", "emc_freq"]
#: a thermal soak of 30 s, not :data:`~edgetune.search.thermal.SOAK_S`'s 360: these tests are about what a prior
#: carries, not the soak, which still runs (its windows, fit and margin) at a twelfth of the simulated steps
SHORT_SOAK_S = 30.0


@pytest.fixture(scope="module")
def cnn():
    return load_workload("cnn")


def _search(profile, workload, budget_w, *, prior=(), storage_url=None, n_trials=30, knobs=KNOBS,
            return_search=False, **kw):
    """A search with the fixed S(b) law (B_noise 256) that _true_time_s scores by: these tests check the
    transfer mechanism against a law both sides share (experiments/transfer.py scores with measured steps).
    Returns the device, the space and the result (or the finished Search, with ``return_search``)."""
    device = open_device(f"sim:{profile}", compute=False)
    kw.setdefault("target", TargetModel())
    space = build_space(device, workload.default_batch_size, BATCHES, knobs)
    mapped = map_to_space(prior, space, device.settings()) if prior else ()
    s = Search(device, workload, space, budget_w=budget_w, protocol=PROTOCOL, n_trials=n_trials,
               storage_url=storage_url or "sqlite:///:memory:",
               storage=None if storage_url else optuna.storages.InMemoryStorage(), study_name="t", prior=mapped,
               **kw)
    result = s.run()
    return device, space, (s if return_search else result)


def _true_time_s(device, workload, cand: Candidate) -> tuple[float, float]:
    e = device.backend.expected(workload.cost, cand.batch_size, cand.knobs)
    return TargetModel().steps(cand.batch_size) * e.step_time_s, e.power_w


def _oracle_s(device, workload, space, budget_w) -> float:
    return min(t for c in space.grid() if (tp := _true_time_s(device, workload, c))[1] <= budget_w
               and device.backend.expected(workload.cost, c.batch_size, c.knobs).fits for t in [tp[0]])


# ---------------------------------------------------------------------------------------------- mapping


def test_snap_numbers_by_ratio_and_power_modes_by_watts():
    assert snap(612_000_000, (306_000_000, 624_750_000, 918_000_000)) == 624_750_000
    assert snap(100, (16, 32, 64, 128)) == 128
    assert snap("15W", ("10W", "15W", "25W", "MAXN")) == "15W"
    assert snap("7W", ("10W", "15W", "25W", "MAXN")) == "10W"
    assert snap("MAXN", ("7W", "15W")) == "15W"


def test_map_to_space_snaps_drops_and_fills_and_keeps_the_first_of_a_collision():
    device = open_device("sim:orin-nx", compute=False)
    space = build_space(device, 64, (32, 64), ["gpu_freq", "power_mode"])
    a = Observation(Candidate(60, (("gpu_freq", 624_750_000), ("cpu_cores", 6))), measured=True, ok=True,
                    step_time_s=0.1, max_avg_power_w=9.0)
    b = Observation(Candidate(64, (("gpu_freq", 612_000_000),)), measured=True, ok=True, step_time_s=0.2,
                    max_avg_power_w=8.0)
    mapped = map_to_space([a, b], space, {"power_mode": "25W"})
    assert len(mapped) == 1  # both land on b=64, 612 MHz: the first is kept
    assert mapped[0].candidate == Candidate(64, (("gpu_freq", 612_000_000), ("power_mode", "25W")))
    assert mapped[0].step_time_s == 0.1 and not mapped[0].feasible  # a prior never holds a budget here
    # both moved (a: batch 60 and 624.75 MHz snapped; both: power_mode filled in); one in the space stays
    c = Observation(Candidate(32, (("gpu_freq", 612_000_000), ("power_mode", "25W"))), measured=True, ok=True,
                    step_time_s=0.1, max_avg_power_w=9.0)
    assert moved_count([a, b, c], space) == 2 and moved_count([c], space) == 0


# ---------------------------------------------------------------------------------------------- loading


def test_load_prior_from_a_folder_a_url_and_by_name(tmp_path, cnn):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    _, _, res = _search("orin-nano", cnn, 10.0, storage_url=url, n_trials=8, soak_s=0.0)
    prior = load_prior(str(tmp_path))
    assert prior.study_name == "t" and prior.device == "sim:orin-nano"
    assert len(prior.observations) == sum(1 for r in res.settings if r.ok)  # one per setting
    assert load_prior(url).observations == prior.observations
    optuna.create_study(storage=url, study_name="other")
    with pytest.raises(PriorError, match=r"2 studies \(other, t\); name one: --prior '.*#STUDY_NAME'"):
        load_prior(str(tmp_path))
    assert load_prior(f"{url}#t").observations == prior.observations
    with pytest.raises(PriorError, match="no study 'nope'"):
        load_prior(f"{url}#nope")
    with pytest.raises(PriorError, match="has no measured setting"):
        load_prior(f"{url}#other")


def test_load_prior_closes_the_study_it_read(tmp_path, cnn):
    # its SQLite file, write-ahead log and shared memory stayed open until the garbage collector came by: a
    # search that reads a prior then measured for hours beside three open files of another study
    url = f"sqlite:///{tmp_path / 'study.db'}"
    _search("orin-nano", cnn, 10.0, storage_url=url, n_trials=4, soak_s=0.0)
    gc.collect()

    def open_files() -> list[str]:
        paths = (os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
        return [p for p in paths if p.startswith(str(tmp_path / "study.db"))]

    assert open_files() == []
    prior = load_prior(str(tmp_path))
    assert prior.observations and open_files() == []


def test_load_prior_names_a_missing_folder_or_file(tmp_path):
    with pytest.raises(PriorError, match="no study.db there"):
        load_prior(str(tmp_path / "missing"))
    with pytest.raises(PriorError, match="no such file"):
        load_prior(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()  # not created by the attempt
    with pytest.raises(PriorError, match="no such file"):
        load_prior(f"journal:{tmp_path / 'missing.log'}#x")
    assert not (tmp_path / "missing.log").exists()


def test_load_prior_names_a_file_that_holds_no_study_with_the_prior_s_way_out(tmp_path):
    # the storage's own line said to move the file away to start a new study: no fix for a prior
    other = tmp_path / "best.json"
    other.write_text('{\n "batch_size": 16\n}\n')
    way_out = "; give the output folder of an earlier search, its study.db or its journal file (journal:FILE)"
    for spec, problem in ((str(other), f"storage {other} is not an SQLite database (damaged or another file)"),
                          (f"sqlite:///{other}", f"storage {other} is not an SQLite database"),
                          (f"journal:{other}", f"storage journal:{other} is not an Optuna journal file (")):
        with pytest.raises(PriorError) as err:
            load_prior(spec)
        line = str(err.value)
        assert line.startswith(f"--prior {spec}: {problem}") and line.endswith(way_out), line
        assert "start a new study" not in line and "server" not in line
    assert other.read_text() == '{\n "batch_size": 16\n}\n'


def test_a_prior_that_holds_no_study_is_refused_with_the_prior_s_way_out_and_left_as_it_was(tmp_path):
    import sqlite3

    way_out = "; give the output folder of an earlier search, its study.db or its journal file (journal:FILE)"
    # another program's SQLite database: Optuna wrote its tables into it (and a write-ahead log) before it said
    # "holds no study; name one", which no name could help
    other = tmp_path / "inventory.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE parts (name TEXT)")
        db.execute("INSERT INTO parts VALUES ('heatsink')")
    db.close()
    before = other.read_bytes()
    for spec in (str(other), f"sqlite:///{other}"):
        with pytest.raises(PriorError) as err:
            load_prior(spec)
        assert str(err.value) == (f"--prior {spec}: {other} is an SQLite database without Optuna's tables (another "
                                  f"program's; nothing was written){way_out}")
    assert other.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["inventory.db"]
    # a journal file with no study in it: there is no name to give
    empty = tmp_path / "empty.log"
    empty.write_text("")
    with pytest.raises(PriorError) as err:
        load_prior(f"journal:{empty}")
    assert str(err.value) == f"--prior journal:{empty} holds no study{way_out}"


def test_load_prior_from_the_output_folder_of_a_search_given_storage_reads_the_study_its_best_json_names(
        tmp_path, capsys, monkeypatch):
    # a fleet's folder holds no study.db: its study is in the --storage its best.json names. "no study.db there;
    # give the output folder of an earlier search" was said of the very folder the README tells you to give
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "fleet"
    assert main(["search", "--device", "sim:orin-nano", "--workload", "cnn", "--knobs", "gpu_freq", "--batch-sizes",
                 "16,32", "--real-steps", "0", "--measure-s", "0.5", "--soak-s", "0", "--budget", "10", "-q",
                 "--n-trials", "3", "--storage", "journal:fleet.log", "--study-name", "f", "-o", str(out)]) == 0
    assert not (out / "study.db").exists()
    prior = load_prior(str(out))
    assert prior.study_name == "f" and len(prior.observations) == 3
    assert prior.observations == load_prior("journal:fleet.log").observations
    best = json.loads((out / "best.json").read_text())
    # a relative journal path is taken from where the search ran: best.json keeps its absolute path too, and from
    # elsewhere that is read ("no such file .../fleet/fleet.log from here" before)
    assert best["study"]["storage"] == "journal:fleet.log"
    assert best["study"]["storage_file"] == str(tmp_path / "fleet.log")
    monkeypatch.chdir(out)
    assert load_prior(str(out)).observations == prior.observations
    # a best.json without it (or the file moved): the line names the file to give
    del best["study"]["storage_file"]
    (out / "best.json").write_text(json.dumps(best))
    with pytest.raises(PriorError, match=r"its study 'f' is in journal:fleet.log, and there is no such file "
                                         r".*fleet/fleet.log from here; give that file's path from here: "
                                         r"--prior 'journal:PATH#f'"):
        load_prior(str(out))
    # a server's password is not in best.json: the line asks for the URL with it, naming the study
    best["study"]["storage"] = "postgresql://edgetune:***@127.0.0.1:5432/edgetune"
    (out / "best.json").write_text(json.dumps(best))
    with pytest.raises(PriorError, match=r"its study 'f' is in postgresql://edgetune:\*\*\*@127.0.0.1:5432/edgetune, "
                                         r"whose password best.json leaves out; give the URL with it: "
                                         r"--prior 'URL#f'"):
        load_prior(str(out))
    (out / "best.json").write_text("{not json")
    with pytest.raises(PriorError, match="no study.db there, and its best.json names no study edgetune can read"):
        load_prior(str(out))


# ---------------------------------------------------------------------------------------------- transfer


def test_warm_search_from_a_sibling_board_stays_near_the_oracle_and_counts_only_its_own_measurements(tmp_path, cnn):
    _search("orin-nano", cnn, 10.0, storage_url=f"sqlite:///{tmp_path / 'study.db'}", n_trials=20,
            soak_s=SHORT_SOAK_S)
    prior = load_prior(str(tmp_path))
    budget_w = 12.0
    device, space, warm = _search("orin-nx", cnn, budget_w, prior=prior.observations, soak_s=SHORT_SOAK_S)
    oracle = _oracle_s(device, cnn, space, budget_w)
    gap = _true_time_s(device, cnn, warm.best.candidate)[0] / oracle - 1.0
    assert gap <= 0.03
    # (measured settings, warm vs cold, are recorded by experiments/transfer.py: here 19 warm vs 18 cold)
    # the prior is no measurement: the pick is a trial measured on this board, whose measurement held
    assert warm.best in warm.settings and warm.best.feasible
    assert all(r.role in ("baseline", "search", "confirm") for r in warm.records)


def test_the_corrected_prior_is_sure_where_this_board_measured_and_keeps_its_doubt_far_from_there():
    """A sibling runs clocks the prior device never reached: there the prior model extrapolates, and its own
    doubt is large. This board's measurements there show the values, so near them that doubt is gone (the
    corrected prediction's std is the correction's own), while far from them it stays."""
    from edgetune.search.prior import PriorModel, Transfer

    def rows(freqs_hz):
        return [{"gpu_freq": float(f), "batch_size": 32} for f in freqs_hz]

    def board(f_hz, slower=1.0):  # step time (s) and power (W): compute-bound plus a fixed overhead
        return 0.004 * 6e8 / f_hz * slower + 0.001, (3.0 + 6.0 * f_hz / 6e8) * slower

    prior_f = np.linspace(2e8, 6e8, 8)  # the prior device tops out at 600 MHz
    t_prior, p_prior = zip(*[board(f) for f in prior_f])
    prior = PriorModel(rows(prior_f), np.zeros(8, dtype=int), list(t_prior), list(p_prior))
    here_f = [1.0e9, 1.1e9, 1.2e9]  # this board, measured only at clocks the prior never ran
    t_here, p_here = zip(*[board(f, slower=1.3) for f in here_f])
    scale = np.log([8.0, 1.2e9 / 2e8])
    transfer = Transfer(prior, ["batch_size", "gpu_freq"], scale, rows(here_f), rows(here_f),
                        np.zeros(3, dtype=int), list(t_here), list(p_here))

    def rel_std(f_hz):
        _, _, st0, sp0 = prior.predict(rows([f_hz]), np.zeros(1, dtype=int))
        t, p, t_std, p_std = transfer.predict(rows([f_hz]), rows([f_hz]), np.zeros(1, dtype=int))
        return (st0[0], sp0[0]), (t_std[0] / t[0], p_std[0] / p[0]), (t[0], p[0])

    for f, t_true, p_true in zip(here_f, t_here, p_here):
        (st0, sp0), (st, sp), (t, p) = rel_std(f)
        assert st0 > 0.15 and sp0 > 0.05  # the prior is unsure out there ...
        assert st < st0 / 3 and sp < sp0 / 3  # ... this board's measurement is not
        assert t == pytest.approx(t_true, rel=0.1) and p == pytest.approx(p_true, rel=0.05)
    near = rel_std(1.2e9)[1]
    far = rel_std(2.4e9)[1]  # twice the highest measured clock: still an extrapolation
    assert far[0] > 5 * near[0] and far[1] > 5 * near[1]


def test_warm_search_probes_the_modes_the_prior_never_saw_and_hands_off_to_this_boards_model(tmp_path, cnn):
    """Orin Nano's study knows its 7W and 15W modes (mapped by watts to Orin NX's 10W and 15W); Orin NX's 25W
    and MAXN get measurements of their own, and after PRIOR_HANDOFF of them the board's own model proposes,
    the prior's corrected model still predicting the modes it saw that this board has too few rows of."""
    from edgetune.search.samplers.guided import PRIOR_HANDOFF

    knobs = ["gpu_freq", "power_mode"]
    _search("orin-nano", cnn, 10.0, storage_url=f"sqlite:///{tmp_path / 'study.db'}", n_trials=16, knobs=knobs,
            soak_s=SHORT_SOAK_S)
    prior = load_prior(str(tmp_path))
    # the stopping rule may end a warm search before the handoff: here it never does (stop_gain 0), so the
    # search measures n_trials settings
    device, space, warm = _search("orin-nx", cnn, 14.0, prior=prior.observations, n_trials=PRIOR_HANDOFF + 2,
                                  knobs=knobs, return_search=True, guided_options={"stop_gain": 0.0},
                                  soak_s=SHORT_SOAK_S)
    mapped_modes = {o.candidate.knobs["power_mode"] for o in map_to_space(prior.observations, space, device.settings())}
    unseen = set(space.knob_values["power_mode"]) - mapped_modes
    assert unseen == {"25W", "MAXN"}
    own = [r for r in warm.result().measured if r.ok]
    for mode in unseen:
        assert sum(r.candidate.knobs["power_mode"] == mode for r in own) >= 4, mode  # min_group
    assert len({r.candidate for r in own}) >= PRIOR_HANDOFF
    sampler = warm.study.sampler
    fitted = sampler._fit(warm.study)
    assert fitted is not None and fitted.transfer is None  # this board's own model, not the prior's
    # ... for the modes that have one: a mode the prior measured and this board barely did keeps the prior's
    # model, corrected by every measurement of this board, where a cold search has its pooled model
    prior_modes = set(sampler.models._prior().models)
    unfitted = {int(g) for g in sampler.grid.live_groups()} - set(fitted.per_group)
    assert fitted.prior_groups == unfitted & prior_modes and fitted.prior_groups
    cand = sampler.grid.candidates()
    cand = cand[np.isin(sampler.grid.group(cand), sorted(fitted.prior_groups))][:50]
    grid = sampler.grid
    expected = fitted.prior_fill.predict(grid.rows(cand, grid.numeric_names), grid.rows(cand, grid.pooled_names),
                                         grid.group(cand))
    for got, want in zip(sampler.models.predict(fitted, cand), expected):
        np.testing.assert_allclose(got, want)


# ---------------------------------------------------------------------------------------------- cost


def test_zeus_cost_weights_energy_against_max_power_times_time():
    cost = ZeusCost(0.25, 20.0)
    assert cost.of(10.0, 100.0) == pytest.approx(0.25 * 100.0 + 0.75 * 20.0 * 10.0)
    assert cost.of_outcome(Outcome(10.0, 100.0, 1.0, 1.0)) == pytest.approx(175.0)
    with pytest.raises(ValueError, match=r"eta must be in \[0, 1\]"):
        ZeusCost(1.5, 20.0)
    assert cost_max_power_w(open_device("sim:orin-nano", compute=False)) == 15.0  # the twin: the module's max


def test_cost_search_picks_the_measured_setting_of_least_cost_and_best_json_reports_it(cnn):
    _, _, res = _search("orin-nano", cnn, 12.0, objective="cost", eta=0.5, n_trials=12, soak_s=SHORT_SOAK_S)
    cost = ZeusCost(0.5, 15.0)
    from edgetune.search.results import certified

    held = [r for r in res.settings if r.feasible and r.outcome]
    # the pick is made among the settings that hold the budget by the sensor's accuracy and the thermal rise
    safe = [r for r in held if certified(r, res.limit_w, res.required_margin_w)] or held
    assert res.best == min(safe, key=lambda r: cost.of_outcome(r.outcome))
    doc = best_json(res)
    assert doc["objective"] == "cost"
    assert doc["cost"]["eta"] == 0.5 and doc["cost"]["max_power_w"] == 15.0
    assert doc["cost"]["cost_j"] == pytest.approx(cost.of_outcome(res.best.outcome))
    assert math.isfinite(doc["speedup_over_baseline"])


def test_cli_cost_objective_and_eta_and_prior_errors(tmp_path, capsys):
    args = ["search", "--device", "sim:orin-nano", "--budget", "10", "--objective", "cost", "-o", str(tmp_path)]
    assert main([*args, "--eta", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "--eta must be <= 1, got 1.5" in err and len(err.strip().splitlines()) == 1
    assert main([*args, "--prior", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "no study.db there" in err and "Traceback" not in err


def test_a_prior_too_small_to_model_is_refused_before_anything_is_measured(tmp_path, capsys):
    common = ["search", "--workload", "cnn", "--knobs", "gpu_freq,power_mode", "--batch-sizes", "16,32",
              "--real-steps", "0", "--measure-s", "0.5", "-q"]
    assert main([*common, "--device", "sim:orin-nano", "--budget", "10", "--n-trials", "2", "--soak-s", "0",
                 "-o", str(tmp_path / "short")]) == 0
    capsys.readouterr()
    assert main([*common[:2], "mobilenet", *common[3:], "--device", "sim:orin-nx", "--budget", "12", "--prior",
                 str(tmp_path / "short"), "-o", str(tmp_path / "warm")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # what was carried over, said before the refusal (the orin-nano's clocks and modes are the orin-nx's too:
    # none moved, test_map_to_space_... counts moved ones), and that it is another model's step times
    assert re.search(r"prior: 2 settings of study '[^']+' \(sim:orin-nano, cnn, budget 10.0 W\); 2 settings of "
                     r"this space from them\n", err)
    assert ("note: the prior trained cnn, this search mobilenet: its step times and power are another model's, "
            "and this board's measurements correct them as they come") in err
    assert ("error: the prior has 2 measured settings in this space, at most 2 in one power mode; a warm start "
            "needs 4 in one: search the earlier board longer (--n-trials), or drop --prior") in err
    assert not (tmp_path / "warm" / "best.json").exists()


def test_cli_cost_search_with_a_prior_writes_the_cost(tmp_path, capsys):
    common = ["search", "--device", "sim:orin-nano", "--workload", "cnn", "--knobs", "gpu_freq",
              "--batch-sizes", "16,32,64", "--real-steps", "0", "--measure-s", "0.5", "--soak-s", str(SHORT_SOAK_S),
              "-q"]
    assert main([*common, "--budget", "10", "-o", str(tmp_path / "a"), "--n-trials", "6"]) == 0
    assert main([*common, "--budget", "9", "--objective", "cost", "--eta", "0.3", "--prior", str(tmp_path / "a"),
                 "-o", str(tmp_path / "b"), "--n-trials", "6"]) == 0
    assert "prior: " in capsys.readouterr().err
    doc = json.loads((tmp_path / "b" / "best.json").read_text())
    assert doc["objective"] == "cost" and doc["cost"]["eta"] == 0.3 and doc["cost"]["cost_j"] > 0


def test_a_prior_that_is_the_resumed_study_itself_or_that_the_sampler_ignores_is_refused(tmp_path, capsys):
    common = ["search", "--device", "sim:orin-nano", "--workload", "cnn", "--knobs", "gpu_freq", "--batch-sizes", "16",
              "--real-steps", "0", "--measure-s", "0.5", "--soak-s", "0", "--confirm", "0", "--budget", "10", "-q"]
    out = tmp_path / "a"
    assert main([*common, "-o", str(out), "--n-trials", "4"]) == 0
    kept = (out / "best.json").read_bytes()
    capsys.readouterr()
    # the same study as its own prior: its measurements would count twice, as this board's and as the prior's
    for prior in (str(out), f"sqlite:///{out / 'study.db'}#sim:orin-nano-cnn-10W-time"):
        assert main([*common, "-o", str(out), "--n-trials", "5", "--prior", prior]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the study this search resumes" in err[0] and "leave --prior out" in err[0], err
        assert (out / "best.json").read_bytes() == kept
    # Optuna's own samplers read no prior: the warm start would be announced and ignored
    assert main([*common, "-o", str(tmp_path / "b"), "--n-trials", "1", "--prior", str(out), "--sampler", "tpe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [("edgetune: error: --prior guides only the guided sampler (--sampler auto or guided); "
                    "--sampler tpe would ignore it: drop one of them")]
    assert not (tmp_path / "b").exists()
    # another study started from it is a warm start
    assert main([*common, "-o", str(tmp_path / "c"), "--n-trials", "5", "--prior", str(out)]) == 0
