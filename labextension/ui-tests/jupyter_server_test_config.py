"""Jupyter Server configuration for the Galata UI tests of jupyter-gpumem.

Runs JupyterLab on the NVML stand-in of ``tests/support/nvml_fake.py``: two GPUs, one with
a MIG instance, a process per running kernel (so the active notebook's row is highlighted)
and two other processes. Every figure is one a user could see (the screenshots taken on it
are committed); gpumem.spec.ts adds a process whose command is an HTML injection attempt to
the samples itself, in the test that checks it shows as literal text.

With ``JUPYTER_GPUMEM_UI_NVML_ERROR`` set to a failure of the stand-in (a key of
``tests.support.nvml_fake.ERROR_CODES``, e.g. ``library_not_found``), NVML fails to start
as on a machine without a GPU; tests/no_gpu_server.ts starts a second server so.

The port is ``JUPYTER_GPUMEM_UI_PORT``: playwright.config.js picks a free one for each server it
starts (8891 when this configuration is run by hand, ``npm start``), and the server fails
rather than move to another port (``port_retries = 0``), so the tests never reach a server
they did not start.

The labextension is served from this checkout's build (``jupyter_gpumem/labextension``),
so the tests exercise the code under test even if another copy is installed.
Never use this configuration outside tests: it switches off authentication.
"""

import os
import sys
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "jupyter_gpumem" / "labextension"
GiB = 2**30

# The NVML stand-in lives in the tests; a fresh clone without `pip install -e .` also finds
# the package here.
sys.path.insert(0, str(REPO))

from tests.support.nvml_fake import DEFAULT_SPEC, ERROR_CODES  # noqa: E402

if not (BUILT / "package.json").exists():
    raise SystemExit(
        f"{BUILT} is missing: build the labextension first "
        "(`npm ci && npm run build:prod` in labextension/, or `pip install -e .`)"
    )

configure_jupyter_server(c)  # noqa: F821 (c is the config object Jupyter passes in)

c.ServerApp.port = int(os.environ.get("JUPYTER_GPUMEM_UI_PORT", "8891"))  # noqa: F821
c.ServerApp.port_retries = 0  # noqa: F821
c.ServerApp.allow_root = True  # noqa: F821
c.ServerApp.jpserver_extensions = {"jupyter_gpumem": True}  # noqa: F821
# Settings changed by a test stay in this run.
c.LabApp.user_settings_dir = tempfile.mkdtemp(prefix="gpumem-settings-")  # noqa: F821

# Serve this checkout's build under its extension name, ahead of any installed copy.
_ext_dir = Path(tempfile.mkdtemp(prefix="gpumem-labext-"))
(_ext_dir / "jupyter-gpumem").symlink_to(BUILT, target_is_directory=True)
c.LabServerApp.extra_labextensions_path = [  # noqa: F821
    str(_ext_dir),
    c.LabServerApp.extra_labextensions_path,  # noqa: F821 (galata's test helpers)
]

c.GpuMem.backend_class = "tests.support.nvml_fake.FakeNvmlBackend"  # noqa: F821
c.GpuMem.interval_s = 0.5  # noqa: F821
c.GpuMem.fake_spec = {  # noqa: F821
    "driver_version": "550.54.15",
    "devices": [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-5c3b9f0e-6f2a-4d1e-9a7b-1f2e3d4c5b6a",
            "memory_total_bytes": 85520809984,
            "memory_used_bytes": 31 * GiB,
            "utilization_percent": 87,
            "temperature_c": 54,
            "power_w": 412.61,
            # 31 GiB in use: each kernel holds 22 GiB, what the last report of gpumem.spec.ts's
            # notebook says its process held after the cell (a training step at batch 48).
            "processes": [
                {"pid": "kernels", "memory_bytes": 22 * GiB},
                {
                    "pid": 48211,
                    "command": "python train.py --config gpt2.yaml",
                    "memory_bytes": 8 * GiB,
                },
                {
                    "pid": 50377,
                    "command": "python evaluate.py --checkpoint runs/gpt2/last.pt",
                    "memory_bytes": 1 * GiB,
                },
            ],
        },
        # The MIG-partitioned A100 of the stand-in's default spec.
        DEFAULT_SPEC["devices"][1],
    ],
}

_nvml_error = os.environ.get("JUPYTER_GPUMEM_UI_NVML_ERROR")
if _nvml_error:
    if _nvml_error not in ERROR_CODES:
        raise SystemExit(
            f"JUPYTER_GPUMEM_UI_NVML_ERROR={_nvml_error!r} is not a stand-in failure; "
            f"use one of {', '.join(sorted(ERROR_CODES))}"
        )
    c.GpuMem.fake_spec = {**c.GpuMem.fake_spec, "init_error": _nvml_error}  # noqa: F821
