"""Estimates for models that hold no weights: built on the meta device, nothing materialised.

On the CPU a meta model's estimate must equal, to the byte, the estimate of the same model
with real weights: the fake run sees the same shapes, so only where its storages come from
differs. A CUDA estimate on a torch build without CUDA must say what to install, never abort.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.trial import Trial

transformers = pytest.importorskip("transformers")

SEQ = 16


def _llama() -> nn.Module:
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


def _gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(
        vocab_size=256,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg)


def _vit() -> nn.Module:
    cfg = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_labels=10,
    )  # fmt: skip
    return transformers.ViTForImageClassification(cfg)


def _lm_batch(device: str) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(2, SEQ, dtype=torch.long, device=device)}


def _lm_loss(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return m(input_ids=b["input_ids"], labels=b["input_ids"]).loss


def _vit_batch(device: str) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.zeros(4, 3, 32, 32, device=device),
        "labels": torch.zeros(4, dtype=torch.long, device=device),
    }


def _vit_loss(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
    return m(**b).loss


CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[str], Any], Callable[..., Any]]] = {
    "llama": (_llama, _lm_batch, _lm_loss),
    "gpt2": (_gpt2, _lm_batch, _lm_loss),
    "vit": (_vit, _vit_batch, _vit_loss),
}


def _trial(name: str, built_on: str, **kwargs: Any) -> Trial:
    build, batch, loss = CASES[name]
    torch.manual_seed(0)
    with torch.device(built_on):
        model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(model, batch(built_on), loss, optimizer=opt, **kwargs)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize(
    "config",
    [Config(), Config(checkpoint="blocks"), Config(precision="bf16"), Config(optimizer="sgd")],
    ids=str,
)
def test_a_meta_model_estimates_as_the_same_model_materialised(name: str, config: Config) -> None:
    real = _trial(name, "cpu").estimate(config=config)
    meta_trial = _trial(name, "meta", device="cpu")
    meta = meta_trial.estimate(config=config)
    assert real.peak_bytes is not None, real.reason
    assert meta.peak_bytes == real.peak_bytes, (meta.reason, meta.breakdown, real.breakdown)
    assert meta.peak_reserved_bytes == real.peak_reserved_bytes
    assert meta.breakdown == real.breakdown
    assert meta.phase == real.phase
    assert all(p.is_meta for p in meta_trial.model.parameters())
    assert not meta_trial.optimizer.state


def test_a_meta_model_estimates_on_the_cpu_unless_told_otherwise() -> None:
    trial = _trial("gpt2", "meta")
    assert trial.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_the_largest_batch_of_a_meta_model() -> None:
    def make(n: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.zeros(n, SEQ, dtype=torch.long)}

    real = _trial("llama", "cpu")
    meta = _trial("llama", "meta", device="cpu")
    budget = real.estimate(batch=make(6)).peak_bytes
    assert budget is not None
    assert meta.max_batch_size(budget, make) == real.max_batch_size(budget, make) == 6


def test_batches_made_on_the_meta_device_are_the_run_devices() -> None:
    def on(device: str) -> Any:
        return lambda n: {"input_ids": torch.zeros(n, SEQ, dtype=torch.long, device=device)}

    meta = _trial("llama", "meta", device="cpu")
    budget = meta.estimate(batch=on("cpu")(6)).peak_bytes
    assert budget is not None
    assert meta.max_batch_size(budget, on("meta")) == meta.max_batch_size(budget, on("cpu")) == 6
    assert meta.last_search.estimate is not None
    assert meta.last_search.estimate.peak_bytes == budget


def test_running_a_meta_model_asks_for_real_weights() -> None:
    trial = _trial("gpt2", "meta", device="cpu")
    for attempt in (lambda: trial.run(Config()), lambda: trial.compare([Config()])):
        with pytest.raises(ValueError, match=r"meta device.*real weights"):
            attempt()
    assert all(p.is_meta for p in trial.model.parameters())


def test_a_model_partly_on_the_meta_device_is_refused() -> None:
    model = _gpt2()
    model.lm_head = nn.Linear(64, 256, bias=False, device="meta")
    with pytest.raises(ValueError, match="some parameters on the meta device"):
        Trial(model, _lm_batch("cpu"), _lm_loss, device="cpu")


CUDA_ON_CPU_BUILD = """
import torch, transformers
from jupyter_gpumem.tuner.trial import Trial
cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64)
with torch.device("meta"):
    model = transformers.GPT2LMHeadModel(cfg)
batch = torch.zeros(2, 16, dtype=torch.long, device="meta")
opt = torch.optim.AdamW(model.parameters())
est = Trial(model, batch, lambda m, b: m(input_ids=b, labels=b).loss, optimizer=opt,
            device="cuda").estimate()
print("PEAK", est.peak_bytes)
print("NOTE", est.notes[0] if est.notes else est.reason)
"""


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="a torch build without CUDA")
def test_a_cuda_estimate_on_a_cpu_only_build_is_made_without_cuda() -> None:
    """Fake CUDA tensors with autograd abort a CPU-only build: the kernel never makes them, and
    the estimate is made on the stand-in device of a worker process instead."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CUDA_ON_CPU_BUILD)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PEAK None" not in done.stdout
    assert "NOTE estimated without CUDA, for the H100-80GB" in done.stdout
    meta = _trial("gpt2", "meta", device="cuda")
    made = meta.max_batch_size(
        "1GiB", lambda n: {"input_ids": torch.zeros(n, SEQ, dtype=torch.long)}
    )
    assert made >= 1


def test_fsdp2_ranks_of_a_meta_model_hold_their_shards_to_the_byte() -> None:
    """Each rank's parameters and AdamW state are its pieces of every parameter: dim 0 cut as
    torch.chunk cuts it. A parameter's piece is stored padded to ceil(rows / ranks) rows, its
    optimizer state is the piece's own rows (the last rank's are fewer: 1001 = 7 x 126 + 119).
    At the peak (in the backward, where the all-gathered layers are communication) gradients
    are partly made; at their most, after the backward, they are the padded pieces."""
    cfg = transformers.LlamaConfig(
        vocab_size=1001, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.zeros(1, 4, dtype=torch.long, device="meta")
    world = 8

    def loss(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        return m(input_ids=b, labels=b).loss

    est = Trial(model, ids, loss, optimizer=opt, device="cpu").estimate(
        config=Config(parallel="fsdp2", world_size=world)
    )
    assert est.peak_bytes is not None, est.reason
    params = list(model.parameters())

    def piece(p: torch.Tensor, rank: int | None) -> int:
        """Bytes of ``rank``'s rows of ``p``; None: the padded piece."""
        rows, per_row = p.shape[0], p.numel() // p.shape[0] * 4
        most = -(-rows // world)
        return per_row * (most if rank is None else max(0, min(most, rows - rank * most)))

    padded = sum(piece(p, None) for p in params)
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    steps = 4 * len(params)  # AdamW's step counter, a float32 scalar per parameter on the CPU
    assert len(est.ranks) == world
    for rank in est.ranks:
        own = sum(piece(p, rank.rank) for p in params)
        assert rank.breakdown["parameters"] == padded + buffers
        assert rank.breakdown["optimizer_state"] == 2 * own + steps
        assert 0 < rank.breakdown["gradients"] <= padded
        assert rank.most_bytes is not None and rank.most_bytes["gradients"] == padded
        assert rank.most_bytes["optimizer_state"] == 2 * own + steps
    assert est.ranks[0].breakdown["optimizer_state"] > est.ranks[-1].breakdown["optimizer_state"]
    assert all(p.is_meta for p in model.parameters())


def _tiny_meta_llama() -> Trial:
    """A two-layer Llama on the meta device whose pieces are short or empty over many ranks
    (K and V projections of 48 rows, a vocabulary of 1,001)."""
    cfg = transformers.LlamaConfig(
        vocab_size=1001, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.zeros(1, 4, dtype=torch.long, device="meta")
    return Trial(
        model, ids, lambda m, b: m(input_ids=b, labels=b).loss, optimizer=opt, device="cpu"
    )


def _rank_figures(trial: Trial, config: Config) -> list[tuple[Any, ...]]:
    est = trial.estimate(config=config)
    assert est.peak_bytes is not None, est.reason
    return [
        (r.rank, r.peak_bytes, r.peak_reserved_bytes, r.breakdown, r.most_bytes, r.phase)
        for r in est.ranks
    ]


def test_fsdp2_pieces_made_on_demand_give_every_rank_the_same_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over 64 ranks most pieces of the K and V projections (48 rows) and some of the
    vocabulary's are short or empty: each rank's figures with FSDP2's pieces narrowed out when
    asked for equal those with every piece made by torch.chunk, to the byte."""
    from contextlib import nullcontext

    from jupyter_gpumem.tuner.estimation import rank_estimates

    trial = _tiny_meta_llama()
    config = Config(parallel="fsdp2", world_size=64)

    on_demand = _rank_figures(trial, config)
    monkeypatch.setattr(rank_estimates, "pieces_on_demand", nullcontext)
    every_piece = _rank_figures(trial, config)
    assert len(on_demand) == 64
    assert len({f[3]["optimizer_state"] for f in on_demand}) > 1  # the ranks differ
    assert on_demand == every_piece


def test_each_shard_layout_played_in_a_forked_child_gives_what_one_process_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over 24 ranks the MLP's pieces (9 of 200 rows) and the vocabulary's (42 of 1,001) make
    three layouts: full, a short MLP piece (rank 22), an empty one and a short vocabulary piece
    (rank 23). Each played in a child of its own, at once, every rank's figures equal those of
    the layouts played one after the other in this process, to the byte."""
    import os

    from jupyter_gpumem.tuner.estimation import forked, rank_estimates

    trial = _tiny_meta_llama()
    model = trial.model
    config = Config(parallel="fsdp2", world_size=24)
    keys = rank_estimates.layouts(model, config)
    assert keys == [rank_estimates.shard_sizes(model, config, r) for r in range(24)]
    assert len(rank_estimates.first_of_each_layout(keys)) == 3

    forks: list[int] = []
    fork = os.fork

    def counted() -> int:
        pid = fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted)
    monkeypatch.setattr(rank_estimates, "cores", lambda: 3)
    apart = _rank_figures(trial, config)
    assert len(forks) == 3
    monkeypatch.setattr(rank_estimates, "can_fork", lambda torch: False)
    here = _rank_figures(trial, config)
    assert len(forks) == 3  # none more
    assert len(apart) == 24
    assert len({f[3]["optimizer_state"] for f in apart}) == 3  # the layouts differ
    assert apart == here
    assert forked.cores() >= 1


def test_attention_gets_what_the_real_step_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers passes SDPA no mask and ``is_causal=True`` (grouped keys and values as they
    are) in the real step; on fake tensors it took them for a trace and built a mask."""
    from transformers import masking_utils

    seen: list[tuple[bool, bool, int]] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        seen.append((attn_mask is None, bool(kwargs.get("is_causal")), k.shape[1]))
        return original(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    decide = masking_utils._ignore_causal_mask_sdpa
    trial = _trial("llama", "meta")
    assert trial.estimate().peak_bytes is not None
    fake = list(seen)
    seen.clear()
    real = _trial("llama", "cpu")
    _lm_loss(real.model, _lm_batch("cpu")).backward()
    assert fake and set(fake) == set(seen) == {(True, True, 2)}  # 2 KV heads, no mask
    assert masking_utils._ignore_causal_mask_sdpa is decide  # put back
