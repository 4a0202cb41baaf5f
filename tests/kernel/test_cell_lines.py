"""A `%%gpumem` cell's lines are numbered once: the report's "cell line N" is the traceback's N.

IPython numbers the lines of a cell magic's body from its first line that is not blank (the
`%%gpumem` line and leading blank lines are not compiled), and so does its traceback for the
same cell. The report names a tensor's line in that numbering, so the two agree.
"""

from __future__ import annotations

import re

import pytest
from IPython.core.interactiveshell import InteractiveShell

ANSI = re.compile(r"\x1b\[[0-9;]*m")
RAISING = "first = 1\nsecond = 2\nkept = torch.ones(1024, 256); 1 / 0\n"  # raises at body line 3


@pytest.mark.parametrize("before", ["", "\n", "\n  \n"], ids=["body", "blank line", "two blank"])
def test_the_report_names_the_line_the_traceback_names(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], before: str
) -> None:
    assert shell.run_cell("import torch").success
    capsys.readouterr()
    result = shell.run_cell(f"%%gpumem -o r --quiet\n{before}{RAISING}")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    shown = ANSI.sub("", capsys.readouterr().out)
    traceback_lines = re.findall(r"Cell In\[\d+\], line (\d+)", shown)
    assert traceback_lines == ["3"], shown
    kept = next(t for t in shell.user_ns["r"].tensors if t.name == "kept")
    assert kept.line == "cell line 3"
