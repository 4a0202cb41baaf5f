"""A rank estimated in a kernel that used CUDA holds the library workspaces a fresh process makes."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import rank_estimates
from jupyter_gpumem.tuner.estimation.estimate import Estimate

MiB = 2**20


def test_the_workspaces_join_the_peak_reserved_and_breakdown() -> None:
    found = Estimate(
        "fsdp2 × 1",  # noqa: RUF001  # as Config labels it
        "cuda:0",
        100 * MiB,
        120 * MiB,
        {"parameters": 40 * MiB, "activations": 60 * MiB},
        "backward",
        rank=0,
    )
    more = rank_estimates.with_workspaces(found, 65 * MiB)
    assert (more.peak_bytes, more.peak_reserved_bytes) == (165 * MiB, 185 * MiB)
    assert more.breakdown == {**found.breakdown, "library_workspace": 65 * MiB}  # type: ignore[dict-item]
    assert sum(more.breakdown.values()) == more.peak_bytes  # type: ignore[union-attr]
    assert more.workspace_bytes == 65 * MiB and more.rank == 0
    unknown = Estimate("x", "cuda:0", None, None, None, None, reason="no fake kernel")
    assert rank_estimates.with_workspaces(unknown, 65 * MiB) is unknown


def test_a_failed_probe_is_none_and_asked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[list[str]] = []

    class Failed:
        returncode, stdout = 1, ""

    def run(args: list[str], **kwargs: object) -> Failed:
        calls.append(args)
        return Failed()

    monkeypatch.setattr(rank_estimates.subprocess, "run", run)
    monkeypatch.setattr(rank_estimates, "_PROBED", {})
    device = torch.device("cuda", 3)
    assert rank_estimates.fresh_workspaces(device) is None
    assert rank_estimates.fresh_workspaces(device) is None
    assert len(calls) == 1 and calls[0][-1] == "3"
