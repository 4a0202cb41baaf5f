"""What a spawned rank receives: objects by value, each storage copied once, the kernel's untouched."""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cloudpickle")

from torch import nn  # noqa: E402

from jupyter_gpumem.tuner.rank_payload import ALIGN, pack, unpack  # noqa: E402


def test_objects_come_back_with_their_own_storages_shared_as_before() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model[1].weight = model[0].weight  # tied
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    whole = torch.arange(12, dtype=torch.float64)
    view = whole[2:5]
    half = torch.ones(3, dtype=torch.bfloat16)
    scale = 3.0
    before = [t.clone() for t in (*model.parameters(), whole, half)]
    pointers = [t.data_ptr() for t in (*model.parameters(), whole, half)]

    payload = pack((model, opt, whole, view, half, lambda x: x * scale))
    # five storages: the tied weight once, two biases, the double one (its view too), the bf16 one
    assert len(payload.places) == 5
    assert all(offset % ALIGN == 0 for offset, _, _ in payload.places)
    assert payload.shared.is_shared()
    m, o, w, v, h, f = unpack(payload, torch.device("cpu"))

    assert m[1].weight is m[0].weight and o.param_groups[0]["params"][0] is m[0].weight
    assert w.dtype == torch.float64 and h.dtype == torch.bfloat16
    assert v.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert torch.equal(v, w[2:5]) and torch.equal(h, half) and f(2.0) == 6.0
    for mine, theirs in zip(m.parameters(), model.parameters(), strict=True):
        assert torch.equal(mine, theirs) and mine.data_ptr() != theirs.data_ptr()
        assert type(mine) is nn.Parameter
    with torch.no_grad():
        m[0].weight.add_(1)  # the copy is the rank's own
    after = [*model.parameters(), whole, half]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert [t.data_ptr() for t in after] == pointers
    assert not any(t.is_shared() for t in after)


def test_what_cannot_be_pickled_is_named() -> None:
    import threading

    lock = threading.Lock()
    with pytest.raises((TypeError, pickle.PicklingError), match="lock"):
        pack(lambda: lock)


def test_a_storage_lives_only_as_long_as_what_holds_it() -> None:
    """A rank frees the parameters its strategy replaces (FSDP2): nothing of the unpacking may
    keep their storages, not even until the next collection."""
    import gc

    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    payload = pack(model)
    gc.disable()
    try:
        copy = unpack(payload, torch.device("cpu"))
        held = [p.untyped_storage()._weak_ref() for p in copy[0].parameters()]
        copy[0].weight = nn.Parameter(torch.zeros(1))  # replaced, as fully_shard replaces it
        copy[0].bias = None
        assert all(torch.UntypedStorage._expired(ref) for ref in held)
    finally:
        gc.enable()
