"""Will it run, and how far? The longest context at a batch, and a batch x context map of a
``generate`` call's estimated peaks with the frontier of what fits.

Every figure is :func:`~.generation.estimate_generate`'s, on fake tensors (a meta model is
enough), with the ``count_held`` given. Contexts are total tokens, the prompt and
``max_new_tokens`` together, as the KV cache holds them at the last step. What fits is the
allocated peak within a budget, or, on a card named by ``gpu``, the estimate's verdict
(reserved peak, CUDA context and margin within the card).
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.generation import estimate_generate, peaks_of
from jupyter_gpumem.tuner.estimation.search import budget_of, largest_fitting
from jupyter_gpumem.units import format_bytes, format_seconds

__all__ = ["ContextSearch", "GenerateMap", "generate_map", "max_generate_context"]

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
# What each state's cells show (the mark) and what that means; the table's legend and text.
MARKS = {
    "fits": ("a size", "the estimated peak, which fits"),
    "over": ("a size and x", "the estimated peak, which does not fit"),
    "left_out": ("x alone", "does not fit, not estimated: a smaller batch or context does not"),
    "unjudged": ("a size, plain", "the estimated peak, not judged: no verdict for the card"),
    "unrun": ("-", "not estimated"),
    "unknown": ("n/a", "no estimate (hover over the cell for why)"),
}
# The theme's success and error colours, as the map's chart draws them (widgets.generate_chart).
STATE_STYLES = {
    "fits": "color:var(--jp-success-color1,#388e3c)",
    "over": "color:var(--jp-error-color1,#d32f2f)",
    "left_out": "color:var(--jp-error-color1,#d32f2f);opacity:.6",
}
_CLASSES = {  # a cell left out does not fit either
    "fits": "gpumem-map-fits",
    "over": "gpumem-map-over",
    "left_out": "gpumem-map-over gpumem-map-left-out",
}


@dataclass(frozen=True)
class ContextSearch:
    """How ``max_generate_context`` found the longest prompt: the estimates it made."""

    prompt_tokens: int  # the longest prompt that fits; 0 when none does
    max_new_tokens: int
    batch_size: int
    budget_bytes: int
    estimate: Estimate | None  # of prompt_tokens
    above: Estimate | None  # of one token more; None where the model's limit fits
    limit: int | None  # the model's longest context (max_position_embeddings); None: unknown
    tried: tuple[tuple[int, int], ...]  # (prompt tokens, estimated peak bytes)
    wall_s: float

    @property
    def context_tokens(self) -> int:
        """The longest total context: prompt and new tokens; 0 when none fits."""
        return self.prompt_tokens + self.max_new_tokens if self.prompt_tokens else 0


@dataclass(frozen=True)
class GenerateMap:
    """Estimated peaks of one ``generate`` setting over batch sizes and contexts."""

    batch_sizes: tuple[int, ...]
    contexts: tuple[int, ...]  # total tokens: prompt + max_new_tokens
    max_new_tokens: int
    estimates: tuple[tuple[Estimate | None, ...], ...]  # [batch][context]; None: not run
    budget_bytes: int | None  # what the allocated peak must stay within; None: judged on a card
    card: str | None  # the card of the verdicts, where ``gpu`` named one
    wall_s: float

    def fits(self, i: int, j: int) -> bool | None:
        """Whether batch ``batch_sizes[i]`` at ``contexts[j]`` fits; None: no estimate. A cell
        left out takes more than a smaller one that did not fit, and does not fit either."""
        est = self.estimates[i][j]
        if est is None:
            smaller = ((a, b) for a in range(i + 1) for b in range(j + 1) if (a, b) != (i, j))
            return False if any(self.fits(a, b) is False for a, b in smaller) else None
        if est.peak_bytes is None:
            return None
        if self.budget_bytes is not None:
            return est.peak_bytes <= self.budget_bytes
        return None if est.verdict is None else est.verdict.fits

    def frontier(self) -> tuple[int, ...]:
        """For each batch size, the longest context of the map that fits (0: none)."""
        return tuple(
            max((c for j, c in enumerate(self.contexts) if self.fits(i, j)), default=0)
            for i in range(len(self.batch_sizes))
        )

    def peak(self, i: int, j: int) -> int | None:
        est = self.estimates[i][j]
        return None if est is None else est.peak_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_sizes": list(self.batch_sizes),
            "contexts": list(self.contexts),
            "max_new_tokens": self.max_new_tokens,
            "budget_bytes": self.budget_bytes,
            "card": self.card,
            "peaks": [[self.peak(i, j) for j in range(len(self.contexts))] for i in range(len(self.batch_sizes))],
            "fits": [[self.fits(i, j) for j in range(len(self.contexts))] for i in range(len(self.batch_sizes))],
            "frontier": list(self.frontier()),
            "wall_s": self.wall_s,
        }  # fmt: skip

    # -- display ---------------------------------------------------------------------------
    def _limit_line(self) -> str:
        against = (
            f"within {format_bytes(self.budget_bytes)} allocated"
            if self.budget_bytes is not None
            else f"on {self.card}"
        )
        return (
            f"generate, {self.max_new_tokens} new tokens: estimated peak by batch and total "
            f"context, {against} (took {format_seconds(self.wall_s)})"
        )

    def _state(self, i: int, j: int) -> str:
        """A cell's state, a key of MARKS."""
        est, fits = self.estimates[i][j], self.fits(i, j)
        if est is None:
            return "left_out" if fits is False else "unrun"
        if est.peak_bytes is None:
            return "unknown"
        return "unjudged" if fits is None else "fits" if fits else "over"

    def _legend(self) -> list[tuple[str, str, str]]:
        """(state, mark, meaning) of each state the map has, in MARKS' order."""
        states = {self._state(i, j) for i in range(len(self.batch_sizes)) for j in range(len(self.contexts))}  # fmt: skip
        return [(state, *MARKS[state]) for state in MARKS if state in states]

    def _cell(self, i: int, j: int) -> str:
        est = self.estimates[i][j]
        if est is None:
            return "x" if self.fits(i, j) is False else "-"
        if est.peak_bytes is None:
            return "n/a"
        return format_bytes(est.peak_bytes) + ("" if self.fits(i, j) else " x")

    def text(self) -> str:
        width = max(10, *(len(self._cell(i, j)) + 2 for i in range(len(self.batch_sizes)) for j in range(len(self.contexts))))  # fmt: skip
        lines = [self._limit_line(), *(f"{mark}: {means}" for _, mark, means in self._legend()), ""]
        lines.append("batch \\ context" + "".join(f"{c:>{width}}" for c in self.contexts))
        for i, b in enumerate(self.batch_sizes):
            cells = "".join(f"{self._cell(i, j):>{width}}" for j in range(len(self.contexts)))
            lines.append(f"{b:>15}{cells}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def chart(self) -> Any:
        """The map as a bqplot chart in an ipywidgets VBox (both needed only here)."""
        from jupyter_gpumem.widgets.generate_chart import GenerateChart

        return GenerateChart(self).widget

    def _repr_html_(self) -> str:
        """The table, each cell in the colour of its state, beside a legend of the marks."""
        head = "".join(f"<th>{c}</th>" for c in self.contexts)
        rows = []
        for i, b in enumerate(self.batch_sizes):
            cells = []
            for j in range(len(self.contexts)):
                state = self._state(i, j)
                why = self.estimates[i][j]
                title = (
                    ""
                    if why is None or why.reason is None
                    else f' title="{html.escape(why.reason)}"'
                )
                style = f' style="{STATE_STYLES[state]}"' if state in STATE_STYLES else ""
                css = _CLASSES.get(state, "gpumem-map-unknown")
                cells.append(f'<td class="{css}"{style}{title}>{html.escape(self._cell(i, j))}</td>')  # fmt: skip
            rows.append(f"<tr><th>{b}</th>{''.join(cells)}</tr>")
        legend = "".join(
            f'<li><span style="{STATE_STYLES.get(state, "font-weight:600")}">'
            f"{html.escape(mark)}</span>: {html.escape(means)}</li>"
            for state, mark, means in self._legend()
        )
        return (
            f'<div class="gpumem-map"><p>{html.escape(self._limit_line())}</p>'
            '<div style="display:flex;flex-wrap:wrap;align-items:flex-start;gap:0 1.5em">'
            f"<table><tr><th>batch \\ context</th>{head}</tr>{''.join(rows)}</table>"
            f'<ul class="gpumem-map-legend" style="margin:0;padding-left:1.2em">{legend}</ul>'
            "</div></div>"
        )


def max_generate_context(
    model: Any,
    budget: int | str,
    *,
    batch_size: int,
    max_new_tokens: int,
    device: Any = None,
    gpu: str | None = None,
    count_held: bool = True,
    **generate_kwargs: Any,
) -> ContextSearch:
    """The longest prompt whose ``generate`` of ``max_new_tokens`` at ``batch_size`` is
    estimated within ``budget`` (bytes, or a size such as ``"20GiB"``), up to the model's own
    longest context. Raises :class:`~.estimate.EstimateUnavailable` where a prompt cannot be
    estimated. ``gpu`` names the card to estimate for, as in :func:`.estimate_generate`."""
    budget_bytes = budget_of(budget)
    t0 = time.perf_counter()
    limit = _position_limit(model)
    if limit is not None and limit <= max_new_tokens:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
            f"{limit} positions"
        )
    made: dict[int, Estimate] = {}

    def prompt_of(n: int) -> Estimate:
        return estimate_generate(
            model,
            batch_size=batch_size,
            prompt_tokens=n,
            max_new_tokens=max_new_tokens,
            device=device,
            gpu=gpu,
            count_held=count_held,
            **generate_kwargs,
        )

    peak = peaks_of(prompt_of, made, "a prompt of {} tokens")

    high = None if limit is None else limit - max_new_tokens
    found = largest_fitting(peak, budget_bytes, 1, high, "prompt length")
    tried = tuple((n, e.peak_bytes or 0) for n, e in made.items())
    return ContextSearch(
        max(found, 0), max_new_tokens, batch_size, budget_bytes, made.get(found),
        made.get(found + 1), limit, tried, time.perf_counter() - t0,
    )  # fmt: skip


def generate_map(
    model: Any,
    *,
    max_new_tokens: int,
    budget: int | str | None = None,
    gpu: str | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    contexts: Sequence[int] = CONTEXTS,
    device: Any = None,
    count_held: bool = True,
    **generate_kwargs: Any,
) -> GenerateMap:
    """Estimated peaks of ``generate`` over ``batch_sizes`` x ``contexts`` (total tokens),
    judged against ``budget`` (allocated bytes or a size) or on the card ``gpu`` names.

    Contexts past the model's longest are left out. Along a batch size, once a context does not
    fit, the longer ones are not estimated (they take more); likewise along a context.
    """
    if (budget is None) == (gpu is None):
        raise ValueError("generate_map() takes a budget (bytes or a size like '20GiB') or a gpu")
    budget_bytes = None if budget is None else budget_of(budget)
    for name, sizes in (("batch_sizes", batch_sizes), ("contexts", contexts)):
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise ValueError(f"{name} is a list of whole numbers from 1 up, got {sizes!r}")
    limit = _position_limit(model)
    kept = sorted({c for c in contexts if c > max_new_tokens and (limit is None or c <= limit)})
    if not kept:
        raise ValueError(
            f"no context in {list(contexts)} leaves room for a prompt before {max_new_tokens} new "
            + ("tokens" if limit is None else f"tokens within the model's {limit} positions")
        )
    t0 = time.perf_counter()
    batches = sorted(set(batch_sizes))
    grid: list[list[Estimate | None]] = [[None] * len(kept) for _ in batches]
    over: list[int] = [len(kept)] * len(batches)  # per batch, the first context that does not fit
    for i, b in enumerate(batches):
        stop = over[i - 1] if i else len(kept)  # a larger batch never fits a longer context
        for j in range(stop):
            est = estimate_generate(
                model,
                batch_size=b,
                prompt_tokens=kept[j] - max_new_tokens,
                max_new_tokens=max_new_tokens,
                device=device,
                gpu=gpu,
                count_held=count_held,
                **generate_kwargs,
            )
            grid[i][j] = est
            judged = GenerateMap(
                (b,), (kept[j],), max_new_tokens, ((est,),), budget_bytes, gpu, 0.0
            )
            if judged.fits(0, 0) is not True:
                over[i] = j
                break
        else:
            over[i] = stop
    return GenerateMap(
        tuple(batches), tuple(kept), max_new_tokens, tuple(tuple(row) for row in grid),
        budget_bytes, None if gpu is None else _card_name(gpu), time.perf_counter() - t0,
    )  # fmt: skip


def _card_name(gpu: str) -> str:
    from jupyter_gpumem.tuner.estimation import cards

    return cards.card(gpu).name


def _position_limit(model: Any) -> int | None:
    """The longest context the model's positions allow, as its config says; None: unknown."""
    config = getattr(model, "config", None)
    text = getattr(config, "get_text_config", None)
    config = text(decoder=True) if callable(text) else config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
