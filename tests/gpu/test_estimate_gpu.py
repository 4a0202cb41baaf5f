"""Estimates on fake tensors against measured trials on a real GPU (issue 14).

GPT-2 124M (random weights, batch 8 x 1024, fp32 AdamW) as it is, with checkpointed blocks and
with bf16 autocast; torchvision ResNet-50 (batch 64, SGD with momentum): each estimate within 5%
of the trial's exact measured peak. ``max_batch_size`` for GPT-2 under 20 GiB: the batch it gives
runs within the budget and the next size up does not. The table (model, estimate, measured,
error, seconds) goes to ``$GPUMEM_OUT/estimate.json``, with GPT-2 in pure bf16 and with SGD beyond
the issue's list, and fp16 autocast, which is refused with its reason.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.gpu_table import gpu_table

GiB = 2**30
TOLERANCE_PCT = 5.0
BUDGET = 20 * GiB


@pytest.fixture(scope="module")
def table() -> Iterator[dict[str, Any]]:
    """Rows of the table, written when the module ends."""
    yield from gpu_table("estimate.json")


@pytest.fixture(scope="module")
def gpt2() -> Iterator[Any]:
    import torch

    if not torch.cuda.is_available():  # module fixtures run before the autouse skip
        pytest.skip("needs a CUDA device")
    transformers = pytest.importorskip("transformers")
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (8, 1024), device="cuda")
    yield Trial(model, ids, _gpt2_loss, optimizer=opt, warmup=2, steps=3)
    del model, opt, ids
    gc.collect()
    torch.cuda.empty_cache()


def _gpt2_loss(m: Any, b: Any) -> Any:
    return m(b, labels=b).loss


def _compare(trial: Any, name: str, table: dict[str, Any], **config: Any) -> dict[str, Any]:
    """Estimate, then measure, the same configuration; one row of the table."""
    t0 = time.perf_counter()
    est = trial.estimate(**config)
    seconds = time.perf_counter() - t0
    result = trial.run(est.config)
    row = {
        "model": name,
        "configuration": est.label,
        "estimated_bytes": est.peak_bytes,
        "measured_bytes": result.peak_allocated_bytes,
        "error_pct": est.error_pct(result.peak_allocated_bytes),
        "estimate_s": seconds,
        "estimated_phase": est.phase,
        "measured_phase": result.report.main.peak_phase if result.report else None,
        "estimated_breakdown": est.breakdown,
        "measured_breakdown": result.breakdown,
        "estimated_reserved_bytes": est.peak_reserved_bytes,
        "measured_reserved_bytes": result.peak_reserved_bytes,
        "resident_bytes": est.resident_bytes,
        "workspace_bytes": est.workspace_bytes,
        "context_bytes": est.context_bytes,
        "reason": est.reason,
        "status": result.status,
        "vs_estimate": result.vs_estimate,
    }
    table["rows"].append(row)
    print(f"\n{name} {est.label}: {result.vs_estimate} in {seconds:.2f} s")
    print(est)
    for key in sorted(set(est.breakdown or {}) | set(result.breakdown or {})):
        e, m = (est.breakdown or {}).get(key, 0), (result.breakdown or {}).get(key, 0)
        print(
            f"  {key:<16} est {e / GiB:8.3f}  measured {m / GiB:8.3f}  diff {(e - m) / 2**20:+9.1f} MiB"
        )
    assert result.status == "ok", result.error
    assert est.peak_bytes is not None, est.reason
    assert result.estimate is est  # the measured result carries the estimate
    return row


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("GPT-2 124M", {}),
        ("GPT-2 124M", {"checkpoint": "blocks"}),
        ("GPT-2 124M", {"precision": "bf16-autocast"}),
        ("GPT-2 124M", {"precision": "bf16"}),  # beyond the list
        ("GPT-2 124M", {"optimizer": "sgd"}),
    ],
)
def test_gpt2_estimate_within_5_percent(
    gpt2: Any, table: dict[str, Any], name: str, config: dict[str, Any]
) -> None:
    row = _compare(gpt2, name, table, **config)
    assert abs(row["error_pct"]) <= TOLERANCE_PCT, row
    assert row["estimate_s"] < 60  # 10 s is the goal; the JSON has the time


def test_fp16_loss_scaling_is_refused_with_its_reason(gpt2: Any, table: dict[str, Any]) -> None:
    est = gpt2.estimate(precision="fp16-autocast")
    table["rows"].append({"model": "GPT-2 124M", "configuration": est.label, "reason": est.reason})
    assert est.peak_bytes is None and "loss scaling" in (est.reason or "")


def test_an_estimate_uses_no_gpu_memory(gpt2: Any) -> None:
    import torch

    gpt2.estimate()  # the device's library workspaces exist from here on
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    gpt2.estimate(checkpoint="blocks")
    assert torch.cuda.max_memory_allocated() == before == torch.cuda.memory_allocated()


def test_resnet50_estimate_within_5_percent(table: dict[str, Any]) -> None:
    import torch

    torchvision = pytest.importorskip("torchvision")
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images = torch.randn(64, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (64,), device="cuda")
    trial = Trial(
        model,
        (images, labels),
        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        optimizer=opt,
        warmup=2,
        steps=3,
    )
    row = _compare(trial, "ResNet-50", table)
    assert abs(row["error_pct"]) <= TOLERANCE_PCT, row


def test_gpt2_max_batch_size_under_20_gib(gpt2: Any, table: dict[str, Any]) -> None:
    import torch

    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    def make_batch(n: int) -> Any:
        return torch.randint(0, 50257, (n, 1024), device="cuda")

    t0 = time.perf_counter()
    size = gpt2.max_batch_size(BUDGET, make_batch)
    seconds = time.perf_counter() - t0
    search = gpt2.last_search
    measured = {}
    for n in (size, size + 1):
        trial = Trial(
            gpt2.model, make_batch(n), _gpt2_loss, optimizer=gpt2.optimizer, warmup=1, steps=2
        )
        result = trial.run(Config())
        measured[n] = {
            "status": result.status,
            "measured_bytes": result.peak_allocated_bytes,
            "estimated_bytes": dict(search.tried).get(n),
        }
        del trial, result
        gc.collect()
    table["max_batch_size"] = {
        "budget_bytes": BUDGET,
        "batch_size": size,
        "seconds": seconds,
        "tried": search.tried,
        "runs": measured,
    }
    print(
        f"\nmax_batch_size under 20 GiB: {size} in {seconds:.1f} s; tried {search.tried}; {measured}"
    )
    assert size >= 1
    assert measured[size]["status"] == "ok"
    assert measured[size]["measured_bytes"] <= BUDGET
    assert measured[size + 1]["status"] != "ok" or measured[size + 1]["measured_bytes"] > BUDGET
    assert seconds < 180  # 60 s is the goal; the JSON has the time
