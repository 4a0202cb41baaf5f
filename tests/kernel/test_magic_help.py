"""`%%gpumem --help` and `-h`: the help, shown as IPython shows a UsageError, and no cell run."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem import logbook
from jupyter_gpumem.ipython.cell_options import CELL_HELP


@pytest.mark.parametrize("line", ["--help", "-h", "-o r --help", "--bogus -h", "--help --top 0"])
def test_help_prints_the_usage_and_does_not_run_the_body(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    shell.user_ns.pop("ran", None)
    result = shell.run_cell(f"%%gpumem {line}\nran = True")
    assert isinstance(result.error_in_exec, UsageError)
    shown = capsys.readouterr()
    assert "UsageError: help for %%gpumem (the cell was not run)\n\n" + CELL_HELP in shown.err
    assert "usage: %%gpumem [-h] [-o VAR]" in shown.err
    assert "-h, --help       show this help; the cell is not run" in shown.err
    assert "ran" not in shell.user_ns and "r" not in shell.user_ns
    assert logbook.reports() == []


def test_a_label_that_reads_like_help_is_a_label(shell: InteractiveShell) -> None:
    assert shell.run_cell("%%gpumem -o r --quiet --name -h\nran = True").success
    assert shell.user_ns["ran"] is True and shell.user_ns["r"].name == "-h"


def test_an_abbreviated_help_is_pointed_at_the_full_option(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="spelled out in full: --help"):
        shell.run_cell_magic("gpumem", "--hel", "ran = True")
