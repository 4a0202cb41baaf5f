"""The kept reports as tables: `jupyter_gpumem.history()` and `%gpumem history`."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.logbook.store import reports
from jupyter_gpumem.units import format_bytes, format_seconds

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = (
    "id", "name", "execution_count", "started_at", "wall_s", "status", "source", "device",
    "peak_allocated_bytes", "peak_reserved_bytes", "allocated_before_bytes",
    "allocated_after_bytes", "allocated_delta_bytes", "cache_bytes", "nvml_process_bytes",
    "non_torch_bytes", "budget_bytes", "device_name", "peak_phase",
)  # fmt: skip


def to_dataframe() -> pd.DataFrame:
    """One row per cell and device; a cell without CUDA gives one row with empty numbers."""
    import pandas as pd

    rows = []
    for r in reports():
        base = {
            "id": r.id, "name": r.name, "execution_count": r.execution_count,
            "started_at": r.started_at, "wall_s": r.wall_s, "status": r.status,
            "budget_bytes": r.budget_bytes,
        }  # fmt: skip
        if not r.devices:
            rows.append({**base, "source": r.source})
        for d in r.devices:
            numbers = {k: getattr(d, k) for k in COLUMNS if k not in base and hasattr(d, k)}
            rows.append({**base, **numbers, "device_name": d.name, "peak_phase": d.peak_phase})
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["started_at"] = pd.to_datetime(frame["started_at"], unit="s")
    return frame


@dataclass(frozen=True)
class HistoryRow:
    """One cell's main figures for `%gpumem history`: plain numbers, formatted when shown."""

    execution_count: int | None
    name: str | None
    status: str
    device: str | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    peak_phase: str | None
    peak_step: int | None
    wall_s: float


@dataclass(frozen=True)
class HistorySummary:
    """`%gpumem history`: one short row per report, as text and as an HTML table.

    `jupyter_gpumem.history()` gives every number (one row per device) as a DataFrame.
    """

    rows: tuple[HistoryRow, ...]

    def table(self) -> tuple[list[str], list[list[str]]]:
        """Column titles and formatted cells; status and device appear only when they vary."""
        columns = ["#", "name", "peak", "reserved", "peak at", "wall"]
        cells = [
            [
                "" if r.execution_count is None else str(r.execution_count),
                r.name or "",
                format_bytes(r.peak_allocated_bytes) if r.device else "",
                format_bytes(r.peak_reserved_bytes) if r.device else "",
                _phase(r),
                format_seconds(r.wall_s),
            ]
            for r in self.rows
        ]
        if any(r.status != "ok" for r in self.rows):
            columns.insert(2, "status")
            for row, r in zip(cells, self.rows, strict=True):
                row.insert(2, r.status)
        if len({r.device for r in self.rows}) > 1:
            columns.insert(columns.index("peak"), "device")
            for row, r in zip(cells, self.rows, strict=True):
                row.insert(columns.index("device"), r.device or "")
        return columns, cells

    def __str__(self) -> str:
        if not self.rows:
            return EMPTY
        columns, cells = self.table()
        widths = [max(len(c) for c in column) for column in zip(columns, *cells, strict=True)]
        lines = []
        for row in [columns, *cells]:
            shown = [
                c.rjust(w) if title in _NUMERIC else c.ljust(w)
                for title, c, w in zip(columns, row, widths, strict=True)
            ]
            lines.append("  ".join(shown).rstrip())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        if not self.rows:
            return f"<p><em>{esc(EMPTY)}</em></p>"
        columns, cells = self.table()

        def cell(tag: str, title: str, text: str) -> str:
            align = "right" if title in _NUMERIC else "left"
            style = f"text-align:{align};padding:0 .7em;white-space:nowrap"
            return f'<{tag} style="{style}">{esc(text)}</{tag}>'

        head = "".join(cell("th", c, c) for c in columns)
        body = "".join(
            "<tr>" + "".join(cell("td", t, c) for t, c in zip(columns, row, strict=True)) + "</tr>"
            for row in cells
        )
        style = (
            "font-family:var(--jp-code-font-family,monospace);"
            "font-size:var(--jp-code-font-size,12px);border-collapse:collapse"
        )
        return (
            f'<table class="jp-gpumem-history" style="{style}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": str(self), "text/html": self._repr_html_()}

    def __repr__(self) -> str:
        return str(self)


EMPTY = "No %%gpumem reports in this kernel yet."
_NUMERIC = frozenset({"#", "peak", "reserved", "wall"})


def _phase(r: HistoryRow) -> str:
    if r.peak_phase is None:
        return ""
    return r.peak_phase + (f", step {r.peak_step}" if r.peak_step is not None else "")


def summary() -> HistorySummary:
    """The reports so far, one short row each (the main device's figures), oldest first."""
    rows = []
    for r in reports():
        main = r.main
        rows.append(
            HistoryRow(
                execution_count=r.execution_count,
                name=r.name,
                status=r.status,
                device=main.device if main else None,
                peak_allocated_bytes=main.peak_allocated_bytes if main else None,
                peak_reserved_bytes=main.peak_reserved_bytes if main else None,
                peak_phase=main.peak_phase if main else None,
                peak_step=main.peak_step if main else None,
                wall_s=r.wall_s,
            )
        )
    return HistorySummary(tuple(rows))
