"""Trials on the CPU: the same peak as `%%gpumem`, bit-exact restoration, failures as results."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.trial import Trial

techniques = pytest.importorskip("jupyter_gpumem.techniques")
Config = techniques.Config
if not hasattr(techniques, "apply_config"):
    pytest.skip("jupyter_gpumem.techniques has no apply_config yet", allow_module_level=True)


def _model() -> nn.Module:
    """Dropout draws random numbers; BatchNorm has running statistics and a step counter."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.BatchNorm1d(64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, 8)
    )


def _loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).pow(2).mean()


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything a trial may touch, copied."""
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "param_ids": [id(p) for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "opt_state": {
            i: {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
            for i, p in enumerate(model.parameters())
            if p in opt.state
        },
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["param_ids"] == b["param_ids"]
    for key in ("params", "buffers", "grads"):
        assert len(a[key]) == len(b[key])
        for x, y in zip(a[key], b[key], strict=True):
            assert (x is None and y is None) or (x.dtype == y.dtype and torch.equal(x, y)), key
    assert a["training"] == b["training"]
    assert a["opt_state"].keys() == b["opt_state"].keys()
    for i, state in a["opt_state"].items():
        assert state.keys() == b["opt_state"][i].keys()
        for k, v in state.items():
            w = b["opt_state"][i][k]
            assert torch.equal(v, w) if torch.is_tensor(v) else v == w, (i, k)
    assert a["groups"] == b["groups"]
    assert torch.equal(a["torch_rng"], b["torch_rng"])
    assert a["python_rng"] == b["python_rng"]
    np.testing.assert_equal(a["numpy_rng"], b["numpy_rng"])


@pytest.fixture
def trained() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """A model with gradients, running statistics and Adam state from a step the user took."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(32, 16)
    _loss(model, x).backward()
    opt.step()
    _loss(model, x).backward()  # gradients left in place, as after a user's backward
    np.random.seed(1)
    random.seed(2)
    return model, opt, x


def test_peak_and_breakdown_equal_a_gpumem_cell(shell: InteractiveShell) -> None:
    setup = (
        "import torch, torch.nn as nn\n"
        "from jupyter_gpumem import Trial\n"
        "from jupyter_gpumem.techniques import Config\n"
        "torch.manual_seed(0)\n"
        "model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))\n"
        "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
        "x = torch.randn(32, 64)\n"
        "def loss_fn(m, b):\n"
        "    return m(b).pow(2).mean()\n"
        "res = Trial(model, x, loss_fn, optimizer=opt, warmup=2, steps=3).run(Config())\n"
        "def train_step():\n"
        "    loss = loss_fn(model, x)\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad(set_to_none=True)\n"
        "train_step(); train_step()  # the trial's warm-up\n"
    )
    assert shell.run_cell(setup).success
    result = shell.run_cell("%%gpumem -o r\nfor _ in range(3):\n    train_step()")
    assert result.success, result.error_in_exec
    res, r = shell.user_ns["res"], shell.user_ns["r"]
    assert res.status == "ok" and res.label == "baseline"
    assert res.report.device == "cpu"
    assert res.peak_allocated_bytes == r.peak_allocated_bytes
    assert res.peak_reserved_bytes == r.peak_reserved_bytes
    assert res.breakdown == r.breakdown
    n = sum(p.numel() for p in shell.user_ns["model"].parameters())
    assert res.breakdown["parameters"] == 4 * n
    assert sum(res.breakdown.values()) == res.peak_allocated_bytes
    assert len(res.step_s_all) == 3 and res.step_s == sorted(res.step_s_all)[1]


def test_step_times_come_from_untracked_steps_after_the_measured_ones() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    tracked: list[bool] = []  # per forward: whether the CPU tracker's dispatch mode is on

    def loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        tracked.append(bool(_get_current_dispatch_mode_stack()))
        return _loss(model, batch)

    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    res = Trial(model, torch.randn(8, 16), loss, optimizer=opt, warmup=1, steps=3).run(Config())
    assert res.status == "ok" and res.peak_allocated_bytes
    # warm-up and measured steps tracked, then as many timed with nothing tracked
    assert tracked == [True] * 4 + [False] * 3
    assert len(res.step_s_all) == 3 and res.step_s == sorted(res.step_s_all)[1]
    tracked.clear()  # a long run times three steps, not as many as it measured
    Trial(model, torch.randn(8, 16), loss, optimizer=opt, warmup=1, steps=8).run(Config())
    # (the CPU tracker may step aside during a long run's measured steps: only the count holds)
    assert len(tracked) == 1 + 8 + 3 and tracked[-3:] == [False] * 3


def test_a_failed_untracked_step_keeps_the_measured_memory_and_says_so() -> None:
    calls = 0

    def loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 5:  # the first step after the warm-up and the three measured ones
            raise RuntimeError("the data loader ran dry")
        return _loss(model, batch)

    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    trial = Trial(model, torch.randn(8, 16), loss, optimizer=opt, warmup=1, steps=3)
    res = trial.run(Config())
    calls = -100  # the next run steps freely
    again = trial.run(Config())
    assert res.status == "ok" and res.peak_allocated_bytes == again.peak_allocated_bytes
    assert res.breakdown == again.breakdown and len(res.step_s_all) == 3  # the tracked times
    assert any(
        "the untracked steps failed (RuntimeError: the data loader ran dry)" in w
        for w in res.warnings
    )
    assert not any("untracked" in w for w in again.warnings)


def test_model_optimizer_and_rng_are_restored_bit_for_bit(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    before = _state(model, opt)
    trial = Trial(model, x, _loss, optimizer=opt, warmup=1, steps=2)
    results = trial.compare([Config(), Config()])  # the duplicate baseline runs once
    assert [r.status for r in results] == ["ok"]
    trial.run(Config())
    _assert_same(before, _state(model, opt))


def test_trials_start_from_the_same_state(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    losses: list[list[float]] = []

    def loss_fn(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        loss = _loss(m, b)
        losses[-1].append(loss.item())
        return loss

    trial = Trial(model, x, loss_fn, optimizer=opt, warmup=1, steps=3)
    runs = []
    for _ in range(2):
        losses.append([])
        runs.append(trial.run(Config()))
    # warm-up, measured and timed steps; dropout draws the same numbers
    assert losses[0] == losses[1] and len(losses[0]) == 1 + 3 + 3
    assert losses[0][0] != losses[0][1]  # the steps do train
    assert runs[0].peak_allocated_bytes == runs[1].peak_allocated_bytes
    assert runs[0].breakdown == runs[1].breakdown


def _raising(after: int, error: Callable[[], BaseException]) -> Callable[..., torch.Tensor]:
    calls = []

    def loss_fn(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > after:
            m.eval()  # state a failing step leaves behind
            raise error()
        return _loss(m, b)

    return loss_fn


def test_an_error_in_loss_fn_becomes_a_result_and_the_model_is_restored(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    before = _state(model, opt)
    loss_fn = _raising(3, lambda: ValueError("bad batch"))
    res = Trial(model, x, loss_fn, optimizer=opt, warmup=2, steps=3).run(Config())
    assert res.status == "error" and res.step_s is None
    assert res.error == "ValueError: bad batch (measured step 2 of 3)"
    assert res.report is not None and res.report.status == "error"
    assert res.peak_allocated_bytes is not None
    _assert_same(before, _state(model, opt))


def test_out_of_memory_becomes_a_result_and_the_next_trial_runs(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    before = _state(model, opt)
    loss_fn = _raising(1, lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    oom = Trial(model, x, loss_fn, optimizer=opt, warmup=2, steps=3).run(Config())
    assert oom.status == "oom" and oom.error is not None and "warm-up step 2 of 2" in oom.error
    assert oom.peak_allocated_bytes is not None and oom.report is not None
    _assert_same(before, _state(model, opt))
    ok = Trial(model, x, _loss, optimizer=opt, warmup=2, steps=3).run(Config())
    assert ok.status == "ok"


def test_step_time_runs_untracked_steps_and_restores_bit_for_bit(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    before = _state(model, opt)
    calls = []

    def loss_fn(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        calls.append(torch.cuda.is_available())
        return _loss(m, b)

    trial = Trial(model, x, loss_fn, optimizer=opt, warmup=3, steps=5)
    timing = trial.step_time(Config(accumulate=2), steps=3)
    assert timing.error is None and timing.step_s is not None and timing.step_s > 0
    assert len(timing.times) == 3 and timing.step_s == sorted(timing.times)[1]  # the median
    assert len(calls) == 2 * (1 + 3)  # one warm-up step and three timed ones, two micro-batches
    _assert_same(before, _state(model, opt))
    failing = Trial(model, x, _raising(2, lambda: ValueError("bad batch")), optimizer=opt)
    assert failing.step_time(Config())[:2] == (None, "ValueError: bad batch")
    _assert_same(before, _state(model, opt))
    with pytest.raises(ValueError, match="at least 1"):
        trial.step_time(Config(), steps=0)
    with pytest.raises(TypeError, match="one-process Config"):
        trial.step_time(Config(parallel="ddp", world_size=2))


def test_compare_puts_the_baseline_first_and_sgd_saves_the_adam_state(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    before = _state(model, opt)
    base, sgd = Trial(model, x, _loss, optimizer=opt, warmup=2, steps=3).compare(
        [Config(optimizer="sgd")]
    )
    assert (base.label, sgd.label) == ("baseline", "sgd")
    assert base.status == sgd.status == "ok", (base.error, sgd.error)
    assert base.breakdown is not None and sgd.breakdown is not None
    assert sgd.peak_allocated_bytes is not None and base.peak_allocated_bytes is not None
    assert sgd.peak_allocated_bytes < base.peak_allocated_bytes
    n = sum(p.numel() for p in model.parameters())
    assert base.breakdown["optimizer_state"] >= 8 * n
    assert sgd.breakdown.get("optimizer_state", 0) < base.breakdown["optimizer_state"]
    _assert_same(before, _state(model, opt))


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True) for _ in range(3)
        )
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_every_technique_runs_and_the_transformer_comes_back_bit_for_bit() -> None:
    model = TinyTransformer()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64, 32)
    _loss(model, x).backward()
    opt.step()
    before = _state(model, opt)
    configs = [
        Config(checkpoint="blocks"),
        Config(precision="bf16-autocast"),
        Config(precision="bf16"),
        Config(optimizer="sgd"),
        Config(checkpoint="blocks", precision="bf16", optimizer="sgd"),
    ]
    results = Trial(model, x, _loss, optimizer=opt, warmup=1, steps=2).compare(configs)
    assert [r.label for r in results] == ["baseline", *(str(c) for c in configs)]
    assert all(r.status == "ok" for r in results), [(r.label, r.error) for r in results]
    by = {r.label: r for r in results}
    base, ckpt = by["baseline"], by["ckpt blocks"]
    assert base.breakdown is not None and ckpt.breakdown is not None
    assert ckpt.breakdown["activations"] < base.breakdown["activations"]
    assert min(results, key=lambda r: r.peak_allocated_bytes or 0).label == str(configs[-1])
    _assert_same(before, _state(model, opt))


def test_a_configuration_that_cannot_apply_is_an_error_result(
    trained: tuple[nn.Module, torch.optim.Optimizer, torch.Tensor],
) -> None:
    model, opt, x = trained
    before = _state(model, opt)
    res = Trial(model, x, _loss, optimizer=opt).run(Config(checkpoint="nothing_by_this_name"))
    assert res.status == "error" and res.report is None and res.peak_allocated_bytes is None
    assert res.error is not None and res.error.startswith("ValueError: checkpoint=")
    assert res.error.endswith("(applying the configuration)")
    _assert_same(before, _state(model, opt))


def _result(label: str, peak: int | None, step: float | None, status: str = "ok") -> TrialResult:
    return TrialResult(Config(), label, status, None, peak, None, None, step, (), ())


def test_to_row_has_plain_numbers_and_deltas() -> None:
    base = _result("baseline", 1000, 0.200)
    ckpt = _result("ckpt", 600, 0.250)
    assert ckpt.to_row(base, budget_bytes=800) == {
        "configuration": "ckpt",
        "status": "ok",
        "peak_bytes": 600,
        "step_ms": 250.0,
        "delta_peak_bytes": -400,
        "delta_peak_pct": -40.0,
        "delta_step_pct": pytest.approx(25.0),
        "step_within_noise": False,  # one step each: no spread to read it against
        "fits_budget": True,
    }
    assert base.to_row(base, budget_bytes=800)["fits_budget"] is False
    row = _result("huge", 500, None, status="oom").to_row(base, None)
    assert row["fits_budget"] is None and row["step_ms"] is None and row["delta_step_pct"] is None


def test_bad_arguments_say_what_is_allowed() -> None:
    model = _model()
    with pytest.raises(ValueError, match="steps must be a whole number of steps >= 1"):
        Trial(model, None, _loss, steps=0)
    with pytest.raises(ValueError, match="warmup must be a whole number of steps >= 0"):
        Trial(model, None, _loss, warmup=-1)
    with pytest.raises(TypeError, match="loss_fn"):
        Trial(model, None, None)  # type: ignore[arg-type]  # the wrong type is the test
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        Trial(model, None, _loss, optimizer=object())
