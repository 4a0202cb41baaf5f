"""Activation checkpointing in place: same numbers, same objects, nothing left behind on revert."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import (
    CHECKPOINT_HELP,
    apply,
    block_groups,
    blocks,
    checkpoint_targets,
)

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


def test_blocks_of_a_modulelist() -> None:
    assert blocks(Toy(n=2)) == ["blocks.0", "blocks.1"]  # not the one-head ModuleList
    root = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    assert blocks(root) == ["0", "1"]
    assert blocks(nn.Sequential(nn.Linear(2, 2))) == []


class Bottleneck(nn.Module):
    """A ResNet block: convolutions, BatchNorm, a downsample branch in the first of a stage."""

    def __init__(self, channels: int, down: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.drop = nn.Dropout(0.1)
        self.downsample = (
            nn.Sequential(nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels))
            if down
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.drop(self.bn2(self.conv2(h)))
        skip = x if self.downsample is None else self.downsample(x)
        return torch.relu(h + skip)


class ResNetLike(nn.Module):
    """Blocks spread over nested stages, as torchvision's ResNets have them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = nn.Sequential(Bottleneck(8, down=True), Bottleneck(8))
        self.layer2 = nn.Sequential(Bottleneck(8, down=True), Bottleneck(8), Bottleneck(8))
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layer2(self.layer1(torch.relu(self.bn1(self.conv1(x)))))
        return self.fc(h.mean(dim=(2, 3)))


def _sequential_stack() -> nn.Sequential:
    """Blocks as the children of an nn.Sequential, between an input and an output layer."""
    return nn.Sequential(nn.Linear(D, D), *(Block() for _ in range(5)), nn.Linear(D, 3))


@pytest.mark.parametrize(
    ("make", "shape", "expected"),
    [
        (_sequential_stack, (8, D), [str(i) for i in range(1, 6)]),
        (
            ResNetLike,
            (4, 3, 8, 8),
            ["layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer2.2"],
        ),
        (lambda: Toy(n=6), (8, D), [f"blocks.{i}" for i in range(6)]),
    ],
    ids=["sequential", "resnet-like", "modulelist"],
)
def test_blocks_wherever_they_sit_checkpoint_bit_equal_and_revert_exactly(
    make: Any, shape: tuple[int, ...], expected: list[str]
) -> None:
    torch.manual_seed(0)
    model = make().train()
    x = torch.randn(*shape)
    assert blocks(model) == expected
    before = snapshot(model)
    out0, grads0 = run(model, x)
    norms = [b.clone() for b in model.buffers()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        applied = apply(model, checkpoint="blocks")
    assert [n for n, m in model.named_modules() if "forward" in m.__dict__] == expected
    for buffer, saved in zip(model.buffers(), norms, strict=True):
        buffer.copy_(saved)  # the same BatchNorm statistics for the second run
    out1, grads1 = run(model, x)
    assert torch.equal(out0, out1)
    assert grads0.keys() == grads1.keys()
    assert all(torch.equal(grads0[k], grads1[k]) for k in grads0)
    if isinstance(model, ResNetLike):  # one warning for all the regions, not one per block
        assert [str(w.message) for w in caught] == list(applied.warnings)
        assert applied.warnings[0].startswith(
            "BatchNorm inside 5 checkpointed regions ('layer1.0', 'layer1.1', 'layer2.0' and 2 more)"
        )
    else:
        assert caught == []
    applied.revert()
    assert snapshot(model) == before


def test_block_groups_prefer_stacks_to_towers_and_join_encoder_and_decoder() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.ModuleList(Block() for _ in range(3))

    class Towers(nn.Module):  # like T5: two stacks of one class, each holding its blocks
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.decoder = Stack(), Stack()
            self.head = nn.Linear(D, 2)

    names = [f"{side}.block.{i}" for side in ("encoder", "decoder") for i in range(3)]
    assert blocks(Towers()) == names
    groups = block_groups(Towers())
    kinds = [(g.kind, len(g.names)) for g in groups]
    # the towers hold more parameters, yet rank after the stack of blocks
    assert kinds[0] == ("Block", 6) and ("Stack", 2) in kinds
    transformer = nn.Transformer(
        d_model=16,
        nhead=2,
        num_encoder_layers=2,
        num_decoder_layers=3,
        dim_feedforward=32,
        batch_first=True,
    )
    assert blocks(transformer) == [
        "encoder.layers.0",
        "encoder.layers.1",
        "decoder.layers.0",
        "decoder.layers.1",
        "decoder.layers.2",
    ]


def test_no_repeated_blocks_names_the_largest_candidates() -> None:
    model = nn.Sequential(
        nn.Linear(4, 64), nn.Sequential(nn.Linear(64, 64), nn.ReLU()), nn.Conv1d(1, 2, 3)
    )
    assert blocks(model) == []
    with pytest.raises(ValueError) as err:
        checkpoint_targets(model, "blocks")
    message = str(err.value)
    assert message.startswith("'blocks' found no repeated blocks in Sequential")
    assert "its largest modules are '1' (Sequential, 4,160 parameters), '0' (Linear, 320" in message
    assert "'1.0'" not in message  # inside '1', already named
    assert CHECKPOINT_HELP in message


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


def _hf_family(name: str) -> tuple[Any, Any]:
    """A tiny model of transformers' ``name`` family that writes a key-value cache in
    training, and its call that returns the loss."""
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 100, (2, 16))
    if name == "llama-eager":
        config = transformers.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, use_cache=True,
        )  # fmt: skip
        config._attn_implementation = "eager"
        model = transformers.LlamaForCausalLM(config)
        return model, lambda: model(input_ids=ids, labels=ids).loss
    config = transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4, use_cache=True,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config)
    return model, lambda: model(input_ids=ids, labels=ids).loss


@pytest.mark.parametrize("family", ["llama-eager", "t5"])
def test_blocks_given_a_cache_in_training_do_not_write_it_twice(family: str) -> None:
    """transformers' decoders hand their layers a cache in training too: a checkpointed layer
    is given none, as transformers' own checkpointing does, or its recompute writes it again
    (Llama's eager attention fails on keys twice as long, T5 saves other tensors)."""
    torch.manual_seed(0)
    model, loss_of = _hf_family(family)
    model.train()

    def step() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        loss = loss_of()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss0, grads0 = step()
    applied = apply(model, checkpoint="blocks")
    assert sum("forward" in m.__dict__ for m in model.modules()) >= 3
    loss1, grads1 = step()
    assert torch.equal(loss0, loss1)
    # T5's decoder blocks sum the encoder states' gradient in another order when checkpointed
    for k in grads0:
        torch.testing.assert_close(grads1[k], grads0[k], rtol=1e-5, atol=1e-7)
    applied.revert()


class Cache:
    def update(self, *tensors: Any) -> None:
        raise AssertionError("a checkpointed block wrote its cache")


class CacheReader(nn.Module):
    """A block that reads a cache it is handed and says whether it was."""

    _can_checkpoint_with_cache = False

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(D, D)
        self.seen: list[Any] = []

    def forward(self, x: torch.Tensor, cache: Any = None, use_cache: bool = False) -> Any:
        self.seen.append((cache, use_cache))
        return x + self.fc(x)


@pytest.mark.parametrize("keeps", [False, True])
def test_a_block_that_only_reads_its_cache_may_keep_it(keeps: bool) -> None:
    model = nn.Sequential(*[CacheReader() for _ in range(3)])
    for m in model:
        m._can_checkpoint_with_cache = keeps
    applied = apply(model, checkpoint="blocks")
    cache = Cache()
    x = torch.randn(2, D, requires_grad=True)
    for m in model:
        x = m(x, cache=cache, use_cache=True)
    x.sum().backward()
    # forward and recompute alike: the cache handed on only where it may be, use_cache as given
    assert model[0].seen == [(cache if keeps else None, True)] * 2
    with torch.no_grad():  # without grad nothing is recomputed, and the call is the caller's
        model[1](x, cache=cache, use_cache=True)
    assert model[1].seen[-1] == (cache, True)
    applied.revert()
