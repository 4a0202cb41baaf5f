"""While a `%%gpumem` cell runs, nothing of ours initialises CUDA or poisons ``fork``.

The calls that poison fork (``is_available``, ``device_count`` and CUDA's lazy init) are
replaced by ones that fail loudly, in a fresh process where our code is made to see a CUDA
build with one device that NVML counts and nobody has initialised. The GPU suite forks real
CUDA workers from a cell (tests/gpu/test_fork_gpu.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    calls = []
    def poisoning(name):
        def call(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} poisons fork")
        return call
    import jupyter_gpumem.tracking.devices as devices
    devices._cuda_build = lambda torch: True  # a CUDA build, as far as we can tell
    torch.cuda.is_initialized = lambda: False
    torch.cuda._device_count_nvml = lambda: 1
    for name in ("is_available", "device_count", "_lazy_init", "init", "current_device"):
        setattr(torch.cuda, name, poisoning("torch.cuda." + name))

    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    setup = ip.run_cell(
        "import torch\\n"
        "model = torch.nn.Linear(8, 8)\\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\\n"
    )
    assert setup.success, setup.error_in_exec
    for source in (
        "%%gpumem -o r\\nfor _ in range(6):\\n    model(torch.randn(4, 8)).sum().backward(); opt.step()",
        "%%gpumem --no-trace\\nx = torch.ones(3)",
        "%gpumem history",
    ):
        result = ip.run_cell(source)
        assert result.success, (source, result.error_in_exec)
    ip.run_line_magic("unload_ext", "jupyter_gpumem")
    assert not calls, calls
    assert ip.user_ns["r"].cuda_available
    print("fork-safe")
    """
)


def test_a_cell_never_asks_cuda_what_would_poison_fork() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fork-safe" in done.stdout
