"""A search's anchors made at once in forked children: their estimates and warnings come back,
and where forking cannot serve, nothing is made so and the search makes them itself."""

from __future__ import annotations

import os
import sys
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning import anchors_at_once

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or sys.platform == "darwin", reason="estimates fork on Linux only"
)
CONFIGS = [Config(), Config(precision="bf16-autocast"), Config(optimizer="sgd")]


def _estimate(workload: Any, config: Config, *, primed: bool, count_held: bool) -> Any:
    if config.optimizer == "sgd":
        raise RuntimeError("this one fails")
    warnings.warn(f"made {config} in {os.getpid()}", stacklevel=1)
    return (str(config), primed, count_held, os.getpid())


def test_each_child_sends_its_estimate_and_warnings_and_a_failed_one_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(anchors_at_once, "estimate_workload", _estimate)
    monkeypatch.setattr(anchors_at_once, "cores", lambda: 2)
    said: list[str] = []
    workload = SimpleNamespace(device=torch.device("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = anchors_at_once.estimated_at_once(
            workload, [*CONFIGS, Config()], count_held=False, say=said.append
        )
    assert said == ["estimating 3 configurations at once, in 2 processes"]
    assert list(found) == CONFIGS[:2]  # the failed one is the search's to make
    assert [v[:3] for v in found.values()] == [
        ("baseline", True, False),
        ("bf16-autocast", True, False),
    ]
    pids = {v[3] for v in found.values()}
    assert os.getpid() not in pids and len(pids) == 2  # each in a child of its own
    messages = [str(w.message) for w in caught]
    assert [m.split(" in ")[0] for m in messages] == ["made baseline", "made bf16-autocast"]


@pytest.mark.parametrize(
    "why", ["one core", "one configuration", "an estimate without CUDA"], ids=str
)
def test_nothing_is_made_at_once_where_forking_cannot_serve(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    made: list[Config] = []
    monkeypatch.setattr(
        anchors_at_once, "estimate_workload", lambda w, c, **kw: made.append(c) or c
    )
    monkeypatch.setattr(anchors_at_once, "cores", lambda: 1 if why == "one core" else 4)
    configs = CONFIGS[:1] if why == "one configuration" else CONFIGS
    device = "cuda" if why == "an estimate without CUDA" else "cpu"
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    workload = SimpleNamespace(device=torch.device(device))
    said: list[str] = []
    assert (
        anchors_at_once.estimated_at_once(workload, configs, count_held=True, say=said.append) == {}
    )
    assert not made and not said
