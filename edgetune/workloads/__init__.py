"""Training workloads: the built-in models and the user's own, selected by one spec string.

A workload is a model, its optimizer, a loss and a seeded source of batches, plus what one
training step asks of the hardware (:class:`~edgetune.power.base.WorkloadCost`), measured once from the
real model. Everything that tunes or simulates a device drives training through
:meth:`Workload.train_step`, one real forward/backward/optimizer step.

Built-ins (``edgetune run --workload NAME``):

=================  ==========================================================================
``cnn``            small CNN, synthetic CIFAR-shaped images (3x32x32, 10 classes)
``mobilenet``      MobileNetV2-style network (inverted residual blocks), same data, width 0.5
``chartransformer`` character-level GPT: 6 layers, 6 heads, 256-dim embeddings, 64-char context
=================  ==========================================================================

Plugging in your own model
--------------------------
Write a function that returns a :class:`Workload` and give its ``module:function`` spec::

    # my_workload.py (in the current directory, on PYTHONPATH, or installed)
    import torch
    from edgetune.workloads import Workload

    def build(seed: int = 0) -> Workload:
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))

        def make_batch(batch_size: int, generator: torch.Generator):
            x = torch.randn(batch_size, 1, 28, 28, generator=generator)
            y = torch.randint(0, 10, (batch_size,), generator=generator)
            return x, y

        return Workload.from_model("mnist-linear", model, make_batch,
                                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                   default_batch_size=64)

and run ``edgetune run --workload my_workload:build ...`` (a path works too: ``./my_workload.py:build``).
For your own data, any map-style ``torch.utils.data.Dataset`` of ``(inputs, target)`` samples,
``Workload.from_dataset(name, model, dataset, ...)`` draws each batch's samples at random and collates
them; the search's batch sizes stop at the dataset's size.
``make_batch(batch_size, generator)`` returns ``(inputs, targets)`` of ``batch_size`` samples (a batch none
of whose tensors follows the batch size is refused: its cost per sample would be another batch's); draw all
its randomness from
``generator`` so that the same seed gives the same batches. The loss is ``loss_fn(model(inputs), targets)``
(cross-entropy unless you pass ``loss_fn=``); a tuple of inputs is unpacked into the model's arguments, a
dict (a tokenizer's output) into its keyword arguments.
If ``build`` takes a ``seed`` argument it receives the run's seed; either way torch's global generator is
seeded with it while ``build`` runs, so the initial weights are reproducible, and ``from_model`` seeds the
batches with it unless given ``seed=``. ``edgetune run`` and ``search``
seed torch's generators with it again before training, so what the model draws as it trains (dropout's masks)
is the same in every run of one ``--seed``. ``examples/my_workload.py``
is a complete example.

Package layout
--------------
``core``     :class:`Workload`, :class:`WorkloadError`, the batch and loss types
``cost``     :class:`CostMeter` (the one definition of a step's cost, also used by the runtime controller),
             the group-aware FLOP formula, :func:`measure_cost`
``data``     seeded synthetic data (prototype images, grammar text, :func:`encode` / :func:`decode`) and
             :func:`dataset_batches`, batches of your own map-style ``Dataset``
``models``   the built-in models and their ``build_*`` functions, :data:`BUILTIN_WORKLOADS`
``loading``  :func:`load_workload`: built-in names and ``module:function`` specs
``placement`` :func:`place`: where training runs (the processor the power hardware measures)
"""

from edgetune.workloads.core import (
    DEFAULT_BATCH_SIZE,
    Batch,
    BatchSource,
    LossFn,
    OptimizerSpec,
    Workload,
    WorkloadError,
)
from edgetune.workloads.cost import _FLOP_FORMULAS as _FLOP_FORMULAS  # private; imported from here by tests
from edgetune.workloads.cost import CostMeter, measure_cost
from edgetune.workloads.data import (
    IMAGE_NOISE_STD,
    IMAGE_SHAPE,
    NUM_CLASSES,
    TEXT_SENTENCES,
    VOCAB,
    dataset_batches,
    decode,
    encode,
    image_batches,
    image_classes,
    synthetic_text,
    text_batches,
)
from edgetune.workloads.loading import load_workload
from edgetune.workloads.models import (
    BUILTIN_WORKLOADS,
    CHAR_CONTEXT,
    MOBILENET_V2_CIFAR,
    MOBILENET_WIDTH,
    CausalSelfAttention,
    CharTransformer,
    InvertedResidual,
    MobileNetV2,
    SmallCNN,
    TransformerBlock,
    build_chartransformer,
    build_cnn,
    build_mobilenet,
)
from edgetune.workloads.placement import Placement, place

__all__ = [
    "BUILTIN_WORKLOADS",
    "CHAR_CONTEXT",
    "DEFAULT_BATCH_SIZE",
    "IMAGE_NOISE_STD",
    "IMAGE_SHAPE",
    "MOBILENET_V2_CIFAR",
    "MOBILENET_WIDTH",
    "NUM_CLASSES",
    "TEXT_SENTENCES",
    "VOCAB",
    "Batch",
    "BatchSource",
    "CausalSelfAttention",
    "CharTransformer",
    "CostMeter",
    "InvertedResidual",
    "LossFn",
    "MobileNetV2",
    "OptimizerSpec",
    "Placement",
    "SmallCNN",
    "TransformerBlock",
    "Workload",
    "WorkloadError",
    "build_chartransformer",
    "build_cnn",
    "build_mobilenet",
    "dataset_batches",
    "decode",
    "encode",
    "image_batches",
    "image_classes",
    "load_workload",
    "measure_cost",
    "place",
    "synthetic_text",
    "text_batches",
]
