"""Estimates on the CPU: the dispatch source's peak, predicted on fake tensors (issue 14).

On the CPU there is no caching allocator: a trial's peak is the exact storage bytes the
dispatch source counts, so the estimate must equal it. The user's model, optimizer and random
state must come back bit for bit, whatever the estimate ran or failed on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.estimate import Estimate, EstimateUnavailable
from jupyter_gpumem.tuner.trial import Trial

TOLERANCE_PCT = 2.0


class TinyGPT(nn.Module):
    """A small causal transformer: tied embedding, dropout, blocks in an nn.ModuleList."""

    def __init__(self, vocab: int = 256, width: int = 32, layers: int = 2, context: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, 4, 4 * width, dropout=0.1, batch_first=True, norm_first=True
            )
            for _ in range(layers)
        )
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.ln(x))


def _gpt_loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = m(ids[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def _mlp_loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x).logsumexp(-1).mean()


def _gpt_batch(n: int) -> torch.Tensor:
    return torch.randint(0, 256, (n, 33))


def _mlp_batch(n: int) -> torch.Tensor:
    return torch.randn(n, 64)


def _gpt() -> Trial:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(model, _gpt_batch(8), _gpt_loss, optimizer=opt, warmup=1, steps=2)


def _mlp() -> Trial:
    """Dropout draws random numbers; BatchNorm has running statistics and a step counter."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.BatchNorm1d(256), nn.GELU(), nn.Dropout(0.1), nn.Linear(256, 10)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return Trial(model, torch.randn(128, 64), _mlp_loss, optimizer=opt, warmup=2, steps=3)


def _trained(trial: Trial) -> Trial:
    """The state a user leaves after training: gradients, optimizer state, moved RNGs."""
    loss = trial.loss_fn(trial.model, trial.batch)
    loss.backward()
    trial.optimizer.step()
    trial.loss_fn(trial.model, trial.batch).backward()
    np.random.seed(1)
    random.seed(2)
    return trial


def _state(trial: Trial) -> dict[str, Any]:
    """Everything an estimate could touch, copied."""
    model, opt = trial.model, trial.optimizer
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "param_ids": [id(p) for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
        "buffer_ids": [id(b) for b in model.buffers()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "attrs": [sorted(vars(m)) for m in model.modules()],
        "training": [m.training for m in model.modules()],
        "state_keys": [id(p) for p in opt.state],
        "state": [{k: v.clone() for k, v in s.items()} for s in opt.state.values()],
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "group_params": [[id(p) for p in g["params"]] for g in opt.param_groups],
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("params", "buffers", "grads"):
        assert len(a[key]) == len(b[key]), key
        for x, y in zip(a[key], b[key], strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y), key
    for key in ("param_ids", "buffer_ids", "attrs", "training", "state_keys", "groups"):
        assert a[key] == b[key], key
    assert a["group_params"] == b["group_params"]
    for s, t in zip(a["state"], b["state"], strict=True):
        assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s)
    assert torch.equal(a["torch_rng"], b["torch_rng"])
    assert a["python_rng"] == b["python_rng"]
    np.testing.assert_equal(a["numpy_rng"], b["numpy_rng"])


CONFIGS = [
    Config(),
    Config(checkpoint="blocks"),
    Config(precision="bf16-autocast"),
    Config(precision="bf16"),
    Config(optimizer="sgd-momentum"),
    Config(accumulate=2),
    Config(checkpoint="blocks", accumulate=4),
    Config(lora=4),
    Config(lora=8, checkpoint="blocks", precision="bf16-autocast"),
]


@pytest.mark.parametrize(
    ("make", "config"),
    [(_gpt, c) for c in CONFIGS]
    + [(_mlp, c) for c in CONFIGS if c.checkpoint is None and c.lora is None]  # no blocks
    + [(_mlp, Config(checkpoint=("1", "3")))],
    ids=lambda v: v.__name__.strip("_") if callable(v) else str(v),
)
def test_estimate_equals_the_measured_cpu_peak(make: Callable[[], Trial], config: Config) -> None:
    trial = _trained(make())
    est = trial.estimate(config=config)
    result = trial.run(config)
    assert result.status == "ok", result.error
    assert est.peak_bytes is not None, est.reason
    assert abs(est.error_pct(result.peak_allocated_bytes) or 0) <= TOLERANCE_PCT, (
        est.peak_bytes,
        result.peak_allocated_bytes,
    )
    assert est.breakdown is not None and sum(est.breakdown.values()) == est.peak_bytes
    assert est.breakdown["parameters"] == result.breakdown["parameters"]
    assert est.device == "cpu"
    if config.checkpoint is None:  # the tagger marks a checkpoint's recompute as forward
        assert est.phase == result.report.main.peak_phase
    assert result.estimate is est


def test_the_user_objects_and_random_state_are_bit_identical_afterwards() -> None:
    for trial, make_batch in ((_trained(_gpt()), _gpt_batch), (_trained(_mlp()), _mlp_batch)):
        before = _state(trial)
        for config in [*CONFIGS, Config(precision="fp16-autocast")]:
            if (config.checkpoint is None and config.lora is None) or isinstance(
                trial.model, TinyGPT
            ):
                trial.estimate(config=config)
        trial.estimate(batch=trial.batch[:4])
        trial.max_batch_size(10**9, make_batch, low=2, high=8)  # BatchNorm needs 2
        _assert_same(before, _state(trial))
        assert not any("forward" in vars(m) for m in trial.model.modules())


def test_max_batch_size_is_the_largest_whose_measured_peak_fits() -> None:
    trial = _gpt()
    base = trial.run(Config()).peak_allocated_bytes
    assert base is not None
    budget = int(base * 1.7)  # batch 8 measured above: about 13 fits
    size = trial.max_batch_size(budget, _gpt_batch)
    search = trial.last_search
    assert search is not None and search.batch_size == size and search.budget_bytes == budget
    assert search.estimate is not None and search.estimate.batch_size == size
    assert search.above is not None and search.above.peak_bytes > budget
    assert len(search.tried) <= 8
    measured = {}
    for n in (size, size + 1):
        run = Trial(trial.model, _gpt_batch(n), _gpt_loss, optimizer=trial.optimizer)
        measured[n] = run.run(Config()).peak_allocated_bytes
    assert measured[size] <= budget < measured[size + 1], (size, measured, budget)


def test_each_phase_has_its_own_peak_and_the_highest_is_the_estimate() -> None:
    trial = _gpt()
    small, large = (trial.estimate(batch=_gpt_batch(n)) for n in (2, 16))
    for est in (small, large):
        phases = est.phase_peaks
        assert phases is not None and {"forward", "backward", "optimizer"} <= set(phases)
        assert max(phases.values()) == est.peak_bytes == phases[est.phase]
        assert all(0 < peak <= est.peak_bytes for peak in phases.values())
    assert small.phase_peaks is not None and large.phase_peaks is not None
    grew = {p: large.phase_peaks[p] - small.phase_peaks[p] for p in small.phase_peaks}
    assert grew["backward"] > grew["optimizer"] >= 0  # the state does not grow with the batch
    parallel = trial.estimate(parallel="ddp", world_size=2)
    assert parallel.phase_peaks is not None
    assert max(parallel.phase_peaks.values()) == parallel.peak_bytes
    for phase, peak in parallel.phase_peaks.items():
        assert peak == max((r.phase_peaks or {}).get(phase, 0) for r in parallel.ranks)


def test_max_batch_size_tells_progress_of_each_estimate_as_it_begins() -> None:
    trial = _gpt()
    lines: list[str] = []
    trial.max_batch_size("1GiB", _gpt_batch, progress=lines.append)
    search = trial.last_search
    assert search is not None and len(lines) == len(search.tried) >= 2
    assert lines == [f"estimating batch size {n:,}" for n, _ in search.tried]
    with pytest.raises(TypeError, match="progress must be"):
        trial.max_batch_size("1GiB", _gpt_batch, progress="yes")


def test_max_batch_size_bounds() -> None:
    trial = _gpt()
    assert trial.max_batch_size("1TiB", _gpt_batch, low=2, high=5) == 5
    with pytest.warns(UserWarning, match="even batch size 3"):
        assert trial.max_batch_size(1000, _gpt_batch, low=3) == 0  # none fits, 2 never tried
    for bad in (0, -5, "lots", True):
        with pytest.raises(ValueError, match="budget"):
            trial.max_batch_size(bad, _gpt_batch)
    with pytest.raises(ValueError, match="high"):
        trial.max_batch_size("1GiB", _gpt_batch, low=4, high=2)


def test_a_measured_run_carries_the_estimate_of_its_configuration_and_batch() -> None:
    trial = _mlp()
    est = trial.estimate(precision="bf16")
    ckpt = trial.estimate(checkpoint=("1",))
    result, other = trial.run(Config(precision="bf16")), trial.run(Config())
    assert result.estimate is est and other.estimate is None
    assert result.vs_estimate is not None
    assert result.vs_estimate.startswith("estimated ") and "(error +0.0%)" in result.vs_estimate
    assert other.vs_estimate is None
    trial.estimate(batch=torch.randn(64, 64), checkpoint=("1",))  # another batch: not kept
    assert trial.run(Config(checkpoint=("1",))).estimate is ckpt
    trial.batch = torch.randn(64, 64)
    assert trial.run(Config(precision="bf16")).estimate is None


@torch.library.custom_op("gpumem_test::doubled", mutates_args=())
def _doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@pytest.mark.parametrize(
    ("loss_fn", "why"),
    [
        (lambda m, b: m(b).sum() * m(b).sum().item(), "reads tensor values"),
        (lambda m, b: m(b)[m(b) > 0].sum(), "output shape depends on tensor values"),
        (lambda m, b: _doubled(m(b)).sum(), "custom operator has no fake implementation"),
    ],
    ids=["item", "nonzero", "custom-op"],
)
def test_what_cannot_be_faked_says_why(loss_fn: Callable[..., Any], why: str) -> None:
    trial = _trained(_mlp())
    trial.loss_fn = loss_fn
    before = _state(trial)
    est = trial.estimate()
    assert est.peak_bytes is None and est.breakdown is None and why in (est.reason or "")
    assert "not available" in est.text() and why in est._repr_html_()
    with pytest.raises(EstimateUnavailable, match="cannot be estimated"):
        trial.max_batch_size("1GiB", _mlp_batch)
    _assert_same(before, _state(trial))
    assert trial.run(Config()).estimate is None  # a failed estimate is never shown as one


def test_fp16_loss_scaling_and_compiled_modules_are_refused() -> None:
    trial = _mlp()
    est = trial.estimate(precision="fp16-autocast")
    assert est.peak_bytes is None and "loss scaling" in (est.reason or "")
    compiled = Trial(torch.compile(trial.model), trial.batch, _mlp_loss, optimizer=trial.optimizer)
    est = compiled.estimate()
    assert est.peak_bytes is None and "torch.compile" in (est.reason or "")


def test_settings_are_checked() -> None:
    trial = _mlp()
    with pytest.raises(TypeError, match="unknown setting"):
        trial.estimate(precisoin="bf16")
    with pytest.raises(TypeError, match="not both"):
        trial.estimate(config=Config(), precision="bf16")
    with pytest.raises(ValueError, match="unknown precision"):
        trial.estimate(precision="fp8")


def test_the_estimate_displays_and_serialises() -> None:
    est = _mlp().estimate(optimizer="sgd")
    assert isinstance(est, Estimate) and est.label == "sgd"
    text = est.text()
    assert text.splitlines()[0] == "gpumem estimate: sgd on cpu"
    assert "peak allocated" in text and "at the peak (backward):" in text
    bundle = est._repr_mimebundle_()
    assert bundle["text/plain"] == text and "<table>" in bundle["text/html"]
    data = json.loads(json.dumps(est.to_dict()))
    assert data["peak_bytes"] == est.peak_bytes and data["breakdown"] == est.breakdown
    assert data["label"] == "sgd" and "config" not in data
    assert (
        data["phase_peaks"] == est.phase_peaks and max(est.phase_peaks.values()) == est.peak_bytes
    )
    assert est.fits(est.peak_bytes) is True and est.fits(est.peak_bytes - 1) is False
    assert est.against(est.peak_bytes).endswith("(error +0.0%)")


class _Caching(nn.Module):
    """Keeps its last output on itself, as some models keep caches."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        self.last = out.detach()
        self.fc.seen = True  # a new attribute on a child
        return out


def test_attributes_the_forward_writes_are_put_back() -> None:
    model = _Caching()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    est = Trial(model, torch.randn(4, 8), lambda m, b: m(b).sum(), optimizer=opt).estimate()
    assert est.peak_bytes is not None
    assert model.last is None and not hasattr(model.fc, "seen")


def test_blocks_of_single_layers_say_that_nothing_is_freed() -> None:
    """An MLP in an nn.Sequential has no repeated blocks, only repeated Linears: "blocks"
    checkpoints those, which frees nothing, and the estimate, the run and its row say so."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    trial = Trial(mlp, torch.randn(32, 16), _mlp_loss, optimizer=opt, warmup=1, steps=1)
    said = "checkpoint='blocks' found no repeated blocks in this model, only repeated single layers"
    base, est = trial.estimate(), trial.estimate(checkpoint="blocks")
    assert est.peak_bytes == base.peak_bytes  # nothing freed, as the note says
    (note,) = est.notes
    assert note.startswith(f"{said} ('0', '2': Linear)") and "next to nothing is freed" in note
    assert f"note: {said}" in est.text() and base.notes == ()
    with pytest.warns(UserWarning, match="found no repeated blocks"):
        run = trial.run(Config(checkpoint="blocks"))
    assert run.status == "ok" and note in run.warnings
    assert run.to_row()["configuration"] == "ckpt blocks"
    by_name = trial.estimate(checkpoint=("0",))  # named by hand: no word of "blocks"
    assert by_name.notes[0].startswith("every checkpointed module is a single layer ('0': Linear)")

    class TwoLayers(nn.Module):  # nothing repeats at all: an error that says what to do
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x).relu())

    flat = TwoLayers()
    none = Trial(flat, torch.randn(4, 16), _mlp_loss, warmup=1, steps=1).estimate(
        checkpoint="blocks"
    )
    assert none.peak_bytes is None and none.reason is not None
    assert "'blocks' found no repeated blocks in TwoLayers" in none.reason
    assert "Name the modules to checkpoint instead" in none.reason


def test_many_micro_batches_are_estimated_from_two_to_the_byte() -> None:
    """From the second micro-batch on each holds what the one before held, so the fake step
    runs two of them: the loss is computed twice a step whatever ``accumulate`` is, and the
    estimate still equals the measured peak."""
    trial = _gpt()
    calls: list[int] = []

    def counted(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        calls.append(ids.shape[0])
        return _gpt_loss(m, ids)

    trial.loss_fn = counted
    est = trial.estimate(accumulate=8)
    steps = trial.warmup + trial.steps
    assert set(calls) == {1} and 2 <= len(calls) <= 2 * steps  # two micro-batches of 1 row a step
    calls.clear()
    result = trial.run(Config(accumulate=8))
    assert len(calls) == 8 * (steps + trial.steps)  # so do the measured and the timed steps
    assert est.peak_bytes == result.peak_allocated_bytes
    assert est.breakdown == result.breakdown
