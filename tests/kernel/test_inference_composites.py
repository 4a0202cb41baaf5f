"""Under ``torch.inference_mode()`` a composite op reaches a dispatch mode whole: what its kernel
makes in between (``cross_entropy_loss``'s log-softmax, a whole logits-sized tensor) is counted
by the CPU source and by the estimate, as the CUDA allocator counts it."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

ROWS, CLASSES = 64, 32000
LOG_SOFTMAX = ROWS * CLASSES * 4


class Scored(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def test_a_cell_in_inference_mode_counts_the_log_softmax(shell: InteractiveShell) -> None:
    setup = f"import torch\nx = torch.randn({ROWS}, {CLASSES})\ny = torch.randint(0, {CLASSES}, ({ROWS},))"
    assert shell.run_cell(setup).success
    body = "with torch.inference_mode():\n    loss = torch.nn.functional.cross_entropy(x, y)"
    assert shell.run_cell(f"%%gpumem -o r --quiet\n{body}").success
    r = shell.user_ns["r"]
    made = r.peak_allocated_bytes - r.allocated_before_bytes
    assert LOG_SOFTMAX <= made < LOG_SOFTMAX + 1024


def test_an_inference_estimate_counts_the_log_softmax_as_measured() -> None:
    from jupyter_gpumem.techniques import Config
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    batch = (torch.randn(ROWS, 16), torch.randint(0, CLASSES, (ROWS,)))
    trial = Trial(Scored(), batch, _loss, inference=True, warmup=1, steps=1)
    config = Config(inference_mode=True)
    estimate = trial.estimate(config=config)
    measured = trial.run(config)
    assert estimate.peak_bytes == measured.peak_allocated_bytes
    logits = ROWS * CLASSES * 4
    assert estimate.breakdown is not None
    assert estimate.breakdown["temporary"] >= logits + LOG_SOFTMAX
    assert measured.breakdown is not None
    assert measured.breakdown["temporary"] == pytest.approx(estimate.breakdown["temporary"], abs=64)


def test_an_op_with_a_kernel_of_its_own_runs_whole() -> None:
    """silu_backward is composite too, but CPU and CUDA run their fused kernels, which make no
    sigmoid in between: split, it would count memory the real step never takes."""
    from jupyter_gpumem.tracking.composites import is_composite

    aten = torch.ops.aten
    assert not is_composite(torch, aten.silu_backward.default)
    assert not is_composite(torch, aten.embedding.default)  # not composite at all
    assert is_composite(torch, aten.cross_entropy_loss.default)
