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
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem import report_log
from jupyter_gpumem.analysis.leak_hints import LeakHint, growth_hint
from jupyter_gpumem.analysis.peaks import replay_window
from jupyter_gpumem.report.build import build_report
from jupyter_gpumem.report.record import DeviceReport, Report
from jupyter_gpumem.tracking.detail import DETAIL_STEPS
from jupyter_gpumem.tracking.process import process_bytes
from jupyter_gpumem.tracking.recorder import Recorder, RecordOptions

__all__ = ["MeasureOptions", "Measurement", "collect", "measure"]


@dataclass(frozen=True)
class MeasureOptions:
    """What to record and how to report it; the `%%gpumem` options that are not about display."""

    name: str | None = None
    budget_bytes: int | None = None
    top: int = 10  # tensors listed
    trace: bool = True  # False: the peak counters only
    devices: Sequence[int] | None = None  # None: every device the block touched
    all_devices: bool = False
    snapshot_path: str | None = None
    detail_steps: int | None = DETAIL_STEPS  # None: the whole block in detail
    log: bool = True  # keep the report in the kernel's report log

    def recording(self) -> RecordOptions:
        return RecordOptions(
            trace=self.trace,
            devices=self.devices,
            all_devices=self.all_devices,
            snapshot_path=self.snapshot_path,
            detail_steps=self.detail_steps,
        )


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
        self._recorder = Recorder(options.recording(), namespace, digest=replay_window)

    def start(self) -> None:
        self._recorder.start()

    def finish(self, error: BaseException | None, *, analyse: bool = True) -> Report | None:
        """Stop recording; the report (kept in the log), or None if not analysed or ours failed."""
        try:
            recording = self._recorder.stop(error)
            if not analyse:
                return None
            opts = self.options
            self.report = build_report(
                recording,
                name=opts.name,
                execution_count=self.execution_count,
                budget_bytes=opts.budget_bytes,
                all_devices=opts.all_devices,
                process_bytes=process_bytes() if recording.devices else {},
                cell=self.cell,
                top=opts.top,
                cell_key=self.cell_key,
                leak_hints=self._leak_hints,
            )
        except Exception as exc:
            warnings.warn(f"jupyter_gpumem could not build the report: {exc!r}", stacklevel=2)
            return None
        if self.options.log:
            dropped = report_log.record(self.report)
            if dropped is not None:
                warnings.warn(dropped, stacklevel=2)
        for sink in _SINKS:
            sink.append(self.report)
        return self.report

    def _leak_hints(self, main: DeviceReport | None) -> list[LeakHint]:
        """What IPython holds on the main device, and growth across runs of the same cell."""
        hints: list[LeakHint] = []
        if self.shell is not None and main is not None:
            from jupyter_gpumem.ipython_state import find_leaks

            device = None if main.device == "cpu" else main.index
            hints.extend(find_leaks(self.shell, device=device, cycles=False))
        if main is not None and self.cell_key is not None:
            earlier = report_log.earlier_runs(self.cell_key, main.device)
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
        measurement.finish(error)
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
