"""The report as fixed-width text: one column per device, then what happened at the peak."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from jupyter_gpumem.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from jupyter_gpumem.analysis.breakdown import TensorRecord
    from jupyter_gpumem.report.record import DeviceReport, Report

# Tensor names longer than this are shortened from the left (their end tells them apart); up
# to it, the name column takes the room it needs.
NAME_WIDTH = 72
CODE = re.compile(r"`([^`\n]+)`")  # code spans in hint texts (the JSON keeps the backticks)


_ROWS: tuple[tuple[str, str, bool], ...] = (
    ("peak allocated", "peak_allocated_bytes", False),
    ("peak reserved", "peak_reserved_bytes", False),
    ("allocated before", "allocated_before_bytes", False),
    ("allocated after", "allocated_after_bytes", False),
    ("allocated delta", "allocated_delta_bytes", True),
    ("cache (reserved - allocated)", "cache_bytes", False),
    ("process memory (NVML)", "nvml_process_bytes", False),
    ("  not PyTorch's", "non_torch_bytes", False),
)


def rows(r: Report) -> list[tuple[str, str, bool]]:
    """The table rows that have a value on at least one device (NVML rows are empty on CPU)."""
    return [row for row in _ROWS if any(getattr(d, row[1]) is not None for d in r.devices)]


def title(r: Report) -> str:
    label = f" {r.name}" if r.name else ""
    state = {"ok": "", "error": " (cell raised)", "oom": " (out of memory)"}.get(r.status, "")
    return f"gpumem{label}: {format_seconds(r.wall_s)}{state}"


def render_text(r: Report) -> str:
    """Fixed-width text, one column per device."""
    lines = [title(r)]
    if r.devices:
        heads = [f"{d.device} {d.name}" for d in r.devices]
        width = max(28, *(len(label) for label, _, _ in _ROWS))
        cols = [max(12, len(h)) for h in heads]
        lines.append(
            " " * width + "  " + "  ".join(h.rjust(c) for h, c in zip(heads, cols, strict=True))
        )
        for label, key, signed in rows(r):
            cells = [format_bytes(getattr(d, key), signed=signed) for d in r.devices]
            lines.append(
                label.ljust(width)
                + "  "
                + "  ".join(v.rjust(c) for v, c in zip(cells, cols, strict=True))
            )
    if r.budget_bytes is not None and r.peak_allocated_bytes is not None:
        verdict = "OVER" if r.over_budget else "within"
        lines.append(f"budget {format_bytes(r.budget_bytes)}: peak is {verdict} budget")
    main = r.main
    if main is not None:
        lines.extend(detail_lines(main))
    lines.extend(f"warning: {w}" for w in warnings(r))
    lines.extend(f"leak: {plain(h.message)} Fix: {plain(h.fix)}" for h in r.leak_hints)
    lines.extend(f"note: {n}" for n in r.shown_notes())
    return "\n".join(lines)


def budget_line(r: Report) -> str | None:
    """What exceeding the budget means in bytes, or None within it."""
    main = r.main
    if not r.over_budget or main is None or r.budget_bytes is None:
        return None
    over = main.peak_allocated_bytes - r.budget_bytes
    return (
        f"peak {format_bytes(main.peak_allocated_bytes)} on {main.device} exceeds the budget "
        f"of {format_bytes(r.budget_bytes)} by {format_bytes(over)}"
    )


def warnings(r: Report) -> list[str]:
    """The report's warnings, the budget's first."""
    over = budget_line(r)
    return [*([over] if over else []), *r.warnings]


def where(d: DeviceReport) -> str:
    if d.peak_phase is None:
        return ""
    step = f", step {d.peak_step}" if d.peak_step is not None else ""
    return f" ({d.peak_phase}{step})"


def plain(text: str) -> str:
    """Hint text for plain output: code spans without their backticks."""
    return CODE.sub(r"\1", text)


def short(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters, keeping its end (``…h.11.mlp.weight]['exp_avg']``)."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def shape(t: TensorRecord) -> str:
    return "x".join(map(str, t.shape)) if t.shape is not None else "?"


def detail_lines(d: DeviceReport) -> list[str]:
    """Breakdown at the peak, out-of-memory advice and the tensor delta of one device."""
    return [*peak_lines(d), *alive_lines(d), *freed_lines(d)]


def peak_lines(d: DeviceReport) -> list[str]:
    """Breakdown at the peak and out-of-memory advice."""
    lines: list[str] = []
    if d.breakdown:
        lines.append(f"at the peak{where(d)} on {d.device}:")
        total = max(1, d.peak_allocated_bytes)
        for category, n in sorted(d.breakdown.items(), key=lambda kv: -kv[1]):
            if n:
                lines.append(
                    f"  {category.replace('_', ' '):<18}{format_bytes(n):>11}  {100 * n / total:3.0f}%"
                )
    if d.oom is not None:
        lines.append(
            f"out of memory asking for {format_bytes(d.oom.requested_bytes)}: "
            f"{d.oom.dominant.replace('_', ' ')} dominated what was live; try {d.oom.advice}"
        )
    return lines


def alive_lines(d: DeviceReport) -> list[str]:
    """The tensors the cell left alive, one line each."""
    alive = [t for t in d.tensors if t.alive]
    if not alive:
        return []
    lines = ["tensors the cell left alive:"]
    width = min(NAME_WIDTH, max(len(t.name or "(unnamed)") for t in alive))
    for t in alive:
        name = short(t.name or "(unnamed)", width)
        lines.append(
            f"  {name:<{width}} {shape(t):>14} {t.dtype or '':>9} {format_bytes(t.nbytes):>11}  {t.line or ''}"
        )
    return lines


def freed_lines(d: DeviceReport) -> list[str]:
    lines: list[str] = []
    freed = [t for t in d.tensors if not t.alive]
    if freed:
        biggest = freed[0]
        lines.append(
            f"largest freed: {format_bytes(biggest.nbytes)} from {biggest.line or 'an unknown line'}"
        )
    return lines
