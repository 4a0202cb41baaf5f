"""A report of CPU tensors says only what means something on the CPU, in user words.

The CPU has no caching allocator (no reserved or cache rows), hints too small to matter are not
shown, and a module named by an index (a Sequential's child) does not read as a number.
"""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpumem.analysis.by_module import ModuleBytes
from jupyter_gpumem.analysis.leak_hints import (
    LeakHint,
    graph_hint,
    growth_hint,
    output_cache_hint,
    worth_showing,
)
from jupyter_gpumem.records import CellRecording, TraceEvent
from jupyter_gpumem.report.build import build_report
from jupyter_gpumem.report.record import NO_CUDA, DeviceReport, Report
from jupyter_gpumem.report.text import module_name

KiB, MiB, GiB = 2**10, 2**20, 2**30
CELL = "<ipython-input-3-0123456789ab>"


def _cpu_recording(nbytes: int = 4 * MiB) -> CellRecording:
    frame = {"filename": CELL, "line": 2, "name": "<module>"}
    return CellRecording(
        started_at=0.0,
        wall_s=0.5,
        cuda_available=False,
        devices={},
        error=None,
        notes=(NO_CUDA,),
        cpu_events=(TraceEvent("alloc", 16, nbytes, 10, (frame,)),),
    )


def _cpu_report() -> Report:
    return build_report(_cpu_recording(), cell=(CELL, 0))


def test_a_cpu_report_has_no_reserved_or_cache_rows() -> None:
    r = _cpu_report()
    assert str(r).splitlines()[:6] == [
        "gpumem: 500 ms",
        "                              cpu CPU tensors",
        "peak allocated                       4.00 MiB",
        "allocated before                          0 B",
        "allocated after                      4.00 MiB",
        "allocated delta                     +4.00 MiB",
    ]
    text, page = str(r), r._repr_mimebundle_()["text/html"]
    for shown in (text, page):
        assert "reserved" not in shown and "cache (" not in shown and "—" not in shown
    assert 'aria-label="CPU tensor memory over the cell"' in page and "GPU memory" not in page


def _gpu() -> DeviceReport:
    return DeviceReport(
        device="cuda:0", index=0, name="NVIDIA H100", total_bytes=80 * GiB,
        allocated_before_bytes=0, allocated_after_bytes=GiB, allocated_delta_bytes=GiB,
        peak_allocated_bytes=2 * GiB, peak_reserved_bytes=3 * GiB, reserved_after_bytes=3 * GiB,
        cache_bytes=2 * GiB, nvml_process_bytes=None, non_torch_bytes=None, source="allocator-trace",
    )  # fmt: skip


def test_beside_a_gpu_the_cpu_column_says_it_has_no_cache_and_why() -> None:
    r = replace(_cpu_report(), devices=(_gpu(), _cpu_report().devices[0]), notes=())
    lines = str(r).splitlines()
    assert lines[1:9] == [
        "                              cuda:0 NVIDIA H100  cpu CPU tensors",
        "peak allocated                          2.00 GiB         4.00 MiB",
        "peak reserved                           3.00 GiB                —",
        "allocated before                             0 B              0 B",
        "allocated after                         1.00 GiB         4.00 MiB",
        "allocated delta                        +1.00 GiB        +4.00 MiB",
        "cache (reserved - allocated)            2.00 GiB                —",
        "—: the CPU has no caching allocator, so nothing is reserved beyond what its tensors hold",
    ]
    why = "the CPU has no caching allocator, so nothing is reserved beyond what its tensors hold"
    page = r._repr_mimebundle_()["text/html"]
    assert page.count(f'<td style="text-align:right;padding:0 .8em" title="{why}">—</td>') == 2
    assert f"<small>—: {why}</small>" in page


def test_a_rank_on_the_cpu_shows_no_reserved_figure() -> None:
    rank = replace(_cpu_report(), rank=0, pid=11, notes=())
    r = replace(_cpu_report(), devices=(), notes=(), ranks=(rank,))
    assert str(r).splitlines()[2:] == [
        "  rank  pid  device  peak allocated  peak reserved  phase  at the peak",
        "*    0   11  cpu           4.00 MiB              —  -      no breakdown",
    ]


def _hinted(*hints: LeakHint | None, nbytes: int = 4 * MiB) -> Report:
    return build_report(
        _cpu_recording(nbytes), cell=(CELL, 0), leak_hints=lambda d: [h for h in hints if h]
    )


def test_hints_too_small_to_matter_are_not_shown() -> None:
    scalar = output_cache_hint(4, ["Out[3]"])  # a 4-byte loss shown as a cell's output
    kept = output_cache_hint(3 * MiB, ["Out[4]"])
    r = _hinted(scalar, kept)
    assert [h.where for h in r.leak_hints] == [("Out[4]",)]
    assert "Out[3]" not in str(r) and "Out[3]" not in r._repr_mimebundle_()["text/html"]
    # 1 MiB is the floor; memory held now must also be 1% of the peak, growth need not be
    assert scalar is not None and not worth_showing(scalar, None)
    below_floor = graph_hint(MiB - 1, ["loss"])
    assert below_floor is not None and not worth_showing(below_floor, MiB)
    at_floor = graph_hint(MiB, ["loss"])
    assert at_floor is not None and worth_showing(at_floor, 100 * MiB)
    assert not worth_showing(at_floor, 101 * MiB)  # under 1% of this peak
    grows = growth_hint([0, 2 * MiB, 4 * MiB, 6 * MiB])
    assert grows is not None and worth_showing(grows, 80 * GiB)
    assert _hinted(at_floor, nbytes=200 * MiB).leak_hints == ()


def test_a_module_named_by_an_index_reads_as_a_module() -> None:
    assert module_name("") == "model"
    assert module_name("2") == "model.2"
    assert module_name("0.attn#1") == "model.0.attn#1"
    assert module_name("transformer.h.3") == "transformer.h.3"
    tree = ModuleBytes("", {"parameters": 16 * MiB}, (ModuleBytes("2", {"parameters": 16 * MiB}),))
    device = replace(_cpu_report().devices[0], module_tree=tree)
    r = replace(_cpu_report(), devices=(device,))
    assert "  model.2    16.0 MiB  mostly parameters" in str(r).splitlines()
    assert 'title="model.2"' in r._repr_mimebundle_()["text/html"]


def test_the_timeline_spans_the_whole_cell_when_it_raised_after_its_last_allocation() -> None:
    frame = {"filename": CELL, "line": 2, "name": "<module>"}
    rec = replace(
        _cpu_recording(),
        wall_s=0.329,
        error=ValueError("boom"),
        cpu_events=(
            TraceEvent("alloc", 16, 4 * MiB, 20_000, (frame,)),
            TraceEvent("free_requested", 16, 4 * MiB, 50_000, (frame,)),
        ),
    )
    r = build_report(rec, cell=(CELL, 0))
    assert r.status == "error" and r.timeline is not None
    assert r.timeline.t_s[-2:] == (0.05, 0.329)  # the last event, then the cell's end
    assert r.timeline.allocated_bytes[-2:] == (0, 0)  # held: nothing happened after it
    assert r.timeline.peak_bytes == 4 * MiB and r.timeline.peak_t_s == 0.02
    svg = r._repr_mimebundle_()["text/html"]
    assert ">329 ms</text>" in svg and ">50 ms</text>" not in svg
    assert r.to_dict()["devices"][0]["timeline"]["t_s"][-1] == 0.329  # the JupyterLab view's
