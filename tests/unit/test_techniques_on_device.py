"""What cannot help on a device: TF32, paging and offloading act on a GPU only, and on the CPU
fp16 autocast keeps bf16 autocast's bytes; each with the reason."""

from __future__ import annotations

import torch

from jupyter_gpumem.techniques import OPTIMIZERS, PRECISIONS
from jupyter_gpumem.techniques.on_device import Unhelpful, left_out_line, unhelpful, usable


def test_on_the_cpu_tf32_and_paging_are_left_out_with_the_reason() -> None:
    left: list[Unhelpful] = []
    cpu = torch.device("cpu")
    assert usable("precision", [None, *PRECISIONS], cpu, left) == [
        None, "fp32", "bf16-autocast", "bf16",
    ]  # fmt: skip
    kept = usable("optimizer", [None, *OPTIMIZERS], cpu, left)
    assert "adamw-paged-8bit" not in kept and "adamw-8bit" in kept  # bitsandbytes runs it there
    assert [u.technique for u in left] == [
        "precision tf32", "precision fp16-autocast", "optimizer adamw-paged-8bit",
    ]  # fmt: skip
    usable("precision", ["tf32"], cpu, left)  # said once, however often it is asked
    line = left_out_line(left, cpu)
    assert line.startswith("Left out on the cpu, where they cannot help: precision tf32: ")
    assert "CUDA's TF32 switches" in line and "it would run as fp32" in line
    assert line.count("tf32:") == 1


def test_on_cuda_everything_can_help() -> None:
    left: list[Unhelpful] = []
    cuda = torch.device("cuda", 0)  # no GPU needed: only the device's type is read
    assert usable("precision", [None, *PRECISIONS], cuda, left) == [None, *PRECISIONS]
    assert usable("optimizer", list(OPTIMIZERS), cuda, left) == list(OPTIMIZERS)
    assert left == [] and unhelpful("offload", "offload", cuda) is None


def test_offloading_moves_nothing_on_the_cpu() -> None:
    found = unhelpful("offload", "offload", "cpu")
    assert found is not None and found.technique == "offload"
    assert "on the cpu they are there already" in found.reason
    assert unhelpful("offload", "offload", "mps") is None  # a GPU's memory, not the host's
    assert unhelpful("precision", "tf32", "mps") is not None  # CUDA's switch only
    assert unhelpful("precision", "fp16-autocast", "mps") is None
