"""Training data for workloads: the built-ins' seeded synthetic images and text, and batches of your dataset.

Each source is a :data:`~edgetune.workloads.core.BatchSource`, ``make_batch(batch_size, generator) ->
(inputs, targets)``, drawing all its randomness from ``generator`` so that one seed gives one stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset, IterableDataset, default_collate

from edgetune.workloads.core import Batch, BatchSource, WorkloadError

__all__ = [
    "IMAGE_NOISE_STD",
    "IMAGE_SHAPE",
    "NUM_CLASSES",
    "TEXT_SENTENCES",
    "VOCAB",
    "dataset_batches",
    "decode",
    "encode",
    "image_batches",
    "image_classes",
    "synthetic_text",
    "text_batches",
]

# ---------------------------------------------------------------------------------------------- images

# (channels, height px, width px) and classes of CIFAR-10, the dataset on-device image training is
# usually benchmarked on: the built-in image workloads see images of its shape.
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
# Side (px) of the coarse random pattern each class prototype is upsampled from: only low spatial
# frequencies, as in natural images.
_PROTOTYPE_GRID_PX = 4
# Standard deviation of the per-pixel noise added to a prototype: the prototypes' own (unit) scale.
IMAGE_NOISE_STD = 1.0


def image_classes(seed: int, num_classes: int = NUM_CLASSES, shape: tuple[int, int, int] = IMAGE_SHAPE) -> Tensor:
    """One smooth, zero-mean, unit-variance prototype image per class.

    Low-frequency 4x4-pixel patterns upsampled to full size, so the classes differ the way natural images do
    (in colour and layout) rather than in single pixels, and convolutions with pooling can tell them apart.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, shape[0], _PROTOTYPE_GRID_PX, _PROTOTYPE_GRID_PX, generator=g)
    fine = F.interpolate(coarse, size=shape[1:], mode="bilinear", align_corners=False)
    return (fine - fine.mean(dim=(1, 2, 3), keepdim=True)) / fine.std(dim=(1, 2, 3), keepdim=True)


def image_batches(prototypes: Tensor, noise: float = IMAGE_NOISE_STD) -> BatchSource:
    """Batches of ``prototype[label] + noise * N(0, 1)``: labelled images a network learns to classify.

    With noise of the same scale as the signal no single pixel gives the class away, so the loss falls
    over many steps (as with real data) instead of collapsing at once.
    """

    def make_batch(batch_size: int, generator: torch.Generator) -> Batch:
        labels = torch.randint(0, prototypes.shape[0], (batch_size,), generator=generator)
        images = prototypes[labels] + noise * torch.randn(
            (batch_size, *prototypes.shape[1:]), generator=generator
        )
        return images, labels

    return make_batch


# ---------------------------------------------------------------------------------------------- text

# The characters a keyboard types: newline and the 95 printable ASCII characters.
VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
_CHAR_INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> Tensor:
    """Character ids of ``text`` in :data:`VOCAB`."""
    try:
        return torch.tensor([_CHAR_INDEX[c] for c in text], dtype=torch.long)
    except KeyError as exc:
        raise WorkloadError(f"character {exc.args[0]!r} is not in the printable-ASCII vocabulary") from None


def decode(ids: Iterable[int]) -> str:
    """The text of character ids in :data:`VOCAB` (the inverse of :func:`encode`)."""
    return "".join(VOCAB[int(i)] for i in ids)


_SUBJECTS = ("the cat", "a dog", "my friend", "the old man", "our teacher", "Alice", "Bob", "the robot")
_VERBS = ("sees", "likes", "finds", "builds", "paints", "follows", "calls", "helps")
_OBJECTS = ("the red ball", "a small house", "the river", "two birds", "the garden", "a blue car",
            "3 apples", "the moon")
_ENDINGS = (".", "!", "?", ", then rests.", " at 9:30.")
# Sentences in the synthetic text: about 62 000 characters (31 a sentence), far more distinct windows than
# a tuning run draws, and built in milliseconds.
TEXT_SENTENCES = 2000


def synthetic_text(seed: int, sentences: int = TEXT_SENTENCES) -> str:
    """A text stream from a tiny grammar: ``<subject> <verb> <object><ending>`` sentences.

    Spelling inside words is deterministic and the next word is drawn from a short list, so a character
    model's loss falls from ln(96) = 4.6 nats towards the grammar's entropy (about 0.5 nats per character).
    """
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        lines.append(sentence[0].upper() + sentence[1:])
    return "\n".join(lines) + "\n"


def text_batches(tokens: Tensor, seq_len: int) -> BatchSource:
    """Random windows of ``seq_len`` characters, each with the window shifted by one as its targets."""

    def make_batch(batch_size: int, generator: torch.Generator) -> Batch:
        starts = torch.randint(0, tokens.numel() - seq_len - 1, (batch_size,), generator=generator)
        windows = torch.stack([tokens[s: s + seq_len + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]

    return make_batch


# ---------------------------------------------------------------------------------------------- your data


def dataset_batches(dataset: Dataset[Any], collate_fn: Callable[[list[Any]], Any] | None = None) -> BatchSource:
    """Batches of distinct samples of a map-style ``dataset``, drawn at random, collated to ``(inputs, targets)``.

    Each batch draws ``batch_size`` different indices from ``generator`` (as a shuffling ``DataLoader`` does
    within an epoch), reads them with ``dataset[i]`` and joins them with ``collate_fn`` (torch's
    ``default_collate`` by default: ``(x, y)`` samples become a batch of ``x`` and a batch of ``y``).

    Raises:
        WorkloadError: an iterable-style dataset, a dataset without ``__len__`` or empty; when a batch is
            drawn, a batch larger than the dataset, or samples that collate to something other than
            ``(inputs, targets)``.
    """
    if isinstance(dataset, IterableDataset):
        raise WorkloadError("an IterableDataset has no random access; give a map-style Dataset (__len__ and "
                            "__getitem__), or write make_batch(batch_size, generator) that reads your stream")
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        raise WorkloadError(f"the dataset ({type(dataset).__name__}) has no length; give a map-style Dataset "
                            f"with __len__ and __getitem__") from None
    if size < 1:
        raise WorkloadError(f"the dataset ({type(dataset).__name__}) is empty")
    collate = default_collate if collate_fn is None else collate_fn

    def make_batch(batch_size: int, generator: torch.Generator) -> Batch:
        if batch_size > size:
            raise WorkloadError(f"batch size {batch_size} is larger than the dataset ({size} samples); "
                                f"choose at most {size}")
        batch = collate([dataset[i] for i in _distinct_indices(size, batch_size, generator)])
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            kind = f"{len(batch)} items" if isinstance(batch, (tuple, list)) else type(batch).__name__
            raise WorkloadError(f"the dataset's samples collate to {kind}, not (inputs, targets); give "
                                f"collate_fn= returning (inputs, targets)")
        return batch[0], batch[1]

    return make_batch


def _distinct_indices(size: int, count: int, generator: torch.Generator) -> list[int]:
    """``count`` different indices below ``size``, in random order, all drawn from ``generator``.

    A permutation where the batch is a large part of the data; otherwise draws until ``count`` differ, which
    costs about ``count`` draws rather than ``size`` (a batch of 64 from a million samples)."""
    if 2 * count >= size:
        return torch.randperm(size, generator=generator)[:count].tolist()
    chosen: dict[int, None] = {}
    while len(chosen) < count:
        for i in torch.randint(0, size, (count - len(chosen),), generator=generator).tolist():
            chosen.setdefault(i)
    return list(chosen)
