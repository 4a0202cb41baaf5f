"""`%gpumem monitor` in a real IPython shell when NVML cannot start: the reason, once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpumem.ipython.monitor_options import MonitorOptions, parse_monitor

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


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--device -3 --interval 1e308", "--device takes a device index (0, 1, ...), got '-3'"),
        ("--interval 1e308", "--interval takes seconds between reads, from 0.25 to 3600, got '1e308'"),
        ("--interval nan", "--interval takes seconds between reads, from 0.25 to 3600, got 'nan'"),
        ("--interval 0.1", "--interval takes seconds between reads, from 0.25 to 3600, got '0.1'"),
        ("--interval 1 --interval 2", "--interval is given once"),
        ("--device", "--device needs a value: a device index (0, 1, ...)"),
        ("--device 1e3", "--device takes a device index (0, 1, ...), got '1e3'"),
        ("--colour red", "the options are --interval and --device, got '--colour'"),
        (f"--interval {'9' * 5000}", "got '99999999999999999...999999999999999999'"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_saying_what_is_allowed(
    shell: InteractiveShell, line: str, said: str
) -> None:
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("gpumem", f"monitor {line}")
    first, *usage = str(raised.value).splitlines()
    assert first.startswith("%gpumem monitor: ") and first.endswith(said), first
    assert usage[0].startswith("usage: %gpumem monitor [--interval SECONDS (>= 0.25)]")
    assert "from 0.25 to 3600" in usage[1]


def test_good_arguments_are_kept() -> None:
    assert parse_monitor(
        ["--interval", "3600", "--device", "1", "--device", "0", "--device", "1"]
    ) == (MonitorOptions(3600.0, (1, 0)))
    assert parse_monitor([]) == MonitorOptions(1.0, None)
