"""`%gpumem monitor` in a real IPython shell when NVML cannot start: the reason, once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("bqplot")

# A fresh process: pytest attaches its log capture to every logger, so only outside pytest
# does a logged warning reach logging's last-resort handler, which writes it to stderr (the
# red box a notebook shows).
SCRIPT = textwrap.dedent(
    """
    from IPython.core.interactiveshell import InteractiveShell
    from tests.support.nvml_fake import FakeNvml
    from jupyter_gpumem.widgets import monitor

    fake = FakeNvml.from_spec({"init_error": "driver_not_loaded", "devices": []})
    monitor.NvmlBackend = lambda **kw: fake.backend(use_environment=False, **kw)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    widget = ip.run_line_magic("gpumem", "monitor")
    print("STATUS", widget.status.value)
    widget.close()
    """
)


def test_unavailable_nvml_says_why_once_and_nothing_on_stderr() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    assert "STATUS <b>GPU monitor:</b> NVML unavailable: driver not loaded" in done.stdout
    assert (done.stdout + done.stderr).count("driver not loaded") == 1, done
    assert "NVML" not in done.stderr, done.stderr
