"""`edgetune search --device trace:<table.csv>`: epochs to target from the table, gap to the table's oracle."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from edgetune.cli import main
from edgetune.power import open_device
from edgetune.search.oracle import TableTarget, prepare_trace
from edgetune.tables import load_table, save_table

ZEUS_TABLES = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23", "tables")
V100_SENTIMENT = os.path.join(ZEUS_TABLES, "v100_sentiment140_bert_base_uncased.csv")


@pytest.fixture
def small_table(tmp_path):
    """12 real rows of the Zeus V100 sentiment140 trace: batch 8, 32, 128 x power limit 100..250 W."""
    table = load_table(V100_SENTIMENT)
    keep = np.isin(table.batch_size, [8, 32, 128]) & np.isin(table.settings[:, 0], [100, 150, 200, 250])
    path = tmp_path / "small.csv"
    save_table(table.subset(np.flatnonzero(keep)), path)
    return str(path)


def test_time_to_target_is_the_tables_epochs_times_time_per_epoch(small_table):
    dev = open_device(f"trace:{small_table}")
    plan = prepare_trace(dev)
    table = dev.backend.table
    assert plan.batch_sizes == (8, 32, 128) and isinstance(plan.target, TableTarget)
    assert dev.backend.compute is False  # the table is the training run: the workload's step is not run
    step = table.step_time()
    for i in range(len(table)):
        b = int(table.batch_size[i])
        assert plan.target.steps(b) * step[i] == pytest.approx(table.time_to_target_s()[i], rel=1e-9)


def test_cli_search_reports_gap_to_the_table_oracle_and_holds_the_budget(small_table, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["search", "--device", f"trace:{small_table}", "--budget", "150", "--n-trials", "6",
               "--output", str(out), "--quiet", "--seed", "0"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "table oracle (time to target, 12 rows)" in text and "gap to the oracle" in text
    doc = json.loads((out / "best.json").read_text())
    gap = doc["oracle_gap"]
    table = load_table(small_table)
    ttt = table.time_to_target_s()
    ok = table.power_w <= 150.0
    oracle = ttt[ok].min()
    chosen = table.find({k: v["value"] for k, v in doc["setting"].items()}, doc["batch_size"])
    assert table.power_w[chosen] <= 150.0 and gap["chosen_holds_budget"] is True
    assert gap["oracle"]["time_to_target_s"] == pytest.approx(oracle)
    assert gap["gap_pct"] == pytest.approx(100.0 * (ttt[chosen] / oracle - 1.0))
    assert gap["gap_pct"] >= 0.0 and gap["measured_settings"] <= 6
    assert doc["target_model"]["source"] == "table"
    assert doc["predicted"]["time_to_target_s"] == pytest.approx(ttt[chosen], rel=1e-3)


def test_cli_batch_size_without_epochs_to_target_is_one_line_exit_2(small_table, tmp_path, capsys):
    rc = main(["search", "--device", f"trace:{small_table}", "--budget", "150", "--batch-sizes", "8,16",
               "--output", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "batch size 16 has no epochs to target in small.csv; use some of 8, 32, 128" in err[-1]


def test_power_cap_design_starts_at_the_cap_below_the_budget_across_batch_sizes(small_table):
    from edgetune.search.samplers import PowerCapSampler
    from edgetune.search.space import build_space

    dev = open_device(f"trace:{small_table}")
    plan = prepare_trace(dev)
    space = build_space(dev, 32, plan.batch_sizes)
    design = PowerCapSampler(space, budget_w=180.0, target=plan.target, seed=0).design()
    picked = [space.candidate(p) for p in design]
    assert [c.batch_size for c in picked] == [8, 32, 128]
    assert {c.knobs["power_limit"] for c in picked} == {150.0}  # the highest cap at or below 180 W
    with pytest.raises(ValueError, match="only knob is a power limit"):
        PowerCapSampler(build_space(open_device("sim:orin-nano", compute=False), 32, (16, 32)))
