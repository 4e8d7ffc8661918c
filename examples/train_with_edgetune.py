"""Train an ordinary PyTorch model under a power budget with ``edgetune.tune``.

The loop below is a plain PyTorch loop; the only edgetune lines are the ``with`` statement and taking the
batches from ``tuner.loader``. ``optimizer.step()`` marks each step (an optimizer hook), so nothing else
changes.

    python examples/train_with_edgetune.py                          # online tuning on the simulated Orin Nano
    python examples/train_with_edgetune.py --plan out/best.json     # apply the plan of `edgetune search`
    python examples/train_with_edgetune.py --device jetson --budget 15

While it runs, lower the budget from another shell (battery low) and watch the guard follow within 2 s:

    echo 7 > budget.txt                  # the file is watched; `kill -USR1 <pid>` re-reads it at once

On ``sim:`` devices the training is real (this CPU) and the time and power are the calibrated twin's. On a
board the model trains where the device measures (its GPU: ``device.compute``), and a PyTorch that cannot
use it is one line with the fix.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from torch import nn
from torch.utils.data import TensorDataset

import edgetune
from edgetune.power import DeviceError, open_device
from edgetune.workloads import WorkloadError, place


def synthetic_cifar(n: int, seed: int = 0) -> TensorDataset:
    """Ten noisy class prototypes at CIFAR's shape: learnable in a few hundred steps."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(10, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = prototypes[labels] + torch.randn(n, 3, 32, 32, generator=g)
    return TensorDataset(images, labels)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="sim:orin-nano", help="sim:<profile>, jetson, nvml:0, auto")
    ap.add_argument("--budget", type=float, default=None, help="power budget in W (default: the plan's, else 10)")
    ap.add_argument("--plan", default=None, help="best.json of `edgetune search` (default: tune online)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--budget-file", default="budget.txt", help="watched file holding the budget in W")
    ap.add_argument("--log", default=None, help="per-step log, .csv or .jsonl")
    args = ap.parse_args()
    budget = args.budget if args.budget is not None or args.plan else 10.0

    torch.manual_seed(0)
    train_set = synthetic_cifar(2048)
    try:
        device = open_device(args.device)
    except DeviceError as exc:  # an unknown device, a board without its sensor: one line, the fix
        raise SystemExit(f"train_with_edgetune: {exc}") from None
    try:
        where = place("auto", device.compute, device.name).torch_device  # the GPU it measures; the CPU on sim:
        model = make_model().to(where)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        # with a plan, its batch size is used; without one, online tuning starts from 32 and explores around it
        tuner = edgetune.tune(model, optimizer, dataset=train_set, batch_size=None if args.plan else 32,
                              budget_w=budget, device=device, plan=args.plan, budget_file=args.budget_file,
                              log=args.log)
    except (WorkloadError, DeviceError, ValueError) as exc:  # a CPU build of PyTorch on a board, a plan that is
        device.close()                                       # not there, a log that exists: one line, the fix
        raise SystemExit(f"train_with_edgetune: {exc}") from None
    loss_fn = nn.CrossEntropyLoss()

    with contextlib.closing(device), tuner:
        for epoch in range(args.epochs):
            total, seen = 0.0, 0
            for x, y in tuner.loader:                  # batches at the batch size edgetune chose
                x, y = x.to(where), y.to(where)
                loss = loss_fn(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()                        # marks the step; the guard keeps the budget
                total += loss.item() * len(x)
                seen += len(x)
            print(f"epoch {epoch}: loss {total / seen:.3f}, batch size {tuner.batch_size}, "
                  f"budget {tuner.budget_w:g} W")
    # the summary table is printed on exit; the figures are in tuner.summary
    print(f"energy {tuner.summary.energy_j:.0f} J over {tuner.summary.time_s:.1f} s, "
          f"{len(tuner.summary.violations)} budget violation(s)")


if __name__ == "__main__":
    main()
