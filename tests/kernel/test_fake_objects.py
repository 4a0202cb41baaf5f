"""The fakes of a model's tensors keep their layout: one fake storage per real storage, of
the same size, with every tensor at the same offset and strides."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from jupyter_gpumem.tuner.estimation.fake_objects import Faker
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog


def _tensors(device: str) -> list[Any]:
    """Tensors as models hold them: whole storages, a transposed one, views into a storage
    seen whole first (at offsets, of another dtype), a storage seen whole after a view of it,
    one of a part of a storage, a scalar, an empty one and a tensor seen twice (a tied
    weight)."""
    with torch.device(device):
        whole = torch.nn.Parameter(torch.empty(64, 32))
        transposed = torch.empty(32, 64).t()
        shared = torch.empty(4, 256)
        part = torch.empty(1000)[10:510].view(25, 20)
        scalar = torch.empty((), dtype=torch.int64)
        empty = torch.empty(0, 8)
        half = torch.empty(3, 7, dtype=torch.bfloat16)
        later = torch.empty(6, 5)
    return [
        whole, transposed, shared, shared[1], shared[2:].view(torch.int32), later[2], later,
        part, scalar, empty, half, whole, shared[0, ::2], transposed.t()[3],
    ]  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_fakes_keep_each_storage_and_each_tensors_place_in_it(device: str) -> None:
    reals = _tensors(device)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        faker = Faker(torch, StorageLog(torch, torch.device("cpu"), mode), meta_to="cpu")
        fakes = [faker.fake(t, "parameters") for t in reals]
    assert fakes[0] is fakes[11]  # a tensor seen twice has one fake
    assert isinstance(fakes[0], torch.nn.Parameter)
    for real, fake in zip(reals, fakes, strict=True):
        assert (fake.dtype, fake.shape, fake.stride()) == (real.dtype, real.shape, real.stride())
        assert fake.storage_offset() == real.storage_offset()
        assert fake.untyped_storage().nbytes() == real.untyped_storage().nbytes()
        assert fake.device.type == "cpu"
    for i, a in enumerate(reals):
        for j, b in enumerate(reals):
            same = a.untyped_storage()._cdata == b.untyped_storage()._cdata
            fake_same = fakes[i].untyped_storage()._cdata == fakes[j].untyped_storage()._cdata
            assert fake_same == same, (i, j)
