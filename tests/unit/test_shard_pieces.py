"""FSDP2's pieces made on demand are torch.chunk's pieces: same sizes, strides and offsets."""

from __future__ import annotations

import pytest
import torch

from jupyter_gpumem.tuner.estimation.shard_pieces import Pieces, pieces, pieces_on_demand


def chunk_with_empty(tensor: torch.Tensor, count: int, dim: int) -> list[torch.Tensor]:
    """torch's own: torch.chunk's pieces, empty ones appended up to ``count``."""
    chunks = list(torch.chunk(tensor, count, dim=dim))
    while len(chunks) < count:
        chunks.append(chunks[0].new_empty(0))
    return chunks


def layout(t: torch.Tensor) -> tuple[object, ...]:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.is_contiguous())


@pytest.mark.parametrize("rows", [1, 5, 63, 64, 65, 1001])
@pytest.mark.parametrize("count", [1, 2, 7, 8, 64, 1024])
@pytest.mark.parametrize("dim", [0, 1])
def test_every_piece_has_torch_chunks_layout(rows: int, count: int, dim: int) -> None:
    shape = (rows, 3) if dim == 0 else (3, rows)
    tensor = torch.arange(3 * rows, dtype=torch.float32).reshape(shape)
    expected = chunk_with_empty(tensor, count, dim)
    made = Pieces(tensor, count, dim)
    assert len(made) == len(expected) == count
    for i, want in enumerate(expected):
        assert layout(made[i]) == layout(want), i
        assert torch.equal(made[i], want)
        if want.numel():
            assert made[i].untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    assert [layout(p) for p in made[-3:]] == [layout(p) for p in expected[-3:]]
    with pytest.raises(IndexError):
        made[count]


def test_what_is_unusual_goes_to_torchs_own() -> None:
    lazily = pieces(chunk_with_empty)
    assert isinstance(lazily(torch.zeros(4, 2), 8, 0), Pieces)
    for odd in (torch.zeros(0, 2), torch.tensor(1.0)):
        if odd.dim() == 0:
            with pytest.raises(RuntimeError):
                lazily(odd, 2, 0)  # torch's own refuses it, and so does this
        else:
            got = lazily(odd, 3, 0)
            assert not isinstance(got, Pieces)
            assert [layout(p) for p in got] == [layout(p) for p in chunk_with_empty(odd, 3, 0)]


def test_fsdp2_takes_the_pieces_for_the_block_only() -> None:
    fsdp_param = pytest.importorskip("torch.distributed.fsdp._fully_shard._fsdp_param")
    before = fsdp_param._chunk_with_empty
    with pieces_on_demand():
        assert isinstance(fsdp_param._chunk_with_empty(torch.zeros(10, 2), 4, 0), Pieces)
    assert fsdp_param._chunk_with_empty is before
    with pytest.raises(KeyError), pieces_on_demand():
        raise KeyError("a failure in the block")
    assert fsdp_param._chunk_with_empty is before
