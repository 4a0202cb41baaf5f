"""The shipped notebooks run headlessly on the CPU, as the README's main command runs them."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from jupyter_gpumem.__main__ import main
from jupyter_gpumem.report.record import MIME_TYPE

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "tuner.ipynb"])
def test_notebook_executes_and_reports(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / name
    assert (
        main(
            ["demo", "--notebook", str(NOTEBOOKS / name), "--output", str(out), "--timeout", "300"]
        )
        == 0
    )
    executed = nbformat.read(out, as_version=4)
    errors = [
        o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors, errors
    reports = [
        o["data"][MIME_TYPE]
        for c in executed.cells
        for o in c.get("outputs", [])
        if MIME_TYPE in o.get("data", {})
    ]
    assert reports and all(r["schema"] == 1 for r in reports)
    assert "report(s) from" in capsys.readouterr().out
