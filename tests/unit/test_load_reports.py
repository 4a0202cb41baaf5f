"""`load_reports` checks each file on load: errors name the file and the field and say what is
allowed; a broken file found through a folder or a glob is skipped with a warning."""

from __future__ import annotations

import copy
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpumem.report.record import SCHEMA
from jupyter_gpumem.workers.rank_reports import (
    MAX_RANK_DEPTH,
    _rows,
    check_report,
    load_reports,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _rank(rank: int) -> dict[str, Any]:
    """A rank report as a worker writes it: rank ``rank`` of the two-rank fixture."""
    wire = json.loads((FIXTURES / "report_two_ranks.json").read_text())
    data: dict[str, Any] = copy.deepcopy(wire["ranks"][rank % 2])
    data["rank"] = rank
    return data


def _write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _assert_refused(path: Path, *fragments: str) -> str:
    with pytest.raises(ValueError) as raised:
        load_reports(path)
    message = str(raised.value)
    assert message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize(
    "name",
    [
        "report_two_ranks.json",
        "report_cpu_gpt_step.json",
        "report_cpu_training_step.json",
        "report_gpu_generate.json",
        "report_gpu_training_step.json",
    ],
)
def test_every_report_fixture_passes_the_check(name: str) -> None:
    check_report(json.loads((FIXTURES / name).read_text()))
    assert load_reports(FIXTURES / name).ranks


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("wall_s", "fast", "wall_s must be a finite number of seconds (0 or more), got 'fast'"),
        ("wall_s", -1.0, "wall_s must be a finite number of seconds (0 or more), got -1.0"),
        ("devices", "cuda:0", "devices must be a list, got 'cuda:0'"),
        ("devices", ["cuda:0"], "devices[0] must be a device (a JSON object), got 'cuda:0'"),
        ("status", "great", "status must be one of 'ok', 'error', 'oom', 'running', got 'great'"),
        ("cuda_available", "yes", "cuda_available must be true or false, got 'yes'"),
        ("notes", "one note", "notes must be a list, got 'one note'"),
        ("notes", [1], "notes[0] must be a string, got 1"),
        ("rank", True, "rank must be a whole number, 0 or more or null, got true"),
        ("schema", "3", f"schema must be a whole number from 1 to {SCHEMA}, got '3'"),
        ("schema", 0, f"schema must be a whole number from 1 to {SCHEMA}, got 0"),
    ],
)
def test_a_bad_field_names_the_file_the_field_and_what_is_allowed(
    tmp_path: Path, field: str, value: Any, said: str
) -> None:
    path = _write(tmp_path / "run.rank0.json", {**_rank(0), field: value})
    assert _assert_refused(path, said) == f"{path}: {said}"


def test_nan_seconds_are_assert_refused(tmp_path: Path) -> None:
    text = json.dumps({**_rank(0), "wall_s": float("nan")})
    assert '"wall_s": NaN' in text  # what json.dump writes, and json.load reads back
    path = _write(tmp_path / "run.rank0.json", text)
    _assert_refused(path, "wall_s must be a finite number of seconds (0 or more), got nan")


def test_nested_fields_are_named_by_their_path(tmp_path: Path) -> None:
    data = _rank(0)
    data["devices"][0]["peak_allocated_bytes"] = "1GiB"
    _assert_refused(
        _write(tmp_path / "a.json", data),
        "devices[0].peak_allocated_bytes must be a whole number of bytes (0 or more), got '1GiB'",
    )
    data = _rank(0)
    data["devices"][0]["timeline"]["t_s"][3] = None
    _assert_refused(
        _write(tmp_path / "b.json", data), "devices[0].timeline.t_s[3] must be a finite"
    )
    data = _rank(0)
    data["devices"][0]["breakdown"]["activations"] = 1.5
    _assert_refused(
        _write(tmp_path / "c.json", data), "devices[0].breakdown['activations'] must be"
    )
    data = _rank(0)
    del data["devices"][0]["source"]
    _assert_refused(
        _write(tmp_path / "d.json", data), "devices[0] lacks source, which a device has"
    )
    data = _rank(0)
    del data["id"], data["wall_s"]
    _assert_refused(_write(tmp_path / "e.json", data), "the report lacks id, wall_s")


def test_a_newer_schema_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.rank0.json", {**_rank(0), "schema": 99})
    _assert_refused(path, f"report schema 99 is newer than this jupyter_gpumem reads (schemas 1 to {SCHEMA})",
             "upgrade jupyter_gpumem")  # fmt: skip


def test_ranks_nest_only_a_few_levels(tmp_path: Path) -> None:
    def nested(depth: int) -> dict[str, Any]:
        data = _rank(0)
        for _ in range(depth):
            data = {**_rank(0), "ranks": [data]}
        return data

    assert load_reports(_write(tmp_path / "ok.json", nested(MAX_RANK_DEPTH))).ranks
    _assert_refused(
        _write(tmp_path / "deep.json", nested(MAX_RANK_DEPTH + 1)),
        "ranks[0].ranks[0].ranks is nested more than 2 levels deep",
    )
    deepest = '{"ranks": [' * 3000 + json.dumps(_rank(0)) + "]}" * 3000  # json.dumps recurses
    _assert_refused(_write(tmp_path / "deepest.json", deepest), "its JSON nests too deeply")
    _assert_refused(
        _write(tmp_path / "ranks.json", {**_rank(0), "ranks": {"0": _rank(0)}}),
        "ranks must be a list, got an object",
    )


def test_a_deep_module_tree_is_assert_refused(tmp_path: Path) -> None:
    tree: dict[str, Any] = {"path": "", "bytes": {}}
    for _ in range(100):
        tree = {"path": "m", "bytes": {"activations": 1}, "children": [tree]}
    data = _rank(0)
    data["devices"][0]["module_tree"] = tree
    _assert_refused(
        _write(tmp_path / "run.json", data), "devices[0].module_tree.children[0]", "64 levels"
    )


def test_what_is_echoed_is_capped(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.rank0.json", {**_rank(0), "wall_s": "x" * 100_000})
    message = _assert_refused(path, "wall_s must be a finite number")
    assert len(message) < len(str(path)) + 120, message
    data = _rank(0)
    data["devices"][0]["breakdown"] = {"k" * 10_000: "v"}
    assert len(_assert_refused(_write(tmp_path / "b.json", data))) < len(str(path)) + 200
    with pytest.raises(FileNotFoundError) as raised:
        load_reports([str(tmp_path / f"missing{i}.json") for i in range(10_000)])
    assert len(str(raised.value)) < 200


def test_not_json_and_not_an_object_are_said_so(tmp_path: Path) -> None:
    _assert_refused(_write(tmp_path / "a.json", "{not json"), "is not a report: it is not JSON")
    _assert_refused(_write(tmp_path / "b.json", "[1, 2]"), "it holds a list, not a JSON object")
    (tmp_path / "c.json").write_bytes(b"\xff\xfe{}")
    _assert_refused(tmp_path / "c.json", "it is not UTF-8 text")


def test_one_bad_file_in_a_folder_is_skipped_with_a_warning(tmp_path: Path) -> None:
    for rank in (0, 2):
        _write(tmp_path / f"run.rank{rank}.json", _rank(rank))
    bad = _write(tmp_path / "run.rank1.json", {**_rank(1), "wall_s": "fast"})
    for given in (tmp_path, str(tmp_path / "run.rank*.json"), tmp_path / "run.json"):
        with pytest.warns(UserWarning) as caught:
            r = load_reports(given)
        assert [k.rank for k in r.ranks] == [0, 2]
        said = f"skipped {bad}: wall_s must be a finite number of seconds (0 or more), got 'fast'"
        assert [str(w.message) for w in caught] == [said]
        assert r.notes[0] == said  # then the ranks compared (rank_balance)
        assert not [n for n in r.notes[1:] if "skipped" in n]
        assert "skipped" in str(r) and "rank1.json" in str(r)  # the report renders


def test_a_file_named_outright_raises(tmp_path: Path) -> None:
    good = _write(tmp_path / "run.rank0.json", _rank(0))
    bad = _write(tmp_path / "run.rank1.json", {**_rank(1), "devices": "cuda:0"})
    with pytest.raises(ValueError, match=re.escape(f"{bad}: devices must be a list")):
        load_reports([good, bad])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped, nothing said
        assert [k.rank for k in load_reports([good]).ranks] == [0]


def test_a_folder_of_bad_files_raises_with_the_reasons(tmp_path: Path) -> None:
    _write(tmp_path / "a.json", {"not": "a report"})
    _write(tmp_path / "b.json", "[]")
    with pytest.warns(UserWarning), pytest.raises(ValueError) as raised:
        load_reports(tmp_path)
    message = str(raised.value)
    assert message.startswith("none of the 2 file(s) at ")
    assert "a.json: the report lacks " in message and "b.json is not a report" in message


def test_paths_of_the_wrong_type_say_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="a path, a glob, a folder, or a list of those; got int 5"):
        load_reports(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int 3 among them"):
        load_reports([str(tmp_path), 3])  # type: ignore[list-item]


def test_a_workers_bad_report_becomes_a_note() -> None:
    reports, notes = _rows([_rank(0), {**_rank(1), "wall_s": "fast"}], ())
    assert [r.rank for r in reports] == [0]
    assert notes == [
        "a rank report could not be read: wall_s must be a finite number of seconds "
        "(0 or more), got 'fast'"
    ]
