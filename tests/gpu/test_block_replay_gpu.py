"""Replayed blocks give the full trace's estimate on the GPU too, one case per zoo family.

As ``tests/kernel/test_block_replay.py`` on the CPU: each family's first case at size ``"tiny"``
with six layers, estimated from the meta device with ``device="cuda"`` twice, with replay and
with every block traced; every figure is the same. On CUDA the backward runs on autograd's
device thread, not the caller's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import model_zoo  # noqa: E402 (bench/ on the path first)
import zoo  # noqa: E402
import zoo_shapes  # noqa: E402

from jupyter_gpumem.tuner.estimation import block_replay  # noqa: E402

FIELDS = ("peak_bytes", "peak_reserved_bytes", "breakdown", "phase", "most_bytes", "reason")


def _one_per_family() -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=pytest.mark.skipif(bool(why), reason=why or ""))
        for c in zoo.first_of_each_family(generate=False)
        for why in [zoo.available(c)]
    ]


CHECKPOINTED = ("llama-bf16-autocast", "gpt2-fp32", "bert-fp32", "gpt-neox-bf16-autocast")


@pytest.mark.parametrize("checkpoint", [None, "blocks"])
@pytest.mark.parametrize("case", _one_per_family())
def test_the_family_estimates_the_same_with_blocks_replayed(
    case: zoo.Case, checkpoint: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As it runs, and with every block checkpointed (their inputs and recomputed tensors
    live until the whole backward ends) on a few families."""
    import dataclasses

    import transformers

    if checkpoint is not None and case.name not in CHECKPOINTED:
        pytest.skip("checkpointed on a few families")

    transformers.logging.set_verbosity_error()
    monkeypatch.setitem(zoo_shapes.LM, "tiny", {**zoo_shapes.LM["tiny"], "num_hidden_layers": 6})
    found = []
    for enabled in (True, False):
        monkeypatch.setattr(block_replay, "ENABLED", enabled)
        built = case.build("meta", "tiny")
        config = dataclasses.replace(model_zoo.config_of(case), checkpoint=checkpoint)
        found.append(model_zoo.trial_of(case, built, "cuda").estimate(config=config))
    replayed, traced = found
    assert traced.peak_bytes is not None, traced.reason
    for name in FIELDS:
        assert getattr(replayed, name) == getattr(traced, name), (name, replayed.notes)
    if checkpoint is not None:
        assert any("checkpointed) replayed" in n for n in replayed.notes), replayed.notes


@pytest.mark.parametrize("name", ["llama-bf16-autocast", "gpt2-fp32"])
def test_fsdp2_ranks_estimate_the_same_with_blocks_replayed(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FSDP2's gathers, reduce-scatters and reshards run through its hooks around a replayed
    block on CUDA too: every rank of three as the full trace gives it."""
    import dataclasses

    import transformers

    transformers.logging.set_verbosity_error()
    monkeypatch.setitem(zoo_shapes.LM, "tiny", {**zoo_shapes.LM["tiny"], "num_hidden_layers": 6})
    case = zoo.case(name)
    found = []
    for enabled in (True, False):
        monkeypatch.setattr(block_replay, "ENABLED", enabled)
        built = case.build("meta", "tiny")
        config = dataclasses.replace(model_zoo.config_of(case), parallel="fsdp2", world_size=3)
        found.append(model_zoo.trial_of(case, built, "cuda").estimate(config=config))
    replayed, traced = found
    assert traced.peak_bytes is not None, traced.reason
    figures = [
        [(r.rank, r.peak_bytes, r.peak_reserved_bytes, r.breakdown, r.phase) for r in e.ranks]
        for e in found
    ]
    assert len(figures[0]) == 3 and figures[0] == figures[1]
    assert any("replayed from block" in n for n in replayed.notes), replayed.notes
