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


# The CPU has no caching allocator: nothing is reserved beyond what its tensors hold, so these
# rows would only repeat allocated, or show a cache of 0 B as if it meant something.
CACHE_ROWS = frozenset({"peak_reserved_bytes", "cache_bytes"})
NO_CACHE = "—"  # in a CPU column beside GPU columns
NO_CACHE_WHY = (
    "the CPU has no caching allocator, so nothing is reserved beyond what its tensors hold"
)


def has_cache(d: DeviceReport) -> bool:
    """Whether ``d`` has a caching allocator, so that reserved and cache mean something."""
    return d.device != "cpu"


def value(d: DeviceReport, key: str) -> int | None:
    """The device's figure for a table row; None where the row means nothing for it."""
    return None if key in CACHE_ROWS and not has_cache(d) else getattr(d, key)


def cell(d: DeviceReport, key: str, *, signed: bool = False) -> str:
    """A table cell: the figure, or NO_CACHE where the CPU has no cache to show."""
    if key in CACHE_ROWS and not has_cache(d):
        return NO_CACHE
    return format_bytes(getattr(d, key), signed=signed)


def rows(r: Report) -> list[tuple[str, str, bool]]:
    """The table rows that have a value on at least one device (NVML rows are empty on CPU,
    reserved and cache rows too)."""
    return [row for row in _ROWS if any(value(d, row[1]) is not None for d in r.devices)]


def no_cache_shown(r: Report) -> bool:
    """Whether the table shows NO_CACHE somewhere: a CPU column beside a GPU's."""
    return any(not has_cache(d) for d in r.devices) and any(
        key in CACHE_ROWS for _, key, _ in rows(r)
    )


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
            cells = [cell(d, key, signed=signed) for d in r.devices]
            lines.append(
                label.ljust(width)
                + "  "
                + "  ".join(v.rjust(c) for v, c in zip(cells, cols, strict=True))
            )
        if no_cache_shown(r):
            lines.append(f"{NO_CACHE}: {NO_CACHE_WHY}")
    if r.budget_bytes is not None and r.peak_allocated_bytes is not None:
        verdict = "OVER" if r.over_budget else "within"
        lines.append(f"budget {format_bytes(r.budget_bytes)}: peak is {verdict} budget")
    main = r.main
    if main is not None:
        lines.extend(detail_lines(main))
    lines.extend(rank_lines(r))
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
    return [*breakdown_lines(d), *module_lines(d), *oom_lines(d)]


def breakdown_lines(d: DeviceReport) -> list[str]:
    """What the peak was made of, largest first."""
    lines: list[str] = []
    if d.breakdown:
        lines.append(f"at the peak{where(d)} on {d.device}:")
        total = max(1, d.peak_allocated_bytes)
        for category, n in sorted(d.breakdown.items(), key=lambda kv: -kv[1]):
            if n:
                lines.append(
                    f"  {category.replace('_', ' '):<18}{format_bytes(n):>11}  {100 * n / total:3.0f}%"
                )
    return lines


TOP_MODULES = 5
ROOT_MODULE = "model"  # what the root of the module tree (path "") is called


def module_name(path: str) -> str:
    """A module's name where it stands alone: its path (``transformer.h.3.attn``); the root
    ``model``; ``model.2`` where the path starts with an index (a Sequential's child), which
    alone would read as a number."""
    if not path:
        return ROOT_MODULE
    return f"{ROOT_MODULE}.{path}" if path[0].isdigit() else path


def module_lines(d: DeviceReport) -> list[str]:
    """The modules holding the most bytes at the peak, by their own code (children apart)."""
    if d.module_tree is None:
        return []
    ranked = d.module_tree.ranked()[:TOP_MODULES]
    if not ranked:
        return []
    lines = ["largest modules at the peak (their own bytes):"]
    width = min(NAME_WIDTH, max(len(module_name(m.path)) for m in ranked))
    for m in ranked:
        own = m.own()
        most = max(own, key=own.__getitem__)
        lines.append(
            f"  {short(module_name(m.path), width):<{width}} {format_bytes(sum(own.values())):>11}"
            f"  mostly {most.replace('_', ' ')}"
        )
    return lines


def oom_lines(d: DeviceReport) -> list[str]:
    """What was live when the allocator ran out, and what would help most."""
    if d.oom is None:
        return []
    return [
        f"out of memory asking for {format_bytes(d.oom.requested_bytes)}: "
        f"{d.oom.dominant.replace('_', ' ')} dominated what was live; try {d.oom.advice}"
    ]


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


RANK_HEADS = ("rank", "pid", "device", "peak allocated", "peak reserved", "phase", "at the peak")
_RIGHT = {0, 1, 3, 4}  # columns aligned right: the numbers


def rank_heading(r: Report) -> str:
    """What the rank table is, and which rank is worst."""
    n = len(r.ranks)
    line = f"{n} worker process{'es' if n != 1 else ''}"
    worst = r.worst_rank
    if worst is not None and worst.main is not None:
        line += (
            f"; the worst (*) is rank {worst.rank}, peak "
            f"{format_bytes(worst.main.peak_allocated_bytes)} on {worst.main.device}"
        )
    return line


def rank_cells(rank: Report) -> tuple[str, ...]:
    """One rank's row: what the table shows of it, or how it ended where it has no figures."""
    main = rank.main
    label = "?" if rank.rank is None else str(rank.rank)
    pid = "?" if rank.pid is None else str(rank.pid)
    if main is None:
        return (label, pid, "-", "-", "-", "-", rank.error or rank.status)
    phase = where(main).strip(" ()") or "-"
    return (
        label,
        pid,
        main.device,
        format_bytes(main.peak_allocated_bytes),
        cell(main, "peak_reserved_bytes"),
        phase,
        top_categories(main),
    )


def top_categories(d: DeviceReport, n: int = 3) -> str:
    """The largest parts of the peak, ``activations 48%, temporary 27%, ...``."""
    if not d.breakdown:
        return "no breakdown"
    total = max(1, d.peak_allocated_bytes)
    parts = sorted(((k, v) for k, v in d.breakdown.items() if v), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k.replace('_', ' ')} {100 * v / total:.0f}%" for k, v in parts)


def rank_failures(r: Report) -> list[str]:
    """The ranks that failed and reported figures: their error and out-of-memory advice.

    Rows without figures say what happened themselves.
    """
    lines = []
    for rank in r.ranks:
        if rank.main is not None and rank.status != "ok" and rank.error:
            lines.append(f"rank {rank.rank} (pid {rank.pid}) failed: {rank.error}")
            lines.extend(f"  {line}" for line in oom_lines(rank.main))
    return lines


def rank_lines(r: Report) -> list[str]:
    """The ranks as a table, the worst marked; its breakdown at the peak; failures."""
    if not r.ranks:
        return []
    worst = r.worst_rank
    rows = [RANK_HEADS, *(rank_cells(rank) for rank in r.ranks)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RANK_HEADS) - 1)]
    marks = [" ", *("*" if rank is worst else " " for rank in r.ranks)]
    lines = [f"ranks: {rank_heading(r)}"]
    for mark, row in zip(marks, rows, strict=True):
        cells = [
            cell.rjust(width) if i in _RIGHT else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append(f"{mark} " + "  ".join([*cells, row[-1]]).rstrip())
    if worst is not None and worst.main is not None and worst.main.breakdown:
        heading, *parts = breakdown_lines(worst.main)
        lines.append(f"rank {worst.rank} {heading}")
        lines.extend(parts)
    lines.extend(rank_failures(r))
    return lines
