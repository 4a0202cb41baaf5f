"""The grouped GEMM's stand-in against the real CPU kernel: the output it allocates, byte for byte.

torch's fake kernel for ``aten._grouped_mm`` takes bf16 alone, and on a build without CUDA it
leaves out the row padding that the real kernels allocate; the stand-in makes what they make.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "_grouped_mm"):
    pytest.skip("a torch without grouped GEMMs", allow_module_level=True)
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from jupyter_gpumem.tuner.estimation.stand_ins import stand_in  # noqa: E402


def _offs(*ends: int) -> Any:
    return torch.tensor(ends, dtype=torch.int32)


# (mat_a, mat_b, offs) of each case the real kernels take; an output of 6 or 12 columns is
# padded to 16 bytes a row in fp32 or in 16-bit floats
CASES: dict[str, Callable[[Any], tuple[Any, Any, Any]]] = {
    # tokens sorted by expert times each expert's weight, stored (experts, out, in) as
    # transformers stores it: the forward and the input's gradient
    "2d-3d": lambda d: (torch.randn(10, 8, dtype=d), torch.randn(3, 6, 8, dtype=d).mT, _offs(3, 7, 10)),
    "2d-3d aligned": lambda d: (torch.randn(10, 8, dtype=d), torch.randn(3, 8, 16, dtype=d), _offs(2, 2, 9)),
    # the weight's gradient: inputs transposed times output gradients, grouped along tokens
    "2d-2d": lambda d: (torch.randn(10, 8, dtype=d).mT, torch.randn(10, 16, dtype=d)[:, :6], _offs(3, 7, 10)),
    "3d-2d": lambda d: (torch.randn(3, 5, 8, dtype=d), torch.randn(8, 16, dtype=d)[:, :12], _offs(3, 7, 12)),
    "3d-3d": lambda d: (torch.randn(3, 5, 8, dtype=d), torch.randn(3, 12, 8, dtype=d).mT, None),
}  # fmt: skip
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_stand_in_allocates_what_the_real_kernel_allocates(case: str, dtype: Any) -> None:
    mat_a, mat_b, offs = CASES[case](dtype)
    real = torch._grouped_mm(mat_a, mat_b, offs=offs)
    run = stand_in(torch, torch.ops.aten._grouped_mm.default)
    assert run is not None
    mode = FakeTensorMode()
    fakes = [None if t is None else mode.from_tensor(t) for t in (mat_a, mat_b, offs)]
    with mode:
        out = run(*fakes[:2], offs=fakes[2])
    assert (out.shape, out.stride(), out.dtype) == (real.shape, real.stride(), real.dtype)
    assert out.untyped_storage().nbytes() == real.untyped_storage().nbytes()
    assert out.device == real.device and isinstance(out, torch._subclasses.FakeTensor)


def test_the_fake_kernel_refuses_what_the_stand_in_takes() -> None:
    """Should torch's fake kernel come to take fp32, this stand-in can go."""
    mat_a, mat_b, offs = CASES["2d-3d"](torch.float32)
    mode = FakeTensorMode()
    fake_a, fake_b, fake_offs = (mode.from_tensor(t) for t in (mat_a, mat_b, offs))
    with mode, pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
        torch._grouped_mm(fake_a, fake_b, offs=fake_offs)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda a, b, o: (a, b, o, {"out_dtype": torch.bfloat16}), "must match `mat_a` dtype"),
        (lambda a, b, o: (a, b, None, {}), "Have to provide offsets"),
        (lambda a, b, o: (a[:, :4], b, o, {}), "contraction dimension"),
        (lambda a, b, o: (a.int(), b, o, {}), "Float32, BFloat16 or Float16"),
        (lambda a, b, o: (a, b, o, {"bias": torch.zeros(6)}), "Bias not supported"),
    ],
    ids=["out-dtype", "no-offsets", "contraction", "int-input", "bias"],
)
def test_what_the_real_kernel_refuses_the_stand_in_refuses(change: Any, error: str) -> None:
    mat_a, mat_b, offs, kwargs = change(*CASES["2d-3d"](torch.float32))
    with pytest.raises(RuntimeError, match=error):
        torch._grouped_mm(mat_a, mat_b, offs=offs, **kwargs)
    run = stand_in(torch, torch.ops.aten._grouped_mm.default)
    assert run is not None
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, pytest.raises(RuntimeError, match=error):
        run(mat_a, mat_b, offs=offs, **kwargs)


def test_other_ops_keep_their_fake_kernels() -> None:
    assert stand_in(torch, torch.ops.aten.mm.default) is None
    assert stand_in(torch, torch.ops.aten.bmm.default) is None


def test_the_cuda_grouped_gemm_buffers_are_the_measured_ones() -> None:
    from jupyter_gpumem.tuner.estimation.stand_ins import cutlass_buffers, kernel_buffers

    # measured on an H200: 480 and 67,584 bytes for 8 groups, 240 and 67,584 for 4
    assert cutlass_buffers(8) == (480, 67_584)
    assert cutlass_buffers(4) == (240, 67_584)
    a, b = torch.randn(32, 16), torch.randn(4, 16, 8)
    offs = torch.tensor([8, 16, 24, 32], dtype=torch.int32)
    grouped = torch.ops.aten._grouped_mm.default
    assert kernel_buffers(torch, grouped, (a, b, offs), {}) == []  # the CPU: the output alone
    assert kernel_buffers(torch, torch.ops.aten.mm.default, (a, a.t()), {}) == []
