"""Will it fit? An estimate's peak set against a card's capacity, with a margin we measured.

What the process holds on the card at the peak is the allocator's reserved peak (the
library workspaces included) plus the CUDA context, and on a rank of N over NCCL, NCCL's own
buffers (:mod:`.nccl`). "Fits" means that plus a margin stays
within the card: the margin is ``MARGIN`` of the reserved peak, above the largest error of
the reserved peak measured in ``bench/results/meta_estimates_h100.json`` (3.1%, a ViT-L/16,
the estimate under the measurement). Where it does not fit, the verdict names the
categories that dominate the peak and what helps each (the advice an out-of-memory report
gives, :data:`~jupyter_gpumem.analysis.attribution.ADVICE`; for ``held_before``, what the
process held before the estimate, how to free it or leave it out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jupyter_gpumem.analysis.attribution import ADVICE
from jupyter_gpumem.tuner.estimation.cards import Card
from jupyter_gpumem.tuner.estimation.nccl import NcclShare, describe
from jupyter_gpumem.units import format_bytes

MARGIN = 0.05  # of the predicted reserved peak
_NOT_REMEDIABLE = frozenset({"unattributed", "allocator_slack", "library_workspace"})
_ADVICE = {
    **ADVICE,
    "held_before": (
        "deleting what this process holds (`del x`, then torch.cuda.empty_cache()), or "
        "count_held=False where the model will replace it"
    ),
}


@dataclass(frozen=True)
class Verdict:
    """Whether an estimated peak fits one card, and by how much."""

    card: Card
    reserved_bytes: int  # the allocator's reserved peak on this card
    context_bytes: int | None  # CUDA context and libraries outside the allocator; None: unknown
    margin_bytes: int
    fits: bool
    dominant: tuple[tuple[str, int], ...]  # the largest categories at the peak, largest first
    nccl: NcclShare | None = None  # NCCL's buffers on a rank of N; None: one process

    @property
    def communication_bytes(self) -> int:
        """NCCL's buffers outside the allocator (0 for one process)."""
        return 0 if self.nccl is None else self.nccl.bytes

    @property
    def needed_bytes(self) -> int:
        """Reserved peak, context, NCCL's buffers and margin: what the card must hold."""
        return (
            self.reserved_bytes
            + (self.context_bytes or 0)
            + self.communication_bytes
            + self.margin_bytes
        )

    @property
    def headroom_bytes(self) -> int:
        """Capacity left over (negative: what is missing)."""
        return self.card.total_bytes - self.needed_bytes

    @property
    def remedies(self) -> tuple[str, ...]:
        return tuple(f"{_label(c)}: {_ADVICE[c]}" for c, _ in self.dominant if c in _ADVICE)

    def line(self) -> str:
        """The verdict in one line, the first of an estimate's report."""
        needs = (
            f"needs {format_bytes(self.needed_bytes)} of its {format_bytes(self.card.total_bytes)}"
        )
        if self.fits:
            return (
                f"fits on {self.card.name}: {needs} ({format_bytes(self.headroom_bytes)} to spare)"
            )
        most = " and ".join(f"{_label(c)} ({format_bytes(n)})" for c, n in self.dominant)
        return (
            f"does not fit on {self.card.name}: {needs} ({format_bytes(-self.headroom_bytes)} "
            f"short); most of the peak is {most}"
        )

    def details(self) -> tuple[str, ...]:
        """How the figure is made up, and what to try where it does not fit."""
        parts = [
            f"reserved at the peak {format_bytes(self.reserved_bytes)}",
            "CUDA context and libraries "
            + (format_bytes(self.context_bytes) if self.context_bytes is not None else "not known"),
            *([describe(self.nccl)] if self.nccl is not None else []),
            f"margin {format_bytes(self.margin_bytes)} ({MARGIN:.0%} of the reserved peak)",
        ]
        out = [" + ".join(parts)]
        if not self.fits:
            out.extend(f"try for {r}" for r in self.remedies)
        return tuple(out)


def _label(category: str) -> str:
    return "held before the call" if category == "held_before" else category.replace("_", " ")


def verdict(
    card: Card,
    reserved_bytes: int,
    context_bytes: int | None,
    breakdown: Mapping[str, int] | None,
    nccl: NcclShare | None = None,
) -> Verdict:
    """The verdict of a reserved peak (and its breakdown) on ``card``; ``nccl`` for a rank."""
    margin = int(reserved_bytes * MARGIN)
    need = reserved_bytes + (context_bytes or 0) + (0 if nccl is None else nccl.bytes) + margin
    ranked = sorted(
        ((c, n) for c, n in (breakdown or {}).items() if n > 0 and c not in _NOT_REMEDIABLE),
        key=lambda cn: -cn[1],
    )
    return Verdict(
        card=card,
        reserved_bytes=reserved_bytes,
        context_bytes=context_bytes,
        margin_bytes=margin,
        fits=need <= card.total_bytes,
        dominant=tuple(ranked[:2]),
        nccl=nccl,
    )
