"""Leak hints in `%%gpumem` reports, and `%gpumem free`."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

LEAKY = "%%gpumem -o r --quiet\nstep_out = torch.randn(512, 512)\nhistory_list.append(step_out * 2)  # planted leak"


def test_a_list_that_grows_on_each_rerun_is_reported(shell: InteractiveShell) -> None:
    assert shell.run_cell("import torch\nhistory_list = []").success
    for _ in range(4):
        assert shell.run_cell(LEAKY).success
    r = shell.user_ns["r"]
    growth = [h for h in r.leak_hints if h.kind == "growth"]
    assert growth, r.leak_hints
    assert growth[0].bytes == 512 * 512 * 4
    assert "grows by 1.00 MiB per run" in growth[0].message
    assert "leak: " in str(r)


def test_a_cell_that_does_not_grow_gets_no_growth_hint(shell: InteractiveShell) -> None:
    assert shell.run_cell("import torch").success
    for _ in range(4):
        assert shell.run_cell("%%gpumem -o r --quiet\nsteady = torch.randn(512, 512)").success
    assert not [h for h in shell.user_ns["r"].leak_hints if h.kind == "growth"]


def test_a_stored_loss_keeping_its_graph_is_reported(shell: InteractiveShell) -> None:
    cell = "%%gpumem -o r --quiet\nw = torch.randn(256, 256, requires_grad=True)\nkept_loss = (w @ torch.randn(256, 512)).relu().sum()"
    assert shell.run_cell("import torch").success
    assert shell.run_cell(cell).success
    kinds = {h.kind for h in shell.user_ns["r"].leak_hints}
    assert "autograd-graph" in kinds


def test_gpumem_free_releases_the_output_cache(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    import weakref

    shell.displayhook.cache_size = 1000
    assert shell.run_cell("import torch").success
    result = shell.run_cell("torch.ones(1024, 1024)", store_history=True)
    ref = weakref.ref(result.result)
    del result
    capsys.readouterr()
    shell.run_line_magic("gpumem", "free")
    out = capsys.readouterr().out
    assert "freed 4.00 MiB" in out, out
    assert ref() is None
