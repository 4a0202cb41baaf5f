"""Activation checkpointing in place: same numbers, same objects, nothing left behind on revert."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import CHECKPOINT_HELP, apply, blocks, checkpoint_targets

D = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, 2 * D)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(2 * D, D)
        self.calls = 0  # forward runs, recomputation included

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.fc2(self.drop(torch.relu(self.fc1(self.ln(x)))))


class Toy(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.heads = nn.ModuleList([nn.Linear(D, 1)])  # a smaller ModuleList: not "the" blocks
        self.blocks = nn.ModuleList([Block() for _ in range(n)])
        self.out = nn.Linear(D, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h) + self.heads[0](h)


class GPT2Block(nn.Module):
    """Like HF GPT-2: hidden_states plus keyword arguments in, a tuple out."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = nn.Linear(D, D)
        self.drop = nn.Dropout(0.2)
        self.mlp = nn.Linear(D, D)
        self.calls = 0

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        bias: torch.Tensor | None = None,
        use_cache: bool = False,
        debug: bool = False,  # a name torch.utils.checkpoint also takes
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.calls += 1
        h = self.attn(self.ln(hidden_states))
        if attention_mask is not None:
            h = h * attention_mask
        if bias is not None:
            h = h + bias
        h = hidden_states + self.drop(h) + self.mlp(h)
        return h, (h.detach() if use_cache else None)


class GPT2Like(nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(50, D)
        self.bias = nn.Parameter(torch.randn(D))
        self.h = nn.ModuleList([GPT2Block() for _ in range(n)])
        self.ln_f = nn.LayerNorm(D)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.wte(ids)
        mask = (ids[..., None] % 3 != 0).float()
        for block in self.h:
            h, present = block(h, attention_mask=mask, bias=self.bias, use_cache=True, debug=False)
            assert present is not None
        return self.ln_f(h)


def run(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward from a fixed seed: the output and every gradient."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    out = model(x)
    (out.float() ** 2).mean().backward()
    return out.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


def snapshot(model: nn.Module) -> dict[str, Any]:
    """The module tree, every hook dict and instance forward, parameter identities, state_dict keys."""
    tree = []
    for name, m in model.named_modules():
        hooks = tuple(
            dict(getattr(m, attr))
            for attr in (
                "_forward_hooks",
                "_forward_pre_hooks",
                "_forward_hooks_with_kwargs",
                "_forward_pre_hooks_with_kwargs",
                "_backward_hooks",
                "_backward_pre_hooks",
            )
        )
        tree.append((name, type(m), id(m), hooks, m.__dict__.get("forward", "absent")))
    return {
        "tree": tree,
        "params": [(n, id(p)) for n, p in model.named_parameters()],
        "keys": list(model.state_dict()),
        "global": (
            dict(nn.modules.module._global_forward_hooks),
            dict(nn.modules.module._global_forward_pre_hooks),
        ),
    }


def calls(model: nn.Module) -> list[int]:
    return [m.calls for m in model.modules() if isinstance(m, (Block, GPT2Block))]


def reset_calls(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, (Block, GPT2Block)):
            m.calls = 0


@pytest.mark.parametrize(
    ("spec", "every", "expected"),
    [
        (r"blocks\.\d+", 1, ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]),
        (("blocks.1", "blocks.3"), 1, ["blocks.1", "blocks.3"]),
        (["blocks.3", "blocks.1"], 1, ["blocks.1", "blocks.3"]),  # model order
        ("blocks", 1, ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]),
        ("blocks", 2, ["blocks.0", "blocks.2"]),
        (r"blocks\.[0-3]", 3, ["blocks.0", "blocks.3"]),
    ],
)
def test_checkpointing_keeps_outputs_gradients_and_objects(
    spec: Any, every: int, expected: list[str]
) -> None:
    torch.manual_seed(0)
    model = Toy().train()
    x = torch.randn(8, D, requires_grad=False)
    assert checkpoint_targets(model, spec, every) == expected
    before = snapshot(model)
    out0, grads0 = run(model, x)
    reset_calls(model)

    applied = apply(model, checkpoint=spec, every=every)
    assert applied.model is model and applied.warnings == ()
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == expected
    after_apply = snapshot(model)
    assert after_apply["params"] == before["params"] and after_apply["keys"] == before["keys"]
    out1, grads1 = run(model, x)
    assert torch.equal(out0, out1)
    assert grads0.keys() == grads1.keys()
    assert all(torch.equal(grads0[k], grads1[k]) for k in grads0)
    # checkpointed blocks ran twice (forward and recompute), the others once
    assert calls(model) == [2 if f"blocks.{i}" in expected else 1 for i in range(4)]

    applied.revert()
    applied.revert()  # idempotent
    assert snapshot(model) == before
    assert all("forward" not in m.__dict__ for m in model.modules())
    reset_calls(model)
    out2, _ = run(model, x)
    assert torch.equal(out0, out2) and calls(model) == [1, 1, 1, 1]


def test_gpt2_like_blocks_with_kwargs_and_tuples() -> None:
    torch.manual_seed(0)
    model = GPT2Like().train()
    ids = torch.randint(0, 50, (2, 12))
    assert blocks(model) == ["h.0", "h.1", "h.2", "h.3"]
    before = snapshot(model)
    out0, grads0 = run(model, ids)
    reset_calls(model)
    applied = apply(model, checkpoint="blocks")
    out1, grads1 = run(model, ids)
    assert calls(model) == [2, 2, 2, 2]
    assert torch.equal(out0, out1)
    assert grads0.keys() == grads1.keys() and "bias" in grads1  # a keyword tensor gets its gradient
    assert all(torch.equal(grads0[k], grads1[k]) for k in grads0)
    applied.revert()
    assert snapshot(model) == before


def test_no_recompute_without_grad() -> None:
    model = Toy().train()
    x = torch.randn(4, D)
    applied = apply(model, checkpoint="blocks")
    with torch.no_grad():
        torch.manual_seed(0)
        out = model(x)
    assert calls(model) == [1, 1, 1, 1] and not out.requires_grad
    applied.revert()


def test_user_instance_forward_is_wrapped_and_restored() -> None:
    model = Toy()
    block = model.blocks[1]
    seen = []

    def custom(x: torch.Tensor) -> torch.Tensor:
        seen.append(1)
        return type(block).forward(block, x) * 1.0

    block.forward = custom  # type: ignore[method-assign]  # what users sometimes do
    applied = apply(model, checkpoint=("blocks.1",))
    run(model, torch.randn(2, D))
    assert len(seen) == 2  # forward and recompute went through the user's forward
    applied.revert()
    assert block.__dict__["forward"] is custom


def test_already_checkpointed_is_refused() -> None:
    model = Toy()
    first = apply(model, checkpoint="blocks", every=2)
    with pytest.raises(ValueError, match=r"already checkpointed: blocks\.0, blocks\.2; revert"):
        apply(model, checkpoint="blocks")
    first.revert()
    apply(model, checkpoint="blocks").revert()


def test_regex_matches_whole_names_and_keeps_the_outermost() -> None:
    model = Toy()
    assert checkpoint_targets(model, r"blocks\.\d+(\.fc1)?") == [f"blocks.{i}" for i in range(4)]
    assert checkpoint_targets(model, r"fc1") == []  # whole names only
    assert checkpoint_targets(model, r".*\.fc1") == [f"blocks.{i}.fc1" for i in range(4)]
    assert checkpoint_targets(model, None) == []


def test_blocks_is_the_largest_modulelist() -> None:
    assert blocks(Toy(n=2)) == ["blocks.0", "blocks.1"]
    root = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    assert blocks(root) == ["0", "1"]
    assert blocks(nn.Sequential(nn.Linear(2, 2))) == []
    with pytest.raises(ValueError, match=r"needs an nn\.ModuleList"):
        checkpoint_targets(nn.Sequential(nn.Linear(2, 2)), "blocks")


@pytest.mark.parametrize(
    ("spec", "every", "message"),
    [
        (42, 1, "bad checkpoint spec 42"),
        ((), 1, "bad checkpoint spec"),
        ((1, 2), 1, "bad checkpoint spec"),
        ("", 1, "empty checkpoint pattern"),
        ("blocks.(", 1, "is not a regex"),
        (("blocks.0", "nope"), 1, "no module named 'nope'.*names look like: inp, heads"),
        ("blocks", 0, "every must be a positive int"),
        ("blocks", 1.5, "every must be a positive int"),
    ],
)
def test_bad_specs_say_what_is_allowed(spec: Any, every: Any, message: str) -> None:
    model = Toy()
    before = snapshot(model)
    with pytest.raises(ValueError, match=message) as err:
        apply(model, checkpoint=spec, every=every)
    if "every" not in message:
        assert CHECKPOINT_HELP in str(err.value)
    assert snapshot(model) == before


def test_regex_matching_nothing_is_an_error_in_apply() -> None:
    with pytest.raises(ValueError, match=r"matches no module \(names look like: inp, heads"):
        apply(Toy(), checkpoint=r"layers\.\d+")


def test_batchnorm_and_huge_region_warn() -> None:
    model = nn.Sequential(
        nn.Linear(4, 64),
        nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64), nn.Linear(64, 64)),
        nn.Linear(64, 1),
    )
    with pytest.warns(UserWarning) as record:
        applied = apply(model, checkpoint=("1",))
    assert record[0].filename == __file__  # stacklevel points at the caller
    assert len(applied.warnings) == 2
    assert "BatchNorm '1.1' inside checkpointed region '1'" in applied.warnings[0]
    assert "running statistics update twice" in applied.warnings[0]
    assert "holds 9" in applied.warnings[1] and "checkpoint its blocks" in applied.warnings[1]
    assert [str(w.message) for w in record] == list(applied.warnings)
    x = torch.randn(8, 4)
    model.train()
    model(x).sum().backward()
    bn = model.get_submodule("1.1")
    assert isinstance(bn, nn.BatchNorm1d) and bn.num_batches_tracked is not None
    assert int(bn.num_batches_tracked) == 2  # the documented double update
    applied.revert()


def test_deepcopy_of_a_checkpointed_model_checkpoints_the_copy() -> None:
    model = Toy()
    applied = apply(model, checkpoint="blocks")
    clone = copy.deepcopy(model)
    reset_calls(clone)
    run(clone, torch.randn(2, D))
    assert calls(clone) == [2, 2, 2, 2] and calls(model) == [0, 0, 0, 0]
    applied.revert()


def test_hugging_face_gpt2_blocks() -> None:
    """The real thing where it is installed: GPT-2 blocks take kwargs and a cache, return tuples."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=3, n_embd=32, n_head=4, vocab_size=100, n_positions=32, use_cache=True
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()  # dropout 0.1 everywhere
    ids = torch.randint(0, 100, (2, 16))

    def step() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    before = snapshot(model)
    loss0, grads0 = step()
    applied = apply(model, checkpoint="blocks")
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == [
        "transformer.h.0",
        "transformer.h.1",
        "transformer.h.2",
    ]
    loss1, grads1 = step()
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys() and all(torch.equal(grads0[k], grads1[k]) for k in grads0)
    applied.revert()
    assert snapshot(model) == before
