"""The largest size whose estimated peak fits a budget, in a handful of estimates."""

from __future__ import annotations

import warnings
from collections.abc import Callable

from jupyter_gpumem.units import format_bytes, parse_size

LARGEST = 1 << 20  # sizes searched without a high bound


def budget_of(budget: int | str) -> int:
    """``budget`` in bytes; ValueError saying what is allowed."""
    try:
        found = parse_size(budget) if isinstance(budget, str) else budget
    except ValueError as exc:
        raise ValueError(f"budget: {exc}") from None
    if isinstance(found, bool) or not isinstance(found, int) or found <= 0:
        raise ValueError(
            f"budget must be a positive number of bytes or a size like '20GiB', got {budget!r}"
        )
    return found


def largest_fitting(
    peak: Callable[[int], int], budget_bytes: int, low: int, high: int | None, what: str
) -> int:
    """The largest size in [low, high] with ``peak(size) <= budget_bytes``; low - 1 when none.

    Peaks grow about linearly with the size, so each guess is the line through the nearest
    estimates on both sides (doubling while none is above), kept strictly inside the bracket.
    ``what`` names the size in warnings ("batch size").
    """
    known: dict[int, int] = {}

    def at(n: int) -> int:
        if n not in known:
            known[n] = peak(n)
        return known[n]

    lo, hi = low, high
    if at(lo) > budget_bytes:
        warnings.warn(
            f"even {what} {low} is estimated at {format_bytes(known[low])}, over the budget of "
            f"{format_bytes(budget_bytes)}",
            stacklevel=4,
        )
        return low - 1
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
            guess = _crossing(below[-2], at(below[-2]), lo, at(lo), budget_bytes) + 1
        guess = max(lo + 1, min(guess, 8 * lo))
        if at(guess) <= budget_bytes:
            lo = guess
        else:
            hi = guess
    while hi - lo > 1:
        guess = _crossing(lo, at(lo), hi, at(hi), budget_bytes)
        guess = max(lo + 1, min(guess, hi - 1))
        if at(guess) <= budget_bytes:
            lo = guess
        else:
            hi = guess
    return lo


def _crossing(n0: int, p0: int, n1: int, p1: int, budget: int) -> int:
    """The largest n on the line through (n0, p0) and (n1, p1) at or under ``budget``."""
    if p1 <= p0:
        return n1 * 2
    return n0 + int((budget - p0) * (n1 - n0) // (p1 - p0))
