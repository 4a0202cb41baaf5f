"""FSDP2's pieces of a parameter, made only for the ranks that are asked about.

``fully_shard`` cuts every parameter into ``world_size`` pieces (``torch.chunk``, empty pieces
appended) and keeps one rank's piece and the first piece's size. On fake tensors each piece is a
dispatch, so a 70B model over 1,024 ranks made about 1.5 million of them per rank played, nearly
all thrown away. While a rank is played, :func:`pieces_on_demand` hands FSDP2 a sequence that
narrows a piece out of the parameter when it is indexed: the same views (same sizes, strides
and offsets) as ``torch.chunk``'s, no allocation either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any


class Pieces(Sequence[Any]):
    """``torch.chunk(tensor, count, dim)`` padded with empty tensors to ``count``, lazily."""

    def __init__(self, tensor: Any, count: int, dim: int) -> None:
        self._tensor = tensor
        self._count = count
        self._dim = dim
        self._rows = tensor.size(dim)
        self._piece = -(-self._rows // count)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(f"piece {index} of {self._count}")
        start = index * self._piece
        if start < self._rows:
            return self._tensor.narrow(self._dim, start, min(self._piece, self._rows - start))
        return self._tensor.new_empty(0)


def pieces(chunk_with_empty: Callable[..., list[Any]]) -> Callable[..., Sequence[Any]]:
    """``chunk_with_empty`` where its pieces can be made lazily; itself for what is unusual."""

    def lazily(tensor: Any, num_chunks: int, dim: int) -> Sequence[Any]:
        if tensor.dim() == 0 or tensor.size(dim) == 0 or num_chunks < 1:
            return chunk_with_empty(tensor, num_chunks, dim)
        return Pieces(tensor, num_chunks, dim)

    return lazily


@contextmanager
def pieces_on_demand() -> Iterator[None]:
    """FSDP2 in this process takes its pieces from :class:`Pieces`, for the block."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param
    except ImportError:  # no FSDP2 in this torch: nothing to change
        yield
        return
    original = getattr(_fsdp_param, "_chunk_with_empty", None)
    if original is None:
        yield
        return
    _fsdp_param._chunk_with_empty = pieces(original)  # type: ignore[assignment]  # a Sequence serves
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original
