"""What the process already holds on the GPU when an estimate starts, on a real GPU (the issue's
case): a 4-layer Llama's ``generate`` at 8 x 512 + 32, with a 2 GiB tensor held and a real copy
of the model loaded beside its meta one.

What only a GPU shows: the snapshot's blocks read as held (the library workspaces told apart by
their addresses, found by clearing them and making them again, so that a tensor of a workspace's
size is held; the user's gradients and optimizer state freed as the trial frees them),
``count_held=False`` giving the figures of a process that holds nothing else, a verdict for
another card unmoved by what is held here, and both figures against a measured ``generate``.
"""

from __future__ import annotations

import gc
from collections.abc import Collection
from typing import Any

import pytest

MiB, GiB = 2**20, 2**30
SIZES = {"batch_size": 8, "prompt_tokens": 512, "max_new_tokens": 32}
KWARGS = {"do_sample": False, "pad_token_id": 0, "min_new_tokens": 32}
TOLERANCE = 0.001  # of the measured peak: generate's allocated error is 0.0000% on an H100


def _llama(built_on: str) -> Any:
    import torch

    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(built_on):
        return transformers.LlamaForCausalLM(cfg).eval()


def _estimate(model: Any, **kwargs: Any) -> Any:
    from jupyter_gpumem import estimate_generate

    est = estimate_generate(model, **SIZES, device="cuda", **KWARGS, **kwargs)
    assert est.peak_bytes is not None, est.reason
    return est


def _facts() -> Any:
    import torch

    from jupyter_gpumem.tuner.estimation.fake_peaks import device_facts

    return device_facts(torch, torch.device("cuda", torch.cuda.current_device()))


def _held_now(own: Collection[int] = ()) -> int:
    """Bytes requested by the allocated blocks of this device that are neither at ``own`` nor a
    library workspace (found again by clearing them, as the estimator does): what an estimate
    starting now finds held."""
    import torch

    from jupyter_gpumem.tuner.estimation.fake_peaks import library_workspaces

    index = torch.cuda.current_device()
    workspaces = library_workspaces(torch, torch.device("cuda", index))
    assert workspaces, "this torch cannot clear its library workspaces: they are told by size"
    skip = set(own) | workspaces
    total = 0
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", 0) != index:
            continue
        for b in seg["blocks"]:
            requested = b.get("requested_size") or b["size"]
            if b["state"] == "active_allocated" and b["address"] not in skip:
                total += requested
    return total


def _freed() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _other_card() -> str:
    from jupyter_gpumem.tuner.estimation import cards

    facts = _facts()
    here = cards.present(facts.name, facts.total_bytes, facts.capability).name
    return "L4" if here == "RTX-4090" else "RTX-4090"


def test_a_held_tensor_is_named_to_the_byte_and_left_out_on_request() -> None:
    import torch

    meta = _llama("meta")
    _freed()
    base = _estimate(meta)  # the workspaces exist from here on, and are not held
    assert not _facts().workspace_sizes  # told by address, not by size
    assert not any("told by the size" in n for n in base.notes), base.notes
    assert base.held_bytes == _held_now()
    assert base.breakdown["library_workspace"] >= 32 * MiB  # at least one cuBLAS workspace
    held = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    # the size of cuBLASLt's workspace (a 512 x 512 fp32 weight), and of cuBLAS's on Hopper
    small = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    large = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
    counted = _estimate(meta)
    left_out = _estimate(meta, count_held=False)
    assert counted.held_bytes - base.held_bytes == 2 * GiB + 33 * MiB and counted.held_counted
    assert counted.held_bytes == _held_now()
    assert counted.breakdown["held_before"] - base.breakdown["held_before"] == 2 * GiB + 33 * MiB
    assert counted.breakdown["library_workspace"] == base.breakdown["library_workspace"]
    assert counted.breakdown["unattributed"] == base.breakdown["unattributed"]
    assert counted.peak_bytes - base.peak_bytes == 2 * GiB + 33 * MiB
    assert any(
        n.startswith("held before the call: ") and n.endswith("count_held=False leaves it out)")
        for n in counted.notes
    ), counted.notes
    assert left_out.held_bytes == counted.held_bytes and not left_out.held_counted
    assert left_out.breakdown["held_before"] == 0
    del held, small, large
    _freed()
    fresh = _estimate(meta, count_held=False)
    assert (left_out.peak_bytes, left_out.peak_reserved_bytes) == (
        fresh.peak_bytes,
        fresh.peak_reserved_bytes,
    )


def test_a_verdict_for_another_card_is_the_same_whatever_is_held_here() -> None:
    import torch

    meta, other = _llama("meta"), _other_card()
    held = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    there = _estimate(meta, gpu=other)
    assert there.held_bytes >= 2 * GiB and not there.held_counted
    assert there.breakdown["held_before"] == 0
    assert f"left out: it is held here, not on the {other}" in there.notes[-1]
    del held
    _freed()
    alone = _estimate(meta, gpu=other)
    assert there.verdict is not None and alone.verdict is not None
    assert abs(there.verdict.needed_bytes - alone.verdict.needed_bytes) <= 0.01 * (
        alone.verdict.needed_bytes
    )
    assert there.peak_bytes == alone.peak_bytes


def test_counted_and_left_out_figures_against_a_measured_generate() -> None:
    """The issue's notebook order: the real copy loaded, then its meta model estimated. Counted,
    the real copy's weights come twice; left out, the figure is the real call's without what
    the process held. The real model's own estimate counts the 2 GiB the call finds."""
    import torch

    real, meta = _llama("cuda"), _llama("meta")
    weights = sum(p.nbytes for p in real.parameters())
    held = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    _freed()
    of_real = _estimate(real)
    of_meta = _estimate(meta)
    of_meta_alone = _estimate(meta, count_held=False)
    own = {t.untyped_storage().data_ptr() for t in (*real.parameters(), *real.buffers())}
    assert of_real.held_bytes == _held_now(own)  # the real weights are the model's
    assert of_meta.held_bytes == _held_now() >= weights + 2 * GiB
    ids = torch.randint(1, 1000, (SIZES["batch_size"], SIZES["prompt_tokens"]), device="cuda")
    mask = torch.ones_like(ids)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = real.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=SIZES["max_new_tokens"], **KWARGS
        )
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated()
    assert out.shape == (SIZES["batch_size"], SIZES["prompt_tokens"] + SIZES["max_new_tokens"])
    print(
        f"measured {measured}, real {of_real.peak_bytes}, meta counted {of_meta.peak_bytes}, "
        f"meta left out {of_meta_alone.peak_bytes}, held {of_real.held_bytes}"
    )
    assert abs(of_real.peak_bytes - measured) <= TOLERANCE * measured
    assert abs(of_meta_alone.peak_bytes - (measured - of_real.held_bytes)) <= (TOLERANCE * measured)
    doubled = of_meta.peak_bytes - of_real.peak_bytes  # the real copy, counted beside the meta's
    assert abs(doubled - (of_meta.held_bytes - of_real.held_bytes)) <= TOLERANCE * measured
    del held, out, ids, mask


def test_a_trial_holds_its_own_gradients_and_optimizer_state_as_its_own() -> None:
    """Gradients and optimizer state the user left are freed by the trial, not held."""
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    batch = torch.randn(64, 4096, device="cuda")
    trial = Trial(model, batch, lambda m, b: m(b).sum(), optimizer=opt)
    model(batch).sum().backward()
    opt.step()  # gradients and AdamW state on the device
    _freed()
    before: Any = trial.estimate()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), batch, *grads, *state)}
    assert before.held_bytes == _held_now(own)
    held = torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    counted: Any = trial.estimate()
    left_out: Any = trial.estimate(count_held=False)
    assert counted.breakdown["held_before"] - before.breakdown["held_before"] == 2 * GiB
    assert counted.peak_bytes - before.peak_bytes == 2 * GiB
    assert left_out.breakdown["held_before"] == 0
    del held
