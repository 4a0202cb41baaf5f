"""Every report of this kernel, in the order the cells ran, and the recent runs of each cell."""

from __future__ import annotations

from collections import OrderedDict, deque

from jupyter_gpumem.report.record import Report

DEFAULT_LIMIT = 200  # reports kept; older ones are dropped, oldest first
RUNS_KEPT = 32  # allocated-after figures kept per cell and device, for growth across re-runs
CELLS_KEPT = 256  # cells whose runs are kept, the most recently run first

_REPORTS: deque[Report] = deque()
_RUNS: OrderedDict[tuple[str, str], deque[int]] = OrderedDict()
_state = {"limit": DEFAULT_LIMIT, "recorded": 0, "dropped": 0}


def keep(report: Report) -> str | None:
    """Keep ``report``; returns a note the first time the limit drops an older one."""
    _REPORTS.append(report)
    _state["recorded"] += 1
    if report.cell_key is not None:
        for d in report.devices:
            key = (report.cell_key, d.device)
            runs = _RUNS.pop(key, None) or deque(maxlen=RUNS_KEPT)
            runs.append(d.allocated_after_bytes)
            _RUNS[key] = runs  # the most recent last
            if len(_RUNS) > CELLS_KEPT:
                _RUNS.popitem(last=False)
    first_drop = _state["dropped"] == 0
    while len(_REPORTS) > _state["limit"]:
        _REPORTS.popleft()
        _state["dropped"] += 1
    if first_drop and _state["dropped"]:
        return (
            f"jupyter_gpumem keeps the last {_state['limit']} reports of this kernel and dropped "
            "the oldest; jupyter_gpumem.set_history_limit(n) keeps more"
        )
    return None


def reports() -> list[Report]:
    """A copy of the reports kept so far, oldest first."""
    return list(_REPORTS)


def recorded() -> int:
    """How many reports this kernel has made, kept or dropped."""
    return _state["recorded"]


def since(count: int) -> list[Report]:
    """The reports made after the first ``count`` (see :func:`recorded`) that are still kept."""
    new = _state["recorded"] - count
    return list(_REPORTS)[-new:] if new > 0 else []


def earlier_runs(cell_key: str, device: str) -> list[int]:
    """Allocated-after bytes of the recent runs of one cell on one device, oldest first."""
    return list(_RUNS.get((cell_key, device), ()))


def set_limit(limit: int) -> None:
    """Keep at most ``limit`` reports (at least 1); the oldest go first."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(
            f"the history limit is a whole number of reports, at least 1; got {limit!r}"
        )
    _state["limit"] = limit
    while len(_REPORTS) > limit:
        _REPORTS.popleft()
        _state["dropped"] += 1


def limit() -> int:
    return _state["limit"]


def dropped() -> int:
    """How many reports the limit has dropped so far."""
    return _state["dropped"]


def clear() -> None:
    _REPORTS.clear()
    _RUNS.clear()
    _state.update(recorded=0, dropped=0)
