"""Config labels and validation, combined techniques, rollback on failure, use after revert."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import (
    CHECKPOINT_HELP,
    OPTIMIZERS,
    PRECISIONS,
    Applied,
    Config,
    apply,
    apply_config,
)

D = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.fc(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def fingerprint(model: nn.Module) -> list[object]:
    """Everything revert must put back: tensors (bits and dtype), objects, forwards, hooks."""
    out: list[object] = []
    for name, t in model.state_dict().items():
        out.append((name, t.dtype, t.clone()))
    out.append([id(p) for p in model.parameters()])
    for m in model.modules():
        out.append(("forward" in m.__dict__, dict(m._forward_pre_hooks), dict(m._forward_hooks)))
    return out


def as_trained(before: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """A pure cast's revert: ``trained`` in ``before``'s dtype, ``before`` where unchanged."""
    changed = trained != before.to(trained.dtype)
    return torch.where(changed, trained.to(before.dtype), before)


def same(a: list[object], b: list[object]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, tuple) and len(x) == 3 and isinstance(x[2], torch.Tensor):
            if not (x[:2] == y[:2] and torch.equal(x[2], y[2])):  # type: ignore[index]
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize(
    ("config", "label"),
    [
        (Config(), "baseline"),
        (
            Config(checkpoint="blocks", precision="bf16-autocast", optimizer="sgd"),
            "ckpt blocks · bf16-autocast · sgd",
        ),
        (Config(checkpoint="blocks", every=2), "ckpt blocks every 2"),
        (Config(checkpoint=r"h\.\d+"), r"ckpt /h\.\d+/"),
        (Config(checkpoint=("a", "b")), "ckpt a,b"),
        (Config(checkpoint=["a", "b", "c"], precision="bf16"), "ckpt 3 modules · bf16"),  # type: ignore[arg-type]
        (Config(optimizer="adafactor"), "adafactor"),
    ],
)
def test_config_labels(config: Config, label: str) -> None:
    assert str(config) == label
    hash(config)  # frozen and hashable: usable as a key for trial rows


def test_config_turns_lists_into_tuples_and_is_frozen() -> None:
    config = Config(checkpoint=["blocks.0"])  # type: ignore[arg-type]
    assert config.checkpoint == ("blocks.0",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.every = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        ({"precision": "fp8"}, PRECISIONS),
        ({"optimizer": "rmsprop"}, OPTIMIZERS),
        ({"checkpoint": 3}, (CHECKPOINT_HELP,)),
        ({"checkpoint": "blocks", "every": -1}, ("positive int",)),
    ],
)
def test_bad_config_names_what_is_allowed(
    kwargs: dict[str, object], allowed: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as err:
        Config(**kwargs)  # type: ignore[arg-type]
    assert all(a in str(err.value) for a in allowed)


def test_combined_step_and_revert() -> None:
    torch.manual_seed(0)
    model = Net().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = fingerprint(model)
    config = Config(checkpoint="blocks", every=2, precision="bf16", optimizer="sgd-momentum")
    applied = apply_config(model, config, opt)
    assert isinstance(applied, Applied) and applied.config == config and not applied.reverted
    assert applied.optimizer is not opt and isinstance(applied.optimizer, torch.optim.SGD)
    assert repr(applied) == "<Applied ckpt blocks every 2 · bf16 · sgd-momentum on Net (active)>"
    x = torch.randn(8, D)
    for _ in range(3):
        with applied.autocast():
            loss = model(x).float().square().mean()
        applied.backward(loss)
        applied.step()
    assert model.head.weight.dtype == torch.bfloat16
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    applied.revert()
    assert applied.reverted and applied.optimizer is opt
    # the objects, forwards and hooks of before; the weights as trained, in their dtypes again
    # (where training left a bf16 value as it was, the fp32 value from before)
    expected = [
        (row[0], row[1], as_trained(row[2], trained[row[0]]))
        if isinstance(row, tuple) and len(row) == 3 and isinstance(row[2], torch.Tensor)
        else row
        for row in before
    ]
    assert same(fingerprint(model), expected) and not same(fingerprint(model), before)
    assert not opt.state  # the replaced optimizer never stepped


def test_apply_and_apply_config_agree() -> None:
    config = Config(checkpoint=("blocks.1",), precision="bf16-autocast", optimizer="adam")
    a = apply(Net(), checkpoint=["blocks.1"], precision="bf16-autocast", optimizer="adam")
    b = apply_config(Net(), config)
    assert a.config == b.config == config
    assert type(a.optimizer) is type(b.optimizer)
    a.revert()
    b.revert()


def test_autocast_precision_trains_with_checkpointing() -> None:
    torch.manual_seed(0)
    model = Net().train()
    applied = apply(model, checkpoint="blocks", precision="bf16-autocast", optimizer="adamw")
    x = torch.randn(8, D)
    with applied.autocast():
        out = model(x)
    assert out.dtype == torch.bfloat16
    applied.backward(out.float().mean())
    grad = model.get_parameter("blocks.0.fc.weight").grad
    assert grad is not None and grad.dtype == torch.float32
    applied.step()
    applied.revert()


def test_failure_half_way_rolls_back() -> None:
    model = Net()
    first = apply(model, checkpoint="blocks")
    before = fingerprint(model)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with pytest.raises(ValueError, match="already checkpointed"):
        apply(model, precision="bf16", checkpoint="blocks")
    with pytest.raises(ValueError, match="already checkpointed"):
        apply(model, precision="fp32", checkpoint=("blocks.0",))
    assert same(fingerprint(model), before)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == flags
    first.revert()


def test_helpers_refuse_after_revert() -> None:
    applied = apply(Net(), precision="bf16-autocast", optimizer="sgd")
    applied.revert()
    for call in (
        applied.autocast,
        applied.step,
        lambda: applied.backward(torch.ones((), requires_grad=True)),
    ):
        with pytest.raises(RuntimeError, match="after revert"):
            call()


def test_bad_objects_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        apply("model", precision="bf16")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"optimizer_obj must be a torch\.optim\.Optimizer"):
        apply(Net(), optimizer="sgd", optimizer_obj="opt")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"config must be a jupyter_gpumem\.techniques\.Config"):
        apply_config(Net(), {"precision": "bf16"})  # type: ignore[arg-type]


def test_replaced_forward_is_left_alone_with_a_warning() -> None:
    model = Net()
    applied = apply(model, checkpoint=("blocks.0",))
    replacement = model.blocks[0].forward
    model.blocks[0].forward = lambda x: x  # type: ignore[method-assign]
    with pytest.warns(UserWarning, match="forward was replaced after checkpointing; left as is"):
        applied.revert()
    assert model.blocks[0].forward is not replacement
