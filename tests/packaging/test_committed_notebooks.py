"""Every committed notebook is committed without outputs, so running one leaves `git status` clean.

JupyterLab saves what a run produced (outputs, execution counts, widget state) into the file it
ran; a notebook committed without them can only gain them in a user's copy. Nothing of ours
runs a committed notebook in place: `python -m jupyter_gpumem lab` opens copies in the git-ignored
gpumem-notebooks/ (test_lab_command.py), Galata uploads a copy to its server's temporary root
(and the UI run fails if a committed notebook changed), and the demo writes the executed
notebook to `--output` only.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _committed_notebooks() -> list[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = []  # not a git checkout (an sdist): the notebooks we know of
    return listed or [
        str(p.relative_to(ROOT))
        for folder in ("notebooks", "labextension/ui-tests/notebooks")
        for p in sorted((ROOT / folder).glob("*.ipynb"))
    ]


NOTEBOOKS = _committed_notebooks()


def test_the_known_notebooks_are_checked() -> None:
    assert {
        "notebooks/quickstart.ipynb",
        "notebooks/tuner.ipynb",
        "notebooks/will_it_run.ipynb",
        "labextension/ui-tests/notebooks/tuner.ipynb",
        "labextension/ui-tests/notebooks/gpus.ipynb",
    } <= set(NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_committed_without_outputs(path: str) -> None:
    notebook = json.loads((ROOT / path).read_text(encoding="utf-8"))
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code, f"{path} has no code cell"
    with_outputs = [c.get("id", i) for i, c in enumerate(code) if c.get("outputs")]
    counted = [c.get("id", i) for i, c in enumerate(code) if c.get("execution_count") is not None]
    assert not with_outputs, (
        f"{path}: cells {with_outputs} have outputs; clear them before committing"
    )
    assert not counted, (
        f"{path}: cells {counted} have execution counts; clear them before committing"
    )
    assert "widgets" not in notebook.get("metadata", {}), f"{path} carries saved widget state"
