"""Command line: ``python -m jupyter_gpumem demo`` executes the quickstart notebook headlessly."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    args = parser.parse_args(argv)
    return demo(args.notebook, args.output, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
