"""The `%%gpumem` report: a frozen record of plain numbers and its renderings.

Numbers are bytes (int) and seconds (float); units appear only in the text and
HTML renderings. ``to_dict()`` is the wire format behind the
``application/vnd.jupyter-gpumem.report+json`` output that the sidebar reads.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from jupyter_gpumem.analysis.attribution import OomInfo
from jupyter_gpumem.analysis.breakdown import TensorRecord
from jupyter_gpumem.analysis.leak_hints import LeakHint
from jupyter_gpumem.analysis.timeline import Timeline
from jupyter_gpumem.units import format_bytes, format_seconds

# Tensor names longer than this are shortened from the left (their end tells them apart); up
# to it, the name column takes the room it needs.
NAME_WIDTH = 72  # text
HTML_NAME_WIDTH = 120
_CODE = re.compile(r"`([^`\n]+)`")  # code spans in hint texts (the JSON keeps the backticks)
MIME_TYPE = "application/vnd.jupyter-gpumem.report+json"
SCHEMA = 1
# Recorded in `Report.notes` when torch sees no CUDA device; `shown_notes` words it for what the
# report holds (CPU tensor memory stands in for the GPU where it was recorded).
NO_CUDA = "No CUDA device is present: the cell ran unchanged and no GPU memory was measured."


@dataclass(frozen=True)
class DeviceReport:
    """One device's numbers for one cell."""

    device: str  # "cuda:0"
    index: int
    name: str
    total_bytes: int | None
    allocated_before_bytes: int
    allocated_after_bytes: int
    allocated_delta_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    reserved_after_bytes: int
    cache_bytes: int  # reserved - allocated after the cell
    nvml_process_bytes: int | None  # what the driver charges this process on the device
    non_torch_bytes: (
        int | None
    )  # nvml_process_bytes - reserved: CUDA context, cuBLAS, other libraries
    source: str  # "allocator-trace" or "counters"
    breakdown: dict[str, int] | None = None  # sums to peak_allocated_bytes
    peak_phase: str | None = None  # forward, backward, optimizer or other
    peak_step: int | None = None  # loop iteration of the peak, 0-based
    timeline: Timeline | None = None
    tensors: tuple[TensorRecord, ...] = ()
    oom: OomInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        # By hand rather than asdict(): no deep copy of the timeline on every display.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["breakdown"] = None if self.breakdown is None else dict(self.breakdown)
        out["timeline"] = None if self.timeline is None else self.timeline.to_dict()
        out["tensors"] = [t.to_dict() for t in self.tensors]
        out["oom"] = None if self.oom is None else asdict(self.oom)
        return out


@dataclass(frozen=True)
class Report:
    """What one `%%gpumem` cell did to GPU memory."""

    id: str
    name: str | None
    execution_count: int | None
    started_at: float
    wall_s: float
    status: str  # "ok", "error" or "oom"
    error: str | None
    cuda_available: bool
    source: str  # "allocator-trace", "counters" or "none"
    budget_bytes: int | None
    devices: tuple[DeviceReport, ...] = ()
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    leak_hints: tuple[LeakHint, ...] = ()
    cell_key: str | None = None  # the same cell re-run has the same key (its name, or its source)
    schema: int = SCHEMA
    extras: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- the main device's numbers, for `-o r` users -------------------------------
    @property
    def main(self) -> DeviceReport | None:
        """The device the cell used most (largest peak above its starting point)."""
        if not self.devices:
            return None
        return max(self.devices, key=lambda d: d.peak_allocated_bytes - d.allocated_before_bytes)

    @property
    def device(self) -> str | None:
        return self.main.device if self.main else None

    @property
    def peak_allocated_bytes(self) -> int | None:
        return self.main.peak_allocated_bytes if self.main else None

    @property
    def peak_reserved_bytes(self) -> int | None:
        return self.main.peak_reserved_bytes if self.main else None

    @property
    def allocated_before_bytes(self) -> int | None:
        return self.main.allocated_before_bytes if self.main else None

    @property
    def allocated_after_bytes(self) -> int | None:
        return self.main.allocated_after_bytes if self.main else None

    @property
    def cache_bytes(self) -> int | None:
        return self.main.cache_bytes if self.main else None

    @property
    def breakdown(self) -> dict[str, int] | None:
        return self.main.breakdown if self.main else None

    @property
    def peak_phase(self) -> str | None:
        return self.main.peak_phase if self.main else None

    @property
    def peak_step(self) -> int | None:
        return self.main.peak_step if self.main else None

    @property
    def tensors(self) -> tuple[TensorRecord, ...]:
        return self.main.tensors if self.main else ()

    @property
    def timeline(self) -> Timeline | None:
        return self.main.timeline if self.main else None

    @property
    def oom(self) -> OomInfo | None:
        return self.main.oom if self.main else None

    @property
    def over_budget(self) -> bool:
        peak = self.peak_allocated_bytes
        return self.budget_bytes is not None and peak is not None and peak > self.budget_bytes

    # -- renderings ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extras":
                continue
            value = getattr(self, f.name)
            if f.name in ("devices", "leak_hints"):
                value = [d.to_dict() for d in value]
            elif f.name == "notes":
                value = list(self.shown_notes())
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        out.update(self.extras)
        return json.loads(json.dumps(out))  # JSON-native: tuples become lists

    def shown_notes(self) -> tuple[str, ...]:
        """The notes as the renderings show them: NO_CUDA says what the figures are instead."""
        cpu = next((d for d in self.devices if d.device == "cpu"), None)
        if NO_CUDA not in self.notes or cpu is None:
            return self.notes
        plain = (
            "No CUDA device: the figures are CPU tensor memory "
            f"(peak {format_bytes(cpu.peak_allocated_bytes)})."
        )
        return tuple(plain if n == NO_CUDA else n for n in self.notes)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {
            "text/plain": render_text(self),
            "text/html": render_html(self),
            MIME_TYPE: self.to_dict(),
        }

    def __str__(self) -> str:
        return render_text(self)

    def timeline_figure(self) -> Any:
        """The main device's timeline as a bqplot Figure; None when there is none."""
        if self.timeline is None:
            return None
        from jupyter_gpumem.widgets.charts import timeline_figure

        return timeline_figure(self.timeline, title=self.name or "")


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


def _rows(r: Report) -> list[tuple[str, str, bool]]:
    """The table rows that have a value on at least one device (NVML rows are empty on CPU)."""
    return [row for row in _ROWS if any(getattr(d, row[1]) is not None for d in r.devices)]


def _title(r: Report) -> str:
    label = f" {r.name}" if r.name else ""
    state = {"ok": "", "error": " (cell raised)", "oom": " (out of memory)"}.get(r.status, "")
    return f"gpumem{label}: {format_seconds(r.wall_s)}{state}"


def render_text(r: Report) -> str:
    """Fixed-width text, one column per device."""
    lines = [_title(r)]
    if r.devices:
        heads = [f"{d.device} {d.name}" for d in r.devices]
        width = max(28, *(len(label) for label, _, _ in _ROWS))
        cols = [max(12, len(h)) for h in heads]
        lines.append(
            " " * width + "  " + "  ".join(h.rjust(c) for h, c in zip(heads, cols, strict=True))
        )
        for label, key, signed in _rows(r):
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
        lines.extend(_detail_lines(main))
    lines.extend(f"warning: {w}" for w in r.warnings)
    lines.extend(f"leak: {_plain(h.message)} Fix: {_plain(h.fix)}" for h in r.leak_hints)
    lines.extend(f"note: {n}" for n in r.shown_notes())
    return "\n".join(lines)


def _where(d: DeviceReport) -> str:
    if d.peak_phase is None:
        return ""
    step = f", step {d.peak_step}" if d.peak_step is not None else ""
    return f" ({d.peak_phase}{step})"


def _plain(text: str) -> str:
    """Hint text for plain output: code spans without their backticks."""
    return _CODE.sub(r"\1", text)


def _code_html(text: str) -> str:
    """Hint text for HTML: escaped, code spans as <code>."""
    return _CODE.sub(r"<code>\1</code>", html.escape(text))


def _short(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters, keeping its end (``…h.11.mlp.weight]['exp_avg']``)."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def _shape(t: TensorRecord) -> str:
    return "x".join(map(str, t.shape)) if t.shape is not None else "?"


def _detail_lines(d: DeviceReport) -> list[str]:
    """Breakdown at the peak, out-of-memory advice and the tensor delta of one device."""
    return [*_peak_lines(d), *_alive_lines(d), *_freed_lines(d)]


def _peak_lines(d: DeviceReport) -> list[str]:
    """Breakdown at the peak and out-of-memory advice."""
    lines: list[str] = []
    if d.breakdown:
        lines.append(f"at the peak{_where(d)} on {d.device}:")
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


def _alive_lines(d: DeviceReport) -> list[str]:
    """The tensors the cell left alive, one line each."""
    alive = [t for t in d.tensors if t.alive]
    if not alive:
        return []
    lines = ["tensors the cell left alive:"]
    width = min(NAME_WIDTH, max(len(t.name or "(unnamed)") for t in alive))
    for t in alive:
        name = _short(t.name or "(unnamed)", width)
        lines.append(
            f"  {name:<{width}} {_shape(t):>14} {t.dtype or '':>9} {format_bytes(t.nbytes):>11}  {t.line or ''}"
        )
    return lines


def _freed_lines(d: DeviceReport) -> list[str]:
    lines: list[str] = []
    freed = [t for t in d.tensors if not t.alive]
    if freed:
        biggest = freed[0]
        lines.append(
            f"largest freed: {format_bytes(biggest.nbytes)} from {biggest.line or 'an unknown line'}"
        )
    return lines


def render_html(r: Report) -> str:
    """A compact, theme-aware table (JupyterLab CSS variables with plain fallbacks)."""
    esc = html.escape
    style = (
        "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px);"
        "border-collapse:collapse"
    )
    parts = [f'<div class="jp-gpumem-report"><strong>{esc(_title(r))}</strong>']
    if r.devices:
        parts.append(f'<table style="{style}"><thead><tr><th></th>')
        parts.extend(
            f'<th style="text-align:right;padding:0 .8em">{esc(d.device)} {esc(d.name)}</th>'
            for d in r.devices
        )
        parts.append("</tr></thead><tbody>")
        for label, key, signed in _rows(r):
            parts.append(f'<tr><td style="padding-right:1em">{esc(label.strip())}</td>')
            parts.extend(
                f'<td style="text-align:right;padding:0 .8em">{esc(format_bytes(getattr(d, key), signed=signed))}</td>'
                for d in r.devices
            )
            parts.append("</tr>")
        parts.append("</tbody></table>")
    if r.budget_bytes is not None and r.peak_allocated_bytes is not None:
        verdict = "over" if r.over_budget else "within"
        parts.append(
            f"<p>Budget {esc(format_bytes(r.budget_bytes))}: peak is {verdict} budget.</p>"
        )
    if r.main is not None and (details := _peak_lines(r.main)):
        parts.append(f'<pre style="margin:.4em 0">{esc(chr(10).join(details))}</pre>')
    if r.main is not None:
        parts.append(_alive_html(r.main, style))
        freed = _freed_lines(r.main)
        parts.extend(f'<pre style="margin:.4em 0">{esc(line)}</pre>' for line in freed)
    if r.timeline is not None and len(r.timeline.t_s) > 1:
        parts.append(_timeline_svg(r.timeline, r.name or ""))
    parts.extend(
        f'<p style="color:var(--jp-warn-color0,#e65100)">⚠ {esc(w)}</p>' for w in r.warnings
    )
    parts.extend(
        f"<p><strong>Leak:</strong> {_code_html(h.message)} <em>Fix:</em> {_code_html(h.fix)}</p>"
        for h in r.leak_hints
    )
    parts.extend(f"<p><em>{esc(n)}</em></p>" for n in r.shown_notes())
    parts.append("</div>")
    return "".join(parts)


def _alive_html(d: DeviceReport, style: str) -> str:
    """The tensors left alive as a table whose name column takes the room it needs."""
    alive = [t for t in d.tensors if t.alive]
    if not alive:
        return ""
    esc = html.escape
    cell = "padding:0 .8em 0 0;white-space:nowrap;text-align:left"
    num = f"{cell};text-align:right"
    heads = [("name", cell), ("shape", num), ("dtype", cell), ("size", num), ("line", cell)]
    rows = []
    for t in alive:
        name = t.name or "(unnamed)"
        values = [
            (esc(_short(name, HTML_NAME_WIDTH)), cell),
            (esc(_shape(t)), num),
            (esc(t.dtype or ""), cell),
            (esc(format_bytes(t.nbytes)), num),
            (esc(t.line or ""), cell),
        ]
        tds = "".join(f'<td style="{s}">{v}</td>' for v, s in values)
        rows.append(f'<tr title="{esc(name)}">{tds}</tr>')
    head = "".join(f'<th style="{s}">{h}</th>' for h, s in heads)
    return (
        '<div style="margin:.4em 0 .2em">Tensors the cell left alive:</div>'
        f'<table class="jp-gpumem-tensors" style="{style}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _timeline_svg(timeline: Timeline, title: str) -> str:
    from jupyter_gpumem.report.svg import timeline_svg

    return timeline_svg(timeline, title=title)
