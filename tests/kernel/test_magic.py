"""`%%gpumem` in a real IPython shell (CPU: no CUDA device here)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem import logbook
from jupyter_gpumem.report.record import MIME_TYPE, NO_CUDA, Report
from jupyter_gpumem.units import format_bytes


def _callbacks(ip: InteractiveShell) -> dict[str, int]:
    return {name: len(cbs) for name, cbs in ip.events.callbacks.items()}


def test_load_and_unload_leave_no_hooks() -> None:
    import torch

    ip = InteractiveShell.instance()
    original = torch.cuda.memory._record_memory_history
    before = _callbacks(ip)
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    assert "gpumem" in ip.magics_manager.magics["cell"]
    assert "gpumem" in ip.magics_manager.magics["line"]
    assert torch.cuda.memory._record_memory_history is not original  # the recording guard
    ip.run_line_magic("unload_ext", "jupyter_gpumem")
    assert "gpumem" not in ip.magics_manager.magics["cell"]
    assert "gpumem" not in ip.magics_manager.magics["line"]
    assert "GpuMemMagics" not in ip.magics_manager.registry
    assert torch.cuda.memory._record_memory_history is original
    assert _callbacks(ip) == before


def test_importing_the_package_imports_neither_torch_nor_pynvml() -> None:
    code = (
        "import sys, jupyter_gpumem, jupyter_gpumem.ipython.magic, jupyter_gpumem.report;"
        "bad = {'torch', 'pynvml'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("line", "allowed"),
    [
        ("--bogus", "usage: %%gpumem"),
        ("--device gpu1", "device index (0, 1, ...) or 'all'"),
        ("--device -1", "device index (0, 1, ...) or 'all'"),
        ("--budget lots", "512MiB, 16GiB, 2.5GB"),
        ("--budget 0GiB", "greater than zero"),
        ("-o 1abc", "Python variable name"),
        ("-o class", "Python variable name"),
        ("--snapshot /no/such/dir/x.pickle", "does not exist"),
        ("--snapshot s.pickle --no-trace", "cannot be combined"),
    ],
)
def test_bad_options_raise_usage_error_and_do_not_run_the_cell(
    shell: InteractiveShell, line: str, allowed: str
) -> None:
    shell.user_ns.pop("ran", None)
    with pytest.raises(UsageError, match=re.escape(allowed)):
        shell.run_cell_magic("gpumem", line, "ran = True")
    assert "ran" not in shell.user_ns
    assert logbook.reports() == []


def test_unknown_line_command_names_the_allowed_ones(shell: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="status, history, monitor"):
        shell.run_line_magic("gpumem", "explode")


def test_a_raising_cell_propagates_its_exception_and_still_reports(shell: InteractiveShell) -> None:
    result = shell.run_cell("%%gpumem -o r --name failing\nx = 1\nraise ValueError('boom 42')")
    assert isinstance(result.error_in_exec, ValueError)
    assert str(result.error_in_exec) == "boom 42"
    assert shell.user_ns["x"] == 1
    report = shell.user_ns["r"]
    assert report.status == "error"
    assert report.error == "ValueError: boom 42"
    assert logbook.reports()[-1] is report


def test_cpu_only_runs_the_cell_unchanged_and_says_so(shell: InteractiveShell) -> None:
    result = shell.run_cell("%%gpumem -o r\nimport torch\ny = torch.ones(3).sum().item()\ny * 2")
    assert result.success
    assert result.result == 6.0  # the last expression's value comes through
    assert shell.user_ns["y"] == 3.0
    report: Report = shell.user_ns["r"]
    assert report.cuda_available is False
    assert [d.device for d in report.devices] == ["cpu"]  # the CPU stands in: tensor memory only
    assert report.source == "cpu-dispatch"
    assert NO_CUDA in report.notes
    bundle = report._repr_mimebundle_()
    plain = f"No CUDA device: the figures are CPU tensor memory (peak {format_bytes(report.peak_allocated_bytes)})."
    for shown in (bundle["text/plain"], bundle["text/html"], "".join(bundle[MIME_TYPE]["notes"])):
        assert plain in shown
        assert (
            "no GPU memory was measured" not in shown
        )  # under a peak, that read as a contradiction
    assert bundle[MIME_TYPE]["cuda_available"] is False


def test_quiet_displays_nothing_and_stores_the_report(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("%%gpumem --quiet -o r\nz = 5")
    assert "gpumem" not in capsys.readouterr().out
    assert shell.user_ns["r"] is logbook.reports()[-1]


def test_report_is_displayed_as_a_mime_bundle(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_cell("%%gpumem --name shown\nz = 5")
    out = capsys.readouterr().out
    assert "gpumem shown:" in out


def test_history_magic_is_compact_and_history_gives_every_number(shell: InteractiveShell) -> None:
    shell.run_cell("%%gpumem --name first --quiet\nimport torch\na = torch.ones(1024, 1024)")
    shell.run_cell("%%gpumem --name second --quiet\nb = 2")
    shown = shell.run_line_magic("gpumem", "history")
    import jupyter_gpumem

    text = str(shown)
    head, first, second = text.splitlines()
    assert head.split() == ["#", "name", "peak", "reserved", "peak", "at", "wall"]
    assert first.split()[1] == "first" and first.split()[3] == "MiB"  # units at the edge
    assert "second" in second and "nan" not in text.lower()
    assert shown._repr_mimebundle_()["text/plain"] == text
    assert "<table" in shown._repr_mimebundle_()["text/html"]
    frame = jupyter_gpumem.history()
    assert list(frame["name"]) == ["first", "second"]
    assert {"id", "peak_allocated_bytes", "peak_reserved_bytes", "wall_s"} <= set(frame.columns)


@pytest.mark.parametrize(
    "line", ["monitor --interval fast", "monitor --interval 0.01", "monitor --colour red"]
)
def test_monitor_bad_arguments_say_what_is_allowed(shell: InteractiveShell, line: str) -> None:
    with pytest.raises(
        UsageError, match=re.escape("%gpumem monitor [--interval SECONDS (>= 0.25)]")
    ):
        shell.run_line_magic("gpumem", line)


def test_the_line_magic_shows_its_help_as_output(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    for flag in ("--help", "-h"):
        assert shell.run_cell(f"%gpumem {flag}").success
        shown = capsys.readouterr()
        assert shown.err == ""
        assert re.match(r"(?s)usage: %gpumem \[status.*free .*monitor   live", shown.out)
