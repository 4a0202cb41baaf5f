"""A Jupyter Server (pytest-jupyter) with the extension on the NVML stand-in, token required."""

from __future__ import annotations

from typing import Any

import pytest

# pytest-jupyter registers no entry point; importing its fixtures (and its async-test hooks)
# into this conftest scopes them to tests/server.
from pytest_jupyter.jupyter_server import *  # noqa: F403

from tests.support.nvml_fake import DEFAULT_SPEC


@pytest.fixture
def fake_spec() -> dict[str, Any] | None:
    """The stand-in's machine; parametrize this name to change it."""
    return DEFAULT_SPEC


@pytest.fixture
def gpumem_config() -> dict[str, Any]:
    """Extra ``c.GpuMem`` settings; parametrize this name to change them."""
    return {}


@pytest.fixture  # type: ignore[no-redef]  # overrides pytest-jupyter's
def jp_server_config(
    fake_spec: dict[str, Any] | None, gpumem_config: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpumem": True}},
        "GpuMem": {
            "backend_class": "tests.support.nvml_fake.FakeNvmlBackend",
            "fake_spec": fake_spec,
            "interval_s": 0.25,
            **gpumem_config,
        },
    }
