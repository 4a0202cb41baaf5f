"""The tuner's per-block toggles, each beside a bar of the block's activations at the peak.

One row per block: a checkbox that picks the block for checkpointing, kept in step with the
panel's module list, and a bar of the block's activation bytes at the peak of the latest
measured run, scaled to the largest block, so that what checkpointing a block would free is
read off beside the switch that does it. The figures come in as ``{block: bytes}``; before
any run the bars are empty and say so. A block that the run checkpointed gets a hatched, empty
track labelled "checkpointed": its activations were recomputed, not kept, and a bar of "0 B"
would read as a block that holds nothing. Units are spelled through `jupyter_gpumem.units`.
"""

from __future__ import annotations

import html
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from jupyter_gpumem.units import format_bytes

__all__ = ["CHECKPOINTED", "BlockBars", "bar_html", "checkpointed_html"]

UNMEASURED = "activations at the peak: run to measure"
CHECKPOINTED = "checkpointed"
_TRACK = "flex:0 0 7em;height:.75em"
_FIGURE = "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px)"
_ROW = "display:flex;align-items:center;gap:.5em;white-space:nowrap"


def bar_html(nbytes: int, top: int, colour: str) -> str:
    """A bar ``nbytes / top`` of its track, then the figure; theme-aware colours."""
    share = nbytes / top if top > 0 else 0.0
    track = f"{_TRACK};background:var(--jp-layout-color3,#ddd)"
    return (
        f'<div class="jp-gpumem-block-bar" style="{_ROW}">'
        f'<div style="{track}"><div style="width:{100 * share:.1f}%;height:100%;'
        f'background:{html.escape(colour)}"></div></div>'
        f'<span style="{_FIGURE}">{html.escape(format_bytes(nbytes))}</span></div>'
    )


def checkpointed_html(colour: str) -> str:
    """An empty track hatched in ``colour`` and the word "checkpointed": nothing kept."""
    esc = html.escape(colour)
    hatch = f"repeating-linear-gradient(135deg,{esc} 0 1px,transparent 1px 5px)"
    track = f"{_TRACK};box-sizing:border-box;border:1px solid {esc};background:{hatch};opacity:.7"
    return (
        f'<div class="jp-gpumem-block-bar jp-gpumem-checkpointed" style="{_ROW}">'
        f'<div style="{track}"></div><span style="{_FIGURE}">{CHECKPOINTED}</span></div>'
    )


class BlockBars:
    """A checkbox and a bar per block; ``widget`` holds them under a caption."""

    def __init__(self, names: Sequence[str], colour: str) -> None:
        self.names = tuple(names)
        self.colour = colour
        self.figures: dict[str, int] = {}  # what the bars show; empty before a run
        self.checkpointed: frozenset[str] = frozenset()  # drawn hatched, "checkpointed"
        self.toggles = {
            n: widgets.Checkbox(
                description=n, indent=False, layout=widgets.Layout(width="50%", min_width="8em")
            )
            for n in self.names
        }
        self.bars = {n: widgets.HTML(layout=widgets.Layout(width="50%")) for n in self.names}
        self.caption = widgets.HTML()
        rows = widgets.VBox(
            [widgets.HBox([self.toggles[n], self.bars[n]]) for n in self.names],
            layout=widgets.Layout(max_height="190px", overflow="auto"),
        )
        self.widget = widgets.VBox(
            [self.caption, rows], layout=widgets.Layout(width="36%", min_width="280px")
        )
        self.update({})

    def update(
        self,
        figures: Mapping[str, int],
        source: str | None = None,
        checkpointed: Collection[str] = (),
    ) -> None:
        """Show ``{block: bytes}`` of the run ``source`` names, the blocks it checkpointed
        hatched; nothing when empty."""
        self.figures = {n: int(figures[n]) for n in self.names if n in figures}
        self.checkpointed = frozenset(n for n in self.names if n in checkpointed)
        if not self.figures:
            self.caption.value = f"<em>{html.escape(UNMEASURED)}</em>"
            for bar in self.bars.values():
                bar.value = ""
            return
        kept = [n for n, b in self.figures.items() if n not in self.checkpointed]
        top = max((self.figures[n] for n in kept), default=0)
        of = f" of {html.escape(source)}" if source else ""
        self.caption.value = f"activations at the peak{of}"
        for name, bar in self.bars.items():
            found = self.figures.get(name)
            if name in self.checkpointed:
                bar.value = checkpointed_html(self.colour)
            else:
                bar.value = "" if found is None else bar_html(found, top, self.colour)

    def follow(self, select: widgets.SelectMultiple) -> None:
        """Keep the checkboxes and ``select``'s value (the picked modules) in step."""

        def from_select(change: dict[str, Any]) -> None:
            picked = set(change["new"])
            for name, box in self.toggles.items():
                box.value = name in picked

        def from_toggle(name: str) -> Any:
            def toggled(change: dict[str, Any]) -> None:
                if (name in select.value) == change["new"]:
                    return  # the echo of a change made in the list
                picked = set(select.value) ^ {name}
                values = [o[1] if isinstance(o, tuple) else o for o in select.options]
                select.value = tuple(v for v in values if v in picked)

            return toggled

        select.observe(from_select, names="value")
        for name, box in self.toggles.items():
            box.observe(from_toggle(name), names="value")
