"""Checks the real kernels make that their fake kernels leave out: a fake step fails where a real one does.

torch's meta kernels (read in 2.13, ``torch/_meta_registrations.py``) for ``aten.mm``,
``aten.addmm``, ``aten._addmm_activation``, ``aten.addbmm`` and ``aten.mv`` check shapes but not
dtypes, while the real kernels, on the CPU and on CUDA, refuse operands of two dtypes
(``ADDMM_META`` in ``ATen/native/LinearAlgebra.cpp``: "self and mat2 must have the same dtype",
"mat1 and mat2 must have the same dtype"; ``addmv``'s "input tensors must have the same dtype").
A long batch fed to a float ``nn.Linear`` therefore ran on fake tensors, and its estimate gave
a peak for a step that cannot run. Each check raises :class:`RealStepError` with the real
kernel's words; the estimate refuses with them.
"""

from __future__ import annotations

import functools
from typing import Any


class RealStepError(RuntimeError):
    """What the real kernel raises on these operands, and the fake kernel does not."""


def check_operands(torch: Any, func: Any, args: tuple[Any, ...]) -> None:
    """RealStepError where the real kernel of ``func`` refuses the dtypes of ``args``."""
    names = _checked(torch).get(func)
    if names is None:
        return
    given = [(n, a) for n, a in zip(names, args, strict=False) if isinstance(a, torch.Tensor)]
    if len(given) < len(names):
        return
    dtypes = {a.dtype for _, a in given}
    if len(dtypes) > 1:
        got = ", ".join(f"{n} {_dtype(a.dtype)}" for n, a in given)
        raise RealStepError(
            f"{func.overloadpacket.__name__}'s operands must have the same dtype, but got {got}"
        )


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def _checked(torch: Any) -> dict[Any, tuple[str, ...]]:
    """The ops checked, each with its operands' names, in the order its real kernel takes them."""
    aten = torch.ops.aten
    return {
        aten.mm.default: ("mat1", "mat2"),
        aten.addmm.default: ("self", "mat1", "mat2"),
        aten._addmm_activation.default: ("self", "mat1", "mat2"),
        aten.addbmm.default: ("self", "batch1", "batch2"),
        aten.mv.default: ("self", "vec"),
    }
