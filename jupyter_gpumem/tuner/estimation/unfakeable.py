"""The one error of the fake-tensor estimates: a step that cannot run on fake tensors, and where."""

from __future__ import annotations

import linecache
import os
import sys
import traceback

_OURS = frozenset({"torch", "jupyter_gpumem"})  # the packages a read passes through
_SOURCE_CHARS = 100


class Unfakeable(Exception):
    """The step cannot run on fake tensors; the message says why, in the user's terms."""


def raised_at(exc: BaseException) -> str | None:
    """The line of the step's code that ``exc`` came from: the innermost frame outside torch
    and this package, as ``path:line `source```, the path from its import root. Where that
    frame is a library's helper (a ``utils`` module), the line is its caller's, through it."""
    tb = exc.__traceback__
    frames = [
        (frame.f_globals.get("__name__") or "", summary)
        for (frame, _), summary in zip(traceback.walk_tb(tb), traceback.extract_tb(tb), strict=True)
    ]
    outside = [(m, s) for m, s in reversed(frames) if m.partition(".")[0] not in _OURS]
    if not outside:
        return None
    module, summary = outside[0]
    if "utils" in module.split(".")[1:] and len(outside) > 1:
        return f"{source_line(outside[1][1])} (through {summary.name})"
    return source_line(summary)


def source_line(summary: traceback.FrameSummary) -> str:
    """``path:line `source``` of ``summary``, its lines joined into one (cut at 100 chars)."""
    first = summary.lineno or 0
    end = getattr(summary, "end_lineno", None)  # Python 3.11 on
    last = min(end or first, first + 4)
    lines = range(first, last + 1)
    source = " ".join(" ".join(linecache.getline(summary.filename, n).split()) for n in lines)
    source = source.replace("( ", "(").replace(" )", ")").strip()
    if len(source) > _SOURCE_CHARS:
        source = source[: _SOURCE_CHARS - 3] + "..."
    return f"{_shown(summary.filename)}:{summary.lineno} `{source}`"


def _shown(filename: str) -> str:
    """``filename`` from the deepest import root holding it (``transformers/...``)."""
    path = os.path.abspath(filename)
    roots = [os.path.abspath(p or os.curdir) for p in sys.path]
    held = [r for r in roots if path.startswith(r.rstrip(os.sep) + os.sep)]
    return os.path.relpath(path, max(held, key=len)) if held else filename
