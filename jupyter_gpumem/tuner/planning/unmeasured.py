"""A plan for a model that holds no weights: every candidate estimated on fake tensors.

A model built on the meta device runs no real step, so nothing is measured and no step time is
known. Each precision and optimizer allowed is estimated as it is; where none fits, with the
model's first ``k`` blocks checkpointed, ``k`` found by bisection between none and all of them.
The plan changes the least that fits: fewer checkpointed blocks first, then fewer changes of
precision and optimizer, then the order in which the planner lists them.

Known limitations:
- Blocks are checkpointed from the first on; alike blocks free alike bytes, so which ``k``
  matters little for memory, and step times are not weighed.
- The plan is verified once the model has weights: ``plan.verify()`` after loading them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.predict import estimate_workload
from jupyter_gpumem.units import format_bytes

NO_WEIGHTS = (
    "The model holds no weights (meta device): each candidate is estimated on fake tensors, "
    "none is measured, and step times are unknown, so the plan changes the least that fits."
)
NOT_VERIFIED = (
    "Not verified by a run: the model holds no weights. Load them and call plan.verify()."
)


@dataclass(frozen=True)
class Candidate:
    """One estimated configuration: its first ``blocks`` checkpointed."""

    precision: str | None
    optimizer: str | None
    blocks: int
    peak_bytes: int | None  # None: not estimated
    reason: str | None = None

    def config(self, names: Sequence[str]) -> Config:
        return Config(
            checkpoint=tuple(names[: self.blocks]) or None,
            precision=self.precision,
            optimizer=self.optimizer,
        )


def cheapest_fit(
    workload: Any,
    limit: int,
    precisions: Sequence[str | None],
    optimizers: Sequence[str | None],
    names: Sequence[str],
    progress: Callable[[str], None],
    *,
    count_held: bool = True,
) -> tuple[Candidate | None, list[Candidate]]:
    """The candidate that changes the least and is estimated within ``limit``, and every one
    tried; ``count_held`` as in :func:`~jupyter_gpumem.tuner.estimation.predict.estimate_workload`."""
    tried: list[Candidate] = []

    def estimate(p: str | None, o: str | None, k: int) -> Candidate:
        config = Candidate(p, o, k, None).config(names)
        progress(f"estimating {config}")
        found = estimate_workload(workload, config, count_held=count_held)
        made = Candidate(p, o, k, found.peak_bytes, found.reason)
        tried.append(made)
        return made

    def fits(c: Candidate) -> bool:
        return c.peak_bytes is not None and c.peak_bytes <= limit

    # fewer changes first, each list's own order after that
    pairs = sorted(
        ((p, o) for p in precisions for o in optimizers),
        key=lambda pair: (pair[0] is not None) + (pair[1] is not None),
    )
    plain = [estimate(p, o, 0) for p, o in pairs]
    fitting = [c for c in plain if fits(c)]
    if fitting or not names:
        return (fitting[0] if fitting else None), tried
    best: Candidate | None = None
    for c in plain:
        if c.peak_bytes is None:
            continue  # what cannot be estimated as it is is not estimated checkpointed either
        found = estimate(c.precision, c.optimizer, len(names))
        if not fits(found):
            continue
        low = 0  # the most blocks known not to fit; found fits
        while found.blocks - low > 1 and (best is None or low + 1 < best.blocks):
            mid = estimate(c.precision, c.optimizer, (low + found.blocks) // 2)
            if fits(mid):
                found = mid
            else:
                low = mid.blocks
        if best is None or found.blocks < best.blocks:
            best = found
    return best, tried


def candidate_lines(tried: Sequence[Candidate], names: Sequence[str], limit: int) -> list[str]:
    """One line per candidate estimated, in the order tried."""
    lines = []
    for c in tried:
        what = str(c.config(names))
        if c.blocks:
            what += f" ({c.blocks} of {len(names)} blocks)"
        if c.peak_bytes is None:
            lines.append(f"{what}: not estimated, {c.reason}.")
        else:
            verdict = "fits" if c.peak_bytes <= limit else "over"
            lines.append(f"{what}: estimated {format_bytes(c.peak_bytes)}, {verdict}.")
    return lines
