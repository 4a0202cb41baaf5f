"""The answers of the ``history`` route: its query checked, a page chosen and encoded.

A full history can be large: 10 minutes of 8 GPUs with 16 processes each, sampled every
0.25 s, is about 65 MB of JSON, and encoding it held the event loop for seconds. So an
answer is a page: at most ``limit`` samples and about `MAX_PAGE_BYTES` of them (one at
least), oldest first, with ``next_since`` to ask for the next page (null on the last one).
``view=memory`` answers only what the sparklines draw (each device's memory used), and
``step`` keeps one sample per ``step`` seconds. `history_page` encodes on a worker thread,
off the event loop, one sample at a time (so the loop gets the GIL between samples).

Query::

    since   unix seconds; only newer samples (default: from the oldest kept)
    limit   the most samples in the answer, 1 to 1000 (default 1000)
    step    seconds, > 0 and <= 86400: only the first sample of each step-long span of time
    view    "full" (default: samples as the ``sample`` route answers them) or "memory"
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jupyter_gpumem.nvml.readings import Sample, encode_json

__all__ = ["MAX_LIMIT", "MAX_PAGE_BYTES", "VIEWS", "HistoryQuery", "history_page"]

MAX_LIMIT = 1000
MAX_PAGE_BYTES = 2**19  # 512 KiB; bench/server_history.py measures what a page costs
MAX_STEP_S = 86400.0
VIEWS = ("full", "memory")
SHOWN_CHARACTERS = 40  # of a refused value, so that an answer never grows with its input


def shown(value: str) -> str:
    """A query value as an error message quotes it: its first characters only."""
    if len(value) <= SHOWN_CHARACTERS:
        return repr(value)
    return f"{value[:SHOWN_CHARACTERS]!r}... ({len(value)} characters)"


def _number(name: str, raw: str, allowed: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{name}={shown(raw)} is not allowed: {allowed}")
    return value


@dataclass(frozen=True)
class HistoryQuery:
    """What one ``history`` request asks for, checked."""

    since: float | None = None
    limit: int = MAX_LIMIT
    step: float | None = None
    view: str = "full"

    @classmethod
    def parse(cls, argument: Callable[[str], str | None]) -> HistoryQuery:
        """From the query (``argument(name)`` is its value or None); ValueError says what is allowed."""
        since = limit = step = None
        if (raw := argument("since")) is not None:
            since = _number(
                "since",
                raw,
                "give a unix time in seconds (e.g. since=1767225600.5), "
                "or leave it out to start at the oldest sample",
            )
        if (raw := argument("limit")) is not None:
            if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_LIMIT):
                raise ValueError(
                    f"limit={shown(raw)} is not allowed: give a whole number of samples "
                    f"from 1 to {MAX_LIMIT}, or leave it out for {MAX_LIMIT}"
                )
            limit = int(raw)
        if (raw := argument("step")) is not None:
            allowed = f"give seconds > 0 and <= {MAX_STEP_S:g} (e.g. step=1), or leave it out"
            step = _number("step", raw, allowed)
            if not 0 < step <= MAX_STEP_S:
                raise ValueError(f"step={shown(raw)} is not allowed: {allowed}")
        view = argument("view") or "full"
        if view not in VIEWS:
            raise ValueError(f"view={shown(view)} is not allowed: use one of {', '.join(VIEWS)}")
        return cls(since, MAX_LIMIT if limit is None else limit, step, view)

    def select(self, kept: Sequence[Sample]) -> list[Sample]:
        """The samples of ``kept`` (the ring buffer, oldest first) this query asks for, all pages.

        With ``step``, a sample is taken when it is the first of its span of time
        (``floor(time / step)``) in the buffer, whatever ``since`` is: so pages asked one
        after the other, from each answer's ``next_since``, take the same samples as one
        answer would.
        """
        selected = []
        span: float | None = None
        for sample in kept:
            if self.step is not None:
                previous, span = span, math.floor(sample.time / self.step)
                if span == previous:
                    continue
            if self.since is None or sample.time > self.since:
                selected.append(sample)
        return selected


def history_page(kept: Sequence[Sample], interval_s: float, query: HistoryQuery) -> str:
    """The JSON text of one answer: the first page of what ``query`` selects in ``kept``."""
    selected = query.select(kept)
    texts: list[str] = []
    size = 0
    for sample in selected[: query.limit]:
        text = encode_json(sample.to_json()) if query.view == "full" else sample.encoded_memory
        if texts and size + len(text) > MAX_PAGE_BYTES:
            break
        texts.append(text)
        size += len(text) + 1
    more = len(texts) < len(selected)
    next_since = selected[len(texts) - 1].time if more else None
    key = "samples" if query.view == "full" else "points"
    return (
        f'{{"interval_s":{json.dumps(interval_s)},"{key}":[{",".join(texts)}],'
        f'"next_since":{json.dumps(next_since)}}}'
    )
