"""What one training step asks of the hardware: :class:`CostMeter`, the FLOP formulas, :func:`measure_cost`.

One definition of a step's :class:`~edgetune.power.base.WorkloadCost`, used twice: :func:`measure_cost`
meters a step of a :class:`~edgetune.workloads.Workload` on a copy of its model when the workload is built,
and the runtime controller meters the user's own first step as it passes (``edgetune.tune`` on the twin).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from edgetune.log import get_logger
from edgetune.power.base import WorkloadCost

if TYPE_CHECKING:
    from edgetune.workloads.core import Workload

__all__ = ["CostMeter", "measure_cost"]

_log = get_logger(__name__)

# Batch size (samples) of the one-off cost measurement: big enough that batch-independent tensors (index
# vectors, scalars) barely move the per-sample figures, small enough that building a workload stays cheap.
_COST_BATCH_SIZE = 4
# The measurement's batch comes from a generator seeded with the workload's seed plus this offset, so it
# neither consumes nor repeats the workload's own batch stream.
_COST_SEED_OFFSET = 0x5EED


def _tensors(batch: Any) -> list[Tensor]:
    """The tensors in a batch (nested tuples, lists and dicts), in order."""
    found, stack = [], [batch]
    while stack:
        x = stack.pop()
        if isinstance(x, Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, Mapping):
            stack.extend(reversed(list(x.values())))
    return found


def _storage_key(t: Tensor) -> tuple[int, int]:
    """Identifies the memory behind ``t``: views of one storage share it."""
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                         _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """FLOPs of ``aten.convolution_backward``: the forward's count for each gradient computed.

    The input gradient is a transposed convolution of the output gradient with the same weights, and the
    weight gradient a convolution of the input with the output gradient: each does exactly the forward's
    multiply-adds. torch's own formula ignores ``groups`` in both (pytorch/pytorch PR #183405), which
    counts a depthwise convolution's backward ``channels`` times over: 6.5x too many training FLOPs for
    MobileNetV2. For ``groups=1`` the two formulas agree.
    """
    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


_FLOP_FORMULAS = {torch.ops.aten.convolution_backward: _conv_backward_flops}

# Elements along each axis of the corner of a frozen weight compared with a saved tensor before the whole
# weight is: two unrelated tensors differ in it (random weights), and it costs nothing beside the full compare.
_CORNER = 8
# The autograd nodes that copy, cast or view one tensor whole: a saved tensor reached from a parameter through
# these alone (autocast's cached bfloat16 weight, its transpose) is a copy of the weight, whatever the batch.
# Not expand: a class token expanded to the batch grows with it.
_COPY_NODES = frozenset({"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0",
                         "UnsafeViewBackward0", "ReshapeAliasBackward0", "CloneBackward0", "AliasBackward0"})


class _Saved:
    """A tensor autograd saved for backward, as :class:`CostMeter` hands it over: while autograd holds it, its
    storage is live activation memory (CPython frees it the moment autograd lets go)."""

    __slots__ = ("_key", "_meter", "tensor")

    def __init__(self, tensor: Tensor, key: tuple[int, int], meter: CostMeter) -> None:
        self.tensor, self._key, self._meter = tensor, key, meter

    def __del__(self) -> None:
        self._meter._release(self._key)


def _same(weight: Tensor, copy: Tensor) -> bool:
    """Whether ``copy`` is ``weight`` cast to its dtype: a corner first, so that a frozen model's many weights of
    one size are not each compared in full with every copy."""
    corner = (slice(0, _CORNER),) * weight.dim()
    return (torch.equal(weight[corner].to(copy.dtype), copy[corner])
            and torch.equal(weight.to(copy.dtype), copy))


def _unpack(saved: Tensor | _Saved) -> Tensor:
    return saved.tensor if isinstance(saved, _Saved) else saved


class CostMeter:
    """Measures what one training step asks of the hardware while the step runs; no extra step is computed.

    The one definition of a step's :class:`~edgetune.power.base.WorkloadCost`, shared by
    :func:`measure_cost` (a step on a copy of a workload) and the runtime controller (the user's own first
    step, as it passes). Between :meth:`start` and :meth:`close` it counts:

    * FLOPs with :class:`torch.utils.flop_counter.FlopCounterMode` and a group-aware convolution backward
      (matrix products, convolutions, attention kernels; elementwise work is not counted);
    * the tensors autograd saves for backward (:func:`torch.autograd.graph.saved_tensors_hooks`), each
      storage once, leaving out the model's parameters and every tensor passed to :meth:`exclude`: the
      activation memory is the most they held at once, the step's peak. Copies of parameters among them
      (mixed precision: autocast's bfloat16 weights, cast again at every use where the weight is frozen)
      do not grow with the batch: they count once, with the gradients, in ``fixed_bytes``. A step of several forward and
      backward passes (LBFGS's closure, gradient accumulation) frees each pass's tensors in its backward,
      so it peaks at one pass, not at their sum; the tensors ``torch.utils.checkpoint`` recomputes in
      backward are its own and not counted (the peak is then the segments' inputs).

    Usage: ``meter = CostMeter(model).start()``; ``input_bytes = meter.exclude(batch)`` before the forward
    pass; forward, backward and ``optimizer.step()``; then ``meter.finish(batch_size, optimizer,
    input_bytes)``. It is also a context manager (``with meter:`` starts and closes it).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._excluded = {_storage_key(p) for p in model.parameters()}
        self._param_ids = {id(p) for p in model.parameters()}
        self._frozen: dict[int, list[Tensor]] = {}  # numel -> frozen parameters: their copies have no history
        for p in model.parameters():
            if not p.requires_grad:
                self._frozen.setdefault(p.numel(), []).append(p)
        self._copies: dict[tuple[int, int], int] = {}  # storage -> bytes of the parameter copies saved
        self._holders: dict[tuple[int, int], int] = {}  # storage -> saved tensors autograd holds on it
        self._live_bytes = 0
        self._peak_bytes = 0
        self._lock = threading.Lock()  # CUDA's autograd threads release what the main thread saved
        self._flops = FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._active = False
        self._started = False

    @property
    def active(self) -> bool:
        """Whether the meter is counting (started and not yet closed)."""
        return self._active

    def start(self) -> CostMeter:
        """Start counting; returns the meter. A meter counts one step: it cannot be restarted."""
        if self._started:
            raise RuntimeError("a CostMeter measures one step; build a new one to measure another")
        self._started = True
        self._flops.__enter__()
        self._hooks.__enter__()
        self._active = True
        return self

    def close(self) -> None:
        """Stop counting (idempotent); what was counted stays for :meth:`finish`."""
        if self._active:
            self._hooks.__exit__(None, None, None)
            self._flops.__exit__(None, None, None)
            self._active = False

    def __enter__(self) -> CostMeter:  # noqa: PYI034 - CostMeter is not subclassed
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _is_param_copy(self, t: Tensor) -> bool:
        """Whether ``t`` is a copy of one of the model's parameters (a cast, a transpose): autocast's weights."""
        fn = t.grad_fn
        if fn is None:  # a frozen weight's cast has no history: compare it with the frozen weights of its size
            if t.requires_grad or not t.is_floating_point() or t.dim() > 2:
                return False
            for p in self._frozen.get(t.numel(), ()):
                views = (p, p.t()) if p.dim() == 2 else (p,)  # a square weight may be saved either way round
                if p.dtype != t.dtype and any(v.shape == t.shape and _same(v, t) for v in views):
                    return True
            return False
        while type(fn).__name__ in _COPY_NODES:
            sources = [f for f, _ in fn.next_functions if f is not None]
            if len(sources) != 1:
                return False
            fn = sources[0]
        return type(fn).__name__ == "AccumulateGrad" and id(fn.variable) in self._param_ids

    def _pack(self, t: Tensor) -> Tensor | _Saved:
        key = _storage_key(t)
        if key in self._excluded:
            return t
        if key in self._copies or self._is_param_copy(t):
            self._copies[key] = key[1]
            return t
        with self._lock:
            held = self._holders.get(key, 0)
            self._holders[key] = held + 1
            if not held:
                self._live_bytes += key[1]
                self._peak_bytes = max(self._peak_bytes, self._live_bytes)
        return _Saved(t, key, self)

    def _release(self, key: tuple[int, int]) -> None:
        """Autograd let go of a saved tensor (its backward ran, or its graph was dropped)."""
        with self._lock:
            held = self._holders.pop(key, 0) - 1
            if held > 0:
                self._holders[key] = held
            elif held == 0:
                self._live_bytes -= key[1]

    def exclude(self, batch: Any) -> float:
        """Count ``batch``'s tensors (nested tuples, lists, dicts) as the step's input, not as activations;
        returns their bytes, a tensor the batch holds twice (token ids as inputs, labels and targets) once."""
        total, seen = 0.0, set()
        for t in _tensors(batch):
            self._excluded.add(_storage_key(t))
            same = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
            if same not in seen:
                seen.add(same)
                total += t.numel() * t.element_size()
        return total

    def finish(self, batch_size: int, optimizer: torch.optim.Optimizer | None, input_bytes: float, *,
               pass_batch_size: int | None = None) -> WorkloadCost:
        """Close the meter and return the step's cost per sample of a ``batch_size`` batch.

        Args:
            batch_size: samples in the measured step.
            optimizer: the optimizer, after its first step (its state is the optimizer's memory), or None.
            input_bytes: bytes of the step's inputs and targets (what :meth:`exclude` returned).
            pass_batch_size: samples of the largest batch one forward pass took, where the step ran several
                (the micro-batches of gradient accumulation): the activation peak is that batch's.
                Default: ``batch_size``.
        """
        self.close()
        params = list(self.model.parameters())
        param_storages = {_storage_key(p) for p in params}
        state_storages: dict[tuple[int, int], int] = {}
        if optimizer is not None:
            for state in optimizer.state.values():
                for value in state.values():
                    if isinstance(value, Tensor) and _storage_key(value) not in param_storages:
                        state_storages[_storage_key(value)] = value.numel() * value.element_size()
        param_bytes = float(sum(p.numel() * p.element_size() for p in params))
        # gradients of the parameters that train (those the step gave one; where none holds one, the step set
        # them to None after its update, those that require one), and the copies of weights saved for backward
        trained = [p for p in params if p.grad is not None] or [p for p in params if p.requires_grad]
        fixed = float(sum(p.numel() * p.element_size() for p in trained) + sum(self._copies.values()))
        return WorkloadCost(
            flops_per_sample=self._flops.get_total_flops() / batch_size,
            param_bytes=param_bytes,
            activation_bytes_per_sample=self._peak_bytes / (pass_batch_size or batch_size),
            input_bytes_per_sample=input_bytes / batch_size,
            optimizer_state_bytes=float(sum(state_storages.values())),
            fixed_bytes=None if fixed == param_bytes else fixed,  # None: a gradient of every parameter
        )


def recompile_after_counting(model: nn.Module) -> None:
    """After a :class:`CostMeter` counted ``model``'s step: where the model runs through torch.compile
    (``torch.compile(model)``, ``model.compile()``), clear torch's compile caches, since dynamo skips for good
    the frames it first meets under a FLOP counter and the model would run eager from then on. Other compiled
    functions compile again once."""
    if hasattr(model, "_orig_mod") or getattr(model, "_compiled_call_impl", None) is not None:
        torch.compiler.reset()


def apply_model(model: nn.Module, inputs: Any) -> Any:
    """``model`` called on a batch's inputs: a tuple or list unpacked into its arguments, a mapping (a
    tokenizer's output) into its keyword arguments, anything else its one argument."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _loss_error(workload: Workload, problem: str) -> Exception:
    from edgetune.workloads.core import WorkloadError  # core imports this module

    return WorkloadError(f"workload {workload.name!r}: {problem}")


def _check_loss(workload: Workload, loss: Any) -> None:
    """A loss that ``backward`` can train from, or a :class:`WorkloadError` naming the fix."""
    if not isinstance(loss, Tensor):
        raise _loss_error(workload, f"loss_fn returned a {type(loss).__name__}, not the loss tensor: return the "
                                    f"tensor (not loss.item()) so that backward can follow it")
    if loss.numel() != 1:
        raise _loss_error(workload, f"loss_fn returned a tensor of shape {tuple(loss.shape)}, not one number: "
                                    f"reduce it (.mean() or .sum())")
    if not loss.requires_grad:
        raise _loss_error(workload, "the loss has no gradient: it is computed under torch.no_grad() or from "
                                    "detached outputs (.detach(), .item(), .numpy()), or no parameter requires "
                                    "a gradient; compute it from the model's outputs with gradients on")


def measure_cost(workload: Workload, batch_size: int = _COST_BATCH_SIZE) -> WorkloadCost:
    """Measure what one training step of ``workload`` asks of the hardware, from the real model.

    One step runs on a copy of the model and optimizer (the workload's own weights, optimizer state and
    batch stream are left untouched) on a batch from a separate generator, counted by a
    :class:`CostMeter`:

    * ``flops_per_sample``: FLOPs of forward + backward counted by :class:`torch.utils.flop_counter.
      FlopCounterMode` (with a group-aware convolution backward), divided by the batch. The counter covers
      matrix products, convolutions and attention kernels, which dominate; elementwise work (activations,
      normalisation, the optimizer's per-parameter update, O(parameters) per step) is not counted.
    * ``activation_bytes_per_sample``: bytes of the tensors autograd saves for backward (seen through
      :func:`torch.autograd.graph.saved_tensors_hooks`), each storage once, parameters and the batch itself
      excluded, divided by the batch.
    * ``param_bytes``: sum of parameter sizes.
    * ``fixed_bytes``: the gradients of the parameters the step gave one, plus the copies of weights saved for
      backward (autocast's); None where that is ``param_bytes`` (every parameter trains, no copies).
    * ``optimizer_state_bytes``: bytes of the state the optimizer holds after one step (SGD momentum:
      one buffer per parameter; Adam: two).
    * ``input_bytes_per_sample``: bytes of one sample's inputs and targets.
    """
    model, optimizer = copy.deepcopy((workload.model, workload.optimizer))  # one memo: optimizer -> copy
    generator = torch.Generator().manual_seed(workload.seed + _COST_SEED_OFFSET)
    inputs, targets = workload.make_batch(batch_size, generator)

    meter = CostMeter(model)
    input_bytes = meter.exclude((inputs, targets))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=[]), meter:
        outputs = apply_model(model, inputs)
        if not isinstance(outputs, Tensor) and workload.loss_fn is F.cross_entropy:
            raise _loss_error(workload, f"the model returns a {type(outputs).__name__}, which the default loss "
                                        f"(cross-entropy) cannot take; pass loss_fn=(outputs, targets) -> loss, "
                                        f"such as lambda out, _: out.loss for a model that computes its loss "
                                        f"(Hugging Face) or lambda out, y: F.cross_entropy(out[0], y) for a tuple")
        loss = workload.loss_fn(outputs, targets)
        _check_loss(workload, loss)
        loss.backward()
    optimizer.step()
    cost = meter.finish(batch_size, optimizer, input_bytes)
    recompile_after_counting(workload.model)
    _log.debug("workload %r: %.1f MFLOP, %.0f activation bytes per sample (measured at batch %d)",
               workload.name, cost.flops_per_sample / 1e6, cost.activation_bytes_per_sample, batch_size)
    return cost
