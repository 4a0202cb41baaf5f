"""The ``history`` route: pages that add up to the whole, the memory view, refused queries."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpumem.nvml.readings import Sample
from jupyter_gpumem.server.handlers import SETTINGS_KEY
from jupyter_gpumem.server.history import MAX_LIMIT, MAX_PAGE_BYTES, HistoryQuery, history_page
from tests.support.nvml_fake import FakeNvml

API = ("jupyter-gpumem", "api")


def samples(count: int, spec: dict[str, Any] | None = None, start: float = 1000.0) -> list[Sample]:
    """``count`` samples of the stand-in, 0.25 s apart, the memory used growing."""
    backend = FakeNvml.from_spec(spec).backend(use_environment=False)
    template = backend.read(0.25)
    return [
        dataclasses.replace(
            template,
            time=start + n * 0.25,
            devices=tuple(dataclasses.replace(d, memory_used_bytes=n) for d in template.devices),
        )
        for n in range(count)
    ]


def query(**arguments: str) -> HistoryQuery:
    return HistoryQuery.parse(arguments.get)


def all_pages(kept: list[Sample], **arguments: str) -> tuple[list[dict[str, Any]], int]:
    """Every page from the first, following ``next_since``: what they hold, and how many."""
    got: list[dict[str, Any]] = []
    for pages in range(1, len(kept) + 2):
        answer = json.loads(history_page(kept, 0.25, query(**arguments)))
        got.extend(answer["samples"] if "samples" in answer else answer["points"])
        if answer["next_since"] is None:
            return got, pages
        assert answer["next_since"] == got[-1]["time"]
        arguments["since"] = repr(answer["next_since"])
    raise AssertionError("the pages never ended")


def test_pages_of_a_limit_add_up_to_the_whole_history() -> None:
    kept = samples(50)
    whole = [s.to_json() for s in kept]
    assert json.loads(history_page(kept, 0.25, query())) == {
        "interval_s": 0.25,
        "samples": whole,
        "next_since": None,
    }
    got, pages = all_pages(kept, limit="7")
    assert got == whole and pages == 8
    got, _ = all_pages(kept, limit="7", since=repr(kept[9].time))
    assert got == whole[10:]


def test_a_page_stops_at_its_byte_budget_and_holds_one_sample_at_least() -> None:
    # About 70 kB a sample: a long command line on each of 8 processes.
    process = {"pid": 1, "command": "python " + "x" * 9000, "memory_bytes": 1}
    spec = {"devices": [{"processes": [{**process, "pid": k} for k in range(8)]}]}
    kept = samples(40, spec)
    size = len(json.dumps(kept[0].to_json()))
    assert size > MAX_PAGE_BYTES / 10
    first = history_page(kept, 0.25, query())
    assert MAX_PAGE_BYTES / 2 < len(first) <= MAX_PAGE_BYTES + 200
    assert json.loads(first)["next_since"] is not None
    got, pages = all_pages(kept)
    assert got == [s.to_json() for s in kept] and pages > 1


def test_memory_view_and_step_take_what_the_sparklines_draw() -> None:
    kept = samples(40)  # 10 s of samples every 0.25 s
    answer = json.loads(history_page(kept, 0.25, query(view="memory", step="1")))
    assert answer["next_since"] is None and "samples" not in answer
    assert [p["time"] for p in answer["points"]] == [1000.0 + n for n in range(10)]
    assert answer["points"][1] == {
        "time": 1001.0,
        "devices": [
            {"index": 0, "memory_used_bytes": 4},
            {"index": 1, "memory_used_bytes": 4},
        ],
    }
    # Pages take the same samples as one answer would, wherever they start.
    got, pages = all_pages(kept, view="memory", step="1", limit="3")
    assert got == answer["points"] and pages == 4
    got, _ = all_pages(kept, view="memory", step="1", limit="3", since="1000.5")
    assert got == answer["points"][1:]


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("since", "yesterday", "unix time in seconds"),
        ("since", "nan", "unix time in seconds"),
        ("since", "-inf", "unix time in seconds"),
        ("limit", "0", f"from 1 to {MAX_LIMIT}"),
        ("limit", str(MAX_LIMIT + 1), f"from 1 to {MAX_LIMIT}"),
        ("limit", "2.5", "whole number"),
        ("limit", "-3", "whole number"),
        ("limit", "٣", "whole number"),  # a digit to str.isdigit, not to int()'s users
        ("step", "0", "seconds > 0"),
        ("step", "1e9", "seconds > 0"),
        ("step", "inf", "seconds > 0"),
        ("view", "everything", "full, memory"),
    ],
)
def test_bad_values_are_refused_saying_what_is_allowed(name: str, value: str, allowed: str) -> None:
    with pytest.raises(ValueError, match=allowed) as error:
        query(**{name: value})
    assert f"{name}={value!r} is not allowed" in str(error.value)


@pytest.mark.parametrize("name", ["since", "limit", "step", "view"])
def test_a_huge_value_is_not_echoed(name: str) -> None:
    huge = "9" * 3 + "x" * 10_000
    with pytest.raises(ValueError) as error:
        query(**{name: huge})
    message = str(error.value)
    assert len(message) < 300 and "x" * 41 not in message
    assert "(10003 characters)" in message


# --- on a running server ----------------------------------------------------------------


async def get(jp_fetch: Any, **params: str) -> dict[str, Any]:
    response = await jp_fetch(*API, "history", params=params)
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    return dict(json.loads(response.body))


async def test_the_route_pages_the_whole_history(jp_fetch: Any, jp_serverapp: Any) -> None:
    sampler = jp_serverapp.web_app.settings[SETTINGS_KEY]["sampler"]
    await jp_fetch(*API, "sample")
    sampler.extend(samples(120, start=1000.0))  # older than the sampler's own
    whole = [s.to_json() for s in sampler.history()]
    got: list[dict[str, Any]] = []
    params = {"limit": "50"}
    for _ in range(10):
        answer = await get(jp_fetch, **params)
        assert len(answer["samples"]) <= 50 and answer["interval_s"] == 0.25
        got.extend(answer["samples"])
        if answer["next_since"] is None:
            break
        params["since"] = repr(answer["next_since"])
    # The sampler may have added samples meanwhile; those it had at the start all came.
    assert got[: len(whole)] == whole
    memory = await get(jp_fetch, view="memory", since="1009.9", step="5")
    assert [p["time"] for p in memory["points"][:3]] == [1010.0, 1015.0, 1020.0]


async def test_the_route_answers_400_without_echoing_a_huge_value(jp_fetch: Any) -> None:
    for name in ("since", "limit", "step", "view"):
        with pytest.raises(HTTPClientError) as error:
            await jp_fetch(*API, "history", params={name: "1" + "z" * 10_000})
        assert error.value.code == 400 and error.value.response is not None
        body = error.value.response.body
        assert len(body) < 500 and b"z" * 41 not in body
        shown = f"{name}='1{'z' * 39}'... (10001 characters) is not allowed"
        assert shown in json.loads(body)["message"]
