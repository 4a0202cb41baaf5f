"""LoRA as a technique: adapters in place, the base frozen, everything back bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config, apply_config

pytest.importorskip("peft")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(3)), nn.Linear(16, 4))


def test_adapters_train_alone_and_revert_leaves_everything_as_it_was() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 16)).sum().backward()
    opt.step()  # a user who trained: gradients and AdamW state exist
    params = {
        name: (p, p.detach().clone(), p.requires_grad) for name, p in model.named_parameters()
    }
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in opt.state.items()}
    keys = list(model.state_dict())
    attributes = sorted(vars(model))
    rng = torch.get_rng_state()

    applied = apply_config(model, Config(lora=4), opt)
    assert str(applied.config) == "lora r4"
    assert torch.equal(torch.get_rng_state(), rng)  # the adapters' draws left no trace
    adapters = [n for n, p in model.named_parameters() if p.requires_grad]
    assert adapters and all("lora_" in n for n in adapters)  # the blocks' linears, the base frozen
    assert not any(n.startswith("3.") for n in adapters)  # the head keeps no adapter
    assert applied.optimizer is not opt and isinstance(applied.optimizer, torch.optim.AdamW)
    assert {id(p) for g in applied.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in model.parameters() if p.requires_grad
    }
    for _ in range(2):
        with applied.autocast():
            loss = model(torch.randn(5, 16)).square().mean()
        applied.backward(loss)
        applied.step()
    applied.revert()

    assert list(model.state_dict()) == keys
    for name, p in model.named_parameters():
        original, value, flag = params[name]
        assert p is original and torch.equal(p, value) and p.requires_grad == flag
        if name in grads:
            assert torch.equal(p.grad, grads[name])  # type: ignore[arg-type]
    assert {
        id(p): {k: v for k, v in s.items()} for p, s in opt.state.items()
    }.keys() == state.keys()
    for p, s in opt.state.items():
        assert all(torch.equal(v, state[id(p)][k]) for k, v in s.items())
    assert not any(type(m).__module__.startswith("peft") for m in model.modules())
    assert sorted(vars(model)) == attributes


def test_what_lora_takes() -> None:
    for bad in (0, 2000, 1.5, True):
        with pytest.raises(ValueError, match="the adapters' rank: a whole number from 1 to 1024"):
            Config(lora=bad)  # type: ignore[arg-type]
    flat = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"no nn\.Linear \(or transformers Conv1D\) inside"):
        apply_config(flat, Config(lora=4), torch.optim.AdamW(flat.parameters()))
    model = _model()
    with pytest.raises(ValueError, match="lora trains its adapters with the optimizer's algorithm"):
        apply_config(model, Config(lora=4), torch.optim.RMSprop(model.parameters()))
    assert all(p.requires_grad for p in model.parameters())  # refused before it touched the model


def test_gpt2s_conv1d_layers_get_adapters_that_start_as_the_identity() -> None:
    """GPT-2's linear layers are transformers' Conv1D, weights stored (in, out): adapted with
    fan_in_fan_out, the output unchanged before training and the model back afterwards."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=16, vocab_size=50)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 50, (2, 16))
    before = model(ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters())

    applied = apply_config(model, Config(lora=4), opt)
    adapted = {n.rsplit(".lora_", 1)[0] for n, p in model.named_parameters() if p.requires_grad}
    assert adapted == {
        f"transformer.h.{i}.{layer}" for i in range(2) for layer in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }  # fmt: skip
    assert torch.equal(model(ids).logits, before)  # B starts at zero: the same function
    applied.backward(model(ids, labels=ids).loss)
    applied.step()
    assert not torch.equal(model(ids).logits, before)  # the adapters trained
    applied.revert()

    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(ids).logits, before)
