"""The work of `%%gpumem` does not grow with the session: 1,000 cells in a real shell.

What a cell costs is counted, not timed (timings live in ``bench/``): the objects the
leak check visits per cell, and the host memory our own code still holds.
"""

from __future__ import annotations

import gc
import statistics
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import jupyter_gpumem
from jupyter_gpumem import logbook
from jupyter_gpumem.held import ipython_refs
from tests.support.cycles import cyclic_garbage

CELLS = 1000
WINDOW = 100
PACKAGE = str(Path(jupyter_gpumem.__file__).parent)
WARM = logbook.CELLS_KEPT + WINDOW  # cells after which every bounded index is full
KEPT_GROWTH_BYTES = 64 * 1024  # what our code may keep beyond cell WARM: far below 1 KiB a cell


def _held_by_us() -> int:
    """Bytes still allocated whose allocating line is in jupyter_gpumem.

    A full collection first: it frees garbage awaiting the collector and empties the
    interpreter's free lists, whose spare tuples keep the allocation site of their first use
    (a block made by one of our lines and freed stays counted there, whoever reuses it).
    """
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    ours = snapshot.filter_traces([tracemalloc.Filter(True, f"{PACKAGE}/*")])
    return sum(stat.size for stat in ours.statistics("filename"))


def test_per_cell_work_and_kept_memory_stay_flat_over_a_thousand_cells(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = (
        "import torch\n"
        "model = torch.nn.Linear(16, 16)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    )
    assert shell.run_cell(setup).success
    visits: list[int] = []
    check_leaks = ipython_refs.check_leaks

    def counted(*args: object, **kwargs: object) -> ipython_refs.LeakCheck:
        check = check_leaks(*args, **kwargs)  # type: ignore[arg-type]
        visits.append(check.visited)
        return check

    monkeypatch.setattr(ipython_refs, "check_leaks", counted)
    body = "x = model(torch.randn(4, 16)).sum()\nx.backward(); opt.step(); opt.zero_grad()\n"
    logbook.set_limit(50)
    tracemalloc.start()
    try:
        for i in range(CELLS):
            # a plain cell between measured ones, as in a notebook; each adds to In, _i<N>
            assert shell.run_cell(body).success
            result = shell.run_cell(f"%%gpumem --quiet --name c{i}\n{body}")
            assert result.success, result.error_in_exec
            if i == WARM:
                kept_early = _held_by_us()
        kept_late = _held_by_us()
    finally:
        tracemalloc.stop()
        logbook.set_limit(logbook.DEFAULT_LIMIT)
    assert len(visits) == CELLS
    first, last = statistics.median(visits[:WINDOW]), statistics.median(visits[-WINDOW:])
    assert last <= first, f"objects visited per cell grew from {first} to {last}"
    assert kept_late - kept_early <= KEPT_GROWTH_BYTES, (kept_early, kept_late)
    assert len(logbook.reports()) == 50
    assert logbook.recorded() == CELLS and logbook.dropped() == CELLS - 50
    assert [r.name for r in logbook.reports()][-1] == f"c{CELLS - 1}"


@pytest.mark.parametrize("flags", ["--quiet", "", "-o r --name step"])
def test_a_cell_leaves_no_garbage_in_cycles(shell: InteractiveShell, flags: str) -> None:
    setup = (
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))\n"
        "opt = torch.optim.Adam(model.parameters())\n"
    )
    assert shell.run_cell(setup).success
    body = "for _ in range(8):\n    model(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()\n"
    for _ in range(2):  # first cells fill caches and install counters
        assert shell.run_cell(f"%%gpumem {flags}\n{body}").success
    plain = cyclic_garbage(shell, body)
    assert cyclic_garbage(shell, f"%%gpumem {flags}\n{body}") == plain


def test_our_work_runs_with_the_collector_paused_and_the_cell_with_it_on(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jupyter_gpumem.session as session

    seen: list[bool] = []
    build = session.build_report

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return build(*args, **kwargs)

    monkeypatch.setattr(session, "build_report", watched)
    assert shell.run_cell("%%gpumem\nimport gc\ncollecting = gc.isenabled()").success
    assert shell.user_ns["collecting"] is True and seen == [False]
    assert gc.isenabled()
    gc.disable()  # the user's choice holds through the cell and after it
    try:
        assert shell.run_cell("%%gpumem --quiet\ncollecting = gc.isenabled()").success
        assert shell.user_ns["collecting"] is False and not gc.isenabled()
    finally:
        gc.enable()


def _promoted(shell: InteractiveShell, flags: str | None, steps: int) -> int:
    """Objects a cell of ``steps`` steps moves into the oldest generation, alive at its end.

    The cell collects its young generations once, as a long cell would many times: what is
    alive then is moved on, and counts towards the next full collection.
    """
    source = (
        "_before = {id(o) for o in gc.get_objects(generation=2)}\n"
        f"for _ in range({steps}):\n    step()\n"
        "gc.collect(1)\n"
        "_promoted = sum(1 for o in gc.get_objects(generation=2) if id(o) not in _before)\n"
    )
    gc.collect()
    cell = source if flags is None else f"%%gpumem {flags}\n{source}"
    assert shell.run_cell(cell).success
    return int(shell.user_ns["_promoted"])


def test_what_a_cell_records_never_reaches_the_oldest_generation(shell: InteractiveShell) -> None:
    setup = (
        "import gc, torch\n"
        "model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())])\n"
        "opt = torch.optim.Adam(model.parameters())\n"
        "def step():\n"
        "    model(torch.randn(8, 32)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "step()\n"
    )
    assert shell.run_cell(setup).success
    _promoted(shell, "--quiet", 1)  # the first cell fills caches and installs counters
    # tags, scope marks and CPU events of every step are alive when the cell collects:
    # recorded as plain tuples, the collector untracks them instead of moving them on
    one, three = _promoted(shell, "--quiet", 1), _promoted(shell, "--quiet", 3)
    assert three <= one + 25, (one, three)
    assert _promoted(shell, None, 3) <= _promoted(shell, None, 1) + 25  # as the plain cell


def test_the_limit_is_validated_and_dropping_is_said_once(
    shell: InteractiveShell, recwarn: pytest.WarningsRecorder
) -> None:
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ValueError, match="at least 1"):
            logbook.set_limit(bad)  # type: ignore[arg-type]
    logbook.set_limit(2)
    try:
        for _ in range(4):
            assert shell.run_cell("%%gpumem --quiet\nx = 1").success
        said = [str(w.message) for w in recwarn if "keeps the last 2 reports" in str(w.message)]
        assert len(said) == 1
        assert len(logbook.reports()) == 2
    finally:
        logbook.set_limit(logbook.DEFAULT_LIMIT)


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
        if n > 3:  # recorded in detail for the first 3 steps, later ones taken to repeat them
            assert any(f"first 3 of {n} steps" in note for note in r.notes), r.notes
    # 40 times the steps, the same events: what was recorded stopped at the detailed steps
    assert counts[200] <= counts[5] * 1.5
    n_params = sum(p.numel() for p in shell.user_ns["model"].parameters())
    assert shell.user_ns["r"].breakdown["parameters"] == 4 * n_params
