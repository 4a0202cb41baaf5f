"""The REST API on a real Jupyter Server (token required), over the NVML stand-in."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

import jupyter_gpumem
from jupyter_gpumem.nvml.sampler import THREAD_NAME
from jupyter_gpumem.server.handlers import SETTINGS_KEY
from tests.support.nvml_fake import DEFAULT_SPEC

API = ("jupyter-gpumem", "api")
ROUTES = [
    ("health",),
    ("sample",),
    ("history",),
    ("kernels", "0000", "processes"),
    ("kernels", "0000", "host"),
]
FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "sample.json").read_text())


async def get(jp_fetch: Any, *parts: str, **kwargs: Any) -> Any:
    response = await jp_fetch(*API, *parts, **kwargs)
    assert response.code == 200
    return json.loads(response.body)


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def shape(value: Any) -> Any:
    """Keys (recursively) and JSON types: what the TypeScript side relies on."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


async def test_health(jp_fetch: Any) -> None:
    body = await get(jp_fetch, "health")
    assert body == {
        "status": "ok",
        "version": jupyter_gpumem.__version__,
        "nvml": {"available": True, "reason": None},
    }


async def test_sample_matches_the_shared_fixture(jp_fetch: Any) -> None:
    body = await get(jp_fetch, "sample")
    assert body["interval_s"] == 0.25
    assert abs(body["time"] - time.time()) < 30
    assert {k: v for k, v in body.items() if k not in ("time", "interval_s")} == {
        k: v for k, v in FIXTURE.items() if k not in ("time", "interval_s")
    }
    assert shape(body) == shape(FIXTURE)


@pytest.mark.parametrize("parts", ROUTES)
async def test_every_route_refuses_requests_without_the_token(
    jp_fetch: Any, parts: tuple[str, ...]
) -> None:
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch(*API, *parts, headers={"Authorization": ""})
    assert error.value.code == 403
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch(*API, *parts, headers={"Authorization": "token wrong"})
    assert error.value.code == 403


async def test_history_since_and_bad_since(jp_fetch: Any) -> None:
    await asyncio.sleep(0.8)
    body = await get(jp_fetch, "history")
    times = [s["time"] for s in body["samples"]]
    assert body["interval_s"] == 0.25 and len(times) >= 2 and times == sorted(times)
    newer = await get(jp_fetch, "history", params={"since": str(times[-2])})
    assert newer["samples"][0]["time"] == times[-1]
    for bad in ("yesterday", "nan", "inf"):
        with pytest.raises(HTTPClientError) as error:
            await jp_fetch(*API, "history", params={"since": bad})
        assert error.value.code == 400 and error.value.response is not None
        assert "unix time in seconds" in json.loads(error.value.response.body)["message"]


@pytest.mark.parametrize(
    ("fake_spec", "reason"),
    [
        ({**DEFAULT_SPEC, "init_error": "library_not_found"}, "library not found"),
        ({**DEFAULT_SPEC, "init_error": "driver_not_loaded"}, "driver not loaded"),
        ({**DEFAULT_SPEC, "init_error": "no_permission"}, "no permission"),
    ],
)
async def test_nvml_failures_answer_200_with_the_reason(jp_fetch: Any, reason: str) -> None:
    health = await get(jp_fetch, "health")
    assert health["status"] == "ok" and health["nvml"] == {"available": False, "reason": reason}
    sample = await get(jp_fetch, "sample")
    assert (sample["available"], sample["reason"], sample["devices"]) == (False, reason, [])
    status = await jp_fetch("api", "status")  # the server itself is unaffected
    assert status.code == 200
    assert (await get(jp_fetch, "health"))["nvml"]["reason"] == reason


@pytest.mark.parametrize(
    "fake_spec",
    [
        {
            "devices": [
                {
                    "name": "G",
                    "errors": {"power_w": "not_supported", "temperature_c": "no_permission"},
                }
            ]
        }
    ],
)
async def test_unsupported_fields_are_null_with_reasons(jp_fetch: Any) -> None:
    (device,) = (await get(jp_fetch, "sample"))["devices"]
    assert device["power_w"] is None and device["temperature_c"] is None
    assert device["reasons"] == {"power_w": "not supported", "temperature_c": "no permission"}
    assert device["memory_total_bytes"] == 16 * 2**30


SECRET = "python serve.py --api-key=s3cret"


@pytest.mark.parametrize(
    "fake_spec",
    [
        {
            "devices": [
                {
                    "name": "G",
                    "processes": [
                        {"pid": 101, "command": SECRET, "uid": os.getuid() + 1},
                        {"pid": 102, "command": SECRET, "uid": None},
                        {"pid": 103, "command": SECRET},  # the server user's
                    ],
                }
            ]
        }
    ],
)
async def test_other_users_command_lines_are_not_served(jp_fetch: Any) -> None:
    expected = {101: "python", 102: "python", 103: SECRET}
    (device,) = (await get(jp_fetch, "sample"))["devices"]
    assert {p["pid"]: p["command"] for p in device["processes"]} == expected
    history = await get(jp_fetch, "history")
    for sample in history["samples"]:
        (device,) = sample["devices"]
        assert {p["pid"]: p["command"] for p in device["processes"]} == expected


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pynvml`` fail; requested before the server starts its sampler."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.mark.parametrize(
    "gpumem_config",
    [{"backend_class": "jupyter_gpumem.nvml.library.NvmlBackend", "fake_spec": None}],
)
async def test_missing_bindings_with_the_real_backend(no_pynvml: None, jp_fetch: Any) -> None:
    health = await get(jp_fetch, "health")
    assert health["nvml"] == {"available": False, "reason": "nvidia-ml-py not installed"}


async def test_ten_concurrent_clients_share_one_sampler(jp_fetch: Any, jp_serverapp: Any) -> None:
    sampler = jp_serverapp.web_app.settings[SETTINGS_KEY]["sampler"]
    await get(jp_fetch, "sample")
    assert len(sampler_threads()) == 1
    start, passes = time.monotonic(), sampler.passes
    for _ in range(5):
        bodies = await asyncio.gather(
            *(get(jp_fetch, route) for route in ("sample", "history", "health") * 4)
        )
        assert len(bodies) == 12
        assert len(sampler_threads()) == 1
    # NVML is read on the sampler's clock, not once per request (60 requests were made).
    assert sampler.passes - passes <= (time.monotonic() - start) / 0.25 + 2


async def test_unknown_kernel_is_404(jp_fetch: Any) -> None:
    with pytest.raises(HTTPClientError) as error:
        await jp_fetch(*API, "kernels", "no-such-kernel", "processes")
    assert error.value.code == 404


async def test_server_cleanup_stops_the_sampler(jp_fetch: Any, jp_serverapp: Any) -> None:
    state = jp_serverapp.web_app.settings[SETTINGS_KEY]
    await get(jp_fetch, "sample")
    assert state["backend"].fake.initialized and len(sampler_threads()) == 1
    await jp_serverapp.cleanup_extensions()
    assert not state["sampler"].thread.is_alive()
    assert sampler_threads() == []
    assert not state["backend"].fake.initialized  # NVML shut down
