"""cuDNN's workspaces, probed in the estimate's own process on the same GPU, are what the same
convolutions hold in this process; a convolutional estimate counts them and says so."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import conv_workspaces  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402

FORWARD = torch.ops.aten.convolution.default
BACKWARD = torch.ops.aten.convolution_backward.default


def _held_beyond(op: Any, args: tuple[Any, ...]) -> int:
    """What ``op`` held at its highest beyond its inputs and outputs, here (a warm call)."""
    op(*args)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = op(*args)
    torch.cuda.synchronize()
    held = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    del out
    return held


def _cases() -> list[tuple[Any, tuple[Any, ...]]]:
    cuda = {"device": "cuda"}
    x = torch.empty(32, 256, 56, 56, **cuda)
    w = torch.empty(512, 256, 1, 1, **cuda)
    y = torch.empty(32, 512, 28, 28, **cuda)
    strided = (x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
    back = (y, x, w, [0], [2, 2], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    d = torch.empty(32, 192, 28, 28, dtype=torch.bfloat16, **cuda)
    dw = torch.empty(192, 1, 7, 7, dtype=torch.bfloat16, **cuda)
    depthwise = (d, d, dw, [192], [1, 1], [3, 3], [1, 1], False, [0, 0], 192, [True, True, True])
    return [(FORWARD, strided), (BACKWARD, back), (BACKWARD, depthwise)]


def test_the_probe_finds_what_each_convolution_holds_in_this_process() -> None:
    prober = conv_workspaces.prober_for(torch, torch.device("cuda", 0))
    assert prober is not None
    for op, args in _cases():
        conv = conv_workspaces.signature(torch, op.__name__, args)
        here = _held_beyond(op, args)
        assert prober.workspace(conv) == here, conv.op
    assert any(prober.workspace(c) > 50 << 20 for c in prober.found)  # the strided fp32 ones


def test_a_convolutional_estimate_counts_the_workspaces_and_says_so() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 7, stride=2, padding=3),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, stride=2, padding=1),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(128, 10),
        )
    batch = torch.empty(32, 3, 224, 224, device="meta")
    opt = torch.optim.AdamW(model.parameters())
    trial = Trial(model, batch, lambda m, b: m(b).logsumexp(-1).mean(), optimizer=opt, device="cuda")
    found = trial.estimate()
    assert found.peak_bytes is not None, found.reason
    note = next(n for n in found.notes if n.startswith("cuDNN's convolution workspaces"))
    assert f"on this {torch.cuda.get_device_name(0)} for 4 distinct convolutions" in note
