"""Gradient noise scale on real torch models with a known answer; the batch-size law; learning-rate rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from edgetune.predictors import (
    GradientNoiseScale,
    adascale_gain,
    epochs_to_target,
    fit_steps_to_target,
    measure_noise_scale_step,
    scale_lr,
    steps_to_target,
)


def test_linear_regression_noise_scale_matches_theory():
    # y = x.w* + eps, x ~ N(0, I_d), eps ~ N(0, s2); loss 0.5 (x.w - y)^2 at fixed w = w* + delta.
    # Per-sample gradient g = x (x.delta - eps): E g = delta; Cov g = (|delta|^2 + s2) I + delta delta^T,
    # so tr(Sigma) = d (|delta|^2 + s2) + |delta|^2 and B_noise = tr(Sigma) / |delta|^2.
    torch.manual_seed(0)
    d, s2 = 10, 1.0
    w_star = torch.randn(d)
    delta = torch.randn(d)
    delta = delta / delta.norm()  # |delta|^2 = 1
    model = torch.nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_((w_star + delta).unsqueeze(0))
    expected = d * (1.0 + s2) + 1.0  # 21

    def loss_fn(pred, y):
        return 0.5 * (pred.squeeze(1) - y).pow(2).mean()

    gns = GradientNoiseScale(beta=0.999)  # nearly a plain average: w does not move in this test
    gen = torch.Generator().manual_seed(1)
    for _ in range(300):
        x = torch.randn(256, d, generator=gen)
        y = x @ w_star + math.sqrt(s2) * torch.randn(256, generator=gen)
        measure_noise_scale_step(gns, model, loss_fn, x, y, micro_batches=8)
    assert gns.noise_scale == pytest.approx(expected, rel=0.12)
    assert gns.grad_sq == pytest.approx(1.0, rel=0.15)
    # the accumulated .grad is the big-batch gradient, ready for optimizer.step()
    assert model.weight.grad is not None


def test_tiny_classifier_noise_scale_is_finite_and_positive():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    centers = torch.randn(4, 20) * 2
    gns = GradientNoiseScale(beta=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(40):
        y = torch.randint(0, 4, (64,))
        x = centers[y] + torch.randn(64, 20)
        measure_noise_scale_step(gns, model, loss_fn, x, y, micro_batches=4)
        opt.step()
    assert math.isfinite(gns.noise_scale) and gns.noise_scale > 0


def test_update_formulas_and_errors():
    gns = GradientNoiseScale(beta=0.5)
    assert math.isnan(gns.noise_scale)
    # exact inputs: |G|^2 = 2, tr(Sigma) = 40: |G_B|^2 = 2 + 40 / B
    b = gns.update(2 + 40 / 8, 2 + 40 / 64, 8, 64)
    assert b == pytest.approx(20.0) and gns.grad_sq == pytest.approx(2.0) and gns.trace_cov == pytest.approx(40.0)
    with pytest.raises(ValueError, match="b_big > b_small"):
        gns.update(1.0, 1.0, 64, 8)
    with pytest.raises(ValueError, match="finite"):
        gns.update(math.inf, 1.0, 8, 64)
    with pytest.raises(ValueError, match="beta"):
        GradientNoiseScale(beta=1.0)


def test_steps_law_fit_recovers_parameters():
    b = np.array([32, 64, 128, 256, 512, 1024])
    steps = steps_to_target(b, 1000.0, 300.0)
    fit = fit_steps_to_target(b[:4], steps[:4])
    assert fit.s_min == pytest.approx(1000.0, rel=1e-6) and fit.b_noise == pytest.approx(300.0, rel=1e-6)
    np.testing.assert_allclose(fit.steps(b[4:]), steps[4:], rtol=1e-6)
    assert epochs_to_target(256, 1000.0, 300.0, 50_000) == pytest.approx(1000 * (1 + 300 / 256) * 256 / 50_000)
    with pytest.raises(ValueError, match="never reached"):
        fit_steps_to_target([8, 16], [10.0, math.inf])
    # steps still falling linearly with b: B_noise lies beyond the data
    flat = fit_steps_to_target([8, 16, 32], [400.0, 200.0, 100.0])
    assert math.isinf(flat.b_noise) and flat.e_min == pytest.approx(3200.0)
    assert flat.steps(64) == pytest.approx(50.0)


def test_learning_rate_rules():
    assert scale_lr(0.1, 32, 128, "linear") == pytest.approx(0.4)
    assert scale_lr(0.1, 32, 128, "sqrt") == pytest.approx(0.2)
    assert scale_lr(0.1, 32, 128, "none") == 0.1
    # AdaScale: near linear when noise dominates, near 1 when the batch already exceeds the noise scale
    assert adascale_gain(4, b_noise=1e6, base_batch=32) == pytest.approx(4, rel=1e-3)
    assert adascale_gain(4, b_noise=1.0, base_batch=1024) == pytest.approx(1, rel=1e-3)
    assert 1 < scale_lr(0.1, 32, 128, "adascale", b_noise=64) / 0.1 < 4
    with pytest.raises(ValueError, match="needs b_noise"):
        scale_lr(0.1, 32, 128, "adascale")
    with pytest.raises(ValueError, match="unknown learning-rate rule"):
        scale_lr(0.1, 32, 128, "cubic")


@pytest.mark.parametrize("old, new", [(math.nan, 32), (32, math.nan), (32, math.inf), (math.inf, 32)])
def test_a_batch_size_that_is_not_a_positive_finite_number_is_refused_not_turned_into_a_nan_lr(old, new):
    # nan passed the check (nan <= 0 is False): a nan (or inf) learning rate trained the model into nan
    with pytest.raises(ValueError, match="batch sizes must be positive finite numbers"):
        scale_lr(0.1, old, new)


def test_an_infinite_batch_size_in_the_law_fit_is_refused_as_the_message_says():
    with pytest.raises(ValueError, match="positive finite numbers"):
        fit_steps_to_target([16, math.inf], [100.0, 50.0])
