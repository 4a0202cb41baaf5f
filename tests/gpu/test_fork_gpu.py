"""A cell that forks CUDA workers runs under `%%gpumem` as it does plain.

Each case runs in a fresh interpreter, since CUDA must be untouched in the parent for
``start_method="fork"``: the pytest process has long initialised it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    setup = ip.run_cell(
        "import torch, torch.multiprocessing as mp\\n"
        "def worker(rank):\\n"
        "    x = torch.randn(1024, 1024, device=f'cuda:{rank % torch.cuda.device_count()}')\\n"
        "    assert (x @ x).isfinite().all()\\n"
    )
    assert setup.success, setup.error_in_exec
    result = ip.run_cell(
        "%%gpumem -o r\\n"
        "ctx = mp.start_processes(worker, nprocs=2, start_method='fork')\\n"
    )
    assert result.success, result.error_in_exec
    import torch
    assert not torch.cuda.is_initialized(), "the cell must leave CUDA untouched in the kernel"
    assert ip.user_ns["r"].status == "ok"
    again = ip.run_cell("%%gpumem\\nmp.start_processes(worker, nprocs=2, start_method='fork')")
    assert again.success, again.error_in_exec
    print("forked")
    """
)


def test_fork_launched_cuda_workers_run_under_the_magic() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240
    )
    if "Cannot re-initialize CUDA" in done.stderr + done.stdout:
        pytest.fail("a worker found CUDA poisoned: " + done.stderr[-2000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "forked" in done.stdout
