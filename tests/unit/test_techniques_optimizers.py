"""Optimizers rebuilt over the same parameters: state bytes per parameter, carried settings,
missing optional packages, and the original optimizer given back untouched."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import OPTIMIZERS, Applied, apply


def make_model() -> nn.Sequential:
    """2-D weights big enough for Adafactor's factored state to be small per parameter."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))


def groups_of(applied: Applied) -> list[dict[str, Any]]:
    assert applied.optimizer is not None
    return applied.optimizer.param_groups


def state_bytes_per_param(opt: torch.optim.Optimizer) -> float:
    """Bytes of optimizer state per parameter, the scalar step counters left out."""
    numel = sum(p.numel() for g in opt.param_groups for p in g["params"])
    total = 0
    for state in opt.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                total += value.nbytes
    return total / numel


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("sgd", 0.0, 0.0),
        ("sgd-momentum", 4.0, 4.0),
        ("adam", 8.0, 8.0),
        ("adamw", 8.0, 8.0),
        ("adamw-fused", 8.0, 8.0),
        ("adafactor", 0.0, 0.1),
    ],
)
def test_state_bytes_per_parameter(name: str, low: float, high: float) -> None:
    model = make_model()
    applied = apply(model, optimizer=name)
    assert applied.optimizer is not None
    assert {id(p) for g in groups_of(applied) for p in g["params"]} == {
        id(p) for p in model.parameters()
    }
    model(torch.randn(4, 256)).square().mean().backward()
    applied.step()
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)
    assert low <= state_bytes_per_param(applied.optimizer) <= high
    applied.revert()
    assert applied.optimizer is None  # nothing was passed in


def test_fused_is_used_where_torch_has_the_kernel() -> None:
    applied = apply(make_model(), optimizer="adamw-fused")
    assert applied.optimizer is not None and groups_of(applied)[0]["fused"] is True
    assert applied.warnings == ()


def test_fused_falls_back_with_the_reason() -> None:
    model = nn.Linear(4, 4, device="meta")
    with pytest.warns(UserWarning, match="torch has no fused AdamW kernel for meta"):
        applied = apply(model, optimizer="adamw-fused")
    assert isinstance(applied.optimizer, torch.optim.AdamW)
    assert not groups_of(applied)[0]["fused"]
    assert "using the default AdamW instead" in applied.warnings[0]


def test_settings_that_mean_the_same_are_carried_per_group() -> None:
    model = make_model()
    old = torch.optim.AdamW(
        [
            {"params": model[0].parameters(), "lr": 1e-3},
            {"params": model[2].parameters(), "lr": 5e-4, "weight_decay": 0.0},
        ],
        weight_decay=0.05,
        betas=(0.8, 0.9),
        eps=1e-6,
    )
    adam = apply(model, optimizer="adam", optimizer_obj=old)
    assert isinstance(adam.optimizer, torch.optim.Adam)
    groups = groups_of(adam)
    assert [(g["lr"], g["weight_decay"], g["betas"], g["eps"]) for g in groups] == [
        (1e-3, 0.05, (0.8, 0.9), 1e-6),
        (5e-4, 0.0, (0.8, 0.9), 1e-6),
    ]
    assert [g["params"] for g in groups] == [g["params"] for g in old.param_groups]
    adam.revert()

    sgd = apply(model, optimizer="sgd-momentum", optimizer_obj=old)
    assert [(g["lr"], g["weight_decay"], g["momentum"]) for g in groups_of(sgd)] == [
        (1e-3, 0.05, 0.9),
        (5e-4, 0.0, 0.9),
    ]
    sgd.revert()

    adafactor = apply(model, optimizer="adafactor", optimizer_obj=old)
    group = groups_of(adafactor)[0]
    assert (group["lr"], group["weight_decay"], group["eps"]) == (1e-3, 0.05, (None, 1e-3))
    adafactor.revert()


def test_sgd_momentum_keeps_the_old_momentum() -> None:
    model = make_model()
    old = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.8)
    applied = apply(model, optimizer="sgd-momentum", optimizer_obj=old)
    assert (
        groups_of(applied)[0]["lr"],
        groups_of(applied)[0]["momentum"],
    ) == (0.1, 0.8)
    assert "betas" not in groups_of(apply(model, optimizer="sgd", optimizer_obj=old))[0]


def test_revert_gives_back_the_original_optimizer_untouched() -> None:
    model = make_model()
    old = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 256)).sum().backward()
    old.step()
    before = {id(p): {k: (v, v.clone()) for k, v in s.items()} for p, s in old.state.items()}
    groups = [dict(g) for g in old.param_groups]
    applied = apply(model, optimizer="sgd", optimizer_obj=old)
    assert applied.optimizer is not old
    model(torch.randn(2, 256)).sum().backward()
    applied.step()
    applied.revert()
    assert applied.optimizer is old
    assert [dict(g) for g in old.param_groups] == groups
    for p, state in old.state.items():
        for k, v in state.items():
            same, copy = before[id(p)][k]
            assert v is same and torch.equal(v, copy)


@pytest.mark.parametrize(
    ("name", "module", "hint"),
    [
        ("lion", "lion_pytorch", "pip install lion-pytorch"),
        ("adamw-8bit", "bitsandbytes", "pip install bitsandbytes"),
        ("adamw-paged-8bit", "bitsandbytes", "pip install bitsandbytes"),
    ],
)
def test_missing_optional_package_names_the_install(
    name: str, module: str, hint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import fails whether or not it is installed
    if module == "bitsandbytes":
        monkeypatch.setitem(sys.modules, "bitsandbytes.optim", None)
    model = make_model()
    with pytest.raises(ImportError, match=hint):
        apply(model, optimizer=name, precision="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # nothing was applied


def test_unknown_optimizer_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError) as err:
        apply(make_model(), optimizer="rmsprop")
    assert "unknown optimizer 'rmsprop'" in str(err.value)
    assert all(name in str(err.value) for name in OPTIMIZERS)


def test_nothing_to_optimize() -> None:
    model = make_model().requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters that require grad"):
        apply(model, optimizer="sgd")


def test_step_without_an_optimizer_says_how_to_get_one() -> None:
    applied = apply(make_model(), precision="tf32")
    with pytest.raises(RuntimeError, match="no optimizer to step: pass optimizer_obj"):
        applied.step()
    applied.revert()


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda ps: torch.optim.AdamW(ps), "adamw"),
        (lambda ps: torch.optim.AdamW(ps, fused=True), "adamw-fused"),
        (lambda ps: torch.optim.Adam(ps), "adam"),
        (lambda ps: torch.optim.SGD(ps, lr=0.1), "sgd"),
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "sgd-momentum"),
        (lambda ps: torch.optim.RMSprop(ps), "RMSprop"),
    ],
)
def test_optimizer_name_says_what_the_optimizer_is(make: Any, name: str) -> None:
    from jupyter_gpumem.techniques.optimizers import optimizer_name

    assert optimizer_name(make(make_model().parameters())) == name
    assert name in OPTIMIZERS or name == "RMSprop"


def test_optimizer_name_of_nothing_is_none() -> None:
    from jupyter_gpumem.techniques.optimizers import optimizer_name

    assert optimizer_name(None) is None
