"""Leak hints in a lived-in kernel: one that holds a dataset, thousands of tensors, a model
with its optimizer and a vocabulary, so that the namespace scan works within its budget."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.analysis.leak_hints import LeakHint
from jupyter_gpumem.held import ipython_refs
from jupyter_gpumem.held.ipython_refs import (
    GRAPH_BUDGET,
    HOLDER_BUDGET,
    check_leaks,
    find_leaks,
    release,
    scan_namespace,
)
from jupyter_gpumem.held.namespace_scan import HIDDEN, SCAN_BUDGET, NamespaceScan

torch = pytest.importorskip("torch")
MiB = 2**20
ROWS, TENSORS, WORDS = 300_000, 20_000, 50_000
LIVED_IN = ("rows", "small_tensors", "model", "opt", "vocab")
QUIET = "%%gpumem --quiet\n_z = 1"  # a cell that changes nothing the scan summarises
WARM_UP = -(-TENSORS // SCAN_BUDGET) + 2  # quiet cells: enough to finish walking small_tensors


def lived_in_state() -> dict[str, Any]:
    """What an hour of work leaves behind, in the order it was made."""
    rows = [{"id": i, "text": "sample", "label": i % 3} for i in range(ROWS)]
    small_tensors = [torch.full((4,), float(i)) for i in range(TENSORS)]
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.Linear(128, 8),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(16, 64)).square().mean().backward()
    opt.step()
    vocab = {f"word{i}": i for i in range(WORDS)}
    assert len(opt.state) == 6  # the step left exp_avg and exp_avg_sq per parameter
    return {
        "rows": rows,
        "small_tensors": small_tensors,
        "model": model,
        "opt": opt,
        "vocab": vocab,
    }


@pytest.fixture
def ip(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    """The shared shell as a fresh kernel that has lived in: torch imported, the state above
    in its namespace, and a namespace scan of its own (its notes are said once per kernel)."""
    monkeypatch.setitem(ipython_refs._SCANS, shell, NamespaceScan())
    assert shell.run_cell("import torch", store_history=True).success
    release(shell)
    shell.user_ns.update(lived_in_state())
    added = set(shell.user_ns)
    yield shell
    release(shell)
    for name in (*LIVED_IN, *(set(shell.user_ns) - added)):
        if not HIDDEN.match(name):  # IPython's own (_5, _i5, Out...) go with the shell's reset
            shell.user_ns.pop(name, None)


def run(ip: InteractiveShell, code: str) -> int:
    result = ip.run_cell(code, store_history=True)
    assert result.success, result.error_in_exec or result.error_before_exec
    return int(result.execution_count)


def settle(ip: InteractiveShell) -> None:
    """Run quiet cells until the scan has walked every variable (exact bytes need that)."""
    for _ in range(WARM_UP):
        run(ip, QUIET)
    stop = ipython_refs._stops(ip)
    assert scan_namespace(ip, torch, stop).visited == 0, "the scan did not finish"


def report_hints(ip: InteractiveShell) -> dict[str, LeakHint]:
    return {h.kind: h for h in ip.user_ns["r"].leak_hints}


def test_growth_across_reruns_is_reported(ip: InteractiveShell) -> None:
    settle(ip)
    run(ip, "history_list = []")
    cell = (
        "%%gpumem -o r --quiet\n"
        "step_out = torch.randn(512, 512)\n"
        "history_list.append(step_out * 2)  # planted leak"
    )
    for _ in range(4):
        run(ip, cell)
    assert set(report_hints(ip)) == {"growth"}  # the lived-in state is no leak
    growth = report_hints(ip)["growth"]
    assert growth.bytes == 512 * 512 * 4
    assert "grows by 1.00 MiB per run" in growth.message


def test_stored_losses_keeping_their_graphs_are_reported(ip: InteractiveShell) -> None:
    settle(ip)
    run(
        ip,
        "w = torch.randn(256, 256, requires_grad=True)\nh = torch.randn(512, 256)\nlosses = []",
    )
    cell = "%%gpumem -o r --quiet\nlosses.append((h @ w).sin().sum())"
    for _ in range(3):
        run(ip, cell)
    assert set(report_hints(ip)) == {"autograd-graph"}
    hint = report_hints(ip)["autograd-graph"]
    # each sin() saved its own 512x256 matmul output; h and w are the user's own variables
    assert hint.bytes == 3 * 512 * 256 * 4
    assert hint.where == ("losses[...]",)
    assert "losses[...]" in hint.message
    run(ip, "losses = [loss.item() for loss in losses]")  # the fix the hint suggests
    run(ip, "%%gpumem -o r --quiet\n_z = 1")
    assert "autograd-graph" not in report_hints(ip)


def test_a_tensor_in_the_output_cache_is_reported(ip: InteractiveShell) -> None:
    settle(ip)
    n = run(ip, "torch.ones(3, 1 << 18)")  # 3 MiB that only Out[n], _n and _ hold
    run(ip, "%%gpumem -o r --quiet\n_z = 1")
    assert set(report_hints(ip)) == {"output-cache"}
    hint = report_hints(ip)["output-cache"]
    assert hint.bytes == 3 * MiB
    assert f"Out[{n}]" in hint.where
    release(ip)
    run(ip, "%%gpumem -o r --quiet\n_z = 1")
    assert "output-cache" not in report_hints(ip)


def test_a_traceback_holding_frames_is_reported(ip: InteractiveShell) -> None:
    settle(ip)
    run(ip, "def explode():\n    scratch = torch.ones(5, 1 << 18)\n    raise RuntimeError('boom')")
    failed = ip.run_cell("explode()", store_history=True)
    assert isinstance(failed.error_in_exec, RuntimeError)
    del failed
    hint = {h.kind: h for h in find_leaks(ip, cycles=False)}["traceback"]
    assert hint.bytes == 5 * MiB
    assert hint.where == ("explode() line 3",)
    run(ip, "%%gpumem -o r --quiet\n_z = 1")
    assert set(report_hints(ip)) == {"traceback"}
    assert report_hints(ip)["traceback"].bytes == 5 * MiB
    assert "the last traceback" in release(ip).cleared
    assert "traceback" not in {h.kind for h in find_leaks(ip, cycles=False)}


def test_later_cells_warn_nothing_and_notes_are_said_once(ip: InteractiveShell) -> None:
    notes: list[tuple[str, ...]] = []
    caught: list[list[warnings.WarningMessage]] = []
    for _ in range(WARM_UP):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            run(ip, "%%gpumem -o r --quiet\n_z = 1")
        caught.append(seen)
        notes.append(ip.user_ns["r"].notes)
    assert all(not seen for seen in caught[1:]), [str(w.message) for c in caught for w in c]
    sampled = [[n for n in report if "sample" in n] for report in notes]
    assert any("rows (300,000 items)" in n for n in sampled[0]), notes[0]
    assert not set(sampled[0]) & {n for report in sampled[1:] for n in report}
    said = [n for report in sampled for n in report]
    assert len(said) == len(set(said)), said  # each is said once...
    # ...vocab's too, though the first cell's budget ran out before the scan reached it
    assert [n for n in said if "vocab (50,000 items)" in n], said
    walked = [
        i
        for i, report in enumerate(notes)
        if any("small_tensors is too large" in n for n in report)
    ]
    assert walked == [0], notes  # the partial walk is announced once, not on every cell
    assert not [n for n in notes[-1] if n.startswith("leak hints")], notes[-1]


def test_each_check_stays_within_its_budgets(ip: InteractiveShell) -> None:
    # a graph longer than GRAPH_BUDGET and an output longer than HOLDER_BUDGET, on top
    run(
        ip,
        "chain = torch.ones(8, requires_grad=True)\ny = chain\nfor _ in range(3000):\n    y = (y * 1.0001).sin()",
    )
    run(
        ip,
        "class Batch(list):\n"
        "    def __repr__(self):\n"
        "        return f'Batch({len(self)})'\n"
        "Batch(torch.ones(2) for _ in range(5000))",
    )
    limit = SCAN_BUDGET + GRAPH_BUDGET + HOLDER_BUDGET
    checks = [check_leaks(ip, cycles=False) for _ in range(WARM_UP)]
    spent = [c.visited for c in checks]
    assert max(spent) <= limit, spent
    assert max(spent) > GRAPH_BUDGET + HOLDER_BUDGET, spent  # all three budgets in use at once
    notes = [n for c in checks for n in c.notes]
    for fact in ("autograd graphs your variables keep", "output cache and last traceback"):
        assert len([n for n in notes if fact in n]) == 1, notes  # said once, not per check
    stop = ipython_refs._stops(ip)
    first = scan_namespace(ip, torch, stop)
    assert scan_namespace(ip, torch, stop).visited == 0, first.visited
    assert check_leaks(ip, cycles=False).visited <= GRAPH_BUDGET + HOLDER_BUDGET  # scan: 0
    # the finished scan knows every storage the namespace holds
    assert len([k for k in first.storages() if k[0] == "cpu"]) >= TENSORS
