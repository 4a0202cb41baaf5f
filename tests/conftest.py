"""Shared fixtures: a real IPython shell with the extension loaded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell


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
