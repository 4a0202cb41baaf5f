"""`jupyter_gpumem.tune(...)` refuses arguments it cannot use, saying what each one takes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import jupyter_gpumem
from jupyter_gpumem.units import SIZE_HELP

SIZES = f"budget takes {SIZE_HELP}, a number of bytes above 0, or None"
NAME = "optimizer is the NAME of your optimizer variable, e.g. tune(model, 'opt')"
TRIAL = "trial takes a jupyter_gpumem.Trial, e.g. trial=Trial(model, batch, loss_fn), or None"


@pytest.fixture
def model(shell: InteractiveShell) -> Iterator[nn.Module]:
    net = nn.Linear(4, 4)
    shell.user_ns.update(model=net, opt=torch.optim.SGD(net.parameters()))
    yield net
    import ipywidgets

    ipywidgets.Widget.close_all()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "said"),
    [
        ((), {"trial": 5}, TypeError, f"{TRIAL}; got int 5"),
        ((), {"trial": "Trial"}, TypeError, f"{TRIAL}; got str 'Trial'"),
        ((3,), {}, TypeError, f"{NAME}; got int 3"),
        (("my opt",), {}, ValueError, f"{NAME}; got str 'my opt'"),
        (("o" * 10_000 + "!",), {}, ValueError, f"{NAME}; got str 'ooooooooooooooooo...ooooooooooooooooo!'"),
        ((), {"budget": 1.5}, TypeError, f"{SIZES}; got float 1.5"),
        ((), {"budget": True}, TypeError, f"{SIZES}; got bool True"),
        ((), {"budget": 0}, ValueError, f"{SIZES}; got int 0"),
        ((), {"budget": -(10**5000)}, ValueError, f"{SIZES}; got int <5001-digit int too long to show>"),
        ((), {"budget": "12 gigs"}, ValueError, f"{SIZES}; got str '12 gigs'"),
        ((), {"budget": "9" * 100_000 + "X"}, ValueError, f"{SIZES}; got str '99999999999999999...99999999999999999X'"),
        ((), {"shell": "kernel"}, TypeError, "shell takes an IPython shell (get_ipython()), or None for this kernel's; got str 'kernel'"),
    ],
)  # fmt: skip
def test_a_wrong_argument_says_what_it_takes(
    shell: InteractiveShell,
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: type[Exception],
    said: str,
) -> None:
    kwargs = {"shell": shell, **kwargs}
    with pytest.raises(error) as raised:
        jupyter_gpumem.tune(model, *(args or ("opt",)), **kwargs)
    assert str(raised.value) == said


def test_a_model_that_is_not_a_module_is_refused(shell: InteractiveShell) -> None:
    with pytest.raises(TypeError) as raised:
        jupyter_gpumem.tune(torch.ones(3), "opt", shell=shell)
    assert str(raised.value).startswith("tune() takes the torch.nn.Module to tune, got Tensor ")


def test_right_arguments_make_a_panel(shell: InteractiveShell, model: nn.Module) -> None:
    trial = jupyter_gpumem.Trial(model, torch.randn(2, 4), lambda m, b: m(b).sum(), steps=1)
    tuner = jupyter_gpumem.tune(model, "opt", trial=trial, budget="1GiB", shell=shell)
    assert tuner.trial is trial and tuner.budget_bytes == 2**30
    assert jupyter_gpumem.tune(model, "opt", budget=1024, shell=shell).budget_bytes == 1024
    assert jupyter_gpumem.tune(model, "opt", budget=" ", shell=shell).budget_bytes is None
