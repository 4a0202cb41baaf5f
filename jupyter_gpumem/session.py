"""Measure a block of code: the one seam between code that runs and its report.

`measure` brackets the block with the recorder, turns the recording into a report,
adds the hints about memory IPython holds, and keeps the report in the kernel's log.
The `%%gpumem` magic, trials and tests all measure through it::

    with measure(MeasureOptions(name="train"), shell.user_ns) as m:
        train()
    m.report  # the Report, or None where ours failed (a warning says why)

A failure in our code never reaches the measured block: recording and analysis
failures become a warning and a missing report, and the block's own exception
passes through unchanged.

Worker processes the block starts through ``torch.multiprocessing`` (``start_processes``,
``spawn``, accelerate's ``notebook_launcher``) measure themselves with ``measure_rank``;
their reports are the report's ``ranks`` (see :mod:`jupyter_gpumem.workers.rank_reports`).
``record`` measures a block of a script, one report file per rank.
"""

from __future__ import annotations

import collections
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from jupyter_gpumem import logbook
from jupyter_gpumem.analysis.leak_hints import LeakHint, growth_hint
from jupyter_gpumem.analysis.peaks import replay_window
from jupyter_gpumem.analysis.replay import layout_after
from jupyter_gpumem.gc_pause import paused, pausing
from jupyter_gpumem.report.build import build_report
from jupyter_gpumem.report.record import DeviceReport, Report
from jupyter_gpumem.tracking.process import process_bytes
from jupyter_gpumem.tracking.ranks import (
    RANKS_DIR_ENV,
    RankFinish,
    recording_started,
    recording_stopped,
    write_json,
    write_report,
)
from jupyter_gpumem.tracking.recorder import Recorder, RecordOptions
from jupyter_gpumem.units import echoed_kind
from jupyter_gpumem.workers.rank_reports import (
    RankCollection,
    current_rank,
    inherited_namespace,
    rank_path,
    with_ranks,
)
from jupyter_gpumem.workers.worker_names import WorkerLocals

__all__ = [
    "MeasureOptions",
    "Measurement",
    "RecordOptions",
    "collect",
    "measure",
    "measure_rank",
    "record",
]


@dataclass(frozen=True)
class MeasureOptions:
    """What to record (``recording``) and how to report it; `%%gpumem`'s options but display."""

    name: str | None = None
    budget_bytes: int | None = None
    top: int = 10  # tensors listed
    recording: RecordOptions = field(default_factory=RecordOptions)
    log: bool = True  # keep the report in the kernel's report log
    ranks: bool = True  # collect the reports of the worker processes the block starts


class Measurement:
    """One measured block: ``start()`` before it, ``finish(error)`` after it, even if it raised."""

    def __init__(
        self,
        options: MeasureOptions,
        namespace: Mapping[str, Any] | None = None,
        *,
        shell: Any = None,
        execution_count: int | None = None,
        cell: tuple[str, int] | None = None,
        cell_key: str | None = None,
    ) -> None:
        self.options = options
        self.shell = shell  # where IPython may hold tensors; None: no such hints
        self.execution_count = execution_count
        self.cell = cell  # (filename, first line) of the block's code, to name its lines
        self.cell_key = cell_key  # the same cell re-run has the same key
        self.report: Report | None = None
        self._recorder = Recorder(
            options.recording,
            namespace,
            digest=replay_window,
            layout_after=layout_after,
            cell_filename=cell[0] if cell is not None else None,
        )
        self._ranks = RankCollection(measure_rank, namespace) if options.ranks else None
        self._token: int | None = None
        self._rank_results: tuple[tuple[Report, ...], tuple[str, ...]] = ((), ())
        self._hint_notes: tuple[str, ...] = ()  # what the leak check could not look at

    def start(self) -> None:
        """Start recording; interrupted or failing half-way, it leaves nothing started."""
        try:
            with paused():
                if self._ranks is not None and not self._ranks.start():
                    self._ranks = None  # an outer block collects the workers' reports
                self._token = recording_started(self._abandon)
                self._recorder.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Take away all that ``start`` installed (hooks, modes, the rank collection).

        ``finish`` does this first; an owner whose ``finish`` was cut short (Ctrl-C) calls it
        again. Safe to call any number of times.
        """
        self._recorder.close()
        if self._token is not None:
            recording_stopped(self._token)
            self._token = None
        if self._ranks is not None:
            self._rank_results = self._ranks.finish()
            self._ranks = None

    def _abandon(self) -> None:
        """In a forked worker: stop this copy of the kernel's recording, keeping nothing."""
        self._recorder.stop(None)

    @pausing
    def finish(self, error: BaseException | None, *, analyse: bool = True) -> Report | None:
        """Stop recording; the report (kept in the log), or None if not analysed or ours failed."""
        try:
            try:
                recording = self._recorder.stop(error)
            finally:
                self.close()
            ranks, rank_notes = self._rank_results
            if not analyse:
                return None
            opts = self.options
            self.report = build_report(
                recording,
                name=opts.name,
                execution_count=self.execution_count,
                budget_bytes=opts.budget_bytes,
                all_devices=opts.recording.all_devices,
                process_bytes=process_bytes() if recording.devices else {},
                cell=self.cell,
                top=opts.top,
                cell_key=self.cell_key,
                leak_hints=self._leak_hints,
            )
            if self._hint_notes:
                self.report = replace(self.report, notes=(*self.report.notes, *self._hint_notes))
            self.report = with_ranks(self.report, ranks, rank_notes)
        except Exception as exc:
            warnings.warn(f"jupyter_gpumem could not build the report: {exc!r}", stacklevel=2)
            return None
        if self.options.log:
            dropped = logbook.keep(self.report)
            if dropped is not None:
                warnings.warn(dropped, stacklevel=2)
        for sink in _SINKS:
            sink.append(self.report)
        return self.report

    def _leak_hints(self, main: DeviceReport | None) -> list[LeakHint]:
        """What IPython holds on the main device, and growth across runs of the same cell."""
        hints: list[LeakHint] = []
        if self.shell is not None and main is not None:
            from jupyter_gpumem.held.ipython_refs import check_leaks

            device = None if main.device == "cpu" else main.index
            check = check_leaks(self.shell, device=device, cycles=False)
            hints.extend(check.hints)
            self._hint_notes = check.notes
        if main is not None and self.cell_key is not None:
            earlier = logbook.earlier_runs(self.cell_key, main.device)
            label = self.options.name or "this cell"
            grown = growth_hint([*earlier, main.allocated_after_bytes], label=label)
            if grown is not None:
                hints.insert(0, grown)
        return hints


@contextmanager
def measure(
    options: MeasureOptions, namespace: Mapping[str, Any] | None = None, **context: Any
) -> Iterator[Measurement]:
    """Measure the ``with`` block; its report is the yielded measurement's ``report``."""
    measurement = Measurement(options, namespace, **context)
    measurement.start()
    error: BaseException | None = None
    try:
        yield measurement
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            measurement.finish(error)
        finally:
            measurement.close()  # already done, unless a Ctrl-C cut finish short
        del error  # its frames hold the block's tensors


_SINKS: list[list[Report]] = []


@contextmanager
def collect() -> Iterator[list[Report]]:
    """Every report measured inside the ``with`` block, in order (the tuner's re-run cells)."""
    made: list[Report] = []
    _SINKS.append(made)
    try:
        yield made
    finally:
        _SINKS.remove(made)


def measure_rank(rank: int) -> RankFinish:
    """Start a worker process's own measurement; called in the worker by ``RankWorker``.

    A forked worker names tensors after the kernel's namespace, which it inherited, and after
    the locals of the function it runs; its lines read as the cells they are in.
    """
    options = MeasureOptions(name=f"rank {rank}", log=False, ranks=False)
    found: dict[str, Any] = {}  # the worker function's locals, filled as the rank ends
    namespace = collections.ChainMap(found, inherited_namespace())  # type: ignore[arg-type]
    # no block of its own: each line reads as the cell its frame is in, the innermost first
    measurement = Measurement(options, namespace)
    measurement.start()
    torch = sys.modules.get("torch")
    worker_locals = WorkerLocals(torch) if torch is not None else None
    if worker_locals is not None:
        worker_locals.install()

    def finish(error: BaseException | None, failure: str | None) -> Mapping[str, Any] | None:
        if worker_locals is not None:
            worker_locals.remove()
            found.update(worker_locals.namespace())
        report = measurement.finish(None if failure is not None else error)
        if report is None:
            return None
        if failure is not None:  # the user's exception, as the traceback torch passes on ends
            kind = failure.split(":", 1)[0].rsplit(".", 1)[-1]
            status = "oom" if kind == "OutOfMemoryError" else "error"
            report = replace(report, status=status, error=failure)
        return replace(report, rank=rank, pid=os.getpid()).to_dict()

    return finish


@contextmanager
def record(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    namespace: Mapping[str, Any] | None = None,
) -> Iterator[Measurement]:
    """Measure the ``with`` block of a script; each rank writes its report to its own file.

    ``record("run.json")`` writes ``run.rank<N>.json``, N being the rank (torch.distributed's
    when it is up at the end of the block, else torchrun's ``RANK``, else 0). Without a path,
    inside a `%%gpumem` cell (``!torchrun train.py``), the file goes to the cell's rank folder
    and the cell's report shows it. ``name``, a string, labels every rank's report (else
    ``rank <N>``).
    """
    folder = os.environ.get(RANKS_DIR_ENV)
    if path is None and folder is None:
        raise ValueError(
            "record() needs a file to write, e.g. record('run.json'), unless it runs under a "
            "%%gpumem cell"
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(
            "record(name=...) takes a string that labels the report, such as 'warm-up', or "
            f"None for 'rank <N>'; got {echoed_kind(name)}"
        )
    if path is not None:
        _check_writable(path)
    rank = current_rank()  # a RANK that is not a number is refused before the block runs
    measurement = Measurement(MeasureOptions(name=name, log=False, ranks=False), namespace)
    measurement.start()
    error: BaseException | None = None
    try:
        yield measurement
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            report = measurement.finish(error)
        finally:
            measurement.close()  # already done, unless a Ctrl-C cut finish short
        del error  # its frames hold the block's tensors
        if report is not None:
            rank = _rank_now(rank)
            report = replace(report, name=name or f"rank {rank}", rank=rank, pid=os.getpid())
            measurement.report = report
            try:
                if path is not None:
                    write_json(rank_path(path, rank), report.to_dict())
                else:
                    assert folder is not None
                    write_report(folder, rank, report.to_dict())
            except OSError as exc:
                warnings.warn(f"jupyter_gpumem could not write the report: {exc!r}", stacklevel=3)


def _check_writable(path: str | os.PathLike[str]) -> None:
    """ValueError, before the block runs, for a path ``record`` could not write its file to."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"record() takes a file path such as 'run.json', got {type(path).__name__}")
    shown = repr(os.fspath(path))[:80]
    if not os.fspath(path) or Path(path).name in ("", ".", ".."):
        raise ValueError(f"record({shown}): give a file name, such as 'run.json'")
    if "\0" in os.fsdecode(path):
        raise ValueError(f"record({shown}): a path holds no NUL byte ('\\x00'); give a file name")
    folder = Path(path).parent
    if not folder.is_dir():
        raise ValueError(f"record({shown}): its folder does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"record({shown}): its folder cannot be written")
    if Path(path).is_dir():
        raise ValueError(f"record({shown}): that is a folder; give a file name inside it")


def _rank_now(at_start: int) -> int:
    """The rank at the block's end (torch.distributed may have come up in it), else at its start."""
    try:
        return current_rank()
    except ValueError:
        return at_start
