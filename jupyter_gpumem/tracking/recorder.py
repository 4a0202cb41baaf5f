"""Bracket one cell: which event sources apply, when they start, what they hand over."""

from __future__ import annotations

import importlib
import linecache
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.gc_pause import pausing
from jupyter_gpumem.records import (
    CellRecording,
    DeviceRecording,
    ModuleCall,
    NamedStorage,
    PhaseMark,
    ScopeMark,
    Tag,
    TraceEvent,
    TraceWindow,
)
from jupyter_gpumem.tracking.cuda import CudaSession, LayoutAfter, allocator_backend
from jupyter_gpumem.tracking.detail import CPU_DETAIL_S, DETAIL_STEPS, DetailSchedule, RootWatch
from jupyter_gpumem.tracking.devices import cuda_present
from jupyter_gpumem.tracking.dynamo_skip import run_plainly
from jupyter_gpumem.tracking.namespace import NAMED, named_storages
from jupyter_gpumem.tracking.tags import Tagger

log = logging.getLogger(__name__)
_FAILED = object()


@dataclass(frozen=True)
class RecordOptions:
    """The parsed `%%gpumem` options that affect recording."""

    trace: bool = True
    devices: Sequence[int] | None = None  # None: every device the cell touched
    all_devices: bool = False
    snapshot_path: str | None = None
    detail_steps: int | None = DETAIL_STEPS  # None: the whole cell in detail


class Recorder:
    """``start()`` before the cell, ``stop(error)`` after it; never imports torch itself.

    The cell is recorded in detail for its first steps and again after a new peak
    (see :mod:`jupyter_gpumem.tracking.detail`). A failure of a tag or event source is
    logged and noted, never raised into the cell.
    """

    def __init__(
        self,
        options: RecordOptions,
        user_ns: Mapping[str, Any] | None = None,
        *,
        digest: Callable[[TraceWindow], Any] | None = None,
        layout_after: LayoutAfter | None = None,
        cell_filename: str | None = None,
    ) -> None:
        self.options = options
        self.cell_filename = cell_filename  # where the cell's own statements run, if known
        self.digest = digest  # see CudaSession
        self.layout_after = layout_after
        self.user_ns: Mapping[str, Any] = user_ns if user_ns is not None else {}
        self._session: CudaSession | None = None
        self._tagger: Tagger | None = None
        self._cpu: Any = None
        self._cpu_start: tuple[tuple[int, int], ...] = ()
        self._cpu_until_us: int | None = None
        self._cpu_until_step: int | None = None
        self._cpu_until_iterations: int | None = None
        self._notes: list[str] = []
        self._t0 = 0.0
        self._started_at = 0.0
        self._schedule: DetailSchedule | None = None
        self._detailed = False
        self._hooks: list[Any] = []
        self._watch = RootWatch()
        self._tagged: tuple[tuple[Tag, ...], tuple[PhaseMark, ...]] | None = None
        self._cpu_events: tuple[TraceEvent, ...] | None = None
        self._next_statement: Any = (
            None  # safe_point.NextStatement, while the CPU source may step aside
        )
        self._loop_watch: Any = None  # loop_iterations.LoopWatch, while it counts a loop
        self._session_ended = False

    def start(self) -> None:
        """Install the event sources; interrupted or failing half-way, it leaves none installed."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Take away every hook, mode and recording ``start`` installed, keeping what they saw.

        Safe to call again (a Ctrl-C in the middle of it is answered by calling it once more),
        and after a start that did not finish.
        """
        self._uninstall()
        self._end_session()

    def _uninstall(self) -> None:
        if self._loop_watch is not None:
            self._loop_watch.stop()
            self._loop_watch = None  # it holds this recorder: no cycle left behind
        if self._next_statement is not None:
            self._next_statement.disarm()
            self._next_statement = None  # it holds this recorder: no cycle left behind
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._watch.stop()
        if self._tagger is not None and self._tagged is None:
            stopped = self._guarded("tags", self._tagger.stop)
            self._tagged = ((), ()) if stopped is _FAILED else stopped
        if self._cpu is not None and self._cpu_events is None:
            events = self._guarded("CPU tensor source", self._cpu.stop)
            self._cpu_events = () if events is _FAILED else events

    def _end_session(self) -> None:
        if self._session is not None and not self._session_ended:
            self._session.close()
            self._session_ended = True

    def _start(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and cuda_present(torch):
            trace = self.options.trace
            if trace and allocator_backend() != "native":
                trace = False
                self._notes.append("the cudaMallocAsync backend keeps no trace: counters only")
            self._session = CudaSession(
                torch,
                trace=trace,
                devices=self.options.devices,
                snapshot_path=self.options.snapshot_path,
                digest=self.digest,
                layout_after=self.layout_after,
            )
            self._session.start()
        named: Mapping[int, NamedStorage] = {}
        if torch is not None and self.options.trace and self._session is None:
            # the CPU source follows the namespace's tensors, found by the read that names them
            tensors: list[Any] = []
            read = self._guarded("namespace", lambda: named_storages(self.user_ns, tensors))
            named = {} if read is _FAILED else read
            self._cpu = _cpu_source()  # kept before it starts: close() stops a half start
            started = self._guarded("CPU tensor source", lambda: self._cpu.start(tensors))
            if started is _FAILED:
                self._cpu.stop()
                self._cpu = None
            else:
                self._cpu_start = started
        elif torch is not None and self.options.trace:
            read = self._guarded("namespace", self._named)
            named = {} if read is _FAILED else read
        if torch is not None and self.options.trace:
            self._tagger = Tagger(torch, self.user_ns)
            self._tagger.on_boundary = self._boundary
            if self._guarded("tags", lambda: self._tagger.start(named)) is _FAILED:
                self._tagger = None
            self._detailed = True
            steps = self.options.detail_steps
            if steps is not None and not self.options.snapshot_path:
                self._schedule = DetailSchedule(steps=steps)
                if self._cpu is not None and self.cell_filename is not None:
                    self._guarded("CPU tensor source", self._limit_cpu_detail)
            self._guarded("optimizer hooks", lambda: self._hook_optimizers(torch))
        self._started_at = time.time()
        self._t0 = time.perf_counter()

    def stop(self, error: BaseException | None) -> CellRecording:
        """Uninstall (as :meth:`close`) and return what the cell did."""
        wall_s = time.perf_counter() - self._t0
        self._uninstall()
        tags: tuple[Tag, ...] = ()
        marks: tuple[PhaseMark, ...] = ()
        calls: tuple[ModuleCall, ...] = ()
        scope_marks: tuple[ScopeMark, ...] = ()
        if self._tagger is not None and self._tagged is not None:
            tags, marks = self._tagged
            calls, scope_marks = self._tagger.scopes.records()
        cpu_events = self._cpu_events if self._cpu is not None else None
        torch = sys.modules.get("torch")
        cuda = torch is not None and cuda_present(torch)
        devices: dict[int, DeviceRecording] = {}
        if torch is not None and cuda and self._session is None and torch.cuda.is_initialized():
            # torch arrived with the cell, so CUDA was not initialised before it.
            self._session = CudaSession(
                torch,
                trace=False,
                devices=self.options.devices,
                counters_reason="torch was imported inside the cell",
            )
        steps = self._schedule.position if self._schedule is not None else 0
        if self._session is not None and not self._session_ended:
            try:
                devices = self._session.finish(steps)
            finally:
                self._end_session()
            self._notes.extend(self._session.notes)
        snapshot = self.options.snapshot_path
        if snapshot and (self._session is None or not self._session.snapshot_path):
            why = (
                "torch was imported inside the cell"
                if self._session is not None
                else "torch is not imported"
                if torch is None
                else "no CUDA device is present"
                if not cuda
                else "the cell did not use CUDA"
            )
            self._notes.append(f"no snapshot was written to {snapshot}: {why}")
        named: Mapping[int, NamedStorage] = {}
        if torch is not None:
            read = self._guarded("namespace", self._named)
            named = {} if read is _FAILED else read
        return CellRecording(
            started_at=self._started_at,
            wall_s=wall_s,
            cuda_available=bool(cuda),
            devices=devices,
            error=error,
            notes=tuple(self._notes),
            tags=tags,
            marks=marks,
            named=named,
            cpu_events=cpu_events,
            cpu_start=self._cpu_start,
            cpu_detail_until_us=self._cpu_until_us,
            cpu_detail_steps=self._cpu_until_step,
            cpu_detail_iterations=self._cpu_until_iterations,
            steps=steps,
            calls=calls,
            scope_marks=scope_marks,
        )

    def _named(self) -> dict[int, NamedStorage]:
        """The namespace's named storages, read again only where they may have changed."""
        activity = self._session.activity() if self._session is not None else None
        if activity is None:
            return named_storages(self.user_ns)
        return NAMED.named(self.user_ns, activity)

    # -- step boundaries -----------------------------------------------------------
    def _hook_optimizers(self, torch: Any) -> None:
        """One global pair for the whole cell: ``Optimizer.step`` iterates them live."""
        optim = importlib.import_module("torch.optim.optimizer")
        run_plainly(self._optimizer_pre, self._optimizer_post)  # see dynamo_skip
        self._hooks.append(optim.register_optimizer_step_pre_hook(self._optimizer_pre))
        self._hooks.append(optim.register_optimizer_step_post_hook(self._optimizer_post))

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        tagger = self._tagger
        if tagger is not None and tagger.active:
            self._guarded("tags", lambda: tagger.optimizer_step_pre(optimizer))

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        tagger = self._tagger
        if tagger is not None and tagger.active:
            self._guarded("tags", lambda: tagger.optimizer_step_post(optimizer))
        self._boundary("step", None, None)

    def _boundary(self, kind: str, module: Any, args: Any) -> None:
        """A step ended (``step``) or a root forward begins (``forward``)."""
        schedule = self._schedule
        if schedule is None:
            return
        counted = schedule.boundary(kind)
        if self._detailed:
            # A decoding cell's peak grows with its cache to the last token: its window stays
            # open, so the breakdown comes from the window that holds the peak.
            decoding = self._tagger is not None and self._tagger.decode.decoding
            if counted and schedule.window_done() and not decoding:
                if self._tagger is None or self._tagger.can_pause():
                    if self._guarded("light mode", self._go_light) is _FAILED:
                        self._schedule = None
        elif counted and self._session is not None and schedule.sample_due():
            if self._guarded("light mode", lambda: self._sample(module, args)) is _FAILED:
                self._schedule = None

    # -- a CPU cell without steps ----------------------------------------------------
    def _limit_cpu_detail(self) -> None:
        """A CPU cell that counts no steps is recorded in detail for its top-level loop's
        first ``DETAIL_STEPS`` iterations, or for ``CPU_DETAIL_S`` where it has none."""
        from jupyter_gpumem.tracking.dispatch import is_library_file
        from jupyter_gpumem.tracking.loop_iterations import LoopWatch, outer_loops
        from jupyter_gpumem.tracking.safe_point import NextStatement

        assert self.cell_filename is not None
        self._next_statement = NextStatement(
            self.cell_filename, self._cpu_step_aside, is_library_file
        )
        if sys.gettrace() is None:  # under a debugger or coverage tool, the deadline alone
            source = "".join(linecache.getlines(self.cell_filename))
            self._loop_watch = LoopWatch(
                self.cell_filename, outer_loops(source), self._cpu_iterated
            )
            self._loop_watch.start()
        self._cpu.deadline_us = time.time_ns() // 1000 + int(CPU_DETAIL_S * 1e6)
        self._cpu.on_deadline = self._cpu_deadline

    def _cpu_iterated(self, iterations: int) -> bool:
        """At the header of the cell's loop, ``iterations`` done; True once stepped aside (or
        no longer due)."""
        schedule = self._schedule
        if schedule is None or schedule.position or not self._detailed:
            return True  # steps are being counted: the schedule decides
        if iterations < DETAIL_STEPS or not self._cpu_step_aside():
            return False
        if not self._detailed:  # stepped aside here
            self._cpu_until_iterations = iterations
        return True

    def _cpu_deadline(self) -> None:
        """From inside an op: past the detail budget, step aside at the cell's next statement."""
        schedule = self._schedule
        if schedule is None or schedule.position or not self._detailed:
            return  # steps are being counted: the schedule decides
        if self._loop_watch is not None:
            self._loop_watch.stop()  # the next statement takes over the thread's trace
        self._guarded("CPU tensor source", self._next_statement.arm)

    def _cpu_step_aside(self) -> bool:
        """At a statement of the user's own code; True once stepped aside (or no longer due)."""
        schedule = self._schedule
        if schedule is None or schedule.position or not self._detailed:
            return True
        if self._tagger is not None and (
            self._tagger.decode.decoding or not self._tagger.can_pause()
        ):
            return False  # a decoding window stays open; a checkpoint's hooks are on top
        if self._guarded("light mode", self._go_light) is _FAILED:
            self._schedule = None
        return True

    def _root_forward(self, module: Any, args: Any) -> None:
        self._boundary("forward", module, args)

    @pausing  # a window's trace read and replayed mid-cell
    def _go_light(self) -> None:
        assert self._schedule is not None
        step = self._schedule.position
        self._detailed = False
        if self._loop_watch is not None:
            self._loop_watch.stop()  # whichever way the window ended, nothing more to count
        if self._tagger is not None:
            self._tagger.pause()
            if not self._schedule.optimizer_steps:
                self._watch.start(self._tagger.roots.values(), self._root_forward)
        if self._session is not None:
            self._session.end_window(step)
        if self._cpu is not None:
            self._cpu.pause()
            self._cpu_until_us = time.time_ns() // 1000
            self._cpu_until_step = step

    @pausing  # may read the layout for a new window
    def _sample(self, module: Any, args: Any) -> None:
        assert self._schedule is not None and self._session is not None
        schedule = self._schedule
        higher = self._session.sample(schedule.position)
        if higher and schedule.may_reenter() and self._session.trace:
            schedule.reentered()
            self._detailed = True
            self._watch.stop()
            self._session.begin_window(schedule.position)
            if self._tagger is not None:
                self._tagger.resume(schedule.optimizer_steps)
                if module is not None:
                    self._tagger.enter_forward(module, args)

    def _guarded(self, what: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            log.warning("jupyter_gpumem: %s failed", what, exc_info=True)
            self._notes.append(f"{what} unavailable: {exc!r}")
            return _FAILED


def _cpu_source() -> Any:
    """The CPU stand-in for the allocator trace (imported when a CPU cell first needs it)."""
    from jupyter_gpumem.tracking.dispatch import DispatchRecorder

    return DispatchRecorder()
