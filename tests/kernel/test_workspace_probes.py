"""cuDNN's workspaces in an estimate: each distinct convolution probed once, its workspace made
after its outputs, and the estimate's note. The probe itself runs on the GPU
(``tests/gpu/test_workspace_probes_gpu.py``); here a prober registered for the CPU answers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import workspace_probes  # noqa: E402
from jupyter_gpumem.tuner.estimation.worker_process import Worker  # noqa: E402
from jupyter_gpumem.tuner.estimation.workspace_probes import (  # noqa: E402
    Call,
    Layout,
    Probe,
    Prober,
    Tally,
)
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
def probed() -> Iterator[list[Call]]:
    """A prober for the CPU that finds a 48 MiB workspace for every convolution but the
    forward of the first (the probe could not run it); the convolutions it was asked about."""
    asked: list[Call] = []

    def measure(convs: Sequence[Call]) -> list[Probe | str]:
        asked.extend(convs)
        return [
            "the GPU had no room for the op's tensors"
            if c.op == "convolution.default" and c.args[0].shape[1] == 3
            else Probe((), WORKSPACE)  # no steps to match: the workspace after the outputs
            for c in convs
        ]

    workspace_probes.PROBERS["cpu"] = Prober("test card", measure)
    try:
        yield asked
    finally:
        workspace_probes.PROBERS.pop("cpu")


def test_each_convolutions_workspace_counts_in_the_peak() -> None:
    plain = _trial().estimate()
    workspace_probes.PROBERS["cpu"] = Prober(
        "test card", lambda convs: [Probe((), WORKSPACE)] * len(convs)
    )
    try:
        with_all = _trial().estimate()
    finally:
        workspace_probes.PROBERS.pop("cpu")
    assert plain.peak_bytes is not None and with_all.peak_bytes is not None
    assert plain.peak_bytes + WORKSPACE >= with_all.peak_bytes > WORKSPACE
    assert not any("cuDNN" in n for n in plain.notes)
    note = next(n for n in with_all.notes if n.startswith("the kernels' own allocations"))
    assert "this test card for 4 distinct convolutions (largest 48.0 MiB)" in note


def test_a_convolution_that_cannot_be_probed_counts_none_and_the_note_says_so(
    probed: list[Call],
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
    note = next(n for n in found.notes if n.startswith("the kernels' own allocations"))
    assert "for 3 distinct convolutions" in note
    assert "1 could not be probed and count none (the GPU had no room" in note


def test_outputs_and_workspaces_are_recorded_in_the_order_the_gpu_allocated_them() -> None:
    """A backward as cuDNN runs it: the input's gradient, its workspace (freed), the weight's
    gradient, its workspace (freed), then the bias's gradient."""
    x = torch.empty(2, 3, 8, 8, device="meta")
    w = torch.empty(4, 3, 3, 3, device="meta")
    g = torch.empty(2, 4, 6, 6, device="meta")
    args = (g, x, w, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    out = torch.ops.aten.convolution_backward.default(*args)
    steps = (
        ("alloc", 0, 1536), ("alloc", 1, 4 << 20), ("free", 1, 0),  # grad input, workspace
        ("alloc", 3, 512), ("alloc", 4, 2 << 20), ("free", 4, 0),  # grad weight, workspace
        ("alloc", 6, 512),  # grad bias
    )  # fmt: skip
    workspace_probes.PROBERS["meta"] = Prober("test card", lambda convs: [Probe(steps, 4 << 20)])
    seen: list[tuple[int, bool]] = []  # (bytes, whether every earlier workspace is gone)
    workspaces: list[Any] = []

    def record(t: Any, *_: Any) -> None:
        seen.append((t.untyped_storage().nbytes(), all(r() is None for r in workspaces)))
        if t.dtype == torch.uint8:
            import weakref

            workspaces.append(weakref.ref(t))

    try:
        tally = Tally()
        func = torch.ops.aten.convolution_backward.default
        assert workspace_probes.recorded(torch, func, args, None, out, record, tally)
    finally:
        workspace_probes.PROBERS.pop("meta")
    assert seen == [
        (x.nbytes, True), (4 << 20, True), (w.nbytes, True), (2 << 20, True), (16, True),
    ]  # fmt: skip
    assert all(r() is None for r in workspaces)
    assert "for 1 distinct convolution (largest 4.00 MiB)" in tally.note()


def test_the_signature_keeps_layouts_and_cudnn_flags() -> None:
    x = torch.empty(2, 3, 8, 8).to(memory_format=torch.channels_last)
    w = torch.empty(4, 3, 3, 3, dtype=torch.bfloat16)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    conv = workspace_probes.signature(torch, "convolution.default", args)
    assert conv.args[0] == Layout((2, 3, 8, 8), (192, 1, 24, 3), "float32", on_gpu=False)
    assert conv.args[1] == Layout((4, 3, 3, 3), (27, 9, 3, 1), "bfloat16", on_gpu=False)
    assert conv.args[3:] == ((1, 1), (0, 0), (1, 1), False, (0, 0), 1)
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not before
    try:
        other = workspace_probes.signature(torch, "convolution.default", args)
    finally:
        torch.backends.cudnn.benchmark = before
    assert other != conv and dict(other.flags)["benchmark"] is (not before)


def test_attention_calls_keep_their_keywords_and_are_named_apart() -> None:
    q = torch.empty(2, 4, 16, 8, dtype=torch.bfloat16)
    op = "_scaled_dot_product_cudnn_attention.default"
    call = workspace_probes.signature(torch, op, (q, q, q, None, True), {"scale": 0.125})
    assert call.kwargs == (("scale", 0.125),) and call.kind == "attention"
    conv = workspace_probes.signature(torch, "convolution.default", (q, q))
    tally = Tally(device_name="test card", probed={call, conv}, largest=3 << 20)
    assert tally.note() == (
        "the kernels' own allocations (cuDNN's convolutions, fused attention, layer norm) "
        "measured on this test card for 1 distinct convolution and 1 distinct attention call "
        "(largest 3.00 MiB)"
    )
    assert op in workspace_probes.OPS


def test_no_prober_for_the_cpu_or_meta() -> None:
    assert workspace_probes.prober_for(torch, torch.device("cpu")) is None
    assert workspace_probes.prober_for(torch, torch.device("meta")) is None


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
        worker.stop()
        worker.start()  # started ahead of its first job, and idle from then on
        assert worker.alive()
        deadline = time.monotonic() + 30
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not worker.alive()
    finally:
        worker.stop()
