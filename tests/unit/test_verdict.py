"""Will it fit: cards by name and the verdict of a peak on a card."""

from __future__ import annotations

import pytest

from jupyter_gpumem.tuner.estimation.cards import CARDS, card
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.nccl import MEASURED, nccl_share
from jupyter_gpumem.tuner.estimation.verdict import MARGIN, verdict

GiB = 2**30


@pytest.mark.parametrize(
    ("name", "expected"),
    [("H100-80GB", "H100-80GB"), ("h100", "H100-80GB"), ("a100 40gb", "A100-40GB"),
     ("RTX_4090", "RTX-4090"), ("Tesla T4", "T4"), ("NVIDIA H200", "H200")],
)  # fmt: skip
def test_cards_are_found_by_their_names(name: str, expected: str) -> None:
    assert card(name).name == expected


def test_an_unknown_card_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: H100-80GB, H200, A100-80GB"):
        card("B300")
    with pytest.raises(TypeError, match="such as 'H100-80GB'"):
        card(80)  # type: ignore[arg-type]


def test_every_card_names_its_source_and_capacity() -> None:
    assert len({c.name for c in CARDS}) == len(CARDS) >= 9
    for c in CARDS:
        assert c.source and 10 * GiB < c.total_bytes < 200 * GiB
    assert not card("T4").bf16 and card("L4").bf16
    assert card("H100").workspace_per_handle > card("A100-80GB").workspace_per_handle


def test_a_peak_fits_when_reserved_context_and_margin_stay_within_the_card() -> None:
    l4 = card("L4")
    context = GiB // 2
    room = l4.total_bytes - context
    just = int(room / (1 + MARGIN)) - 1024
    fits = verdict(l4, just, context, {"activations": just})
    assert fits.fits and fits.headroom_bytes >= 0
    assert fits.line().startswith("fits on L4: needs ")
    over = verdict(
        l4,
        just + 2 * 1024 * 1024,
        context,
        {"activations": 3 * GiB, "parameters": 9 * GiB, "unattributed": 10 * GiB},
    )
    assert not over.fits and over.headroom_bytes < 0
    line = over.line()
    assert line.startswith("does not fit on L4:") and "short" in line
    # the largest categories that a technique addresses, largest first; never "unattributed"
    assert [c for c, _ in over.dominant] == ["parameters", "activations"]
    assert "parameters (9.00 GiB) and activations (3.00 GiB)" in line
    remedies = over.remedies
    assert remedies[0].startswith("parameters: keeping the weights in bf16")
    assert "checkpointing" in remedies[1]
    assert [d for d in over.details() if d.startswith("try for parameters")]


def test_a_rank_needs_nccl_buffers_beside_its_context() -> None:
    h100 = card("H100")
    one = verdict(h100, 10 * GiB, GiB // 2, {"activations": 10 * GiB})
    assert nccl_share(1) is None and one.communication_bytes == 0
    share = nccl_share(4)
    assert share is not None and share.bytes == MEASURED[4] and "4 ranks" in share.basis
    rank = verdict(h100, 10 * GiB, GiB // 2, {"activations": 10 * GiB}, share)
    assert rank.needed_bytes - one.needed_bytes == share.bytes
    assert "NCCL's buffers 850 MiB (measured with 4 ranks on H100 80GBs)" in rank.details()[0]
    # a reserved peak that just fits alone no longer fits beside NCCL's buffers
    edge = int((h100.total_bytes - GiB // 2 - share.bytes // 2) / (1 + MARGIN))
    assert (
        verdict(h100, edge, GiB // 2, {}).fits and not verdict(h100, edge, GiB // 2, {}, share).fits
    )
    eight = nccl_share(8)
    assert eight is not None and "measured with 4 ranks" in eight.basis and "for 8" in eight.basis


def test_an_unknown_context_is_said() -> None:
    v = verdict(card("H100"), 10 * GiB, None, {})
    assert v.fits and "CUDA context and libraries not known" in v.details()[0]


def test_the_verdict_comes_first_in_an_estimate_in_text_and_html() -> None:
    v = verdict(card("T4"), 20 * GiB, GiB // 2, {"optimizer_state": 12 * GiB})
    est = Estimate(
        "baseline",
        "cuda:0",
        19 * GiB,
        20 * GiB,
        {"optimizer_state": 12 * GiB},
        "optimizer",
        verdict=v,
    )
    lines = est.text().splitlines()
    assert lines[0].startswith("gpumem estimate: baseline on cuda:0")
    assert lines[1].startswith("does not fit on T4")
    assert any("try for optimizer state: a lighter optimizer" in x for x in lines)
    page = est._repr_html_()
    assert page.index("jp-gpumem-verdict-does-not-fit") < page.index("gpumem estimate:")
    assert est.to_dict()["verdict"]["fits"] is False
