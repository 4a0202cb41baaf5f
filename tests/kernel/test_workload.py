"""A trial's inputs are refused up front where they would make its answer wrong."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from jupyter_gpumem.techniques import Config  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402


def _loss(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
    return m(b).square().mean()


def test_an_optimizer_of_another_model_is_refused() -> None:
    model, other = nn.Linear(256, 256), nn.Linear(256, 256)
    with pytest.raises(
        ValueError, match=r"holds 2 of 2 tensors that are not the model's parameters"
    ):
        Trial(model, torch.randn(4, 256), _loss, optimizer=torch.optim.Adam(other.parameters()))
    mixed = torch.optim.SGD([*model.parameters(), *other.parameters()], lr=0.1)
    with pytest.raises(
        ValueError, match=r"holds 2 of 4 tensors .* \(the first of shape \(256, 256\)\)"
    ):
        Trial(model, torch.randn(4, 256), _loss, optimizer=mixed)


def test_an_optimizer_of_part_of_the_model_is_taken() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    head = torch.optim.Adam(model[1].parameters())  # a frozen body, as LoRA trains adapters
    result = Trial(model, torch.randn(4, 8), _loss, optimizer=head, warmup=0, steps=1).run(Config())
    assert result.status == "ok"
    # exp_avg and exp_avg_sq of the head's 18 parameters, and a 4-byte step count per tensor
    assert (
        result.breakdown is not None and result.breakdown["optimizer_state"] == 2 * 4 * 18 + 2 * 4
    )


def test_the_matching_optimizer_counts_its_state() -> None:
    model = nn.Linear(256, 256)
    trial = Trial(
        model, torch.randn(4, 256), _loss, optimizer=torch.optim.Adam(model.parameters()), steps=1
    )
    assert trial.run(Config()).breakdown["optimizer_state"] == 2 * 4 * (256 * 256 + 256) + 2 * 4


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda t: t.run(None),
            r"run takes a Config, e.g\. Config\(precision='bf16'\); got NoneType None",
        ),
        (lambda t: t.compare(["x"]), r"compare takes a list of Config.*got list \['x'\]"),
        (lambda t: t.compare(Config()), "compare takes a list of Config"),
        (lambda t: t.run("y" * 10_000), r"got str 'y.{0,39}$"),  # 40 characters at most
    ],
)
def test_wrong_arguments_say_what_is_allowed(call: object, message: str) -> None:
    model = nn.Linear(4, 4)
    trial = Trial(
        model, torch.randn(2, 4), _loss, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    with pytest.raises(TypeError, match=message):
        call(trial)  # type: ignore[operator]
