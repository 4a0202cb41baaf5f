"""Activation offloading: hooks on the targets' forwards, composed with the hooks beneath,
the same gradients, and everything back bit for bit.

This machine's tests have no GPU: where a test needs tensors moved, CPU tensors stand for a
device's (``STAYS`` without "cpu"), so every saved tensor is copied and brought back.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config, apply_config, offloading
from jupyter_gpumem.techniques.offloading import NO_EFFECT, OnHost, offloaded
from tests.unit.test_techniques_applied import D, Net


@pytest.fixture
def cpu_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors stand for a GPU's: offloading copies them and brings them back."""
    monkeypatch.setattr(offloading, "STAYS", ("meta",))


def _hooks(model: nn.Module) -> list[object]:
    return [
        (
            name,
            dict(m._forward_pre_hooks),
            dict(m._forward_hooks),
            dict(m._forward_hooks_always_called),
            "forward" in m.__dict__,
        )
        for name, m in model.named_modules()
    ]


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "tensors": {k: v.clone() for k, v in model.state_dict().items()},
        "ids": [id(p) for p in model.parameters()],
        "grads": [p.grad.clone() for p in model.parameters() if p.grad is not None],
        "opt": [{k: v.clone() for k, v in s.items()} for s in opt.state.values()],
        "hooks": _hooks(model),
        "rng": (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()),
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["tensors"].keys() == b["tensors"].keys()
    assert all(torch.equal(v, b["tensors"][k]) for k, v in a["tensors"].items())
    assert a["ids"] == b["ids"] and a["hooks"] == b["hooks"]
    assert all(torch.equal(x, y) for x, y in zip(a["grads"], b["grads"], strict=True))
    for s, t in zip(a["opt"], b["opt"], strict=True):
        assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s)
    assert torch.equal(a["rng"][0], b["rng"][0]) and a["rng"][1] == b["rng"][1]
    assert np.array_equal(a["rng"][2], b["rng"][2])


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Net().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(8, D)).square().mean().backward()
    opt.step()
    model(torch.randn(8, D)).square().mean().backward()
    return model, opt


def _grads(model: nn.Module, config: Config, x: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of one step under ``config``, the model as it was afterwards."""
    model.zero_grad(set_to_none=True)
    applied = apply_config(model, config)
    torch.manual_seed(1)  # the same dropout masks
    applied.backward(model(x).square().mean())
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    applied.revert()
    model.zero_grad(set_to_none=True)
    return grads


def test_the_config_takes_where_to_offload() -> None:
    assert str(Config(offload="blocks")) == "offload blocks"
    assert str(Config(checkpoint="blocks", offload="model")) == "ckpt blocks · offload model"
    for bad in ("layers", True, 1, ""):
        with pytest.raises(ValueError, match="offload takes 'blocks'"):
            Config(offload=bad)  # type: ignore[arg-type]


def test_on_the_cpu_nothing_moves_and_a_warning_says_so() -> None:
    model, opt = _trained()
    before = _state(model, opt)
    with pytest.warns(UserWarning, match="no effect here"):
        applied = apply_config(model, Config(offload="model"), opt)
    assert applied.warnings == (NO_EFFECT,)
    assert _hooks(model) == before["hooks"]  # nothing installed
    applied.revert()
    _assert_same(before, _state(model, opt))


@pytest.mark.parametrize("where", ["blocks", "model"])
@pytest.mark.usefixtures("cpu_moves")
def test_hooks_go_on_the_targets_and_come_off_exactly(where: str) -> None:
    model, opt = _trained()
    before = _state(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied = apply_config(model, Config(offload=where), opt)
    hooked = [name for name, m in model.named_modules() if m._forward_pre_hooks]
    assert hooked == ([f"blocks.{i}" for i in range(4)] if where == "blocks" else [""])
    for _ in range(2):
        applied.backward(model(torch.randn(8, D)).square().mean())
        applied.step()
    assert opt.state  # it trained
    applied.revert()
    applied.revert()  # idempotent
    after = _state(model, opt)
    assert after["hooks"] == before["hooks"]
    assert after["ids"] == before["ids"]


@pytest.mark.usefixtures("cpu_moves")
def test_revert_leaves_the_model_optimizer_and_random_state_bit_for_bit() -> None:
    model, opt = _trained()
    before = _state(model, opt)
    for config in (
        Config(offload="model"),
        Config(offload="blocks", checkpoint="blocks"),
        Config(offload="blocks", precision="bf16", optimizer="sgd"),
    ):
        apply_config(model, config, opt).revert()
        _assert_same(before, _state(model, opt))


@pytest.mark.parametrize(
    "config",
    [
        Config(offload="model"),
        Config(offload="blocks"),
        Config(offload="blocks", checkpoint="blocks"),
        Config(offload="model", checkpoint="blocks", every=2),
    ],
    ids=str,
)
@pytest.mark.usefixtures("cpu_moves")
def test_offloaded_gradients_are_the_plain_steps(config: Config) -> None:
    model, _ = _trained()
    x = torch.randn(8, D)
    plain = _grads(model, Config(), x)
    for g, h in zip(plain, _grads(model, config, x), strict=True):
        assert torch.equal(g, h)


@pytest.mark.usefixtures("cpu_moves")
def test_the_hooks_beneath_see_the_saved_tensor_and_its_copy_coming_back() -> None:
    """What the recorder's tagger relies on: its pack sees each saved tensor as it is saved,
    its unpack gets a copy (not the object it packed) back, parameters unmoved."""
    packed: list[torch.Tensor] = []
    unpacked: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> tuple[torch.Tensor, int]:
        packed.append(t)
        return t, len(packed) - 1

    def unpack(p: tuple[torch.Tensor, int]) -> torch.Tensor:
        t, i = p
        unpacked.append(t)
        assert torch.equal(t, packed[i])
        weight = packed[i]._base is fc.weight
        assert (t is packed[i]) == weight
        return t

    fc = nn.Linear(D, D)
    x = torch.randn(4, D, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        with offloaded():
            y = torch.tanh(fc(x))
        y.sum().backward()
    assert len(unpacked) == len(packed) >= 3  # x, the weight, tanh's output
    assert any(t._base is fc.weight for t in packed)  # saved transposed, and not moved


def test_without_hooks_beneath_a_saved_tensor_waits_on_the_host(cpu_moves: None) -> None:
    hooks = offloaded()
    pack, unpack = hooks.pack_hook, hooks.unpack_hook
    t = torch.randn(3, 4).t()  # not contiguous: it comes back contiguous, equal
    moved, inner = pack(t)
    assert moved and isinstance(inner, OnHost) and inner.device == t.device
    back = unpack((moved, inner))
    assert torch.equal(back, t) and back.data_ptr() != t.data_ptr()
    p = nn.Parameter(torch.randn(2))
    assert pack(p) == (False, p)


def test_blocks_need_repeated_blocks() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(ValueError, match="offload='blocks' finds blocks as checkpoint='blocks'"):
        apply_config(model, Config(offload="blocks"))
    assert not model._forward_pre_hooks
