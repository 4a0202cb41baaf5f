"""Command line: ``python -m jupyter_gpumem demo`` executes the quickstart notebook headlessly;
``python -m jupyter_gpumem lab`` opens working copies of the shipped notebooks in JupyterLab."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from jupyter_gpumem.ipython.display import COMM_TARGET
from jupyter_gpumem.report.record import MIME_TYPE

HERE = Path(__file__).resolve().parent
# The wheel ships the quickstart inside the package; a source checkout keeps it in notebooks/.
QUICKSTART = next(
    (
        p
        for p in (HERE / "quickstart.ipynb", HERE.parent / "notebooks" / "quickstart.ipynb")
        if p.exists()
    ),
    HERE / "quickstart.ipynb",
)
# Where `lab` puts its working copies; the repository's .gitignore names it.
WORKING_COPIES = Path("gpumem-notebooks")


def shipped_notebooks() -> list[Path]:
    """The notebooks to copy: a source checkout's notebooks/, or the quickstart a wheel ships."""
    checkout = HERE.parent / "notebooks"
    if (HERE.parent / "pyproject.toml").exists() and checkout.is_dir():
        return sorted(checkout.glob("*.ipynb"))
    return [QUICKSTART] if QUICKSTART.exists() else []


@dataclass(frozen=True)
class Copies:
    """What `copy_notebooks` did: the copies it made, and those it left as the user had them."""

    made: tuple[Path, ...]
    kept: tuple[Path, ...]


def copy_notebooks(sources: Sequence[Path], folder: Path, fresh: bool = False) -> Copies:
    """Copy ``sources`` into ``folder``; an existing copy is kept (a user's edits and outputs
    stay) unless ``fresh``. JupyterLab then saves what a run produced into the copies only."""
    folder.mkdir(parents=True, exist_ok=True)
    made, kept = [], []
    for source in sources:
        target = folder / source.name
        if target.resolve() == source.resolve():
            raise ValueError(f"{folder} holds the shipped notebooks; choose another folder")
        if target.exists() and not fresh:
            kept.append(target)
            continue
        shutil.copyfile(source, target)
        made.append(target)
    return Copies(tuple(made), tuple(kept))


def _exec_in(folder: Path, command: list[str]) -> NoReturn:
    """Become ``command`` run in ``folder``: JupyterLab gets the terminal (Ctrl-C asks, as it does)."""
    os.chdir(folder)
    os.execv(command[0], command)


def lab(
    folder: Path,
    fresh: bool,
    jupyter_args: Sequence[str],
    launch: Callable[[Path, list[str]], int] | None = None,
) -> int:
    """Copy the shipped notebooks into ``folder`` and open JupyterLab there on the quickstart."""
    if importlib.util.find_spec("jupyterlab") is None:
        print("JupyterLab is not installed: pip install jupyterlab", file=sys.stderr)
        return 2
    sources = shipped_notebooks()
    if not sources:
        print("no shipped notebooks found next to the package", file=sys.stderr)
        return 2
    try:
        copies = copy_notebooks(sources, folder, fresh)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    for path in copies.made:
        print(f"copied {path.name} to {path}")
    for path in copies.kept:
        print(f"kept your copy {path} (--fresh replaces it with the shipped one)")
    first = next((p.name for p in sources if p.name == QUICKSTART.name), sources[0].name)
    command = [sys.executable, "-m", "jupyterlab", first, *jupyter_args]
    return (launch or _exec_in)(folder, command)


def demo(notebook: Path, output: Path | None, timeout_s: int) -> int:
    """Execute ``notebook`` in a fresh kernel and print every `%%gpumem` report it made."""
    import nbformat
    from nbclient import NotebookClient

    if not notebook.exists():
        print(f"no notebook at {notebook}; pass --notebook PATH", file=sys.stderr)
        return 2
    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout_s,
        kernel_name="python3",
        # the kernel starts where the command was run, never inside the installed package
        resources={"metadata": {"path": str(Path.cwd())}},
    )
    # The kernel asks whether our renderer is here; headless, nothing answers, and the
    # reports keep their HTML with the SVG timeline.
    client.comm_open_handlers[COMM_TARGET] = lambda msg: None
    client.execute()
    reports = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if MIME_TYPE in data:
                reports += 1
                print(data.get("text/plain", ""))
                print()
    if output is not None:
        nbformat.write(nb, output)
        print(f"executed notebook written to {output}")
    print(f"{reports} report(s) from {notebook}")
    return 0 if reports else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpumem")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("demo", help="execute the quickstart notebook and print its reports")
    run.add_argument("--notebook", type=Path, default=QUICKSTART)
    run.add_argument("--output", type=Path, default=None, help="write the executed notebook here")
    run.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    open_lab = sub.add_parser(
        "lab",
        help="copy the shipped notebooks into a folder of working copies and open JupyterLab there",
        description="Other options (--allow-root, --port, --no-browser) go to `jupyter lab`.",
    )
    open_lab.add_argument(
        "--dir",
        type=Path,
        default=WORKING_COPIES,
        help=f"the working copies' folder (default ./{WORKING_COPIES})",
    )
    open_lab.add_argument(
        "--fresh", action="store_true", help="replace existing copies with the shipped notebooks"
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "lab":
        return lab(args.dir, args.fresh, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return demo(args.notebook, args.output, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
