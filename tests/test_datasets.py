"""Your own data as a workload: batches of a map-style torch Dataset (`Workload.from_dataset`,
`dataset_batches`), and batch sizes that stop at the dataset's size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from edgetune.cli import main
from edgetune.power import open_device
from edgetune.search.space import SpaceError, build_space, default_batch_sizes
from edgetune.workloads import Workload, WorkloadError, dataset_batches
from edgetune.workloads.data import _distinct_indices

N = 200


def numbered() -> TensorDataset:
    """Sample i holds the value i in every feature, so a batch tells which samples it drew."""
    x = torch.arange(N, dtype=torch.float32).view(N, 1).repeat(1, 8)
    return TensorDataset(x, torch.arange(N) % 3)


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


class Records(Dataset):
    """A plain Dataset of (tensor, int) samples, as torchvision's datasets give them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((8,), float(i)), i % 3


@pytest.mark.parametrize("count", [3, 64, 150, 200])
def test_a_batch_holds_distinct_samples_drawn_by_the_generator(count: int) -> None:
    make = dataset_batches(numbered())
    x, y = make(count, torch.Generator().manual_seed(7))
    drawn = x[:, 0].long()
    assert x.shape == (count, 8) and y.shape == (count,)
    assert len(set(drawn.tolist())) == count  # no sample twice in one batch, as a shuffling DataLoader
    assert torch.equal(y, drawn % 3)  # inputs and targets of the same samples
    again, _ = make(count, torch.Generator().manual_seed(7))
    other, _ = make(count, torch.Generator().manual_seed(8))
    assert torch.equal(x, again) and not torch.equal(x, other)


def test_distinct_indices_cover_the_data_uniformly() -> None:
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(50)
    for _ in range(2000):
        idx = _distinct_indices(50, 5, g)  # the draw-until-distinct path (5 of 50)
        assert len(set(idx)) == 5 and all(0 <= i < 50 for i in idx)
        counts[idx] += 1
    # each index is drawn 2000 * 5 / 50 = 200 times in expectation; binomial sd about 13
    assert counts.min() > 140 and counts.max() < 260
    assert sorted(_distinct_indices(10, 10, g)) == list(range(10))  # the permutation path


def test_default_collate_joins_tensor_and_int_samples() -> None:
    x, y = dataset_batches(Records(30))(6, torch.Generator().manual_seed(1))
    assert x.shape == (6, 8) and y.dtype == torch.long and torch.equal(y, x[:, 0].long() % 3)


def test_from_dataset_trains_and_stops_its_batches_at_the_dataset_size() -> None:
    w = Workload.from_dataset("numbered", mlp(), Records(N), default_batch_size=32,
                              optimizer=lambda p: torch.optim.SGD(p, lr=1e-3))
    assert w.max_batch_size == N and w.cost.flops_per_sample > 0
    assert w.make_batch(N)[0].shape == (N, 8)  # the whole dataset is one batch
    losses = [w.train_step(32) for _ in range(5)]
    assert all(loss > 0 for loss in losses)
    with pytest.raises(WorkloadError, match=r"^batch size 201 is larger than the data of workload 'numbered' "
                                            r"\(200 samples\); choose at most 200$"):
        w.make_batch(N + 1)
    with pytest.raises(WorkloadError, match="default_batch_size 256 is larger than its data"):
        Workload.from_dataset("numbered", mlp(), Records(N), default_batch_size=256)


def test_a_dataset_smaller_than_the_cost_batch_is_measured_at_its_size() -> None:
    w = Workload.from_dataset("three", mlp(), Records(3), default_batch_size=2)
    assert w.max_batch_size == 3 and w.cost.flops_per_sample > 0


class Stream(IterableDataset):
    def __iter__(self):
        yield from ((torch.zeros(8), 0) for _ in range(10))


class NoLength(Dataset):
    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(8), 0


class Dicts(Records):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x, y = super().__getitem__(i)
        return {"features": x, "label": torch.tensor(y)}


@pytest.mark.parametrize(("dataset", "message"), [
    (Stream(), r"^an IterableDataset has no random access; give a map-style Dataset"),
    (NoLength(), r"^the dataset \(NoLength\) has no length; give a map-style Dataset with __len__"),
    (Records(0), r"^the dataset \(Records\) is empty$"),
])
def test_a_dataset_that_cannot_be_sampled_is_one_line(dataset: Dataset, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        Workload.from_dataset("bad", mlp(), dataset)


def test_samples_that_are_not_input_target_pairs_need_a_collate_fn() -> None:
    with pytest.raises(WorkloadError, match=r"collate to dict, not \(inputs, targets\); give collate_fn="):
        Workload.from_dataset("dicts", mlp(), Dicts(N))

    def collate(items):
        return (torch.stack([d["features"] for d in items]), torch.stack([d["label"] for d in items]))

    w = Workload.from_dataset("dicts", mlp(), Dicts(N), collate_fn=collate)
    assert w.train_step(16) > 0


class KeywordModel(torch.nn.Module):
    """A model called as a tokenizer's output is passed: keyword arguments, an output object with logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()

    def forward(self, features: torch.Tensor, scale: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.net(features * scale[:, None])}


def test_mapping_inputs_are_the_models_keyword_arguments() -> None:
    def collate(items):
        features = torch.stack([d["features"] for d in items])
        return {"features": features, "scale": torch.ones(len(items))}, torch.stack([d["label"] for d in items])

    w = Workload.from_dataset("keywords", KeywordModel(), Dicts(N), collate_fn=collate,
                              loss_fn=lambda out, y: torch.nn.functional.cross_entropy(out["logits"], y))
    inputs, _ = w.make_batch(8)
    assert set(inputs) == {"features", "scale"} and w.train_step(8) > 0
    assert w.cost.input_bytes_per_sample == 8 * 4 + 4 + 8  # features, scale and the label, per sample


def test_the_search_space_stops_at_the_dataset_size() -> None:
    assert default_batch_sizes(32, 200) == (4, 8, 16, 32, 64, 128)
    assert default_batch_sizes(32) == (4, 8, 16, 32, 64, 128, 256)
    device = open_device("sim:orin-nano", compute=False)
    assert build_space(device, 32, None, ["gpu_freq"], max_batch_size=200).batch_sizes[-1] == 128
    with pytest.raises(SpaceError, match=r"^batch sizes \(--batch-sizes, space.batch_sizes\) 256, 512: larger "
                                         r"than the workload's data \(200 samples\); give batch sizes up to 200$"):
        build_space(device, 32, [64, 256, 512], ["gpu_freq"], max_batch_size=200)


USER = """
import torch
from torch.utils.data import TensorDataset
from edgetune.workloads import Workload

def build(seed: int = 0) -> Workload:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(200, 8, generator=g), torch.randint(0, 3, (200,), generator=g))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return Workload.from_dataset("recorded", model, data, default_batch_size=32, seed=seed)
"""


def test_cli_refuses_batch_sizes_beyond_the_data_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "recorded.py").write_text(USER)
    spec = f"{tmp_path / 'recorded.py'}:build"
    argv = ["search", "--device", "sim:orin-nano", "--workload", spec, "--budget", "10",
            "--batch-sizes", "64,256", "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        ("edgetune: error: batch sizes (--batch-sizes, space.batch_sizes) 256: larger than the workload's data "
         "(200 samples); give batch sizes up to 200")]
    assert not (tmp_path / "out").exists()
    assert main(["run", "--device", "sim:orin-nano", "--workload", spec, "--batch-size", "300",
                 "--steps", "2"]) == 2
    assert "batch size 300 is larger than the data of workload 'recorded' (200 samples)" in capsys.readouterr().err
    assert main(["run", "--device", "sim:orin-nano", "--workload", spec, "--batch-size", "200", "--steps", "2",
                 "--json"]) == 0
