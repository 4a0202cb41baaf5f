"""On the CPU the tuner offers only what can help there, and says why once: TF32 (CUDA's switch)
is neither measured nor estimated by a plan or a search, nor fp16 autocast beside bf16's; a fit through the panel gives its
step-time change with one figure in its reasoning, its HTML and the table."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.joint import search
from jupyter_gpumem.tuner.planning.plan import Plan, plan
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.trial import Trial
from jupyter_gpumem.tuner.workload import Workload

pytest.importorskip("bqplot")

from jupyter_gpumem.widgets.tuner import tune

LEFT_OUT = "Left out on the cpu, where they cannot help: precision tf32: it sets CUDA's TF32"


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _trial() -> Trial:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters())
    return Trial(
        model, torch.randn(512, 32), lambda m, b: m(b).square().mean(), optimizer=opt,
        warmup=1, steps=2,
    )  # fmt: skip


class _Recorded:
    """A trial that keeps every configuration it measured."""

    def __init__(self, trial: Trial) -> None:
        self.trial, self.configs = trial, list[Config]()

    @property
    def workload(self) -> Workload:
        return self.trial.workload

    def run(self, config: Config) -> TrialResult:
        self.configs.append(config)
        return self.trial.run(config)

    def compare(self, configs: Sequence[Config]) -> list[TrialResult]:
        self.configs += configs
        return self.trial.compare(configs)


@pytest.fixture(autouse=True)
def _closed_panels() -> Iterator[None]:
    yield
    import gc

    import ipywidgets

    ipywidgets.Widget.close_all()
    gc.collect()


def test_a_cpu_plan_measures_no_tf32_and_says_why_once() -> None:
    trial = _Recorded(_trial())
    found = plan(trial, "1GiB", techniques=("precision",))
    assert trial.configs and not any(c.precision == "tf32" for c in trial.configs)
    # fp16 autocast keeps bf16 autocast's bytes: on the CPU its runs would only repeat those
    assert {c.precision for c in trial.configs} == {None, "bf16-autocast"}
    said = [line for line in found.reasoning if line.startswith(LEFT_OUT)]
    assert len(said) == 1 and "nothing on the cpu reads: it would run as fp32" in said[0]
    assert "precision fp16-autocast: it keeps the bytes bf16-autocast keeps" in said[0]
    assert found.precision not in ("tf32", "fp16-autocast")


def test_a_cpu_search_estimates_and_times_no_tf32_nor_offloading_and_says_why_once() -> None:
    steps: list[str] = []
    found = search(_trial(), "1GiB", progress=steps.append)
    assert steps and not any("tf32" in s or "offload" in s for s in steps), steps
    said = [line for line in found.reasoning if line.startswith(LEFT_OUT)]
    assert len(said) == 1, found.text()
    assert "offload: it moves activations from a GPU to host memory" in said[0]
    assert "cpu_offload: it moves FSDP2's state" in said[0]
    assert all(c.precision != "tf32" for c, _, _ in found.front)


def _step_figure(text: str) -> str:
    """The one step-time figure in ``text``: ``+25%`` or ``within noise``."""
    found = re.findall(r"[+-]\d+% against as it is|within noise of as it is", text)
    assert len(found) == 1, text
    return found[0].split(" against")[0].removesuffix(" of as it is")


def test_a_fit_gives_one_figure_for_its_step_time_change_everywhere(
    shell: InteractiveShell,
) -> None:
    trial = _trial()
    shell.user_ns.update(model=trial.model, opt=trial.optimizer)
    tuner = tune(trial.model, "opt", trial=trial, shell=shell)
    base, every = tuner.compare([Config(checkpoint="blocks")])  # the table's first baseline
    assert base.peak_allocated_bytes is not None and every.peak_allocated_bytes is not None
    budget = (base.peak_allocated_bytes + every.peak_allocated_bytes) // 2
    found = tuner.fit(budget, techniques=("checkpoint",))
    assert isinstance(found, Plan) and found.measured_change is not None, found.reasoning
    figure = found.measured_change.figure
    assert _step_figure(found.reasoning[-1]) == figure  # "Verified by a measured run: ..."
    cells = re.findall(r"<t[hd][^>]*>([^<]*)</t[hd]>", tuner.panel.fit_text.value)
    at = cells.index("step against as it is")
    assert cells[at + 2] == figure  # the measured column of the panel's plan table
    rows: list[dict[str, Any]] = tuner.rows
    assert rows[-1]["configuration"] == f"plan · {found.config}"
    # the table compares with the plan's own baseline, so its row gives the plan's figure
    assert rows[-2]["configuration"] == "plan · baseline"
    assert rows[-1]["step_within_noise"] == found.measured_change.within_noise
    assert rows[-1]["delta_step_pct"] == pytest.approx(found.measured_change.pct)
    shown = tuner.text().split("\nplan · ckpt")[-1]  # the plan's row, wrapped or not
    assert re.findall(r"[+-]\d+%|within noise", shown)[1] == figure  # after the peak's change
