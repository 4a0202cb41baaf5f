"""What CUDA kernels make through ATen inside themselves: softmax backward's ``grad * output``,
on CUDA and on a device aimed as CUDA, in the product's dtype; none on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation import cuda_like  # noqa: E402
from jupyter_gpumem.tuner.estimation.kernel_temporaries import temporaries  # noqa: E402

BACKWARD = torch.ops.aten._softmax_backward_data.default


@pytest.fixture
def aimed() -> object:
    cuda_like.aim("meta", cuda_like.Multiprocessors(132, 2048))
    yield
    cuda_like._AIMED.pop("meta")


def test_softmax_backward_makes_the_product_of_the_gradient_and_output(aimed: object) -> None:
    grad = torch.empty(4, 16, 512, 512, device="meta")
    (made,) = temporaries(torch, BACKWARD, (grad, grad, -1, torch.float32), {})
    assert (made.shape, made.dtype, made.device.type) == (grad.shape, torch.float32, "meta")
    assert made.nbytes == 67_108_864  # DeBERTa-v3's, measured on an H200
    half = torch.empty(2, 8, 8, device="meta", dtype=torch.float16)
    fp32 = torch.empty(2, 8, 8, device="meta")
    (mixed,) = temporaries(torch, BACKWARD, (fp32, half, -1, torch.float16), {})
    assert mixed.dtype == torch.float32  # fp32 gradient of an fp16 softmax: a float product


def test_none_for_other_ops_and_on_the_cpu(aimed: object) -> None:
    grad = torch.empty(2, 8, device="meta")
    assert temporaries(torch, torch.ops.aten._log_softmax_backward_data.default, (grad, grad, -1, torch.float32), {}) == []  # fmt: skip
    cpu = torch.empty(2, 8)
    assert temporaries(torch, BACKWARD, (cpu, cpu, -1, torch.float32), {}) == []
