"""Plans for a model that holds no weights: estimated, never measured, and confirmed here by
running the plan on the same architecture with real weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.plan import fit_plan, plan
from jupyter_gpumem.tuner.trial import Trial

transformers = pytest.importorskip("transformers")


def _trial(device: str) -> Trial:
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
        ids = torch.zeros(4, 64, dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(model, ids, _loss, optimizer=opt)


def _loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


def test_a_meta_plan_fits_and_the_real_weights_confirm_it() -> None:
    meta = _trial("meta")
    base = meta.estimate().peak_bytes
    assert base is not None
    budget = round(0.8 * base)
    # checkpointing and precision only: 8-bit AdamW alone would fit this budget too
    found = fit_plan(meta, budget, techniques=("checkpoint", "precision"))
    assert found.fits and found.result is None and found.predicted_step_s is None
    assert found.checkpoint and found.optimizer is None  # checkpointing needed, AdamW kept
    assert found.predicted_peak_bytes is not None and found.predicted_peak_bytes <= budget
    assert all(p.is_meta for p in meta.model.parameters())
    text = "\n".join(found.reasoning)
    assert "holds no weights" in text and found.reasoning[-1].startswith("Not verified")
    assert found.reasoning[2].startswith(f"Plan: {found.config}")
    # one block fewer does not fit: the plan checkpoints the fewest blocks that do
    fewer = Config(checkpoint=found.checkpoint[:-1] or None, precision=found.precision)
    fewer_peak = meta.estimate(config=fewer).peak_bytes
    assert fewer_peak is not None and fewer_peak > budget - round(0.01 * budget)
    real = _trial("cpu").run(found.config)
    assert real.status == "ok" and real.peak_allocated_bytes == found.predicted_peak_bytes


def test_a_budget_nothing_meets_says_so() -> None:
    meta = _trial("meta")
    found = plan(meta, "64KiB")
    assert not found.fits and found.checkpoint == ()
    assert found.reasoning[-1].startswith("Nothing estimated fits")
    assert any("(4 of 4 blocks)" in line for line in found.reasoning)


def test_the_tuner_plans_for_a_meta_model_and_says_why_it_cannot_run_it(shell: Any) -> None:
    import jupyter_gpumem

    meta = _trial("meta")
    shell.user_ns["opt"] = meta.optimizer
    tuner = jupyter_gpumem.tune(meta.model, "opt", trial=meta, shell=shell)
    base = meta.estimate().peak_bytes
    assert base is not None
    found = tuner.fit(round(0.8 * base))
    assert found.fits and tuner.config == found.config
    assert "holds no weights" in tuner.panel.fit_text.value
    with pytest.raises(ValueError, match="meta device: run\\(\\) runs real steps"):
        tuner.rerun()
    assert all(p.is_meta for p in meta.model.parameters())
