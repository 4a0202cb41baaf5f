"""Will it run? ``estimate_generate`` from a meta model beside a real ``generate`` cell measured
on the CPU: the same peak to the byte, the same phase and step, nothing materialised."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

pytest.importorskip("transformers")

SETUP = """
import torch, transformers
from transformers import GPT2Config, GPT2LMHeadModel
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_embd=64, n_head=2, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config).eval()
with torch.device("meta"):
    meta = GPT2LMHeadModel(config).eval()
"""


@pytest.mark.parametrize(
    ("batch", "prompt", "new", "extra"),
    [
        (4, 8, 6, {}),
        (2, 16, 24, {}),  # the steps between the first and last ones skipped
        (2, 16, 10, {"cache_implementation": "static"}),
        (3, 7, 30, {"cache_implementation": "static"}),  # the steps between skipped
        (2, 5, 12, {"cache_implementation": "static", "do_sample": True}),
        (3, 5, 4, {"do_sample": True}),
        (3, 5, 12, {"do_sample": True, "top_k": 5, "repetition_penalty": 1.2}),
    ],
)
def test_the_estimate_is_the_measured_peak_to_the_byte(
    shell: InteractiveShell, batch: int, prompt: int, new: int, extra: dict[str, Any]
) -> None:
    from jupyter_gpumem import estimate_generate

    assert shell.run_cell(SETUP).success
    meta = shell.user_ns["meta"]
    # min_new_tokens: a random model may pick the end token; the estimate takes every step
    kwargs = {"pad_token_id": 0, "min_new_tokens": new, **extra}
    est = estimate_generate(
        meta, batch_size=batch, prompt_tokens=prompt, max_new_tokens=new, device="cpu", **kwargs
    )
    assert est.peak_bytes is not None, est.reason
    assert all(p.is_meta for p in meta.parameters())
    shell.user_ns.update(kwargs=kwargs, new=new)
    prompts = f"ids = torch.randint(1, 100, ({batch}, {prompt})); mask = torch.ones_like(ids)"
    assert shell.run_cell(prompts).success
    run = "out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, **kwargs)"
    assert shell.run_cell(f"%%gpumem -o r --quiet\n{run}").success
    r = shell.user_ns["r"]
    assert shell.user_ns["out"].shape == (batch, prompt + new)
    assert est.peak_bytes == r.peak_allocated_bytes
    assert (est.phase, r.peak_phase, r.peak_step) == ("decode", "decode", new - 1)
    assert est.breakdown is not None and est.breakdown["kv_cache"] == r.breakdown["kv_cache"]
    assert est.breakdown["parameters"] == r.breakdown["parameters"]
    assert est.label == f"generate: {batch} x {prompt} tokens + {new} new"


def test_what_it_takes_and_what_it_refuses() -> None:
    import torch
    import transformers

    from jupyter_gpumem import estimate_generate

    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    sizes = {"batch_size": 1, "prompt_tokens": 4, "max_new_tokens": 2}
    with pytest.raises(
        ValueError,
        match="batch_size must be a batch size, a whole number from 1 to 2,147,483,647; got int 0",
    ):
        estimate_generate(meta, **{**sizes, "batch_size": 0})
    with pytest.raises(ValueError, match="max_length comes from"):
        estimate_generate(meta, **sizes, max_length=9)
    with pytest.raises(TypeError, match=r"with \.generate\(\)"):
        estimate_generate(torch.nn.Linear(2, 2), **sizes)
    compiled = transformers.CompileConfig()
    compiled._compile_all_devices = True  # as generate compiles a static cache's calls on CUDA
    static = {"cache_implementation": "static", "compile_config": compiled, "pad_token_id": 0}
    est = estimate_generate(meta, **sizes, device="cpu", **static)
    assert est.peak_bytes is None and "estimate and run it with disable_compile=True" in (
        est.reason or ""
    )
    assert estimate_generate(meta, **sizes, device="cpu", disable_compile=True, **static).peak_bytes
    if not torch.backends.cuda.is_built():  # never an abort: estimated without CUDA
        est = estimate_generate(meta, **sizes, device="cuda", pad_token_id=0)
        assert est.peak_bytes is not None, est.reason
        assert est.notes[0] == "estimated without CUDA, for the H100-80GB"


def test_the_largest_batch_runs_within_the_budget_and_one_more_does_not(
    shell: InteractiveShell,
) -> None:
    from jupyter_gpumem import estimate_generate, max_generate_batch

    assert shell.run_cell(SETUP).success
    meta = shell.user_ns["meta"]
    kwargs = {"pad_token_id": 0, "min_new_tokens": 6}
    one = estimate_generate(
        meta, batch_size=1, prompt_tokens=8, max_new_tokens=6, device="cpu", **kwargs
    )
    assert one.peak_bytes is not None and one.breakdown is not None
    budget = one.peak_bytes + 6 * (one.peak_bytes - one.breakdown["parameters"])
    lines: list[str] = []
    found = max_generate_batch(
        meta, budget, prompt_tokens=8, max_new_tokens=6, device="cpu", progress=lines.append,
        **kwargs,
    )  # fmt: skip
    assert found.batch_size > 1 and found.above is not None and len(found.tried) <= 8
    assert lines == [f"estimating batch size {n:,}" for n, _ in found.tried]
    measured = {}
    for n in (found.batch_size, found.batch_size + 1):  # measured, as a user runs it
        shell.user_ns.update(kwargs=kwargs, n=n)
        cell = "ids = torch.randint(1, 100, (n, 8))\nout = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, **kwargs)"
        assert shell.run_cell(f"%%gpumem -o r --quiet\n{cell}").success
        shell.run_cell("del out")
        measured[n] = shell.user_ns["r"].peak_allocated_bytes
    assert measured[found.batch_size] <= budget < measured[found.batch_size + 1]
    assert found.estimate is not None and found.estimate.batch_size == found.batch_size


@pytest.mark.parametrize(
    ("extra", "calls"),
    [({}, 4), ({"cache_implementation": "static"}, 4), ({"output_scores": True}, 40)],
)
def test_only_a_growing_cache_skips_the_middle_steps(extra: dict[str, Any], calls: int) -> None:
    """A dynamic cache's last steps take the most, and a static one's take what the others took
    but for the tokens so far, so the steps between are not run; anything kept per step
    (scores) is run step by step."""
    import torch
    import transformers

    from jupyter_gpumem import estimate_generate
    from jupyter_gpumem.tuner.estimation.generation import FIRST_STEPS, LAST_STEPS

    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, bos_token_id=0, eos_token_id=0)
    with torch.device("meta"):
        meta = transformers.GPT2LMHeadModel(config).eval()
    seen: list[int] = []
    meta.register_forward_pre_hook(lambda module, args, kwargs: seen.append(1), with_kwargs=True)
    est = estimate_generate(
        meta,
        batch_size=2,
        prompt_tokens=4,
        max_new_tokens=40,
        device="cpu",
        pad_token_id=0,
        **extra,
    )
    assert est.peak_bytes is not None, est.reason
    assert len(seen) == (FIRST_STEPS + LAST_STEPS if calls == 4 else calls)


def test_a_generate_cell_carries_its_estimate(shell: InteractiveShell) -> None:
    """``%%gpumem --estimate est``: the report sets the estimate beside what it measured."""
    from IPython.core.error import UsageError

    from jupyter_gpumem.units import format_bytes

    assert shell.run_cell(SETUP).success
    cell = (
        "from jupyter_gpumem import estimate_generate\n"
        "est = estimate_generate(meta, batch_size=2, prompt_tokens=8, max_new_tokens=6,"
        " device='cpu', pad_token_id=0, min_new_tokens=6)\n"
        "ids = torch.randint(1, 100, (2, 8))"
    )
    assert shell.run_cell(cell).success
    run = (
        "%%gpumem -o r --quiet --estimate est\n"
        "out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),"
        " max_new_tokens=6, pad_token_id=0, min_new_tokens=6)"
    )
    assert shell.run_cell(run).success
    r, est = shell.user_ns["r"], shell.user_ns["est"]
    assert r.peak_allocated_bytes == est.peak_bytes
    peak = format_bytes(est.peak_bytes)
    assert f"estimated {peak}, measured {peak} (error +0.0%)" in r.notes
    for given, says in (("nothing", "no such variable"), ("ids", "it holds a Tensor")):
        with pytest.raises(UsageError, match=f"--estimate {given}: {says}; give the variable"):
            shell.run_cell_magic("gpumem", f"--estimate {given}", "x = 1")
    assert "x" not in shell.user_ns  # the cell did not run


@pytest.mark.parametrize("new", [3, 12])  # every step played; the steps between skipped
def test_a_compiled_static_cache_places_its_decode_calls_in_a_graph_pool(new: int) -> None:
    """generate compiles a static cache's decode calls (on CUDA; here on every device): each
    decode call's storages are the CUDA graph pool's, the prefill's and the cache's never (the
    call standing for a late decode step makes its cache again, which the prefill makes in
    the real call); the warm-up and the recording each make the pool's workspace, the warm-up
    also Inductor's benchmark flush buffer."""
    import torch
    import transformers

    from jupyter_gpumem.tuner.estimation import graph_pool
    from jupyter_gpumem.tuner.estimation.generation import generate_run

    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    with torch.device("meta"):
        meta = transformers.LlamaForCausalLM(config).eval()
    compiled = transformers.CompileConfig()
    compiled._compile_all_devices = True
    kwargs = {"cache_implementation": "static", "compile_config": compiled, "pad_token_id": 0}
    workspace, flush = 4 << 20, 12 << 20
    asks = graph_pool.PoolRequests((workspace,), flush)
    run, notes = generate_run(torch, meta, torch.device("cpu"), (2, 16, new), kwargs, False, asks)
    assert notes == (graph_pool.NOTE,)
    kv = {i for i, category in run.tags if category == "kv_cache"}
    pools = [i for i, category in run.tags if category == "cuda_graph_pool"]
    assert kv and not kv & run.pooled
    # the warm-up's flush buffer and workspace, the recording's workspace
    assert [run.sizes[i] for i in pools] == [flush, workspace, workspace]
    assert set(pools) <= run.pooled
    # each capture first empties the default pool's cache: at the warm-up and the recording
    decoding = sorted(m.time_us for m in run.marks if m.phase == "decode")
    assert len(run.emptied) == graph_pool.RECORDED_CALLS
    assert decoding[0] < run.emptied[0] < decoding[1] < run.emptied[1]
    # and the trees clear every cuBLAS workspace as the warm-up begins
    assert len(run.cleared) == 1 and run.emptied[0] < run.cleared[0] < decoding[1]
    first_decode = min(m.time_us for m in run.marks if m.phase == "decode")
    born = {i: clock for action, i, clock in run.events if action == "alloc"}
    assert run.pooled and all(born[i] > first_decode for i in run.pooled)
    # every decode call made some: the pool's requests come in each of them
    decodes = sorted(m.time_us for m in run.marks if m.phase == "decode")
    ends = [*decodes[1:], max(born.values()) + 1]
    for start, end in zip(decodes, ends, strict=True):
        assert any(start < born[i] < end for i in run.pooled), (start, end)
    # without the graphs' workspaces (on the CPU), the call is refused with its reason
    with pytest.raises(Exception, match="disable_compile=True"):
        generate_run(torch, meta, torch.device("cpu"), (2, 16, new), kwargs, False)


def test_a_compiled_sliding_window_cache_is_refused_with_its_reason() -> None:
    """Gemma-2's static cache keeps a sliding window's token count in a Python int that the
    compiled call guards on (it compiles again on the second decode call): refused, named."""
    import torch
    import transformers

    from jupyter_gpumem.tuner.estimation import graph_pool
    from jupyter_gpumem.tuner.estimation.generation import generate_run
    from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable

    config = transformers.Gemma2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
    )  # fmt: skip
    with torch.device("meta"):
        meta = transformers.Gemma2ForCausalLM(config).eval()
    compiled = transformers.CompileConfig()
    compiled._compile_all_devices = True
    kwargs = {"cache_implementation": "static", "compile_config": compiled, "pad_token_id": 0}
    asks = graph_pool.PoolRequests((1 << 20,), 0)
    with pytest.raises(Unfakeable) as refused:
        generate_run(torch, meta, torch.device("cpu"), (2, 16, 3), kwargs, False, asks)
    assert str(refused.value) == graph_pool.RECOMPILES.format("StaticSlidingWindowLayer")
