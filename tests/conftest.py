"""Shared fixtures: a real IPython shell with the extension loaded."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

# The tests' tensors are small, so torch's intra-op threads cost more than they give; on a
# 2-core machine they spin against the kernels and servers the tests start (a plan in
# test_plan.py: 202 s with two threads, 40 s with one). Set before torch is imported, so the
# kernels, ranks and workers the tests start inherit it; a value already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file: the variable is read at import
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    """A real IPython shell with `%load_ext jupyter_gpumem`, unloaded afterwards."""
    from jupyter_gpumem import logbook

    ip = InteractiveShell.instance()
    ip.reset(new_session=False)  # each test starts from an empty user namespace
    logbook.clear()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    yield ip
    ip.run_line_magic("unload_ext", "jupyter_gpumem")
    ip.reset(new_session=False)  # the singleton shell would keep this test's models alive
    logbook.clear()


@pytest.fixture(autouse=True)
def _no_kept_segment_summaries() -> Iterator[None]:
    """Each test reads its layouts afresh: made-up snapshots share addresses and totals."""
    from jupyter_gpumem.tracking.snapshot import SUMMARIES

    SUMMARIES.clear()
    yield
    SUMMARIES.clear()


@pytest.fixture(autouse=True, scope="session")
def _allocator_counts_checked() -> Iterator[None]:
    """Every estimate the tests make checks the allocator model's own count against the
    replay of its trace (the workers of estimates without CUDA are told so too)."""
    from jupyter_gpumem.tuner.estimation import fake_peaks

    fake_peaks.CHECKED = True
    yield
    fake_peaks.CHECKED = False
