"""Fit to budget: pick the measured configuration that fits a memory budget at the least step time.

Pure: it reads plain records (anything with ``label``, ``status``, ``peak_allocated_bytes`` and
``step_s``, such as :class:`jupyter_gpumem.tuner.trial.TrialResult`), so it is tested without torch.

How it chooses, and why the greedy ratio only explains:

1. Only candidates that ran to the end (status ``"ok"``) and have a peak and a step time count;
   out-of-memory and failed trials are named and left out.
2. If the baseline fits, it is chosen: nothing needs to change.
3. Otherwise the candidates are ranked greedily by bytes saved per millisecond of step time lost,
   ``(baseline_peak - peak) / max(step - baseline_step, epsilon)``; a candidate that is faster than
   the baseline ranks first. The reasoning walks this ranking to the first one that fits.
4. The chosen configuration is the fitting candidate with the least step time. The greedy ratio
   can disagree with it: a candidate that saves much memory for a moderate cost has a better
   ratio than one that saves just enough for a small cost, yet when both fit, the second is
   cheaper. Since the goal is "fits, at the least step-time cost" and every candidate was
   measured, the least step time decides; the reasoning says when the two differ.
5. If none fits, nothing is chosen and the lowest measured peak is named.

The chosen configuration's step-time change is written as the tuner's table writes it
(:mod:`jupyter_gpumem.tuner.step_change`): "within noise" where the records' timed steps
(``step_spread_s``, where they have it) spread as far as the change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from jupyter_gpumem.tuner.step_change import step_change
from jupyter_gpumem.units import format_bytes, format_seconds

EPSILON_S = 1e-6  # a step-time cost below a microsecond counts as free in the ratio


class Candidate(Protocol):
    """What fit_to_budget reads from a trial result."""

    @property
    def label(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def peak_allocated_bytes(self) -> int | None: ...
    @property
    def step_s(self) -> float | None: ...


@dataclass(frozen=True)
class FitChoice:
    """The configuration chosen for a budget, and how it was chosen."""

    chosen: str | None  # label of the chosen configuration; None when nothing fits
    fits: bool
    reasoning: tuple[str, ...]
    ranking: tuple[str, ...] = ()  # labels in greedy order (bytes saved per ms lost)


def fit_to_budget(
    results: Sequence[Candidate], budget_bytes: int, baseline: Candidate | None = None
) -> FitChoice:
    """The fitting configuration with the least step time; ``baseline`` defaults to ``results[0]``."""
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be a positive number of bytes, got {budget_bytes}")
    if baseline is None:
        if not results:
            raise ValueError("fit_to_budget needs at least one result (the baseline first)")
        baseline = results[0]
    budget = format_bytes(budget_bytes)
    lines = [f"Budget: {budget}."]
    measured: list[Candidate] = []
    for r in results:
        if _measured(r):
            measured.append(r)
        else:
            lines.append(f"{r.label}: left out, {_why_unmeasured(r)}.")

    if _measured(baseline) and _fits(baseline, budget_bytes):
        lines.append(
            f"The baseline{_named(baseline)} fits: peak {format_bytes(baseline.peak_allocated_bytes)} "
            f"<= {budget} at {format_seconds(baseline.step_s)} per step, so nothing needs to change."
        )
        return FitChoice(baseline.label, True, tuple(lines), (baseline.label,))

    others = [r for r in measured if r is not baseline and r.label != baseline.label]
    if _measured(baseline):
        lines.append(
            f"The baseline{_named(baseline)} does not fit: peak "
            f"{format_bytes(baseline.peak_allocated_bytes)}, "
            f"{format_bytes(_over(baseline, budget_bytes))} over, at "
            f"{format_seconds(baseline.step_s)} per step."
        )
        ranked = sorted(others, key=lambda r: _rank_key(r, baseline))
        lines.append("Ranked by memory saved per ms of step time lost:")
        lines.extend(
            f"  {i}. {_describe(r, baseline, budget_bytes)}" for i, r in enumerate(ranked, 1)
        )
    else:
        ranked = sorted(others, key=lambda r: (_step(r), _peak(r)))
        lines.append(
            f"The baseline{_named(baseline)} has no measurement ({_why_unmeasured(baseline)}), "
            "so savings cannot be compared with it; the candidates are ranked by step time:"
        )
        lines.extend(
            f"  {i}. {r.label}: peak {format_bytes(r.peak_allocated_bytes)}, "
            f"{format_seconds(r.step_s)} per step, {_fit_words(r, budget_bytes)}"
            for i, r in enumerate(ranked, 1)
        )
    ranking = tuple(r.label for r in ranked)

    fitting = [r for r in ranked if _fits(r, budget_bytes)]
    if not fitting:
        if not measured:
            lines.append(f"Nothing was measured, so no configuration is known to fit {budget}.")
            return FitChoice(None, False, tuple(lines), ranking)
        lowest = min(measured, key=lambda r: (_peak(r), _step(r)))
        lines.append(
            f"No measured configuration fits {budget}. The lowest peak is {lowest.label}: "
            f"{format_bytes(lowest.peak_allocated_bytes)}, "
            f"{format_bytes(_over(lowest, budget_bytes))} over the budget; combine techniques or "
            "shrink the batch."
        )
        return FitChoice(None, False, tuple(lines), ranking)

    first = fitting[0]
    best = min(fitting, key=lambda r: (_step(r), _peak(r)))  # min() keeps the first of ties
    lines.append(f"First in that order to fit: {first.label}.")
    if best is not first:
        lines.append(
            f"{best.label} fits as well at a lower step time ({format_seconds(best.step_s)} "
            f"against {format_seconds(first.step_s)}), and the least step time decides."
        )
    lines.append(
        f"Chosen: {best.label}, peak {format_bytes(best.peak_allocated_bytes)} of {budget} at "
        f"{format_seconds(best.step_s)} per step{_cost_words(best, baseline)}."
    )
    return FitChoice(best.label, True, tuple(lines), ranking)


def _measured(r: Candidate) -> bool:
    return r.status == "ok" and r.peak_allocated_bytes is not None and r.step_s is not None


def _why_unmeasured(r: Candidate) -> str:
    if r.status == "oom":
        return "it ran out of memory"
    if r.status != "ok":
        return "it failed"
    return "no peak was measured" if r.peak_allocated_bytes is None else "no step time was measured"


def _peak(r: Candidate) -> int:
    assert r.peak_allocated_bytes is not None
    return r.peak_allocated_bytes


def _step(r: Candidate) -> float:
    assert r.step_s is not None
    return r.step_s


def _fits(r: Candidate, budget_bytes: int) -> bool:
    return _measured(r) and _peak(r) <= budget_bytes


def _over(r: Candidate, budget_bytes: int) -> int:
    return _peak(r) - budget_bytes


def _rank_key(r: Candidate, baseline: Candidate) -> tuple[int, float, float, int]:
    """Faster-and-smaller first, then the best ratio; candidates that save nothing go last."""
    saved = _peak(baseline) - _peak(r)
    cost = _step(r) - _step(baseline)
    if saved <= 0:
        return (2, -saved, _step(r), _peak(r))
    if cost <= 0:
        return (0, -saved, _step(r), _peak(r))
    return (1, -saved / max(cost, EPSILON_S), _step(r), _peak(r))


def _describe(r: Candidate, baseline: Candidate, budget_bytes: int) -> str:
    saved = _peak(baseline) - _peak(r)
    cost = _step(r) - _step(baseline)
    head = f"{r.label}: peak {format_bytes(r.peak_allocated_bytes)}"
    if saved <= 0:
        what = f"saves nothing ({format_bytes(-saved, signed=True)})"
    elif cost <= 0:
        what = f"saves {format_bytes(saved)} and is {_seconds(-cost)} faster"
    else:
        per_ms = round(saved / (max(cost, EPSILON_S) * 1000))
        what = f"saves {format_bytes(saved)} for +{_seconds(cost)}: {format_bytes(per_ms)} per ms"
    return f"{head}, {what}, {_fit_words(r, budget_bytes)}"


def _fit_words(r: Candidate, budget_bytes: int) -> str:
    if _fits(r, budget_bytes):
        return "fits"
    return f"does not fit ({format_bytes(_over(r, budget_bytes))} over)"


def _cost_words(r: Candidate, baseline: Candidate) -> str:
    if r is baseline or not _measured(baseline):
        return ""
    cost = _step(r) - _step(baseline)
    change = step_change(
        _step(r),
        _step(baseline),
        getattr(r, "step_spread_s", None),  # a TrialResult's; plain records may lack it
        getattr(baseline, "step_spread_s", None),
    )
    seconds = f"{'+' if cost >= 0 else '-'}{_seconds(abs(cost))}"
    if change is None:
        return f" ({seconds} against the baseline)"
    return f" ({seconds}, {change.against('the baseline')})"


def _seconds(s: float) -> str:
    """format_seconds for a non-negative difference; sub-microsecond differences read as 0 µs."""
    return format_seconds(max(s, 0.0))


def _named(result: object) -> str:
    """`` (label)`` unless the label already says it is the baseline."""
    label = str(getattr(result, "label", ""))
    return "" if label in ("", "baseline") else f" ({label})"
