"""GPU tests: run on the GPU machine (``pytest -m gpu tests/gpu``); skipped without CUDA."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _fresh_cache_per_module() -> Iterator[None]:
    """Each module starts from an emptied cache: exact block-size figures depend on the layout."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
