"""The tuner's block toggles and their activation bars, without a kernel or a model."""

from __future__ import annotations

import re

import pytest

widgets = pytest.importorskip("ipywidgets")

from jupyter_gpumem.units import format_bytes  # noqa: E402
from jupyter_gpumem.widgets.block_bars import (  # noqa: E402
    CHECKPOINTED,
    UNMEASURED,
    BlockBars,
    bar_html,
)

MiB = 2**20
NAMES = ("blocks.0", "blocks.1", "blocks.2")


def share(html: str) -> float:
    found = re.search(r"width:([\d.]+)%", html)
    assert found is not None, html
    return float(found.group(1))


def test_bars_are_scaled_to_the_largest_block_and_give_its_figure() -> None:
    bars = BlockBars(NAMES, "#59a14f")
    assert bars.figures == {} and UNMEASURED in bars.caption.value
    assert all(b.value == "" for b in bars.bars.values())
    bars.update({"blocks.0": 400 * MiB, "blocks.1": 100 * MiB, "blocks.2": 0}, "<b>ckpt</b>")
    assert [share(bars.bars[n].value) for n in NAMES] == [100.0, 25.0, 0.0]
    for name, n in bars.figures.items():
        assert format_bytes(n) in bars.bars[name].value
    assert "&lt;b&gt;ckpt&lt;/b&gt;" in bars.caption.value and "<b>" not in bars.caption.value
    bars.update({})
    assert bars.figures == {} and UNMEASURED in bars.caption.value
    assert bar_html(0, 0, "#000").count("width:0.0%") == 1  # nothing at the peak: no bar


def test_toggles_and_the_module_list_stay_in_step() -> None:
    select = widgets.SelectMultiple(
        options=[(f"{n} (Block)", n) for n in NAMES] + [("head", "head")]
    )
    bars = BlockBars(NAMES, "#59a14f")
    bars.follow(select)
    bars.toggles["blocks.2"].value = True
    bars.toggles["blocks.0"].value = True
    assert select.value == ("blocks.0", "blocks.2")  # in the list's order
    bars.toggles["blocks.2"].value = False
    assert select.value == ("blocks.0",)
    select.value = ("head", "blocks.1")  # picked in the list: its order is kept
    assert [n for n, t in bars.toggles.items() if t.value] == ["blocks.1"]
    assert select.value == ("head", "blocks.1")


def test_checkpointed_blocks_are_drawn_hatched_and_named_not_as_zero_bytes() -> None:
    bars = BlockBars(NAMES, "#59a14f")
    bars.update({"blocks.0": 400 * MiB, "blocks.1": 0, "blocks.2": 100 * MiB}, "ckpt", {"blocks.1"})
    assert bars.checkpointed == {"blocks.1"}
    hatched = bars.bars["blocks.1"].value
    assert CHECKPOINTED in hatched and "repeating-linear-gradient" in hatched
    assert "0 B" not in hatched and "width:" not in hatched  # no fill, no figure
    assert [share(bars.bars[n].value) for n in ("blocks.0", "blocks.2")] == [100.0, 25.0]
    # the largest kept block sets the scale, not a checkpointed one
    bars.update({"blocks.0": 400 * MiB, "blocks.1": 100 * MiB}, "ckpt", {"blocks.0"})
    assert share(bars.bars["blocks.1"].value) == 100.0
    bars.update({"blocks.0": 400 * MiB}, "baseline")  # a later run without: a plain bar again
    assert bars.checkpointed == frozenset() and CHECKPOINTED not in bars.bars["blocks.0"].value


def test_toggles_follow_a_list_whose_options_change() -> None:
    select = widgets.SelectMultiple(options=[(n, n) for n in NAMES])
    bars = BlockBars(NAMES, "#59a14f")
    bars.follow(select)
    select.options = [(n, n) for n in (*NAMES, "head")]  # single layers listed too
    select.value = ("head",)
    bars.toggles["blocks.1"].value = True
    assert select.value == ("blocks.1", "head")
