"""Convergence truth: crossing steps, the warm-up prediction, the scores and the measured table's files."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from edgetune.predictors import steps_to_target
from edgetune.predictors.convergence import (
    CONVERGENCE_COLUMNS,
    ChoiceLoss,
    ConvergenceError,
    ConvergenceRow,
    MeasuredNoiseScale,
    NoiseScaleRow,
    append_convergence_row,
    check_appendable,
    choice_loss,
    crossing_step,
    geometric_schedule,
    load_b_noise,
    load_convergence,
    predict_from_warmup,
    read_b_noise_rows,
    read_comment,
    read_convergence_rows,
    save_b_noise_rows,
    save_convergence_rows,
    steps_error,
)

# ------------------------------------------------------------------------------------------ crossing_step


def test_crossing_interpolates_between_evaluations():
    # accuracy 0.8 at step 10, 0.9 at step 20: 0.85 is crossed half-way
    assert crossing_step([5, 10, 20], [0.5, 0.8, 0.9], 0.85, higher_is_better=True) == pytest.approx(15.0)


def test_crossing_for_a_loss_falls_below_the_target():
    assert crossing_step([1, 2, 4], [4.0, 3.5, 2.5], 3.0, higher_is_better=False) == pytest.approx(3.0)
    # a loss above the target everywhere never reaches it
    assert math.isnan(crossing_step([1, 2], [4.0, 3.5], 3.0, higher_is_better=False))


def test_crossing_takes_the_first_time_the_target_is_met_not_a_later_one():
    # a noisy metric that reaches the target, drops back, then reaches it again
    assert crossing_step([1, 2, 3, 4], [0.5, 0.95, 0.7, 0.99], 0.9, higher_is_better=True) == pytest.approx(
        1 + 0.4 / 0.45)


def test_crossing_exactly_at_an_evaluation_and_at_the_first_one():
    assert crossing_step([2, 4, 8], [0.1, 0.9, 0.95], 0.9, higher_is_better=True) == 4.0
    assert crossing_step([7, 8], [0.95, 0.97], 0.9, higher_is_better=True) == 7.0


def test_a_diverged_evaluation_beside_the_crossing_gives_the_evaluations_own_step():
    assert crossing_step([10, 20], [math.nan, 0.5], 1.0, higher_is_better=False) == 20.0
    assert crossing_step([10, 20], [math.inf, 0.5], 1.0, higher_is_better=False) == 20.0
    assert math.isnan(crossing_step([10, 20], [0.5, math.nan], 0.9, higher_is_better=True))


def test_crossing_rejects_mismatched_or_unsorted_input():
    with pytest.raises(ValueError, match="same length"):
        crossing_step([1, 2], [0.1], 0.5, higher_is_better=True)
    with pytest.raises(ValueError, match="increasing"):
        crossing_step([2, 1], [0.1, 0.2], 0.5, higher_is_better=True)
    assert math.isnan(crossing_step([], [], 0.5, higher_is_better=True))


def test_rows_are_appended_never_rewritten_and_a_foreign_table_is_refused(tmp_path):
    path = tmp_path / "runs.csv"
    check_appendable(path)
    (tmp_path / "other.csv").write_text("batch_size,steps\n32,40\n")
    with pytest.raises(ConvergenceError, match="not a runs table's"):
        check_appendable(tmp_path / "other.csv")
    with pytest.raises(ConvergenceError, match="no folder"):
        check_appendable(tmp_path / "missing" / "runs.csv")
    with pytest.raises(ConvergenceError, match="is a folder"):
        check_appendable(tmp_path)
    first = ConvergenceRow("toy", "accuracy", 0.9, 32, 0, 0.05, 40.5, 10, 1.0)
    append_convergence_row(path, first, comment=["provenance"])
    append_convergence_row(path, ConvergenceRow("toy", "accuracy", 0.9, 64, 1, 0.1, math.nan, 5, 2.0))
    text = path.read_text()
    assert text.startswith("# provenance\n") and text.count(",".join(CONVERGENCE_COLUMNS)) == 1
    rows = read_convergence_rows(path)
    assert rows[0] == first and rows[1].batch_size == 64 and math.isnan(rows[1].steps)
    check_appendable(path)  # its own table takes more rows


# ------------------------------------------------------------------------------------------ schedule


def test_geometric_schedule_steps_by_one_then_by_the_ratio():
    steps = list(itertools.islice(geometric_schedule(1, 1.1), 16))
    assert steps[:10] == list(range(1, 11))
    assert steps[10:] == [11, 13, 15, 17, 19, 21]
    for a, b in itertools.pairwise(steps):
        assert b >= a * 1.1 or b == a + 1


def test_geometric_schedule_starts_where_asked_and_checks_its_arguments():
    assert list(itertools.islice(geometric_schedule(50, 1.2), 3)) == [50, 60, 72]
    with pytest.raises(ValueError, match="positive"):
        next(geometric_schedule(0))
    with pytest.raises(ValueError, match="above 1"):
        next(geometric_schedule(1, 1.0))


# ------------------------------------------------------------------------------------------ prediction


def test_prediction_from_warmup_recovers_the_law_exactly():
    b = np.array([8, 16, 32, 64, 128, 256])
    truth = steps_to_target(b, 40.0, 100.0)
    predicted = predict_from_warmup(b, 100.0, 64, float(truth[3]))
    np.testing.assert_allclose(predicted, truth)
    assert steps_error(predicted, truth) == pytest.approx(0.0, abs=1e-12)


def test_prediction_with_a_wrong_noise_scale_is_right_only_at_the_anchor():
    b = np.array([8, 64, 256])
    truth = steps_to_target(b, 40.0, 100.0)
    predicted = predict_from_warmup(b, 25.0, 64, float(truth[1]))
    assert predicted[1] == pytest.approx(truth[1])
    assert predicted[0] < truth[0] and predicted[2] > truth[2]  # too little noise: a flatter curve


def test_prediction_with_infinite_noise_scale_is_perfect_linear_scaling():
    np.testing.assert_allclose(predict_from_warmup([10, 20, 40], math.inf, 20, 100.0), [200.0, 100.0, 50.0])


def test_prediction_rejects_bad_input():
    with pytest.raises(ValueError, match="non-negative"):
        predict_from_warmup([8], math.nan, 8, 10.0)
    with pytest.raises(ValueError, match="positive"):
        predict_from_warmup([8], 10.0, 8, 0.0)


def test_steps_error_is_the_mean_absolute_relative_error_over_finite_pairs():
    assert steps_error([110, 90, 50], [100, 100, math.nan]) == pytest.approx(0.10)
    with pytest.raises(ValueError, match="no batch size"):
        steps_error([1.0], [math.nan])


# ------------------------------------------------------------------------------------------ choice loss


def test_choice_loss_is_zero_when_both_curves_pick_the_same_batch():
    c = choice_loss([8, 16, 32], [100, 60, 50], [110, 55, 45], [1.0, 1.0, 1.0])
    assert (c.measured_choice, c.predicted_choice) == (32, 32)
    assert c.loss == 0.0


def test_choice_loss_prices_the_predicted_pick_at_the_measured_steps():
    # measured: time 100x1=100 at b=8, 40x3=120 at b=32; predicted thinks b=32 wins (20x3=60 < 100)
    c = choice_loss([8, 32], [100, 20], [100, 40], [1.0, 3.0])
    assert c == ChoiceLoss(measured_choice=8, predicted_choice=32, measured_time_s=100.0,
                           predicted_choice_time_s=120.0)
    assert c.loss == pytest.approx(0.2)


def test_choice_loss_never_picks_a_batch_that_missed_the_target():
    c = choice_loss([8, 32], [100, 1], [100, math.nan], [1.0, 1.0])
    assert c.predicted_choice == 8 and c.loss == 0.0


def test_choice_loss_checks_shapes_and_step_times():
    with pytest.raises(ValueError, match="same length"):
        choice_loss([8], [1, 2], [1], [1])
    with pytest.raises(ValueError, match="positive"):
        choice_loss([8], [1], [1], [0.0])


# ------------------------------------------------------------------------------------------ the table


def _rows():
    out = []
    for seed, steps in zip((0, 1, 2), ((100.0, 30.0), (120.0, 36.0), (110.0, math.nan))):
        out += [ConvergenceRow("cnn", "accuracy", 0.9, 8, seed, 0.00625, steps[0], 12, 1.5),
                ConvergenceRow("cnn", "accuracy", 0.9, 64, seed, 0.05, steps[1], 9, 2.0)]
    return out


def test_table_round_trips_and_takes_medians_over_seeds(tmp_path):
    path = tmp_path / "steps.csv"
    save_convergence_rows(path, _rows())
    curves = load_convergence(path)
    cnn = curves["cnn"]
    assert cnn.batch_sizes == (8, 64) and cnn.seeds == (0, 1, 2)
    assert cnn.steps(8) == 110.0 and cnn.min_steps[0] == 100.0 and cnn.max_steps[0] == 120.0
    # one of three seeds missed the target at b=64: the median is still the middle run
    assert cnn.steps(64) == 36.0 and cnn.max_steps[1] == math.inf
    with pytest.raises(KeyError, match="batch size 16"):
        cnn.steps(16)


def test_table_median_is_nan_where_most_seeds_missed(tmp_path):
    rows = [ConvergenceRow("t", "loss", 3.0, 4, s, 1e-4, v, 5, 1.0) for s, v in enumerate((10.0, math.nan, math.nan))]
    path = tmp_path / "steps.csv"
    save_convergence_rows(path, rows)
    assert math.isnan(load_convergence(path)["t"].steps(4))


def test_table_errors_are_one_line_and_name_the_file(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("workload,batch_size\ncnn,8\n")
    with pytest.raises(ConvergenceError, match="missing column") as info:
        load_convergence(path)
    assert "\n" not in str(info.value) and "bad.csv" in str(info.value)
    with pytest.raises(ConvergenceError, match="cannot read"):
        load_convergence(tmp_path / "absent.csv")
    rows = _rows()
    save_convergence_rows(path, rows)
    path.write_text(path.read_text().replace(",8,0,", ",eight,0,", 1))
    with pytest.raises(ConvergenceError, match="line 2"):
        load_convergence(path)


def test_a_line_with_a_cell_past_the_last_column_is_refused_not_read_shifted(tmp_path):
    # 1,050 steps written without quotes: every cell after it moved one column on, and the run read as 1 step
    path = tmp_path / "steps.csv"
    save_convergence_rows(path, _rows())
    text = path.read_text()
    first = text.splitlines()[1]
    cells = first.split(",")
    cells[CONVERGENCE_COLUMNS.index("steps")] = "1,050"
    path.write_text(text.replace(first, ",".join(cells), 1))
    with pytest.raises(ConvergenceError, match="line 2 has 10 cells for the 9 columns") as info:
        load_convergence(path)
    assert "\n" not in str(info.value)
    path.write_text(text.replace(first, first + ",", 1))  # a trailing comma: an empty cell, no value lost
    assert load_convergence(path)["cnn"].steps(8) == 110.0


def test_table_refuses_two_targets_for_one_workload(tmp_path):
    rows = _rows() + [ConvergenceRow("cnn", "accuracy", 0.8, 8, 0, 0.00625, 50.0, 5, 1.0)]
    path = tmp_path / "steps.csv"
    save_convergence_rows(path, rows)
    with pytest.raises(ConvergenceError, match="several targets"):
        load_convergence(path)


def test_b_noise_table_round_trips(tmp_path):
    row = NoiseScaleRow("cnn", 42.5, 0.99, 128, 4, 100, 33.3, 0.9, 60.0, 20, 12.0)
    path = tmp_path / "b_noise.csv"
    save_b_noise_rows(path, [row])
    assert read_b_noise_rows(path) == [row]
    assert load_b_noise(path) == {"cnn": MeasuredNoiseScale("cnn", (row,))}
    assert load_b_noise(path)["cnn"].b_noise == 42.5


def _warmup(seed: int, b_noise: float, steps: float = 30.0, **changes) -> NoiseScaleRow:
    return replace(NoiseScaleRow("cnn", b_noise, 0.99, 128, 4, seed, steps, 0.9, 2 * b_noise, 20, b_noise / 4),
                   **changes)


def test_a_workloads_b_noise_is_the_median_of_its_warmups(tmp_path):
    # one warm-up is one draw (cnn's read 5-29 samples over nine seeds): the median, like the steps' over seeds
    path = tmp_path / "b_noise.csv"
    rows = [_warmup(102, 25.7, 86.0), _warmup(100, 13.2, 88.7), _warmup(101, 5.2, 90.3),
            replace(_warmup(100, 60.0), workload="mobilenet", warmup_batch=128)]
    save_b_noise_rows(path, rows)
    noise = load_b_noise(path)
    cnn = noise["cnn"]
    assert cnn.seeds == (100, 101, 102)  # in seed order, whatever the file's
    assert cnn.b_noise == 13.2 and cnn.warmup_steps == 88.7
    assert cnn.b_noise_fast == 26.4 and cnn.b_noise_first_steps == pytest.approx(3.3)
    assert (cnn.warmup_batch, cnn.micro_batches, cnn.beta, cnn.fast_beta, cnn.first_steps) == (128, 4, 0.99, 0.9, 20)
    assert noise["mobilenet"].b_noise == 60.0
    # a warm-up that reached the target before first_steps has no early estimate: the median of the others
    save_b_noise_rows(path, [_warmup(100, 13.2), _warmup(101, 8.0, b_noise_first_steps=math.nan)])
    assert load_b_noise(path)["cnn"].b_noise_first_steps == pytest.approx(3.3)


def test_warmups_of_one_workload_must_be_distinct_and_alike(tmp_path):
    path = tmp_path / "b_noise.csv"
    save_b_noise_rows(path, [_warmup(100, 13.2), _warmup(100, 25.7)])
    with pytest.raises(ConvergenceError, match=r"warm-up seed\(s\) \[100\] twice"):
        load_b_noise(path)
    save_b_noise_rows(path, [_warmup(100, 13.2), _warmup(101, 25.7, warmup_batch=64)])
    with pytest.raises(ConvergenceError, match="different warmup_batch"):
        load_b_noise(path)


def test_rows_read_back_as_written(tmp_path):
    path = tmp_path / "steps.csv"
    rows = _rows()
    save_convergence_rows(path, rows)
    back = read_convergence_rows(path)
    assert [r.steps for r in back if math.isfinite(r.steps)] == [r.steps for r in rows if math.isfinite(r.steps)]
    assert back[:-1] == rows[:-1] and math.isnan(back[-1].steps)


def test_provenance_comment_is_kept_apart_from_the_rows(tmp_path):
    path = tmp_path / "steps.csv"
    comment = ["data: sklearn digits", "lr rule: 'linear'\ntarget: accuracy >= 0.9", ""]
    save_convergence_rows(path, _rows(), comment)
    text = path.read_text().splitlines()
    assert text[:4] == ["# data: sklearn digits", "# lr rule: 'linear'", "# target: accuracy >= 0.9", "#"]
    assert read_comment(path) == ["data: sklearn digits", "lr rule: 'linear'", "target: accuracy >= 0.9", ""]
    assert load_convergence(path)["cnn"].steps(8) == 110.0
    row = NoiseScaleRow("cnn", 42.5, 0.99, 128, 4, 100, 33.3, 0.9, 60.0, 20, 12.0)
    save_b_noise_rows(tmp_path / "b.csv", [row], ["estimator: GradientNoiseScale"])
    assert load_b_noise(tmp_path / "b.csv") == {"cnn": MeasuredNoiseScale("cnn", (row,))}
    # a bad value is reported at its line in the file, the comment lines counted
    path.write_text(path.read_text().replace(",8,0,", ",eight,0,", 1))
    with pytest.raises(ConvergenceError, match="line 6"):
        load_convergence(path)
