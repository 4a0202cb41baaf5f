"""`%%gpumem` and `%gpumem`: parse options, run the cell under a tracker, show the report.

A failure inside jupyter_gpumem never breaks the user's cell: the cell's own
result or exception always comes through unchanged, and a report that cannot be
built becomes a warning.
"""

from __future__ import annotations

import ast
import hashlib
import keyword
import os
import shlex
import sys
import warnings
from dataclasses import dataclass, replace
from types import CodeType
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from jupyter_gpumem import kernel_history as history
from jupyter_gpumem.analysis.cell import build_report
from jupyter_gpumem.report import Report
from jupyter_gpumem.tracking.cell import CellOptions, CellTracker
from jupyter_gpumem.tracking.counters import COUNTERS
from jupyter_gpumem.tracking.cuda import GUARD
from jupyter_gpumem.tracking.process import process_bytes
from jupyter_gpumem.units import parse_size

CELL_USAGE = (
    "%%gpumem [-o VAR] [--name LABEL] [--device N|all] [--budget SIZE] [--snapshot PATH] "
    "[--top N] [--no-trace] [--quiet]"
)
LINE_COMMANDS = ("status", "history", "monitor", "free")


@dataclass(frozen=True)
class Options:
    """`%%gpumem` options after validation."""

    output: str | None
    name: str | None
    devices: tuple[int, ...] | None
    all_devices: bool
    budget_bytes: int | None
    snapshot: str | None
    trace: bool
    quiet: bool
    top: int


class _Parser:
    """Holds the magic_arguments declaration; its docstring is the magic's help."""

    @magic_arguments()
    @argument("-o", dest="output", metavar="VAR", help="store the report in this variable")
    @argument("--name", metavar="LABEL", help="label the report")
    @argument(
        "--device", metavar="N|all", help="report device N, or all devices (default: those used)"
    )
    @argument("--budget", metavar="SIZE", help="warn when the peak exceeds SIZE, e.g. 16GiB")
    @argument("--snapshot", metavar="PATH", help="write a memory_viz snapshot pickle to PATH")
    @argument(
        "--no-trace", action="store_true", help="exact peaks from the counters only (cheapest)"
    )
    @argument("--quiet", action="store_true", help="show nothing; the report is still stored")
    @argument("--top", metavar="N", help="list the N largest tensors (default 10)")
    def gpumem(self, line: str) -> None:
        """Track GPU memory of a cell: exact peak allocated/reserved per device."""


def parse_options(line: str) -> Options:
    """Validate `%%gpumem` options; UsageError names what is allowed."""
    try:
        args = parse_argstring(_Parser.gpumem, line)
    except UsageError as exc:
        raise UsageError(f"{exc}\nusage: {CELL_USAGE}") from None
    if args.output is not None and (
        not args.output.isidentifier() or keyword.iskeyword(args.output)
    ):
        raise UsageError(f"-o needs a Python variable name, got {args.output!r}")
    devices: tuple[int, ...] | None = None
    all_devices = False
    if args.device is not None:
        if args.device == "all":
            all_devices = True
        elif args.device.isdigit():
            devices = (int(args.device),)
        else:
            raise UsageError(
                f"--device takes a device index (0, 1, ...) or 'all', got {args.device!r}"
            )
    budget = None
    if args.budget is not None:
        try:
            budget = parse_size(args.budget)
        except ValueError as exc:
            raise UsageError(f"--budget: {exc}") from None
    if args.snapshot is not None and args.no_trace:
        raise UsageError(
            "--snapshot needs the allocator trace; it cannot be combined with --no-trace"
        )
    if args.snapshot is not None:
        parent = os.path.dirname(os.path.abspath(args.snapshot))
        if not os.path.isdir(parent):
            raise UsageError(f"--snapshot: the folder {parent!r} does not exist")
    top = 10
    if args.top is not None:
        if not args.top.isdigit() or int(args.top) < 1:
            raise UsageError(f"--top takes a positive whole number of tensors, got {args.top!r}")
        top = int(args.top)
    return Options(
        top=top,
        output=args.output,
        name=args.name,
        devices=devices,
        all_devices=all_devices,
        budget_bytes=budget,
        snapshot=args.snapshot,
        trace=not args.no_trace,
        quiet=args.quiet,
    )


@magics_class
class GpuMemMagics(Magics):
    """The `gpumem` line and cell magic."""

    @line_cell_magic
    def gpumem(self, line: str, cell: str | None = None) -> Any:
        if cell is None:
            return self._line(line)
        opts = parse_options(line)
        self._check_devices(opts)
        shell = self.shell
        assert shell is not None
        filename, body, tail = self._compile(cell)
        _import_torch_first(shell, cell)
        # Frames count lines of the compiled body; the editor shows the magic line and any
        # leading blank lines that IPython strips before compiling.
        lines = cell.split("\n")
        offset = 1 + next((i for i, text in enumerate(lines) if text.strip()), 0)
        tracker = CellTracker(
            CellOptions(
                trace=opts.trace,
                devices=opts.devices,
                all_devices=opts.all_devices,
                snapshot_path=opts.snapshot,
            ),
            shell.user_ns,
        )
        tracker.start()
        error: BaseException | None = None
        try:
            exec(body, shell.user_ns)
            return eval(tail, shell.user_ns) if tail is not None else None
        except BaseException as exc:
            error = exc
            raise
        finally:
            key = opts.name or hashlib.sha1(cell.encode()).hexdigest()[:16]
            self._finish(tracker, opts, error, filename, offset, key)

    def _compile(self, cell: str) -> tuple[str, CodeType, CodeType | None]:
        """Compile the cell as IPython would; a final expression is compiled apart, to return its value."""
        shell = self.shell
        assert shell is not None
        source = shell.transform_cell(cell)
        filename = shell.compile.cache(cell, shell.execution_count, raw_code=cell)
        tree = ast.parse(source, filename=filename)
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = compile(ast.Expression(tree.body.pop().value), filename, "eval")
        return filename, compile(tree, filename, "exec"), tail

    def _finish(
        self,
        tracker: CellTracker,
        opts: Options,
        error: BaseException | None,
        filename: str,
        line_offset: int,
        cell_key: str,
    ) -> None:
        try:
            recording = tracker.stop(error)
            nvml = process_bytes() if recording.devices else {}
            report = build_report(
                recording,
                name=opts.name,
                execution_count=self.shell.execution_count if self.shell else None,
                budget_bytes=opts.budget_bytes,
                all_devices=opts.all_devices,
                process_bytes=nvml,
                cell=(filename, line_offset),
                top=opts.top,
            )
            report = self._with_leaks(report, opts, cell_key)
        except Exception as exc:
            warnings.warn(f"jupyter_gpumem could not build the report: {exc!r}", stacklevel=2)
            return
        dropped = history.record(report)
        if dropped is not None:
            warnings.warn(dropped, stacklevel=2)
        if opts.output and self.shell is not None:
            self.shell.user_ns[opts.output] = report
        if opts.quiet:
            for w in report.warnings:
                warnings.warn(w, stacklevel=2)
            return
        display(report)
        if (
            report.timeline is not None
            and len(report.timeline.t_s) > 1
            and _has_widgets(self.shell)
        ):
            display(report.timeline_figure())

    def _with_leaks(self, report: Report, opts: Options, cell_key: str) -> Report:
        """Leak hints from IPython's state, and growth across earlier runs of the same cell."""
        from jupyter_gpumem.analysis.leaks import growth_hint
        from jupyter_gpumem.leaks import find_leaks

        main = report.main
        device = None if main is None or main.device == "cpu" else main.index
        hints = list(find_leaks(self.shell, device=device, cycles=False)) if report.devices else []
        if main is not None:
            earlier = history.earlier_runs(cell_key, main.device)
            grown = growth_hint(
                [*earlier, main.allocated_after_bytes], label=opts.name or "this cell"
            )
            if grown is not None:
                hints.insert(0, grown)
        return replace(report, leak_hints=tuple(hints), cell_key=cell_key)

    def _check_devices(self, opts: Options) -> None:
        torch = sys.modules.get("torch")
        if opts.devices is None or torch is None or not torch.cuda.is_available():
            return
        count = torch.cuda.device_count()
        if opts.devices[0] >= count:
            allowed = ", ".join(str(i) for i in range(count))
            raise UsageError(
                f"--device {opts.devices[0]}: this process sees devices {allowed} (or 'all')"
            )

    def _line(self, line: str) -> Any:
        words = shlex.split(line)
        command = words[0] if words else "status"
        if command == "status":
            return _status()
        if command == "history":
            return history.summary()
        if command == "monitor":
            return _monitor(words[1:])
        if command == "free":
            from jupyter_gpumem.leaks import release

            print(release(self.shell))
            return None
        raise UsageError(f"%gpumem takes one of: {', '.join(LINE_COMMANDS)}; got {command!r}")


def _monitor(words: list[str]) -> Any:
    """`%gpumem monitor [--interval S] [--device N ...]`: the live NVML gauge widget."""
    from jupyter_gpumem.widgets.monitor import show

    usage = "usage: %gpumem monitor [--interval SECONDS (>= 0.25)] [--device N ...]"
    interval_s, devices = 1.0, []
    it = iter(words)
    for word in it:
        value = next(it, None)
        try:
            if word == "--interval" and value is not None:
                interval_s = float(value)
            elif word == "--device" and value is not None:
                devices.append(int(value))
            else:
                raise ValueError(word)
        except ValueError:
            raise UsageError(
                f"%gpumem monitor: bad argument {word!r} {value or ''}\n{usage}"
            ) from None
    try:
        return show(interval_s, devices or None)
    except ValueError as exc:
        raise UsageError(f"%gpumem monitor: {exc}\n{usage}") from None


def _import_torch_first(shell: InteractiveShell, cell: str) -> None:
    """Import torch before the tracker starts when the cell imports it itself.

    The tracker picks its event sources from the modules loaded when it starts, so a cell
    that imports torch would otherwise measure nothing on its first run. Importing torch
    does not initialise CUDA. If the import fails, the cell's own import raises it.
    """
    if "torch" in sys.modules or "torch" not in cell:
        return
    tree = ast.parse(shell.transform_cell(cell))
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


def _has_widgets(shell: Any) -> bool:
    """Widgets render only where a kernel with comms runs the shell (not plain IPython)."""
    return getattr(shell, "kernel", None) is not None


def _status() -> None:
    torch = sys.modules.get("torch")
    reports: list[Report] = history.reports()
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


def load(shell: InteractiveShell) -> None:
    """Register the magics; loading twice is harmless."""
    if id(shell) in _MAGICS:
        return
    magics = GpuMemMagics(shell)
    shell.register_magics(magics)
    _MAGICS[id(shell)] = magics
    GUARD.install()
    COUNTERS.install()
    shell.events.register("post_run_cell", _install_guard)


def unload(shell: InteractiveShell) -> None:
    """Remove the magics and every hook the extension installed."""
    if _MAGICS.pop(id(shell), None) is None:
        return
    manager = shell.magics_manager
    assert manager is not None
    for kind in ("line", "cell"):
        manager.magics[kind].pop("gpumem", None)
    manager.registry.pop("GpuMemMagics", None)
    shell.events.unregister("post_run_cell", _install_guard)
    GUARD.uninstall()
    COUNTERS.uninstall()


def _install_guard(result: Any = None) -> None:
    """Watch the user's history recording as soon as they import torch."""
    if not GUARD.installed and "torch" in sys.modules:
        GUARD.install()
        COUNTERS.install()
