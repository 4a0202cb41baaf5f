"""The largest size whose estimated peak fits a budget, in a handful of estimates."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping

from jupyter_gpumem.units import MOST_BYTES, SIZE_HELP, echoed_kind, format_bytes, parse_size

LARGEST = 1 << 20  # sizes searched without a high bound
MOST_SIZE = 2**31 - 1  # the largest batch size taken, far past any batch a step holds
NOTHING_FITS = 0  # the size found where even the smallest tried is over the budget
PHASE_LINES = True  # guesses from each phase's line; bench/answer_speed.py times the totals' too


def budget_of(budget: int | str) -> int:
    """``budget`` in bytes; the same ValueError, saying what is allowed, wherever one is taken."""
    if isinstance(budget, str):
        try:
            return parse_size(budget)
        except ValueError as exc:
            raise ValueError(f"budget: {exc}") from None
    if isinstance(budget, bool) or not isinstance(budget, int) or not 0 < budget <= MOST_BYTES:
        raise ValueError(
            "budget must be bytes, a whole number greater than zero and at most 2**60 (1 EiB), "
            f"or {SIZE_HELP}; got {echoed_kind(budget)}"
        )
    return budget


def size_of(name: str, value: int | None) -> int | None:
    """``value``, a batch size (None: not given); the same ValueError wherever one is taken."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST_SIZE
    ):
        raise ValueError(
            f"{name} must be a batch size, a whole number from 1 to {MOST_SIZE:,}; "
            f"got {echoed_kind(value)}"
        )
    return value


def sizes_of(low: int, high: int | None) -> tuple[int, int | None]:
    """The bounds of a batch size search, checked as :func:`size_of` checks each."""
    size_of("low", low)
    size_of("high", high)
    if high is not None and high < low:
        raise ValueError(f"high ({high}) must be >= low ({low})")
    return low, high


def largest_fitting(
    peak: Callable[[int], int],
    budget_bytes: int,
    low: int,
    high: int | None,
    what: str,
    progress: Callable[[str], None] | None = None,
    phases: Callable[[int], Mapping[str, int] | None] | None = None,
) -> int:
    """The largest size in [low, high] with ``peak(size) <= budget_bytes``; NOTHING_FITS (0)
    when even ``low`` does not, with a warning that says so: never a size not tried.

    Peaks grow about linearly with the size, so each guess is the line through the nearest
    estimates on both sides (doubling while only one is known), kept strictly inside the
    bracket: a peak that is a line is found in four estimates (``low``, the next, the line's
    crossing and one past it). Where the line keeps missing on one side (a peak that curves,
    as eager attention's does with the sequence), every third guess is the bracket's geometric middle instead.
    ``phases(size)``, where given, is the most held in each phase of an estimated size: the
    peak is the highest of them, so the guess is where the first phase's own line crosses the
    budget (a training step's small batches peak in the optimizer step, which the batch does
    not move, and their line alone would point far past the budget).
    ``what`` names the size in warnings ("batch size"); ``progress`` is told of each estimate
    as it begins ("estimating batch size 2512").
    """
    known: dict[int, int] = {}

    def crossing(n0: int, n1: int) -> int:
        lines = _phase_lines(phases, n0, n1) if phases is not None and PHASE_LINES else []
        rising = [(p0, p1) for p0, p1 in lines if p1 > p0]  # a flat phase never crosses
        if not rising:
            return _crossing(n0, known[n0], n1, known[n1], budget_bytes)
        return min(_crossing(n0, p0, n1, p1, budget_bytes) for p0, p1 in rising)

    def at(n: int) -> int:
        if n not in known:
            if progress is not None:
                progress(f"estimating {what} {n:,}")
            known[n] = peak(n)
        return known[n]

    lo, hi = low, high
    if at(lo) > budget_bytes:
        warnings.warn(
            f"even {what} {low} is estimated at {format_bytes(known[low])}, over the budget of "
            f"{format_bytes(budget_bytes)}",
            stacklevel=4,
        )
        return NOTHING_FITS
    if hi is not None and at(hi) <= budget_bytes:
        return hi
    while hi is None:  # grow past the budget
        if lo >= LARGEST:
            warnings.warn(
                f"{what} {lo} still fits the budget; the search stops there (pass high=)",
                stacklevel=4,
            )
            return lo
        below = sorted(n for n in known if n <= lo)
        guess = 2 * lo
        if len(below) >= 2:
            guess = crossing(below[-2], lo) + 1
        guess = max(lo + 1, min(guess, LARGEST))
        if at(guess) <= budget_bytes:
            lo = guess
        else:
            hi = guess
    same_side = 0  # guesses in a row that moved the same end of the bracket
    last_fit: bool | None = None
    while hi - lo > 1:
        if same_side >= 2:  # halve the bracket's ratio: it may span orders of magnitude
            guess = max(lo + 1, min(math.isqrt(lo * hi), hi - 1))
        else:
            guess = crossing(lo, hi)
            guess = max(lo + 1, min(guess, hi - 1))
        fits = at(guess) <= budget_bytes
        if fits:
            lo = guess
        else:
            hi = guess
        same_side = same_side + 1 if fits == last_fit else 1
        last_fit = fits
    return lo


def _phase_lines(
    phases: Callable[[int], Mapping[str, int] | None], n0: int, n1: int
) -> list[tuple[int, int]]:
    """The peaks at ``n0`` and ``n1`` of each phase both sizes have; none where either has none."""
    at0, at1 = phases(n0), phases(n1)
    if not at0 or not at1:
        return []
    return [(at0[phase], at1[phase]) for phase in at0 if phase in at1]


def _crossing(n0: int, p0: int, n1: int, p1: int, budget: int) -> int:
    """The largest n on the line through (n0, p0) and (n1, p1) at or under ``budget``."""
    if p1 <= p0:
        return n1 * 2
    return n0 + int((budget - p0) * (n1 - n0) // (p1 - p0))
