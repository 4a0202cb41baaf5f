"""The model zoo at its tiny size on the CPU: every family the GPU zoo measures, estimated here.

For each case of ``bench/zoo.py`` whose packages are installed: the estimate of the model on
the meta device equals, to the byte, the estimate of the same architecture with random
weights, and both are within 1% of the peak a ``%%gpumem`` cell measures when it runs the same
steps (or the same ``generate`` call) on the CPU. A ``generate`` row decodes long enough that
the cache holds the peak, which both name ``kv_cache`` with the same bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import model_zoo  # noqa: E402 (bench/ on the path first)
import zoo  # noqa: E402

SIZE = "tiny"
TOLERANCE = 0.01
# the step a training cell runs, as the trial does: the forward under the row's precision
TRAIN_STEP = """
for _ in range(3):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del loss
"""
INFERENCE_STEP = """
for _ in range(3):
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = loss_fn(model, batch)
    del out
"""
GENERATE_STEP = """
with torch.no_grad():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, **kwargs)
"""


def _cases(*workloads: str) -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=pytest.mark.skipif(bool(why), reason=why or ""))
        for c in zoo.CASES
        if c.workload in workloads
        for why in [zoo.available(c)]
    ]


def _quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


@pytest.mark.parametrize("case", _cases("train", "lora", "inference"))
def test_a_step_is_estimated_from_the_meta_device_as_measured(
    shell: InteractiveShell, case: zoo.Case
) -> None:
    _quiet()
    meta_estimate, meta = model_zoo.estimate(case, SIZE, "cpu")
    assert meta_estimate.peak_bytes is not None, meta_estimate.reason
    assert all(p.is_meta for p in meta.model.parameters())
    real = case.build("cpu", SIZE)
    real_estimate = model_zoo.trial_of(case, real, "cpu").estimate(config=model_zoo.config_of(case))
    assert real_estimate.peak_bytes == meta_estimate.peak_bytes
    assert real_estimate.breakdown == meta_estimate.breakdown

    params = [p for p in real.model.parameters() if p.requires_grad]
    shell.user_ns.update(
        torch=torch, model=real.model, batch=real.batch, loss_fn=real.loss,
        opt=torch.optim.AdamW(params, lr=1e-4) if case.trains else None,
        autocast=case.precision == "bf16-autocast",
    )  # fmt: skip
    body = TRAIN_STEP if case.trains else INFERENCE_STEP
    assert shell.run_cell(f"%%gpumem -o r --quiet\n{body}").success
    measured = shell.user_ns["r"].peak_allocated_bytes
    assert meta_estimate.peak_bytes == pytest.approx(measured, rel=TOLERANCE)


@pytest.mark.parametrize("case", _cases("generate"))
def test_generate_is_estimated_from_the_meta_device_as_measured(
    shell: InteractiveShell, case: zoo.Case
) -> None:
    from jupyter_gpumem import estimate_generate

    _quiet()
    batch, prompt, new = zoo.GENERATE[SIZE]
    meta_estimate, meta = model_zoo.estimate(case, SIZE, "cpu")
    if meta_estimate.peak_bytes is None:  # a cache the estimate cannot model says why
        assert "compile" in (meta_estimate.reason or ""), meta_estimate.reason
        return
    assert all(p.is_meta for p in meta.model.parameters())
    real = case.build("cpu", SIZE)
    kwargs = model_zoo.generate_kwargs(case, new)
    real_estimate = estimate_generate(
        real.model, batch_size=batch, prompt_tokens=prompt, max_new_tokens=new, device="cpu",
        **kwargs,
    )  # fmt: skip
    assert real_estimate.peak_bytes == meta_estimate.peak_bytes

    torch.manual_seed(0)
    ids = torch.randint(1, 100, (batch, prompt))
    shell.user_ns.update(torch=torch, model=real.model, ids=ids, new=new, kwargs=kwargs)
    assert shell.run_cell(f"%%gpumem -o r --quiet\n{GENERATE_STEP}").success
    r = shell.user_ns["r"]
    assert shell.user_ns["out"].shape[-1] == prompt + new
    assert meta_estimate.peak_bytes == pytest.approx(r.peak_allocated_bytes, rel=TOLERANCE)
    assert meta_estimate.breakdown is not None
    cache = meta_estimate.breakdown["kv_cache"]
    assert cache == r.breakdown["kv_cache"]
    # the same category holds the peak in both (the cache, where the decode is long enough)
    assert _largest(meta_estimate.breakdown) == _largest(r.breakdown), meta_estimate.breakdown
    if (
        case.family in ("llama", "qwen2-tied", "opt")
        and case.generate.get("cache_implementation") is None
    ):
        assert _largest(r.breakdown) == "kv_cache", r.breakdown


def _largest(breakdown: dict[str, int]) -> str:
    return max((n, k) for k, n in breakdown.items() if k not in ("parameters", "inputs", "other"))[
        1
    ]


@pytest.mark.parametrize("case", _cases("train", "lora", "generate"))
def test_zoo_models_are_built_as_loading_leaves_them(case: zoo.Case) -> None:
    """Tied embeddings stay one tensor, and no buffer is left uninitialised (no to_empty)."""
    _quiet()
    for device in ("cpu", "meta"):
        model = case.build(device, SIZE).model
        config = getattr(model, "config", None)
        get_in = getattr(model, "get_input_embeddings", None)
        get_out = getattr(model, "get_output_embeddings", None)
        if config is not None and get_in is not None and get_out is not None and get_out():
            tied = getattr(config.get_text_config(), "tie_word_embeddings", False)
            assert (get_in().weight is get_out().weight) == bool(tied), case.name
        if device == "cpu":
            for name, buffer in model.named_buffers():
                if buffer.is_floating_point():
                    assert torch.isfinite(buffer).all(), name
