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
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jupyter_gpumem.report.record import SCHEMA, Report, report_from_dict
from jupyter_gpumem.tracking.ranks import (
    RANKS_DIR_ENV,
    RankMeasure,
    RankWorker,
    read_reports,
)
from jupyter_gpumem.units import echoed
from jupyter_gpumem.workers.rank_balance import rank_notes

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
        """Put everything back, then read the folder: the ranks' reports and notes about them.

        Safe to call again, and after a ``start`` that was cut short or found an outer block.
        """
        global _ACTIVE
        if self.directory is None:  # never started: nothing of ours to put back
            return (), ()
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
            check_report(data)
            report = report_from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            notes.append(f"a rank report could not be read: {exc}")
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
    compared = rank_notes(ranks)
    return replace(
        report, status=status, ranks=tuple(ranks), notes=(*report.notes, *notes, *compared)
    )


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
    given = os.environ.get("RANK", "0")
    if not given.strip().isdigit():
        raise ValueError(
            f"the RANK environment variable is {given[:40]!r}: torchrun sets it to the process's "
            "rank, a whole number (0, 1, ...); unset it or set it to one"
        )
    return int(given)


def load_reports(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Report:
    """One multi-rank report from rank files: a path, a glob, a folder, or a list of those.

    ``run.json`` also finds the ``run.rank<N>.json`` files that ``record("run.json")`` wrote.
    A file named outright must be a report (ValueError naming the file and the field
    otherwise); a file found through a folder, a glob or ``run.json`` that is not one is
    skipped with a warning that says why, so one broken rank does not hide the others.
    """
    files = _files(paths)
    if not files:
        raise FileNotFoundError(
            f"no report files at {echoed(paths)}: give a file, a glob such as 'run.rank*.json', "
            "or a folder of rank files"
        )
    ranks: list[Report] = []
    skipped: list[str] = []
    for n, (file, named) in enumerate(files):
        try:
            report = read_report(file)
        except ValueError as exc:
            if named:
                raise
            skipped.append(f"skipped {exc}")
            warnings.warn(skipped[-1], stacklevel=3)  # through jupyter_gpumem.load_reports
            continue
        if report.rank is None:
            report = replace(report, rank=n)
        ranks.append(report)
    if not ranks:
        raise ValueError(
            f"none of the {len(files)} file(s) at {echoed(paths)} is a jupyter_gpumem report: "
            + "; ".join(skipped[:3])
            + ("; ..." if len(skipped) > 3 else "")
        )
    ranks.sort(key=lambda r: (r.rank, r.started_at))
    status = "ok"
    for r in ranks:
        if r.status == "oom" or (r.status != "ok" and status == "ok"):
            status = r.status
    names = {re.sub(r"\.rank\d+$", "", Path(f).stem) for f, _ in files}
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
        notes=(*skipped, *rank_notes(ranks)),
        ranks=tuple(ranks),
    )


def read_report(path: str | os.PathLike[str]) -> Report:
    """The report in one file; ValueError naming the file and what is wrong with it."""
    name = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{name} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not a report: it is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"{name} is not a report: its JSON nests too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{name} is not a report: it is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name} is not a report: it holds {_got(data)}, not a JSON object")
    try:
        check_report(data)
        return report_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:  # the last two: what the check missed
        raise ValueError(f"{name}: {exc}") from None


def _files(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> list[tuple[str, bool]]:
    """The files to read, each with whether it was named outright (not found by a pattern)."""
    allowed = "load_reports takes a path, a glob, a folder, or a list of those"
    if isinstance(paths, (str, os.PathLike)):
        items: list[Any] = [paths]
    elif isinstance(paths, Iterable):
        items = list(paths)
    else:
        raise TypeError(f"{allowed}; got {type(paths).__name__} {echoed(paths)}")
    found: dict[str, bool] = {}
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"{allowed}; got {type(item).__name__} {echoed(item)} among them")
        text = os.fspath(item)
        if "\0" in os.fsdecode(text):
            raise ValueError(
                f"{allowed}, and a path holds no NUL byte ('\\x00'); got {echoed(text)}"
            )
        p = Path(text)
        if p.is_dir():
            matches = sorted(str(f) for f in p.glob("*.json"))
        elif p.is_file():
            found[text] = True
            continue
        elif glob.has_magic(text):
            matches = sorted(glob.glob(text))
        else:
            matches = sorted(glob.glob(str(rank_path(p, 0)).replace(".rank0", ".rank*")))
        for match in matches:
            found.setdefault(match, False)
    return list(found.items())


# -- what a report file may hold ------------------------------------------------------------
MAX_RANK_DEPTH = 2  # a cell's workers, and the workers one of them started
MAX_MODULE_DEPTH = 64  # module paths nest a few levels; a deeper tree is not a model's


@dataclass(frozen=True)
class _Value:
    """A leaf of the wire format: a test and the words that say what passes it."""

    test: Callable[[Any], bool]
    allowed: str
    optional: bool = False  # null allowed

    def opt(self) -> _Value:
        return _Value(self.test, f"{self.allowed} or null", optional=True)


@dataclass(frozen=True)
class _List:
    item: Any  # a _Value, an _Object or a _Map
    optional: bool = False


@dataclass(frozen=True)
class _Map:
    value: _Value  # string keys
    optional: bool = False


@dataclass(frozen=True)
class _Object:
    what: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    required: frozenset[str] = frozenset()
    optional: bool = False
    nests: str | None = None  # the field that holds more of this object, depth-bounded
    max_depth: int = 0


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


_STR = _Value(lambda v: isinstance(v, str), "a string")
_INT = _Value(_is_int, "a whole number")
_BYTES = _Value(lambda v: _is_int(v) and v >= 0, "a whole number of bytes (0 or more)")
_INDEX = _Value(lambda v: _is_int(v) and v >= 0, "a whole number, 0 or more")
_NUMBER = _Value(_is_number, "a finite number")
_SECONDS = _Value(lambda v: _is_number(v) and v >= 0, "a finite number of seconds (0 or more)")
_BOOL = _Value(lambda v: isinstance(v, bool), "true or false")
STATUSES = ("ok", "error", "oom", "running")
_STATUS = _Value(lambda v: v in STATUSES, "one of " + ", ".join(map(repr, STATUSES)))
_SCHEMA = _Value(lambda v: _is_int(v) and 1 <= v <= SCHEMA, f"a whole number from 1 to {SCHEMA}")

_TENSOR = _Object(
    "a tensor",
    {"name": _STR.opt(), "shape": _List(_INDEX, optional=True), "dtype": _STR.opt(),
     "nbytes": _BYTES, "device": _STR, "line": _STR.opt(), "alive": _BOOL},
    frozenset({"nbytes", "device", "alive"}),
)  # fmt: skip
_BAND = _Object(
    "a phase band",
    {"start_s": _NUMBER, "end_s": _NUMBER, "phase": _STR, "step": _INT},
    frozenset({"start_s", "end_s", "phase", "step"}),
)
_TIMELINE = _Object(
    "a timeline",
    {"t_s": _List(_NUMBER), "allocated_bytes": _List(_BYTES), "reserved_bytes": _List(_BYTES),
     "bands": _List(_BAND), "peak_t_s": _NUMBER, "peak_bytes": _BYTES},
    frozenset({"t_s", "allocated_bytes", "reserved_bytes", "bands", "peak_t_s", "peak_bytes"}),
    optional=True,
)  # fmt: skip
_OOM = _Object(
    "an out-of-memory record",
    {"requested_bytes": _BYTES, "breakdown": _Map(_BYTES), "dominant": _STR, "advice": _STR,
     "largest": _List(_TENSOR)},
    frozenset({"requested_bytes", "breakdown", "dominant", "advice", "largest"}),
    optional=True,
)  # fmt: skip
_MODULE = _Object(
    "a module tree",
    {"path": _STR, "bytes": _Map(_BYTES)},
    optional=True,
    nests="children",
    max_depth=MAX_MODULE_DEPTH,
)
_DEVICE = _Object(
    "a device",
    {"device": _STR, "index": _INT, "name": _STR, "total_bytes": _BYTES.opt(),
     "allocated_before_bytes": _BYTES, "allocated_after_bytes": _BYTES,
     "allocated_delta_bytes": _INT, "peak_allocated_bytes": _BYTES, "peak_reserved_bytes": _BYTES,
     "reserved_after_bytes": _BYTES, "cache_bytes": _INT, "nvml_process_bytes": _BYTES.opt(),
     "non_torch_bytes": _BYTES.opt(), "source": _STR, "breakdown": _Map(_INT, optional=True),
     "peak_phase": _STR.opt(), "peak_step": _INT.opt(), "timeline": _TIMELINE,
     "tensors": _List(_TENSOR), "oom": _OOM, "module_tree": _MODULE},
    frozenset({"device", "index", "name", "total_bytes", "allocated_before_bytes",
               "allocated_after_bytes", "allocated_delta_bytes", "peak_allocated_bytes",
               "peak_reserved_bytes", "reserved_after_bytes", "cache_bytes",
               "nvml_process_bytes", "non_torch_bytes", "source"}),
)  # fmt: skip
_HINT = _Object(
    "a leak hint",
    {"kind": _STR, "bytes": _BYTES, "template": _STR, "fix": _STR, "where": _List(_STR),
     "amounts": _Map(_BYTES)},
    frozenset({"kind", "bytes", "template", "fix"}),
)  # fmt: skip
_REPORT = _Object(
    "a report",
    {"schema": _SCHEMA, "id": _STR, "name": _STR.opt(), "execution_count": _INT.opt(),
     "started_at": _NUMBER, "wall_s": _SECONDS, "status": _STATUS, "error": _STR.opt(),
     "cuda_available": _BOOL, "source": _STR, "budget_bytes": _BYTES.opt(),
     "devices": _List(_DEVICE), "notes": _List(_STR), "warnings": _List(_STR),
     "leak_hints": _List(_HINT), "cell_key": _STR.opt(), "main_device": _STR.opt(),
     "rank": _INDEX.opt(), "pid": _INT.opt()},
    frozenset({"id", "name", "execution_count", "started_at", "wall_s", "status", "error",
               "cuda_available", "source", "budget_bytes"}),
    nests="ranks",
    max_depth=MAX_RANK_DEPTH,
)  # fmt: skip


def check_report(data: Mapping[str, Any]) -> None:
    """ValueError naming the first field of ``data`` that a report cannot hold, and what it may.

    Fields this version does not know pass (``report_from_dict`` leaves them out); a schema
    newer than this version's is refused, since its known fields may mean something else.
    """
    schema = data.get("schema", SCHEMA)
    if _is_int(schema) and schema > SCHEMA:
        raise ValueError(
            f"report schema {schema} is newer than this jupyter_gpumem reads (schemas 1 to "
            f"{SCHEMA}): upgrade jupyter_gpumem to load it"
        )
    _check_object(data, _REPORT, "")


def _check(value: Any, spec: Any, where: str) -> None:
    if value is None and spec.optional:
        return
    if isinstance(spec, _Value):
        if not spec.test(value):
            raise ValueError(f"{where} must be {spec.allowed}, got {_got(value)}")
    elif isinstance(spec, _List):
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list, got {_got(value)}")
        for i, item in enumerate(value):
            _check(item, spec.item, f"{where}[{i}]")
    elif isinstance(spec, _Map):
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object of names to values, got {_got(value)}")
        for key, item in value.items():
            _check(item, spec.value, f"{where}[{echoed(key)}]")
    else:
        _check_object(value, spec, where)


def _check_object(value: Any, spec: _Object, where: str, depth: int = 0) -> None:
    """``depth``: how many times ``spec.nests`` led here, at most ``spec.max_depth``."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be {spec.what} (a JSON object), got {_got(value)}")
    missing = sorted(spec.required - value.keys())
    if missing:
        lacks = ", ".join(missing)
        raise ValueError(f"{where or 'the report'} lacks {lacks}, which {spec.what} has")
    prefix = f"{where}." if where else ""
    for name, field_spec in spec.fields.items():
        if name in value:
            _check(value[name], field_spec, prefix + name)
    nested = value.get(spec.nests) if spec.nests is not None else None
    if nested is None:
        return
    if not isinstance(nested, list):
        raise ValueError(f"{prefix}{spec.nests} must be a list, got {_got(nested)}")
    if nested and depth >= spec.max_depth:
        raise ValueError(
            f"{prefix}{spec.nests} is nested more than {spec.max_depth} levels deep: "
            f"{spec.what} holds at most {spec.max_depth} levels of {spec.nests}"
        )
    for i, item in enumerate(nested):
        _check_object(item, spec, f"{prefix}{spec.nests}[{i}]", depth + 1)


def _got(value: Any) -> str:
    """What a JSON value is, as an error message says it: the value itself where short."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return echoed(value)
