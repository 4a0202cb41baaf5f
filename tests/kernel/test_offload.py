"""Activation offloading under the recorder and the estimate (issue 38).

On this CPU there is no GPU to offload from, and ``Config(offload=...)`` moves nothing there
(a warning says so). To test what the recorder and the estimate make of offloading, CPU tensors
stand for a GPU's (``STAYS`` without "cpu"): every saved tensor is copied and brought back,
the copies being in the same memory. The GPU test (tests/gpu/test_offload_gpu.py) measures
the real thing.
"""

from __future__ import annotations

import time

import pytest
import torch

from jupyter_gpumem.techniques import Config, offloading
from jupyter_gpumem.techniques.offloading import OnHost
from jupyter_gpumem.tracking.tags import Tagger
from jupyter_gpumem.tuner.trial import Trial
from tests.kernel.test_estimate import _assert_same, _gpt, _gpt_loss, _state, _trained

OFFLOADED = [
    Config(offload="model"),
    Config(offload="blocks"),
    Config(offload="blocks", checkpoint="blocks"),
    Config(offload="model", precision="bf16-autocast", accumulate=2),
]


@pytest.fixture
def cpu_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offloading, "STAYS", ("meta",))


@pytest.mark.parametrize("config", OFFLOADED, ids=str)
@pytest.mark.usefixtures("cpu_moves")
def test_the_estimate_equals_the_measured_peak_and_breakdown(config: Config) -> None:
    trial = _trained(_gpt())
    est = trial.estimate(config=config)
    result = trial.run(config)
    assert result.status == "ok", result.error
    assert not any("no effect" in w for w in result.warnings)
    assert est.peak_bytes == result.peak_allocated_bytes, est.reason
    if config.checkpoint is None:  # the tagger marks a checkpoint's recompute as forward
        assert est.breakdown == result.breakdown
        assert result.breakdown["activations"] > 0
    if config in OFFLOADED[:2]:  # elsewhere the peak may be in the loss, outside the model:
        # the estimate's forward takes it in, the tagger's "other"
        assert est.phase == result.report.main.peak_phase == "backward"


def test_on_the_cpu_offloading_moves_nothing_and_says_so() -> None:
    trial = _trained(_gpt())
    base = trial.run(Config())
    with pytest.warns(UserWarning, match="no effect here"):
        est = trial.estimate(config=Config(offload="model"))
    result = trial.run(Config(offload="model"))
    assert any("no effect here" in w for w in result.warnings)
    assert result.peak_allocated_bytes == base.peak_allocated_bytes == est.peak_bytes


@pytest.mark.usefixtures("cpu_moves")
def test_estimates_and_runs_leave_the_user_objects_bit_for_bit() -> None:
    trial = _trained(_gpt())
    before = _state(trial)
    for config in OFFLOADED:
        trial.estimate(config=config)
        trial.run(config)
    _assert_same(before, _state(trial))
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in trial.model.modules())


def test_the_tagger_tags_what_comes_back_and_not_the_host_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The saved tensors are tagged when saved, their copies when backward brings them back;
    the host copies are never tagged (on a GPU they are not the device's memory)."""
    monkeypatch.setattr(offloading, "STAYS", ("meta",))
    hosts: list[tuple[OnHost, int]] = []  # kept alive: no later storage takes their addresses
    back: list[torch.Tensor] = []
    to_host, bring_back = offloading.to_host, OnHost.back

    def made(t: torch.Tensor) -> OnHost:
        hosts.append((to_host(t), time.time_ns() // 1000))
        return hosts[-1][0]

    def brought(h: OnHost) -> torch.Tensor:
        back.append(bring_back(h))
        return back[-1]

    monkeypatch.setattr(offloading, "to_host", made)
    monkeypatch.setattr(OnHost, "back", brought)
    trial = _gpt()
    applied = offloading.Offloading(trial.model, [""])
    tagger = Tagger(torch, {})
    tagger.start()
    try:
        _gpt_loss(trial.model, trial.batch).backward()
    finally:
        tags, _ = tagger.stop()
        applied.revert()
    assert hosts and len(back) == len(hosts)
    activations = [t for t in tags if t.category == "activations"]
    assert {b.untyped_storage().data_ptr() for b in back} <= {t.address for t in activations}
    for host, born in hosts:
        address = host.tensor.untyped_storage().data_ptr()
        assert not [t for t in tags if t.address == address and t.time_us > born]


def test_a_users_own_save_on_cpu_hides_the_tracker_as_documented() -> None:
    """The limitation tags.py names: torch's own hooks, entered inside the cell, win."""
    trial = _gpt()

    def theirs(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.save_on_cpu():
            return _gpt_loss(model, batch)

    hidden = Trial(trial.model, trial.batch, theirs, optimizer=trial.optimizer).run(Config())
    assert hidden.breakdown["activations"] == 0


def test_the_search_offers_offloading_where_it_moves_something(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It keeps the training math, so it is a candidate without being allowed; on the CPU,
    where it moves nothing, it is not."""
    trial = _trained(_gpt())
    budget = 10**12
    plain = trial.search(budget, measure=False)
    monkeypatch.setattr(offloading, "STAYS", ("meta",))
    found = trial.search(budget, measure=False)
    assert found.anchors == plain.anchors + 2  # each offloading alone: blocks, model
    assert found.candidates == 3 * plain.candidates
    assert found.config == plain.config == Config()  # nothing needed: nothing changed
