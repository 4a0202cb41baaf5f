"""Whole-notebook cost of `%%gpumem` on the CPU: each corpus notebook plain and tracked.

    python bench/notebook_corpus.py bench/results/notebook_corpus_cpu.json [--only NAME]
    python bench/notebook_corpus.py bench/results/notebook_corpus_cpu_lived_in.json --lived-in

Every notebook runs twice in its own fresh kernel (ipykernel through nbclient, as the
README's main command runs the quickstart): plain, then with ``%load_ext jupyter_gpumem`` in
a first cell and ``%%gpumem`` on every code cell. A cell's time is the kernel's own (from
its input's broadcast to its reply), so the front end's rendering is left out and the
report's building is counted. The kernel's resident memory is read after the last cell.
With ``--lived-in`` the notebooks run one after another in one kernel (plain, then tracked
in another), each on what the ones before left, as a long working session does.
Targets: the corpus within 1.5x of plain overall, no notebook over 2x.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))

from notebooks import NOTEBOOKS

RSS = """\
with open("/proc/self/status") as f:
    print({k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("VmRSS", "VmHWM")})
"""


def notebook(cells: list[str], *, tracked: bool) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    code = [f"%%gpumem\n{c}" if tracked else c for c in cells]
    if tracked:
        code.insert(0, "%load_ext jupyter_gpumem")
    nb.cells = [nbformat.v4.new_code_cell(c) for c in [*code, RSS]]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def cell_seconds(cell: nbformat.NotebookNode) -> float:
    timing = cell.metadata["execution"]
    began = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
    ended = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
    return (ended - began).total_seconds()


def run(cells: list[str], *, tracked: bool) -> dict[str, Any]:
    nb = notebook(cells, tracked=tracked)
    NotebookClient(nb, timeout=1200, kernel_name="python3", record_timing=True).execute()
    body = nb.cells[1:-1] if tracked else nb.cells[:-1]
    seconds = [cell_seconds(c) for c in body]
    rss_text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    rss = json.loads(rss_text.strip().replace("'", '"'))
    return {
        "cells_s": seconds,
        "total_s": sum(seconds),
        "load_ext_s": cell_seconds(nb.cells[0]) if tracked else 0.0,
        "rss_bytes": rss["VmRSS"],
        "peak_rss_bytes": rss["VmHWM"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", choices=sorted(NOTEBOOKS), action="append")
    parser.add_argument("--lived-in", action="store_true", help="all notebooks in one kernel")
    args = parser.parse_args()
    names = args.only or list(NOTEBOOKS)
    results: dict[str, Any] = {}
    if args.lived_in:
        cells = [c for name in names for c in NOTEBOOKS[name]]
        whole = {"plain": run(cells, tracked=False), "tracked": run(cells, tracked=True)}
    start = 0
    for name in names:
        if args.lived_in:
            end = start + len(NOTEBOOKS[name])
            plain, tracked = (
                {"cells_s": whole[k]["cells_s"][start:end], "rss_bytes": whole[k]["rss_bytes"]}
                for k in ("plain", "tracked")
            )
            for part in (plain, tracked):
                part["total_s"] = sum(part["cells_s"])
            start = end
        else:
            plain = run(NOTEBOOKS[name], tracked=False)
            tracked = run(NOTEBOOKS[name], tracked=True)
        ratio = tracked["total_s"] / plain["total_s"]
        results[name] = {"plain": plain, "tracked": tracked, "ratio": ratio}
        print(
            f"{name:20s} plain {plain['total_s']:6.2f} s  tracked {tracked['total_s']:6.2f} s  "
            f"x{ratio:4.2f}  rss +{(tracked['rss_bytes'] - plain['rss_bytes']) / 2**20:6.1f} MiB",
            flush=True,
        )
    plain_s = sum(r["plain"]["total_s"] for r in results.values())
    tracked_s = sum(r["tracked"]["total_s"] for r in results.values())
    worst = max(results.values(), key=lambda r: r["ratio"])["ratio"]
    summary = {
        "plain_s": plain_s,
        "tracked_s": tracked_s,
        "ratio": tracked_s / plain_s,
        "worst": worst,
    }
    print(
        f"corpus: plain {plain_s:.2f} s, tracked {tracked_s:.2f} s, x{summary['ratio']:.2f}; worst x{worst:.2f}"
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "python": platform.python_version(),
                "lived_in": args.lived_in,
                "notebooks": results,
                "summary": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
