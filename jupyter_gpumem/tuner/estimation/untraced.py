"""Libraries' choices made as in the real step, where they take fake tensors for tracing.

transformers builds no attention mask for SDPA when it can pass ``is_causal=True`` instead,
unless it is tracing a graph, and it counts a fake tensor as tracing: on fake tensors it made a
mask the real step does without, and SDPA picked another kernel (memory-efficient attention with
keys and values repeated per head, where the real float32 step runs the math kernel on grouped
ones, or flash without a mask in bf16). A fake run is no trace; two decisions are made here as
the real step makes them:

- position ids that the model made itself (an ``arange``) hold one sequence per row, so they
  call for no packed-sequence mask;
- the causal mask is skipped for a query as long as its keys, or of one token, without padding,
  whatever the fake offset of the cache (and, for a prompt made without padding, whatever its
  fake attention mask);
- a padding mask known to hold only ones (made by ``torch.ones`` in the model, as BART's decoder
  makes one) is no padding: the causal and the bidirectional mask are skipped as without one.

Known limitations:
- Decisions that read the values of the batch are left to transformers, which takes the masked
  path: an ``attention_mask`` without padding, and ``position_ids`` given in the batch (packed
  sequences or not).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from jupyter_gpumem.tuner.estimation.storage_log import fake_class


@contextmanager
def untraced(
    batch_storages: Callable[[], set[int]],
    *,
    unpadded: bool = False,
    ones: Callable[[Any], bool] | None = None,
) -> Iterator[None]:
    """transformers' mask decisions as in the real step, for the duration of a fake run.

    ``batch_storages()`` gives the storages of the user's batch (``_cdata``): their values are
    the user's, unknown here, so decisions on them and their views stay transformers' own.
    With ``unpadded``, the run's attention masks are known to hold no padding (a prompt made
    for the run): a fake padding mask decides as no padding does; so does one that
    ``ones(mask)`` knows to hold only ones (:func:`~.known_values.known_values`).
    """
    masking = sys.modules.get("transformers.masking_utils")  # never imported for this
    fake: Any = fake_class()
    with ExitStack() as stack:
        if masking is not None:

            def unpacked(original: Callable[..., Any], given: dict[str, Any]) -> Any:
                ids = given["position_ids"]
                if isinstance(ids, fake) and ids.untyped_storage()._cdata not in batch_storages():
                    return None  # the model's own positions: one sequence per row
                return original(**given)

            def no_padding(mask: Any) -> bool:
                return (unpadded and isinstance(mask, fake)) or (
                    ones is not None and mask is not None and ones(mask)
                )

            def causal(original: Callable[..., Any], given: dict[str, Any]) -> Any:
                if no_padding(given["padding_mask"]):
                    given["padding_mask"] = None  # all ones: the same decision as none
                if (
                    given["padding_mask"] is None
                    and isinstance(given["q_offset"], fake)
                    and (given["q_length"] == 1 or given["kv_length"] == given["q_length"])
                ):
                    given["q_offset"] = 0  # read only where these lengths never lead
                return original(**given)

            packed = "find_packed_sequence_indices"
            stack.enter_context(_wrapped(masking, packed, {"position_ids"}, unpacked))
            reads = {"padding_mask", "q_length", "kv_length", "q_offset"}
            stack.enter_context(_wrapped(masking, "_ignore_causal_mask_sdpa", reads, causal))
            if ones is not None:

                def bidirectional(original: Callable[..., Any], given: dict[str, Any]) -> Any:
                    if given["padding_mask"] is not None and ones(given["padding_mask"]):
                        given["padding_mask"] = None
                    return original(**given)

                skip = "_ignore_bidirectional_mask_sdpa"
                stack.enter_context(_wrapped(masking, skip, {"padding_mask"}, bidirectional))
        yield


@contextmanager
def _wrapped(
    module: Any,
    name: str,
    reads: set[str],
    decide: Callable[[Callable[..., Any], dict[str, Any]], Any],
) -> Iterator[None]:
    """``module.name`` replaced by ``decide(original, arguments)`` while the context lasts,
    where its signature names what ``decide`` reads (another transformers: left alone)."""
    original = getattr(module, name, None)
    params = inspect.signature(original).parameters if callable(original) else {}
    plain = all(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
    if original is None or not plain or not reads <= params.keys():
        yield
        return
    signature = inspect.signature(original)

    def replacement(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return decide(original, dict(bound.arguments))

    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)
