"""CI runs the README's test command byte for byte, so the README's commands are the tested ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    """The command lines of the README's first two code blocks: the main job, then the tests."""
    blocks = re.findall(
        r"^```bash\n(.*?)^```$", (ROOT / "README.md").read_text(), flags=re.MULTILINE | re.DOTALL
    )
    return [
        next(line for line in block.splitlines() if not line.startswith("#"))
        for block in blocks[:2]
    ]


def test_readme_starts_with_the_main_job_and_the_test_suite() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.index("```bash")
    assert "\n## " not in readme[:first_block]
    main_job, tests = _readme_commands()
    assert main_job.endswith("python -m jupyter_gpumem demo")
    assert tests.endswith(" && python tests/run_all.py")
    for command in (main_job, tests):
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && ")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in script
    _, tests = _readme_commands()
    # The last line, so that its exit status is the script's: under `set -e` a failure inside
    # an `&&` list stops the list but not the script.
    assert script.rstrip("\n").splitlines()[-1] == tests
