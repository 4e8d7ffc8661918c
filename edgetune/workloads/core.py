"""The :class:`Workload` type: a model with its optimizer, loss and seeded batches, and its measured cost.

Everything that tunes or simulates a device drives training through :meth:`Workload.train_step`, one real
forward/backward/optimizer step. Build a workload with :meth:`Workload.from_model`; bad definitions raise
:class:`WorkloadError`, one line naming the fix.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from edgetune.power.base import WorkloadCost
from edgetune.power.knobs import BatchSizeError, check_batch_size
from edgetune.workloads.cost import _COST_BATCH_SIZE, _COST_SEED_OFFSET, _tensors, apply_model, measure_cost

__all__ = ["DEFAULT_BATCH_SIZE", "Batch", "BatchSource", "LossFn", "OptimizerSpec", "Workload", "WorkloadError"]

Batch = tuple[Any, Tensor]
BatchSource = Callable[[int, torch.Generator], Batch]
LossFn = Callable[[Any, Tensor], Tensor]
OptimizerSpec = Union[torch.optim.Optimizer, Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer], None]  # noqa: UP007 - evaluated at runtime on 3.10 too

# Samples per batch when a workload names none: the default of common training loops (Keras' fit).
DEFAULT_BATCH_SIZE = 32
# The optimizer of a workload that brings none: plain SGD with momentum at a learning rate that trains
# most small models without tuning (torch's own examples use 0.01 with momentum 0.9).
_DEFAULT_SGD_LR = 0.01
_DEFAULT_SGD_MOMENTUM = 0.9
# The seed of the run whose workload is being built (load_workload sets it while the builder runs): the seed of
# a workload built without one, so that a builder which leaves seed= out still draws each run's own batches.
RUN_SEED: contextvars.ContextVar[int] = contextvars.ContextVar("edgetune_run_seed", default=0)
# The two batches that show which of a batch's axes follows the batch size come from generators seeded with
# the workload's seed plus this offset (and one more), apart from the workload's stream and the cost's batch.
_SHAPE_SEED_OFFSET = _COST_SEED_OFFSET + 1


class WorkloadError(ValueError):
    """A workload spec or definition that cannot be used; the message is one line naming the fix."""


def _one_line(exc: BaseException) -> str:
    """``TypeName: message`` on a single line (messages of import errors can span lines)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(eq=False)
class Workload:
    """A model with its optimizer, loss and seeded synthetic batches.

    Build one with :meth:`from_model`; :attr:`cost` is measured at construction.

    Attributes:
        name: what reports call the workload.
        model: the ``torch.nn.Module`` (built on CPU; batches follow the model to its device).
        batch_source: ``batch_source(batch_size, generator) -> (inputs, targets)``.
        loss_fn: ``loss_fn(model(inputs), targets) -> scalar loss``.
        optimizer: the optimizer over ``model``'s parameters.
        default_batch_size: the batch size common practice uses for this model: the baseline a tuned
            setting is compared against.
        seed: seeds the batch stream (and, in :func:`~edgetune.workloads.load_workload`, the initial weights).
        b_noise: the gradient noise scale B_noise of this workload, in samples, as measured (McCandlish et
            al. 2018: around this batch size, doubling the batch stops nearly halving the steps to a
            target; see :mod:`edgetune.predictors`); None when unknown. Not used yet.
        max_batch_size: the largest batch the data can give, in samples (a dataset's size: a batch holds
            distinct samples); None for a source without end, such as synthetic data. The search's batch
            sizes stop there.
        cost: what one training step asks of the hardware, measured once by
            :func:`~edgetune.workloads.measure_cost`.
    """

    name: str
    model: nn.Module = field(repr=False)
    batch_source: BatchSource = field(repr=False)
    loss_fn: LossFn = field(repr=False)
    optimizer: torch.optim.Optimizer = field(repr=False)
    default_batch_size: int = DEFAULT_BATCH_SIZE
    seed: int = 0
    b_noise: float | None = None
    max_batch_size: int | None = None
    cost: WorkloadCost = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise WorkloadError(f"workload {self.name!r}: model must be a torch.nn.Module, "
                                f"got {type(self.model).__name__}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise WorkloadError(f"workload {self.name!r}: optimizer must be a torch.optim.Optimizer, "
                                f"got {type(self.optimizer).__name__}")
        own = {id(p) for p in self.model.parameters()}
        if own and not any(id(p) in own for group in self.optimizer.param_groups for p in group["params"]):
            raise WorkloadError(f"workload {self.name!r}: the optimizer updates none of the model's parameters (built "
                                f"over another model's?); build it over model.parameters(), or pass optimizer= a "
                                f"function of the parameters, such as lambda params: torch.optim.Adam(params)")
        self.default_batch_size = _check_batch_size(self.default_batch_size, "default_batch_size")
        if self.b_noise is not None:
            if isinstance(self.b_noise, bool) or not isinstance(self.b_noise, (int, float)) \
                    or not (math.isfinite(self.b_noise) and self.b_noise > 0):
                raise WorkloadError(f"workload {self.name!r}: b_noise must be a positive number of samples "
                                    f"or None, got {self.b_noise!r}")
            self.b_noise = float(self.b_noise)
        if self.max_batch_size is not None:
            self.max_batch_size = _check_batch_size(self.max_batch_size, "max_batch_size")
            if self.default_batch_size > self.max_batch_size:
                raise WorkloadError(f"workload {self.name!r}: default_batch_size {self.default_batch_size} is "
                                    f"larger than its data ({self.max_batch_size} samples); give a smaller one")
        self._generator = torch.Generator().manual_seed(self.seed)
        cost_batch = min(_COST_BATCH_SIZE, self.max_batch_size or _COST_BATCH_SIZE)
        self._rows_per_sample: float | None = None  # the batch axis' length per sample (None: not known)
        try:
            self._rows_per_sample = self._batch_axis(cost_batch)
            self.cost = measure_cost(self, cost_batch)
        except WorkloadError:
            raise
        except Exception as exc:
            raise WorkloadError(f"workload {self.name!r}: one training step on a batch of {cost_batch} "
                                f"failed: {_one_line(exc)}") from exc

    def _batch_axis(self, batch_size: int) -> float | None:
        """The length of the batch axis per sample: that of a tensor of the batch that ``batch_source`` makes
        ``batch_size`` samples long and twice as long at twice the size (or half at half, where the data holds
        fewer). One of its batch's tensors must follow the batch size, or every per-sample cost is measured on
        a batch of another size; None where this cannot be told (a single sample, batches without tensors)."""
        other = 2 * batch_size if self.max_batch_size is None or 2 * batch_size <= self.max_batch_size \
            else batch_size // 2
        if other < 1 or other == batch_size:
            return None
        shapes = []
        for size, offset in ((batch_size, _SHAPE_SEED_OFFSET), (other, _SHAPE_SEED_OFFSET + 1)):
            inputs, targets = self.batch_source(size, torch.Generator().manual_seed(self.seed + offset))
            shapes.append([tuple(t.shape) for t in _tensors((inputs, targets))])
        if not shapes[0] or len(shapes[0]) != len(shapes[1]):
            return None
        for one, two in zip(*shapes):
            if len(one) != len(two):
                continue
            for n, m in zip(one, two):
                if n > 0 and n * other == m * batch_size:
                    return n / batch_size
        raise WorkloadError(
            f"workload {self.name!r}: make_batch({batch_size}) and make_batch({other}) return tensors of shapes "
            f"{_shapes(shapes[0])} and {_shapes(shapes[1])}, none of whose sizes follows the batch size, so the "
            f"cost per sample would be measured on a batch of another size; return batch_size samples "
            f"(make_batch's first argument)")

    @classmethod
    def from_model(
        cls,
        name: str,
        model: nn.Module,
        make_batch: BatchSource,
        *,
        loss_fn: LossFn = F.cross_entropy,
        optimizer: OptimizerSpec = None,
        default_batch_size: int = DEFAULT_BATCH_SIZE,
        seed: int | None = None,
        b_noise: float | None = None,
        max_batch_size: int | None = None,
    ) -> Workload:
        """The workload of ``model`` trained on batches from ``make_batch``.

        Args:
            name: what reports call it.
            model: the network.
            make_batch: ``make_batch(batch_size, generator) -> (inputs, targets)`` of ``batch_size`` samples,
                drawing its randomness from ``generator``. One of its tensors must have an axis that follows the
                batch size (checked at two sizes, and at every batch drawn), or the cost per sample would be
                measured on a batch of another size: a :class:`WorkloadError` says so.
            loss_fn: ``loss_fn(model(inputs), targets)``; cross-entropy by default.
            optimizer: an optimizer over ``model.parameters()`` (one over none of them, another model's, is
                refused), or a function of the parameters that builds one; SGD with momentum 0.9 and lr 0.01
                by default.
            default_batch_size: the batch size you would train with without edgetune.
            seed: seeds the batch stream; by default the seed :func:`~edgetune.workloads.load_workload` builds
                with (the run's ``--seed``; 0 outside it), so that a builder need not pass it on.
            b_noise: the workload's measured gradient noise scale in samples, if known.
            max_batch_size: the largest batch ``make_batch`` can give (your data's size), if it has one.
        """
        if optimizer is None:
            optimizer = torch.optim.SGD(model.parameters(), lr=_DEFAULT_SGD_LR, momentum=_DEFAULT_SGD_MOMENTUM)
        elif not isinstance(optimizer, torch.optim.Optimizer) and callable(optimizer):
            optimizer = optimizer(model.parameters())
        seed = RUN_SEED.get() if seed is None else seed
        return cls(name, model, make_batch, loss_fn, optimizer, default_batch_size=default_batch_size, seed=seed,
                   b_noise=b_noise, max_batch_size=max_batch_size)

    @classmethod
    def from_dataset(
        cls,
        name: str,
        model: nn.Module,
        dataset: Dataset[Any],
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loss_fn: LossFn = F.cross_entropy,
        optimizer: OptimizerSpec = None,
        default_batch_size: int = DEFAULT_BATCH_SIZE,
        seed: int | None = None,
        b_noise: float | None = None,
    ) -> Workload:
        """The workload of ``model`` trained on your own data: batches of distinct samples of ``dataset``.

        ``dataset`` is a map-style ``torch.utils.data.Dataset`` (``__len__`` and ``__getitem__``: a
        ``TensorDataset``, a torchvision dataset, your own class); each batch draws its samples at random
        (:func:`~edgetune.workloads.data.dataset_batches`) and ``collate_fn`` (torch's ``default_collate``
        unless given) makes them ``(inputs, targets)``. Batch sizes stop at the dataset's size. The other
        arguments are :meth:`from_model`'s.

        Loading and collating the samples is part of each measured step, as in a ``DataLoader`` with
        ``num_workers=0``: where your training loads in worker processes, give a dataset that holds its
        samples decoded in memory, so the step measured is the one your training runs.
        """
        from edgetune.workloads.data import dataset_batches

        source = dataset_batches(dataset, collate_fn)
        return cls.from_model(name, model, source, loss_fn=loss_fn, optimizer=optimizer,
                              default_batch_size=default_batch_size, seed=seed, b_noise=b_noise,
                              max_batch_size=len(dataset))  # type: ignore[arg-type]  # checked by dataset_batches

    # -- training ---------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live; batches are moved there."""
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    def to(self, device: torch.device | str) -> Workload:
        """Move the model and the optimizer's state to ``device``, in place; returns the workload.

        Where ``nn.Module.to`` replaces a parameter rather than moving its data (it does between some kinds
        of device), the optimizer is pointed at the new one, with its state. Batches follow the model
        (:meth:`make_batch`). An optimizer's ``step`` counters stay where torch keeps them (on the CPU unless
        the optimizer is capturable or fused).
        """
        device = torch.device(device)
        before = list(self.model.parameters())
        self.model.to(device)
        replaced = {id(old): new for old, new in zip(before, self.model.parameters()) if old is not new}
        if replaced:
            for group in self.optimizer.param_groups:
                group["params"] = [replaced.get(id(p), p) for p in group["params"]]
            moved = {replaced.get(id(p), p): s for p, s in self.optimizer.state.items()}
            self.optimizer.state.clear()
            self.optimizer.state.update(moved)
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if key != "step" and isinstance(value, Tensor):
                    state[key] = value.to(device)
        return self

    def make_batch(self, batch_size: int, generator: torch.Generator | None = None) -> Batch:
        """The next synthetic ``(inputs, targets)`` of ``batch_size`` samples, on the model's device.

        Drawn from the workload's seeded stream, or from ``generator`` when given (the stream is then
        left untouched: :func:`~edgetune.workloads.measure_cost` draws its batch that way).
        """
        batch_size = _check_batch_size(batch_size, "batch size")
        if self.max_batch_size is not None and batch_size > self.max_batch_size:
            raise WorkloadError(f"batch size {batch_size} is larger than the data of workload {self.name!r} "
                                f"({self.max_batch_size} samples); choose at most {self.max_batch_size}")
        inputs, targets = self.batch_source(batch_size, self._generator if generator is None else generator)
        rows = None if self._rows_per_sample is None else self._rows_per_sample * batch_size
        found = _tensors((inputs, targets))
        if rows is not None and found and not any(rows in t.shape for t in found):
            raise WorkloadError(f"make_batch({batch_size}) of workload {self.name!r} returned tensors of shapes "
                                f"{_shapes([tuple(t.shape) for t in found])}: none holds the {batch_size} samples "
                                f"asked for; return batch_size samples, or, where your data holds fewer, give "
                                f"Workload.from_model the most it holds as max_batch_size=")
        device = self.device
        if device.type != "cpu":
            inputs, targets = _to(inputs, device), _to(targets, device)
        return inputs, targets

    def loss(self, batch: Batch) -> Tensor:
        """The training loss of the model on ``batch`` (forward pass only): a tuple or list of inputs is
        unpacked into the model's arguments, a mapping (a tokenizer's output) into its keyword arguments."""
        inputs, targets = batch
        return self.loss_fn(apply_model(self.model, inputs), targets)

    def split_batch(self, batch: Batch, batch_size: int, parts: int) -> list[Batch]:
        """``batch`` of ``batch_size`` samples (from :meth:`make_batch`) cut into ``parts`` equal micro-batches,
        each one that :meth:`loss` takes (gradient accumulation; B_noise's small batches).

        Inputs and targets may be tensors, or tuples, lists and dicts of them (a tokenizer's output): a tensor
        whose first axis is a whole multiple of ``batch_size`` (one row per sample, or per token of a flattened
        sequence) is cut along it; any other leaf (a mask or table shared by the batch, a number) goes whole
        into every part. Raises :class:`WorkloadError` where ``batch_size`` does not split into ``parts``, or
        where the inputs or the targets hold the batch on no tensor's first axis, or on a three-axis tensor's
        second (a sequence-first layout, whose length may be a multiple of the batch).
        """
        if parts < 1 or batch_size % parts:
            raise WorkloadError(f"a batch of {batch_size} does not split into {parts} equal micro-batches")
        inputs, targets = batch
        cut = []
        for what, x in (("inputs", inputs), ("targets", targets)):
            found = _tensors(x)
            seq_first = next((t for t in found if _sequence_first(t, batch_size)), None)
            if seq_first is not None:  # its length a multiple of the batch: cut, each part would hold every sample
                raise WorkloadError(
                    f"workload {self.name!r}: cutting a batch of {batch_size} into {parts} micro-batches needs the "
                    f"samples on the first axis, and a tensor of the {what} of shape "
                    f"{_shapes([tuple(seq_first.shape)])} holds them on its second (sequence-first); put the batch "
                    f"axis first")
            if not any(_holds_batch(t, batch_size) for t in found):
                raise WorkloadError(
                    f"workload {self.name!r}: cutting a batch of {batch_size} into {parts} micro-batches needs "
                    f"the samples on the first axis of a tensor of the {what}, whose shapes are "
                    f"{_shapes([tuple(t.shape) for t in found]) or 'none (no tensor)'}; put the batch axis first")
            cut.append(_split(x, parts, batch_size))
        return list(zip(*cut))

    def train_step(self, batch_size: int) -> float:
        """One real training step (forward, backward, optimizer) on a fresh batch; returns the loss."""
        batch = self.make_batch(batch_size)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        loss.backward()
        self.optimizer.step()
        return float(loss.item())

    @property
    def lr(self) -> float:
        """The learning rate of the optimizer's first parameter group."""
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Set the learning rate; other parameter groups keep their ratio to the first group's rate."""
        if not (lr > 0 and math.isfinite(lr)):
            raise WorkloadError(f"learning rate must be a positive number, got {lr!r}")
        groups = self.optimizer.param_groups
        base = float(groups[0]["lr"])
        for group in groups:
            group["lr"] = lr * (float(group["lr"]) / base) if base > 0 else lr


def _check_batch_size(batch_size: Any, what: str) -> int:
    """:func:`edgetune.power.knobs.check_batch_size`, failing as a :class:`WorkloadError` (what callers of
    workloads catch, the CLI included)."""
    try:
        return check_batch_size(batch_size, what)
    except BatchSizeError as exc:
        raise WorkloadError(str(exc)) from None


def _shapes(shapes: list[tuple[int, ...]]) -> str:
    return ", ".join(str(shape) for shape in shapes)


def _holds_batch(t: Tensor, batch_size: int) -> bool:
    """``t``'s first axis holds the batch's samples: a whole multiple of ``batch_size`` (per sample, or per token
    of a flattened sequence)."""
    return t.ndim >= 1 and t.shape[0] >= batch_size and t.shape[0] % batch_size == 0


def _sequence_first(t: Tensor, batch_size: int) -> bool:
    """``t`` holds the batch on its second axis: a tensor of three or more axes, ``(length, batch, ...)``, whose
    first is not the batch (a recurrent layer's default layout). Its length may be a whole multiple of the batch,
    and :func:`_holds_batch` would then cut the sequence, not the samples. A flattened sequence's tokens are one
    axis (``(batch x length, features)``), so two axes are not judged."""
    return t.ndim >= 3 and t.shape[1] == batch_size and t.shape[0] != batch_size


def _split(x: Any, parts: int, batch_size: int) -> list[Any]:
    """``x`` (a tensor, or tuples, lists and dicts of them) as ``parts`` micro-batches
    (:meth:`Workload.split_batch`)."""
    if isinstance(x, Tensor):
        return list(x.chunk(parts)) if _holds_batch(x, batch_size) else [x] * parts
    if isinstance(x, (tuple, list)):
        columns = [_split(v, parts, batch_size) for v in x]
        return [type(x)(column[i] for column in columns) for i in range(parts)]
    if isinstance(x, Mapping):
        columns = {k: _split(v, parts, batch_size) for k, v in x.items()}
        return [{k: column[i] for k, column in columns.items()} for i in range(parts)]
    return [x] * parts


def _to(x: Any, device: torch.device) -> Any:
    """``x`` (a tensor, or tuples, lists and dicts of them) on ``device``."""
    if isinstance(x, Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to(v, device) for v in x)
    if isinstance(x, Mapping):
        return {k: _to(v, device) for k, v in x.items()}
    return x
