"""The kernel side of per-rank reports: collect what the worker processes of a block wrote.

While a measured block runs, :class:`RankCollection` makes a rank folder, names it in the
environment (:data:`~jupyter_gpumem.tracking.ranks.RANKS_DIR_ENV`), and puts a
:class:`~jupyter_gpumem.tracking.ranks.RankWorker` in place of
``torch.multiprocessing.spawn._wrap`` and a subclass of its ``ProcessContext`` that notes
the processes ``start_processes`` starts, so that a worker that died without a report still
gets a row with its exit status. When the block ends, both are put back and the folder is
read as it is: nothing waits for a worker, so a job that hangs cannot hang the report.

``load_reports`` reads rank files written elsewhere (``jupyter_gpumem.record`` under
``torchrun``) into one multi-rank report.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from jupyter_gpumem.report.record import Report, report_from_dict
from jupyter_gpumem.tracking.ranks import (
    RANKS_DIR_ENV,
    RankMeasure,
    RankWorker,
    read_reports,
)

_ACTIVE: RankCollection | None = None  # one collection at a time: the outermost block's


class RankCollection:
    """``start()`` before a measured block, ``finish()`` after it; the ranks' reports."""

    def __init__(self, measure: RankMeasure, namespace: Mapping[str, Any] | None = None) -> None:
        self.measure = measure
        self.namespace: Mapping[str, Any] = namespace if namespace is not None else {}
        self.directory: str | None = None
        self._env_before: str | None = None
        self._spawn: Any = None
        self._patched: list[tuple[str, Any, Any]] = []  # (name, ours, the original)
        self._processes: list[tuple[int, Any]] = []  # (index, multiprocessing.Process)

    def start(self) -> bool:
        """Begin collecting; False (and nothing changed) when an outer block already collects."""
        global _ACTIVE
        if _ACTIVE is not None:
            return False
        # Named, not made: the first worker that writes makes it, so a cell that starts none
        # costs no file system call.
        self.directory = os.path.join(tempfile.gettempdir(), f"gpumem-ranks-{uuid.uuid4().hex}")
        self._env_before = os.environ.get(RANKS_DIR_ENV)
        os.environ[RANKS_DIR_ENV] = self.directory
        self._spawn = sys.modules.get("torch.multiprocessing.spawn")
        if self._spawn is not None:
            self._patch()
        _ACTIVE = self
        return True

    def _patch(self) -> None:
        spawn = self._spawn
        assert self.directory is not None
        wrap = spawn._wrap
        worker = RankWorker(self.directory, self.measure, original=wrap)
        self._patched.append(("_wrap", worker, wrap))
        spawn._wrap = worker
        base = spawn.ProcessContext
        noting = _noting_context(base)
        self._patched.append(("ProcessContext", noting, base))
        spawn.ProcessContext = noting

    def note(self, processes: Sequence[Any]) -> None:
        self._processes.extend(enumerate(processes))

    def finish(self) -> tuple[tuple[Report, ...], tuple[str, ...]]:
        """Put everything back, then read the folder: the ranks' reports and notes about them."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        for name, ours, original in reversed(self._patched):
            if getattr(self._spawn, name, None) is ours:  # the user's own patch stays
                setattr(self._spawn, name, original)
        self._patched.clear()
        if self._env_before is None:
            os.environ.pop(RANKS_DIR_ENV, None)
        else:
            os.environ[RANKS_DIR_ENV] = self._env_before
        if self.directory is None or not (self._processes or os.path.isdir(self.directory)):
            return (), ()
        written, problems = read_reports(self.directory)
        ranks, notes = _rows(written, self._processes)
        running = [r for r in ranks if r.status == "running"]
        if running:
            notes.append(
                f"{len(running)} worker(s) still ran when the cell ended; a report they write "
                f"later is in {self.directory} (jupyter_gpumem.load_reports"
                f"({str(Path(self.directory) / '*.json')!r}))"
            )
        else:
            shutil.rmtree(self.directory, ignore_errors=True)
        self._processes = []
        return ranks, (*problems, *notes)


@functools.cache
def _noting_context(base: type) -> type:
    """torch's ProcessContext, noting the processes it holds for the collecting block."""

    class ProcessContext(base):  # type: ignore[misc, valid-type]
        def __init__(self, processes: Sequence[Any], error_files: Sequence[Any]) -> None:
            super().__init__(processes, error_files)
            if _ACTIVE is not None:
                _ACTIVE.note(processes)

    ProcessContext.__qualname__ = base.__qualname__
    ProcessContext.__module__ = base.__module__
    ProcessContext.__doc__ = base.__doc__
    return ProcessContext


def _rows(
    written: Iterable[Mapping[str, Any]], processes: Sequence[tuple[int, Any]]
) -> tuple[tuple[Report, ...], list[str]]:
    """One report per worker: the one it wrote, else one that says how it ended."""
    notes: list[str] = []
    reports: list[Report] = []
    seen: set[int] = set()
    for data in written:
        try:
            report = report_from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            notes.append(f"a rank report could not be read: {exc!r}")
            continue
        reports.append(report)
        if report.pid is not None:
            seen.add(report.pid)
    for index, process in processes:
        pid = getattr(process, "pid", None)
        if pid is None or pid in seen:
            continue
        seen.add(pid)
        reports.append(_silent(index, pid, _exitcode(process)))
    reports.sort(key=lambda r: (r.rank if r.rank is not None else -1, r.started_at))
    return tuple(reports), notes


def _exitcode(process: Any) -> int | None:
    """The process's exit code without waiting (None while it runs)."""
    try:
        return process.exitcode  # type: ignore[no-any-return]  # polls, never blocks
    except (ValueError, OSError):  # closed, or reaped elsewhere
        return None


def _silent(rank: int, pid: int, exitcode: int | None) -> Report:
    """The row of a worker that wrote no report: how it ended, as far as the kernel knows."""
    if exitcode is None:
        status, how = "running", "still running when the cell ended"
    elif exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        status = "error"
        how = f"killed by {name}"
        if name == "SIGKILL":
            how += " (the system's out-of-memory killer sends it)"
        elif name == "SIGTERM":
            how += " (start_processes stops the other ranks when one fails)"
    else:
        status, how = "error", f"exited with code {exitcode}"
    return Report(
        id=uuid.uuid4().hex,
        name=f"rank {rank}",
        execution_count=None,
        started_at=time.time(),
        wall_s=0.0,
        status=status,
        error=f"no report: {how}",
        cuda_available=False,
        source="none",
        budget_bytes=None,
        rank=rank,
        pid=pid,
    )


def inherited_namespace() -> Mapping[str, Any]:
    """In a forked worker, the namespace of the block that started it; else an empty one."""
    return _ACTIVE.namespace if _ACTIVE is not None else {}


def with_ranks(report: Report, ranks: Sequence[Report], notes: Sequence[str]) -> Report:
    """``report`` with the ranks' reports, and notes about them after its own.

    A block that raised because a rank ran out of memory has status "oom", as that rank.
    """
    if not ranks and not notes:
        return report
    status = report.status
    if status == "error" and any(r.status == "oom" for r in ranks):
        status = "oom"
    return replace(report, status=status, ranks=tuple(ranks), notes=(*report.notes, *notes))


# -- files written outside the notebook --------------------------------------------------
def rank_path(path: str | os.PathLike[str], rank: int) -> Path:
    """``run.json`` -> ``run.rank3.json``: each rank's own file."""
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}{p.suffix or '.json'}")


def current_rank() -> int:
    """This process's rank: torch.distributed's when it is up, else torchrun's ``RANK``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0"))


def load_reports(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Report:
    """One multi-rank report from rank files: a path, a glob, a folder, or a list of those.

    ``run.json`` also finds the ``run.rank<N>.json`` files that ``record("run.json")`` wrote.
    """
    files = _files(paths)
    if not files:
        raise FileNotFoundError(
            f"no report files at {paths!r}: give a file, a glob such as 'run.rank*.json', "
            "or a folder of rank files"
        )
    ranks: list[Report] = []
    for n, file in enumerate(files):
        try:
            report = report_from_dict(_read_json(file))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{file} is not a jupyter_gpumem report: {exc}") from exc
        if report.rank is None:
            report = replace(report, rank=n)
        ranks.append(report)
    ranks.sort(key=lambda r: (r.rank, r.started_at))
    status = "ok"
    for r in ranks:
        if r.status == "oom" or (r.status != "ok" and status == "ok"):
            status = r.status
    names = {re.sub(r"\.rank\d+$", "", Path(f).stem) for f in files}
    name = names.pop() if len(names) == 1 else None
    return Report(
        id=uuid.uuid4().hex,
        name=name,
        execution_count=None,
        started_at=min(r.started_at for r in ranks),
        wall_s=max(r.wall_s for r in ranks),
        status=status,
        error=None,
        cuda_available=any(r.cuda_available for r in ranks),
        source="none",
        budget_bytes=None,
        ranks=tuple(ranks),
    )


def _files(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    found: list[str] = []
    for item in items:
        text = os.fspath(item)
        p = Path(text)
        if p.is_dir():
            found.extend(sorted(str(f) for f in p.glob("*.json")))
        elif p.is_file():
            found.append(text)
        elif glob.has_magic(text):
            found.extend(sorted(glob.glob(text)))
        else:
            found.extend(sorted(glob.glob(str(rank_path(p, 0)).replace(".rank0", ".rank*"))))
    return list(dict.fromkeys(found))


def _read_json(path: str) -> Mapping[str, Any]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError("it holds no JSON object")
    return data
