"""What every family of the model zoo shares: the built record and the sizes.

``"tiny"`` builds in seconds on a CPU (CI); ``"bench"`` makes hundreds of MB to a few GB on a
GPU. Language batches are (batch, tokens) of token ids; image batches (batch, side).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SIZES = ("tiny", "bench")


@dataclass(frozen=True)
class Built:
    """A model on a device with what one step needs."""

    model: Any
    batch: Any
    loss: Callable[[Any, Any], Any]  # loss(model, batch): the scalar loss, or the outputs
    make_batch: Callable[[int], Any]  # make_batch(n): a batch of n samples on the same device


# (batch, tokens) of a language-model batch; widths of a decoder
TOKENS = {"tiny": (2, 32), "bench": (4, 512)}
LM = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),
    "bench": dict(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    ),
}
IMAGES = {"tiny": (2, 32), "bench": (32, 224)}  # (batch, side)


def ids(size: str, vocab: int, n: int | None = None) -> Any:
    import torch

    batch, tokens = TOKENS[size]
    return torch.randint(1, vocab, (n or batch, tokens))


def lm_loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


def lm(size: str, model: Any, vocab: int) -> Built:
    return Built(model, ids(size, vocab), lm_loss, lambda n: ids(size, vocab, n))
