"""The tuner's form without a kernel or a model: few checkpoint controls, charts only with data."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("bqplot")

from jupyter_gpumem.widgets.plan_view import CPU_STEPS
from jupyter_gpumem.widgets.tuner_panel import (
    CHARTS_LATER,
    FIT_TECHNIQUES,
    GPUS_LATER,
    VIEWS,
    Module,
    Panel,
)

MiB = 2**20
BLOCKS = [f"transformer.h.{i}" for i in range(4)]
MODULES = [
    Module("transformer", "GPT2Model", False),
    Module("transformer.wte", "Embedding", True),
    *(Module(b, "GPT2Block", False) for b in BLOCKS),
    *(Module(f"{b}.attn", "GPT2Attention", False) for b in BLOCKS),
    *(Module(f"{b}.{leaf}", kind, True) for b in BLOCKS
      for leaf, kind in (("ln_1", "LayerNorm"), ("attn.c_attn", "Conv1D"), ("mlp.dropout", "Dropout"))),
]  # fmt: skip
ROW: dict[str, Any] = {
    "configuration": "baseline", "chart_label": "baseline", "status": "ok",
    "peak_bytes": 16 * MiB, "step_ms": 26.5, "delta_peak_bytes": 0, "delta_peak_pct": 0.0,
    "delta_step_pct": 0.0, "fits_budget": False, "breakdown": {"activations": 16 * MiB},
    "warnings": (),
}  # fmt: skip


def _panel(blocks: list[str] = BLOCKS, *, tracked_steps: bool = False) -> Panel:
    return Panel(
        "<b>t</b>", MODULES, blocks, "opt", optimizer_now="adamw", tracked_steps=tracked_steps
    )


def _values(panel: Panel) -> list[str]:
    return [value for _, value in panel.modules.options]


def test_blocks_come_first_and_the_rest_waits_behind_more() -> None:
    panel = _panel()
    assert panel.all_blocks.description == "all 4 blocks" and not panel.all_blocks.disabled
    assert list(panel.block_bars.toggles) == BLOCKS
    assert panel.more.selected_index is None  # closed: the blocks are what most models need
    assert panel.modules in panel.more.children[0].children
    assert panel.every in panel.more.children[0].children[1].children
    # no Dropout, Conv1D, LayerNorm or Embedding: a single layer frees next to nothing
    assert _values(panel) == [*BLOCKS, "transformer", *(f"{b}.attn" for b in BLOCKS)]
    assert "Conv1D, Dropout, Embedding, LayerNorm" in panel.single_layers.description
    panel.modules.value = ("transformer.h.1.attn",)
    panel.single_layers.value = True
    assert len(_values(panel)) == len(MODULES) and _values(panel)[:4] == BLOCKS
    assert panel.modules.value == ("transformer.h.1.attn",)  # the pick survives the new list
    panel.single_layers.value = False
    assert "transformer.wte" not in _values(panel)


def test_show_modules_offers_single_layers_and_opens_more() -> None:
    panel = _panel()
    panel.show_modules(BLOCKS[:2])  # the toggles show blocks: "more" stays closed
    assert panel.more.selected_index is None and not panel.single_layers.value
    panel.show_modules(["transformer.h.0", "transformer.wte"])
    assert panel.single_layers.value and panel.more.selected_index == 0
    assert "transformer.wte" in _values(panel)


def test_a_model_without_blocks_opens_more_and_says_why() -> None:
    panel = _panel([])
    assert panel.more.selected_index == 0 and panel.all_blocks.disabled
    assert "no repeated blocks" in panel.children[1].value


def test_the_charts_wait_for_data_and_the_message_says_so() -> None:
    panel = _panel()
    assert panel.charts.children == () and CHARTS_LATER in panel.charts_note.value
    panel.show([])
    assert panel.charts.children == () and CHARTS_LATER in panel.charts_note.value
    panel.show([{**ROW, "status": "error", "breakdown": None, "delta_peak_bytes": None}])
    assert panel.charts.children == () and "No measurement has a breakdown" in (
        panel.charts_note.value
    )
    panel.show([ROW], 12 * MiB)
    assert panel.charts.children == (panel.breakdown.widget, panel.tradeoff.figure)
    assert panel.charts_note.value == "" and list(panel.breakdown.budget.x) == [12.0, 12.0]


def test_fit_keeps_the_optimizer_by_default() -> None:
    panel = _panel()
    assert FIT_TECHNIQUES == {"checkpoint": True, "precision": True, "optimizer": False}
    assert {n: box.value for n, box in panel.fit_techniques.items()} == FIT_TECHNIQUES


def test_step_times_timed_under_the_tracker_have_a_standing_note() -> None:
    assert "step times compare configurations with each other only" in (
        _panel(tracked_steps=True).steps_note.value
    )
    assert CPU_STEPS.split(",")[0] in _panel(tracked_steps=True).steps_note.value
    assert _panel().steps_note.value == ""


def test_pure_bf16_says_that_revert_keeps_what_was_trained() -> None:
    panel = _panel()
    panel.precision.value = "bf16"
    panel.show_config("bf16")
    shown = panel.configuration.value
    assert "configuration: bf16 (Apply applies it)" in shown
    assert "Revert casts them back to their dtypes and keeps what was trained" in shown
    assert "at bf16 precision" in shown
    panel.precision.value = "bf16-autocast"
    panel.show_config("bf16-autocast")
    assert "Revert" not in panel.configuration.value


def test_all_blocks_ticks_each_block_and_follows_them() -> None:
    panel = _panel()
    toggles = panel.block_bars.toggles
    panel.all_blocks.value = True
    assert all(box.value for box in toggles.values())  # the bars' "checkpointed" agree
    assert panel.modules.value == tuple(BLOCKS) and panel.checkpoint_spec() == "blocks"
    toggles[BLOCKS[1]].value = False
    assert not panel.all_blocks.value  # no longer all of them
    assert panel.checkpoint_spec() == (BLOCKS[0], BLOCKS[2], BLOCKS[3])
    toggles[BLOCKS[1]].value = True
    assert panel.all_blocks.value  # every block's box ticked: "all" is
    panel.all_blocks.value = False
    assert not any(box.value for box in toggles.values()) and panel.checkpoint_spec() is None
    panel.modules.value = ("transformer.h.0.attn",)
    panel.all_blocks.value = True  # the blocks join what was picked
    assert panel.modules.value == (*BLOCKS, "transformer.h.0.attn")
    panel.all_blocks.value = False
    assert panel.modules.value == ("transformer.h.0.attn",)


def test_every_row_of_controls_wraps_rather_than_cutting_one_off() -> None:
    panel = _panel()
    rows = [c for c in panel.children if panel.strategy in getattr(c, "children", ())]
    rows += [c for c in panel.children if panel.budget in getattr(c, "children", ())]
    rows += [c for c in panel.children if panel.buttons["Apply"] in getattr(c, "children", ())]
    assert len(rows) == 3 and all(r.layout.flex_flow == "row wrap" for r in rows)


def test_the_gpu_chart_has_a_tab_right_under_the_status_line() -> None:
    panel = _panel()
    assert panel.views.titles == VIEWS == ("measurements", "per GPU")
    status_row = next(c for c in panel.children if panel.status in getattr(c, "children", ()))
    between = panel.children[
        panel.children.index(status_row) + 1 : panel.children.index(panel.views)
    ]
    assert between == [panel.messages, panel.fit_text, panel.search_view]  # empty until used
    measurements, per_gpu = panel.views.children
    assert panel.table in measurements.children and panel.charts in measurements.children
    assert panel.ranks.widget in per_gpu.children and GPUS_LATER in panel.ranks_note.value
    panel.show([ROW, ROW])
    panel.show_ranks([], None, "peak per GPU")
    assert panel.views.titles == ("measurements (2)", "per GPU")
    panel.show_view("per GPU")
    assert panel.views.selected_index == 1
