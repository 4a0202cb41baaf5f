"""cuDNN's workspaces, probed in the estimate's own process on the same GPU, are what the same
convolutions hold in this process; a convolutional estimate counts them and says so."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import workspace_probes  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402

FORWARD = torch.ops.aten.convolution.default
BACKWARD = torch.ops.aten.convolution_backward.default
NORM = torch.ops.aten.native_layer_norm.default
NORM_BACKWARD = torch.ops.aten.native_layer_norm_backward.default


def _held_beyond(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> int:
    """What ``op`` held at its highest beyond its inputs and outputs, here (a warm call)."""
    op(*args, **(kwargs or {}))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = op(*args, **(kwargs or {}))
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
    # ConvNeXt's layer norm over channels of a channels-first activation: a strided input
    h = torch.empty(32, 96, 56, 56, **cuda).permute(0, 2, 3, 1)
    g, b = torch.ones(96, **cuda), torch.zeros(96, **cuda)
    _, mean, rstd = NORM(h, [96], g, b, 1e-6)
    norm = (h, [96], g, b, 1e-6)
    norm_back = (torch.empty(32, 56, 56, 96, **cuda), h, [96], mean, rstd, g, b, [True] * 3)
    return [
        (FORWARD, strided),
        (BACKWARD, back),
        (BACKWARD, depthwise),
        (NORM, norm),
        (NORM_BACKWARD, norm_back),
    ]


def test_the_probe_finds_what_each_convolution_and_layer_norm_holds_in_this_process() -> None:
    prober = workspace_probes.prober_for(torch, torch.device("cuda", 0))
    assert prober is not None
    for op, args in _cases():
        conv = workspace_probes.signature(torch, op.__name__, args)
        here = _held_beyond(op, args)
        found = prober.probe(conv)
        assert not isinstance(found, str), found
        assert found.extra == here, conv.op
        made = op(*args)
        outputs = [t for t in made if t is not None] if isinstance(made, tuple) else [made]
        assert sorted(found.outputs()) == sorted(_rounded(t.nbytes) for t in outputs)
    extras = {c.op: p.extra for c, p in prober.found.items() if not isinstance(p, str)}
    assert extras["convolution.default"] > 50 << 20  # a strided fp32 convolution's
    assert extras["native_layer_norm.default"] >= 32 * 56 * 56 * 96 * 4  # made contiguous


def test_the_probe_finds_what_each_attention_kernel_holds_in_this_process() -> None:
    """The fused attention ops behind scaled_dot_product_attention, as a ViT calls them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    class Calls(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            if func.__name__ in workspace_probes.OPS:
                calls.append((func, args, dict(kwargs or {})))
            return func(*args, **(kwargs or {}))

    q, k, v = (
        torch.randn(32, 12, 197, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    with Calls():
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()
    assert len(calls) == 2, [c[0] for c in calls]  # the forward and its backward
    prober = workspace_probes.prober_for(torch, torch.device("cuda", 0))
    assert prober is not None
    for op, args, kwargs in calls:
        found = prober.probe(workspace_probes.signature(torch, op.__name__, args, kwargs))
        assert not isinstance(found, str), found
        assert found.extra == _held_beyond(op, args, kwargs), op


def _rounded(n: int) -> int:
    return -(-n // 512) * 512


def test_the_fake_op_allocates_as_the_probe_found() -> None:
    """Fake outputs and workspaces recorded in the order of the probe's allocations."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jupyter_gpumem.tuner.estimation.workspace_probes import Tally, recorded

    prober = workspace_probes.prober_for(torch, torch.device("cuda", 0))
    assert prober is not None
    for op, real in _cases():
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in real)
            out = op(*args)
            sizes: list[int] = []

            def record(t: Any, *_: Any, sizes: list[int] = sizes) -> None:
                sizes.append(t.untyped_storage().nbytes())

            assert recorded(torch, op, args, None, out, record, Tally())
        found = prober.probe(workspace_probes.signature(torch, op.__name__, real))
        assert not isinstance(found, str)
        wanted = [n for kind, _, n in found.steps if kind == "alloc"]
        assert [_rounded(n) for n in sizes] == wanted, op


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
    trial = Trial(
        model, batch, lambda m, b: m(b).logsumexp(-1).mean(), optimizer=opt, device="cuda"
    )
    found = trial.estimate()
    assert found.peak_bytes is not None, found.reason
    note = next(n for n in found.notes if n.startswith("the kernels' own allocations"))
    assert f"on this {torch.cuda.get_device_name(0)} for 4 distinct convolutions" in note
