"""Run the body of a `%%gpumem` cell through IPython's own steps, as the plain cell runs.

``InteractiveShell.run_cell_async`` transforms a cell, caches its source for tracebacks under
the cell's execution count, parses it, applies the AST transformers and hands the statements
to ``run_ast_nodes``, which shows the last value through the displayhook and an error as a
traceback. ``prepare`` and ``run`` take the same steps for the body, so top-level ``await``,
a trailing ``;``, ``%`` and ``!`` lines, tracebacks, ``Out`` and ``_`` are the plain cell's.

IPython has already shown an error of the body when ``run`` returns; ``fail`` then fails the
running cell through its ``ExecutionResult`` (so "Run All" stops there) rather than raising
it into a second traceback. Called in some other way (``run_cell_magic`` from code), the
error is raised to the caller.

A body with top-level ``await`` needs the cell's own event loop (ipykernel's is already
running while a cell runs). ``await_transform`` makes IPython see such a cell as async by
turning it into ``await get_ipython().run_cell_magic(...)``; the magic then returns a
coroutine that IPython, or ipykernel in its loop, awaits.

Known limitations: the body's displayed value and traceback are formatted inside the
measured interval, as they are part of the plain cell, and the report follows them. Called
other than as the cell (``run_cell_magic`` from code, or under ``%%time``), an error is shown
by IPython and then raised, so the caller may show it again; an async body called so while
an event loop runs cannot be awaited and is refused. A body that awaits but does not compile
as a whole fails, as the plain cell does, with "needs a real async loop", here at its line.
"""

from __future__ import annotations

import ast
import asyncio
import dis
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from IPython.core.displayhook import DisplayHook
from IPython.core.error import InputRejected
from IPython.core.interactiveshell import InteractiveShell


@dataclass
class Outcome:
    """The body's errors, filled in by IPython as it fills an ``ExecutionResult``."""

    error_before_exec: BaseException | None = None
    error_in_exec: BaseException | None = None

    @property
    def error(self) -> BaseException | None:
        return self.error_in_exec if self.error_in_exec is not None else self.error_before_exec


@dataclass(frozen=True)
class RunningCell:
    """The cell being run, when it is exactly this `%%gpumem` cell."""

    result: Any  # IPython's ExecutionResult
    awaited: bool  # the cell reads `await get_ipython().run_cell_magic(...)`
    silent: bool
    shell_futures: bool


@dataclass(frozen=True)
class Body:
    """A body transformed, cached and parsed, ready for ``run``."""

    raw: str
    source: str
    filename: str
    tree: ast.Module
    needs_async: bool
    compiler: Any


@dataclass(frozen=True)
class MagicCall:
    """A cell that IPython turned into one ``get_ipython().run_cell_magic(name, line, cell)``."""

    name: str
    line: str
    cell: str
    awaited: bool


def magic_call(text: str) -> MagicCall | None:
    """The cell magic call that ``text`` consists of, or None."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    node = tree.body[0].value
    awaited = isinstance(node, ast.Await)
    if isinstance(node, ast.Await):
        node = node.value
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "run_cell_magic"
        and len(node.args) == 3
        and not node.keywords
    ):
        return None
    args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(args) != 3:
        return None
    return MagicCall(args[0], args[1], args[2], awaited)


def running_cell(shell: InteractiveShell, cell: str) -> RunningCell | None:
    """The running cell if it is the `%%gpumem` cell whose body is ``cell``, else None."""
    result = getattr(shell.displayhook, "exec_result", None)
    if result is None:
        return None
    info = result.info
    text = getattr(info, "transformed_cell", None)
    try:
        call = magic_call(text if text is not None else shell.transform_cell(info.raw_cell))
    except Exception:  # a cell IPython could not transform: not ours to judge
        return None
    if call is None or call.cell != cell:
        return None
    return RunningCell(result, call.awaited, bool(info.silent), bool(info.shell_futures))


def result_awaited() -> bool:
    """Whether the code that called ``run_cell_magic`` awaits what it returns: a nested
    ``await get_ipython().run_cell_magic("gpumem", ...)`` inside a cell's async body."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "run_cell_magic":
        frame = frame.f_back  # type: ignore[assignment]
    caller = frame.f_back if frame is not None else None
    if caller is None:
        return False
    following = (i for i in dis.get_instructions(caller.f_code) if i.offset > caller.f_lasti)
    return next((i.opname for i in following), None) == "GET_AWAITABLE"


def cell_count(shell: InteractiveShell) -> int:
    """The execution count of the cell being run (IPython has already counted on past it)."""
    result = getattr(shell.displayhook, "exec_result", None)
    count = getattr(result, "execution_count", None)
    return int(count) if count is not None else int(shell.execution_count)


def prepare(
    shell: InteractiveShell, raw: str, count: int, running: RunningCell | None, outcome: Outcome
) -> Body | None:
    """Transform, cache and parse ``raw`` as ``run_cell_async`` does; None after showing an error."""
    try:
        source = shell.transform_cell(raw)
    except Exception as exc:
        shell.showtraceback()
        outcome.error_before_exec = exc
        return None
    futures = running is None or running.shell_futures
    compiler = shell.compile if futures else shell.compiler_class()
    filename = compiler.cache(source, count, raw_code=raw)
    try:
        tree = compiler.ast_parse(source, filename=filename)
    except shell.custom_exceptions as exc:
        shell.CustomTB(*sys.exc_info())
        outcome.error_before_exec = exc
        return None
    except IndentationError as exc:
        shell.showindentationerror()
        outcome.error_before_exec = exc
        return None
    except (OverflowError, SyntaxError, ValueError, TypeError, MemoryError) as exc:
        shell.showsyntaxerror()
        outcome.error_before_exec = exc
        return None
    try:
        tree = shell.transform_ast(tree)
    except InputRejected as exc:
        shell.showtraceback()
        outcome.error_before_exec = exc
        return None
    needs_async = bool(
        shell.should_run_async(raw, transformed_cell=source, preprocessing_exc_tuple=None)
    )
    return Body(raw, source, filename, tree, needs_async, compiler)


async def run(shell: InteractiveShell, body: Body, outcome: Outcome, *, silent: bool) -> None:
    """Run the statements as ``run_cell_async`` does; errors are shown and kept in ``outcome``."""
    __tracebackhide__ = True
    hook = shell.displayhook
    stored = body.source.rstrip("\n")  # what the plain cell's history would hold
    # The displayhook asks the history whether the cell ends in ';'; the history holds the
    # `%%gpumem` cell, so it is told about the body instead, for as long as the body runs.
    own = hook.__dict__.get("quiet")
    shown = shell.__dict__.get("showtraceback")
    try:
        hook.quiet = lambda: DisplayHook.semicolon_at_end_of_expression(stored)  # type: ignore[method-assign]  # restored below
        shell.showtraceback = _without_our_frames(shell.showtraceback)  # type: ignore[method-assign]  # restored below
        await shell.run_ast_nodes(
            body.tree.body,
            body.filename,
            interactivity="none" if silent else shell.ast_node_interactivity,
            compiler=body.compiler,
            result=outcome,
        )
    finally:  # no call of ours here: a Ctrl-C cannot land between the two
        if shown is None:
            shell.__dict__.pop("showtraceback", None)
        else:
            shell.showtraceback = shown  # type: ignore[method-assign]  # someone else's, put back
        if own is None:
            hook.__dict__.pop("quiet", None)
        else:
            hook.quiet = own  # type: ignore[method-assign]  # someone else's override, put back


OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _without_our_frames(show: Callable[..., Any]) -> Callable[..., Any]:
    """``showtraceback`` for the body's errors: an op that failed under our dispatch mode or
    hooks ends its traceback at the caller of our code, as the plain cell's does."""

    def showtraceback(*args: Any, **kwargs: Any) -> Any:
        error = sys.exc_info()[1]
        if error is not None:
            cut_at_our_frames(error.__traceback__)
        return show(*args, **kwargs)

    return showtraceback


def cut_at_our_frames(tb: TracebackType | None) -> None:
    """End the traceback ``tb`` before its first frame of jupyter_gpumem (and all below it)."""
    previous = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(OURS):
            if previous is not None:
                previous.tb_next = None
            return
        previous, tb = tb, tb.tb_next


def run_now(shell: InteractiveShell, coro: Coroutine[Any, Any, Any], needs_async: bool) -> Any:
    """Run ``coro`` to its end here: stepped by hand, or on IPython's runner for async bodies."""
    __tracebackhide__ = True
    if needs_async:
        runner = shell.trio_runner or shell.loop_runner
        return runner(coro)
    try:
        coro.send(None)
        # A body that does not compile as a whole can still await in one statement; IPython
        # then fails the plain cell with this RuntimeError. Here it is raised where the body
        # waits, so the body's traceback names the line and the tracker stops in order.
        for _ in range(3):
            coro.throw(RuntimeError(f"{coro!r} needs a real async loop"))
    except StopIteration as stop:
        return stop.value
    coro.close()  # the body caught the error three times and waited again
    return None


def loop_running() -> bool:
    """True while an asyncio loop runs in this thread (ipykernel's, during every cell)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def fail(shell: InteractiveShell, running: RunningCell | None, outcome: Outcome) -> None:
    """Fail the running cell with the body's error, already shown; raise it to other callers."""
    __tracebackhide__ = True
    error = outcome.error
    if error is None:
        return
    if running is None:
        raise error
    if outcome.error_before_exec is not None:
        running.result.error_before_exec = outcome.error_before_exec
    if outcome.error_in_exec is not None:
        running.result.error_in_exec = outcome.error_in_exec
    shell.events.register("post_execute", _MarkFailed(shell))


class _MarkFailed:
    """Once, after the cell: IPython saw the magic return, so it thinks the cell succeeded."""

    def __init__(self, shell: InteractiveShell) -> None:
        self.shell = shell

    def __call__(self) -> None:
        self.shell.events.unregister("post_execute", self)
        self.shell.last_execution_succeeded = False


# What a cell that a Ctrl-C cut while it was read runs instead: the plain cell's error.
INTERRUPTED = "raise KeyboardInterrupt  # Ctrl-C while IPython read the cell\n"


class AwaitTransform:
    """The input transformer that makes a `%%magic_name` cell with an async body awaitable.

    IPython reads every cell through it before the cell runs, outside the cell's own error
    handling: a Ctrl-C that lands there becomes the cell's KeyboardInterrupt, as one in the
    cell's code does, because the cell read becomes :data:`INTERRUPTED`. It stays so for that
    cell until the cell has run (``post_execute``), since ipykernel reads a cell once to choose
    how to run it and ``run_cell`` reads it again. A Ctrl-C at the very instruction that enters
    it is IPython's, as it is for any cell.

    IPython refuses a cell magic with an empty body before the magic is called; a line that
    ``answers_alone`` (``--help``) is handed to the magic with a body of one newline instead.
    """

    def __init__(
        self,
        shell: InteractiveShell,
        magic_name: str,
        answers_alone: Callable[[str], bool] = lambda line: False,
    ) -> None:
        self.shell = shell
        self.magic_name = magic_name
        self.answers_alone = answers_alone
        self.prefix = f"get_ipython().run_cell_magic({magic_name!r}, "
        self.cut: str | None = None  # the cell a Ctrl-C cut while it was read, until it ran
        self._nested = False  # reading the body: the outer call answers for a Ctrl-C

    def __call__(self, lines: list[str]) -> list[str]:
        try:
            if self.cut is not None and "".join(lines) == self.cut:
                return [INTERRUPTED]
            if not lines or not lines[0].startswith(self.prefix):
                return lines
            return self._awaited(lines)
        except KeyboardInterrupt:
            if self._nested:
                raise
            if self.cut is None:
                self.shell.events.register("post_execute", self.forget)
            self.cut = "".join(lines)
            return [INTERRUPTED]

    def _awaited(self, lines: list[str]) -> list[str]:
        try:
            call = magic_call("".join(lines))
            if call is None or call.awaited or call.name != self.magic_name:
                return lines
            if not call.cell and self.answers_alone(call.line):
                return [f"get_ipython().run_cell_magic({call.name!r}, {call.line!r}, '\\n')\n"]
            try:
                self._nested = True
                source = self.shell.transform_cell(call.cell)
            finally:
                self._nested = False
            if not self.shell.should_run_async(
                call.cell, transformed_cell=source, preprocessing_exc_tuple=None
            ):
                return lines
        except Exception:  # the body's own errors show when it runs, as in a plain cell
            return lines
        return ["await " + lines[0], *lines[1:]]

    def forget(self) -> None:
        """After the cut cell ran (``post_execute``): read cells afresh."""
        self.cut = None
        if self.forget in self.shell.events.callbacks.get("post_execute", ()):
            self.shell.events.unregister("post_execute", self.forget)


def await_transform(
    shell: InteractiveShell,
    magic_name: str,
    answers_alone: Callable[[str], bool] = lambda line: False,
) -> AwaitTransform:
    """The input transformer that makes a `%%magic_name` cell with an async body awaitable
    (and one without a body runnable where its line ``answers_alone``)."""
    return AwaitTransform(shell, magic_name, answers_alone)


def forget(shell: InteractiveShell) -> None:
    """Drop a pending ``_MarkFailed`` and a transformer's cut cell (the extension is unloaded
    by the failing cell itself)."""
    for callback in list(shell.events.callbacks.get("post_execute", ())):
        if isinstance(callback, _MarkFailed) or isinstance(
            getattr(callback, "__self__", None), AwaitTransform
        ):
            shell.events.unregister("post_execute", callback)
