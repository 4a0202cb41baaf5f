"""A report with worker ranks: the rank table at a fixed layout, the wire format and its way back."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from jupyter_gpumem.analysis.attribution import OomInfo
from jupyter_gpumem.analysis.breakdown import TensorRecord
from jupyter_gpumem.analysis.leak_hints import graph_hint
from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.report.record import MIME_TYPE, DeviceReport, Report, report_from_dict
from jupyter_gpumem.workers.rank_reports import _silent, load_reports, with_ranks

GiB, MiB = 2**30, 2**20


def _device(index: int, peak: int, activations: int) -> DeviceReport:
    return DeviceReport(
        device=f"cuda:{index}", index=index, name="NVIDIA H200", total_bytes=140 * GiB,
        allocated_before_bytes=0, allocated_after_bytes=GiB, allocated_delta_bytes=GiB,
        peak_allocated_bytes=peak, peak_reserved_bytes=peak + GiB, reserved_after_bytes=2 * GiB,
        cache_bytes=GiB, nvml_process_bytes=None, non_torch_bytes=None, source="allocator-trace",
        breakdown={"parameters": GiB, "gradients": GiB, "optimizer_state": 2 * GiB,
                   "activations": activations, "inputs": 0, "other": 0,
                   "temporary": peak - 4 * GiB - activations, "unattributed": 0},
        peak_phase="backward", peak_step=1,
        timeline=Timeline((0.0, 1.0), (0, peak), (0, peak + GiB),
                          (PhaseBand(0.0, 1.0, "backward", 1),), 1.0, peak),
        tensors=(TensorRecord("loss", (), "float32", 512, f"cuda:{index}", "cell line 3", True),),
    )  # fmt: skip


def _rank(rank: int, peak: int, activations: int, **kw: object) -> Report:
    fields = dict(
        id=f"r{rank}", name=f"rank {rank}", execution_count=None, started_at=10.0 + rank,
        wall_s=2.5, status="ok", error=None, cuda_available=True, source="allocator-trace",
        budget_bytes=None, devices=(_device(rank, peak, activations),), rank=rank, pid=4100 + rank,
    )  # fmt: skip
    fields.update(kw)
    return Report(**fields)  # type: ignore[arg-type]


def _cell() -> Report:
    ranks = (
        _rank(0, 8 * GiB, 3 * GiB),
        _rank(1, 10 * GiB, 5 * GiB, status="error", error="ValueError: rank 1 fails"),
        _silent(2, 4102, -9),
    )
    return Report(
        id="cell", name="ddp", execution_count=4, started_at=9.0, wall_s=3.25, status="error",
        error="ProcessRaisedException: ...", cuda_available=True, source="none",
        budget_bytes=None, ranks=ranks,
    )  # fmt: skip


def test_the_rank_table_is_exact_and_marks_the_worst_rank() -> None:
    r = _cell()
    assert r.worst_rank is r.ranks[1]
    assert str(r) == "\n".join(
        [
            "gpumem ddp: 3.25 s (cell raised)",
            "ranks: 3 worker processes; the worst (*) is rank 1, peak 10.0 GiB on cuda:1",
            "  rank   pid  device  peak allocated  peak reserved  phase             at the peak",
            "     0  4100  cuda:0        8.00 GiB       9.00 GiB  backward, step 1  activations 38%, "
            "optimizer state 25%, parameters 12%",
            "*    1  4101  cuda:1        10.0 GiB       11.0 GiB  backward, step 1  activations 50%, "
            "optimizer state 20%, parameters 10%",
            "     2  4102  -                    -              -  -                 no report: killed by "
            "SIGKILL (the system's out-of-memory killer sends it)",
            "rank 1 at the peak (backward, step 1) on cuda:1:",
            "  activations          5.00 GiB   50%",
            "  optimizer state      2.00 GiB   20%",
            "  parameters           1.00 GiB   10%",
            "  gradients            1.00 GiB   10%",
            "  temporary            1.00 GiB   10%",
            "rank 1 (pid 4101) failed: ValueError: rank 1 fails",
        ]
    )


def test_html_marks_the_worst_rank_and_escapes() -> None:
    page = _cell()._repr_mimebundle_()["text/html"]
    table = page[page.index('<table class="jp-gpumem-ranks"') :]
    assert table.count("<tr") == 4  # the heads and three ranks
    worst = table[table.index('class="jp-gpumem-worst-rank"') :]
    assert worst.index(">1 ◀ worst<") < worst.index("</tr>")
    assert "no report: killed by SIGKILL" in table


def test_the_wire_format_carries_the_ranks_and_comes_back_whole() -> None:
    r = replace(_cell(), leak_hints=(graph_hint(MiB, ["loss"]),))
    wire = r._repr_mimebundle_()[MIME_TYPE]
    json.dumps(wire)
    assert [k["rank"] for k in wire["ranks"]] == [0, 1, 2] and wire["worst_rank"] == 1
    assert wire["ranks"][2]["devices"] == [] and wire["ranks"][2]["pid"] == 4102
    back = report_from_dict(wire)
    assert back.to_dict() == wire
    assert back.ranks[1].devices == r.ranks[1].devices and back.leak_hints == r.leak_hints
    assert back.worst_rank is back.ranks[1]


def test_unknown_fields_are_left_out_when_reading() -> None:
    wire = _rank(0, GiB, 0).to_dict()
    wire["from_a_later_version"] = {"x": 1}
    wire["devices"][0]["also_new"] = 3
    assert report_from_dict(wire) == replace(_rank(0, GiB, 0), main_device="cuda:0")


FIXTURE = Path(__file__).parents[1] / "fixtures" / "report_two_ranks.json"


def test_the_two_rank_fixture_from_the_gpu_machine_reads_back_whole() -> None:
    wire = json.loads(FIXTURE.read_text())
    r = report_from_dict(wire)
    back = r.to_dict()
    # recorded before schema 3: the fields it added come back empty, the rest unchanged
    assert wire["schema"] < 3
    for rank in back["ranks"]:
        for device in rank["devices"]:
            assert device.pop("module_tree") is None and device.pop("largest_module") is None
    assert back == wire
    assert [(k.rank, k.device) for k in r.ranks] == [(0, "cuda:0"), (1, "cuda:1")]
    assert r.worst_rank is r.ranks[1] and wire["worst_rank"] == 1
    assert "*    1" in str(r) and "jp-gpumem-worst-rank" in r._repr_mimebundle_()["text/html"]
    assert load_reports(FIXTURE).ranks[0].ranks == r.ranks  # a saved cell report loads too


def test_a_rank_that_ran_out_of_memory_says_what_was_live_once() -> None:
    at_oom = {**dict.fromkeys(_device(0, 0, 0).breakdown or {}, 0), "activations": 3 * GiB}
    oom = OomInfo(40 * GiB, at_oom, "activations", "activation checkpointing", ())
    ranks = (
        _rank(0, 12 * GiB, 3 * GiB),
        _rank(
            1, 6 * GiB, 1 * GiB, status="oom", error="torch.OutOfMemoryError: CUDA out of memory."
        ),
    )
    ranks = (ranks[0], replace(ranks[1], devices=(replace(ranks[1].devices[0], oom=oom),)))
    raised = replace(_cell(), status="error", ranks=())
    r = with_ranks(raised, ranks, ())
    assert r.status == "oom" and r.worst_rank is r.ranks[0]  # the worst by peak is not the OOM
    text = str(r)
    failed = "rank 1 (pid 4101) failed: torch.OutOfMemoryError: CUDA out of memory."
    advice = "out of memory asking for 40.0 GiB: activations dominated what was live; try activation checkpointing"
    assert text.count(advice) == 1
    assert text.endswith(f"{failed}\n  {advice}"), text
    page = r._repr_mimebundle_()["text/html"]
    assert page.count("out of memory asking for 40.0 GiB") == 1
    assert with_ranks(replace(raised, status="ok"), ranks, ()).status == "ok"
