"""A `%%gpumem` cell behaves as the plain cell: one test per row of issue 11, and a kernel run.

Each test runs the body as a plain cell and under `%%gpumem` in the same real shell, from the
same namespace, and compares what a user sees (cell_compare.Seen). Options that are not
allowed raise a UsageError naming what is, before the body runs.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cell_compare import Run, compare, run_cell, user_names
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem import logbook
from jupyter_gpumem.report.record import Report

BODY = "ran = True\nran"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    """One shell for the module: compare() starts both cells from the same names itself, and
    IPython's reset, which the shared fixture runs around every test, takes most of the time."""
    ip = InteractiveShell.instance()
    ip.reset(new_session=False)
    logbook.clear()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    yield ip
    ip.run_line_magic("unload_ext", "jupyter_gpumem")
    ip.reset(new_session=False)
    logbook.clear()


def assert_same(plain: Run, magic: Run) -> None:
    assert magic.seen == plain.seen
    assert magic.reports == 1


def assert_refused(shell: InteractiveShell, options: str, allowed: str, body: str = BODY) -> None:
    """The option line is refused with ``allowed`` in the message; the body does not run."""
    shell.user_ns.pop("ran", None)
    plain, magic, baseline = compare(shell, options, body)
    assert plain.seen.success and "ran" in plain.seen.names  # the body would have run
    assert isinstance(magic.result.error_in_exec, UsageError)
    assert allowed in str(magic.result.error_in_exec)
    assert magic.seen.names == baseline
    assert magic.reports == 0
    assert magic.seen.text == "" and magic.stderr.startswith("UsageError: ")  # IPython's way
    assert magic.seen.value is None and magic.seen.displays == ()


# -- row 1: top-level await ----------------------------------------------------------------
def test_await_at_top_level_runs_as_in_the_plain_cell(shell: InteractiveShell) -> None:
    body = "await asyncio.sleep(0)\nx = await asyncio.sleep(0, 7)\nx * 2"
    plain, magic, _ = compare(shell, "--quiet -o r", body, setup="import asyncio")
    assert_same(plain, magic)
    assert magic.seen.value == "14" and magic.seen.names["x"] == "7"
    assert shell.user_ns["r"].status == "ok"


def test_an_async_body_that_raises_names_its_line(shell: InteractiveShell) -> None:
    body = "await asyncio.sleep(0)\n\nraise KeyError('k')"
    plain, magic, _ = compare(shell, "--quiet", body, setup="import asyncio")
    assert_same(plain, magic)
    assert magic.seen.error == ("KeyError", 3)


def test_await_is_a_syntax_error_when_autoawait_is_off(shell: InteractiveShell) -> None:
    shell.autoawait = False
    try:
        plain, magic, _ = compare(
            shell, "--quiet", "await asyncio.sleep(0)", setup="import asyncio"
        )
    finally:
        shell.autoawait = True
    assert magic.seen == plain.seen
    assert magic.seen.error is not None and magic.seen.error[0] == "SyntaxError"


# -- row 2: shell quoting ------------------------------------------------------------------
def test_quoted_values_lose_their_quotes(shell: InteractiveShell, tmp_path: Path) -> None:
    plain, magic, _ = compare(shell, '--name "two words" -o r --quiet', BODY)
    assert_same(plain, magic)
    assert shell.user_ns["r"].name == "two words"
    folder = tmp_path / "a b"
    folder.mkdir()
    path = folder / "c d.pickle"
    plain, magic, _ = compare(shell, f"--snapshot '{path}' -o r --quiet", BODY)
    assert_same(plain, magic)
    plain, magic, _ = compare(shell, "--name=it\\'s -o r --quiet", BODY)
    assert_same(plain, magic)
    assert shell.user_ns["r"].name == "it's"


# -- row 3: integers that str.isdigit() accepts and int() does not -------------------------
@pytest.mark.parametrize(
    ("options", "allowed"),
    [
        ("--top ²", "--top takes a positive whole number"),
        ("--top 0", "--top takes a positive whole number"),
        ("--top 1.5", "--top takes a positive whole number"),
        ("--device ²", "device index (0, 1, ...) or 'all'"),
        ("--device -1", "device index (0, 1, ...) or 'all'"),
        ("--device gpu1", "device index (0, 1, ...) or 'all'"),
    ],
)
def test_integers_are_read_by_int(shell: InteractiveShell, options: str, allowed: str) -> None:
    assert_refused(shell, options, allowed)


def test_top_takes_what_int_takes(shell: InteractiveShell) -> None:
    plain, magic, _ = compare(shell, "--top 3 -o r --quiet", BODY)
    assert_same(plain, magic)


# -- row 4: unclosed quotes ----------------------------------------------------------------
def test_an_unclosed_quote_is_a_usage_error(shell: InteractiveShell) -> None:
    assert_refused(shell, "--name 'x", "No closing quotation")
    result = run_cell(shell, "%gpumem 'x")
    assert isinstance(result.result.error_in_exec, UsageError)
    assert "%gpumem [status | history | free | monitor" in str(result.result.error_in_exec)


# -- row 5: budgets of at least one byte ---------------------------------------------------
@pytest.mark.parametrize(
    ("options", "allowed"),
    [
        ("--budget 0.4", "at least one byte"),
        ("--budget 0", "greater than zero"),
        ("--budget lots", "512MiB, 16GiB, 2.5GB"),
        ("--budget " + "9" * 400, "more than 1 EiB"),
    ],
)
def test_a_budget_is_at_least_one_byte(shell: InteractiveShell, options: str, allowed: str) -> None:
    assert_refused(shell, options, allowed)


def test_a_budget_of_one_byte_is_kept(shell: InteractiveShell) -> None:
    plain, magic, _ = compare(shell, "--budget 0.6 -o r --quiet", BODY)
    assert_same(plain, magic)
    assert shell.user_ns["r"].budget_bytes == 1


# -- row 6: tracebacks name the plain cell's lines -----------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "\n\nx = 1\nraise ValueError('boom')",
        "x = 1\n\n\nraise ValueError('boom')\n\n",
        "def f():\n    return 1 / 0\n\nf()",
        "  \n\t\nx = (",
        "x = 1\nreturn x",
        "1 +",
    ],
)
def test_tracebacks_match_the_plain_cell(shell: InteractiveShell, body: str) -> None:
    plain, magic, _ = compare(shell, "--quiet", body)
    assert magic.seen == plain.seen
    assert not magic.seen.success
    assert "Error retrieving source code" not in magic.seen.text
    assert magic.seen.error is not None and magic.seen.error[1] not in (None, -1)
    assert magic.seen.text.count("Traceback") + magic.seen.text.count("Error:") >= 1


def test_the_traceback_shows_the_raising_line(shell: InteractiveShell) -> None:
    plain, magic, _ = compare(shell, "--quiet", "\n\nx = 1\nraise ValueError('boom')")
    assert magic.seen == plain.seen
    assert magic.seen.error == ("ValueError", 2)
    assert "In[N], line 2" in magic.seen.text
    assert "----> 2 raise ValueError('boom')" in magic.seen.text
    assert magic.seen.text.count("Traceback (most recent call last)") == 1


# -- row 7: a trailing ';' -----------------------------------------------------------------
@pytest.mark.parametrize("body", ["x = 2\nx;", "x = 2\nx ;  # quiet", "x = 2\nx", "x = 2; x"])
def test_a_trailing_semicolon_hides_the_value(shell: InteractiveShell, body: str) -> None:
    plain, magic, _ = compare(shell, "--quiet", body)
    assert_same(plain, magic)
    shown = not body.split("#")[0].rstrip().endswith(";")
    assert (magic.seen.value == "2") is shown
    assert ("Out[N]: 2" in magic.seen.text) is shown


# -- row 8: snapshot paths -----------------------------------------------------------------
def test_a_snapshot_path_is_a_writable_file(shell: InteractiveShell, tmp_path: Path) -> None:
    assert_refused(shell, f"--snapshot {tmp_path}", "is a folder")
    assert_refused(shell, "--snapshot ''", "the path of a file to write")
    assert_refused(shell, f"--snapshot {tmp_path}/", "the path of a file to write")
    assert_refused(shell, f"--snapshot {tmp_path}/no/such.pickle", "does not exist")
    assert_refused(shell, "--snapshot s.pickle --no-trace", "cannot be combined")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not _root():
        assert_refused(shell, f"--snapshot {locked}/s.pickle", "not writable")


# -- row 9: -o names -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    ["__builtins__", "print", "len", "In", "Out", "get_ipython", "exit", "quit", "_", "__",
     "___", "_i", "_ii", "_iii", "_oh", "_dh", "_ih", "_12", "_i12", "__name__", "class",
     "1abc", "a-b", "ﬁ", "open"],
)  # fmt: skip
def test_output_names_that_would_break_the_next_cell(shell: InteractiveShell, name: str) -> None:
    assert_refused(shell, f"-o {shlex.quote(name)}", "Python variable name")
    after = shell.run_cell("print('still', len([1]))")
    assert after.success


def test_an_output_name_of_ones_own_holds_the_report(shell: InteractiveShell) -> None:
    plain, magic, _ = compare(shell, "-o report_1 --quiet", BODY)
    assert_same(plain, magic)
    assert isinstance(shell.user_ns["report_1"], Report)


# -- row 10: abbreviations and repeats -----------------------------------------------------
@pytest.mark.parametrize(
    ("options", "allowed"),
    [
        ("--qu", "spelled out in full: --quiet"),
        ("--nam x", "spelled out in full: --name"),
        ("--no", "spelled out in full: --no-trace"),
        ("--quiet --quiet", "--quiet is given twice"),
        ("--name a --name b", "--name is given twice"),
        ("-o a -o b", "-o is given twice"),
        ("--name", "--name needs a value"),
        ("--name --quiet", "--name needs a value"),
        ("--quiet=yes", "--quiet takes no value"),
        ("words", "%%gpumem takes only options"),
        ("--bogus", "usage: %%gpumem"),
    ],
)
def test_options_are_spelled_out_and_given_once(
    shell: InteractiveShell, options: str, allowed: str
) -> None:
    assert_refused(shell, options, allowed)


# -- row 11: --device N beyond the devices this process sees -------------------------------
def test_a_device_this_process_does_not_see_is_refused(shell: InteractiveShell) -> None:
    import torch

    assert not torch.backends.cuda.is_built()  # the CPU build: no device at all
    assert_refused(shell, "--device 99", "sees no CUDA device")
    assert_refused(shell, "--device 0", "sees no CUDA device")
    plain, magic, _ = compare(shell, "--device all --quiet", BODY)
    assert_same(plain, magic)


class _Cuda:
    def __init__(self, count: int, initialized: bool) -> None:
        self.count, self.initialized = count, initialized
        self.asked: list[str] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        self.asked.append("device_count")
        assert self.initialized, "device_count() before CUDA is up poisons fork"
        return self.count


@pytest.mark.parametrize("initialized", [True, False])
def test_device_count_is_asked_only_once_cuda_is_up(
    monkeypatch: pytest.MonkeyPatch, initialized: bool
) -> None:
    from jupyter_gpumem.ipython import magic
    from jupyter_gpumem.ipython.cell_options import parse_options
    from jupyter_gpumem.tracking import devices

    cuda = _Cuda(2, initialized)
    monkeypatch.setitem(sys.modules, "torch", type("torch", (), {"cuda": cuda})())
    monkeypatch.setattr(devices, "_cuda_build", lambda torch: True)
    assert magic._missing_device(parse_options("--device 1")) is None
    found = magic._missing_device(parse_options("--device 2"))
    if initialized:
        assert found == "--device 2: this process sees devices 0, 1 (or 'all')"
    else:
        assert found is None  # checked after the cell, once the cell has started CUDA
        assert cuda.asked == []


def test_without_torch_a_device_index_is_checked_after_the_cell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_gpumem.ipython import magic
    from jupyter_gpumem.ipython.cell_options import parse_options

    monkeypatch.delitem(sys.modules, "torch")
    assert magic._missing_device(parse_options("--device 99")) is None


# -- row 12: line magic words --------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "allowed"),
    [
        ("history extra", "%gpumem history takes nothing after it"),
        ("status now", "%gpumem status takes nothing after it"),
        ("free all", "%gpumem free takes nothing after it"),
        ("'x", "No closing quotation"),
        ("explode", "status, history, monitor"),
    ],
)
def test_line_magic_words_are_checked(shell: InteractiveShell, line: str, allowed: str) -> None:
    with pytest.raises(UsageError, match=re.escape(allowed)):
        shell.run_line_magic("gpumem", line)


# -- %, ! and the last value ---------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "%time y = 3\ny",
        "!true\n_exit_code",
        "import math\nmath.floor(2.5)",
        "print('a')\n1\nprint('b')\n2",
        "display('shown')\n3",
        "raise KeyboardInterrupt",
        "raise SystemExit(3)",
        "# only a comment",  # (an empty body is IPython's UsageError, before any magic runs)
        "for i in range(2):\n    i",
        "    indented = 1\n    indented",
    ],
)
def test_magic_lines_and_values_as_in_the_plain_cell(shell: InteractiveShell, body: str) -> None:
    plain, magic, _ = compare(shell, "--quiet", body)
    assert magic.seen == plain.seen


@pytest.mark.parametrize("mode", ["all", "last", "none", "last_expr_or_assign"])
def test_every_interactivity_mode(shell: InteractiveShell, mode: str) -> None:
    shell.ast_node_interactivity = mode
    try:
        plain, magic, _ = compare(shell, "--quiet", "a = 1\na\nb = a + 1\nb")
    finally:
        shell.ast_node_interactivity = "last_expr"
    assert_same(plain, magic)


# -- the cell's number and its failure -----------------------------------------------------
def test_the_report_has_the_cells_own_execution_count(shell: InteractiveShell) -> None:
    first = run_cell(shell, "%%gpumem -o r --quiet\nx = 1")
    second = run_cell(shell, "%%gpumem -o s --quiet\nx = 2")
    assert shell.user_ns["r"].execution_count == first.result.execution_count
    assert shell.user_ns["s"].execution_count == second.result.execution_count
    assert logbook.reports()[-1].execution_count == second.result.execution_count


def test_a_failing_body_fails_the_cell_once(shell: InteractiveShell) -> None:
    """IPython shows the error once; the cell fails, so Run All stops there."""
    magic = run_cell(shell, "%%gpumem -o r --quiet\nx = 1\n1 / 0")
    result: Any = magic.result
    assert not result.success and isinstance(result.error_in_exec, ZeroDivisionError)
    assert shell.last_execution_succeeded is False
    assert magic.seen.text.count("ZeroDivisionError") == 2  # the header and the last line
    assert shell.user_ns["r"].status == "error"
    after = shell.run_cell("y = 1")
    assert after.success and shell.last_execution_succeeded


def test_run_cell_magic_from_code_raises_the_error(shell: InteractiveShell) -> None:
    with pytest.raises(ZeroDivisionError):
        shell.run_cell_magic("gpumem", "--quiet", "1 / 0")
    assert shell.run_cell_magic("gpumem", "--quiet", "x = 4") is None
    assert shell.user_ns["x"] == 4


def test_no_hook_is_left_after_failing_or_interrupted_cells(shell: InteractiveShell) -> None:
    before = {name: len(cbs) for name, cbs in shell.events.callbacks.items()}
    transforms = list(shell.input_transformers_post)
    shell.run_cell("import asyncio")
    for body in ("1 / 0", "raise KeyboardInterrupt", "x = (", "await asyncio.sleep(0)\n1/0"):
        run_cell(shell, f"%%gpumem --quiet\n{body}")
    assert {name: len(cbs) for name, cbs in shell.events.callbacks.items()} == before
    assert shell.input_transformers_post == transforms
    assert "quiet" not in vars(shell.displayhook)


def test_unload_removes_the_await_transformer(shell: InteractiveShell) -> None:
    assert len(shell.input_transformers_post) == 1
    shell.run_line_magic("unload_ext", "jupyter_gpumem")
    assert shell.input_transformers_post == []
    shell.run_line_magic("load_ext", "jupyter_gpumem")


# -- in a kernel: its event loop runs while the cell runs ----------------------------------
def test_in_a_kernel_async_bodies_run_and_run_all_stops_at_an_error() -> None:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    cells = [
        "%load_ext jupyter_gpumem\nimport asyncio",
        "%%gpumem --quiet -o r\nawait asyncio.sleep(0)\nx = 5\nx",
        "(r.execution_count, r.status)",
        "%%gpumem --quiet\nx + 1;",
        "%%gpumem --quiet\n\n\ny = 1\nraise ValueError('v')",
        "after = 1",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    with pytest.raises(CellExecutionError, match="ValueError"):
        NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = [c.get("outputs", []) for c in nb.cells]
    assert outputs[1] == [_result(2, "5")]
    assert outputs[2] == [_result(3, "(2, 'ok')")]
    assert outputs[3] == []
    (error,) = outputs[4]
    assert error["output_type"] == "error" and error["ename"] == "ValueError"
    assert "line 2" in "".join(error["traceback"])
    assert nb.cells[5].get("execution_count") is None  # Run All stopped at the error


def _result(count: int, text: str) -> dict[str, Any]:
    return {
        "output_type": "execute_result",
        "execution_count": count,
        "data": {"text/plain": text},
        "metadata": {},
    }


def _root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0


def test_user_names_leave_out_ipythons_own(shell: InteractiveShell) -> None:
    result = shell.run_cell("mine = 1\n2", store_history=True)
    names = user_names(shell)
    assert names["mine"] == "1"
    count = result.execution_count
    ipython = {"_", "__", "_i", "_ii", f"_{count}", f"_i{count}", "In", "Out", "get_ipython"}
    assert ipython <= set(shell.user_ns) and not ipython & set(names)


def test_a_nested_run_cell_magic_can_be_awaited_as_at_top_level(shell: InteractiveShell) -> None:
    shell.run_cell("import torch")
    nested = (
        'await get_ipython().run_cell_magic("gpumem", "-o inner --quiet", "x = torch.ones(10)")'
    )
    result = shell.run_cell(f"%%gpumem -o outer --quiet\n{nested}\ny = 1")
    assert result.success, result.error_in_exec
    assert shell.user_ns["inner"].peak_allocated_bytes == 40
    assert shell.user_ns["outer"].status == "ok" and shell.user_ns["y"] == 1
    plain = 'get_ipython().run_cell_magic("gpumem", "-o again --quiet", "z = torch.ones(5)")'
    assert shell.run_cell(f"%%gpumem --quiet\n{plain}").success
    again = shell.user_ns["again"]
    assert again.peak_allocated_bytes - again.allocated_before_bytes == 20


FUNC = """
from torch.func import functional_call, grad, jacrev
params = {k: v.detach() for k, v in net.named_parameters()}
g = grad(lambda p, x: functional_call(net, p, (x,)).sum())(params, x)
j = jacrev(lambda x: net(x).sum())(x)
"""


def _net(shell: InteractiveShell) -> None:
    shell.run_cell(
        "import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
        "net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))\nx = torch.randn(3, 4)"
    )


def test_torch_func_transforms_run_as_in_the_plain_cell(shell: InteractiveShell) -> None:
    torch = pytest.importorskip("torch")
    _net(shell)
    assert shell.run_cell(FUNC).success
    plain = {k: v.clone() for k, v in shell.user_ns["g"].items()}, shell.user_ns["j"].clone()
    result = shell.run_cell(f"%%gpumem -o r --quiet\n{FUNC}")
    assert result.success, result.error_in_exec
    assert all(torch.equal(plain[0][k], v) for k, v in shell.user_ns["g"].items())
    assert torch.equal(plain[1], shell.user_ns["j"])
    assert shell.user_ns["r"].status == "ok"


COMPILED = """
calls = []
def backend(gm, inputs):
    calls.append(len(inputs))
    return gm.forward
f = torch.compile(lambda t: (t * 2).relu(), backend=backend)
out = f(x)
compiled = torch.compile(net, backend="aot_eager")
kind = type(compiled(x).grad_fn).__name__
"""


def test_torch_compile_compiles_as_in_the_plain_cell(shell: InteractiveShell) -> None:
    _net(shell)
    shell.run_cell("import torch._dynamo\ntorch._dynamo.reset()")
    assert shell.run_cell(COMPILED).success
    plain = shell.user_ns["calls"], shell.user_ns["kind"]
    shell.run_cell("torch._dynamo.reset()")
    result = shell.run_cell(f"%%gpumem --quiet\n{COMPILED}")
    assert result.success, result.error_in_exec
    assert (
        (shell.user_ns["calls"], shell.user_ns["kind"])
        == plain
        == ([1], "CompiledFunctionBackward")
    )


def test_a_backend_that_fails_fails_the_tracked_cell_too(shell: InteractiveShell) -> None:
    _net(shell)
    cell = (
        "import torch._dynamo\ntorch._dynamo.reset()\n"
        "def broken(gm, inputs):\n    raise ValueError('no backend')\n"
        "torch.compile(lambda t: t + 1, backend=broken)(x)\n"
    )
    plain = shell.run_cell(cell)
    tracked = shell.run_cell(f"%%gpumem --quiet\n{cell}")
    assert not plain.success and not tracked.success
    assert type(tracked.error_in_exec) is type(plain.error_in_exec)
    assert type(plain.error_in_exec).__name__ == "BackendCompilerFailed"


def test_a_failing_op_shows_no_frame_of_ours(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("import torch\na, b = torch.ones(3), torch.ones(4)")
    capsys.readouterr()
    shell.run_cell("c = a + b")
    plain = capsys.readouterr().out
    shell.run_cell("%%gpumem --quiet\nc = a + b")
    tracked = capsys.readouterr().out
    assert "jupyter_gpumem" not in tracked and "_ops.py" not in tracked
    assert "eval_frame.py" not in tracked and "_compile.py" not in tracked
    assert tracked.count("File ") == plain.count("File ") == 0
    assert "must match the size of tensor b (4)" in tracked


def test_compiling_a_module_warns_nothing_and_adds_no_name(shell: InteractiveShell) -> None:
    _net(shell)
    shell.run_cell("import warnings, torch._dynamo\ntorch._dynamo.reset()")
    cell = (
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    y = torch.compile(net, backend='eager')(x)\n"
        "messages = [str(w.message) for w in seen]"
    )
    before = set(shell.user_ns)
    assert shell.run_cell(f"%%gpumem --quiet\n{cell}").success
    assert shell.user_ns["messages"] == []
    assert set(shell.user_ns) - before <= {"y", "seen", "messages"}
    assert "__warningregistry__" not in shell.user_ns
