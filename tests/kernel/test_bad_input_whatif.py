"""Bad input to the what-if API is refused with what is allowed, never a raw error or an
answer the tool cannot stand behind: a batch never tried, a peak for a step that cannot run."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import jupyter_gpumem  # noqa: E402
from jupyter_gpumem.tuner.estimation.estimate import EstimateUnavailable  # noqa: E402
from jupyter_gpumem.tuner.trial import Trial  # noqa: E402
from jupyter_gpumem.units import parse_size  # noqa: E402


def _loss(m: nn.Module, b: Any) -> Any:
    return m(b).sum()


def _trial(model: nn.Module, batch: Any, **kwargs: Any) -> Trial:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trial(model, batch, _loss, optimizer=opt, **kwargs)


def _meta_linear() -> nn.Module:
    with torch.device("meta"):
        return nn.Linear(4, 2)


# -- 9: nothing fits ----------------------------------------------------------------------------
def test_when_even_low_does_not_fit_the_answer_is_the_nothing_fits_one_not_an_untried_batch() -> (
    None
):
    trial = _trial(nn.Linear(4, 2), torch.zeros(3, 4))
    with pytest.warns(UserWarning, match="even batch size 1000000 is estimated at"):
        found = trial.max_batch_size(4096, lambda n: torch.zeros(n, 4), low=10**6)
    assert found == 0  # as for low=1: no batch fits
    search = trial.last_search
    assert search is not None and [n for n, _ in search.tried] == [10**6]
    assert search.estimate is None
    assert search.above is not None and search.above.batch_size == 10**6
    with pytest.warns(UserWarning, match="even batch size 1 is estimated"):
        assert trial.max_batch_size(1, lambda n: torch.zeros(n, 4)) == 0


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


# -- 12: bounds, budgets, frozen models, devices, paths -------------------------------------------
def test_world_sizes_are_checked_before_a_range_becomes_a_list() -> None:
    trial = _trial(nn.Linear(4, 2), torch.zeros(4, 4))
    for sizes in (range(1, 10**9), range(1, 10**30), [1] * 2000):
        with pytest.raises(
            ValueError, match=r"world_sizes is a list of rank counts .* at most 1024"
        ):
            trial.search("1GiB", world_sizes=sizes)
    with pytest.raises(ValueError, match="world_size is the number of ranks"):
        trial.search("1GiB", world_sizes=range(1020, 1030))


def test_a_budget_too_large_to_parse_says_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="is more than 1 EiB: give a size such as 512MiB"):
        parse_size("1" * 400 + "GiB")
    trial = _trial(nn.Linear(4, 2), torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"budget: '1111.*' is more than 1 EiB") as caught:
        trial.search("1" * 400 + "GiB")
    assert len(str(caught.value)) < 300  # the message does not echo the 400 digits


@pytest.mark.parametrize("budget", [1e30, 10**400, 0, True, None, "lots"])
def test_a_bad_budget_gets_one_error_everywhere_a_budget_is_taken(budget: Any) -> None:
    trial = _trial(nn.Linear(4, 2), torch.zeros(4, 4))
    calls = {
        "plan": lambda: trial.plan(budget),
        "search": lambda: trial.search(budget, measure=False),
        "max_batch_size": lambda: trial.max_batch_size(budget, lambda n: torch.zeros(n, 4)),
    }
    messages = set()
    for name, call in calls.items():
        with pytest.raises(ValueError, match="budget") as caught:
            call()
        assert type(caught.value) is ValueError, name
        messages.add(str(caught.value))
    assert len(messages) == 1, messages
    if not isinstance(budget, str):
        assert messages.pop().startswith("budget must be bytes")


@pytest.mark.parametrize("size", [1e30, 10**30, 0, True, "8"])
def test_a_bad_batch_size_gets_one_error_everywhere_one_is_taken(size: Any) -> None:
    trial = _trial(nn.Linear(4, 2), torch.zeros(4, 4))
    for name in ("low", "high"):
        with pytest.raises(ValueError, match=rf"^{name} must be a batch size, a whole number"):
            trial.max_batch_size("1GiB", lambda n: torch.zeros(n, 4), **{name: size})


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2))

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_model_with_nothing_to_train_is_refused_up_front_naming_the_fix() -> None:
    frozen = _Blocks().requires_grad_(False)
    trial = _trial(frozen, torch.zeros(3, 4))
    fix = r"no trainable parameters .* inference=True.* unfreeze parameters"
    for call in (
        trial.estimate,
        lambda: trial.max_batch_size("1GiB", lambda n: torch.zeros(n, 4)),
        lambda: trial.search("1GiB", measure=False),
        lambda: trial.plan("1GiB"),
    ):
        with pytest.raises(ValueError, match=fix):
            call()
    inference = Trial(frozen, torch.zeros(3, 4), lambda m, b: m(b), inference=True)
    assert inference.estimate().peak_bytes is not None
    adapted = trial.estimate(lora=4)  # adapters are what a LoRA step trains
    assert adapted.peak_bytes is not None, adapted.reason


@pytest.mark.parametrize("device", ["tpu", "cuda:x", object()])
def test_a_device_torch_does_not_know_says_what_is_allowed(device: Any) -> None:
    with pytest.raises(ValueError, match="device is where the steps would run: 'cuda'"):
        Trial(nn.Linear(4, 2), torch.zeros(3, 4), _loss, device=device)


def test_a_nul_byte_in_a_path_is_refused_before_anything_runs(tmp_path: Any) -> None:
    ran = []
    with pytest.raises(ValueError, match=r"record\(.*\): a path holds no NUL byte"):
        with jupyter_gpumem.record(str(tmp_path / "run\x00.json")):
            ran.append(True)
    assert not ran
    for paths in ("run\x00.json", [str(tmp_path / "a\x00b.json")], str(tmp_path / "x\x00/*.json")):
        with pytest.raises(ValueError, match=r"load_reports takes a path.* no NUL byte"):
            jupyter_gpumem.load_reports(paths)
