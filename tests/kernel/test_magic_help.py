"""`%%gpumem --help` and `-h`: the help as plain output, every line command in it, no cell run."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem import logbook
from jupyter_gpumem.ipython.cell_options import CELL_HELP
from jupyter_gpumem.ipython.magic import HELP, LINE_COMMANDS, GpuMemMagics


@pytest.mark.parametrize("line", ["--help", "-h", "-o r --help", "--bogus -h", "--help --top 0"])
def test_help_prints_the_usage_and_does_not_run_the_body(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    shell.user_ns.pop("ran", None)
    result = shell.run_cell(f"%%gpumem {line}\nran = True")
    assert result.success  # help, not an error: no red box
    shown = capsys.readouterr()
    assert shown.err == "" and shown.out == HELP + "\n"
    assert shown.out.startswith(CELL_HELP)
    assert "usage: %%gpumem [-h] [-o VAR]" in shown.out
    assert "-h, --help       show this help; the cell is not run" in shown.out
    for command in LINE_COMMANDS:  # %gpumem free too
        assert f"\n  {command}  " in shown.out
    assert "ran" not in shell.user_ns and "r" not in shell.user_ns
    assert logbook.reports() == []


@pytest.mark.parametrize("cell", ["%%gpumem --help", "%%gpumem -h\n", "%%gpumem --quiet -h"])
def test_help_in_a_cell_of_its_own_is_shown(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cell: str
) -> None:
    result = shell.run_cell(cell)  # IPython refuses an empty body before the magic is called
    assert result.success and capsys.readouterr().out == HELP + "\n"
    assert logbook.reports() == []


def test_an_empty_body_without_help_is_still_refused(shell: InteractiveShell) -> None:
    result = shell.run_cell("%%gpumem --quiet")
    assert isinstance(result.error_in_exec, UsageError)
    assert "the cell body is empty" in str(result.error_in_exec)


def test_help_of_a_body_that_awaits_is_shown_too(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.user_ns.pop("ran", None)
    result = shell.run_cell("%%gpumem -h\nimport asyncio\nawait asyncio.sleep(0)\nran = True")
    assert result.success and capsys.readouterr().out == HELP + "\n"
    assert "ran" not in shell.user_ns


def test_the_docstring_is_the_help(shell: InteractiveShell) -> None:
    assert GpuMemMagics.gpumem.__doc__ == HELP


def test_a_label_that_reads_like_help_is_a_label(shell: InteractiveShell) -> None:
    assert shell.run_cell("%%gpumem -o r --quiet --name -h\nran = True").success
    assert shell.user_ns["ran"] is True and shell.user_ns["r"].name == "-h"


def test_an_abbreviated_help_is_pointed_at_the_full_option(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="spelled out in full: --help"):
        shell.run_cell_magic("gpumem", "--hel", "ran = True")
