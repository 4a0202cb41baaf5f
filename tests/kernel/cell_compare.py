"""Run a body as a plain cell and as a `%%gpumem` cell in one real shell; compare what shows.

What a user can observe of a cell: whether it failed, the names it left (by repr), the value
shown as ``Out``, the error's type and the line it names, the text written (prints, the
``Out`` prompt, tracebacks) and other displays. Prompt numbers are checked against each
cell's own execution count and then written as ``N``, so two runs compare equal.
"""

from __future__ import annotations

import contextlib
import gc
import io
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from IPython.core.displaypub import CapturingDisplayPublisher
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem import logbook
from jupyter_gpumem.report.record import MIME_TYPE

_IPYTHON_NAME = re.compile(r"_+|_i{1,3}|_i?\d+|_exit_code|_oh|_dh|_ih|In|Out")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_LOOP = "needs a real async loop"  # IPython's error for an await it cannot run


@dataclass(frozen=True)
class Seen:
    """What a user sees of one cell."""

    success: bool
    names: dict[str, str]  # user names -> repr, IPython's own left out
    value: str | None  # repr of the value shown as Out, None when nothing was shown
    error: tuple[str, int | None] | None  # (type, line in the cell) of the cell's error
    text: str  # stdout: prints, Out prompt, traceback; prompt numbers written as N
    displays: tuple[str, ...]  # display() outputs other than the report


@dataclass(frozen=True)
class Run:
    seen: Seen
    result: Any  # ExecutionResult
    reports: int  # 1 when the cell added a `%%gpumem` report
    stderr: str


def run_cell(shell: InteractiveShell, source: str, *, skip: frozenset[str] = frozenset()) -> Run:
    """Run ``source`` as the next cell (history stored, as in a kernel) and see what it shows."""
    publisher = CapturingDisplayPublisher()
    saved = shell.display_pub
    shell.display_pub = publisher
    out, err = io.StringIO(), io.StringIO()
    before = _last_report()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = shell.run_cell(source, store_history=True)
            count = result.execution_count
            error = result.error_in_exec or result.error_before_exec
            line = None if error is None else error_line(error, count)
            if error is not None and NO_LOOP in str(error):
                # IPython leaves the cell's coroutine waiting, held by the traceback; closed
                # later, it would show a GeneratorExit traceback in whichever cell runs then.
                error.with_traceback(None)
                sys.last_type = sys.last_value = sys.last_traceback = None
                shell.InteractiveTB.tb = None
                gc.collect()
    finally:
        shell.display_pub = saved
    displays = tuple(
        _plain(repr(sorted(o["data"].items())))
        for o in publisher.outputs
        if MIME_TYPE not in o["data"]
    )
    seen = Seen(
        success=result.success,
        names=user_names(shell, skip),
        value=None if result.result is None else _plain(repr(result.result)),
        error=None if error is None else (type(error).__name__, line),
        text=_numbered(_ANSI.sub("", out.getvalue()), count),
        displays=displays,
    )
    return Run(seen, result, int(_last_report() is not before), err.getvalue())


def _last_report() -> object:
    reports = logbook.reports()
    return reports[-1] if reports else None


def user_names(shell: InteractiveShell, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    hidden = set(shell.user_ns_hidden) | skip
    return {
        name: _plain(_safe_repr(value))
        for name, value in shell.user_ns.items()
        if name not in hidden and not name.startswith("__") and not _IPYTHON_NAME.fullmatch(name)
    }


def error_line(error: BaseException, count: int) -> int | None:
    """The line of the cell (numbered ``count``) that the error names; -1 for another cell's."""
    if isinstance(error, SyntaxError) and error.filename and "ipython-input" in error.filename:
        return error.lineno if _cell_number(error.filename) == count else -1
    line = None
    tb = error.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if "ipython-input" in name:
            line = tb.tb_lineno if _cell_number(name) == count else -1
        tb = tb.tb_next
    return line


def compare(
    shell: InteractiveShell, options: str, body: str, *, setup: str = ""
) -> tuple[Run, Run, dict[str, str]]:
    """The plain cell and the `%%gpumem` cell, each from the same namespace after ``setup``.

    Returns both runs and the names as they were before either ran.
    """
    if setup:
        prepared = shell.run_cell(setup, store_history=False)
        assert prepared.success, prepared.error_in_exec
    start = dict(shell.user_ns)
    skip = frozenset({_output_name(options)} - {""})  # the report's variable, in the magic's run
    baseline = user_names(shell, skip)
    plain = run_cell(shell, body, skip=skip)
    shell.user_ns.clear()
    shell.user_ns.update(start)
    magic = run_cell(shell, f"%%gpumem {options}\n{body}", skip=skip)
    return plain, magic, baseline


def _output_name(options: str) -> str:
    try:
        words = shlex.split(options)
    except ValueError:
        return ""
    return words[words.index("-o") + 1] if "-o" in words[:-1] else ""


def _numbered(text: str, count: int) -> str:
    text = re.sub(r"\d[\d.e+-]* (ns|us|µs|ms|s)\b", "T", text)  # %time's figures
    text = text.replace(f"In[{count}]", "In[N]").replace(f"Out[{count}]", "Out[N]")
    return re.sub(rf"<ipython-input-{count}-[0-9a-f]+>", "<cell N>", text)


def _cell_number(filename: str) -> int | None:
    match = re.search(r"ipython-input-(\d+)-", filename)
    return int(match.group(1)) if match else None


def _plain(text: str) -> str:
    return _ADDRESS.sub("0x?", text)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a half-built object of the cell's own
        return f"<repr failed: {type(exc).__name__}>"
