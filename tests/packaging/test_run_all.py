"""tests/run_all.py runs every part whatever the others did, and its exit status says if any failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_all import PARTS, Part, PartResult, duration, main, summary

ROOT = Path(__file__).resolve().parents[2]


def _part(name: str, code: str) -> Part:
    return Part(name, (sys.executable, "-c", code))


def _lines(out: str) -> list[str]:
    """The summary's lines: from its heading on."""
    return out[out.index("=== test suite summary") :].splitlines()[1:]


def test_a_failing_first_part_still_runs_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = tmp_path / "ran"
    parts = [
        _part("first", "raise SystemExit(3)"),
        _part("second", f"open({str(ran)!r}, 'w').write('yes')"),
        _part("third", "print('third part ran')"),
    ]
    assert main([], parts) == 1
    assert ran.read_text() == "yes"
    out = capsys.readouterr().out
    assert "third part ran" in out
    lines = _lines(out)
    assert lines[0].split()[:2] == ["first", "failed"] and lines[0].endswith(" s (exit 3)")
    assert lines[1].split()[:2] == ["second", "passed"]
    assert lines[2].split()[:2] == ["third", "passed"]
    assert lines[-1] == "parts: 2 passed, 1 failed"


def test_every_part_passing_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([], [_part("a", "pass"), _part("b", "pass")]) == 0
    assert _lines(capsys.readouterr().out)[-1] == "parts: 2 passed, 0 failed"


def test_a_part_that_cannot_start_fails_and_the_rest_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parts = [Part("missing", ("no-such-program-for-gpumem",)), _part("after", "pass")]
    assert main([], parts) == 1
    lines = _lines(capsys.readouterr().out)
    assert lines[0].split()[:2] == ["missing", "failed"] and "(did not start: " in lines[0]
    assert lines[1].split()[:2] == ["after", "passed"]


def test_named_parts_run_alone(capsys: pytest.CaptureFixture[str]) -> None:
    parts = [_part("a", "raise SystemExit(1)"), _part("b", "pass")]
    assert main(["b"], parts) == 0
    assert [line.split()[0] for line in _lines(capsys.readouterr().out)[:-2]] == ["b"]
    with pytest.raises(SystemExit) as exc:
        main(["c"], parts)
    assert exc.value.code == 2
    assert "no part named c; the parts are a, b" in capsys.readouterr().err


def test_the_script_exits_non_zero_from_the_command_line() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "run_all.py"), "no-such-part"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "no part named no-such-part" in result.stderr


def test_the_suite_is_pytest_jest_and_the_ui_tests() -> None:
    assert [p.name for p in PARTS] == ["pytest", "jest", "ui"]
    assert PARTS[0].command == (sys.executable, "-m", "pytest")
    assert PARTS[1].command == ("npm", "--prefix", "labextension", "test")
    assert PARTS[2].command == ("npm", "--prefix", "labextension", "run", "test:ui")


def test_summary_gives_each_part_its_wall_time() -> None:
    text = summary([PartResult("pytest", 0, 1712.4), PartResult("ui", 1, 41.6)])
    assert text.splitlines()[2:] == [
        "pytest  passed  28 min 32 s",
        "ui      failed  42 s (exit 1)",
        "total 29 min 14 s",
        "parts: 1 passed, 1 failed",
    ]
    assert duration(59.4) == "59 s" and duration(60) == "1 min 00 s"
