"""What the Hugging Face ``Trainer`` asks of a model and a data set, for the adapter tests: a classifier whose
forward takes the batch's keys and returns its loss, and items as dicts."""

from __future__ import annotations

import torch


class LabelledClassifier(torch.nn.Module):
    """``net`` as the Trainer calls a model: ``forward(x, labels)`` -> ``{"loss", "logits"}``."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class DictData(torch.utils.data.Dataset):
    """Tensors ``x``, ``y`` as the Trainer's items: ``{"x": ..., "labels": ...}``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}
