"""Training state a library holds, out of the namespace's sight, still has its name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.held import ipython_refs
from jupyter_gpumem.held.namespace_scan import NamespaceScan
from jupyter_gpumem.tracking.held_state import HELD

# A trainer in the manner of HF's or Lightning's: the model and the optimizer live in its
# attributes (under names no lookup could guess), and training happens in its own method.
LIBRARY = """
import torch, torch.nn as nn

class Engine:
    def __init__(self, width):
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self._parts = {"update_rule": torch.optim.AdamW(self.net.parameters(), lr=1e-3)}

    def fit(self, steps):
        x = torch.randn(8, self.net[0].in_features)
        for _ in range(steps):
            self.net(x).square().mean().backward()
            self._parts["update_rule"].step()  # gradients stay, as after a Trainer's last step

engine = Engine(64)
engine.fit(2)
N = sum(p.numel() for p in engine.net.parameters())
STEP_BYTES = sum(
    s["step"].untyped_storage().nbytes() for s in engine._parts["update_rule"].state.values()
)
"""

INFERENCE = "%%gpumem -o r --quiet\nwith torch.no_grad():\n    y = engine.net(torch.randn(4, 64))"


@pytest.fixture
def ip(shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    monkeypatch.setitem(ipython_refs._SCANS, shell, NamespaceScan(on_optimizer=HELD.found))
    HELD.clear()
    yield shell
    for name in ("engine", "Engine", "N", "STEP_BYTES", "r", "y"):
        shell.user_ns.pop(name, None)
    HELD.clear()


def check(ip: InteractiveShell) -> None:
    r = ip.user_ns["r"]
    n, step_bytes = ip.user_ns["N"], ip.user_ns["STEP_BYTES"]
    assert r.breakdown["optimizer_state"] == 8 * n + step_bytes, r.breakdown
    assert r.breakdown["gradients"] == 4 * n, r.breakdown
    assert r.breakdown["parameters"] == 4 * n, r.breakdown
    named = {t.name for t in r.tensors if t.name}
    assert not any("_parts" in name or "update_rule" in name for name in named)


def test_state_of_an_optimizer_that_stepped_since_the_extension_loaded(
    ip: InteractiveShell,
) -> None:
    assert ip.run_cell("import torch").success  # the step hook goes in once torch is there
    assert ip.run_cell(LIBRARY).success  # a plain cell: only the global step hook hears it
    ((where, _),) = HELD.known()
    assert where == "AdamW"
    assert ip.run_cell(INFERENCE).success
    check(ip)


def test_state_of_an_optimizer_found_by_the_scan(ip: InteractiveShell) -> None:
    assert ip.run_cell("import torch").success
    HELD.uninstall()  # as if the extension was loaded after training
    try:
        assert ip.run_cell(LIBRARY).success
    finally:
        HELD.install()
    assert not list(HELD.known())
    assert ip.run_cell(INFERENCE).success  # its report's scan walks `engine`
    ((where, _),) = HELD.known()
    assert where == "engine: AdamW"
    assert ip.run_cell(INFERENCE).success
    check(ip)
