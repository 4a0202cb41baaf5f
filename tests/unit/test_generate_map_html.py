"""A generate map's table says what its marks mean: a legend beside it, cells in its colours."""

from __future__ import annotations

import re

from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.generate_map import MARKS, GenerateMap

MiB = 2**20


def _estimate(peak: int | None, reason: str | None = None) -> Estimate:
    return Estimate(
        label="generate", device="cpu", peak_bytes=peak, peak_reserved_bytes=peak,
        breakdown=None, phase="prefill", reason=reason,
    )  # fmt: skip


def _map() -> GenerateMap:
    """Batch 1 fits the shorter context and was not run at the longer; batch 2 is over at the
    shorter, so left out at the longer, as is batch 4, which has no estimate at the shorter."""
    return GenerateMap(
        batch_sizes=(1, 2, 4),
        contexts=(64, 128),
        max_new_tokens=8,
        estimates=(
            (_estimate(10 * MiB), None),
            (_estimate(30 * MiB), None),
            (_estimate(None, reason="no attention kernel"), None),
        ),
        budget_bytes=20 * MiB,
        card=None,
        wall_s=1.0,
    )


def _cells(page: str) -> list[tuple[str, str]]:
    return re.findall(r'<td class="([^"]+)"[^>]*>([^<]*)</td>', page)


def test_the_table_has_a_legend_of_its_marks_beside_it() -> None:
    page = _map()._repr_html_()
    assert _cells(page) == [
        ("gpumem-map-fits", "10.0 MiB"), ("gpumem-map-unknown", "-"),
        ("gpumem-map-over", "30.0 MiB x"), ("gpumem-map-over gpumem-map-left-out", "x"),
        ("gpumem-map-unknown", "n/a"), ("gpumem-map-over gpumem-map-left-out", "x"),
    ]  # fmt: skip
    legend = re.search(r'<ul class="gpumem-map-legend"[^>]*>(.*)</ul>', page)
    assert legend is not None
    items = [re.sub(r"<[^>]+>", "", li) for li in re.findall(r"<li>(.*?)</li>", legend.group(1))]
    assert items == [
        "a size: the estimated peak, which fits",
        "a size and x: the estimated peak, which does not fit",
        "x alone: does not fit, not estimated: a smaller batch or context does not",
        "-: not estimated",
        "n/a: no estimate (hover over the cell for why)",
    ]
    # the colours of the cells are the legend's, the theme's success and error colours
    assert page.count('style="color:var(--jp-success-color1,#388e3c)"') == 1 + 1
    assert page.count('style="color:var(--jp-error-color1,#d32f2f)"') == 1 + 1
    assert page.count('style="color:var(--jp-error-color1,#d32f2f);opacity:.6"') == 2 + 1
    assert 'title="no attention kernel"' in page


def test_the_text_says_what_its_marks_mean_too() -> None:
    text = _map().text().splitlines()
    assert text[1:6] == [
        f"{mark}: {means}" for state, (mark, means) in MARKS.items() if state != "unjudged"
    ]
    assert text[6] == ""


def test_a_legend_names_only_the_marks_the_map_has() -> None:
    fits = GenerateMap(
        batch_sizes=(1,), contexts=(64,), max_new_tokens=8, estimates=((_estimate(MiB),),),
        budget_bytes=20 * MiB, card=None, wall_s=1.0,
    )  # fmt: skip
    page = fits._repr_html_()
    assert page.count("<li>") == 1 and " x" not in page
