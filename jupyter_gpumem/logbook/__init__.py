"""This kernel's `%%gpumem` reports: kept in order (``store``), shown as tables (``table``)."""

from jupyter_gpumem.logbook.store import (
    CELLS_KEPT,
    DEFAULT_LIMIT,
    clear,
    dropped,
    earlier_runs,
    keep,
    limit,
    recorded,
    reports,
    set_limit,
    since,
)
from jupyter_gpumem.logbook.table import (
    COLUMNS,
    EMPTY,
    HistoryRow,
    HistorySummary,
    summary,
    to_dataframe,
)

__all__ = [
    "CELLS_KEPT",
    "COLUMNS",
    "DEFAULT_LIMIT",
    "EMPTY",
    "HistoryRow",
    "HistorySummary",
    "clear",
    "dropped",
    "earlier_runs",
    "keep",
    "limit",
    "recorded",
    "reports",
    "set_limit",
    "since",
    "summary",
    "to_dataframe",
]
