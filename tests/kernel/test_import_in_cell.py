"""A `%%gpumem` cell that imports torch itself is measured on its first run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

# A fresh process: in the test process torch is usually imported already.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "jupyter_gpumem")
    out = {}
    ip.run_cell("%%gpumem -o plain\\nx = 'torch is only named here'  # import torch")
    out["after_plain"] = "torch" in sys.modules
    ip.run_cell(sys.argv[1])
    r = ip.user_ns["r"]
    out["devices"] = [d.device for d in r.devices]
    out["peak"] = r.peak_allocated_bytes
    out["guard"] = sys.modules["jupyter_gpumem.tracking.cuda"].GUARD.installed
    print(json.dumps(out))
    """
)


def _run(cell: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, cell],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_first_run_of_a_cell_that_imports_torch_is_measured() -> None:
    out = _run("%%gpumem -o r\nimport torch\nkeep = torch.ones(1024, 1024)")
    assert out["after_plain"] is False  # a cell that only names torch does not import it
    assert out["devices"] == ["cpu"]
    assert isinstance(out["peak"], int) and out["peak"] >= 4 * 2**20
    assert out["guard"] is True


def test_from_import_inside_a_function_counts_too() -> None:
    cell = (
        "%%gpumem -o r\n"
        "def make():\n"
        "    from torch.nn import functional as F\n"
        "    import torch\n"
        "    return F.relu(torch.ones(1024, 1024))\n"
        "keep = make()"
    )
    out = _run(cell)
    assert out["devices"] == ["cpu"]
    assert isinstance(out["peak"], int) and out["peak"] >= 4 * 2**20
