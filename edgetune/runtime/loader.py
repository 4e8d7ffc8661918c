"""A data loader whose batch size edgetune may change between steps, with the learning rate scaled to match.

:class:`ResizableBatchSampler` draws each batch's indices at the batch size in force when the batch is
drawn, from one seeded permutation per epoch, so a change in the middle of an epoch neither repeats nor
skips a sample. :class:`BatchLoader` wraps an ordinary ``torch.utils.data.DataLoader`` over it (workers,
pinning and collation are torch's), and applies a pending change at the next step (``at="step"``) or at the
next epoch (``at="epoch"``).

When the batch size changes from b to b', every parameter group's learning rate is scaled by the configured
rule (:func:`edgetune.predictors.scale_lr`: linear, square root, ...); the optimizer object and its state
(momentum, Adam moments) are kept as they are. A learning-rate scheduler's ``initial_lr`` is scaled too, so
a schedule continues from the scaled value.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from edgetune.power.knobs import check_batch_size

__all__ = ["BatchLoader", "ResizableBatchSampler", "rescale_lr"]


#: parameter-group keys that hold learning rates: the rate, and those schedulers compute it from (every
#: scheduler's ``initial_lr``; OneCycleLR's peak and floor)
_GROUP_RATES = ("lr", "initial_lr", "max_lr", "min_lr")
#: scheduler attributes that hold the rates it computes from (every scheduler's; CyclicLR's peaks)
_SCHEDULER_RATES = ("base_lrs", "max_lrs")


def base_lr(optimizer: torch.optim.Optimizer | None, schedulers: Iterable[Any] = ()) -> float:
    """The learning rate a run trains at, for its runs-file row: the first group's base rate where a scheduler
    computes the rate from one (it may end the run at zero), else its rate now (nan: no optimizer)."""
    if optimizer is None:
        return math.nan
    base = next((s.base_lrs for s in schedulers if isinstance(getattr(s, "base_lrs", None), list)), None)
    return float(base[0]) if base else float(optimizer.param_groups[0]["lr"])


def rescale_lr(optimizer: torch.optim.Optimizer, old_batch_size: int, new_batch_size: int, rule: str, *,
               schedulers: Iterable[Any] = (), **rule_options: Any) -> list[float]:
    """Scale every parameter group's learning rate for a batch-size change; returns the new rates.

    The rates ``schedulers`` compute from (``base_lrs``; a group's ``initial_lr``, OneCycleLR's ``max_lr``
    and ``min_lr``) are scaled alike, or a scheduler's next step would undo the change. The optimizer's
    state (momentum buffers, Adam moments) is untouched.
    """
    from edgetune.predictors import scale_lr

    def scaled(lr: float) -> float:
        return scale_lr(lr, old_batch_size, new_batch_size, rule, **rule_options)

    rates = []
    for group in optimizer.param_groups:
        for key in _GROUP_RATES:
            if isinstance(group.get(key), (int, float)):
                group[key] = scaled(group[key])
        rates.append(group["lr"])
    for scheduler in schedulers:
        for name in _SCHEDULER_RATES:
            values = getattr(scheduler, name, None)
            if isinstance(values, list):
                setattr(scheduler, name, [scaled(v) for v in values])
    return rates


class ResizableBatchSampler(Sampler[list[int]]):
    """Batches of indices over ``range(num_samples)`` at a batch size that may change between batches.

    Args:
        num_samples: dataset length.
        batch_size: the first batch size.
        shuffle: a fresh permutation each epoch (seeded by ``seed`` and the epoch number: reproducible).
        seed: the permutation seed.
        drop_last: drop a last batch smaller than the batch size in force.
    """

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        if num_samples <= 0:
            raise ValueError("the dataset is empty")
        self.num_samples = num_samples
        self.batch_size = check_batch_size(batch_size)
        if drop_last and self.batch_size > num_samples:
            raise ValueError(f"batch size {self.batch_size} is larger than the dataset ({num_samples} samples) with "
                             f"drop_last=True: no batch would be drawn; give a batch size up to {num_samples}, or "
                             f"drop_last=False")
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        # (nominal batch size, samples) of every batch drawn and not yet consumed (workers prefetch ahead)
        self.drawn: deque[tuple[int, int]] = deque()

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=g).tolist()
        else:
            order = list(range(self.num_samples))
        self.epoch += 1
        self.drawn.clear()
        pos = 0
        while pos < self.num_samples:
            b = self.batch_size  # read per batch: a change takes effect at the next batch drawn
            if self.drop_last and pos + b > self.num_samples:
                return
            indices = order[pos: pos + b]
            self.drawn.append((b, len(indices)))
            yield indices
            pos += b

    def __len__(self) -> int:
        n = self.num_samples / self.batch_size
        return int(n) if self.drop_last else math.ceil(n)


class BatchLoader:
    """Iterate over a dataset in batches whose size edgetune chooses and may change between steps.

    Iterating starts an epoch. ``len(loader)`` is the number of batches at the batch size in force.

    Args:
        dataset: a map-style ``torch.utils.data.Dataset`` (``len`` and integer indexing).
        batch_size: the first batch size.
        optimizer: whose learning rate follows batch-size changes (None: leave it alone).
        lr_rule: the scaling rule (``linear``, ``sqrt``, ``none``, ``adascale`` as
            :func:`edgetune.predictors.scale_lr`; ``adascale`` needs :attr:`b_noise`).
        shuffle, seed, drop_last: as :class:`ResizableBatchSampler`.
        on_epoch_start, on_epoch_end: called with the epoch number (the controller's accounting).
        on_resize: called with (old, new, learning rates) after a change took effect.
        schedulers: the optimizer's learning-rate schedulers, scaled with it (:func:`rescale_lr`).
        on_batch: called with each batch and the samples it holds (fewer than the batch size at an epoch's
            end) before the loop receives it.
        loader_options: passed to ``torch.utils.data.DataLoader`` (``num_workers``, ``collate_fn``,
            ``pin_memory`` ...). With workers, a change reaches the loop after the batches already prefetched;
            the learning rate changes with the first batch of the new size, not before.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, optimizer: torch.optim.Optimizer | None = None,
                 lr_rule: str = "linear", shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 on_epoch_start: Callable[[int], None] | None = None,
                 on_epoch_end: Callable[[int], None] | None = None,
                 on_resize: Callable[[int, int, list[float]], None] | None = None,
                 on_batch: Callable[[Any, int], None] | None = None,
                 schedulers: list[Any] | None = None, **loader_options: Any) -> None:
        if not isinstance(dataset, Sized):
            raise TypeError("the dataset needs a length (a map-style torch Dataset); iterable datasets cannot "
                            "be re-batched: take tuner.batch_size and batch them yourself")
        self.dataset = dataset
        self.sampler = ResizableBatchSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed,
                                             drop_last=drop_last)
        self.optimizer = optimizer
        self.lr_rule = lr_rule
        self.on_epoch_start = on_epoch_start
        self.on_epoch_end = on_epoch_end
        self.on_resize = on_resize
        self.on_batch = on_batch
        self.schedulers = schedulers if schedulers is not None else []  # scaled with the rate (shared list)
        self._loader = DataLoader(dataset, batch_sampler=self.sampler, **loader_options)
        self._effective = batch_size  # the batch size the learning rate is set for
        #: the gradient noise scale the ``adascale`` rule needs (the online tuner sets it once measured)
        self.b_noise: float | None = None
        self._at_epoch: int | None = None
        self.epoch = -1

    @property
    def batch_size(self) -> int:
        """The batch size of the batches the loop receives now."""
        return self._effective

    def set_batch_size(self, batch_size: int, at: str = "step") -> None:
        """Change the batch size from the next step (``at="step"``) or the next epoch (``at="epoch"``)."""
        batch_size = check_batch_size(batch_size)
        if at == "step":
            self.sampler.batch_size = batch_size
            self._at_epoch = None
        elif at == "epoch":
            self._at_epoch = batch_size
        else:
            raise ValueError(f"at must be 'step' or 'epoch', got {at!r}")

    def resize_now(self, batch_size: int) -> None:
        """Draw the next batch at ``batch_size`` without cancelling a change asked for the next epoch.

        The budget guard's moves: power must fall now, not at the end of the epoch, and a change the run
        asked for at the next epoch still comes then.
        """
        self.sampler.batch_size = check_batch_size(batch_size)

    def __len__(self) -> int:
        return len(self.sampler)

    def close(self) -> None:
        """Stop the loader's worker processes now. ``persistent_workers`` keeps them between epochs, and
        torch stops them only when the loader is collected: after the run they would hold their memory (a
        copy of the dataset each, on a board whose memory the GPU shares) for as long as the tuner is kept."""
        iterator = getattr(self._loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._loader._iterator = None

    def __iter__(self) -> Iterator[Any]:
        if self._at_epoch is not None:
            self.sampler.batch_size, self._at_epoch = self._at_epoch, None
        self.epoch += 1
        if self.on_epoch_start is not None:
            self.on_epoch_start(self.epoch)
        for batch in self._loader:
            drawn = self.sampler.drawn
            nominal, samples = drawn.popleft() if drawn else (self.sampler.batch_size,) * 2
            if nominal != self._effective:
                old, self._effective = self._effective, nominal
                options = {"b_noise": self.b_noise} if self.lr_rule == "adascale" else {}
                rates = (rescale_lr(self.optimizer, old, nominal, self.lr_rule, schedulers=self.schedulers,
                                    **options) if self.optimizer is not None else [])
                if self.on_resize is not None:
                    self.on_resize(old, nominal, rates)
            if self.on_batch is not None:
                self.on_batch(batch, samples)
            yield batch
        if self.on_epoch_end is not None:
            self.on_epoch_end(self.epoch)
