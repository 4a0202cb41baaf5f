"""Trial.plan on the CPU: a subset of blocks for a budget, predicted and then measured."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jupyter_gpumem.techniques import Config, blocks
from jupyter_gpumem.tuner.planning.plan import Plan, fit_plan, plan
from jupyter_gpumem.tuner.planning.profile import profile_step
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.trial import Trial
from jupyter_gpumem.tuner.workload import Workload
from jupyter_gpumem.units import format_bytes

D = 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, 4 * D)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln(x)))))


class Stack(nn.Module):
    """12 blocks in an nn.Sequential between an input and an output layer."""

    def __init__(self, n: int = 12) -> None:
        super().__init__()
        self.inp = nn.Linear(D, D)
        self.layers = nn.Sequential(*(Block() for _ in range(n)))
        self.out = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(self.inp(x)))


class Attention(nn.Module):
    """A GPT-like block: keyword arguments in (a mask shared by all blocks), a tuple out."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(
        self, h: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False
    ) -> tuple[torch.Tensor, Any]:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, 4, D // 4).permute(2, 0, 3, 1, 4)
        a = F.softmax(q @ k.transpose(-1, -2) / 4 + attention_mask, dim=-1) @ v
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, D))
        return h + self.mlp(self.ln2(h)), ((k, v) if use_cache else None)


class TinyGPT(nn.Module):
    def __init__(self, n: int = 8, vocab: int = 300) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, D)
        self.h = nn.ModuleList(Attention() for _ in range(n))
        self.head = nn.Linear(D, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        h = self.wte(ids)
        for block in self.h:
            h, _ = block(h, attention_mask=mask, use_cache=True)
        return self.head(h)


def _stack_trial() -> Trial:
    torch.manual_seed(0)
    model = Stack()
    opt = torch.optim.AdamW(model.parameters())
    return Trial(
        model, torch.randn(256, D), lambda m, b: m(b).square().mean(), optimizer=opt, steps=2
    )


def _gpt_trial() -> Trial:
    torch.manual_seed(0)
    model = TinyGPT()
    ids = torch.randint(0, 300, (8, 48))

    def loss(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(b).flatten(0, 1), b.flatten())

    opt = torch.optim.AdamW(model.parameters())
    return Trial(model, ids, loss, optimizer=opt, warmup=1, steps=2)


def _anchors(trial: Trial) -> tuple[int, int]:
    names = tuple(blocks(trial.model))
    base, every = trial.compare([Config(checkpoint=names)])
    assert base.peak_allocated_bytes is not None and every.peak_allocated_bytes is not None
    return base.peak_allocated_bytes, every.peak_allocated_bytes


@pytest.mark.parametrize("make", [_stack_trial, _gpt_trial], ids=["sequential", "gpt-like"])
def test_a_budget_between_gives_a_strict_subset_whose_measured_peak_fits(make: Any) -> None:
    trial = make()
    weights = [p.detach().clone() for p in trial.model.parameters()]
    n = len(blocks(trial.model))
    base, every = _anchors(trial)
    budget = (base + every) // 2
    found = trial.plan(budget, techniques=("checkpoint",))
    assert isinstance(found, Plan) and found.fits
    assert 0 < len(found.checkpoint) < n
    assert found.precision is None and found.optimizer is None
    assert found.predicted_peak_bytes is not None and found.predicted_peak_bytes <= budget
    assert found.predicted_step_s is not None and found.predicted_step_s > 0
    assert found.measured_peak_bytes is None and found.measured_fits is None
    assert found.verify() is found
    assert found.measured_fits and found.measured_peak_bytes is not None
    assert found.measured_peak_bytes <= budget
    # the model is exact on these stacks: the prediction is the measurement, or a little above
    assert 0 <= found.predicted_peak_bytes - found.measured_peak_bytes <= 0.02 * budget
    text = "\n".join(found.reasoning)
    assert f"of {n} blocks" in text and "Solver: exact search" in text
    assert found.config == Config(checkpoint=found.checkpoint)
    data = found.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["checkpoint"] == list(found.checkpoint)
    assert data["measured_peak_bytes"] == found.measured_peak_bytes
    assert all(torch.equal(p, w) for p, w in zip(trial.model.parameters(), weights, strict=True))
    assert all("forward" not in m.__dict__ for m in trial.model.modules())  # nothing left applied


def test_more_budget_checkpoints_fewer_blocks() -> None:
    trial = _stack_trial()
    base, every = _anchors(trial)
    counts = []
    for share in (0.05, 0.3, 0.6, 0.9):
        found = plan(trial, round(every + share * (base - every)), ("checkpoint",))
        assert found.fits
        counts.append(len(found.checkpoint))
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
    roomy = plan(trial, 2 * base, ("checkpoint",))
    assert roomy.checkpoint == () and roomy.predicted_peak_bytes == base
    assert "nothing needs to change" in "\n".join(roomy.reasoning)
    tight = plan(trial, every // 2, ("checkpoint",))
    assert not tight.fits and len(tight.checkpoint) == 12
    assert any(line.startswith("Nothing fits") for line in tight.reasoning)


def test_the_profile_sees_each_block() -> None:
    trial = _stack_trial()
    names = blocks(trial.model)
    profile = profile_step(trial.workload, names, Config())
    assert [b.name for b in profile.blocks] == names and profile.unused == ()
    assert len({b.saving_bytes for b in profile.blocks}) == 1  # alike blocks, alike bytes
    first = profile.blocks[0]
    assert 0 < first.saving_bytes < first.saved_bytes  # the checkpoint keeps the block's input
    assert first.saved_bytes - first.saving_bytes == 256 * D * 4
    assert first.forward_s > 0 and first.output_bytes == 256 * D * 4
    assert first.grad_bytes == 4 * sum(p.numel() for p in trial.model.layers[0].parameters())
    with pytest.raises(ValueError, match="without checkpointing"):
        profile_step(trial.workload, names, Config(checkpoint="blocks"))


def test_all_techniques_fit_a_budget_checkpointing_alone_cannot() -> None:
    trial = _stack_trial()
    _, every = _anchors(trial)
    steps: list[str] = []
    # AdamW's variants (8-bit too, where bitsandbytes is installed) and autocast alone cannot:
    # the plan may change the optimizer
    assert not plan(trial, round(0.6 * every)).fits
    found = fit_plan(trial, round(0.6 * every), allow=("optimizer",), progress=steps.append)
    assert found.fits and found.measured_fits, found.reasoning
    assert found.precision is not None or found.optimizer is not None
    text = "\n".join(found.reasoning)
    assert "combinations of precision and optimizer" in text
    assert "Verified by a measured run" in found.reasoning[-1]
    assert steps and any(s.startswith("verifying") for s in steps)


def test_the_plan_keeps_the_training_math_unless_allowed() -> None:
    """AdamW stays AdamW (its fused and 8-bit variants may come), and weights stay fp32 under
    autocast, whatever the budget; allowed, the plan may change both, and says so first."""
    trial = _stack_trial()
    _, every = _anchors(trial)
    steps: list[str] = []
    kept = plan(trial, round(0.5 * every), progress=steps.append)
    assert kept.optimizer in (None, "adamw-fused", "adamw-8bit"), kept.reasoning
    assert kept.precision != "bf16"
    assert kept.reasoning[0].startswith("Keeps your optimizer, adamw (or its variants")
    assert "allow=('optimizer', 'pure-bf16')" in kept.reasoning[0]
    measured = " ".join(steps)
    assert "sgd" not in measured and "adafactor" not in measured and "'bf16'" not in measured
    freed = plan(trial, round(0.5 * every), allow=("optimizer", "pure-bf16"))
    assert freed.reasoning[0].startswith("Keeps nothing of the training math fixed; allowed")
    assert "another optimizer algorithm" in freed.reasoning[0]
    assert any("sgd" in line for line in freed.reasoning), freed.reasoning
    with pytest.raises(ValueError, match="some of optimizer, pure-bf16"):
        plan(trial, every, allow=("lora",))


def test_a_model_without_blocks_is_planned_without_checkpointing() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(D, D)
            self.conv = nn.Conv1d(1, 1, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(self.fc(x)[:, None])

    model = Flat()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trial = Trial(model, torch.randn(32, D), lambda m, b: m(b).square().mean(), optimizer=opt)
    found = trial.plan(1, techniques=("checkpoint",))
    assert not found.fits and found.checkpoint == ()
    assert "no repeated blocks" in found.reasoning[2]  # after the training math and the budget


def _activations(by_module: dict[str, dict[str, int]], name: str) -> int:
    """A block's activations at the peak: its one call's, or the sum over ``name#k`` calls."""
    calls = [k for k in by_module if k == name or k.startswith(f"{name}#")]
    return sum(by_module[k].get("activations", 0) for k in calls)


def test_the_reasoning_gives_each_blocks_activations_at_the_peak() -> None:
    trial = _stack_trial()
    base, every = _anchors(trial)
    found = trial.plan((base + every) // 2, techniques=("checkpoint",))
    assert found.baseline is not None and found.baseline.report is not None
    by_module = found.baseline.report.by_module
    assert by_module is not None
    expected = {n: by_module[n]["activations"] for n in found.blocks}  # each block ran once
    assert found.block_bytes == expected and min(expected.values()) > 0
    assert found.to_dict()["block_bytes"] == expected
    text = "\n".join(found.reasoning)
    activations = found.baseline.report.breakdown["activations"]  # type: ignore[index]
    assert (
        f"{format_bytes(activations)}, {format_bytes(sum(expected.values()))} of it in the "
        f"{len(expected)} blocks" in text
    )
    listed = [line for line in found.reasoning if line.startswith("  layers.")]
    assert listed and len(listed) <= len(set(expected.values()))  # alike blocks share a line
    for figure in set(expected.values()):
        assert any(format_bytes(figure) in line for line in listed), (figure, listed)
    # the first block of each line, and what the plan does with the first checkpointed one
    firsts = [line.split()[0].rstrip(":") for line in listed]
    assert firsts[0] == found.blocks[0] and set(firsts) <= set(found.blocks)
    first = found.checkpoint[0]
    assert any(first in line and "checkpointed" in line for line in listed)
    assert any("kept" in line for line in listed)  # a strict subset: some blocks stay


def test_block_bytes_sum_the_calls_of_a_block_run_twice() -> None:
    class Twice(nn.Module):
        """Four blocks, run through twice in each forward (a weight-shared recurrence)."""

        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Block() for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(2):
                for block in self.layers:
                    x = block(x)
            return x

    torch.manual_seed(0)
    model = Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trial = Trial(model, torch.randn(128, D), lambda m, b: m(b).square().mean(),
                  optimizer=opt, warmup=1, steps=1)  # fmt: skip
    found = trial.plan("1TiB", techniques=("checkpoint",))
    assert found.fits and found.checkpoint == ()
    assert found.baseline is not None and found.baseline.report is not None
    by_module = found.baseline.report.by_module
    assert by_module is not None and "layers.1#1" in by_module  # the calls are told apart
    assert found.block_bytes == {n: _activations(by_module, n) for n in found.blocks}
    assert found.block_bytes["layers.1"] > by_module["layers.1#0"]["activations"]
    assert "kept" in "\n".join(found.reasoning)


class _WithoutReports:
    """A trial whose results carry no report: the planner takes any such measurer."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial

    @property
    def workload(self) -> Workload:
        return self.trial.workload

    def run(self, config: Config) -> TrialResult:
        return replace(self.trial.run(config), report=None)

    def compare(self, configs: Sequence[Config]) -> list[TrialResult]:
        return [replace(r, report=None) for r in self.trial.compare(configs)]


def test_a_run_without_the_peak_by_module_leaves_the_blocks_out() -> None:
    found = plan(_WithoutReports(_stack_trial()), "1TiB", ("checkpoint",))
    assert found.fits and found.block_bytes == {} and found.to_dict()["block_bytes"] == {}
    assert not any(line.startswith("Activations at the peak") for line in found.reasoning)


@pytest.mark.parametrize(
    ("budget", "techniques", "error"),
    [
        ("lots", ("checkpoint",), "is not a size such as"),
        (0, ("checkpoint",), "greater than zero"),
        (True, ("checkpoint",), "budget must be bytes"),
        ("1GiB", ("quantize",), "techniques must name some of checkpoint, precision, optimizer"),
        ("1GiB", (), "techniques must name"),
    ],
)
def test_bad_input_says_what_is_allowed(budget: Any, techniques: Any, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        plan(_stack_trial(), budget, techniques)
