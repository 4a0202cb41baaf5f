"""Report schemas 2 and 3: the fixture (a `generate` call) reads back and renders; its new names read well.

The fixture is shared with the labextension's jest and Galata tests, which read schema 1
fixtures as well.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from jupyter_gpumem.report.record import MIME_TYPE, SCHEMA, report_from_dict
from jupyter_gpumem.report.svg import PHASE_COLORS, timeline_svg
from jupyter_gpumem.report.text import breakdown_lines
from jupyter_gpumem.widgets.tuner_charts import CATEGORY_COLORS, legend_html

FIXTURES = Path(__file__).parents[1] / "fixtures"
NEW_CATEGORIES = ("kv_cache", "library_workspace", "cuda_graph_pool")


def _generate() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "report_gpu_generate.json").read_text())
    return data


def test_the_generate_fixture_is_the_current_schema_and_reads_back() -> None:
    data = _generate()
    assert SCHEMA == 3 and data["schema"] == SCHEMA
    report = report_from_dict(data)
    assert report.schema == SCHEMA
    assert report.breakdown is not None and report.breakdown["kv_cache"] > 0
    assert report.peak_phase in ("prefill", "decode")
    bundle = report._repr_mimebundle_()[MIME_TYPE]
    assert bundle["schema"] == SCHEMA
    assert bundle["devices"][0]["breakdown"] == data["devices"][0]["breakdown"]


def test_the_generate_fixture_renders_its_kv_cache_and_its_phases() -> None:
    report = report_from_dict(_generate())
    assert re.search(r"^  kv cache +\S+ \S+ +\d+%$", str(report), re.MULTILINE), str(report)
    assert report.timeline is not None
    svg = timeline_svg(report.timeline)
    for phase in ("prefill", "decode"):
        assert f'fill="{PHASE_COLORS[phase]}"' in svg
        assert f">{phase}</text>" in svg
    assert PHASE_COLORS["prefill"] != PHASE_COLORS["decode"]


def test_the_new_categories_read_well_in_the_text_breakdown() -> None:
    report = report_from_dict(_generate())
    device = report.devices[0]
    peak = device.peak_allocated_bytes
    breakdown = {"parameters": peak - 3 * 1024, **{k: 1024 for k in NEW_CATEGORIES}}
    lines = breakdown_lines(replace(device, breakdown=breakdown))
    labels = [line[2:20].rstrip() for line in lines[1:]]
    assert labels == ["parameters", "kv cache", "library workspace", "cuda graph pool"]
    assert all(line[20] == " " for line in lines[1:])  # the label column holds them whole


def test_the_tuner_colours_the_new_categories_apart() -> None:
    assert set(NEW_CATEGORIES) <= set(CATEGORY_COLORS)
    colours = list(CATEGORY_COLORS.values())
    assert len(set(colours)) == len(colours)
    order = list(CATEGORY_COLORS)
    assert order.index("optimizer_state") < order.index("kv_cache") < order.index("activations")
    assert order.index("unattributed") < order.index("library_workspace")
    assert order.index("unattributed") < order.index("cuda_graph_pool")
    legend = legend_html(list(NEW_CATEGORIES))
    for label in ("kv cache", "library workspace", "cuda graph pool"):
        assert f"</span>{label}</span>" in legend
