"""The namespace's names are read again only when something that names a storage changed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from jupyter_gpumem.tracking import namespace
from jupyter_gpumem.tracking.held_state import HELD


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    calls: list[int] = []
    original = namespace.named_storages

    def counted(user_ns: Any) -> Any:
        calls.append(1)
        return original(user_ns)

    monkeypatch.setattr(namespace, "named_storages", counted)
    namespace.NAMED.clear()
    yield calls
    namespace.NAMED.clear()
    namespace.EDITS.uninstall()


def test_names_are_reused_until_a_binding_a_module_or_the_allocator_changes(
    reads: list[int],
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    ns: dict[str, Any] = {"model": model, "x": torch.ones(3)}
    memo = namespace.NAMED
    first = memo.named(ns, activity=(1,))
    assert {n.name for n in first.values()} == {"model.0.weight", "model.0.bias", "x"}
    assert memo.named(ns, activity=(1,)) is first and len(reads) == 1

    memo.named(ns, activity=(2,))  # the allocator allocated or freed
    assert len(reads) == 2
    ns["y"] = torch.zeros(2)  # a new variable
    assert "y" in {n.name for n in memo.named(ns, activity=(2,)).values()}
    assert len(reads) == 3
    ns["x"] = ns["y"]  # a variable bound to another object
    memo.named(ns, activity=(2,))
    assert len(reads) == 4
    model.add_module("head", torch.nn.Linear(4, 2))  # a module registered a submodule
    named = memo.named(ns, activity=(2,))
    assert "model.head.weight" in {n.name for n in named.values()} and len(reads) == 5
    HELD.found(torch.optim.SGD(model.parameters()), "trainer")  # an optimizer came to light
    memo.named(ns, activity=(2,))
    assert len(reads) == 6
    memo.named(ns, activity=(2,))
    assert len(reads) == 6
    HELD.clear()


def test_without_allocator_counters_every_call_reads(reads: list[int]) -> None:
    ns = {"x": torch.ones(3)}
    namespace.NAMED.named(ns, activity=None)
    namespace.NAMED.named(ns, activity=None)
    assert len(reads) == 2
