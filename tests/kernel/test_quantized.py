"""bitsandbytes on fake tensors: 4-bit weights laid out as quantizing lays them out, the 4-bit
matmul's own buffers, 8-bit optimizers' copies, and clear reasons where the CPU cannot tell.

The fake runs with 4-bit weights themselves need CUDA (bitsandbytes' matmul is modelled there);
they are checked against measured runs in ``tests/gpu/test_quantized_gpu.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from jupyter_gpumem.tuner.estimation.fake_objects import Faker, fake_optimizer
from jupyter_gpumem.tuner.estimation.quantized import hidden_buffers
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.tuner.planning.plan import SAME_ALGORITHM

bnb = pytest.importorskip("bitsandbytes")
GEMM = torch.ops.bitsandbytes.gemm_4bit.default


def _layout(t: Any) -> list[Any]:
    """Every tensor a 4-bit weight stores: shape, dtype and storage bytes."""

    def one(x: Any) -> Any:
        return None if x is None else (tuple(x.shape), x.dtype, x.untyped_storage().nbytes())

    state = t.quant_state
    parts = [one(t), one(state.absmax), one(state.code), one(state.offset)]
    if state.state2 is not None:
        parts += [one(state.state2.absmax), one(state.state2.code), state.state2.blocksize]
    return [*parts, tuple(state.shape), state.dtype, state.blocksize, state.quant_type]


def _mlp_trial(out: int) -> Any:
    """Two linear layers, 512 wide then ``out``, trained with AdamW on the CPU."""
    from jupyter_gpumem.tuner.trial import Trial

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, out)
    )
    opt = torch.optim.AdamW(model.parameters())
    return Trial(model, torch.randn(8, 512), lambda m, b: m(b).sum(), optimizer=opt, device="cpu")


def _faker() -> tuple[Faker, FakeTensorMode]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    log = StorageLog(torch, torch.device("cpu"), mode)
    return Faker(torch, log, meta_to=torch.device("cpu")), mode


@pytest.mark.parametrize("nested", [True, False])
@pytest.mark.parametrize("storage", [torch.uint8, torch.bfloat16])
def test_a_meta_4bit_weight_is_faked_as_quantizing_stores_it(
    nested: bool, storage: torch.dtype
) -> None:
    def linear() -> Any:
        return bnb.nn.Linear4bit(
            300, 200, bias=False, compute_dtype=torch.bfloat16, compress_statistics=nested,
            quant_type="nf4", quant_storage=storage,
        )  # fmt: skip

    with torch.device("meta"):
        meta = linear()
    real = linear().to("cpu")  # quantized by bitsandbytes
    assert meta.weight.is_meta and not meta.weight.bnb_quantized and real.weight.bnb_quantized
    faker, mode = _faker()
    with mode:
        from_meta = faker.fake(meta.weight, "parameters")
        from_real = faker.fake(real.weight, "parameters")
        assert faker.fake(meta.weight, "parameters") is from_meta  # one fake per weight
    assert _layout(from_meta) == _layout(from_real)
    assert (from_meta.quant_state.state2 is not None) == nested
    assert meta.weight.is_meta and meta.weight.quant_state is None  # the model untouched


def _gemm_args(rows: int, nested: bool = True) -> tuple[tuple[Any, ...], dict[str, Any]]:
    n, k = 1024, 512
    a = torch.empty(rows, k, dtype=torch.bfloat16, device="cuda")
    packed = torch.empty(n * k // 2, 1, dtype=torch.uint8, device="cuda")
    blocks = n * k // 64
    if not nested:
        return (a, packed, [n, k], torch.empty(blocks, device="cuda"), 64, "nf4"), {}
    absmax = torch.empty(-(blocks // -256), device="cuda")
    return (a, packed, [n, k], absmax, 64, "nf4"), {
        "absmax_8bit": torch.empty(blocks, dtype=torch.uint8, device="cuda")
    }


def test_the_4bit_matmul_dequantizes_past_1536_rows() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):  # fake CUDA tensors, no autograd
        args, kwargs = _gemm_args(2048)
        made = hidden_buffers(torch, GEMM, args, kwargs)
        plain = hidden_buffers(torch, GEMM, *_gemm_args(2048, nested=False))
        few = hidden_buffers(torch, GEMM, *_gemm_args(3))
        other = hidden_buffers(torch, torch.ops.aten.mm.default, (args[0], args[0].T), {})
    # the nested absmax dequantized and offset (float32 per block), then the weight in A's dtype
    assert [(tuple(t.shape), t.dtype) for t in made] == [
        ((1024 * 512 // 64,), torch.float32),
        ((1024 * 512 // 64,), torch.float32),
        ((1024, 512), torch.bfloat16),
    ]
    assert [(tuple(t.shape), t.dtype) for t in plain] == [((1024, 512), torch.bfloat16)]
    assert few == [] and other == []  # its own kernel up to 4 rows; other ops take nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks the GPU present when there is one")
def test_between_5_and_1536_rows_without_a_gpu_the_reason_not_a_guess() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(Unfakeable, match="by the GPU it runs on"):
            hidden_buffers(torch, GEMM, *_gemm_args(512))


def test_a_meta_qlora_estimate_on_the_cpu_says_where_it_is_modelled() -> None:
    from jupyter_gpumem.tuner.trial import Trial

    with torch.device("meta"):
        model = torch.nn.Sequential(
            bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4"),
            torch.nn.Linear(64, 4),
        )
    x = torch.zeros(8, 64, device="meta", requires_grad=True)
    opt = torch.optim.AdamW(model[1].parameters())
    est = Trial(model, x, lambda m, b: m(b).sum(), optimizer=opt, device="cpu").estimate()
    assert est.peak_bytes is None
    assert "modelled on CUDA" in est.reason and "device='cuda'" in est.reason
    assert all(p.is_meta for p in model.parameters())


def test_an_8bit_optimizer_copy_keeps_the_users_maps_and_a_paged_one_steps_unpaged() -> None:
    model = torch.nn.Linear(256, 256)
    opt = bnb.optim.AdamW8bit(model.parameters())
    maps = dict(opt.name2qmap)
    faker, mode = _faker()
    with mode:
        copy = fake_optimizer(torch, opt, faker)
    assert copy.name2qmap is not opt.name2qmap  # what the fake step moves goes in its own dict
    assert opt.name2qmap.keys() == maps.keys()
    assert all(opt.name2qmap[k] is v for k, v in maps.items())
    assert set(copy.name2qmap) == {"dynamic", "udynamic"} and copy.optimizer_name == "adam"
    assert not any(isinstance(t, FakeTensor) for t in copy.name2qmap.values())  # made from values
    paged = bnb.optim.PagedAdamW8bit(model.parameters())
    with mode:
        copy = fake_optimizer(torch, paged, faker)
    # the copy pages nothing (no unified memory for fakes); the user's still pages
    assert copy.is_paged is False and paged.is_paged is True
    assert "get_state_buffer" not in vars(paged)


def test_a_paged_optimizers_paged_state_is_left_out_of_the_estimate(monkeypatch: Any) -> None:
    """bitsandbytes pages the state of large tensors on a GPU (none on the CPU, where the
    estimate is the unpaged twin's: see the test below): with that rule made to hold on the
    CPU, the estimate is its twin's less exactly those buffers, taken from the optimizer state,
    and its notes say how many bytes page."""
    from jupyter_gpumem.tuner.estimation import quantized

    trial = _mlp_trial(64)
    twin = trial.estimate(optimizer="adamw-8bit")
    assert not quantized.pages(torch.empty(512, 512))  # bitsandbytes pages nothing on the CPU
    monkeypatch.setattr(quantized, "pages", lambda p: p.numel() >= 512 * 512)
    paged = trial.estimate(optimizer="adamw-paged-8bit")
    state = 2 * 512 * 512  # two uint8 moments of the one tensor over the threshold
    assert paged.peak_bytes == twin.peak_bytes - state
    assert twin.breakdown and paged.breakdown
    assert paged.breakdown["optimizer_state"] == twin.breakdown["optimizer_state"] - state
    assert {k: v for k, v in paged.breakdown.items() if k != "optimizer_state"} == {
        k: v for k, v in twin.breakdown.items() if k != "optimizer_state"
    }
    assert any("unified memory" in n and "512 KiB" in n for n in paged.notes), paged.notes


def test_bitsandbytes_optimizers_are_named_as_the_tuner_names_them() -> None:
    from jupyter_gpumem.techniques.optimizers import optimizer_name

    params = list(torch.nn.Linear(64, 64).parameters())
    assert optimizer_name(bnb.optim.AdamW8bit(params)) == "adamw-8bit"
    assert optimizer_name(bnb.optim.PagedAdamW8bit(params)) == "adamw-paged-8bit"
    # the same update, but its state is outside the allocator: plans never pick it unasked
    assert "adamw-paged-8bit" not in SAME_ALGORITHM["adamw"]
    assert "adamw" in SAME_ALGORITHM["adamw-paged-8bit"]


def test_an_8bit_optimizer_a_configuration_builds_is_estimated_as_measured() -> None:
    """Config(optimizer="adamw-8bit") builds bitsandbytes' AdamW8bit inside the fake mode: its
    quantization maps come from real values, and the estimate equals the measured CPU peak."""
    from jupyter_gpumem.techniques import Config

    trial = _mlp_trial(512)
    est = trial.estimate(optimizer="adamw-8bit")
    result = trial.run(Config(optimizer="adamw-8bit"))
    assert result.status == "ok", result.error
    assert est.peak_bytes == result.peak_allocated_bytes, est.reason
    assert est.breakdown == result.breakdown
    paged = trial.estimate(optimizer="adamw-paged-8bit")  # nothing pages on the CPU
    assert paged.peak_bytes == est.peak_bytes and paged.breakdown == est.breakdown
