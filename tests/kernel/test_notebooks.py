"""The shipped notebooks run headlessly on the CPU, as the README's main command runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbconvert import HTMLExporter

from jupyter_gpumem.__main__ import main
from jupyter_gpumem.ipython.display import WIDGET_VIEW
from jupyter_gpumem.report.record import MIME_TYPE, SCHEMA

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "tuner.ipynb", "will_it_run.ipynb"])
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
    assert reports and all(r["schema"] == SCHEMA for r in reports)
    assert "report(s) from" in capsys.readouterr().out
    # One timeline per report: no front end answered, so no widget view beside the HTML's SVG.
    bundles = [o.get("data", {}) for c in executed.cells for o in c.get("outputs", [])]
    assert not [b for b in bundles if WIDGET_VIEW in b and MIME_TYPE in b]
    page, _ = HTMLExporter().from_notebook_node(executed)
    expected = sum(len(_main_timeline(r)) > 1 for r in reports)
    assert expected and page.count('class="jp-gpumem-timeline"') == expected
    stderr = "".join(
        "".join(o.get("text", ""))
        for c in executed.cells
        for o in c.get("outputs", [])
        if o.get("name") == "stderr"
    )
    assert "loss_type" not in stderr, stderr  # transformers' warning of an unnamed loss
    if name == "will_it_run.ipynb":
        _says_the_kv_cache_at_the_prefill_peak(executed)


def _says_the_kv_cache_at_the_prefill_peak(executed: Any) -> None:
    """The notebook promises the estimate's KV cache on its own line: at a prefill peak,
    the line of what the prompt's tokens hold."""
    shown = [
        str(o["data"]["text/plain"])
        for c in executed.cells
        for o in c.get("outputs", [])
        if "gpumem estimate: generate: 8 x 1024 tokens" in str(o.get("data", {}).get("text/plain"))
    ]
    assert shown, "no estimate of 8 x 1024 tokens shown"
    lines = shown[0].splitlines()
    below = lines[lines.index("at the peak (prefill):") + 1 :]
    assert any(line.strip().startswith("kv cache ") for line in below), shown[0]


def _main_timeline(report: dict[str, Any]) -> list[float]:
    main = next(d for d in report["devices"] if d["device"] == report["main_device"])
    return list((main.get("timeline") or {}).get("t_s") or [])
