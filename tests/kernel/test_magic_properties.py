"""Generated option lines and bodies: `%%gpumem` refuses the line or behaves as the plain cell.

For every example the body runs as a plain cell and under `%%gpumem OPTIONS` from the same
namespace (cell_compare.compare). Either the magic raised a UsageError, leaving the names as
they were, writing nothing and recording no report (the body did not run), or the user sees
the same as for the plain cell: success, names, the value shown, the error's type and line,
the text written and other displays. The seed is fixed, so CI runs the same examples.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

from cell_compare import NO_LOOP, compare
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.report.record import Report

EXAMPLES = 300
SETUP = "import asyncio\nimport torch\nseed = 3"

# Lines of Python and IPython that succeed, fail when run, fail to compile, print, display,
# await, interrupt or exit (and "%pwd;", a UsageError of the body's own).
LINES = [
    "a = 1",
    "b = a + 1",
    "a",
    "a + seed",
    "print('p', seed)",
    "1 / 0",
    "raise ValueError('v')",
    "await asyncio.sleep(0)",
    "c = await asyncio.sleep(0, 7)",
    "async def co():\n    return 4",
    "await co()",
    "del a",
    "if seed:\n    d = 2\nd",
    "for i in range(2):\n    i",
    "x = (",
    "return 5",
    "yield 1",
    "    indented = 1",
    "%time e = 3",
    "e",
    "_",
    "# a comment",
    "",
    "import math",
    "math.pi",
    "def g():\n    return h",
    "g()",
    "display('shown')",
    "raise KeyboardInterrupt",
    "raise SystemExit",
    "t = torch.ones(4)",
    "t.sum().item()",
    "a = 1;",
    "%pwd",
    "lambda: 1",
    "[k for k in range(3)]",
]

TMP = "{tmp}"  # replaced by the test's own folder
WORDS = [
    "-o r", "-o print", "-o _", "-o __builtins__", "-o In", "-o _12", "-o class", "-o",
    "--name first", "--name 'two words'", '--name "x', "--name=eq", "--name", "--nam x",
    "--quiet", "--qu", "--quiet=1", "--no-trace", "--no",
    "--top 3", "--top ²", "--top 0", "--top=-1",
    "--device all", "--device 0", "--device ²", "--device 99", "--device",
    "--budget 1KiB", "--budget 0.4", "--budget 1", "--budget 16GiB", "--budget lots",
    f"--snapshot {TMP}/s.pickle", f"--snapshot {TMP}", "--snapshot ''", f"--snapshot '{TMP}/a b'",
    "extra", "'", '"', "\\", "-", "--",
]  # fmt: skip
# Option-line text: no line breaks (those would end the magic line and start the body).
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=0, max_size=6)


VALID = [
    "-o r", "--name first", "--name 'two words'", "--quiet", "--no-trace", "--top 3",
    "--device all", "--budget 1KiB", "--budget 1", f"--snapshot {TMP}/s.pickle",
]  # fmt: skip


@st.composite
def option_lines(draw: st.DrawFn) -> str:
    """Half of the lines from options that are allowed, half from anything at all."""
    if draw(st.booleans()):
        return " ".join(draw(st.lists(st.sampled_from(VALID), unique=True, max_size=3)))
    words = draw(
        st.lists(
            st.one_of(
                st.sampled_from(WORDS),
                TEXT.map(lambda t: "--name " + shlex.quote(t)),
                TEXT.map(lambda t: "-o " + shlex.quote(t)),
                TEXT,
            ),
            max_size=4,
        )
    )
    return " ".join(words)


@st.composite
def bodies(draw: st.DrawFn) -> str:
    lines = draw(st.lists(st.sampled_from(LINES), min_size=1, max_size=4))
    body = "\n".join(lines)
    if draw(st.booleans()):
        body += draw(st.sampled_from([";", " ;", "; # quiet"]))
    head = draw(st.sampled_from(["", "\n", "\n\n", "  \n"]))
    tail = draw(st.sampled_from(["", "\n", "\n\n", "\n# end"]))
    return head + body + tail


def test_a_magic_cell_is_refused_or_is_the_plain_cell(
    shell: InteractiveShell, tmp_path: Path
) -> None:
    ran: list[str] = []  # "refused" or "same", one per example

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        options=option_lines(),
        body=bodies(),
        mode=st.sampled_from(["last_expr", "all", "last", "none", "last_expr_or_assign"]),
    )
    def check(options: str, body: str, mode: str) -> None:
        options = options.replace(TMP, str(tmp_path))
        assert shell.run_cell(SETUP).success
        shell.ast_node_interactivity = mode
        try:
            plain, magic, baseline = compare(shell, options, body)
        finally:
            shell.ast_node_interactivity = "last_expr"
        refused = magic.result.error_in_exec
        if isinstance(refused, UsageError) and str(refused) != str(plain.result.error_in_exec):
            ran.append("refused")
            assert magic.seen.names == baseline, "the body ran"
            assert magic.reports == 0, "the body was tracked"
            assert magic.seen.text == "" and magic.seen.displays == ()
            assert magic.stderr.startswith("UsageError: ")
            return
        ran.append("same")
        assert magic.reports == 1 or magic.result.error_before_exec is not None  # not compiled
        if NO_LOOP in str(plain.result.error_in_exec):
            # The body awaits but does not compile as a whole, so IPython runs it without a
            # loop and fails the cell. The magic fails it with the same error, raised at the
            # awaiting line (the plain cell names no line, and shows a GeneratorExit later).
            assert NO_LOOP in str(magic.result.error_in_exec)
            assert replace(magic.seen, error=None, text="") == replace(
                plain.seen, error=None, text=""
            )
            return
        assert magic.seen == plain.seen
        words = shlex.split(options)
        if "-o" in words and magic.reports:
            assert isinstance(shell.user_ns[words[words.index("-o") + 1]], Report)

    check()
    assert len(ran) >= EXAMPLES
    assert ran.count("refused") > EXAMPLES // 5 and ran.count("same") > EXAMPLES // 5
