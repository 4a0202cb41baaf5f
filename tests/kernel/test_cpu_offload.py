"""``Config(cpu_offload=True)``: FSDP2's CPUOffloadPolicy on one rank and on two (issue 38).

On the CPU the model is in host memory already, so nothing moves (a warning says so), but the
policy's path runs: the estimate plays each rank on fake tensors and must equal the forked
rank's measured peak to the byte. tests/gpu/test_cpu_offload_gpu.py measures what moves.
"""

from __future__ import annotations

import pytest
import torch

from jupyter_gpumem.techniques import Config
from tests.kernel.test_estimate import _assert_same, _gpt, _state, _trained

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="needs torch.distributed"
)


@pytest.mark.parametrize("world_size", [1, 2])
def test_each_rank_estimate_equals_its_measured_rank(world_size: int) -> None:
    trial = _trained(_gpt())
    before = _state(trial)
    config = Config(parallel="fsdp2", world_size=world_size, cpu_offload=True)
    with pytest.warns(UserWarning, match="nothing moves to host memory"):
        estimate = trial.estimate(config=config)
    result = trial.run(config)
    assert result.status == "ok", result.error
    assert [r.rank for r in result.ranks] == list(range(world_size))
    for measured, predicted in zip(result.ranks, estimate.ranks, strict=True):
        assert predicted.peak_bytes == measured.peak_allocated_bytes, result.vs_estimate
    assert any("nothing moves to host memory" in w for w in result.warnings)
    assert f"{world_size} rank{'s' if world_size > 1 else ''} over gloo" in result.warnings
    _assert_same(before, _state(trial))  # the ranks trained copies


def test_cpu_offload_needs_fsdp2_and_says_how() -> None:
    for config in (
        {"cpu_offload": True},
        {"cpu_offload": True, "parallel": "ddp", "world_size": 2},
    ):
        with pytest.raises(ValueError, match=r"needs parallel='fsdp2', with world_size=1 on one"):
            Config(**config)
    with pytest.raises(ValueError, match="cpu_offload is True or False"):
        Config(parallel="fsdp2", cpu_offload="yes")
    config = Config(parallel="fsdp2", world_size=2, cpu_offload=True, precision="bf16-autocast")
    assert str(config) == "bf16-autocast · fsdp2 × 2 · state on cpu"  # noqa: RUF001
    assert config.single == Config(precision="bf16-autocast")
