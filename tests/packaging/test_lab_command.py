"""``python -m jupyter_gpumem lab`` opens working copies of the shipped notebooks in a git-ignored
folder, so running them in JupyterLab (which saves outputs into the file it opened) leaves the
committed notebooks and ``git status`` clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from jupyter_gpumem import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "notebooks").glob("*.ipynb"))


class Launches:
    """Stands in for starting JupyterLab: records the folder and the command."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, list[str]]] = []

    def __call__(self, folder: Path, command: list[str]) -> int:
        self.calls.append((folder, command))
        return 0


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    launches = Launches()
    monkeypatch.setattr(cli, "_exec_in", launches)
    return launches


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


def _save_a_run(path: Path) -> None:
    """What JupyterLab's save writes after a run: outputs and counts into the opened file."""
    notebook = nbformat.read(path, as_version=4)
    for count, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
    nbformat.write(notebook, path)


def test_the_checkout_ships_its_notebooks() -> None:
    assert {"quickstart.ipynb", "tuner.ipynb", "will_it_run.ipynb"} <= {p.name for p in SHIPPED}
    assert cli.shipped_notebooks() == SHIPPED


def test_lab_copies_every_notebook_and_opens_the_quickstart_in_the_copies(
    tmp_path: Path, launches: Launches
) -> None:
    folder = tmp_path / "copies"
    assert cli.main(["lab", "--dir", str(folder), "--allow-root", "--no-browser"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [p.name for p in SHIPPED]
    for source in SHIPPED:
        assert (folder / source.name).read_bytes() == source.read_bytes()
    opened = [sys.executable, "-m", "jupyterlab", "quickstart.ipynb"]
    assert launches.calls == [(folder, [*opened, "--allow-root", "--no-browser"])]


def test_running_the_copies_leaves_git_status_clean(
    tmp_path: Path, launches: Launches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone's worth of the repository: its .gitignore and notebooks, committed."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    shutil.copyfile(ROOT / ".gitignore", repo / ".gitignore")
    for source in SHIPPED:
        shutil.copyfile(source, repo / "notebooks" / source.name)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "shipped")

    monkeypatch.chdir(repo)
    assert cli.main(["lab"]) == 0  # the README's command, from the repository root
    ((folder, _),) = launches.calls
    assert folder == Path("gpumem-notebooks")
    copies = sorted((repo / folder).glob("*.ipynb"))
    assert [p.name for p in copies] == [p.name for p in SHIPPED]
    for copy in copies:
        _save_a_run(copy)
    assert _git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    for source in SHIPPED:
        assert (repo / "notebooks" / source.name).read_bytes() == source.read_bytes()


def test_a_second_lab_keeps_the_users_copies_unless_fresh(
    tmp_path: Path, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "copies"
    assert cli.main(["lab", "--dir", str(folder)]) == 0
    quickstart = folder / "quickstart.ipynb"
    _save_a_run(quickstart)
    ran = quickstart.read_bytes()
    capsys.readouterr()

    assert cli.main(["lab", "--dir", str(folder)]) == 0
    assert quickstart.read_bytes() == ran
    assert f"kept your copy {quickstart}" in capsys.readouterr().out

    assert cli.main(["lab", "--dir", str(folder), "--fresh"]) == 0
    assert quickstart.read_bytes() == (ROOT / "notebooks" / "quickstart.ipynb").read_bytes()


def test_lab_refuses_to_open_the_shipped_notebooks_themselves(
    launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p: p.read_bytes() for p in SHIPPED}
    assert cli.main(["lab", "--dir", str(ROOT / "notebooks"), "--fresh"]) == 2
    assert "holds the shipped notebooks; choose another folder" in capsys.readouterr().err
    assert launches.calls == []
    assert {p: p.read_bytes() for p in SHIPPED} == before


def test_demo_still_refuses_options_it_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--allow-root"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --allow-root" in capsys.readouterr().err
