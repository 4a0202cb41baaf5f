"""The cell timeline as a static SVG: the picture inside the report's HTML, with no widgets.

Allocated and reserved memory over the cell's run, the forward/backward/optimizer phases as
translucent bands, and the peak as a point whose label sits above the plot area, joined to it
by a leader. Reserved memory is drawn only where it differs from allocated (on the CPU the two
are one series). The y unit (GiB or MiB) is chosen from the largest value; colours are mid-tone
so they read on light and dark themes. :mod:`jupyter_gpumem.widgets.charts` draws the same chart
with bqplot from these colours and helpers.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from jupyter_gpumem.analysis.timeline import PHASES, PhaseBand, Timeline
from jupyter_gpumem.units import format_bytes, format_seconds

__all__ = ["PHASE_COLORS", "SERIES_COLORS", "timeline_svg"]
SERIES_COLORS = {"allocated": "#4e79a7", "reserved": "#f28e2b", "peak": "#e15759"}
PHASE_COLORS = {
    "forward": "#59a14f",
    "backward": "#b07aa1",
    "optimizer": "#edc948",
    "prefill": "#4e79a7",
    "decode": "#76b7b2",
    "other": "#9c9c9c",
}
BAND_OPACITY = 0.18
LEGEND_TEXT = "var(--jp-ui-font-color1, #444)"  # the theme's text colour, not the mark's
HEADROOM = 1.08  # the y axis ends a little above the largest value
# bqplot clips marks to the plot area, so the figure's peak label sits inside it, in a strip
# above the largest value: the y axis ends that much higher, the leader stops short of it.
FIGURE_HEADROOM, LEADER_TOP = 1.3, 0.88
GiB, MiB = 2**30, 2**20


def _unit(top_bytes: int) -> tuple[str, int]:
    """GiB from 1 GiB up, else MiB."""
    return ("GiB", GiB) if top_bytes >= GiB else ("MiB", MiB)


def _top_bytes(tl: Timeline) -> int:
    return max((*tl.allocated_bytes, *tl.reserved_bytes, tl.peak_bytes, 0))


def _end_s(tl: Timeline) -> float:
    return max((*tl.t_s, *(b.end_s for b in tl.bands), tl.peak_t_s, 0.0))


def _by_phase(bands: Sequence[PhaseBand]) -> dict[str, list[PhaseBand]]:
    """Bands grouped by phase, known phases first in PHASES order; unknown ones as "other"."""
    grouped: dict[str, list[PhaseBand]] = {}
    for band in sorted(bands, key=lambda b: b.start_s):
        phase = band.phase if band.phase in PHASE_COLORS else "other"
        grouped.setdefault(phase, []).append(band)
    return {p: grouped[p] for p in PHASES if p in grouped}


def _series(tl: Timeline) -> list[tuple[str, tuple[int, ...]]]:
    """The series worth drawing, back to front: reserved only when it is not allocated again."""
    out: list[tuple[str, tuple[int, ...]]] = []
    if tl.reserved_bytes and tuple(tl.reserved_bytes) != tuple(tl.allocated_bytes):
        out.append(("reserved", tuple(tl.reserved_bytes)))
    if tl.allocated_bytes:
        out.append(("allocated", tuple(tl.allocated_bytes)))
    return out


def _peak_text(tl: Timeline) -> str:
    return f"peak {format_bytes(tl.peak_bytes)} at {format_seconds(tl.peak_t_s)}"


def _align(fraction: float) -> str:
    """Text anchor for a label at ``fraction`` of the width, so that it stays inside."""
    return "start" if fraction < 0.3 else "end" if fraction > 0.7 else "middle"


# -- static SVG ---------------------------------------------------------------------------
def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(v: float) -> str:
    return f"{v:.1f}"


def timeline_svg(tl: Timeline, width: int = 640, height: int = 180, *, title: str = "") -> str:
    """The same chart as a self-contained inline SVG string (no scripts, all text escaped)."""
    if width < 160 or height < 80:
        raise ValueError(f"the SVG needs width >= 160 and height >= 80, got {width}x{height}")
    left, right, bottom, legend, peak_row = 56, 10, 20, 16, 14
    x0, x1, y0, y1 = left, width - right, 4 + legend + peak_row, height - bottom
    end_s = _end_s(tl) or 1.0
    top = _top_bytes(tl) * HEADROOM or 1.0

    def px(t: float) -> float:
        return x0 + (x1 - x0) * t / end_s

    def py(b: float) -> float:
        return y1 - (y1 - y0) * b / top

    label = title or "GPU memory over the cell"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="jp-gpumem-timeline" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{_esc(label)}" '
        'style="font:10px var(--jp-ui-font-family,sans-serif);color:inherit">',
        f"<title>{_esc(label)}: {_esc(_peak_text(tl))}</title>",
    ]
    phases = _by_phase(tl.bands)
    for phase, bands in phases.items():
        for b in bands:
            out.append(
                f'<rect class="band" data-phase="{_esc(phase)}" x="{_num(px(b.start_s))}" '
                f'y="{_num(y0)}" width="{_num(px(b.end_s) - px(b.start_s))}" '
                f'height="{_num(y1 - y0)}" fill="{PHASE_COLORS[phase]}" '
                f'fill-opacity="{BAND_OPACITY}"><title>{_esc(b.phase)}, step {b.step}</title></rect>'
            )
    axis = 'stroke="currentColor" stroke-opacity="0.45" fill="none"'
    out.append(f'<path class="axis" d="M{x0},{y0} V{y1} H{x1}" {axis}/>')
    ticks: list[tuple[float, float, str, str]] = [
        (x0 - 4, y1, "end", "0"),
        (x0, y1 + 13, "start", "0 s"),
        (x1, y1 + 13, "end", format_seconds(end_s)),
    ]
    if _top_bytes(tl):
        ticks.append((x0 - 4, py(_top_bytes(tl)) + 3, "end", format_bytes(_top_bytes(tl))))
    out += [
        f'<text x="{_num(x)}" y="{_num(y)}" text-anchor="{a}" fill="currentColor">{_esc(s)}</text>'
        for x, y, a, s in ticks
    ]
    drawn = _series(tl)
    for series, values in drawn:
        dash = ' stroke-dasharray="4 3"' if series == "reserved" else ""
        points = " L".join(
            f"{_num(px(t))},{_num(py(v))}" for t, v in zip(tl.t_s, values, strict=False)
        )
        out.append(
            f'<path class="series" data-series="{series}" d="M{points}" fill="none" '
            f'stroke="{SERIES_COLORS[series]}" stroke-width="1.5"{dash}/>'
        )
    if tl.t_s:
        cx, cy = px(tl.peak_t_s), py(tl.peak_bytes)
        anchor = _align((cx - x0) / (x1 - x0))
        color = SERIES_COLORS["peak"]
        # The label has its own row above the plot area; a dotted leader drops to the point.
        out.append(
            f'<path class="peak-leader" d="M{_num(cx)},{_num(y0 - 3)} V{_num(cy - 3.5)}" '
            f'stroke="{color}" stroke-width="1" stroke-dasharray="1 2" fill="none"/>'
        )
        out.append(
            f'<circle class="peak" cx="{_num(cx)}" cy="{_num(cy)}" r="3.5" fill="{color}">'
            f"<title>{_esc(_peak_text(tl))}</title></circle>"
        )
        out.append(
            f'<text class="peak-label" x="{_num(cx)}" y="{_num(y0 - 5)}" '
            f'text-anchor="{anchor}" fill="{color}">{_esc(_peak_text(tl))}</text>'
        )
    shown = dict(drawn)
    legend_items: list[tuple[str, str]] = [
        (s, SERIES_COLORS[s]) for s in ("allocated", "reserved") if s in shown
    ]
    legend_items += [(p, PHASE_COLORS[p]) for p in phases]
    x = float(x0)
    for name, color in legend_items:
        out.append(
            f'<rect x="{_num(x)}" y="4" width="10" height="10" fill="{color}"/>'
            f'<text x="{_num(x + 13)}" y="13" fill="currentColor">{_esc(name)}</text>'
        )
        x += 13 + 6.5 * len(name) + 12
    out.append("</svg>")
    return "".join(out)
