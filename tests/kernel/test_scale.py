"""The cost of `%%gpumem` does not grow with the session: 1,000 cells in a real shell."""

from __future__ import annotations

import statistics
import time

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem import report_log as history

CELLS = 1000
WINDOW = 100


def _timed(shell: InteractiveShell, source: str) -> float:
    """CPU seconds of this thread: what the cell costs, whatever else the machine runs."""
    t0 = time.thread_time()
    result = shell.run_cell(source)
    elapsed = time.thread_time() - t0
    assert result.success, result.error_in_exec
    return elapsed


def test_per_cell_overhead_stays_flat_over_a_thousand_cells(shell: InteractiveShell) -> None:
    setup = (
        "import torch\n"
        "model = torch.nn.Linear(16, 16)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    )
    assert shell.run_cell(setup).success
    body = "x = model(torch.randn(4, 16)).sum()\nx.backward(); opt.step(); opt.zero_grad()\n"
    history.set_limit(50)
    try:
        overheads = []
        for i in range(CELLS):
            # interleaved, so that drift of the machine cancels; each cell adds to In, _i<N>
            plain = _timed(shell, body)
            tracked = _timed(shell, f"%%gpumem --quiet --name c{i}\n{body}")
            overheads.append(tracked - plain)
        first = statistics.median(overheads[:WINDOW])
        last = statistics.median(overheads[-WINDOW:])
        assert last <= 1.2 * first, (
            f"median overhead grew from {first * 1e3:.2f} to {last * 1e3:.2f} ms"
        )
        assert len(history.reports()) == 50
        assert history.recorded() == CELLS and history.dropped() == CELLS - 50
        assert [r.name for r in history.reports()][-1] == f"c{CELLS - 1}"
    finally:
        history.set_limit(history.DEFAULT_LIMIT)


def test_the_limit_is_validated_and_dropping_is_said_once(
    shell: InteractiveShell, recwarn: pytest.WarningsRecorder
) -> None:
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="at least 1"):
            history.set_limit(bad)  # type: ignore[arg-type]
    history.set_limit(2)
    try:
        for _ in range(4):
            assert shell.run_cell("%%gpumem --quiet\nx = 1").success
        said = [str(w.message) for w in recwarn if "keeps the last 2 reports" in str(w.message)]
        assert len(said) == 1
        assert len(history.reports()) == 2
    finally:
        history.set_limit(history.DEFAULT_LIMIT)


def test_the_cpu_source_steps_aside_after_the_first_steps(shell: InteractiveShell) -> None:
    setup = (
        "import torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "x = torch.randn(16, 32)\n"
        "def step():\n"
        "    model(x).pow(2).mean().backward(); opt.step(); opt.zero_grad(set_to_none=True)\n"
    )
    assert shell.run_cell(setup).success
    counts = {}
    for n in (5, 200):
        assert shell.run_cell(f"%%gpumem --quiet -o r\nfor _ in range({n}):\n    step()").success
        r = shell.user_ns["r"]
        assert sum(r.breakdown.values()) == r.peak_allocated_bytes
        counts[n] = len(r.timeline.t_s)
        assert any(f"first steps only (of {n})" in note for note in r.notes), r.notes
    # 40 times the steps, the same events: what was recorded stopped at the detailed steps
    assert counts[200] <= counts[5] * 1.5
    n_params = sum(p.numel() for p in shell.user_ns["model"].parameters())
    assert shell.user_ns["r"].breakdown["parameters"] == 4 * n_params
