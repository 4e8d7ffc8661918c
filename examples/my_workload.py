"""A user-defined workload: your own model, tuned by edgetune like the built-ins.

Run it from the repository root (or anywhere with this folder on PYTHONPATH)::

    edgetune run --device sim:orin-nano --workload examples.my_workload:build --batch-size 32 --steps 50
    edgetune run --device sim:orin-nano --workload examples/my_workload.py:build --batch-size 32 --steps 50

``build`` returns an :class:`edgetune.workloads.Workload`. Here the model is a small 1-D convolutional
classifier of sensor windows (an accelerometer's 3 axes, 128 samples: the kind of model edge devices
fine-tune on their own data), trained on a recorded set of windows whose class sets the frequency of a sine
wave. Replace the model and ``recorded_windows`` with yours: any map-style ``torch.utils.data.Dataset``
whose samples are ``(inputs, target)`` (``Workload.from_dataset``; the search's batch sizes stop at its
size). Where your data has no end (a simulator, a live stream), pass ``make_batch`` to
``Workload.from_model`` instead, drawing all its randomness from ``generator``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.data import TensorDataset

from edgetune.workloads import Workload

AXES, WINDOW, CLASSES = 3, 128, 6
RECORDED = 4096  # windows in the recorded set


def make_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy sine windows; class ``k`` oscillates at ``4 (k + 1)`` cycles per window, random phase per axis."""
    labels = torch.randint(0, CLASSES, (batch_size,), generator=generator)
    phase = 2 * math.pi * torch.rand(batch_size, AXES, 1, generator=generator)
    t = torch.linspace(0, 2 * math.pi, WINDOW)
    cycles = 4.0 * (labels + 1).float().view(-1, 1, 1)
    signal = torch.sin(cycles * t + phase)
    return signal + 0.5 * torch.randn(batch_size, AXES, WINDOW, generator=generator), labels


def recorded_windows() -> TensorDataset:
    """The recorded set: the same windows on every run, as a dataset on disk would be."""
    return TensorDataset(*make_batch(RECORDED, torch.Generator().manual_seed(2024)))


def build(seed: int = 0) -> Workload:
    model = nn.Sequential(
        nn.Conv1d(AXES, 32, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(32, 64, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        nn.Flatten(), nn.Linear(64, CLASSES),
    )
    return Workload.from_dataset(
        "har-cnn1d",
        model,
        recorded_windows(),
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
        default_batch_size=64,
        seed=seed,
    )
