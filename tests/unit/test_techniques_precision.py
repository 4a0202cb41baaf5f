"""Precision: TF32 switches restored, autocast and loss scaling through the helpers, pure casts
reverted to their dtypes on the same Parameter objects, keeping what was trained."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import PRECISIONS, apply


def legacy_flags() -> tuple[bool, bool, str]:
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )


@pytest.fixture(autouse=True)
def _flags_untouched() -> Iterator[None]:
    before = legacy_flags()
    yield
    assert legacy_flags() == before


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


def grad_of(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def as_trained(before: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """What revert gives back: ``trained`` in ``before``'s dtype where training changed it,
    ``before`` bit for bit where it did not."""
    changed = trained != before.to(trained.dtype)
    return torch.where(changed, trained.to(before.dtype), before)


def hooks_of(model: nn.Module) -> list[dict[int, object]]:
    return [
        dict(getattr(m, a))
        for m in model.modules()
        for a in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks")
    ]


def test_pure_bf16_reverts_to_the_dtypes_keeping_what_was_trained() -> None:
    model = make_model().train()
    x = torch.randn(4, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(x).sum().backward()
    opt.step()  # the optimizer has fp32 state, the parameters fp32 grads
    params = list(model.parameters())
    before = state_of(model)
    moments = [opt.state[p]["exp_avg"] for p in params]
    hooks = hooks_of(model)

    applied = apply(model, precision="bf16", optimizer_obj=opt)
    assert applied.optimizer is opt
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert {grad_of(p).dtype for p in params} == {torch.bfloat16}  # cast, not dropped
    assert model[1].running_mean.dtype == torch.bfloat16
    assert model[1].num_batches_tracked.dtype == torch.int64  # integer buffers are left alone
    assert all(opt.state[p]["exp_avg"] is m for p, m in zip(params, moments, strict=True))
    assert {m.dtype for m in moments} == {torch.bfloat16}
    for _ in range(2):  # fp32 input cast by the root pre-hook; the step works on bf16 state
        with applied.autocast():
            out = model(x)
        assert out.dtype == torch.bfloat16
        applied.backward(out.float().sum())
        applied.step()
    model(x).float().sum().backward()  # a gradient still held at revert
    trained = state_of(model)
    trained_grads = [grad_of(p).clone() for p in params]
    trained_moments = [m.clone() for m in moments]

    applied.revert()
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert after[k].dtype == v.dtype, k
        assert torch.equal(after[k], as_trained(v, trained[k])), k
        assert torch.equal(after[k].to(trained[k].dtype), trained[k]), k  # to bf16 precision
    assert not torch.equal(after["0.weight"], before["0.weight"])  # not the copy from before
    assert after["1.num_batches_tracked"] == before["1.num_batches_tracked"] + 3
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    for p, g in zip(params, trained_grads, strict=True):
        assert grad_of(p).dtype == torch.float32 and torch.equal(grad_of(p), g.float())
    for p, m, trained_m in zip(params, moments, trained_moments, strict=True):
        assert opt.state[p]["exp_avg"] is m and m.dtype == torch.float32
        assert torch.equal(m.bfloat16(), trained_m)
        assert opt.state[p]["step"].item() == 3
    assert hooks_of(model) == hooks
    opt.step()  # fp32 training goes on from there


def test_pure_bf16_applied_and_reverted_without_training_changes_nothing() -> None:
    model = make_model()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    before = state_of(model)
    moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    apply(model, precision="bf16", optimizer_obj=opt).revert()
    after = model.state_dict()
    for k, v in before.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], v), k
    for p, m in zip(model.parameters(), moments, strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], m)


def test_pure_bf16_revert_keeps_tied_weights_and_state_made_meanwhile() -> None:
    torch.manual_seed(0)
    embed, head = nn.Embedding(10, 8), nn.Linear(8, 10, bias=False)
    head.weight = embed.weight
    model = nn.Sequential(embed, head)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)  # no state until its first step
    tokens = torch.tensor([[1, 2, 3]])
    before = embed.weight.detach().clone()

    applied = apply(model, precision="bf16", optimizer_obj=opt)
    model(tokens).float().sum().backward()
    applied.step()
    trained = embed.weight.detach().clone()
    applied.revert()

    assert head.weight is embed.weight and embed.weight.dtype == torch.float32
    assert torch.equal(embed.weight, as_trained(before, trained))
    assert not torch.equal(embed.weight, before)
    state = opt.state[embed.weight]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    model(tokens).sum().backward()
    opt.step()  # fp32 parameters and fp32 state step together


def test_fp32_casts_a_bf16_model_back_and_turns_tf32_off() -> None:
    model = make_model().to(torch.bfloat16)
    state = state_of(model)
    applied = apply(model, precision="fp32")
    assert legacy_flags()[:2] == (False, False)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model(torch.randn(3, 8, dtype=torch.bfloat16)).dtype == torch.float32
    now = state_of(model)  # the forward moved BatchNorm's running statistics
    applied.revert()
    after = model.state_dict()
    for k, v in state.items():
        assert after[k].dtype == v.dtype and torch.equal(after[k], now[k].to(v.dtype)), k


def test_fp32_on_an_fp32_model_adds_no_hook() -> None:
    model = make_model()
    hooks = hooks_of(model)
    applied = apply(model, precision="fp32")
    assert hooks_of(model) == hooks
    applied.revert()


def test_tf32_switches_on_and_back() -> None:
    model = make_model()
    applied = apply(model, precision="tf32")
    assert legacy_flags()[:2] == (True, True)
    applied.revert()
    applied.revert()


def test_tf32_with_the_new_fp32_precision_api() -> None:
    """A process that uses backend.fp32_precision keeps using it (mixing the two raises)."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("torch without backend.fp32_precision")
    code = textwrap.dedent(
        """
        import torch
        from torch import nn
        from jupyter_gpumem.techniques import apply
        b = torch.backends
        b.cuda.matmul.fp32_precision = "ieee"
        b.cudnn.conv.fp32_precision = "ieee"
        before = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)
        applied = apply(nn.Linear(2, 2), precision="tf32")
        assert (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision) == ("tf32", "tf32")
        applied.revert()
        after = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision)
        assert after == before, (after, before)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_bf16_autocast_is_a_forward_context() -> None:
    model = make_model()
    applied = apply(model, precision="bf16-autocast")
    with applied.autocast():
        out = model(torch.randn(4, 8))
    assert out.dtype == torch.bfloat16
    assert model(torch.randn(4, 8)).dtype == torch.float32  # only inside the context
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    applied.revert()


def test_fp16_autocast_works_on_cpu_with_loss_scaling() -> None:
    """Decision: fp16-autocast is supported on the CPU (CPU fp16 autocast + CPU GradScaler)."""
    model = make_model()
    x = torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    applied = apply(model, precision="fp16-autocast", optimizer_obj=opt)
    with applied.autocast():
        out = model(x)
    assert out.dtype == torch.float16
    applied.backward(out.float().mean() * 1e-3)  # small enough not to overflow once scaled
    scaled = grad_of(model.get_parameter("0.weight")).clone()
    model.zero_grad()
    with applied.autocast():
        (model(x).float().mean() * 1e-3).backward()
    # the scaler's initial scale (fp16 rounding differs between the two)
    assert torch.allclose(
        scaled, grad_of(model.get_parameter("0.weight")) * 65536.0, rtol=1e-2, atol=2e-2
    )
    model.zero_grad()

    # A step goes through the scaler: with an inf loss the optimizer step is skipped.
    before = model.get_parameter("0.weight").detach().clone()
    with applied.autocast():
        loss = model(x).float().sum() * float("inf")
    applied.backward(loss)
    applied.step()
    assert torch.equal(model.get_parameter("0.weight"), before)
    assert all(p.grad is None for p in model.parameters())
    with applied.autocast():
        loss = model(x).float().mean() * 1e-3
    applied.backward(loss)
    applied.step()
    assert not torch.equal(model.get_parameter("0.weight"), before)
    applied.revert()


def test_fp16_autocast_warns_for_fp16_parameters() -> None:
    model = make_model().half()
    with pytest.warns(UserWarning, match="GradScaler cannot unscale fp16"):
        apply(model, precision="fp16-autocast").revert()


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16"])
def test_non_autocast_precisions_use_a_null_context(name: str) -> None:
    model = make_model()
    applied = apply(model, precision=name)
    with applied.autocast():
        assert not torch.is_autocast_enabled("cpu")
    applied.revert()


def test_unknown_precision_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError) as err:
        apply(make_model(), precision="fp8")
    assert all(name in str(err.value) for name in PRECISIONS)


def test_precision_name_reads_the_parameters_dtype() -> None:
    from jupyter_gpumem.techniques.precision import precision_name

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))  # 40 and 36 parameters
    assert precision_name(model) == "fp32"
    model[0].to(torch.bfloat16)
    model[1].to(torch.bfloat16)
    assert precision_name(model) == "bf16"
    model[1].to(torch.float16)
    assert precision_name(model) == "mixed (bf16, fp16)"  # most parameters first
    assert precision_name(nn.ReLU()) is None
