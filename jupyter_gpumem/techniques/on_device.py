"""Techniques that cannot help on a device, and why: plans and searches there leave them out.

Some techniques act only on CUDA. ``tf32`` sets CUDA's TF32 switches (cuBLAS matmuls, cuDNN
convolutions), which nothing else reads: elsewhere a run under it is the fp32 run again, and
any difference between the two step times is noise. Activation offloading moves what the
forward saves from a GPU to host memory, and FSDP2's ``cpu_offload`` the state: on the CPU
both are there already. The paged 8-bit AdamW pages its state between a GPU and host memory;
bitsandbytes runs it as ``adamw-8bit`` on the CPU. And on the CPU, where bf16 autocast always
runs, fp16 autocast keeps the same bytes with loss scaling on top (torch has it there so that
the same code paths can be tested without a GPU, :mod:`.precision`): measuring it would only
repeat bf16 autocast's runs. A plan or a search that leaves any of them out says so once,
with the reason (:func:`left_out_line`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jupyter_gpumem.techniques.offloading import STAYS

__all__ = ["Unhelpful", "left_out_line", "unhelpful", "usable"]

_CUDA_ONLY = {
    ("precision", "tf32"): "it sets CUDA's TF32 switches (cuBLAS matmuls, cuDNN convolutions), "
    "which nothing on the {device} reads: it would run as fp32",
    ("optimizer", "adamw-paged-8bit"): "it pages its state between a GPU and host memory; "
    "on the {device} bitsandbytes runs it as adamw-8bit",
}
_BESIDE_BF16 = {
    ("precision", "fp16-autocast"): "it keeps the bytes bf16-autocast keeps, with loss scaling "
    "on top, and on the {device} bf16-autocast always runs",
}
_ON_A_GPU = {
    "offload": "it moves activations from a GPU to host memory, and on the {device} they are "
    "there already",
    "cpu_offload": "it moves FSDP2's state from a GPU to host memory, and on the {device} it is "
    "there already",
}


@dataclass(frozen=True)
class Unhelpful:
    """A technique left out on a device, and why."""

    technique: str  # as the reasoning names it: "precision tf32", "offload blocks"
    reason: str


def _device_type(device: object) -> str:
    return str(getattr(device, "type", None) or str(device).split(":")[0])


def unhelpful(kind: str, name: str, device: object) -> Unhelpful | None:
    """Why ``kind`` ``name`` (``"precision"``, ``"tf32"``) cannot help on ``device``; None
    where it can."""
    where = _device_type(device)
    template = None
    if where != "cuda":
        template = _CUDA_ONLY.get((kind, name))
    if template is None and where == "cpu":
        template = _BESIDE_BF16.get((kind, name))
    if template is None and where in STAYS:
        template = _ON_A_GPU.get(kind)
    if template is None:
        return None
    technique = kind if kind == name else f"{kind} {name}"
    return Unhelpful(technique, template.format(device=where))


def usable(
    kind: str, names: Sequence[str | None], device: object, left_out: list[Unhelpful]
) -> list[str | None]:
    """``names`` that can help on ``device`` (None, as it is, always can); the others are
    added to ``left_out``."""
    kept: list[str | None] = []
    for name in names:
        found = None if name is None else unhelpful(kind, name, device)
        if found is None:
            kept.append(name)
        elif found not in left_out:
            left_out.append(found)
    return kept


def left_out_line(left_out: Sequence[Unhelpful], device: object) -> str:
    """One sentence naming what was left out on ``device`` (at least one), and why."""
    where = _device_type(device)
    said = "; ".join(f"{u.technique}: {u.reason}" for u in left_out)
    return f"Left out on the {where}, where they cannot help: {said}."
