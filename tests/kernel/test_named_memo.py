"""The namespace's names are read again only when something that names a storage changed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from jupyter_gpumem.tracking import kept_names, namespace
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


def _fresh_names(ns: dict[str, Any]) -> dict[int, Any]:
    """The names made from nothing kept: every source named again."""
    kept = kept_names.SOURCES, kept_names.STRUCTURE
    kept_names.SOURCES, kept_names.STRUCTURE = (
        kept_names.SourceNames(),
        kept_names.ModuleStructure(),
    )
    try:
        return namespace.named_storages(ns)
    finally:
        kept_names.SOURCES, kept_names.STRUCTURE = kept


def test_kept_names_follow_every_change_a_source_can_make() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.AdamW(model.parameters())
    ns: dict[str, Any] = {"model": model, "opt": opt, "feats": [torch.ones(2)]}
    seen = []

    def check() -> None:
        named = namespace.named_storages(ns)
        assert named == _fresh_names(ns)
        seen.append({n.name for n in named.values()})

    check()
    model(torch.randn(3, 4)).sum().backward()  # gradients appear
    check()
    opt.step()  # optimizer state appears
    check()
    opt.zero_grad(set_to_none=True)  # gradients go
    check()
    with torch.no_grad():
        model[0].weight.data = torch.zeros(4, 4)  # new storage, nothing registered
    check()
    model[1].running_mean = torch.ones(4)  # a buffer rebound
    check()
    model[0]._parameters["bias"] = torch.nn.Parameter(torch.ones(4))  # no registration
    check()
    ns["feats"].append(torch.zeros(5))  # a container grew
    check()
    model.add_module("head", torch.nn.Linear(4, 1))  # a submodule registered
    check()
    assert "model.0.weight.grad" in seen[1] and "model.0.weight.grad" not in seen[3]
    assert any("exp_avg" in name for name in seen[2])
    assert "feats[1]" in seen[7] and "model.head.weight" in seen[8]


def test_a_source_unchanged_is_not_named_again(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(4, 4)
    ns: dict[str, Any] = {"model": model, "x": torch.ones(3)}
    namespace.named_storages(ns)
    made: list[str] = []
    original = kept_names.NAMES.get

    def counted(t: Any, name: str, category: str | None) -> Any:
        made.append(name)
        return original(t, name, category)

    monkeypatch.setattr(kept_names.NAMES, "get", counted)
    first = namespace.named_storages(ns)
    assert made == [] and namespace.named_storages(ns) is first
    model.weight.grad = torch.zeros(4, 4)
    namespace.named_storages(ns)
    assert sorted(made) == ["model.bias", "model.weight", "model.weight.grad"]


def test_what_is_kept_goes_with_its_tensors_and_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    # start afresh: the sources other tests left alive set how far the kept ones may grow, and
    # their names, dropped by the collector mid-test, would change the counts
    monkeypatch.setattr(kept_names, "SOURCES", kept_names.SourceNames())
    monkeypatch.setattr(kept_names, "NAMES", kept_names.NameCache())
    before = len(kept_names.NAMES)
    ns: dict[str, Any] = {f"t{i}": torch.ones(2) for i in range(200)}
    named = namespace.named_storages(ns)
    assert len(named) == 200 and len(kept_names.NAMES) == before + 200
    ns.clear()
    assert len(kept_names.NAMES) == before  # each entry left with its tensor
    for _ in range(10 * kept_names.PRUNE_AT):  # a new optimizer per cell, the old one dropped
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
        namespace.named_storages({"opt": opt})
    assert len(kept_names.SOURCES) <= 2 * kept_names.PRUNE_AT + 1
