"""Import directions at run time: the package and the server extension pull in neither torch
nor pynvml, and the kernel's NVML readers (`jupyter_gpumem.nvml`, the report's process figures,
the monitor widget) pull in neither jupyter_server nor tornado."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

PROBE = """
import sys
import jupyter_gpumem
import jupyter_gpumem.server
from jupyter_gpumem.nvml import library as nvml
from jupyter_gpumem.nvml import sampler
from jupyter_gpumem.server import extension, handlers, host, kernels
from tests.support.nvml_fake import FakeNvml
FakeNvml.from_spec().backend(use_environment=False).read()  # the stand-in needs no pynvml
nvml.NvmlBackend()  # constructing the real backend does not load NVML either
print(sorted(m for m in ("torch", "pynvml") if m in sys.modules))
"""


def test_server_imports_neither_torch_nor_pynvml() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "[]", result.stderr


def test_probe_would_notice_pynvml() -> None:
    """The probe is able to fail: the real backend's first read does import pynvml."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = PROBE.replace("nvml.NvmlBackend()", "nvml.NvmlBackend().read()")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "['pynvml']", result.stderr


KERNEL_SIDE = """
import sys
import jupyter_gpumem.nvml
from jupyter_gpumem.nvml import library, readings, sampler, visibility
from jupyter_gpumem.tracking.process import process_bytes
from jupyter_gpumem.widgets import monitor
process_bytes()  # NVML read as the kernel reads it for a report (empty without a GPU)
print(sorted(m for m in ("jupyter_server", "tornado") if m in sys.modules))
"""


def test_the_kernels_nvml_readers_import_no_server() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", KERNEL_SIDE], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == "[]", result.stderr
