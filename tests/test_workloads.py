"""Built-in workloads train for real, their FLOP counts match analytic counts, user workloads load."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import edgetune
from edgetune.workloads import (
    _FLOP_FORMULAS,
    BUILTIN_WORKLOADS,
    CostMeter,
    Workload,
    WorkloadError,
    load_workload,
    measure_cost,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread while these tests train: with ``pytest -n 2`` on 2 cores, torch's default of
    one thread per core oversubscribes the machine and its spinning threads made this file 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def builtins() -> dict[str, Workload]:
    return {name: load_workload(name, seed=0) for name in BUILTIN_WORKLOADS}


# ---------------------------------------------------------------------------------------------- training

# (batch size, learning rate, steps): tiny batches so the file stays fast. The image models' learning
# rates are for batch 128; at these batches they are scaled down (the mobilenet's less than linearly:
# with zero-gamma blocks it tolerates it, and learns in fewer steps).
TRAINING = {
    "cnn": (8, 0.1 * 8 / 128, 20),
    "mobilenet": (16, 0.05, 16),
    "chartransformer": (4, None, 15),
}


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builtin_trains_for_real_and_loss_falls(name: str) -> None:
    workload = load_workload(name, seed=0)
    batch_size, lr, steps = TRAINING[name]
    if lr is not None:
        workload.set_lr(lr)
    before = [p.detach().clone() for p in workload.model.parameters()]
    losses = [workload.train_step(batch_size) for _ in range(steps)]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < 0.8 * losses[0], losses
    assert any(not torch.equal(a, b) for a, b in zip(before, workload.model.parameters()))


def test_defaults_follow_common_practice(builtins: dict[str, Workload]) -> None:
    assert {n: w.default_batch_size for n, w in builtins.items()} == {
        "cnn": 128, "mobilenet": 128, "chartransformer": 64}
    assert isinstance(builtins["cnn"].optimizer, torch.optim.SGD)
    assert isinstance(builtins["chartransformer"].optimizer, torch.optim.AdamW)


# ---------------------------------------------------------------------------------------------- FLOPs


def _forward_flops_by_hand(model: nn.Module, example: torch.Tensor) -> tuple[float, float]:
    """2 x multiply-adds of every conv and linear layer, from the layer shapes; and the first layer's."""
    flops: list[float] = []

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            out_positions = output.shape[2] * output.shape[3]
            flops.append(2 * out_positions * module.out_channels * (module.in_channels // module.groups) * kh * kw)
        else:
            flops.append(2 * module.in_features * module.out_features)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        model.eval()
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
        model.train()
    return float(sum(flops)), float(flops[0])


@pytest.mark.parametrize("name", ["cnn", "mobilenet"])
def test_image_model_flops_match_layer_shapes(builtins: dict[str, Workload], name: str) -> None:
    workload = builtins[name]
    forward, first_layer = _forward_flops_by_hand(workload.model, torch.zeros(1, 3, 32, 32))
    # Training is forward + the input gradient + the weight gradient, each as many multiply-adds as the
    # forward; the first layer needs no input gradient (the images do not require grad).
    expected = 3 * forward - first_layer
    assert workload.cost.flops_per_sample == pytest.approx(expected, rel=1e-9)


def test_transformer_flops_match_6n_rule_plus_attention(builtins: dict[str, Workload]) -> None:
    workload = builtins["chartransformer"]
    model = workload.model
    seq, layers, heads, head_dim = 64, 6, 6, 64
    assert (len(model.blocks), model.seq_len) == (layers, seq)
    # N: weights the tokens are multiplied by (every linear layer; embeddings are lookups)
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    rule_of_thumb = 6 * n * seq  # Kaplan et al. 2020: 6 N FLOPs per token to train
    assert rule_of_thumb < workload.cost.flops_per_sample < 1.2 * rule_of_thumb
    # plus attention: QK^T and AV, 2 * seq * (heads * head_dim) multiply-adds each per token and layer
    attention = 3 * 2 * 2 * seq * heads * head_dim * layers * seq
    assert workload.cost.flops_per_sample == pytest.approx(rule_of_thumb + attention, rel=1e-9)


def test_depthwise_convolution_backward_counts_groups() -> None:
    conv = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)
    x = torch.randn(2, 32, 8, 8, requires_grad=True)
    with FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS) as counter:
        conv(x)
    forward = counter.get_total_flops()
    assert forward == 2 * 2 * 8 * 8 * 32 * 9
    with FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS) as counter:
        conv(x).sum().backward()
    assert counter.get_total_flops() == 3 * forward


def test_cost_bytes_are_measured_from_the_model(builtins: dict[str, Workload]) -> None:
    for name, workload in builtins.items():
        cost = workload.cost
        params = list(workload.model.parameters())
        assert cost.param_bytes == sum(p.numel() * 4 for p in params)
        if name == "chartransformer":  # AdamW: two moments per parameter, plus a step counter per tensor
            assert 2 * cost.param_bytes <= cost.optimizer_state_bytes <= 2 * cost.param_bytes + 8 * len(params)
            assert cost.input_bytes_per_sample == 2 * 64 * 8  # 64 int64 ids in, 64 out
        else:  # SGD with momentum: one buffer per parameter
            assert cost.optimizer_state_bytes == cost.param_bytes
            assert cost.input_bytes_per_sample == 3 * 32 * 32 * 4 + 8
        assert cost.activation_bytes_per_sample > 10 * cost.input_bytes_per_sample


def test_activation_bytes_are_per_sample(builtins: dict[str, Workload]) -> None:
    cnn = builtins["cnn"]
    small, large = measure_cost(cnn, batch_size=2), measure_cost(cnn, batch_size=8)
    assert small.activation_bytes_per_sample == pytest.approx(large.activation_bytes_per_sample, rel=0.02)
    assert small.flops_per_sample == pytest.approx(large.flops_per_sample, rel=1e-9)
    # the conv stages' outputs alone (before BN, ReLU, pooling) are saved for backward
    conv_outputs = 4 * (32 * 32 * 32 + 64 * 16 * 16 + 128 * 8 * 8)
    assert large.activation_bytes_per_sample > conv_outputs


def _vectors(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 64, generator=generator), torch.randint(0, 10, (batch_size,), generator=generator)


def test_a_frozen_backbone_holds_no_gradients() -> None:
    # fine-tuning a head (or adapters) on a frozen backbone: the step holds gradients of the head only; two
    # copies of every parameter made a LoRA fine-tune of a 3.2-GB backbone out of memory on the 8-GB Orin
    # Nano twin at every batch size
    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    full = Workload.from_model("full", model(), _vectors).cost
    frozen_model = model()
    frozen_model[:4].requires_grad_(False)
    head = frozen_model[4]
    frozen = Workload.from_model("frozen", frozen_model, _vectors,
                                 optimizer=torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9)).cost
    head_bytes = sum(p.numel() * 4 for p in head.parameters())
    assert frozen.param_bytes == full.param_bytes
    assert frozen.optimizer_state_bytes == head_bytes  # momentum of the head's parameters only
    assert frozen.memory_bytes(0) == frozen.param_bytes + head_bytes + frozen.optimizer_state_bytes
    assert full.memory_bytes(0) == 2 * full.param_bytes + full.optimizer_state_bytes
    assert frozen.flops_per_sample == 2 * (64 * 512 + 512 * 512) + 3 * 2 * 512 * 10 - 2 * 512 * 10  # no backbone backward

    class NoGradBackbone(nn.Module):  # frozen by running the backbone under torch.no_grad() in forward
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                features = self.net[:4](x)
            return self.net[4](features)

    no_grad = Workload.from_model("no-grad", NoGradBackbone(), _vectors).cost
    assert no_grad.flops_per_sample == frozen.flops_per_sample
    assert no_grad.optimizer_state_bytes == head_bytes  # SGD keeps momentum where a gradient came
    assert no_grad.memory_bytes(0) == frozen.memory_bytes(0)  # and holds gradients only there


class _Autocast(nn.Module):
    """An MLP whose forward runs under CPU autocast in bfloat16 (mixed precision), the middle layer frozen or not."""

    def __init__(self, freeze_middle: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        self.net[2].requires_grad_(not freeze_middle)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.net(x).float()


@pytest.mark.parametrize("freeze_middle", [False, True])
def test_autocasts_copies_of_the_weights_are_held_once_not_per_sample(freeze_middle: bool) -> None:
    # autocast saves bfloat16 copies of the weights for backward: counted as activations, measured on a batch
    # of 4, they came back 4 times over per sample, 16x the copies at batch 64 (a model's whole weights 8x over)
    workload = Workload.from_model("bf16", _Autocast(freeze_middle), _vectors)
    costs = [measure_cost(workload, batch_size) for batch_size in (2, 4, 16)]
    per_sample = [cost.activation_bytes_per_sample for cost in costs]
    assert max(per_sample) < 1.01 * min(per_sample)
    assert per_sample[1] < 2 * (1024 + 1024 + 64 + 10) * 2 + 64  # the bfloat16 tensors of one sample, and then some
    copies = 2 * (1024 * 1024 + 1024 * 10)  # the bfloat16 weights of the layers whose input gets a gradient
    trained = sum(p.numel() * 4 for p in workload.model.parameters() if p.requires_grad)
    assert costs[1].memory_bytes(0) == costs[1].param_bytes + trained + copies + costs[1].optimizer_state_bytes


def _mlp_step_cost(optimizer_cls, **options):
    """The CostMeter's figures for one optimizer step of a small MLP on a batch of 16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = optimizer_cls(model.parameters(), **options)
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    evaluations = []

    def closure():
        evaluations.append(1)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    meter = CostMeter(model).start()
    input_bytes = meter.exclude((x, y))
    opt.step(closure)
    return meter.finish(16, opt, input_bytes), len(evaluations)


def test_a_closure_optimizer_holds_one_evaluations_activations_at_a_time():
    """LBFGS evaluates its closure several times per step: the FLOPs add up, the memory does not (each
    backward frees its pass's tensors). Summed, the twin would take 10-20x the memory and refuse batches that
    fit."""
    sgd, once = _mlp_step_cost(torch.optim.SGD, lr=0.1)
    lbfgs, evaluations = _mlp_step_cost(torch.optim.LBFGS, max_iter=8)
    assert once == 1 and evaluations > 3
    assert lbfgs.activation_bytes_per_sample == sgd.activation_bytes_per_sample > 0
    assert lbfgs.flops_per_sample == pytest.approx(evaluations * sgd.flops_per_sample, rel=0.01)


def test_accumulated_micro_batches_peak_at_one_micro_batch(builtins: dict[str, Workload]) -> None:
    """A first step of four micro-batches of 8 (gradient accumulation through ``tuner.loader``) holds one
    micro-batch's activations at a time: per sample, the figure of one batch of 8."""
    workload = load_workload("cnn", seed=0)
    x, y = workload.make_batch(32)
    with edgetune.tune(workload.model, workload.optimizer, dataset=TensorDataset(x, y), batch_size=8,
                       budget_w=15, device="sim:orin-nano", online=False, print_summary=False) as tuner:
        for i, batch in enumerate(tuner.loader):
            workload.loss(batch).backward()
            if i % 4 == 3:
                workload.optimizer.step()
                workload.optimizer.zero_grad()
    assert tuner.steps == 1 and tuner.summary.samples == 32
    expected = builtins["cnn"].cost.activation_bytes_per_sample
    assert tuner.cost.activation_bytes_per_sample == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_runtime_measures_the_cost_measure_cost_measures(builtins: dict[str, Workload], name: str) -> None:
    """``edgetune.tune`` on the twin measures the step's cost from the user's first real step: the same
    figure as :func:`measure_cost` (the twin times every step by it), depthwise convolutions included."""
    workload = load_workload(name, seed=0)
    x, y = workload.make_batch(8)
    with edgetune.tune(workload.model, workload.optimizer, dataset=TensorDataset(x, y), batch_size=8,
                       budget_w=15, device="sim:orin-nano", online=False, print_summary=False) as tuner:
        for bx, by in tuner.loader:
            workload.optimizer.zero_grad()
            workload.loss((bx, by)).backward()
            workload.optimizer.step()
    assert tuner.steps == 1
    expected = builtins[name].cost
    assert tuner.cost.flops_per_sample == pytest.approx(expected.flops_per_sample, rel=0.01)
    assert tuner.cost.param_bytes == expected.param_bytes
    assert tuner.cost.optimizer_state_bytes == expected.optimizer_state_bytes
    assert tuner.cost.input_bytes_per_sample == expected.input_bytes_per_sample


# ---------------------------------------------------------------------------------------------- determinism


def test_same_seed_same_weights_batches_and_losses() -> None:
    a, b, c = load_workload("cnn", seed=7), load_workload("cnn", seed=7), load_workload("cnn", seed=8)
    for (name, pa), pb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.state_dict()["features.0.weight"], c.model.state_dict()["features.0.weight"])
    xa, ya = a.make_batch(4)
    xb, yb = b.make_batch(4)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert [a.train_step(4) for _ in range(3)] == [b.train_step(4) for _ in range(3)]
    assert a.cost == b.cost


def test_loading_and_measuring_leave_global_rng_and_weights_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    workload = load_workload("chartransformer", seed=0)
    assert torch.equal(torch.rand(3), expected)
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    measure_cost(workload)
    assert all(torch.equal(before[k], v) for k, v in workload.model.state_dict().items())
    assert not workload.optimizer.state


def test_text_stream_is_learnable_printable_text(builtins: dict[str, Workload]) -> None:
    from edgetune.workloads import VOCAB, decode

    assert len(VOCAB) == 96
    x, y = builtins["chartransformer"].batch_source(2, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (2, 64)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next characters
    text = decode(x[0].tolist())
    assert any(word in text for word in ("the", "sees", "likes", "finds", "helps", "moon", "garden"))


# ---------------------------------------------------------------------------------------------- lr, batch size


def test_set_lr_keeps_group_ratios() -> None:
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD([{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}])
    workload = Workload.from_model(
        "two-groups", model, lambda b, g: (torch.randn(b, 4, generator=g), torch.randint(0, 2, (b,), generator=g)),
        optimizer=optimizer)
    workload.set_lr(0.5)
    assert workload.lr == 0.5
    assert optimizer.param_groups[1]["lr"] == pytest.approx(0.05)
    with pytest.raises(WorkloadError):
        workload.set_lr(0.0)


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8"])
def test_bad_batch_size_is_one_line_workload_error(builtins: dict[str, Workload], batch_size: object) -> None:
    # the shared check (edgetune.power.knobs.check_batch_size), raised as the WorkloadError callers catch
    with pytest.raises(WorkloadError, match="^batch size must be a positive whole number") as info:
        builtins["cnn"].train_step(batch_size)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    with pytest.raises(WorkloadError, match="^default_batch_size must be a positive whole number"):
        Workload.from_model("bad", nn.Linear(4, 2), lambda b, g: (torch.randn(b, 4), torch.zeros(b, dtype=torch.long)),
                            default_batch_size=batch_size)  # type: ignore[arg-type]


def _linear_workload(**kwargs: object) -> Workload:
    return Workload.from_model(
        "linear", nn.Linear(4, 2),
        lambda b, g: (torch.randn(b, 4, generator=g), torch.randint(0, 2, (b,), generator=g)), **kwargs)


def test_b_noise_is_optional_samples() -> None:
    assert _linear_workload().b_noise is None  # nobody measured it
    assert _linear_workload(b_noise=256).b_noise == 256.0
    for bad in (0, -5.0, float("nan"), float("inf"), "256", True):
        with pytest.raises(WorkloadError, match="b_noise must be a positive number of samples or None") as info:
            _linear_workload(b_noise=bad)
        assert "\n" not in str(info.value)


def test_whole_number_batch_size_is_accepted(builtins: dict[str, Workload]) -> None:
    inputs, targets = builtins["cnn"].make_batch(4.0)  # type: ignore[arg-type]
    assert inputs.shape[0] == targets.shape[0] == 4


# ---------------------------------------------------------------------------------------------- user workloads

USER_MODULE = """
import torch
from edgetune.workloads import Workload

calls = []

def make_batch(batch_size, generator):
    return torch.randn(batch_size, 8, generator=generator), torch.randint(0, 3, (batch_size,), generator=generator)

def build(seed=0):
    calls.append(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return Workload.from_model("tiny-mlp", model, make_batch, default_batch_size=16, seed=seed)

def build_without_seed():
    return build()

def build_forgets_the_seed(seed=0):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return Workload.from_model("tiny-mlp", model, make_batch, default_batch_size=16)

def build_pins_the_seed(seed=0):
    model = torch.nn.Linear(8, 3)
    return Workload.from_model("pinned", model, make_batch, seed=42)

def build_tuple():
    model = torch.nn.Linear(8, 3)
    return model, make_batch, torch.nn.functional.cross_entropy

def build_fails():
    raise RuntimeError("dataset folder missing\\nsecond line")

def build_wrong_batch():
    model = torch.nn.Linear(8, 3)
    return Workload.from_model("bad", model, lambda batch_size: torch.zeros(batch_size, 8))

NOT_A_FUNCTION = 3
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"edgetune_test_user_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_example_workload_loads_from_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    # the console script does not put the current directory on sys.path; loading must still find it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(REPO))])
    monkeypatch.delitem(sys.modules, "examples.my_workload", raising=False)
    monkeypatch.delitem(sys.modules, "examples", raising=False)
    workload = load_workload("examples.my_workload:build", seed=1)
    assert workload.name == "har-cnn1d" and workload.cost.flops_per_sample > 0
    losses = [workload.train_step(16) for _ in range(30)]
    assert sum(losses[-3:]) / 3 < 0.8 * losses[0]
    by_path = load_workload("examples/my_workload.py:build", seed=1)
    assert all(torch.equal(p, q) for p, q in zip(by_path.model.state_dict().values(),
                                                  load_workload("examples.my_workload:build", seed=1)
                                                  .model.state_dict().values()))
    assert str(REPO) not in sys.path  # the current directory is on sys.path only while loading


def test_user_workload_from_a_module_on_sys_path(user_module: str) -> None:
    workload = load_workload(f"{user_module}:build", seed=5)
    assert sys.modules[user_module].calls == [5]
    assert workload.name == "tiny-mlp" and workload.default_batch_size == 16
    assert workload.cost.flops_per_sample == 3 * 2 * (8 * 16 + 16 * 3) - 2 * 8 * 16  # no grad for inputs
    assert math.isfinite(workload.train_step(4))
    again = load_workload(f"{user_module}:build_without_seed", seed=5)  # seeded globally while it runs
    assert all(torch.equal(p, q) for p, q in zip(again.model.parameters(), load_workload(
        f"{user_module}:build_without_seed", seed=5).model.parameters()))


def test_a_builder_that_does_not_pass_the_seed_on_still_draws_the_runs_batches(user_module: str) -> None:
    # the module docstring's own example leaves seed= out of from_model: every --seed drew the same batches,
    # and the B_noise warm-ups said to run on fresh batches ran on one stream
    one, two, again = (load_workload(f"{user_module}:build_forgets_the_seed", seed=s) for s in (1, 2, 1))
    assert (one.seed, two.seed) == (1, 2)
    assert not torch.equal(one.make_batch(4)[0], two.make_batch(4)[0])
    assert torch.equal(again.make_batch(4)[0], load_workload(f"{user_module}:build_forgets_the_seed",
                                                             seed=1).make_batch(4)[0])
    assert load_workload(f"{user_module}:build_pins_the_seed", seed=3).seed == 42  # a seed given is kept
    assert Workload.from_model("outside", nn.Linear(8, 3), sys.modules[user_module].make_batch).seed == 0


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (":nope", "has no function 'nope'; did you mean 'build'"),
        (":NOT_A_FUNCTION", "names a int, not a function"),
        (":build_tuple", "returned tuple, not a Workload; build one with edgetune.workloads.Workload.from_model"),
        (":build_fails", "failed: RuntimeError: dataset folder missing second line"),
        (":build_wrong_batch", "one training step on a batch of 4 failed: TypeError"),
    ],
)
def test_bad_user_workload_is_one_line(user_module: str, suffix: str, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload(user_module + suffix)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def build(:\n    pass\n", "SyntaxError"),
        ("import edgetune_no_such_dependency\n", "ModuleNotFoundError: No module named 'edgetune_no_such_dependency'"),
        ("raise RuntimeError('bad\\nconfig')\n", "RuntimeError: bad config"),
    ],
)
def test_module_that_fails_to_import_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 source: str, message: str) -> None:
    name = f"edgetune_broken_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkloadError) as info:
        load_workload(f"{name}:build")
    assert str(info.value).startswith(f"cannot import '{name}' for workload '{name}:build': ")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cnnn", "unknown workload 'cnnn'; did you mean 'cnn'? built-in workloads: cnn, mobilenet, chartransformer"),
        ("transformer", "did you mean 'chartransformer'?"),
        ("resnet50", ("unknown workload 'resnet50'; built-in workloads: cnn, mobilenet, chartransformer; "
                     "or give module:function")),
        ("", "workload spec must be a name or module:function"),
        ("edgetune_no_such_module:build", ("ModuleNotFoundError: No module named 'edgetune_no_such_module'; run "
                                           "edgetune from the folder that holds it, add that folder to PYTHONPATH, "
                                           "or give path/to/file.py:function")),
        ("missing_file.py:build", "FileNotFoundError: no such file 'missing_file.py'"),
        (":build", "is not module:function"),
        ("examples.my_workload:", "is not module:function"),
    ],
)
def test_bad_spec_is_one_line_workload_error(spec: str, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload(spec)
    assert isinstance(info.value, ValueError)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_file_workload_imports_its_sibling_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `python my.py` puts my.py's folder on sys.path: a training script's `from model import Net` works there,
    # and must work where edgetune loads the same file by path, from another directory
    folder = tmp_path / "my project"
    folder.mkdir()
    (folder / "edgetune_sibling_net.py").write_text("import torch\nNet = lambda: torch.nn.Linear(8, 3)\n")
    (folder / "train me.py").write_text(USER_MODULE.replace(
        "import torch\n", "import torch\nfrom edgetune_sibling_net import Net\n", 1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "edgetune_sibling_net", raising=False)
    path_before = list(sys.path)
    workload = load_workload("my project/train me.py:build", seed=3)
    assert workload.name == "tiny-mlp" and "edgetune_sibling_net" in sys.modules
    assert sys.path == path_before  # on sys.path only while loading, as the current directory is
    sys.modules.pop("edgetune_sibling_net")


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))


def _images(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch_size, 1, 28, 28, generator=generator), torch.randint(0, 10, (batch_size,), generator=generator)


def test_a_batch_that_ignores_the_batch_size_is_refused_not_measured() -> None:
    # make_batch returning 32 samples whatever it is asked for: the cost of 32 samples divided by 4 was taken
    # for one sample's, 8x too many FLOPs and activation bytes, and the twin timed every batch size from it
    def fixed(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(32, 1, 28, 28, generator=generator), torch.randint(0, 10, (32,), generator=generator)

    with pytest.raises(WorkloadError) as info:
        Workload.from_model("fixed", _mlp(), fixed)
    assert ("make_batch(4) and make_batch(8) return tensors of shapes (32, 1, 28, 28), (32,) and (32, 1, 28, 28), "
            "(32,), none of whose sizes follows the batch size") in str(info.value)
    assert "return batch_size samples" in str(info.value) and "\n" not in str(info.value)


def test_a_batch_short_of_the_batch_size_fails_the_step_that_asks_for_it() -> None:
    # slicing a fixed tensor of 100 samples: right up to 100, then 100 samples where 128 are asked for, a
    # step the twin timed as 128 samples'
    data, labels = torch.randn(100, 1, 28, 28), torch.randint(0, 10, (100,))

    def sliced(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return data[:batch_size], labels[:batch_size]

    workload = Workload.from_model("sliced", _mlp(), sliced)
    assert workload.cost.flops_per_sample == 3 * 2 * (784 * 64 + 64 * 10) - 2 * 784 * 64
    assert math.isfinite(workload.train_step(100))
    with pytest.raises(WorkloadError, match=r"make_batch\(128\) of workload 'sliced' returned tensors of shapes "
                                            r"\(100, 1, 28, 28\), \(100,\): none holds the 128 samples asked for"):
        workload.train_step(128)
    bounded = Workload.from_model("sliced", _mlp(), sliced, max_batch_size=100)
    with pytest.raises(WorkloadError, match="larger than the data"):
        bounded.train_step(128)


def test_batches_whose_axes_follow_the_batch_size_are_measured_per_sample() -> None:
    # two views per sample (contrastive pairs), token ids padded to a length that varies, a dict of inputs
    def pairs(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(2 * batch_size, 1, 28, 28, generator=generator),
                torch.randint(0, 10, (2 * batch_size,), generator=generator))

    one = Workload.from_model("one", _mlp(), lambda b, g: (torch.randn(b, 1, 28, 28, generator=g),
                                                           torch.randint(0, 10, (b,), generator=g)))
    two = Workload.from_model("two", _mlp(), pairs)
    assert two.cost.flops_per_sample == pytest.approx(2 * one.cost.flops_per_sample)
    assert math.isfinite(two.train_step(16))

    class Tokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(50, 8), nn.Linear(8, 50)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(input_ids) * attention_mask.unsqueeze(-1))

    def padded(batch_size: int, generator: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        length = int(torch.randint(3, 9, (1,), generator=generator))
        ids = torch.randint(0, 50, (batch_size, length), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones(batch_size, length)}, ids

    tokens = Workload.from_model("tokens", Tokens(), padded,
                                 loss_fn=lambda out, ids: nn.functional.cross_entropy(out.flatten(0, 1), ids.flatten()))
    assert math.isfinite(tokens.train_step(5))


def test_an_optimizer_over_another_models_parameters_is_refused() -> None:
    # built over a second instance of the net: the steps ran, the loss never fell, the optimizer's state (and
    # so the memory) was measured as none
    with pytest.raises(WorkloadError) as info:
        Workload.from_model("other", _mlp(), _images, optimizer=torch.optim.Adam(_mlp().parameters()))
    assert "the optimizer updates none of the model's parameters" in str(info.value)
    assert "model.parameters()" in str(info.value) and "\n" not in str(info.value)


class _ModelOutput:
    """What a Hugging Face model returns: an object with the loss it computed and the logits."""

    def __init__(self, loss: torch.Tensor, logits: torch.Tensor) -> None:
        self.loss, self.logits = loss, logits


class _ComputesItsLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor) -> _ModelOutput:
        logits = self.net(pixels)
        return _ModelOutput(nn.functional.cross_entropy(logits, labels), logits)


def _pixels_and_labels(batch_size: int, generator: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    pixels, labels = _images(batch_size, generator)
    return {"pixels": pixels, "labels": labels}, labels


def _no_grad_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return nn.functional.cross_entropy(outputs, targets)


@pytest.mark.parametrize(
    ("model", "batches", "loss_fn", "message"),
    [
        (_mlp, _images, lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"),
         "loss_fn returned a tensor of shape (4,), not one number: reduce it (.mean() or .sum())"),
        (_mlp, _images, lambda out, y: nn.functional.cross_entropy(out, y).item(),
         "loss_fn returned a float, not the loss tensor: return the tensor (not loss.item())"),
        (_mlp, _images, _no_grad_loss, "the loss has no gradient"),
        (_ComputesItsLoss, _pixels_and_labels, None,
         "the model returns a _ModelOutput, which the default loss (cross-entropy) cannot take; pass loss_fn="),
    ],
)
def test_a_loss_that_cannot_train_is_refused_with_the_fix(model, batches, loss_fn, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        Workload.from_model("bad-loss", model(), batches, **({} if loss_fn is None else {"loss_fn": loss_fn}))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_losses_that_train_are_taken_as_they_are() -> None:
    # a 1-element loss, a summed loss, a model that computes its own loss (Hugging Face: out.loss)
    for loss_fn in (lambda out, y: nn.functional.cross_entropy(out, y).reshape(1),
                    lambda out, y: nn.functional.cross_entropy(out, y, reduction="sum")):
        assert math.isfinite(Workload.from_model("ok", _mlp(), _images, loss_fn=loss_fn).train_step(8))
    hf = Workload.from_model("hf", _ComputesItsLoss(), _pixels_and_labels, loss_fn=lambda out, _: out.loss)
    assert hf.cost.flops_per_sample == Workload.from_model("plain", _mlp(), _images).cost.flops_per_sample


def test_a_training_script_that_parses_its_command_line_at_import_loads_with_its_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # argparse at module level read edgetune's own command line: the script's usage and "unrecognized arguments:
    # run --device ...", exit 2, and no word of edgetune's
    (tmp_path / "train.py").write_text(USER_MODULE.replace("calls = []\n", (
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--hidden', type=int, default=16)\n"
        "args = parser.parse_args()\n"
        "calls = []\n"), 1))
    monkeypatch.setattr(sys, "argv", ["edgetune", "run", "--device", "sim:orin-nano", "--workload", "train.py:build"])
    workload = load_workload(f"{tmp_path / 'train.py'}:build")
    assert workload.name == "tiny-mlp"
    assert sys.argv[1:3] == ["run", "--device"]  # put back


def test_a_builder_that_exits_or_needs_arguments_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "builders.py").write_text(USER_MODULE + (
        "def build_exits(seed=0):\n"
        "    import sys\n"
        "    sys.exit('no GPU found')\n"
        "def build_wide(width, seed=0):\n"
        "    return build(seed)\n"))
    with pytest.raises(WorkloadError) as info:
        load_workload(f"{tmp_path / 'builders.py'}:build_exits")
    assert "exited (SystemExit: no GPU found)" in str(info.value)
    with pytest.raises(WorkloadError) as info:
        load_workload(f"{tmp_path / 'builders.py'}:build_wide")
    assert "build_wide' needs width, which edgetune cannot give (it passes seed= only): give it a default" \
        in str(info.value)


def test_a_tensor_the_batch_holds_twice_is_one_input() -> None:
    # a causal LM as Hugging Face trains it: the token ids are the inputs, the labels and the targets, one
    # tensor: counted three times, the twin loaded and moved 3x the bytes the batch holds
    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = nn.Embedding(100, 32), nn.Linear(32, 100)

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> _ModelOutput:
            logits = self.head(self.embed(input_ids))
            return _ModelOutput(nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()), logits)

    def ids(batch_size: int, generator: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        tokens = torch.randint(0, 100, (batch_size, 128), generator=generator)
        return {"input_ids": tokens, "labels": tokens}, tokens

    workload = Workload.from_model("lm", LM(), ids, loss_fn=lambda out, _: out.loss)
    assert workload.cost.input_bytes_per_sample == 128 * 8


def test_builtin_names_are_case_insensitive() -> None:
    assert load_workload("CNN").name == "cnn"


def test_builtins_carry_the_b_noise_measured_by_convergence_truth() -> None:
    # the value stored with each workload is the one experiments/convergence_truth.py measured and wrote
    from edgetune.predictors.convergence import load_b_noise

    measured = load_b_noise(REPO / "experiments" / "data" / "convergence" / "b_noise.csv")
    for name in ("cnn", "mobilenet", "chartransformer"):
        workload = load_workload(name)
        assert workload.b_noise == pytest.approx(measured[name].b_noise, rel=0.01), name
        assert measured[name].warmup_batch == workload.default_batch_size


# ---------------------------------------------------------------------------------------------- placement


def test_to_moves_the_model_and_the_optimizer_state_in_place() -> None:
    cnn = load_workload("cnn", seed=0)
    cnn.train_step(4)  # SGD with momentum: a momentum buffer per parameter
    assert cnn.to("meta") is cnn and cnn.device == torch.device("meta")
    # the optimizer still steps the model's own parameters (moving to meta replaces them), its state with them
    params = list(cnn.model.parameters())
    assert [id(p) for p in cnn.optimizer.param_groups[0]["params"]] == [id(p) for p in params]
    assert [id(p) for p in cnn.optimizer.state] == [id(p) for p in params]
    buffers = [s["momentum_buffer"] for s in cnn.optimizer.state.values()]
    assert buffers and all(b.device == torch.device("meta") for b in buffers)
    inputs, targets = cnn.make_batch(2)  # batches follow the model
    assert inputs.device == targets.device == torch.device("meta")


def test_adam_step_counters_stay_where_torch_keeps_them() -> None:
    model = nn.Linear(4, 2)
    work = Workload.from_model("linear", model, lambda b, g: (torch.randn(b, 4, generator=g),
                                                             torch.randint(0, 2, (b,), generator=g)),
                               optimizer=torch.optim.Adam(model.parameters()))
    work.train_step(3)
    work.to("meta")
    state = next(iter(work.optimizer.state.values()))
    assert state["exp_avg"].device == torch.device("meta") and state["step"].device == torch.device("cpu")


def _compute(device: str | None, why: str = ""):
    from edgetune.power.base import ComputeDevice

    return ComputeDevice(device, why)


def test_auto_places_training_where_the_device_measures() -> None:
    from edgetune.workloads.placement import place

    placed = place("auto", _compute("cpu"), "rapl")
    assert placed.torch_device == torch.device("cpu") and placed.note is None
    with pytest.raises(WorkloadError) as err:
        place("auto", _compute(None, "GPU-1 is hidden from CUDA by CUDA_VISIBLE_DEVICES"), "nvml:GPU-1")
    assert str(err.value).startswith("nvml:GPU-1: GPU-1 is hidden from CUDA") and "--torch-device cuda:<n>" in str(err.value)
    for wrong in ("gpu0", "meta", "cuda:x"):  # meta is a torch device, but holds no data to train on
        with pytest.raises(WorkloadError, match=rf"--torch-device {wrong}: not a torch device that trains; use auto"):
            place(wrong, _compute("cpu"), "rapl")
    assert place("CPU", _compute("cpu"), "rapl").torch_device == torch.device("cpu")  # as torch spells it, or not


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA build of torch: the CPU build's refusal is not reached")
def test_a_cpu_build_of_torch_on_a_gpu_device_is_refused_with_the_fix() -> None:
    from edgetune.workloads.placement import place

    with pytest.raises(WorkloadError) as err:
        place("auto", _compute("cuda:0"), "jetson")
    message = str(err.value)
    assert "\n" not in message and message.startswith("jetson measures its GPU (cuda:0), where training must run")
    assert f"this PyTorch ({torch.__version__}) cannot use CUDA" in message
    assert "NVIDIA's wheel for your JetPack" in message and "--torch-device cpu" in message
    with pytest.raises(WorkloadError, match=r"^--torch-device cuda:1, but this PyTorch .* cannot use CUDA"):
        place("cuda:1", _compute("cpu"), "rapl")
    # NVML measures the GPU alone: training on the CPU there is no way out, another device is
    from edgetune.power.base import ComputeDevice

    with pytest.raises(WorkloadError) as err:
        place("auto", ComputeDevice("cuda:0", measures_cpu=False), "nvml:0")
    assert "--torch-device cpu" not in str(err.value)
    assert str(err.value).endswith("or, to tune training on the CPU, open a device that measures the CPU "
                                   "(--device rapl on x86)")


def test_training_elsewhere_than_measured_is_allowed_and_noted() -> None:
    from edgetune.workloads.placement import place

    placed = place("cpu", _compute("cuda:0"), "jetson")
    assert placed.torch_device == torch.device("cpu")
    assert placed.note == ("note: training on the CPU (--torch-device cpu), not on jetson's GPU (cuda:0): the GPU's "
                           "knobs change nothing in the training step")
    from edgetune.power.base import ComputeDevice

    placed = place("cpu", ComputeDevice("cuda:0", measures_cpu=False), "nvml:0")
    assert placed.note == ("note: training on the CPU (--torch-device cpu), not on nvml:0's GPU (cuda:0), which is "
                           "all it measures: the power measured is not the training's")
    assert place("cpu", _compute("cpu"), "sim:orin-nano", simulated=True).note is None  # the twin models the step
    assert place("cpu", _compute("cuda:0"), "sim:orin-nano", simulated=True).note is None


def test_a_compiled_model_still_compiles_after_its_cost_is_measured() -> None:
    """measure_cost counts FLOPs under a dispatch mode, which makes torch.compile skip the frames it meets for
    good; the workload's compiled model must compile when it trains (before: eager for the whole search)."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
                          backend="eager")

    def make_batch(batch_size: int, generator: torch.Generator):
        return torch.randn(batch_size, 8, generator=generator), torch.randint(0, 3, (batch_size,), generator=generator)

    workload = Workload.from_model("compiled", model, make_batch, default_batch_size=16)
    counters.clear()
    for _ in range(3):
        workload.train_step(16)
    assert workload.cost.flops_per_sample > 0 and counters["stats"]["unique_graphs"] >= 1
    torch.compiler.reset()
