"""`%%gpumem` and `%gpumem`: parse options, run the cell under a tracker, show the report.

A failure inside jupyter_gpumem never breaks the user's cell: the cell's own
result or exception always comes through unchanged, and a report that cannot be
built becomes a warning.
"""

from __future__ import annotations

import ast
import hashlib
import sys
import warnings
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class

from jupyter_gpumem import logbook
from jupyter_gpumem.gc_pause import pausing
from jupyter_gpumem.ipython import cell_run, display
from jupyter_gpumem.ipython.cell_options import (
    CELL_HELP,
    CELL_USAGE,
    Options,
    asks_help,
    parse_options,
    split_words,
)
from jupyter_gpumem.ipython.monitor_options import MONITOR_USAGE, parse_monitor
from jupyter_gpumem.report import text
from jupyter_gpumem.report.record import Report
from jupyter_gpumem.session import Measurement
from jupyter_gpumem.tracking import devices as cuda_devices
from jupyter_gpumem.tracking.counters import COUNTERS
from jupyter_gpumem.tracking.cuda import GUARD
from jupyter_gpumem.tracking.held_state import HELD
from jupyter_gpumem.tracking.namespace import EDITS, NAMED

__all__ = ["CELL_USAGE", "GpuMemMagics", "Options", "load", "parse_options", "unload"]

LINE_COMMANDS = ("status", "history", "monitor", "free")
LINE_USAGE = "%gpumem [status | history | free | monitor [--interval SECONDS] [--device N ...]]"
LINE_LIST = """  status    the extension's state: devices, recording, reports kept
  history   this kernel's %%gpumem reports, one row each
  free      release the tensors IPython holds (output cache, last traceback)
  monitor   live GPU gauges (for front ends without the sidebar)"""
LINE_HELP = f"""usage: {LINE_USAGE}

{LINE_LIST}

%%gpumem --help shows the cell magic's options."""
# What `%%gpumem --help` prints (the cell is not run): the options and every line command.
HELP = f"""{CELL_HELP}
As a line magic: {LINE_USAGE}

{LINE_LIST}
"""


@magics_class
class GpuMemMagics(Magics):
    """The `gpumem` line and cell magic."""

    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> Any:
        if cell is None:
            return self._line(line)
        __tracebackhide__ = True  # IPython leaves our frames out of the body's tracebacks
        shell = self.shell
        assert shell is not None
        if asks_help(line):  # shown as output, not as an error; the body does not run
            print(HELP)
            running = cell_run.running_cell(shell, cell)
            awaited = running.awaited if running is not None else cell_run.result_awaited()
            return _nothing() if awaited else None
        opts = parse_options(line, reserved=shell.user_ns_hidden)
        self._check_devices(opts)
        expected = _estimate_in(shell, opts.estimate)
        running = cell_run.running_cell(shell, cell)
        # awaited as the cell itself, or by a body that awaits a nested run_cell_magic
        awaited = running.awaited if running is not None else cell_run.result_awaited()
        count = cell_run.cell_count(shell)
        prepared = cell_run.Outcome()
        body = cell_run.prepare(shell, cell, count, running, prepared)
        if body is not None and body.needs_async and not awaited and cell_run.loop_running():
            raise UsageError(
                "a body with top-level await runs only as a %%gpumem cell of its own, "
                "not through run_cell_magic while an event loop runs"
            )
        coro = None
        try:
            if body is None:
                coro = self._failed(running, prepared)
            else:
                _import_torch_first(body.tree)
                coro = self._tracked(opts, body, running, count, expected)
            if awaited:
                return coro  # the cell reads `await get_ipython().run_cell_magic(...)`
            return cell_run.run_now(shell, coro, body is not None and body.needs_async)
        except BaseException:
            if coro is not None:
                coro.close()  # a Ctrl-C before it started: no "never awaited" warning later
            raise

    gpumem.__doc__ = HELP

    async def _failed(
        self, running: cell_run.RunningCell | None, outcome: cell_run.Outcome
    ) -> None:
        """The body could not be compiled: IPython has shown why, as for the plain cell."""
        __tracebackhide__ = True
        assert self.shell is not None
        cell_run.fail(self.shell, running, outcome)

    async def _tracked(
        self,
        opts: Options,
        body: cell_run.Body,
        running: cell_run.RunningCell | None,
        count: int,
        expected: Any = None,
    ) -> None:
        """Track exactly the body's statements; report, then fail the cell as the body did."""
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        # The report names lines as the traceback of this cell does: from the body's first line
        # that is not blank (IPython compiles a cell magic's body so).
        key = opts.measuring.name or hashlib.sha1(body.raw.encode()).hexdigest()[:16]
        measurement = Measurement(
            opts.measuring,
            shell.user_ns,
            shell=shell,
            execution_count=count,
            cell=(body.filename, 0),
            cell_key=key,
        )
        outcome = cell_run.Outcome()
        escaped: BaseException | None = None
        measurement.start()
        try:
            try:
                silent = running is not None and running.silent
                await cell_run.run(shell, body, outcome, silent=silent)
            except BaseException as exc:  # an interrupt that arrived outside the body's own code
                escaped = exc
                raise
            finally:
                error = outcome.error if outcome.error is not None else escaped
                self._finish(measurement, opts, error, expected)
        finally:
            measurement.close()  # already done, unless a Ctrl-C cut the report short
        cell_run.fail(shell, running, outcome)

    @pausing  # the analysis and its display: see jupyter_gpumem.gc_pause
    def _finish(
        self,
        measurement: Measurement,
        opts: Options,
        error: BaseException | None,
        expected: Any = None,
    ) -> None:
        report = measurement.finish(error)
        if report is None:
            return
        if expected is not None:
            report = beside(report, expected)
        missing = _missing_device(opts)
        if missing is not None:
            warnings.warn(f"{missing}; nothing was reported for it", stacklevel=2)
        if opts.output and self.shell is not None:
            self.shell.user_ns[opts.output] = report
        if opts.quiet:
            for w in text.warnings(report):
                warnings.warn(w, stacklevel=2)
            return
        display.show(report, self.shell)

    def _check_devices(self, opts: Options) -> None:
        missing = _missing_device(opts)
        if missing is not None:
            raise UsageError(missing)

    def _line(self, line: str) -> Any:
        words = split_words(line, LINE_USAGE)
        command, args = (words[0], words[1:]) if words else ("status", [])
        if command in ("-h", "--help"):
            print(LINE_HELP)
            return None
        if command == "monitor":
            return _monitor(args)
        if command not in LINE_COMMANDS:
            raise UsageError(
                f"%gpumem takes one of: {', '.join(LINE_COMMANDS)}; got {command!r}\nusage: {LINE_USAGE}"
            )
        if args:
            raise UsageError(
                f"%gpumem {command} takes nothing after it, got {' '.join(args)!r}\nusage: {LINE_USAGE}"
            )
        if command == "status":
            return _status()
        if command == "history":
            return logbook.summary()
        from jupyter_gpumem.held.ipython_refs import release

        print(release(self.shell))
        return None


async def _nothing() -> None:
    """What an awaited `%%gpumem --help` awaits: the help is printed already."""


def _estimate_in(shell: InteractiveShell, name: str | None) -> Any:
    """The estimate ``--estimate`` names, or UsageError saying what the variable must hold."""
    if name is None:
        return None
    found = shell.user_ns.get(name)
    if not callable(getattr(found, "against", None)) or not hasattr(found, "peak_bytes"):
        held = (
            "no such variable"
            if name not in shell.user_ns
            else f"it holds a {type(found).__name__}"
        )
        raise UsageError(
            f"--estimate {name}: {held}; give the variable holding an estimate "
            "(from estimate_generate, Trial.estimate or estimate_generate's searches)"
        )
    return found


def beside(report: Report, expected: Any) -> Report:
    """The report with a note setting ``expected``'s peak beside the measured one."""
    from dataclasses import replace

    main = report.main
    measured = None if main is None else main.peak_allocated_bytes
    line = expected.against(measured)
    if (
        main is not None
        and expected.device
        and expected.device.split(":")[0] != main.device.split(":")[0]
    ):
        line += f" (estimated on {expected.device}, measured on {main.device})"
    return replace(report, notes=(*report.notes, line))


def _monitor(words: list[str]) -> Any:
    """`%gpumem monitor [--interval S] [--device N ...]`: the live NVML gauge widget."""
    from jupyter_gpumem.widgets.monitor import show  # imports bqplot

    options = parse_monitor(words)
    try:
        return show(options.interval_s, options.devices)
    except ValueError as exc:
        raise UsageError(f"%gpumem monitor: {exc}\n{MONITOR_USAGE}") from None


def _visible_devices(torch: Any) -> int | None:
    """CUDA devices this process sees, or None where only initialising CUDA would tell."""
    if not cuda_devices._cuda_build(torch):
        return 0
    if torch.cuda.is_initialized():
        return int(torch.cuda.device_count())
    return None


def _missing_device(opts: Options) -> str | None:
    """What is wrong with ``--device N`` if this process can tell, without starting CUDA."""
    torch = sys.modules.get("torch")
    devices = opts.measuring.recording.devices
    if devices is None or torch is None:
        return None
    count = _visible_devices(torch)
    index = devices[0]
    if count is None or index < count:
        return None
    if count == 0:
        return (
            f"--device {index}: this process sees no CUDA device; leave --device out to "
            "measure CPU tensor memory"
        )
    allowed = ", ".join(str(i) for i in range(count))
    return f"--device {index}: this process sees devices {allowed} (or 'all')"


def _import_torch_first(tree: ast.Module) -> None:
    """Import torch before the tracker starts when the cell imports it itself.

    The tracker picks its event sources from the modules loaded when it starts, so a cell
    that imports torch would otherwise measure nothing on its first run. Importing torch
    does not initialise CUDA. If the import fails, the cell's own import raises it.
    """
    if "torch" in sys.modules:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name == "torch" or name.startswith("torch.") for name in names):
            try:
                import torch  # noqa: F401  # loaded for the tracker; the cell binds its own names
            except (ImportError, OSError):
                return
            _install_guard()
            return


def _status() -> None:
    torch = sys.modules.get("torch")
    reports: list[Report] = logbook.reports()
    cuda = "torch not imported yet"
    if torch is not None:
        cuda = (
            f"{torch.cuda.device_count()} CUDA device(s)"
            if torch.cuda.is_available()
            else "no CUDA device"
        )
    lines = [f"jupyter_gpumem: {cuda}; {len(reports)} report(s) this kernel"]
    if reports:
        lines.append(str(reports[-1]))
    print("\n".join(lines))


_MAGICS: dict[int, GpuMemMagics] = {}
_TRANSFORMS: dict[int, Any] = {}  # the input transformer that awaits async bodies, per shell


def load(shell: InteractiveShell) -> None:
    """Register the magics; loading twice is harmless."""
    if id(shell) in _MAGICS:
        return
    magics = GpuMemMagics(shell)
    shell.register_magics(magics)
    _MAGICS[id(shell)] = magics
    _TRANSFORMS[id(shell)] = cell_run.await_transform(shell, "gpumem", answers_alone=asks_help)
    shell.input_transformers_post.append(_TRANSFORMS[id(shell)])
    GUARD.install()
    COUNTERS.install()
    HELD.install()
    shell.events.register("post_run_cell", _install_guard)
    display.FRONTEND.ask(shell)


def unload(shell: InteractiveShell) -> None:
    """Remove the magics and every hook the extension installed."""
    if _MAGICS.pop(id(shell), None) is None:
        return
    manager = shell.magics_manager
    assert manager is not None
    for kind in ("line", "cell"):
        manager.magics[kind].pop("gpumem", None)
    manager.registry.pop("GpuMemMagics", None)
    transform = _TRANSFORMS.pop(id(shell), None)
    if transform in shell.input_transformers_post:
        shell.input_transformers_post.remove(transform)
    cell_run.forget(shell)
    shell.events.unregister("post_run_cell", _install_guard)
    GUARD.uninstall()
    COUNTERS.uninstall()
    HELD.uninstall()
    EDITS.uninstall()
    NAMED.clear()
    display.FRONTEND.forget()


def _install_guard(result: Any = None) -> None:
    """Watch the user's history recording and optimizers as soon as they import torch."""
    if not GUARD.installed and "torch" in sys.modules:
        GUARD.install()
        COUNTERS.install()
    if not HELD.installed and "torch" in sys.modules:
        HELD.install()
