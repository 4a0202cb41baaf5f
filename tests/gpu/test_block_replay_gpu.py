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


@pytest.mark.parametrize("case", _one_per_family())
def test_the_family_estimates_the_same_with_blocks_replayed(
    case: zoo.Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    monkeypatch.setitem(zoo_shapes.LM, "tiny", {**zoo_shapes.LM["tiny"], "num_hidden_layers": 6})
    found = []
    for enabled in (True, False):
        monkeypatch.setattr(block_replay, "ENABLED", enabled)
        built = case.build("meta", "tiny")
        found.append(
            model_zoo.trial_of(case, built, "cuda").estimate(config=model_zoo.config_of(case))
        )
    replayed, traced = found
    for name in FIELDS:
        assert getattr(replayed, name) == getattr(traced, name), (name, replayed.notes)
