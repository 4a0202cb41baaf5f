"""CUDA's reduction kernels' staging buffers, sized as Reduce.cuh sizes them.

The figures are the H200's (132 multiprocessors of 2,048 threads, torch 2.11): what each op held
beyond what it held before and after (``bench/op_transients.py``), the buffer and the semaphores
each rounded to the allocator's 512 bytes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import cuda_like  # noqa: E402
from jupyter_gpumem.tuner.estimation.cuda_like import Multiprocessors  # noqa: E402
from jupyter_gpumem.tuner.estimation.reduce_buffers import (  # noqa: E402
    Iteration,
    buffers,
    global_buffers,
    iteration,
)

H200 = Multiprocessors(132, 2048)


def _held(shape: tuple[int, ...], dims: tuple[int, ...], itemsize: int) -> int | None:
    strides = torch.empty(shape, device="meta").stride()
    found = global_buffers(iteration(shape, strides, dims), itemsize, 4, H200)
    return None if found is None else sum(-(-n // 512) * 512 for n in found)


@pytest.mark.parametrize(
    ("shape", "dims", "itemsize", "measured"),
    [
        ((25088, 768), (0,), 2, 138_412_544),  # ConvNeXt's bias gradient, bf16
        ((6304, 3072), (0,), 2, 138_412_544),  # ViT-B's MLP bias
        ((2048, 32000), (0,), 2, 147_457_024),  # DeBERTa's vocabulary bias
        ((32, 28, 28, 192), (0, 1, 2), 4, 38_535_680),  # ConvNeXt, fp32, channels last
    ],
)
def test_the_buffers_are_the_measured_ones(
    shape: tuple[int, ...], dims: tuple[int, ...], itemsize: int, measured: int
) -> None:
    assert _held(shape, dims, itemsize) == measured


def test_the_kernel_sees_the_reduced_dimensions_first_and_coalesced() -> None:
    assert iteration((32, 28, 28, 192), (150528, 5376, 192, 1), (0, 1, 2)) == Iteration(
        (25088, 192), (192, 1), 1
    )
    # a row sum: the reduced dimension is the fastest, the rest coalesce behind it
    assert iteration((4, 512, 1000), (512000, 1000, 1), (-1,)) == Iteration(
        (1000, 2048), (1, 1000), 1
    )
    # a transposed input: reduced first whatever its stride, then the kept ones by stride
    assert iteration((768, 25088), (1, 768), (1,)) == Iteration((25088, 768), (768, 1), 1)
    assert iteration((5, 1, 7), (7, 7, 1), ()) == Iteration((35,), (1,), 1)  # every dimension


def test_reductions_that_stay_in_their_blocks_allocate_nothing() -> None:
    assert _held((4, 512, 1000), (2,), 2) is None  # rows of 1000: within a block
    assert _held((64, 768), (0,), 2) is None  # 64 rows: too few values a thread
    assert _held((8, 128256), (0, 1), 4) is not None  # everything into one value: split


def test_fewer_multiprocessors_split_less() -> None:
    it = iteration((25088, 768), (768, 1), (0,))
    h200 = global_buffers(it, 2, 4, H200)
    t4 = global_buffers(it, 2, 4, Multiprocessors(40, 1024))
    assert h200 is not None and t4 is not None and t4[0] < h200[0]
    assert t4[1] == h200[1]  # a semaphore a column of blocks either way


def test_the_fake_step_gets_them_for_sums_and_means_on_an_aimed_device() -> None:
    x = torch.empty(25088, 768, dtype=torch.bfloat16, device="meta")
    sum_dim, mean = torch.ops.aten.sum.dim_IntList, torch.ops.aten.mean.dim
    assert buffers(torch, sum_dim, (x, [0]), {}) == []  # meta is no CUDA device
    cuda_like.aim("meta", H200)
    try:
        made = buffers(torch, sum_dim, (x, [0]), {})
        assert [t.nbytes for t in made] == [138_412_032, 24]
        assert all(t.device.type == "meta" for t in made)
        assert [t.nbytes for t in buffers(torch, mean, (x, [0], False), {})] == [138_412_032, 24]
        assert buffers(torch, torch.ops.aten.amax.default, (x, [0]), {}) == []
        assert buffers(torch, sum_dim, (x.long(), [0]), {}) == []  # integers: not modelled
        assert buffers(torch, sum_dim, (x, [1]), {}) == []  # rows of 768: within a block
    finally:
        cuda_like._AIMED.pop("meta")
