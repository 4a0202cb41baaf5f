"""Where a trial or an estimate runs: a CUDA device always carries its index, as tensors name it."""

from __future__ import annotations

import torch

from jupyter_gpumem.tuner.workload import indexed


def test_a_cuda_device_carries_its_index_without_starting_cuda() -> None:
    started = torch.cuda.is_initialized()
    assert indexed(torch, "cuda") == torch.device(
        "cuda", torch.cuda.current_device() if started else 0
    )
    assert indexed(torch, "cuda:1") == torch.device("cuda", 1)
    assert indexed(torch, torch.device("cpu")) == torch.device("cpu")
    assert torch.cuda.is_initialized() == started
