"""The report as theme-aware HTML (JupyterLab CSS variables with plain fallbacks).

This is what front ends without the jupyter_gpumem renderer show, nbconvert's HTML included;
the timeline is the static SVG of :mod:`jupyter_gpumem.report.svg`.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from jupyter_gpumem.report.svg import timeline_svg
from jupyter_gpumem.report.text import (
    CODE,
    NO_CACHE,
    NO_CACHE_WHY,
    RANK_HEADS,
    breakdown_lines,
    cell,
    freed_lines,
    has_cache,
    module_name,
    no_cache_shown,
    peak_lines,
    rank_cells,
    rank_failures,
    rank_heading,
    rows,
    shape,
    short,
    title,
    warnings,
)
from jupyter_gpumem.units import format_bytes

if TYPE_CHECKING:
    from jupyter_gpumem.analysis.by_module import ModuleBytes
    from jupyter_gpumem.report.record import DeviceReport, Report

HTML_NAME_WIDTH = 120


def render_html(r: Report, *, timeline: bool = True) -> str:
    """A compact table, the tensors left alive, the timeline's SVG, warnings, hints and notes."""
    esc = html.escape
    style = (
        "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px);"
        "border-collapse:collapse"
    )
    parts = [f'<div class="jp-gpumem-report"><strong>{esc(title(r))}</strong>']
    if r.devices:
        parts.append(f'<table style="{style}"><thead><tr><th></th>')
        parts.extend(
            f'<th style="text-align:right;padding:0 .8em">{esc(d.device)} {esc(d.name)}</th>'
            for d in r.devices
        )
        parts.append("</tr></thead><tbody>")
        for label, key, signed in rows(r):
            parts.append(f'<tr><td style="padding-right:1em">{esc(label.strip())}</td>')
            parts.extend(_cell_html(cell(d, key, signed=signed)) for d in r.devices)
            parts.append("</tr>")
        parts.append("</tbody></table>")
        if no_cache_shown(r):
            parts.append(f"<div><small>{esc(NO_CACHE)}: {esc(NO_CACHE_WHY)}</small></div>")
    if r.budget_bytes is not None and r.peak_allocated_bytes is not None:
        verdict = "over" if r.over_budget else "within"
        parts.append(
            f"<p>Budget {esc(format_bytes(r.budget_bytes))}: peak is {verdict} budget.</p>"
        )
    if r.main is not None and (details := peak_lines(r.main)):
        parts.append(f'<pre style="margin:.4em 0">{esc(chr(10).join(details))}</pre>')
    if r.main is not None and r.main.module_tree is not None:
        parts.append(_modules_html(r.main.module_tree))
    if r.main is not None:
        parts.append(_alive_html(r.main, style))
        freed = freed_lines(r.main)
        parts.extend(f'<pre style="margin:.4em 0">{esc(line)}</pre>' for line in freed)
    if timeline and r.timeline is not None and len(r.timeline.t_s) > 1:
        cpu = r.main is not None and not has_cache(r.main)
        parts.append(
            timeline_svg(
                r.timeline, title=r.name or ("CPU tensor memory over the cell" if cpu else "")
            )
        )
    parts.append(_ranks_html(r, style))
    parts.extend(
        f'<p style="color:var(--jp-warn-color0,#e65100)">⚠ {esc(w)}</p>' for w in warnings(r)
    )
    parts.extend(
        f"<p><strong>Leak:</strong> {_code_html(h.message)} <em>Fix:</em> {_code_html(h.fix)}</p>"
        for h in r.leak_hints
    )
    parts.extend(f"<p><em>{esc(n)}</em></p>" for n in r.shown_notes())
    parts.append("</div>")
    return "".join(parts)


def _cell_html(text: str) -> str:
    """A figure of the device table; NO_CACHE says why in its tooltip."""
    why = f' title="{html.escape(NO_CACHE_WHY)}"' if text == NO_CACHE else ""
    return f'<td style="text-align:right;padding:0 .8em"{why}>{html.escape(text)}</td>'


def _code_html(text: str) -> str:
    """Hint text for HTML: escaped, code spans as <code>."""
    return CODE.sub(r"<code>\1</code>", html.escape(text))


def _modules_html(tree: ModuleBytes) -> str:
    """The peak by module as nested ``<details>``: the model open, its modules folded."""
    return f'<div class="jp-gpumem-modules" style="margin:.4em 0">At the peak, by module:{_module_html(tree, 0)}</div>'


def _module_html(m: ModuleBytes, depth: int) -> str:
    """One module of the tree with its children, ``depth`` levels below the model."""
    esc = html.escape
    parts = sorted(m.bytes.items(), key=lambda kv: -kv[1])
    kinds = ", ".join(f"{c.replace('_', ' ')} {format_bytes(n)}" for c, n in parts[:3])
    label = esc(m.path.rsplit(".", 1)[-1] if m.path else module_name(m.path))
    title = esc(module_name(m.path)) if m.path else ""  # the root's label says it all
    head = f"<code>{label}</code> {esc(format_bytes(m.total))} <small>({esc(kinds)})</small>"
    if not m.children:
        return f'<div style="margin-left:1.2em" title="{title}">{head}</div>'
    opened = " open" if depth == 0 else ""
    inner = "".join(_module_html(c, depth + 1) for c in m.children)
    return f'<details{opened} style="margin-left:{0 if depth == 0 else 1.2}em" title="{title}"><summary>{head}</summary>{inner}</details>'


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
            (esc(short(name, HTML_NAME_WIDTH)), cell),
            (esc(shape(t)), num),
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


def _ranks_html(r: Report, style: str) -> str:
    """The worker processes' table, the worst rank's row marked and in bold."""
    if not r.ranks:
        return ""
    esc = html.escape
    cell = "padding:0 .8em 0 0;white-space:nowrap;text-align:left"
    num = f"{cell};text-align:right"
    aligns = [num, num, cell, num, num, cell, cell]
    worst = r.worst_rank
    head = "".join(f'<th style="{a}">{h}</th>' for h, a in zip(RANK_HEADS, aligns, strict=True))
    body = []
    for rank in r.ranks:
        marked = rank is worst
        attrs = ' class="jp-gpumem-worst-rank" style="font-weight:bold"' if marked else ""
        tds = "".join(
            f'<td style="{a}">{esc(v)}{" ◀ worst" if marked and i == 0 else ""}</td>'
            for i, (v, a) in enumerate(zip(rank_cells(rank), aligns, strict=True))
        )
        body.append(f"<tr{attrs}>{tds}</tr>")
    parts = [
        f'<div style="margin:.6em 0 .2em">Ranks: {esc(rank_heading(r).replace(" (*)", ""))}</div>',
        f'<table class="jp-gpumem-ranks" style="{style}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>",
    ]
    if worst is not None and worst.main is not None and (details := breakdown_lines(worst.main)):
        details[0] = f"rank {worst.rank} {details[0]}"
        parts.append(f'<pre style="margin:.4em 0">{esc(chr(10).join(details))}</pre>')
    parts.extend(f"<p>{esc(line)}</p>" for line in rank_failures(r))
    return "".join(parts)
