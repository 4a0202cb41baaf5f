"""transformers' mask decisions made as in the real step during a fake run, on stand-ins with
the signatures of ``transformers.masking_utils`` (the installed transformers may take other
paths), and left alone where they read the batch's values or the signatures differ."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from jupyter_gpumem.tuner.estimation.untraced import untraced


def _masking(calls: list[tuple[str, Any]]) -> types.ModuleType:
    module = types.ModuleType("transformers.masking_utils")

    def find_packed_sequence_indices(position_ids: Any) -> Any:
        calls.append(("packed", position_ids))
        return "packed mask"

    def _ignore_causal_mask_sdpa(
        padding_mask: Any, q_length: int, kv_length: int, q_offset: Any, kv_offset: int,
        local_attention_size: Any = None,
    ) -> bool:  # fmt: skip
        calls.append(("causal", q_offset))
        return not isinstance(q_offset, torch.Tensor)  # as tracing: a tensor offset keeps the mask

    module.find_packed_sequence_indices = find_packed_sequence_indices  # type: ignore[attr-defined]
    module._ignore_causal_mask_sdpa = _ignore_causal_mask_sdpa  # type: ignore[attr-defined]
    return module


def test_decisions_the_real_step_makes_without_reading_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, Any]] = []
    masking = _masking(calls)
    originals = dict(vars(masking))
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", masking)
    with FakeTensorMode():
        batch = torch.zeros(2, 16, dtype=torch.long)
        own = torch.arange(16).unsqueeze(0)
        offset = torch.tensor(0)
        with untraced(lambda: {batch.untyped_storage()._cdata}):
            assert masking.find_packed_sequence_indices(own) is None  # the model's positions
            assert calls == []
            assert masking.find_packed_sequence_indices(batch[:, :8]) == "packed mask"
            assert masking._ignore_causal_mask_sdpa(None, 16, 16, offset, 0) is True
            assert masking._ignore_causal_mask_sdpa(None, 1, 17, offset, 0) is True
            # a query shorter than its keys reads the offset: transformers decides
            assert masking._ignore_causal_mask_sdpa(None, 4, 16, offset, 0) is False
            assert masking._ignore_causal_mask_sdpa(batch, 16, 16, offset, 0) is False
    assert [c[0] for c in calls] == ["packed", "causal", "causal", "causal", "causal"]
    assert [c[1] for c in calls[1:3]] == [0, 0]
    assert vars(masking) == originals  # put back


def test_other_signatures_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    masking = types.ModuleType("transformers.masking_utils")

    def find_packed_sequence_indices(ids: Any) -> str:  # another transformers' name
        return "theirs"

    masking.find_packed_sequence_indices = find_packed_sequence_indices  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", masking)
    with untraced(set):
        assert masking.find_packed_sequence_indices is find_packed_sequence_indices  # type: ignore[attr-defined]
