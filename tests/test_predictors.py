"""The hardware model: fits real traces and the twin from a handful of rows; validates its input."""

from __future__ import annotations

import os

import numpy as np
import pytest
from sklearn.base import clone

from edgetune.power.base import WorkloadCost
from edgetune.power.sim import Twin
from edgetune.predictors import HardwareModel, Prediction
from edgetune.tables import load_table

ZEUS_TABLES = os.path.join(os.path.dirname(__file__), "..", "experiments", "data", "zeus-nsdi23", "tables")
# a small CNN's step as the twin sees it (the shape of edgetune.workloads' cnn)
COST = WorkloadCost(flops_per_sample=6.2e7, param_bytes=1.4e6, activation_bytes_per_sample=6.3e5,
                    input_bytes_per_sample=1.2e4, optimizer_state_bytes=1.4e6)


def split(table, k, seed):
    order = np.random.default_rng(seed).permutation(len(table))
    return order[:k], order[k:]


def mape(pred, truth):
    return float(np.mean(np.abs(pred / truth - 1)) * 100)


def test_power_limit_table_from_ten_rows():
    t = load_table(os.path.join(ZEUS_TABLES, "a40_imagenet_resnet50.csv"))
    X, time_s, power = t.features(), t.step_time(), t.power_w
    train, test = split(t, 10, seed=0)
    model = HardwareModel().fit([X[i] for i in train], time_s[train], power[train])
    assert model.base_kind_ == "power_cap"
    pred = model.predict([X[i] for i in test])
    assert isinstance(pred, Prediction) and len(pred) == test.size
    # measured on 71 unseen settings of a real GPU; the plain GP reference is ~10% / 3% here
    assert mape(pred.step_time_s, time_s[test]) < 12
    assert mape(pred.power_w, power[test]) < 6
    assert np.all(pred.step_time_std > 0) and np.all(pred.power_std > 0)


@pytest.mark.parametrize("table, seed, bound", [
    # 4x slower at 100 W than uncapped, 1.6x at 150 W: the slowdown is convex in the cap (static power)
    ("a40_sentiment140_bert_base_uncased", 2, 9.0),  # a cap-power-ratio law alone: 16.7%
    # small batches are per-step bound (time ~ 1/b), large ones per-sample bound, with a sharp knee
    ("a40_cifar100_shufflenetv2", 0, 10.5),  # additive per-step + per-sample parts: 12.4%
    ("v100_cifar100_shufflenetv2", 2, 8.0),  # 10.9%
])
def test_power_cap_physics_on_the_hard_tables(table, seed, bound):
    t = load_table(os.path.join(ZEUS_TABLES, f"{table}.csv"))
    X, time_s, power = t.features(), t.step_time(), t.power_w
    train, test = split(t, 10, seed=seed)
    pred = HardwareModel().fit([X[i] for i in train], time_s[train], power[train]).predict([X[i] for i in test])
    assert mape(pred.step_time_s, time_s[test]) < bound


def test_power_cap_base_static_power_and_clock_floor():
    from edgetune.predictors.bases import PowerCapBase

    # free power 250 W at every batch size, static 75 W, the lowest clock draws 75 + 0.2 x 175 = 110 W;
    # time per sample: per-step part 0.1 / b slowing with exponent 0.5, per-sample part 0.01, alpha 1
    theta = np.array([250.0, 0.0, 5.0, 1.0, 1.0, 1.0, np.log(0.1), np.log(0.01), -30.0, 0.3, np.log(0.2), 0.5, 4.0])
    limits = np.array([400.0, 250.0, 200.0, 150.0, 110.0, 90.0, 70.0])
    x, b = np.full(limits.size, 5.0), np.full(limits.size, 32.0)
    free, drawn, static = PowerCapBase._power(theta, x, limits)
    np.testing.assert_allclose(static, 75.0)
    assert drawn[0] == pytest.approx(250.0, rel=0.01)  # a limit above the free power changes nothing
    assert drawn[3] == pytest.approx(150.0, rel=0.01)  # a binding cap is met
    assert drawn[-1] == pytest.approx(110.0, rel=0.01) and drawn[-1] > limits[-1]  # below the floor: not met
    step = PowerCapBase._time(theta, b, free, drawn, static)
    assert np.all(np.diff(step) >= 0)
    # under the cap, dynamic power (above static) sets the clock: 150 W leaves 75 of 175 W -> 2.33x
    per_sample = 0.01 * 175.0 / (drawn[3] - 75.0)
    per_step = 0.1 / 32 * (175.0 / (drawn[3] - 75.0)) ** 0.5
    assert step[3] == pytest.approx((per_step**4 + per_sample**4) ** 0.25, rel=1e-9)
    # at the floor the clock cannot fall further: lowering the limit more barely slows the step (without
    # the floor, 70 W, under the static power, would be an infinite slowdown)
    assert np.isfinite(step[-1]) and step[-1] < 1.05 * step[-2]


def test_uncertainty_grows_away_from_the_data():
    t = load_table(os.path.join(ZEUS_TABLES, "v100_squad_bert_base_uncased.csv"))
    X, time_s, power = t.features(), t.step_time(), t.power_w
    near = [i for i, r in enumerate(X) if r["batch_size"] <= 16]
    model = HardwareModel().fit([X[i] for i in near], time_s[near], power[near])
    seen = model.predict([{"power_limit": 150.0, "batch_size": 12.0}])
    far = model.predict([{"power_limit": 150.0, "batch_size": 56.0}])
    assert far.step_time_std[0] / far.step_time_s[0] > seen.step_time_std[0] / seen.step_time_s[0]


def twin_rows(n, seed):
    twin = Twin("orin-nano", compute=False)
    grid = twin.knob_grid()
    rng = np.random.default_rng(seed)
    X, time_s, power = [], [], []
    while len(X) < n:
        s = {k: grid[k][rng.integers(len(grid[k]))] for k in ("gpu_freq", "emc_freq")}
        b = int(2 ** rng.integers(3, 8))
        e = twin.expected(COST, b, {"power_mode": grid["power_mode"][-1], **s})
        X.append({**{k: float(v) for k, v in s.items()}, "batch_size": float(b)})
        time_s.append(e.step_time_s)
        power.append(e.power_w)
    return X, np.array(time_s), np.array(power)


def test_frequency_knobs_use_the_physics_base_and_extrapolate_on_the_twin():
    X, time_s, power = twin_rows(60, seed=1)
    model = HardwareModel().fit(X[:12], time_s[:12], power[:12])
    assert model.base_kind_ == "frequency"
    pred = model.predict(X[12:])
    assert mape(pred.step_time_s, time_s[12:]) < 20
    assert mape(pred.power_w, power[12:]) < 15


def test_peak_power_follows_the_measured_ratio():
    X = [{"gpu_freq": f, "batch_size": b} for f in (3e8, 6e8) for b in (8, 16, 32)]
    t = np.array([0.02, 0.03, 0.05, 0.011, 0.016, 0.027])
    p = np.array([5.0, 5.5, 6.0, 8.0, 9.0, 10.0])
    model = HardwareModel(residual="none").fit(X, t, p, peak_power_w=p * 1.3)
    pred = model.predict(X)
    np.testing.assert_allclose(pred.peak_power_w / pred.power_w, 1.3)
    # sklearn conventions: parameters round-trip, clone gives an unfitted copy
    assert model.get_params() == {"base": "auto", "residual": "none", "random_state": 0, "cv_folds": 4}
    assert not hasattr(clone(model), "base_model_")


@pytest.mark.parametrize("X, t, p, message", [
    ([], [], [], "X is empty"),
    ([{"gpu_freq": 1.0}], [1.0], [1.0], "'batch_size'"),
    ([{"gpu_freq": 1.0, "batch_size": 8}, {"batch_size": 16}], [1, 1], [1, 1], "row 1 of X has knobs"),
    ([{"batch_size": 8}, {"batch_size": 16}], [1.0], [1.0, 2.0], "step_time_s has 1 values for 2 rows"),
    ([{"batch_size": 8}, {"batch_size": 16}], [1.0, float("nan")], [1.0, 2.0], "positive finite"),
    ([{"batch_size": 8}, {"batch_size": -16}], [1.0, 1.0], [1.0, 2.0], "positive finite"),
    ([{"batch_size": 8}], [1.0], [1.0], "at least 2"),
])
def test_bad_input_is_refused(X, t, p, message):
    with pytest.raises(ValueError, match=message):
        HardwareModel().fit(X, t, p)


def test_predict_needs_fit_and_the_same_knobs():
    with pytest.raises(ValueError, match="not fitted"):
        HardwareModel().predict([{"batch_size": 8}])
    model = HardwareModel().fit([{"power_limit": 100, "batch_size": b} for b in (8, 16, 32)],
                                [0.1, 0.15, 0.3], [90, 95, 99])
    with pytest.raises(ValueError, match="expects \\['power_limit'\\]"):
        model.predict([{"gpu_freq": 1e9, "batch_size": 8}])
    with pytest.raises(ValueError, match="base must be one of"):
        HardwareModel(base="magic").fit([{"batch_size": 8}, {"batch_size": 16}], [1, 2], [1, 1])


def test_predicts_a_search_sized_grid():
    X, time_s, power = twin_rows(10, seed=2)
    model = HardwareModel().fit(X, time_s, power)
    grid = [{"gpu_freq": f, "emc_freq": e, "batch_size": float(b)} for f in np.linspace(3e8, 6.2e8, 25)
            for e in np.linspace(2e8, 2.1e9, 25) for b in (8, 16, 32, 64, 128, 256, 512, 1024)]
    pred = model.predict(grid)  # the speed is measured in experiments/predictor_comparison.py
    assert len(pred) == 5000 and np.all(np.isfinite(pred.step_time_s)) and np.all(pred.power_w > 0)
    assert np.all(np.isfinite(pred.step_time_std)) and np.all(pred.power_std > 0)


def test_columns_named_by_role_use_the_clock_physics():
    """``gpu_freq_hz`` / ``emc_freq_mhz`` / ``online_cores`` are the registry's clocks by role: the roofline
    serves them, with the same predictions as under the registry's names; a knob with no role rides along."""
    X, time_s, power = twin_rows(40, seed=2)
    renamed = [{"gpu_freq_hz": r["gpu_freq"], "emc_freq_mhz": r["emc_freq"] / 1e6, "batch_size": r["batch_size"]}
               for r in X]
    plain = HardwareModel().fit(X[:10], time_s[:10], power[:10])
    model = HardwareModel().fit(renamed[:10], time_s[:10], power[:10])
    assert model.base_kind_ == plain.base_kind_ == "frequency"
    np.testing.assert_allclose(model.predict(renamed[10:]).step_time_s, plain.predict(X[10:]).step_time_s,
                               rtol=1e-3)
    extra = [{**r, "fan_level": 1.0 + i % 3} for i, r in enumerate(renamed)]
    assert HardwareModel().fit(extra[:10], time_s[:10], power[:10]).base_kind_ == "frequency"


def test_extrapolated_batch_sizes_are_reported_unsure_and_more_so_further_out():
    from edgetune.predictors.hardware_model import EXTRAPOLATION_STD_PER_OCTAVE

    t = load_table(os.path.join(ZEUS_TABLES, "v100_squad_bert_base_uncased.csv"))
    X, time_s, power = t.features(), t.step_time(), t.power_w
    near = [i for i, r in enumerate(X) if r["batch_size"] <= 16]
    model = HardwareModel().fit([X[i] for i in near], time_s[near], power[near])
    rel = [float(p.step_time_std[0] / p.step_time_s[0]) for p in
           (model.predict([{"power_limit": 150.0, "batch_size": b}]) for b in (12.0, 32.0, 64.0))]
    assert rel[0] < rel[1] < rel[2]
    assert rel[1] >= EXTRAPOLATION_STD_PER_OCTAVE[0] * 1.0  # one octave above the largest measured (16)
    assert rel[2] >= EXTRAPOLATION_STD_PER_OCTAVE[0] * 2.0


def test_power_cap_cv_refits_run_the_winning_start_only():
    # the cross-validated floor refits the base once per fold; a power-cap refit runs the full fit's winning
    # start alone (half the work), and its cost on the fold's rows is the same as from both starts
    from edgetune.predictors.bases import PowerCapBase
    t = load_table(os.path.join(ZEUS_TABLES, "a40_imagenet_resnet50.csv"))
    X, time_s, power = t.features(), t.step_time(), t.power_w
    train, _ = split(t, 12, seed=1)
    model = HardwareModel().fit([X[i] for i in train], time_s[train], power[train])
    full = model.base_model_
    b = np.array([X[i]["batch_size"] for i in train])
    assert full.start_m in (float(np.log2(b.min())), float(np.log2(b.max())))
    k = np.array([[X[i]["power_limit"]] for i in train]) / model.scale_
    keep = np.arange(train.size) % 4 != 0
    args = (k[keep], b[keep], time_s[train][keep] / b[keep], power[train][keep], float(model.scale_[0]))
    one = PowerCapBase.fit(*args, start_m=full.start_m)
    both = PowerCapBase.fit(*args)
    assert one.start_m == full.start_m
    ts_one, p_one = one.predict(k[~keep], b[~keep])
    ts_both, _ = both.predict(k[~keep], b[~keep])
    assert 0 < model.cv_var_[0] <= 0.04 and 0 < model.cv_var_[1] <= 0.04
    assert np.all(np.isfinite(ts_one)) and np.all(p_one > 0)
    # the held-out time predictions of one start and of both agree within 5%
    assert np.sqrt(np.mean(np.log(ts_one / ts_both) ** 2)) < 0.05


def test_within_std_counts_the_truths_a_doubt_covers():
    one = np.ones(4)
    pred = Prediction(step_time_s=one, power_w=10 * one, peak_power_w=10 * one, step_time_std=0.1 * one,
                      power_std=one)
    # log errors 0, 0.1, 0.25, 0.5 against 2 std of 0.2 (time) and 0.2 (power, relative)
    truth = np.exp([0.0, 0.1, 0.25, -0.5])
    assert pred.within_std(truth, 10 * truth) == (0.5, 0.5)
    assert pred.within_std(truth, 10 * truth, n_std=3.0) == (0.75, 0.75)


def test_refit_spread_widens_the_doubt_between_rows_until_it_covers_held_out_truths():
    # the GP's std is small next to the rows however the base splits what they show; the refits' spread
    # shows where that split is open. On the twin, 10 rows: the GP alone covers 46-100% of the held-out
    # times within 2 std, with the spread 81-100%, and the means do not move
    X, time_s, power = twin_rows(80, seed=1)
    for seed in range(3):
        train, test = split(X, 10, seed)
        model = HardwareModel().fit([X[i] for i in train], time_s[train], power[train])
        assert len(model.refits_) == 4
        rows = [X[i] for i in test]
        gp, both = model.predict(rows), model.predict(rows, refit_spread=True)
        assert np.array_equal(gp.step_time_s, both.step_time_s) and np.array_equal(gp.power_w, both.power_w)
        assert np.all(both.step_time_std >= gp.step_time_std) and np.all(both.power_std >= gp.power_std)
        assert np.any(both.step_time_std > 1.05 * gp.step_time_std)
        # the spread is capped: a relative std of at most 20% on top of the GP's
        assert np.all(np.hypot(gp.step_time_std / gp.step_time_s, 0.2) >= both.step_time_std / both.step_time_s - 1e-12)

        (t_gp, p_gp), (t_both, p_both) = (pred.within_std(time_s[test], power[test]) for pred in (gp, both))
        assert t_both >= max(t_gp, 0.8) and p_both >= max(p_gp, 0.9)
        assert t_both > t_gp or t_gp == 1.0


def test_refit_spread_needs_the_cross_validation():
    X, time_s, power = twin_rows(20, seed=2)
    for model in (HardwareModel(cv_folds=0), HardwareModel(residual="none"),
                  HardwareModel()):
        n = 4 if model.cv_folds == 4 and model.residual == "gp" else 12  # 4 rows: no more rows than folds
        model.fit(X[:n], time_s[:n], power[:n])
        assert model.refits_ == []
        a, b = model.predict(X[12:]), model.predict(X[12:], refit_spread=True)
        assert np.array_equal(a.step_time_std, b.step_time_std) and np.array_equal(a.power_std, b.power_std)


SIX = [{"gpu_freq": f, "batch_size": b} for f in (3e8, 6e8) for b in (8, 16, 32)]
SIX_T, SIX_P = [0.02, 0.03, 0.05, 0.011, 0.016, 0.027], [5.0, 5.5, 6.0, 8.0, 9.0, 10.0]


@pytest.mark.parametrize("X, message", [
    # a later row without its batch size raised a bare KeyError
    ([{"gpu_freq": 3e8, "batch_size": 8}, {"gpu_freq": 6e8}], "row 1 of X has no 'batch_size'"),
    ([{"gpu_freq": 3e8, "batch_size": 8}, [6e8, 16]], "row 1 of X is not a mapping"),
    # which knob and row: a table's knob column may hold 0 (a fan level, a mode index)
    ([{"fan_level": 1.0, "batch_size": 8}, {"fan_level": 0.0, "batch_size": 16}],
     "row 1 of X: fan_level = 0; knob values and batch sizes must be positive finite numbers"),
])
def test_a_bad_row_is_named_with_a_value_error(X, message):
    with pytest.raises(ValueError, match=message):
        HardwareModel().fit(X, [0.01, 0.02], [5.0, 6.0])
    model = HardwareModel(residual="none").fit([{k: 1.0 for k in X[0]}, {**{k: 2.0 for k in X[0]}, "batch_size": 16}],
                                               [0.01, 0.02], [5.0, 6.0])
    with pytest.raises(ValueError, match=message):
        model.predict(X)


@pytest.mark.parametrize("cv_folds", [1, -1, 2.5, True])
def test_cv_folds_other_than_zero_or_two_or_more_are_refused(cv_folds):
    # one fold "cross-validated" by a refit on no rows at all, and a negative count turned the floor off
    # without a word: both gave a model that looked fitted as asked
    with pytest.raises(ValueError, match="cv_folds must be 0 .no cross-validation. or a whole number >= 2"):
        HardwareModel(cv_folds=cv_folds).fit(SIX, SIX_T, SIX_P)
    assert HardwareModel(cv_folds=2).fit(SIX, SIX_T, SIX_P).cv_var_ != (0.0, 0.0)


def test_a_target_of_another_shape_than_one_value_per_row_is_refused():
    # a 2 x 3 array for six rows read row by row: whichever order the caller meant
    with pytest.raises(ValueError, match="step_time_s must be one value per row of X, got shape .2, 3."):
        HardwareModel().fit(SIX, np.array(SIX_T).reshape(2, 3), SIX_P)
    column = HardwareModel().fit(SIX, np.array(SIX_T)[:, None], SIX_P)  # a column is one value per row
    flat = HardwareModel().fit(SIX, SIX_T, SIX_P)
    assert np.array_equal(column.predict(SIX).step_time_s, flat.predict(SIX).step_time_s)


def test_within_std_needs_one_truth_per_prediction():
    one = np.ones(4)
    pred = Prediction(step_time_s=one, power_w=one, peak_power_w=one, step_time_std=0.1 * one, power_std=0.1 * one)
    # a single truth was broadcast against every prediction: a share of something else
    with pytest.raises(ValueError, match="1 step_time_s value.s. for 4 predictions"):
        pred.within_std([1.0], one)
