"""bitsandbytes on fake tensors: 4-bit weights (QLoRA) as stored, what their matmul allocates unseen, 8-bit optimizers.

A ``Params4bit`` cannot wrap a fake tensor, so its fake is a plain fake parameter of the packed
layout that carries a ``quant_state`` of fakes; ``Linear4bit`` reads it as it reads its own.
A weight quantized already is faked storage for storage. A weight on the meta device was never
quantized (``replace_with_bnb_linear`` under ``init_empty_weights``, as transformers loads a
4-bit model): it gets the layout that ``bitsandbytes.functional.quantize_4bit`` gives it on
CUDA, the packed weight, the absmax per block (8-bit with its own absmax, code and offset under
``compress_statistics``) and the 16-value code.

bitsandbytes' 4-bit matmul (``bitsandbytes::gemm_4bit``, 0.50 and later) either runs its own
kernel or, past 1536 rows of input and wherever its per-card heuristic prefers, dequantizes the
weight into the input's dtype and calls ``F.linear``, all inside one op whose fake kernel
allocates only the output. :func:`hidden_buffers` makes the buffers that op takes for itself.

An 8-bit optimizer steps fake parameters as it steps real ones once its quantization maps (a
few hundred floats, made from values) are made outside the fake mode, in a dict of its own;
one that a configuration builds inside the fake mode makes them outside it too
(:func:`maps_made_for_real`).

A paged 8-bit optimizer keeps the state of each tensor of 100,000 elements or more in CUDA
unified memory, outside PyTorch's allocator, where the measured peak does not see it. Its copy
steps as its unpaged twin and names those buffers (:func:`paged_state`): the fake run leaves them
out of the allocator's figures, and the estimate says how many bytes page instead.

Known limitations:
- For 5 to 1536 rows, the kernel choice is bitsandbytes' heuristic for the GPU present; a
  named card that is not present uses the present card's choice, and without a GPU the
  estimate says it cannot tell.
- 8-bit weights (``Int8Params``) and 4-bit weights across ranks are not faked.
- A paged buffer takes device memory while there is room for it; the estimate does not say
  when the driver would move it to the host.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.units import format_bytes

PAGED_FROM = 100_000  # bitsandbytes pages the state of tensors of this many elements and more
PAGED = "_gpumem_paged_state"  # where a paged optimizer's copy keeps its paged buffers
_FALLBACK_ROWS = 1536  # bitsandbytes dequantizes and calls F.linear past this many rows (CUDA)
_CUSTOM_ROWS = 4  # and always runs its own kernel up to this many
_GEMM = "bitsandbytes::gemm_4bit"


def is_4bit(t: Any) -> bool:
    """Whether ``t`` is a bitsandbytes ``Params4bit`` (bitsandbytes is not imported for it)."""
    cls = type(t)
    return cls.__name__ == "Params4bit" and cls.__module__.startswith("bitsandbytes")


def fake_4bit(torch: Any, faker: Any, p: Any) -> Any:
    """A fake parameter of ``p``'s stored layout carrying a ``quant_state`` of fakes.

    ``faker`` is the run's :class:`~jupyter_gpumem.tuner.estimation.fake_objects.Faker`.
    """
    from bitsandbytes.functional import QuantState

    state = p.quant_state
    if p.bnb_quantized and state is not None:
        faked = faker.fake_plain(p, "parameters")
        faked.quant_state = _faked_state(faker, state)
        return faked
    if not p.is_meta:
        raise Unfakeable(
            "a 4-bit weight that is not quantized yet (move the model to the GPU first, or "
            "build it on the meta device)"
        )
    n = p.numel()
    blocks = -(n // -p.blocksize)
    storage = p.quant_storage

    def made(shape: tuple[int, ...], dtype: Any) -> Any:
        return faker.fresh(shape, dtype, "parameters")

    # in the order quantize_4bit makes them on CUDA, beside the weight as loaded and the
    # float32 absmax it then quantizes (twice, shifted by its mean), which it lets go
    script: list[tuple[str, Any]] = [("alloc", n * p.element_size())]
    if p.compress_statistics:
        packed = made(((n + 1) // (storage.itemsize * 2), 1), storage)
        code = made((16,), torch.float32)
        offset = made((), torch.float32)
        nested_absmax = made((-(blocks // -256),), torch.float32)
        absmax = made((blocks,), torch.uint8)
        nested = QuantState(
            absmax=nested_absmax,
            code=made((256,), torch.float32),
            blocksize=256,
            dtype=torch.float32,
        )
        script += [("alloc", blocks * 4), ("place", packed), ("place", code), ("place", offset)]
        script += [("alloc", blocks * 4), ("place", nested_absmax), ("place", absmax)]
        script += [("place", nested.code), ("free", 2), ("free", 1), ("free", 0)]
    else:
        absmax = made((blocks,), torch.float32)
        packed = made(((n + 1) // (storage.itemsize * 2), 1), storage)
        code = made((16,), torch.float32)
        nested, offset = None, None
        script += [("place", absmax), ("place", packed), ("place", code), ("free", 0)]
    faker.log.loaded(script)
    packed = torch.nn.Parameter(packed, requires_grad=False)
    packed.quant_state = QuantState(
        absmax=absmax,
        shape=p.shape,
        dtype=p.dtype,
        blocksize=p.blocksize,
        code=code,
        quant_type=p.quant_type,
        offset=offset,
        state2=nested,
    )
    return packed


def _faked_state(faker: Any, state: Any) -> Any:
    made = copy.copy(state)
    for key in ("absmax", "code", "offset"):
        value = getattr(state, key, None)
        if value is not None:
            setattr(made, key, faker.fake_plain(value, "parameters"))
    if getattr(state, "state2", None) is not None:
        made.state2 = _faked_state(faker, state.state2)
    return made


def hidden_buffers(
    torch: Any, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[Any]:
    """The buffers ``func`` allocates for itself on CUDA, made (fake) in the order it makes them."""
    if getattr(func, "namespace", None) != "bitsandbytes" or func._schema.name != _GEMM:
        return []
    names = ("A", "B", "shapeB", "absmax", "blocksize", "quant_type", "bias", "absmax_8bit")
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    a, shape_b, blocksize = given["A"], given["shapeB"], given["blocksize"]
    if a.device.type != "cuda":
        raise Unfakeable(
            f"bitsandbytes' 4-bit matmul is modelled on CUDA, where QLoRA trains, not on "
            f"{a.device.type}; estimate with device='cuda'"
        )
    k = a.shape[-1]
    rows = a.numel() // k if k else 0
    if rows > _FALLBACK_ROWS or k % blocksize:
        dequantizes = True
    elif rows <= _CUSTOM_ROWS:
        dequantizes = False
    else:
        dequantizes = not _custom_kernel_here(torch, a, rows, shape_b[0], k)
    if not dequantizes:
        copied = not a.is_contiguous()  # its kernel reads A row-major
        return [torch.empty_like(a, memory_format=torch.contiguous_format)] if copied else []
    made = []
    absmax_8bit = given.get("absmax_8bit")
    if absmax_8bit is not None:  # the nested absmax, dequantized, then offset
        made.append(torch.empty_like(absmax_8bit, dtype=torch.float32))
        made.append(torch.empty_like(absmax_8bit, dtype=torch.float32))
    made.append(torch.empty(tuple(shape_b), dtype=a.dtype, device=a.device))
    return made


def _custom_kernel_here(torch: Any, a: Any, rows: int, n: int, k: int) -> bool:
    """bitsandbytes' own choice on the GPU present, for ``rows`` in its heuristic's range."""
    index = a.device.index or 0
    choose = None
    if torch.cuda.is_available() and index < torch.cuda.device_count():
        from bitsandbytes.backends.cuda import ops

        choose = getattr(ops, "_gemm_4bit_use_custom_fn", None)
    if choose is None:
        raise Unfakeable(
            f"bitsandbytes chooses its 4-bit matmul for {rows} rows by the GPU it runs on, and "
            "no such GPU is present; estimate with more than 1536 tokens per step, or on the GPU"
        )
    return bool(choose(index, a.dtype, rows, n, k))


def ready_to_step(optimizer: Any) -> None:
    """A bitsandbytes optimizer's copy made able to step fake parameters (others untouched)."""
    if not hasattr(optimizer, "name2qmap") or not hasattr(optimizer, "fill_qmap"):
        return
    if getattr(optimizer, "is_paged", False):
        _unpaged(optimizer)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    optimizer.name2qmap = dict(optimizer.name2qmap)  # the user's optimizer keeps its own
    if "dynamic" not in optimizer.name2qmap:
        with unset_fake_temporarily():
            optimizer.fill_qmap()


def _unpaged(optimizer: Any) -> None:
    """A paged optimizer's copy made to step as its unpaged twin, keeping the state buffers
    bitsandbytes would page (``get_state_buffer``'s rule) in :data:`PAGED`."""
    plain = optimizer.get_state_buffer
    paged: list[Any] = []

    def get_state_buffer(p: Any, *args: Any, **kwargs: Any) -> Any:
        buffer = plain(p, *args, **kwargs)
        if pages(p):
            paged.append(buffer)
        return buffer

    optimizer.is_paged = False  # no page manager, no synchronize: the fakes are in the allocator
    optimizer.get_state_buffer = get_state_buffer
    setattr(optimizer, PAGED, paged)


def pages(p: Any) -> bool:
    """Whether bitsandbytes pages the state of ``p``: on a GPU, from 100,000 elements."""
    return bool(p.device.type != "cpu" and p.numel() >= PAGED_FROM)


def paged_state(optimizer: Any) -> list[Any]:
    """The state buffers a paged optimizer's copy keeps outside PyTorch's allocator."""
    return list(getattr(optimizer, PAGED, ()))


def paged_note(nbytes: int) -> str:
    """What an estimate says of a paged optimizer's state."""
    return (
        f"{format_bytes(nbytes)} of the optimizer's state pages through CUDA unified memory, "
        "outside PyTorch's allocator, so it is not in this peak (nor in the measured one); it "
        "takes device memory while there is room and moves to the host when there is not"
    )


BNB_OPTIMIZERS = ("adamw-8bit", "adamw-paged-8bit")  # the Config names bitsandbytes builds


@contextmanager
def maps_made_for_real(name: str | None) -> Iterator[None]:
    """While it lasts, a bitsandbytes 8-bit optimizer built under the fake mode makes its
    quantization maps from real values (they are computed with ``.tolist()``)."""
    if name not in BNB_OPTIMIZERS and "bitsandbytes.optim.optimizer" not in sys.modules:
        yield
        return
    from bitsandbytes.optim.optimizer import Optimizer8bit
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    original = Optimizer8bit.fill_qmap

    def fill_qmap(self: Any) -> None:
        with unset_fake_temporarily():
            original(self)

    Optimizer8bit.fill_qmap = fill_qmap  # type: ignore[method-assign]
    try:
        yield
    finally:
        Optimizer8bit.fill_qmap = original  # type: ignore[method-assign]
