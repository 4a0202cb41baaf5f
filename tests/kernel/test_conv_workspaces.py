"""cuDNN's workspaces in an estimate: each distinct convolution probed once, its workspace made
after its outputs, and the estimate's note. The probe itself runs on the GPU
(``tests/gpu/test_conv_workspaces_gpu.py``); here a prober registered for the CPU answers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import conv_workspaces  # noqa: E402
from jupyter_gpumem.tuner.estimation.conv_workspaces import Convolution, Layout, Prober  # noqa: E402
from jupyter_gpumem.tuner.estimation.worker_process import Worker  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402

WORKSPACE = 48 << 20


def _trial() -> Trial:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, stride=2)
    )
    batch = torch.randn(2, 3, 16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trial(model, batch, lambda m, b: m(b).square().mean(), optimizer=opt, device="cpu")


@pytest.fixture
def probed() -> Iterator[list[Convolution]]:
    """A prober for the CPU that finds a 48 MiB workspace for every convolution but the
    forward of the first (the probe could not run it); the convolutions it was asked about."""
    asked: list[Convolution] = []

    def measure(convs: Sequence[Convolution]) -> list[int | str]:
        asked.extend(convs)
        return [
            "the GPU had no room for the convolution's tensors"
            if c.op == "convolution.default" and c.args[0].shape[1] == 3
            else WORKSPACE
            for c in convs
        ]

    conv_workspaces.PROBERS["cpu"] = Prober("test card", measure)
    try:
        yield asked
    finally:
        conv_workspaces.PROBERS.pop("cpu")


def test_each_convolutions_workspace_counts_in_the_peak() -> None:
    plain = _trial().estimate()
    conv_workspaces.PROBERS["cpu"] = Prober("test card", lambda convs: [WORKSPACE] * len(convs))
    try:
        with_all = _trial().estimate()
    finally:
        conv_workspaces.PROBERS.pop("cpu")
    assert plain.peak_bytes is not None and with_all.peak_bytes is not None
    assert plain.peak_bytes + WORKSPACE >= with_all.peak_bytes > WORKSPACE
    assert not any("cuDNN" in n for n in plain.notes)
    note = next(n for n in with_all.notes if n.startswith("cuDNN's convolution workspaces"))
    assert "this test card for 4 distinct convolutions (largest 48.0 MiB)" in note


def test_a_convolution_that_cannot_be_probed_counts_none_and_the_note_says_so(
    probed: list[Convolution],
) -> None:
    found = _trial().estimate()
    ops = sorted(c.op for c in probed)
    # two forwards; two backwards (the first without the input's gradient), each asked once
    # however many steps ran them
    assert ops == ["convolution.default"] * 2 + ["convolution_backward.default"] * 2
    first_backward = next(
        c for c in probed if c.op == "convolution_backward.default" and c.args[1].shape[1] == 3
    )
    assert first_backward.args[-1] == (False, True, True)  # output_mask: no input gradient
    note = next(n for n in found.notes if n.startswith("cuDNN's convolution workspaces"))
    assert "for 3 distinct convolutions" in note
    assert "1 could not be probed and count none (the GPU had no room" in note


def test_the_signature_keeps_layouts_and_cudnn_flags() -> None:
    x = torch.empty(2, 3, 8, 8).to(memory_format=torch.channels_last)
    w = torch.empty(4, 3, 3, 3, dtype=torch.bfloat16)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    conv = conv_workspaces.signature(torch, "convolution.default", args)
    assert conv.args[0] == Layout((2, 3, 8, 8), (192, 1, 24, 3), "float32")
    assert conv.args[1] == Layout((4, 3, 3, 3), (27, 9, 3, 1), "bfloat16")
    assert conv.args[3:] == ((1, 1), (0, 0), (1, 1), False, (0, 0), 1)
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not before
    try:
        other = conv_workspaces.signature(torch, "convolution.default", args)
    finally:
        torch.backends.cudnn.benchmark = before
    assert other != conv and dict(other.flags)["benchmark"] is (not before)


def test_no_prober_for_the_cpu_or_meta() -> None:
    assert conv_workspaces.prober_for(torch, torch.device("cpu")) is None
    assert conv_workspaces.prober_for(torch, torch.device("meta")) is None


def _environment(name: Any) -> str:
    return os.environ.get(name, "")


def test_the_worker_gets_its_environment_and_ends_when_idle() -> None:
    worker = Worker(env={"GPUMEM_PROBE_TEST": "yes"}, idle_s=0.5)
    try:
        assert worker.call(_environment, "GPUMEM_PROBE_TEST") == "yes"
        assert worker.alive()
        deadline = time.monotonic() + 30
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not worker.alive()
        assert worker.call(_environment, "GPUMEM_PROBE_TEST") == "yes"  # started again
    finally:
        worker.stop()
