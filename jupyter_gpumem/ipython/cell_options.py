"""`%%gpumem` options: split as a shell would, every value checked before the cell runs.

Options are spelled out in full (no abbreviations) and given at most once. Each error is a
``UsageError`` that says what is allowed. Nothing here imports torch: whether a device
index exists is the magic's question, asked where it cannot initialise CUDA.
"""

from __future__ import annotations

import builtins
import keyword
import os
import re
import shlex
import stat
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass, field

from IPython.core.error import UsageError

from jupyter_gpumem.session import MeasureOptions, RecordOptions
from jupyter_gpumem.units import SIZE_HELP, parse_size

CELL_USAGE = (
    "%%gpumem [-h] [-o VAR] [--name LABEL] [--device N|all] [--budget SIZE] [--snapshot PATH] "
    "[--top N] [--estimate VAR] [--no-trace] [--quiet]"
)
CELL_HELP = f"""Track the memory of a cell: exact peak allocated/reserved per device.

usage: {CELL_USAGE}

  -h, --help       show this help; the cell is not run (so does %%gpumem?)
  -o VAR           store the report in the variable VAR
  --name LABEL     label the report
  --device N|all   report device N, or every device (default: the devices the cell used)
  --budget SIZE    warn when the peak exceeds SIZE (512MiB, 16GiB, 2.5GB, bytes; at least 1 B)
  --snapshot PATH  write the allocator snapshot pickle to the file PATH
  --top N          list the N largest tensors the cell left alive (default 10)
  --estimate VAR   set the estimate in VAR (estimate_generate, Trial.estimate) beside the
                   measured peak: "estimated X, measured Y (error Z%)"
  --no-trace       exact peaks from the counters only (the cheapest mode)
  --quiet          show nothing; the report is still stored

Values are quoted as in a shell (--name "two words"); --opt=VALUE also works.
"""
# What parse_options raises for --help; the magic asks `asks_help` first and prints the help.
HELP_SHOWN = f"help for %%gpumem (the cell was not run)\n\n{CELL_HELP}"

_VALUED = ("-o", "--name", "--device", "--budget", "--snapshot", "--top", "--estimate")
_FLAGS = ("--no-trace", "--quiet")
_HELP = ("-h", "--help")
# Names IPython keeps in the user namespace; binding a report to one breaks the next cell.
_IPYTHON_NAMES = frozenset(
    {"In", "Out", "get_ipython", "exit", "quit", "_oh", "_dh", "_ih", "_exit_code", "_sh"}
)
_IPYTHON_PATTERN = re.compile(r"_+|_i{1,3}|_i?\d+")
VARIABLE_HELP = (
    "a Python variable name that is not a keyword, a builtin or one of IPython's own names "
    "(In, Out, get_ipython, _, __, _i, _ii, _oh, _dh, _ih, _12, _i12, ...)"
)


@dataclass(frozen=True)
class Options:
    """`%%gpumem` options after validation: what is measured, and where the report goes."""

    measuring: MeasureOptions = field(default_factory=MeasureOptions)
    output: str | None = None  # the variable that receives the report
    quiet: bool = False
    estimate: str | None = None  # the variable holding the estimate the report is set beside


def split_words(line: str, usage: str) -> list[str]:
    """Words of a magic line as a POSIX shell splits them (quotes removed, no comments)."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    if os.name == "nt":
        lexer.escape = ""  # backslashes separate Windows paths
    try:
        return list(lexer)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise UsageError(f"{exc} in {line.strip()!r}: close each quote\nusage: {usage}") from None


def parse_options(line: str, *, reserved: Collection[str] = ()) -> Options:
    """Validate `%%gpumem` options; ``reserved`` are more names ``-o`` may not take.

    ``-h``/``--help`` anywhere an option may stand raises a UsageError whose message is the
    help, before any other option is judged.
    """
    words = split_words(line, CELL_USAGE)
    if _asks_help(words):
        raise UsageError(HELP_SHOWN)
    given = _given(words)
    output = given.get("-o")
    if output is not None:
        check_variable(output, reserved)
    name = given.get("--name")
    if name is not None and not name.strip():
        raise UsageError("--name needs a label that is not empty, e.g. --name train")
    devices, all_devices = _device(given.get("--device"))
    budget = _budget(given.get("--budget"))
    snapshot = given.get("--snapshot")
    trace = "--no-trace" not in given
    if snapshot is not None:
        if not trace:
            raise UsageError(
                "--snapshot needs the allocator trace; it cannot be combined with --no-trace"
            )
        snapshot = _snapshot_path(snapshot)
    top = given.get("--top")
    recording = RecordOptions(
        trace=trace, devices=devices, all_devices=all_devices, snapshot_path=snapshot
    )
    measuring = MeasureOptions(
        name=name,
        budget_bytes=budget,
        top=10 if top is None else _top(top),
        recording=recording,
    )
    estimate = given.get("--estimate")
    if estimate is not None and not estimate.isidentifier():
        raise UsageError(
            f"--estimate takes the name of a variable holding an estimate, got {estimate!r}"
        )
    return Options(measuring, output=output, quiet="--quiet" in given, estimate=estimate)


def check_variable(name: str, reserved: Collection[str] = ()) -> None:
    """UsageError unless ``name`` can hold the report without shadowing anything of Python's."""
    bad = (
        not name.isidentifier()
        or keyword.iskeyword(name)
        or unicodedata.normalize("NFKC", name) != name  # code would spell it differently
        or hasattr(builtins, name)
        or name.startswith("__")
        or name in _IPYTHON_NAMES
        or name in reserved
        or _IPYTHON_PATTERN.fullmatch(name) is not None
    )
    if bad:
        raise UsageError(f"-o needs {VARIABLE_HELP}; got {name!r}")


def asks_help(line: str) -> bool:
    """Whether the `%%gpumem` line asks for the help (a line that does not split asks nothing:
    `parse_options` says what is wrong with it)."""
    try:
        words = split_words(line, CELL_USAGE)
    except UsageError:
        return False
    return _asks_help(words)


def _asks_help(words: list[str]) -> bool:
    """Whether ``-h`` or ``--help`` stands where an option may (not as ``--name``'s value)."""
    it = iter(words)
    for word in it:
        if word in _HELP:
            return True
        if word in _VALUED:
            next(it, None)
    return False


def _given(words: list[str]) -> dict[str, str]:
    """Option -> value ('' for flags); unknown, abbreviated, repeated or valueless options raise."""
    given: dict[str, str] = {}
    it = iter(words)
    for word in it:
        option, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if option in _FLAGS:
            if eq:
                raise UsageError(f"{option} takes no value, got {word!r}\nusage: {CELL_USAGE}")
        elif option in _VALUED:
            if not eq:
                following = next(it, None)
                if following is None or following.startswith("--") or following == "-o":
                    raise UsageError(
                        f"{option} needs a value, e.g. {_EXAMPLES[option]} "
                        f"({option}=VALUE for one that starts with --)\nusage: {CELL_USAGE}"
                    )
                value = following
        else:
            raise UsageError(_unknown(word))
        if option in given:
            raise UsageError(f"{option} is given twice; give each option once\nusage: {CELL_USAGE}")
        given[option] = value
    return given


_EXAMPLES = {
    "-o": "-o report",
    "--name": '--name "first epoch"',
    "--device": "--device 0 or --device all",
    "--budget": "--budget 16GiB",
    "--snapshot": "--snapshot cell.pickle",
    "--top": "--top 20",
    "--estimate": "--estimate est",
}


def _unknown(word: str) -> str:
    if not word.startswith("-"):
        return f"unexpected {word!r}: %%gpumem takes only options\nusage: {CELL_USAGE}"
    option = word.partition("=")[0]
    near = [o for o in _VALUED + _FLAGS + _HELP if o.startswith(option) and len(option) > 2]
    hint = f" (options are spelled out in full: {' or '.join(near)})" if near else ""
    return f"unknown option {option!r}{hint}\nusage: {CELL_USAGE}"


def _device(value: str | None) -> tuple[tuple[int, ...] | None, bool]:
    if value is None:
        return None, False
    if value == "all":
        return None, True
    try:
        index = int(value)
    except ValueError:
        index = -1
    if index < 0:
        raise UsageError(f"--device takes a device index (0, 1, ...) or 'all', got {value!r}")
    return (index,), False


def _budget(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        budget = parse_size(value)
    except (ValueError, OverflowError) as exc:
        # parse_size's message says what is allowed; it is not repeated here
        reason = exc if isinstance(exc, ValueError) else f"{value!r} is too large; give {SIZE_HELP}"
        raise UsageError(f"--budget: {reason}") from None
    if budget < 1:
        raise UsageError(f"--budget needs at least one byte, got {value!r}; give {SIZE_HELP}")
    return budget


def _top(value: str) -> int:
    try:
        top = int(value)
    except ValueError:
        top = 0
    if top < 1:
        raise UsageError(f"--top takes a positive whole number of tensors, got {value!r}")
    return top


def _snapshot_path(value: str) -> str:
    """The absolute path of a file that can be written, or UsageError saying why not."""
    allowed = "--snapshot takes the path of a file to write, e.g. --snapshot cell.pickle"
    if not value.strip() or value.endswith(("/", os.sep)):
        raise UsageError(f"{allowed}; got {value!r}")
    try:
        path = os.path.abspath(os.path.expanduser(value))
        parent = os.path.dirname(path)
        mode = os.stat(path).st_mode if os.path.lexists(path) else None
        parent_ok = os.path.isdir(parent)
        writable = parent_ok and os.access(parent, os.W_OK | os.X_OK)
        file_writable = mode is None or os.access(path, os.W_OK)
    except (ValueError, OSError) as exc:  # an embedded NUL byte, a dangling link
        raise UsageError(f"{allowed}; {value!r} cannot be used: {exc}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"{allowed}; {value!r} is a folder")
    if mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{allowed}; {value!r} exists and is not a regular file")
    if not parent_ok:
        raise UsageError(f"{allowed}; the folder {parent!r} does not exist")
    if not writable or not file_writable:
        raise UsageError(f"{allowed}; {path!r} is not writable here")
    return path
