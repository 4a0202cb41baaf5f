"""Leak hints and `free` against a real IPython shell, with CPU tensors."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.analysis.leak_hints import LeakHint, growth_hint
from jupyter_gpumem.held.ipython_refs import find_leaks, free, namespace_bytes, release

torch = pytest.importorskip("torch")
MiB = 2**20


@pytest.fixture
def ip(shell: InteractiveShell) -> Iterator[InteractiveShell]:
    """The shared shell with torch imported and nothing held from earlier tests."""
    shell.run_cell("import torch, weakref", store_history=True)
    release(shell)
    yield shell
    release(shell)
    for name in ("w", "h", "loss", "losses", "acc", "x", "ref", "explode", "Cyclic"):
        shell.user_ns.pop(name, None)


def run(ip: InteractiveShell, code: str) -> int:
    result = ip.run_cell(code, store_history=True)
    return int(result.execution_count)


def hints(ip: InteractiveShell, device: object = None, cycles: bool = True) -> dict[str, LeakHint]:
    return {h.kind: h for h in find_leaks(ip, device=device, cycles=cycles)}


def test_a_tensor_in_the_output_cache_is_reported_and_freed(ip: InteractiveShell) -> None:
    n = run(ip, "torch.ones(3, 1 << 18)")  # 3 MiB, shown as Out[n] and kept as _
    ref = weakref.ref(ip.user_ns["Out"][n])
    hint = hints(ip)["output-cache"]
    assert hint.bytes == 3 * MiB
    assert f"Out[{n}]" in hint.where and "_" in hint.where
    assert free(ip) >= 3 * MiB
    assert ref() is None
    assert n not in ip.user_ns["Out"] and f"_{n}" not in ip.user_ns
    assert "output-cache" not in hints(ip)


def test_an_output_that_a_variable_also_holds_is_not_reported(ip: InteractiveShell) -> None:
    run(ip, "x = torch.ones(1 << 18)\nx")
    assert "output-cache" not in hints(ip)
    release(ip)
    assert ip.user_ns["x"].numel() == 1 << 18  # the user's variable is untouched


@pytest.mark.parametrize("magic", ["", "%%gpumem --quiet\n"])
def test_a_tensor_only_the_traceback_holds_is_reported_and_freed(
    ip: InteractiveShell, magic: str
) -> None:
    run(ip, "def explode():\n    scratch = torch.ones(5, 1 << 18)\n    raise RuntimeError('boom')")
    run(ip, f"{magic}explode()")
    hint = hints(ip)["traceback"]
    assert hint.bytes == 5 * MiB
    assert hint.where == ("explode() line 3",)
    freed = release(ip)
    assert "the last traceback" in freed.cleared
    assert freed.total_bytes >= 5 * MiB
    assert not hasattr(sys, "last_traceback")
    assert "traceback" not in hints(ip)


def test_a_stored_loss_keeping_its_graph_is_reported(ip: InteractiveShell) -> None:
    run(
        ip,
        "w = torch.randn(256, 256, requires_grad=True)\n"
        "h = torch.randn(512, 256)\n"
        "loss = (h @ w).sin().sum()",
    )
    hint = hints(ip)["autograd-graph"]
    # sin() saved the 512x256 matmul output; h and w are the user's own variables
    assert hint.bytes == 512 * 256 * 4
    assert hint.where == ("loss",)
    run(ip, "losses = [loss]\ndel loss")
    assert hints(ip)["autograd-graph"].where == ("losses[...]",)
    run(ip, "losses[0].backward()")  # backward frees what the graph saved
    assert "autograd-graph" not in hints(ip)


def test_a_list_that_grows_each_rerun_gives_a_growth_hint(ip: InteractiveShell) -> None:
    run(ip, "acc = []")
    after = []
    for _ in range(4):
        run(ip, "acc.append(torch.ones(1 << 18))")
        after.append(namespace_bytes(ip))
    hint = growth_hint(after, label="acc.append cell")
    assert hint is not None and hint.bytes == MiB
    assert "grows by 1.00 MiB per run" in hint.message


def cyclic_objects() -> int:
    return sum(type(o).__name__ == "Cyclic" for o in gc.get_objects())


def test_tensors_in_reference_cycles_are_found_without_being_freed(ip: InteractiveShell) -> None:
    was_enabled, flags, garbage = gc.isenabled(), gc.get_debug(), len(gc.garbage)
    gc.disable()  # an automatic collection would free the cycle under the test
    try:
        run(
            ip,
            "class Cyclic:\n    pass\nc = Cyclic(); c.me = c; c.t = torch.ones(2, 1 << 18)\ndel c",
        )
        assert hints(ip)["cycles"].bytes == 2 * MiB
        # found, not freed, and the collector's settings are as they were
        assert cyclic_objects() == 1
        assert (gc.get_debug(), len(gc.garbage)) == (flags, garbage)
        assert hints(ip)["cycles"].bytes == 2 * MiB
        assert "cycles" not in hints(ip, cycles=False)
        assert free(ip) >= 2 * MiB
        assert cyclic_objects() == 0
        assert "cycles" not in hints(ip)
    finally:
        if was_enabled:
            gc.enable()


def test_device_filter(ip: InteractiveShell) -> None:
    run(ip, "torch.ones(1 << 18)")
    assert hints(ip, device="cpu")["output-cache"].bytes == MiB
    assert hints(ip, device=0) == {}
    assert hints(ip, device="cuda") == {}


def test_without_torch_nothing_is_imported(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    assert find_leaks(ip) == []
    assert namespace_bytes(ip) == 0
    assert free(ip) == 0
    assert "torch" not in sys.modules
