"""Foreach ops run by kinds of element make the very run the whole lists make.

Every foreach optimizer of torch.optim steps a model whose parameters come in few layouts
(six alike blocks, a head of its own), on fake tensors, once with each foreach op run by kinds
of element (``foreach_groups``) and once on its whole lists: the two fake runs are equal in
every storage, event and tag. Gradient clipping (``_foreach_norm``) and the step counts the
optimizers keep on the CPU (values, which each element must get) run through it too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from jupyter_gpumem.techniques import Config  # noqa: E402
from jupyter_gpumem.tuner.estimation import foreach_groups  # noqa: E402
from jupyter_gpumem.tuner.estimation.fake_step import run_fake  # noqa: E402

OPTIMIZERS: dict[str, Callable[[Any], Any]] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True, foreach=True),
    "sgd-nesterov": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, foreach=True),
    "rmsprop-centered": lambda p: torch.optim.RMSprop(p, lr=1e-3, centered=True, momentum=0.9, foreach=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2, foreach=True),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-3, foreach=True),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-3, foreach=True),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-3, foreach=True),
    "adadelta": lambda p: torch.optim.Adadelta(p, foreach=True),
}  # fmt: skip


def _model() -> nn.Module:
    blocks = [nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32)) for _ in range(6)]  # fmt: skip
    return nn.Sequential(*blocks, nn.Linear(32, 10))


def _loss(m: nn.Module, batch: Any) -> Any:
    x, y = batch
    return nn.functional.cross_entropy(m(x), y)


class _ClippedAdamW(torch.optim.AdamW):
    """AdamW after the gradients are clipped by their norm, as the Trainer steps it."""

    def step(self, closure: Any = None) -> Any:
        params = [p for group in self.param_groups for p in group["params"]]
        nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        return super().step(closure)


def _run(make: Callable[[Any], Any], grouped: bool) -> Any:
    with torch.device("meta"):
        model = _model()
    optimizer = make(model.parameters())
    batch = (torch.randn(8, 32, device="meta"), torch.randint(0, 10, (8,), device="meta"))
    foreach_groups.ENABLED = grouped
    try:
        return run_fake(
            model, optimizer, _loss, torch.device("cpu"), Config(), batch=batch,
            warmup=1, steps=2,
        )  # fmt: skip
    finally:
        foreach_groups.ENABLED = True


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_step_by_kinds_of_element_is_the_step_on_the_whole_lists(name: str) -> None:
    grouped = _run(OPTIMIZERS[name], grouped=True)
    whole = _run(OPTIMIZERS[name], grouped=False)
    assert grouped == whole
    assert len(grouped.events) > 0


def test_clipping_by_kinds_of_element_is_clipping_on_the_whole_lists() -> None:
    clipped = lambda p: _ClippedAdamW(p, lr=1e-3, foreach=True)  # noqa: E731
    grouped = _run(clipped, grouped=True)
    assert grouped == _run(clipped, grouped=False)
    plain = _run(OPTIMIZERS["adamw"], grouped=True)
    assert len(grouped.events) > len(plain.events)  # the norms were made


def test_only_foreach_ops_of_fake_tensors_without_values_are_grouped() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args[0]))
        return torch._foreach_sqrt(*args, **kwargs)

    counted.__name__ = "_foreach_sqrt"
    run = foreach_groups.grouped(torch, counted)
    assert run is not None and foreach_groups.grouped(torch, torch.ops.aten.add.Tensor) is None
    with FakeTensorMode():
        fake = [torch.empty(4, 4) for _ in range(5)] + [torch.empty(3) for _ in range(5)]
        out = run(fake)
    assert calls == [2]  # one element of each kind
    assert [tuple(o.shape) for o in out] == [(4, 4)] * 5 + [(3,)] * 5
    assert len({o.untyped_storage()._cdata for o in out}) == 10  # each its own storage
    real = [torch.ones(4) for _ in range(6)]
    calls.clear()
    out = run(real)
    assert calls == [6]  # real tensors carry values: every element runs
    assert all(torch.equal(o, torch.ones(4)) for o in out)
