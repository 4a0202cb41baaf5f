"""N ranks on the CPU: per-rank estimates from one process against forked ranks over gloo (issue 23).

The estimate plays each rank in a fake process group on fake tensors; ``Trial.run`` forks the
ranks, which measure themselves with the dispatch source. On the CPU both count exact storage
bytes, so they must agree rank by rank, FSDP2's parameters being each rank's padded shard.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.rank_estimates import shard_sizes
from jupyter_gpumem.tuner.trial import Trial

TOLERANCE_PCT = 3.0
pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="needs torch.distributed"
)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(192, 192), nn.GELU()) for _ in range(3)]
    return nn.Sequential(*blocks, nn.Linear(192, 7))  # 7 rows: an uneven last shard


def _loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x).logsumexp(-1).mean()


@pytest.fixture
def trial() -> Trial:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(model, torch.randn(48, 192), _loss, optimizer=opt, warmup=1, steps=2)


def _padded_shard_bytes(model: nn.Module, world: int) -> int:
    """What FSDP2 keeps of each parameter on every rank: ceil(rows / world) rows."""
    total = 0
    for p in model.parameters():
        rows = p.shape[0]
        total += -(-rows // world) * (p.numel() // rows) * p.element_size()
    return total


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_each_rank_estimate_matches_its_forked_rank(trial: Trial, parallel: str) -> None:
    config = Config(parallel=parallel, world_size=2)
    estimate = trial.estimate(config=config)
    assert estimate.peak_bytes is not None, estimate.reason
    assert [e.rank for e in estimate.ranks] == [0, 1]
    result = trial.run(config)
    assert result.status == "ok", result.error
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.estimate is estimate
    for measured, predicted in zip(result.ranks, estimate.ranks, strict=True):
        assert measured.status == "ok", measured.error
        assert measured.estimate is predicted
        error = predicted.error_pct(measured.peak_allocated_bytes)
        assert error is not None and abs(error) <= TOLERANCE_PCT, result.vs_estimate
    worst = max(r.peak_allocated_bytes or 0 for r in result.ranks)
    assert result.peak_allocated_bytes == worst
    assert estimate.peak_bytes == max(e.peak_bytes or 0 for e in estimate.ranks)
    assert result.vs_estimate is not None and result.vs_estimate.count("rank ") == 2


def test_fsdp2_parameters_are_each_ranks_shard(trial: Trial) -> None:
    config = Config(parallel="fsdp2", world_size=2)
    shard = _padded_shard_bytes(trial.model, 2)
    full = sum(p.numel() * p.element_size() for p in trial.model.parameters())
    estimate = trial.estimate(config=config)
    result = trial.run(config)
    for predicted, measured in zip(estimate.ranks, result.ranks, strict=True):
        assert predicted.breakdown is not None and measured.breakdown is not None
        assert predicted.breakdown["parameters"] == shard < full
        assert measured.breakdown["parameters"] == shard
        # the all-gathered parameters and the reduce-scatter input, told by their code
        assert predicted.breakdown["communication"] > 0
        assert measured.breakdown["communication"] > 0
        # AdamW's two moments of the local shard (the last rank's is shorter) and its steps
        assert predicted.breakdown["optimizer_state"] == measured.breakdown["optimizer_state"]
    ddp = trial.estimate(config=Config(parallel="ddp", world_size=2))
    assert all(e.breakdown is not None and e.breakdown["parameters"] == full for e in ddp.ranks)


def test_ranks_with_the_same_shards_are_played_once() -> None:
    model = _mlp()
    fsdp = Config(parallel="fsdp2", world_size=4)
    keys = [shard_sizes(model, fsdp, r) for r in range(4)]
    # 192 rows cut in 4 pieces of 48; 7 rows in pieces of 2, 2, 2 and 1
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert keys[3][-2:] == (1, 1)
    ddp = Config(parallel="ddp", world_size=4)
    assert {shard_sizes(model, ddp, r) for r in range(4)} == {()}


def test_the_kernels_model_and_optimizer_are_untouched(trial: Trial) -> None:
    params = list(trial.model.parameters())
    before = [p.detach().clone() for p in params]
    groups = [list(g["params"]) for g in trial.optimizer.param_groups]
    for parallel in ("ddp", "fsdp2"):
        config = Config(parallel=parallel, world_size=2)
        trial.estimate(config=config)
        trial.run(config)
    assert list(trial.model.parameters()) == params
    assert all(type(p) is nn.Parameter for p in params)
    assert all(torch.equal(p, b) for p, b in zip(params, before, strict=True))
    assert [list(g["params"]) for g in trial.optimizer.param_groups] == groups
    assert not torch.distributed.is_initialized()
    assert type(trial.model) is nn.Sequential  # not sharded in the kernel


def _touch(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    queue.put(float((torch.ones(8, 8) @ torch.ones(8, 8)).sum()))


def test_a_plain_fork_still_works_afterwards(trial: Trial) -> None:
    trial.run(Config(parallel="ddp", world_size=2))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_touch, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 512.0


def _fails_on_rank_1(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if torch.distributed.get_rank() == 1:
        raise ValueError("rank 1 has a bad batch")
    return _loss(m, x)


def test_a_failing_rank_is_named_and_the_others_stopped() -> None:
    model = _mlp()
    trial = Trial(model, torch.randn(8, 192), _fails_on_rank_1, warmup=0, steps=1)
    result = trial.run(Config(parallel="ddp", world_size=2))
    assert result.status == "error"
    assert result.error is not None and result.error.startswith("rank 1: ValueError")
    assert "bad batch" in result.error
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.ranks[1].status == "error"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"world_size": 2}, "needs a strategy"),
        ({"parallel": "zero3", "world_size": 2}, "ddp, fsdp2"),
        ({"parallel": "ddp", "world_size": 0}, "whole number from 1 to 1024, got 0"),
        ({"parallel": "ddp", "world_size": True}, "whole number from 1 to 1024"),
        ({"parallel": "ddp", "world_size": 10**9}, "from 1 to 1024, got 1000000000$"),
        ({"parallel": "ddp", "world_size": 10**5000}, "got a huge number$"),
        ({"parallel": "x" * 10_000, "world_size": 2}, "^unknown parallel strategy 'x{39}; choose"),
    ],
)
def test_bad_parallel_settings_say_what_is_allowed(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config(**settings)


def test_labels_and_keywords(trial: Trial) -> None:
    assert str(Config(parallel="fsdp2", world_size=4, precision="bf16-autocast")).endswith(
        "fsdp2 × 4"  # noqa: RUF001  # the label's sign
    )
    by_keywords = trial.estimate(parallel="ddp", world_size=2)
    assert by_keywords.label == "ddp × 2"  # noqa: RUF001
    assert len(by_keywords.ranks) == 2
    with pytest.raises(TypeError, match="parallel, world_size"):
        trial.estimate(parallel_ranks=2)


def test_max_batch_size_per_gpu_follows_the_strategy(trial: Trial) -> None:
    def make_batch(n: int) -> torch.Tensor:
        return torch.randn(n, 192)

    budget = 3 * 2**20
    one = trial.max_batch_size(budget, make_batch, high=4096)
    ddp = trial.max_batch_size(budget, make_batch, high=4096, parallel="ddp", world_size=2)
    search = trial.last_search
    assert search is not None and search.estimate is not None and search.above is not None
    assert len(search.estimate.ranks) == 2
    # the worst rank fits and the next batch size does not
    assert search.estimate.peak_bytes is not None and search.estimate.peak_bytes <= budget
    assert search.above.peak_bytes is not None and search.above.peak_bytes > budget
    fsdp = trial.max_batch_size(budget, make_batch, high=4096, parallel="fsdp2", world_size=4)
    search = trial.last_search
    assert search is not None and search.estimate is not None
    assert len(search.estimate.ranks) == 4
    # DDP keeps a bucket copy of every gradient; FSDP2 keeps a quarter of the model's state
    assert ddp < one < fsdp
