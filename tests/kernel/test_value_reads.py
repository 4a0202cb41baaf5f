"""Steps that read tensor values, estimated on fake tensors, which have none.

A mask the model makes with ``torch.ones`` holds ones whatever the data, and a LayerDrop draw
compared with probability zero is false whatever the draw: the estimate reads them as the real
step does, and equals its measured peak. A read of anything else (the batch's values, a draw
compared with 0.5, a mask written after it was made) stays a refusal that names the line of the
step that reads. A check's condition (``torch._check_tensor_all``, ``torch._assert``,
transformers' ``torch_compilable_check``) reads as passing, as it must for the real step to run,
and the estimate says which check; a branch on the same value stays refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.estimation.known_values import ONE, UNIT, ZERO, Span, compared
from jupyter_gpumem.tuner.trial import Trial

WIDTH = 16


class OnesMask(nn.Module):
    """Makes its own mask of ones and takes the padded path, which holds more, where it is not."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[:2], dtype=torch.long, device=x.device)
        if mask[:, None, :].bool().all():
            return self.a(x)
        return self.a(x) * mask[..., None] + self.b(x)


class LayerDrop(nn.Module):
    """Skips each layer with probability ``p``, as transformers' LayerDrop does in training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if torch.rand([]) < self.p:
                continue
            x = layer(x)
        return x


class Reads(nn.Module):
    """A linear layer, then ``read(output)`` as the step's branch."""

    def __init__(self, read: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.read = read
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return y * 2 if self.read(y) else y


class Checked(nn.Module):
    """A linear layer whose output ``check`` checks finite; ``branch`` then branches on it too."""

    def __init__(self, check: Callable[[torch.Tensor], None], branch: bool = False) -> None:
        super().__init__()
        self.check, self.branch = check, branch
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        finite = torch.isfinite(y).all()
        self.check(finite)
        if self.branch and bool(finite):
            return y * 2
        return y


def _torch_check(finite: torch.Tensor) -> None:
    torch._check_tensor_all(finite, lambda: "not finite")


def _torch_assert(finite: torch.Tensor) -> None:
    torch._assert(finite, "not finite")


def _transformers_check(finite: torch.Tensor) -> None:
    from transformers.utils import torch_compilable_check

    torch_compilable_check(finite, "not finite")


def _written_mask(y: torch.Tensor) -> bool:
    mask = torch.ones(y.shape[:2], dtype=torch.bool)
    mask[0, 0] = False
    return bool(mask.all())


def _trial(make: Callable[[], nn.Module], built_on: str) -> Trial:
    torch.manual_seed(0)
    with torch.device(built_on):
        model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return Trial(
        model, torch.randn(4, 8, WIDTH), lambda m, b: m(b).sum(), optimizer=opt, device="cpu"
    )


def _lm_loss(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return m(input_ids=ids, labels=ids).loss


def _line_of(text: str) -> str:
    """``file:line`` of the line of this file that holds ``text``."""
    lines = Path(__file__).read_text().splitlines()
    return f"{Path(__file__).name}:{next(i for i, s in enumerate(lines, 1) if text in s)}"


def test_a_refusal_names_the_line_that_reads() -> None:
    est = _trial(lambda: Reads(lambda y: y.sum().item() > 0), "cpu").estimate()
    assert est.peak_bytes is None
    reason = est.reason or ""
    assert "reads tensor values" in reason
    assert f"read at {_line_of('Reads(lambda y: y.sum().item() > 0)')} `" in reason, reason
    assert "y.sum().item() > 0" in reason


@pytest.mark.parametrize("make", [OnesMask, LayerDrop], ids=lambda m: m.__name__)
def test_known_reads_estimate_as_the_model_materialised(make: Callable[[], nn.Module]) -> None:
    meta = _trial(make, "meta").estimate()
    real = _trial(make, "cpu")
    assert meta.peak_bytes is not None, meta.reason
    assert meta.peak_bytes == real.estimate().peak_bytes
    assert meta.peak_bytes == real.run(Config()).peak_allocated_bytes


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda: Reads(lambda y: bool(y.sum() > 0)), "if self.read(y)"),
        (lambda: LayerDrop(0.5), "if torch.rand([]) < self.p:"),
        (lambda: Reads(_written_mask), "return bool(mask.all())"),
    ],
    ids=["batch-values", "layerdrop-half", "mask-written"],
)
def test_reads_of_unknown_values_stay_refused(make: Callable[[], nn.Module], line: str) -> None:
    est = _trial(make, "meta").estimate()
    assert est.peak_bytes is None
    assert "reads tensor values" in (est.reason or "")
    assert f"read at {Path(__file__).name}:" in (est.reason or "")
    assert line in (est.reason or ""), est.reason


@pytest.mark.parametrize(
    ("check", "line"),
    [
        (_torch_check, "torch._check_tensor_all(finite,"),
        (_torch_assert, "torch._assert(finite,"),
        (_transformers_check, "torch_compilable_check(finite,"),
    ],
    ids=["torch-check-tensor-all", "torch-assert", "transformers-check"],
)
def test_a_checks_condition_is_taken_to_pass_as_the_real_step_needs(
    check: Callable[[torch.Tensor], None], line: str
) -> None:
    if check is _transformers_check:
        pytest.importorskip("transformers")
    meta = _trial(lambda: Checked(check), "meta").estimate()
    real = _trial(lambda: Checked(check), "cpu")
    assert meta.peak_bytes is not None, meta.reason
    assert meta.peak_bytes == real.estimate().peak_bytes
    assert meta.peak_bytes == real.run(Config()).peak_allocated_bytes
    (note,) = [n for n in meta.notes if "taken to pass" in n]
    assert f"the check in {check.__name__} taken to pass" in note, note
    assert f"{_line_of(line)} `{line}" in note, note


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda: Checked(_torch_check, branch=True), "if self.branch and bool(finite):"),
        (
            lambda: Reads(lambda y: torch._check(y.abs().max().item() < 1e6)),
            "Reads(lambda y: torch._check(y.abs().max().item() < 1e6))",
        ),
    ],
    ids=["branch-on-the-checked-value", "number-read-for-a-check"],
)
def test_reads_that_steer_the_step_stay_refused_beside_checks(
    make: Callable[[], nn.Module], line: str
) -> None:
    """A branch on a checked value steers the step; ``.item()`` of a number is read before
    ``torch._check`` sees its outcome, in the step's own code."""
    est = _trial(make, "meta").estimate()
    assert est.peak_bytes is None
    assert f"read at {_line_of(line)} `" in (est.reason or ""), est.reason
    assert line in (est.reason or ""), est.reason


def test_a_bart_decoder_skips_the_causal_mask_of_its_own_ones_as_the_real_step() -> None:
    """BartDecoder makes an attention mask of ones where none is given; the real step then
    passes is_causal to SDPA instead of a mask, and so must the fake one."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BartConfig(
        vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=512,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    ids = torch.zeros(4, 256, dtype=torch.long)

    def trial(built_on: str) -> Trial:
        torch.manual_seed(0)
        with torch.device(built_on):
            model = transformers.BartForCausalLM(cfg)
        opt = torch.optim.SGD(model.parameters())
        return Trial(model, ids, _lm_loss, optimizer=opt, device="cpu")

    est = trial("meta").estimate()
    assert est.peak_bytes is not None, est.reason
    assert est.peak_bytes == trial("cpu").run(Config()).peak_allocated_bytes


@pytest.mark.parametrize(
    ("span", "op", "number", "answer"),
    [
        (UNIT, "lt", 0.0, ZERO),
        (UNIT, "ge", 0, ONE),
        (UNIT, "lt", 1, ONE),
        (UNIT, "lt", 0.5, None),
        (UNIT, "eq", 1, ZERO),
        (ONE, "eq", 1, ONE),
        (ONE, "ne", 0, ONE),
        (ZERO, "gt", 0, ZERO),
        (Span(0, 1), "le", 1, ONE),
        (Span(0, 1), "eq", 1, None),
    ],
)
def test_comparisons_known_for_every_element(
    span: Span, op: str, number: float, answer: Span | None
) -> None:
    assert compared(span, op, number) == answer
