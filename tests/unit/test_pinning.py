"""Pinning on threads while offloading lasts: the allocator settings set, and put back as the
environment has them."""

from __future__ import annotations

import pytest
import torch

from jupyter_gpumem.techniques import pinning


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What reaches PyTorch's allocator settings, on a machine taken to have a GPU."""
    seen: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", seen.append, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for key in pinning.ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)
    return seen


def test_pinning_on_threads_then_pytorchs_defaults_again(settings: list[str]) -> None:
    put_back = pinning.fast_pinning()
    assert settings == [pinning.FAST]
    assert "pinned_num_register_threads:8" in pinning.FAST
    put_back()
    assert settings == [pinning.FAST, pinning.DEFAULTS]


def test_the_environments_settings_pass_along_and_win_on_the_way_back(
    settings: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    user = "expandable_segments:True,pinned_num_register_threads:4"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", user)
    put_back = pinning.fast_pinning()
    put_back()
    # parsed in order, later keys win: ours over the user's while it lasts, theirs after
    assert settings == [f"{user},{pinning.FAST}", f"{pinning.DEFAULTS},{user}"]


def test_a_refused_setting_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def refuse(value: str) -> None:
        calls.append(value)
        raise ValueError("Unrecognized key")

    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuse, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pinning.fast_pinning()()
    assert len(calls) == 1  # tried once; nothing to put back


def test_without_a_gpu_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pinning.fast_pinning()()
    pinning.release_cached()
    assert calls == []


def test_offloading_a_cpu_model_leaves_the_settings_alone(settings: list[str]) -> None:
    from jupyter_gpumem.techniques.offloading import Offloading

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    offloading = Offloading(model, [""])
    offloading.revert()
    assert settings == [] and offloading.warnings  # nothing moves, nothing pins
