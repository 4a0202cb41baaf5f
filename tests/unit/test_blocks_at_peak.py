"""Each block's activations at the peak, read from a report, and the plan's lines about them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from jupyter_gpumem.analysis.by_module import ModuleBytes
from jupyter_gpumem.report.record import Report, report_from_dict
from jupyter_gpumem.tuner.planning.blocks_at_peak import block_activations
from jupyter_gpumem.tuner.planning.reasoning import BLOCK_GROUPS, block_lines
from jupyter_gpumem.units import format_bytes

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report_cpu_gpt_step.json"
MiB = 2**20


def _report(tree: ModuleBytes | None) -> Report:
    report = report_from_dict(json.loads(FIXTURE.read_text()))
    assert report.main is not None
    return replace(report, devices=(replace(report.main, module_tree=tree),), main_device=None)


def test_a_block_sums_its_calls_and_leaves_its_childrens_out() -> None:
    fc = ModuleBytes("h.0.fc#1", {"activations": 3 * MiB})
    tree = ModuleBytes(
        "",
        {"activations": 20 * MiB, "parameters": MiB},
        (
            ModuleBytes("h.0#0", {"activations": 5 * MiB}),
            ModuleBytes("h.0#1", {"activations": 4 * MiB}, (fc,)),
            ModuleBytes("h.1", {"activations": 6 * MiB, "parameters": MiB}),
            ModuleBytes("h.10", {"activations": 7 * MiB}),  # not h.1 again
        ),
    )
    report = _report(tree)
    assert report.by_module is not None and "h.0#1" in report.by_module
    assert block_activations(report, ["h.0", "h.1", "h.2"]) == {
        "h.0": 9 * MiB,
        "h.1": 6 * MiB,
        "h.2": 0,  # ran, but holds nothing at the peak
    }
    assert block_activations(report, []) == {}


def test_a_report_without_the_peak_by_module_gives_no_figures() -> None:
    assert block_activations(_report(None), ["h.0"]) == {}
    assert block_activations(None, ["h.0"]) == {}


def test_the_recorded_gpt_step_gives_its_blocks() -> None:
    report = report_from_dict(json.loads(FIXTURE.read_text()))
    by_module = report.by_module
    assert by_module is not None
    names = sorted({p.split("#")[0] for p in by_module if p.count(".") == 2 and ".h." in p})
    assert names, sorted(by_module)
    found = block_activations(report, names)
    assert set(found) == set(names) and sum(found.values()) > 0
    assert sum(found.values()) <= (report.breakdown or {})["activations"]


BLOCKS = tuple(f"h.{i}" for i in range(12))


def test_alike_blocks_share_a_line_that_says_which_are_checkpointed() -> None:
    figures = dict.fromkeys(BLOCKS, 412 * MiB) | {"h.11": 380 * MiB}
    lines = block_lines(figures, BLOCKS[:6], BLOCKS, "bf16", 5 * 2**30)
    assert lines == [
        f"Activations at the peak of the run with nothing checkpointed under bf16: "
        f"{format_bytes(5 * 2**30)}, {format_bytes(sum(figures.values()))} of it in the 12 blocks.",
        f"  h.0 to h.10: {format_bytes(412 * MiB)} each, checkpointed: h.0-h.5; the rest kept.",
        f"  h.11: {format_bytes(380 * MiB)}, kept.",
    ]
    every = block_lines(figures, BLOCKS, BLOCKS, None)
    assert every[0].endswith(f": {format_bytes(sum(figures.values()))} in the 12 blocks.")
    assert every[1].endswith("each, checkpointed.") and every[2].endswith(", checkpointed.")


def test_many_different_blocks_read_as_one_range() -> None:
    figures = {name: (i + 1) * MiB for i, name in enumerate(BLOCKS)}
    assert len(BLOCKS) > BLOCK_GROUPS
    lines = block_lines(figures, ("h.10", "h.11"), BLOCKS, None)
    assert len(lines) == 2
    assert lines[1] == (
        f"  From {format_bytes(MiB)} (h.0) to {format_bytes(12 * MiB)} (h.11) a block; "
        "checkpointed: h.10-h.11."
    )
    assert block_lines(figures, (), BLOCKS, None)[1].endswith("none checkpointed.")


def test_no_figures_no_lines() -> None:
    assert block_lines({}, (), BLOCKS, None) == []
    assert block_lines({"other": 1}, (), BLOCKS, None) == []
