"""The autograd engine's sums of gradients on the GPU: made in place where the old buffer is the
engine's alone, and the estimate from the meta device places them so (``grad_sums``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.trial import Trial  # noqa: E402
from tests.support.squared import Squared  # noqa: E402


def _trial(device: str, rows: int = 16384, width: int = 1024) -> Trial:
    with torch.device(device):
        model = Squared(width)
        x = torch.zeros(rows, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trial(model, x, lambda m, b: m(b), optimizer=opt, device="cuda")


def test_the_estimate_of_a_sum_at_the_peak_is_the_measured_peak() -> None:
    unit = 16384 * 1024 * 4
    found = _trial("meta").estimate()
    assert found.peak_bytes is not None, found.reason
    measured = _trial("cuda").run(found.config)
    assert measured.status == "ok", measured
    # the input, h (saved) and the two gradients of h: the second added into the first
    step = measured.peak_allocated_bytes - found.breakdown["library_workspace"]
    assert 4 * unit <= step < 4.5 * unit
    assert (
        abs(found.peak_bytes - measured.peak_allocated_bytes)
        <= 0.001 * measured.peak_allocated_bytes
    )
    assert found.peak_reserved_bytes == measured.peak_reserved_bytes
