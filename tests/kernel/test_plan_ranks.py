"""Trial.plan on two ranks over gloo on the CPU: every run, the profile included, on the ranks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)

from torch import nn  # noqa: E402

from jupyter_gpumem.techniques import Config  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def _loss(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
    return m(b).logsumexp(-1).mean()


def _trial() -> Trial:
    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(4)], nn.Linear(64, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(model, torch.randn(1024, 64), _loss, optimizer=opt, warmup=1, steps=2)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_a_plan_on_two_ranks_checkpoints_to_fit_each_rank(parallel: str) -> None:
    trial = _trial()
    base = trial.run(Config(parallel=parallel, world_size=2))
    assert base.status == "ok", base.error
    budget = round(0.8 * (base.peak_allocated_bytes or 0))
    found = trial.plan(budget, techniques=("checkpoint",), parallel=parallel, world_size=2)
    assert found.parallel == parallel and found.world_size == 2
    assert found.config == Config(checkpoint=found.checkpoint, parallel=parallel, world_size=2)
    assert found.fits and found.checkpoint
    assert found.predicted_peak_bytes is not None and found.predicted_peak_bytes <= budget
    assert f"On 2 ranks of {parallel}: the budget is per rank" in found.reasoning[2]
    assert any(line.startswith("Profiled step") for line in found.reasoning), found.reasoning
    # the figures are the worst rank's, as Trial.run gives them
    assert found.baseline is not None and [r.rank for r in found.baseline.ranks] == [0, 1]
    assert found.baseline.peak_allocated_bytes == base.peak_allocated_bytes
    data = found.to_dict()
    assert data["parallel"] == parallel and data["world_size"] == 2
    verified = found.verify()
    assert verified.result is not None and len(verified.result.ranks) == 2
    assert verified.measured_fits, (verified.measured_peak_bytes, budget)


def test_one_process_plans_say_so_in_their_record() -> None:
    trial = _trial()
    found = trial.plan(2**40, techniques=("checkpoint",))
    assert found.parallel is None and found.world_size == 1
    assert found.config == Config()
    assert found.to_dict()["parallel"] is None and found.to_dict()["world_size"] == 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"world_size": 2}, "needs a strategy"),
        ({"parallel": "zero3", "world_size": 2}, "ddp, fsdp2"),
        ({"parallel": "ddp", "world_size": 0}, "whole number from 1 to 1024, got 0"),
    ],
)
def test_bad_rank_settings_say_what_is_allowed(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _trial().plan(2**20, **settings)


def test_a_model_without_weights_is_sent_to_search_for_ranks() -> None:
    with torch.device("meta"):
        model = nn.Sequential(Block(), Block())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trial = Trial(model, torch.randn(8, 64, device="meta"), _loss, optimizer=opt, device="cpu")
    with pytest.raises(ValueError, match=r"world_sizes=\(2,\)\) estimates it on ranks"):
        trial.plan(2**20, parallel="fsdp2", world_size=2)
