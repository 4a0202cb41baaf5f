"""Gradient accumulation: micro-batches are views of the batch, the gradients the full batch's."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config, apply_config
from jupyter_gpumem.techniques.accumulation import micro_batches


def test_micro_batches_are_equal_views_of_every_tensor_in_the_batch() -> None:
    Pair = namedtuple("Pair", "x y")
    x, y = torch.randn(8, 3), torch.arange(8)
    batch = {"pair": Pair(x, y), "ids": [y], "scale": 2.0, "scalar": torch.tensor(1.0)}
    parts = micro_batches(batch, 4)
    assert len(parts) == 4
    for i, part in enumerate(parts):
        assert isinstance(part["pair"], Pair) and part["scale"] == 2.0
        assert part["scalar"] is batch["scalar"]  # no rows to cut
        assert torch.equal(part["pair"].x, x[2 * i : 2 * i + 2])
        assert part["pair"].x.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert torch.equal(part["ids"][0], y[2 * i : 2 * i + 2])
    assert micro_batches(batch, 1) == [batch]


@pytest.mark.parametrize(
    ("batch", "says"),
    [
        (torch.randn(6, 2), "needs a batch whose 6 rows split evenly: use a divisor of 6"),
        ((torch.randn(8, 2), torch.randn(4)), "disagree on it (4, 8 rows)"),
        ({"a": 1.0}, "the batch holds none"),
    ],
)
def test_a_batch_that_does_not_split_says_why(batch: object, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        micro_batches(batch, 4)


def test_the_config_takes_a_count_of_micro_batches() -> None:
    assert str(Config(accumulate=4)) == "accumulate 4" and str(Config()) == "baseline"
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="number of micro-batches per optimizer step"):
            Config(accumulate=bad)  # type: ignore[arg-type]


def test_accumulated_gradients_are_the_full_batchs_and_nothing_is_left_applied() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.Linear(16, 3))
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0]), b[1])  # the mean over the batch

    loss_fn(model, (x, y)).backward()
    full = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applied = apply_config(model, Config(accumulate=3))
    for micro in applied.micro_batches((x, y)):
        applied.backward(loss_fn(applied.model, micro))
    for p, g in zip(model.parameters(), full, strict=True):
        torch.testing.assert_close(p.grad, g)
    applied.revert()
    assert applied.model is model
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
