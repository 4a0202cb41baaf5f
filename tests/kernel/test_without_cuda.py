"""Estimates for a GPU from a torch without CUDA: the stand-in device, its tables, and the verdicts.

The stand-in device is registered only in the worker process (it changes the process for good), so
every check that needs it runs in the estimate's worker process. The figures are compared
with what the same configurations measured on an H200 (``tests/fixtures/h200_measured.json``,
written on the GPU machine by ``bench/model_zoo.py``; the kind and versions are in the file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.techniques import Config  # noqa: E402
from jupyter_gpumem.tuner.estimation import (  # noqa: E402
    cards,
    cuda_attention,
    cuda_autocast,
    cuda_stand_in,
    graph_pool,
    without_cuda,
)
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "h200_measured.json"

pytestmark = pytest.mark.skipif(
    cuda_stand_in.unavailable(torch) is not None, reason="torch too old for the stand-in device"
)


def _mlp() -> tuple[Any, Any, Any]:
    with torch.device("meta"):
        model = torch.nn.Sequential(
            torch.nn.Linear(256, 1024), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 10)
        )
    batch = torch.randn(64, 256)
    return model, batch, lambda m, b: m(b).float().logsumexp(-1).mean()


# -- the tables ----------------------------------------------------------------------------------
def test_the_autocast_table_is_the_policy_this_torch_registers_for_cuda() -> None:
    registered = cuda_autocast.cuda_autocast_ops(torch)
    assert cuda_autocast.unlisted(torch) == ()
    assert cuda_autocast.listed() <= registered | {"aten::rms_norm"}


def _dtypes_under_autocast(_: Any) -> dict[str, str]:
    device = cuda_stand_in.device(torch)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), torch.autocast(device.type, dtype=torch.bfloat16):
        x = torch.empty(8, 16, device=device)
        w = torch.nn.Parameter(torch.empty(16, 16, device=device))
        y = torch.nn.functional.linear(x, w)
        out = {
            "linear": y,
            "layer_norm": torch.nn.functional.layer_norm(y, (16,)),
            "softmax": torch.softmax(y, -1),
            "sum": y.sum(),
            "sin": torch.sin(y),
            "addcmul": torch.addcmul(x, y, y),
        }
        again = torch.nn.functional.linear(x, w)
        cached = again.dtype == y.dtype
    return {**{k: str(v.dtype) for k, v in out.items()}, "cached": str(cached)}


def _silu_backward_ops(_: Any) -> list[str]:
    """The ops a SiLU's backward reaches a dispatch mode with, on the stand-in device."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    device = cuda_stand_in.device(torch)
    seen: list[str] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, 8, device=device, requires_grad=True)
        y = torch.nn.functional.silu(x)
        grad = torch.ones_like(y)
        with Seen():
            torch.autograd.grad(y, x, grad)
    return [name for name in seen if not name.startswith(("device", "detach"))]


def test_a_fused_cuda_kernel_runs_whole_on_the_stand_in_device() -> None:
    """CUDA's silu_backward is one kernel; the stand-in once ran its composite (six ops)."""
    assert without_cuda.WORKER.call(_silu_backward_ops, None) == ["silu_backward.default"]


def test_the_stand_in_device_autocasts_as_cuda_does_not_as_the_cpu_does() -> None:
    got = without_cuda.WORKER.call(_dtypes_under_autocast, None)
    assert got == {
        "linear": "torch.bfloat16",
        "layer_norm": "torch.float32",  # fp32 on CUDA; the CPU keeps bf16
        "softmax": "torch.float32",
        "sum": "torch.float32",
        "sin": "torch.bfloat16",  # not in the policy: the input's dtype
        "addcmul": "torch.float32",  # promote: the widest input
        "cached": "True",
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(torch.ones(2, 4), torch.ones(4, 4))
        assert torch.nn.functional.layer_norm(y, (4,)).dtype == torch.bfloat16


def test_a_mask_that_requires_grad_with_dropout_takes_the_math_path() -> None:
    q = torch.empty(2, 8, 32, 64, dtype=torch.bfloat16, device="meta")
    mask = torch.empty(1, 8, 32, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    assert cuda_attention.backend(torch, q, q, q, mask, False, 0.1) == "math"  # T5
    assert cuda_attention.backend(torch, q, q, q, mask, False, 0.0) == "efficient"  # Swin
    with torch.no_grad():
        assert cuda_attention.backend(torch, q, q, q, mask, False, 0.1) == "efficient"


@pytest.mark.parametrize(
    ("dtype", "heads", "head_dim", "mask", "gqa", "expected"),
    [
        (torch.bfloat16, (8, 8), 64, False, False, "flash"),
        (torch.float16, (8, 2), 128, False, True, "flash"),
        (torch.bfloat16, (8, 8), 64, True, False, "efficient"),
        (torch.float32, (8, 8), 64, False, False, "efficient"),
        (torch.float32, (8, 8), 6, False, False, "math"),
        (torch.float32, (8, 2), 64, False, True, "math"),
        (torch.bfloat16, (8, 8), 512, False, False, "efficient"),
    ],
)
def test_attention_picks_the_kernel_cuda_picks(
    dtype: Any, heads: tuple[int, int], head_dim: int, mask: bool, gqa: bool, expected: str
) -> None:
    q = torch.empty(2, heads[0], 32, head_dim, dtype=dtype, device="meta")
    kv = torch.empty(2, heads[1], 32, head_dim, dtype=dtype, device="meta")
    m = torch.empty(2, 1, 32, 32, dtype=torch.bool, device="meta") if mask else None
    assert cuda_attention.backend(torch, q, kv, kv, m, gqa) == expected


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(256, 768)

    def forward(self, x: Any) -> Any:
        q, k, v = self.qkv(x).view(x.size(0), x.size(1), 3, 4, 64).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_flash_attention_keeps_no_score_matrix() -> None:
    with torch.device("meta"):
        model = _Attention()
    batch = torch.randn(2, 2048, 256)
    opt = torch.optim.SGD(model.parameters())
    trial = Trial(model, batch, lambda m, b: m(b).float().mean(), optimizer=opt, device="cpu")
    on_gpu = trial.estimate(gpu="H200", precision="bf16-autocast")
    scores = 2 * 4 * 2048 * 2048 * 2  # one bf16 score matrix: 64 MiB
    assert on_gpu.peak_bytes is not None, on_gpu.reason
    assert on_gpu.breakdown["activations"] < scores / 4
    assert on_gpu.notes[0] == "estimated without CUDA, for the H200"


# -- the entry points ----------------------------------------------------------------------------
def test_a_cpu_trial_with_a_gpu_named_answers_for_that_card() -> None:
    model, batch, loss = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    found = Trial(model, batch, loss, optimizer=opt, device="cpu").estimate(gpu="RTX-4090")
    assert found.peak_bytes is not None, found.reason
    assert found.notes[0] == "estimated without CUDA, for the RTX-4090"
    assert found.verdict is not None and found.verdict.fits
    assert found.device_total_bytes == cards.card("RTX-4090").total_bytes
    assert sum(found.breakdown.values()) == found.peak_bytes
    # the library workspaces of a fresh process on an Ada card: torch's defaults, two handles
    assert found.breakdown["library_workspace"] == sum(
        cuda_stand_in.workspaces(cards.card("RTX-4090"))
    )
    assert all(p.is_meta for p in model.parameters())  # the kernel's model untouched


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="a torch built with CUDA")
def test_a_cuda_trial_on_a_torch_without_cuda_answers_for_an_h100() -> None:
    model, batch, loss = _mlp()
    opt = torch.optim.SGD(model.parameters())
    found = Trial(model, batch, loss, optimizer=opt, device="cuda").estimate()
    assert found.peak_bytes is not None, found.reason
    assert found.notes[0] == "estimated without CUDA, for the H100-80GB"


def test_what_cannot_be_estimated_without_cuda_says_why() -> None:
    model, batch, loss = _mlp()
    trial = Trial(model, batch, loss, optimizer=torch.optim.AdamW(model.parameters()), device="cpu")
    no_bf16 = trial.estimate(gpu="T4", precision="bf16-autocast")
    assert no_bf16.peak_bytes is None and "no bfloat16 support" in no_bf16.reason
    ranks = trial.estimate(gpu="H200", config=Config(parallel="ddp", world_size=2))
    assert ranks.peak_bytes is None and "parallel=None" in ranks.reason
    with pytest.raises(ValueError, match="unknown gpu"):
        trial.estimate(gpu="H300")


def test_a_failure_in_the_child_comes_back_as_its_reason() -> None:
    def fails(_: Any) -> None:
        raise RuntimeError("the step cannot run")

    assert without_cuda.WORKER.call(fails, None) == "RuntimeError: the step cannot run"
    assert without_cuda.WORKER.call(_dtypes_under_autocast, None)["linear"] == "torch.bfloat16"


# -- against the H200 ----------------------------------------------------------------------------
def _fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", ["gpt2-fp32", "llama-bf16-autocast"])
def test_estimated_without_cuda_as_measured_on_an_h200(name: str) -> None:
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "bench"))
    import model_zoo
    import zoo

    row = next(r for r in _fixture()["cases"] if r["case"] == name)
    case = zoo.case(name)
    built = case.build("meta", "bench")
    trial = model_zoo.trial_of(case, built, "cpu")
    found = trial.estimate(gpu="H200", config=model_zoo.config_of(case))
    assert found.peak_bytes is not None, found.reason
    assert found.peak_bytes == pytest.approx(row["measured_allocated"], rel=0.02)
    assert found.peak_reserved_bytes == pytest.approx(row["measured_reserved"], rel=0.05)
    # the GPU machine's own estimate of the same configuration
    assert found.peak_bytes == pytest.approx(row["estimated_allocated"], rel=0.005)


def test_generate_is_estimated_for_a_card_from_the_cpu() -> None:
    transformers = pytest.importorskip("transformers")
    from jupyter_gpumem import estimate_generate

    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    sizes = {"batch_size": 2, "prompt_tokens": 16, "max_new_tokens": 8, "pad_token_id": 0}
    found = estimate_generate(model, device="cpu", gpu="A100-40GB", **sizes)
    assert found.peak_bytes is not None, found.reason
    assert found.notes[0] == "estimated without CUDA, for the A100-40GB"
    assert found.breakdown["kv_cache"] > 0 and found.verdict is not None
    long = estimate_generate(
        model, device="cpu", gpu="A100-40GB", **{**sizes, "max_new_tokens": 64}
    )
    for est in (found, long):  # the decode steps filled in for the allocator keep time order
        phases = est.phase_peaks
        assert phases is not None and {"prefill", "decode"} <= set(phases)
        assert max(phases.values()) == est.peak_bytes == phases[est.phase]
    # a static cache is compiled on CUDA, and so here: its decode calls in a CUDA graph pool,
    # which reserves the card's L2-sized flush buffer and cuBLAS workspace beside the default pool
    static = estimate_generate(model, gpu="H200", cache_implementation="static", **sizes)
    eager = estimate_generate(
        model, gpu="H200", cache_implementation="static", disable_compile=True, **sizes
    )
    assert static.peak_bytes is not None and eager.peak_bytes is not None, static.reason
    assert graph_pool.NOTE in static.notes and graph_pool.NOTE not in eager.notes
    assert static.peak_reserved_bytes >= eager.peak_reserved_bytes + (92 << 20)
    other = transformers.CompileConfig(mode="max-autotune-no-cudagraphs")
    refused = estimate_generate(
        model, gpu="H200", cache_implementation="static", compile_config=other, **sizes
    )
    assert refused.peak_bytes is None
    assert "mode='max-autotune-no-cudagraphs'" in refused.reason
    assert "disable_compile=True" in refused.reason
    assert graph_pool.requests((9, 0), cards.card("H200").l2_cache_bytes) == (
        graph_pool.PoolRequests((32 << 20,), 60 << 20)
    )


def _zoo_cases() -> list[Any]:
    sys.path.insert(0, str(ROOT / "bench"))
    import zoo

    return [
        pytest.param(
            c,
            id=c.name,
            marks=pytest.mark.skipif(bool(zoo.available(c)), reason=zoo.available(c) or ""),
        )
        for c in zoo.CASES
    ]


@pytest.mark.parametrize("case", _zoo_cases())
def test_every_family_of_the_zoo_is_estimated_for_a_card_from_the_cpu(case: Any) -> None:
    """The CPU zoo through the path without CUDA: every case answers for the H200 (or gives the
    reason CUDA gives too), its breakdown summing to its peak, the meta model untouched."""
    import model_zoo
    import zoo

    from jupyter_gpumem import estimate_generate

    built = case.build("meta", "tiny")
    if case.workload == "generate":
        batch, prompt, new = zoo.GENERATE["tiny"]
        found = estimate_generate(
            built.model, batch_size=batch, prompt_tokens=prompt, max_new_tokens=new, gpu="H200",
            **model_zoo.generate_kwargs(case, new),
        )  # fmt: skip
        if found.peak_bytes is None:  # a sliding window's count, guarded on: refused on CUDA too
            assert found.reason == graph_pool.RECOMPILES.format("StaticSlidingWindowLayer")
            assert case.generate.get("cache_implementation") == "static"
            return
    else:
        trial = model_zoo.trial_of(case, built, "cpu")
        found = trial.estimate(gpu="H200", config=model_zoo.config_of(case))
    assert found.peak_bytes is not None, found.reason
    assert found.notes[0] == "estimated without CUDA, for the H200"
    assert sum(found.breakdown.values()) == found.peak_bytes
    assert found.peak_reserved_bytes >= found.peak_bytes
    assert all(p.is_meta for p in built.model.parameters())


def test_the_largest_batch_for_a_card_is_searched_from_the_cpu() -> None:
    model, batch, loss = _mlp()
    trial = Trial(model, batch, loss, optimizer=torch.optim.AdamW(model.parameters()), device="cpu")
    budget = 80 * 2**20  # the library workspaces (65 MiB on an H200) and a little more
    n = trial.max_batch_size(budget, lambda n: torch.randn(n, 256), gpu="H200", high=4096)
    search = trial.last_search
    assert 1 <= n < 4096
    assert search.estimate is not None and search.estimate.peak_bytes <= budget
    assert search.above is not None and search.above.peak_bytes > budget
    assert search.estimate.notes[0] == "estimated without CUDA, for the H200"


def test_a_convolutional_model_is_told_what_is_not_modelled() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten())
    batch = torch.randn(4, 3, 16, 16)
    trial = Trial(
        model,
        batch,
        lambda m, b: m(b).sum(),
        optimizer=torch.optim.SGD(model.parameters()),
        device="cpu",
    )
    found = trial.estimate(gpu="H200")
    assert found.peak_bytes is not None, found.reason
    assert any("convolution workspaces are not counted" in n for n in found.notes)
    model, batch, loss = _mlp()
    plain = Trial(model, batch, loss, optimizer=torch.optim.SGD(model.parameters()), device="cpu")
    assert not any("convolution" in n for n in plain.estimate(gpu="H200").notes)
