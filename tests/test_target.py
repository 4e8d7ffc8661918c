"""The training target in the user's loop: ``tune(target=..., runs_file=...)`` and ``tuner.report``."""

from __future__ import annotations

import math

import pytest
import torch
from hf_models import DictData, LabelledClassifier
from torch.utils.data import TensorDataset

import edgetune
from edgetune.predictors.convergence import read_convergence_rows
from edgetune.runtime import Plan, StepRecord
from edgetune.runtime.target import Target, TargetTracker, outcome
from edgetune.search.runs_target import RunsTarget

WORKLOAD = "toy"


def toy(seed=0):
    """A separable problem an MLP learns to 90% accuracy in a few dozen steps."""
    torch.manual_seed(seed)
    x = torch.randn(512, 8)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.05), TensorDataset(x, y)


def plan(batch_size=32):
    return Plan(batch_size=batch_size, setting={}, budget_w=10.0, device="sim:orin-nano", workload=WORKLOAD)


def train(tuner, model, optimizer, data, *, epochs=8, every=4, halve_at=None):
    """The user's loop: evaluate every ``every`` steps, stop once the target is reached."""
    x, y = data.tensors
    for _ in range(epochs):
        for xb, yb in tuner.loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if halve_at is not None and tuner.steps == halve_at:
                tuner.set_batch_size(tuner.batch_size // 2)
            if tuner.steps % every == 0:
                with torch.no_grad():
                    accuracy = (model(x).argmax(1) == y).float().mean().item()
                if tuner.report(accuracy):
                    return


def run(tmp_path, *, target=0.9, batch_size=32, epochs=8, runs_file="runs.csv", halve_at=None, **options):
    model, optimizer, data = toy()
    path = tmp_path / runs_file if runs_file else None
    with edgetune.tune(model, optimizer, dataset=data, plan=plan(batch_size), device="sim:orin-nano",
                       print_summary=False, target=Target("accuracy", target), runs_file=path,
                       **options) as tuner:
        train(tuner, model, optimizer, data, epochs=epochs, halve_at=halve_at)
    return tuner


def records(*sizes, time_s=0.1, energy_j=1.0):
    return [StepRecord(k, 0, b, b, k * time_s, (k + 1) * time_s, time_s, energy_j, energy_j / time_s, 10.0, 10.0, "")
            for k, b in enumerate(sizes)]


# ---------------------------------------------------------------------------------------------- the pieces


def test_the_crossing_is_interpolated_between_evaluations_either_way_round():
    acc = TargetTracker(Target("accuracy", 0.9))
    assert not acc.report(4, 0.6)
    assert not acc.report(8, 0.8)
    assert acc.report(12, 1.0)  # 0.9 half way from 8 to 12
    assert acc.crossing == pytest.approx(10.0)
    assert acc.report(16, 0.5)  # reached stays reached: the first crossing counts
    assert acc.crossing == pytest.approx(10.0)
    loss = TargetTracker(Target("val_loss", 1.0, higher_is_better=False))
    assert not loss.report(10, math.nan)  # a diverged loss is short of the target
    assert not loss.report(20, 2.0)
    assert loss.report(20, 0.5)  # a second report at one step replaces the first
    assert loss.steps == [10, 20] and loss.crossing == 20.0


@pytest.mark.parametrize("bad, message", [
    (lambda: Target("", 0.9), "metric must be a name"),
    (lambda: Target("accuracy", math.nan), "finite number"),
    (lambda: Target("accuracy", True), "finite number"),
    (lambda: Target("loss", 1.0, higher_is_better="low"), "True (accuracy) or False"),
])
def test_a_bad_target_is_refused_in_one_line(bad, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        bad()


def test_reports_must_be_numbers_in_step_order():
    tracker = TargetTracker(Target("accuracy", 0.9))
    tracker.report(5, 0.5)
    with pytest.raises(ValueError, match="after one at step 5"):
        tracker.report(4, 0.6)
    with pytest.raises(TypeError, match="as a number"):
        tracker.report(6, "high")


def test_time_and_energy_run_to_the_crossing_and_only_one_batch_size_is_a_run():
    tracker = TargetTracker(Target("accuracy", 0.9))
    tracker.report(2, 0.8)
    tracker.report(4, 1.0)  # crossing at 3.0
    got = outcome(tracker, records(32, 32, 32, 32, 16), ended_normally=True)
    assert got.recordable and got.batch_size == 32 and got.steps == pytest.approx(3.0)
    assert got.time_s == pytest.approx(0.3) and got.energy_j == pytest.approx(3.0)
    tracker.report(5, 1.0)
    assert outcome(tracker, records(32, 16, 16, 16, 16), ended_normally=True).batch_size == 0
    changed = outcome(tracker, records(32, 16, 16, 16, 16), ended_normally=True)
    assert not changed.recordable and "32 -> 16" in changed.why


def test_a_run_is_recorded_at_the_batch_an_optimizer_step_trains_on():
    tracker = TargetTracker(Target("accuracy", 0.9))
    tracker.report(3, 1.0)
    # gradient accumulation of 4 batches of 32, the epoch's last step holding 3: a run at batch 128
    steps = [StepRecord(k, 0, 32, n, k * 0.1, (k + 1) * 0.1, 0.1, 1.0, 10.0, 10.0, 10.0, "")
             for k, n in enumerate((128, 128, 96, 128))]
    got = outcome(tracker, steps, ended_normally=True)
    assert got.recordable and got.batch_size == 128
    # an epoch's smaller last batch is no other batch size
    last = [StepRecord(k, 0, 32, n, k * 0.1, (k + 1) * 0.1, 0.1, 1.0, 10.0, 10.0, 10.0, "")
            for k, n in enumerate((32, 32, 20))]
    assert outcome(tracker, last, ended_normally=True).batch_size == 32


def test_a_missed_target_is_a_run_only_when_the_run_ended_normally():
    tracker = TargetTracker(Target("accuracy", 0.9))
    tracker.report(4, 0.5)
    done = outcome(tracker, records(32, 32, 32, 32), ended_normally=True)
    assert done.recordable and math.isnan(done.steps) and done.steps_run == 4
    cut = outcome(tracker, records(32, 32, 32, 32), ended_normally=False)
    assert not cut.recordable and "cut short" in cut.why
    quiet = outcome(tracker, records(32, 32), ended_normally=False, recording=False)
    assert not quiet.recordable and quiet.why == ""  # no runs file: nothing to explain
    early = TargetTracker(Target("accuracy", 0.1))
    early.report(0, 0.5)
    assert "before the first step" in outcome(early, records(32), ended_normally=True).why


# ---------------------------------------------------------------------------------------------- in the loop


def test_runs_at_two_batch_sizes_make_a_table_the_search_reads(tmp_path):
    small = run(tmp_path, batch_size=16)
    large = run(tmp_path, batch_size=64, epochs=30)
    for tuner, b in ((small, 16), (large, 64)):
        t = tuner.summary.target
        assert t.reached and t.batch_size == b and t.recorded_in.endswith("runs.csv")
        assert 0 < t.time_s < tuner.summary.time_s and 0 < t.energy_j < tuner.summary.energy_j
        assert f"reached after {t.steps:.1f} steps at batch size {b}" in tuner.summary.table()
        assert any("target accuracy >= 0.9 reached" in text for _, text in tuner.events)
    rows = read_convergence_rows(tmp_path / "runs.csv")
    assert [r.batch_size for r in rows] == [16, 64]
    assert [r.steps for r in rows] == pytest.approx([small.summary.target.steps, large.summary.target.steps], rel=1e-5)
    assert all(r.workload == WORKLOAD and r.metric == "accuracy" and r.lr == 0.05 and r.seed == 0 for r in rows)
    target = RunsTarget.from_csv(tmp_path / "runs.csv", WORKLOAD)
    assert target.medians == pytest.approx({16: rows[0].steps, 64: rows[1].steps})


def test_a_second_run_with_the_same_seed_is_added_with_a_warning(tmp_path, caplog):
    run(tmp_path)
    assert not [r for r in caplog.records if "already has a run" in r.message]
    run(tmp_path)
    (warning,) = [r.message for r in caplog.records if "already has a run" in r.message]
    assert "of toy at batch size 32 with loader seed 0" in warning and "pass another seed=" in warning
    run(tmp_path, seed=1)
    assert len([r for r in caplog.records if "already has a run" in r.message]) == 1
    assert [r.seed for r in read_convergence_rows(tmp_path / "runs.csv")] == [0, 0, 1]


def test_a_run_that_ends_short_of_the_target_is_recorded_as_a_miss(tmp_path):
    tuner = run(tmp_path, target=0.999, epochs=1)
    assert not tuner.summary.target.reached
    assert "not reached in 16 steps" in tuner.summary.table()
    assert "as a run that missed the target" in tuner.summary.table()
    (row,) = read_convergence_rows(tmp_path / "runs.csv")
    assert math.isnan(row.steps) and row.batch_size == 32


def test_a_run_cut_short_or_resized_records_nothing(tmp_path):
    model, optimizer, data = toy()
    with pytest.raises(KeyboardInterrupt), edgetune.tune(
            model, optimizer, dataset=data, plan=plan(), device="sim:orin-nano", print_summary=False,
            target=Target("accuracy", 0.999), runs_file=tmp_path / "runs.csv") as tuner:
        train(tuner, model, optimizer, data, epochs=1)
        raise KeyboardInterrupt
    assert "cut short" in tuner.summary.table() and not (tmp_path / "runs.csv").exists()
    tuner = run(tmp_path, halve_at=2)
    assert "32 -> 16" in tuner.summary.target.why and not (tmp_path / "runs.csv").exists()


def test_without_a_runs_file_the_summary_still_gives_the_steps_to_target(tmp_path):
    tuner = run(tmp_path, runs_file=None)
    assert tuner.summary.target.reached and not tuner.summary.target.recorded_in
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options, message", [
    ({"runs_file": "runs.csv", "target": None}, "pass target=edgetune.Target"),
    ({"runs_file": "runs.csv", "plan": None, "online": True}, "online tuning changes it"),
    ({"runs_file": "runs.csv", "plan": None, "online": False, "batch_size": 32}, "needs workload="),
    ({"runs_file": "other.csv"}, "not a runs table's"),
    ({"runs_file": "missing/runs.csv"}, "no folder"),
    ({"target": 0.9}, "must be an edgetune.Target"),
])
def test_what_cannot_be_recorded_is_refused_before_training(tmp_path, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.csv").write_text("batch_size,steps\n32,40\n")
    model, optimizer, data = toy()
    kwargs = {"plan": plan(), "target": Target("accuracy", 0.9), **options}
    with pytest.raises(ValueError, match=message):
        edgetune.tune(model, optimizer, dataset=data, device="sim:orin-nano", budget_w=10, **kwargs)
    assert (tmp_path / "other.csv").read_text() == "batch_size,steps\n32,40\n"


def test_report_needs_a_target():
    model, optimizer, data = toy()
    with edgetune.tune(model, optimizer, dataset=data, plan=plan(), device="sim:orin-nano",
                       print_summary=False) as tuner, pytest.raises(RuntimeError, match="needs a target"):
        tuner.report(0.5)
    assert tuner.summary.target is None


# ---------------------------------------------------------------------------------------------- the adapters


def test_the_lightning_callback_reads_the_logged_metric_stops_and_records(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from edgetune.runtime.adapters import LightningCallback

    _, _, data = toy()

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = toy()[0]
            self.batch_size = 8

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size, shuffle=False)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(data, batch_size=512)

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    callback = LightningCallback(budget_w=10.0, device="sim:orin-nano", plan=plan(32), print_summary=False,
                                 target=Target("val_acc", 0.9), runs_file=tmp_path / "runs.csv")
    trainer = pl.Trainer(max_epochs=30, callbacks=[callback], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         default_root_dir=tmp_path, val_check_interval=4, check_val_every_n_epoch=None)
    trainer.fit(Module())
    t = callback.summary.target
    assert t.reached and t.batch_size == 32 and trainer.global_step < 30 * 16  # it stopped at the target
    assert t.steps_run - 4 < t.steps <= t.steps_run  # between the last two evaluations, 4 steps apart
    (row,) = read_convergence_rows(tmp_path / "runs.csv")
    assert row.workload == WORKLOAD and row.steps == pytest.approx(t.steps, rel=1e-5) and row.metric == "val_acc"


def test_the_hf_callback_finds_the_eval_prefixed_metric_and_stops(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    from edgetune.runtime.adapters import HFTrainerCallback

    def accuracy(prediction):
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    callback = HFTrainerCallback(budget_w=10.0, device="sim:orin-nano", plan=plan(32), print_summary=False,
                                 target=Target("accuracy", 0.9), runs_file=tmp_path / "runs.csv")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), num_train_epochs=30,
                                          per_device_train_batch_size=32, per_device_eval_batch_size=512,
                                          learning_rate=0.05, optim="sgd", lr_scheduler_type="constant",
                                          eval_strategy="steps", eval_steps=4, report_to=[], save_strategy="no",
                                          logging_strategy="no", use_cpu=True, disable_tqdm=True)
    model, _, data = toy()
    trainer = transformers.Trainer(model=LabelledClassifier(model), args=args, train_dataset=DictData(*data.tensors),
                                   eval_dataset=DictData(*data.tensors),
                                   compute_metrics=accuracy, callbacks=[callback])
    trainer.train()
    t = callback.summary.target
    assert t.reached and t.batch_size == 32 and trainer.state.global_step < 30 * 16  # it stopped there
    (row,) = read_convergence_rows(tmp_path / "runs.csv")
    assert row.steps == pytest.approx(t.steps, rel=1e-5) and row.metric == "accuracy"
    assert not any("not among the validation metrics" in r.message for r in caplog.records)


def test_the_hf_callback_with_several_eval_datasets_names_the_metric_to_give(tmp_path, caplog):
    """A Trainer with several eval datasets names each one's metrics ``eval_<set>_<metric>`` and calls the
    callbacks once per set: ``Target("accuracy")`` is found in none, and the warning names the metric to give
    in full; with it, the run stops at the target and the other set's evaluations are not taken for missing."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # the Trainer needs it
    from edgetune.runtime.adapters import HFTrainerCallback

    def accuracy(prediction):
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    def fit(metric, out):
        callback = HFTrainerCallback(budget_w=10.0, device="sim:orin-nano", plan=plan(32), print_summary=False,
                                     target=Target(metric, 0.75))
        args = transformers.TrainingArguments(output_dir=str(tmp_path / out), max_steps=24,
                                              per_device_train_batch_size=32, per_device_eval_batch_size=512,
                                              learning_rate=0.05, optim="sgd", lr_scheduler_type="constant",
                                              eval_strategy="steps", eval_steps=4, report_to=[], save_strategy="no",
                                              logging_strategy="no", use_cpu=True, disable_tqdm=True)
        model, _, data = toy()
        sets = {"val": DictData(*data.tensors), "test": DictData(*data.tensors[:2])}
        trainer = transformers.Trainer(model=LabelledClassifier(model), args=args, train_dataset=DictData(*data.tensors),
                                       eval_dataset=sets, compute_metrics=accuracy, callbacks=[callback])
        trainer.train()
        warned = [r.getMessage() for r in caplog.records if "validation metrics" in r.getMessage()]
        caplog.clear()
        return callback.summary.target, warned

    target, warned = fit("accuracy", "short")
    assert not target.reached and len(warned) == 1
    assert warned[0].startswith("target metric 'accuracy' is not among the validation metrics (epoch, "
                                "eval_val_accuracy, ")
    assert warned[0].endswith("name the evaluation set's in full, Target('eval_val_accuracy', ...)")
    target, warned = fit("eval_val_accuracy", "named")
    assert target.reached and warned == []


def test_an_adapter_says_once_when_the_target_metric_is_not_logged(caplog):
    from edgetune.runtime._adapter import _Adapter

    model, optimizer, _ = toy()
    with _Adapter(budget_w=10.0, device="sim:orin-nano", plan=plan(32), print_summary=False,
                  target=Target("val_acc", 0.9)) as adapter:
        adapter._start(model, optimizer, 32)
        assert not adapter._report({"val_loss": torch.tensor(0.7)})
        assert not adapter._report({"val_loss": torch.tensor(0.6)})
        assert adapter._report({"val_acc": torch.tensor(0.95)})
    assert [r.message for r in caplog.records if "validation metrics" in r.message] == [
        "target metric 'val_acc' is not among the validation metrics (val_loss): log it under that name"]


def test_a_learning_rate_set_for_another_batch_size_is_scaled_to_the_plans(tmp_path):
    model, optimizer, data = toy()
    with edgetune.tune(model, optimizer, dataset=data, plan=plan(16), device="sim:orin-nano", print_summary=False,
                       lr_batch_size=128, lr_rule="linear") as tuner:
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 16 / 128)
    assert any("learning rate set for batch size 128, scaled to batch size 16 (linear): 0.00625" in text
               for _, text in tuner.events)
    model, optimizer, data = toy()
    with edgetune.tune(model, optimizer, dataset=data, plan=plan(16), device="sim:orin-nano", print_summary=False,
                       lr_batch_size=16):
        assert optimizer.param_groups[0]["lr"] == 0.05  # set for the batch size it runs at: as given
    with pytest.raises(ValueError, match="cannot be used with lr_rule='adascale'"):
        edgetune.tune(model, optimizer, dataset=data, plan=plan(16), lr_batch_size=128, lr_rule="adascale")
    with pytest.raises(ValueError, match="lr_batch_size"):
        edgetune.tune(model, optimizer, dataset=data, plan=plan(16), lr_batch_size=0)


def test_evaluations_go_to_a_jsonl_log_and_an_existing_log_is_never_overwritten(tmp_path):
    import json

    log = tmp_path / "run.jsonl"
    tuner = run(tmp_path, runs_file=None, log=log)
    kinds = [json.loads(line) for line in log.read_text().splitlines()]
    evaluations = [k for k in kinds if k["kind"] == "evaluation"]
    assert len(evaluations) == tuner.summary.target.evaluations and evaluations[0]["metric"] == "accuracy"
    assert [e["after_steps"] for e in evaluations] == list(range(4, 4 * len(evaluations) + 1, 4))
    assert evaluations[-1]["value"] >= 0.9 and evaluations[-1]["device_time_s"] > 0
    before = log.read_bytes()
    with pytest.raises(ValueError, match="exists: edgetune never overwrites a log"):
        run(tmp_path, runs_file=None, log=log)
    assert log.read_bytes() == before


def test_a_runs_file_damaged_during_the_run_is_reported_and_the_exit_goes_on(tmp_path):
    from edgetune.predictors.convergence import CONVERGENCE_COLUMNS

    path = tmp_path / "runs.csv"
    model, optimizer, data = toy()
    with edgetune.tune(model, optimizer, dataset=data, plan=plan(), device="sim:orin-nano", print_summary=False,
                       target=Target("accuracy", 0.9), runs_file=path) as tuner:
        train(tuner, model, optimizer, data)
        path.write_text(",".join(CONVERGENCE_COLUMNS) + "\ntoy,accuracy,0.9,thirty-two,0,0.05,40,3,1\n")
    t = tuner.summary.target
    assert t.reached and not t.recorded_in and f"could not write {path}" in t.why
    assert tuner.summary.knobs_restored and "the row was not recorded" in tuner.summary.table()
