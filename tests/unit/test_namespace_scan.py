"""The namespace scan's cost per cell is bounded by its budget, whatever the namespace holds."""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpumem.held.namespace_scan import SCAN_BUDGET, NamespaceScan
from jupyter_gpumem.held.tensor_walk import LARGE

torch = pytest.importorskip("torch")


def lived_in(n_rows: int) -> dict[str, Any]:
    """A namespace like an hour's work: a dataset of small dicts, a vocabulary, a model."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return {
        "rows": [{"id": i, "text": "sample", "label": i % 3} for i in range(n_rows)],
        "vocab": {f"w{i}": i for i in range(n_rows // 10)},
        "names": tuple(f"n{i}" for i in range(n_rows // 10)),
        "model": model,
        "opt": opt,
        "x": torch.ones(4),
    }


def scan(ns: dict[str, Any], scanner: NamespaceScan) -> Any:
    return scanner.update(ns, {}, torch, frozenset())


def test_objects_visited_per_cell_do_not_grow_with_the_namespace() -> None:
    first, again = [], []
    for n_rows in (1_000, 100_000, 1_000_000):
        ns, scanner = lived_in(n_rows), NamespaceScan()
        first.append(scan(ns, scanner).visited)
        again.append(scan(ns, scanner).visited)
    # the large containers are judged by the same sample whatever their length
    assert first[1] == first[2] <= SCAN_BUDGET and first[0] <= SCAN_BUDGET
    assert again == [0, 0, 0]  # an unchanged namespace costs no walk at all


def test_what_a_sample_skips_is_said_once() -> None:
    ns, scanner = lived_in(100_000), NamespaceScan()
    ns["small"] = list(range(LARGE + 1))  # judged by a sample too, but too small to mention
    notes = scan(ns, scanner).notes
    assert any("rows (100,000 items)" in n and "sample" in n for n in notes)
    assert any("vocab (10,000 items)" in n for n in notes)
    assert any("names (10,000 items)" in n for n in notes)
    assert not any("small" in n for n in notes) and len(notes) == 3
    assert scan(ns, scanner).notes == ()
    view = scan(ns, scanner)
    model, opt = ns["model"], ns["opt"]
    for t in [*model.parameters(), *(v for s in opt.state.values() for v in s.values())]:
        assert view.holds(("cpu", t.untyped_storage().data_ptr()))


def test_a_list_of_many_tensors_is_walked_over_several_cells() -> None:
    tensors = [torch.full((4,), float(i)) for i in range(3 * SCAN_BUDGET + 10)]
    ns, scanner = {"cached": tensors}, NamespaceScan()
    visits, notes = [], []
    for _ in range(6):
        view = scan(ns, scanner)
        visits.append(view.visited)
        notes.extend(view.notes)
    assert max(visits) <= SCAN_BUDGET and visits[-1] == 0
    assert len(view.storages()) == len(tensors)
    assert len([n for n in notes if "cached" in n]) == 1  # said once, when first found


def test_a_growing_list_is_walked_from_where_it_stopped() -> None:
    losses = [torch.randn(3, requires_grad=True).sum() for _ in range(2 * LARGE)]
    ns, scanner = {"losses": losses}, NamespaceScan()
    while scan(ns, scanner).visited:  # walked over several cells, within the budget each
        pass
    losses.append(torch.randn(3, requires_grad=True).sum())
    view = scan(ns, scanner)
    assert view.visited == 1  # the new loss only
    assert len(list(view.graph_tensors())) == len(losses)


def test_a_rebound_name_is_walked_again() -> None:
    ns, scanner = {"x": [torch.ones(2)]}, NamespaceScan()
    scan(ns, scanner)
    ns["x"] = [torch.ones(3)]
    view = scan(ns, scanner)
    assert view.visited > 0
    assert view.holds(("cpu", ns["x"][0].untyped_storage().data_ptr()))
    del ns["x"]
    assert scan(ns, scanner).storages() == {}
