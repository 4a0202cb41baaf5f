"""Objects outside the namespace are found once registered with `jupyter_gpumem.track`."""

from IPython.core.interactiveshell import InteractiveShell


def test_tracked_model_parameters_are_attributed(shell: InteractiveShell) -> None:
    setup = (
        "import torch, jupyter_gpumem\n"
        "def build():\n"
        "    m = torch.nn.Linear(128, 128)\n"
        "    jupyter_gpumem.track(m, 'hidden_model')\n"
        "    return [m]\n"
        "holder = {'models': build()}  # not a top-level module: invisible without track()\n"
    )
    assert shell.run_cell(setup).success
    assert shell.run_cell("%%gpumem -o r\ny = holder['models'][0](torch.randn(4, 128))").success
    r = shell.user_ns["r"]
    assert r.breakdown["parameters"] == (128 * 128 + 128) * 4
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
