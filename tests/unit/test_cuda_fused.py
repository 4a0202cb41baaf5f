"""The stand-in device's fused ops: the table is what this torch registers, and each op then
reaches the fake mode whole, one output, as CUDA's kernel makes it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from jupyter_gpumem.tuner.estimation.cuda_fused import CPU_ONLY, FUSED  # noqa: E402


def test_the_table_is_every_op_with_a_cpu_kernel_and_the_composite() -> None:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    found = {
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and has(name, "CPU") and has(name, "CompositeImplicitAutograd")
    }
    assert found - set(CPU_ONLY) <= set(FUSED), found
    assert set(FUSED) <= found | {f for f in FUSED if has(f"aten::{f}", "PrivateUse1")}
