"""Run every part of the test suite, whatever an earlier part did, and say how each went.

``python tests/run_all.py`` runs pytest, jest and the browser UI tests one after the other from
the repository root, each with its output as it comes, then prints one line per part (passed or
failed, wall time) and exits 1 if any part failed. Name parts to run only those:
``python tests/run_all.py jest ui``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Part:
    """One part of the suite: a name and the command that runs it from the repository root."""

    name: str
    command: tuple[str, ...]


@dataclass(frozen=True)
class PartResult:
    """How a part ended: its exit status (None when it could not start, with the reason)."""

    name: str
    returncode: int | None
    wall_s: float
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.returncode == 0


PARTS = (
    Part("pytest", (sys.executable, "-m", "pytest")),
    Part("jest", ("npm", "--prefix", "labextension", "test")),
    Part("ui", ("npm", "--prefix", "labextension", "run", "test:ui")),
)


def run_part(part: Part, cwd: Path) -> PartResult:
    """Run ``part`` with the terminal's streams, timed."""
    print(f"\n=== {part.name}: {' '.join(part.command)}", flush=True)
    start = time.monotonic()
    try:
        returncode: int | None = subprocess.run(part.command, cwd=cwd, check=False).returncode
        error = ""
    except OSError as exc:  # the program is missing (npm not installed) or not executable
        returncode, error = None, str(exc)
    return PartResult(part.name, returncode, time.monotonic() - start, error)


def run_parts(parts: Sequence[Part], cwd: Path = ROOT) -> list[PartResult]:
    """Run every part in order; a failed part never stops the next."""
    return [run_part(part, cwd) for part in parts]


def duration(seconds: float) -> str:
    """Wall time as a person reads it: ``42 s``, ``3 min 05 s``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60:02d} s"


def summary(results: Sequence[PartResult]) -> str:
    """One line per part, then the counts on a line of their own."""
    width = max(len(r.name) for r in results)
    lines = ["", "=== test suite summary"]
    for r in results:
        if r.passed:
            why = ""
        elif r.returncode is None:
            why = f" (did not start: {r.error})"
        else:
            why = f" (exit {r.returncode})"
        outcome = "passed" if r.passed else "failed"
        lines.append(f"{r.name:<{width}}  {outcome}  {duration(r.wall_s)}{why}")
    failed = sum(not r.passed for r in results)
    total = duration(sum(r.wall_s for r in results))
    lines.append(f"total {total}")
    lines.append(f"parts: {len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, parts: Sequence[Part] = PARTS) -> int:
    names = [p.name for p in parts]
    parser = argparse.ArgumentParser(prog="python tests/run_all.py", description=__doc__)
    parser.add_argument("part", nargs="*", help=f"any of {', '.join(names)} (default: every part)")
    chosen = parser.parse_args(argv).part or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"no part named {', '.join(unknown)}; the parts are {', '.join(names)}")
    results = run_parts([p for p in parts if p.name in chosen])
    print(summary(results), flush=True)
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
