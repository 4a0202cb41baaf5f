"""Bad input to the what-if API is refused with what is allowed, never a raw error or an
answer the tool cannot stand behind: a batch never tried, a peak for a step that cannot run."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from jupyter_gpumem.tuner.estimation.estimate import EstimateUnavailable  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402


def _loss(m: nn.Module, b: Any) -> Any:
    return m(b).sum()


def _trial(model: nn.Module, batch: Any, **kwargs: Any) -> Trial:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trial(model, batch, _loss, optimizer=opt, **kwargs)


def _meta_linear() -> nn.Module:
    with torch.device("meta"):
        return nn.Linear(4, 2)


# -- 10: the fake step fails where the real step fails -------------------------------------------
def test_a_long_batch_into_a_float_linear_is_refused_as_the_real_step_refuses_it() -> None:
    model, batch = nn.Linear(4, 2), torch.randint(0, 4, (3, 4))
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        model(batch)  # the real step
    trial = _trial(model, batch)
    est = trial.estimate()
    assert est.peak_bytes is None and est.reason is not None
    assert "the real step fails too" in est.reason and "must have the same dtype" in est.reason
    assert "int64" in est.reason and "float32" in est.reason
    ints = _trial(nn.Linear(4, 2), torch.zeros(3, 4))
    with pytest.raises(EstimateUnavailable, match="must have the same dtype"):
        ints.max_batch_size("1GiB", lambda n: torch.randint(0, 4, (n, 4)))
    meta = _trial(_meta_linear(), torch.randint(0, 4, (3, 4), device="meta"))
    assert meta.estimate().peak_bytes is None


def test_a_matmul_of_two_dtypes_is_refused_inside_the_model_too() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(4, 2))

        def forward(self, x: Any) -> Any:
            return torch.mm(x.double(), self.w)

    with pytest.raises(RuntimeError, match="same dtype"):
        Mixed()(torch.zeros(3, 4))
    est = _trial(Mixed(), torch.zeros(3, 4)).estimate()
    assert est.peak_bytes is None and "mm's operands must have the same dtype" in str(est.reason)


def test_a_meta_batch_with_a_model_that_holds_weights_is_refused() -> None:
    model, batch = nn.Linear(4, 2), torch.zeros(3, 4, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        model(batch).sum().backward()  # the real step
    est = _trial(model, batch).estimate()
    assert est.peak_bytes is None and est.reason is not None
    assert "meta device" in est.reason and "weights are on cpu" in est.reason
    trial = _trial(nn.Linear(4, 2), torch.zeros(3, 4))
    with pytest.raises(EstimateUnavailable, match="the batch holds a tensor on the meta device"):
        trial.max_batch_size("1GiB", lambda n: torch.zeros(n, 4, device="meta"))


def test_meta_models_still_take_real_and_meta_batches() -> None:
    real = _trial(nn.Linear(4, 2), torch.zeros(3, 4)).estimate()
    assert real.peak_bytes is not None
    for batch in (torch.zeros(3, 4), torch.zeros(3, 4, device="meta")):
        est = _trial(_meta_linear(), batch).estimate()
        assert est.peak_bytes == real.peak_bytes, est.reason
    meta = _trial(_meta_linear(), torch.zeros(3, 4, device="meta"))
    assert meta.max_batch_size("1MiB", lambda n: torch.zeros(n, 4, device="meta"), high=64) == 64
