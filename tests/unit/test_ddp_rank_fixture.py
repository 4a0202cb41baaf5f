"""The breakdown of a DDP rank's peak, from a trace recorded on an H100 (torch 2.11).

The fixture is one rank of the one-rank DDP job in ``tests/gpu/test_ranks_gpu.py``
(Linear(1024, 4096), GELU, Linear(4096, 1024), AdamW, three steps, gradients set to None
after each) under `%%gpumem`; its frames are kept up to the cell's own. At its peak, in the
second step's optimizer, DDP holds its first bucket set and the rebuilt one, and AdamW its
square-root temporaries, one of which sits at an address the next step's gradient takes
after two smaller storages.
"""

import json
from pathlib import Path

from jupyter_gpumem.records import (
    CellRecording,
    DeviceRecording,
    ModuleCall,
    PhaseMark,
    ScopeMark,
    StepSample,
    Tag,
    TraceEvent,
    TraceWindow,
    Workspace,
)
from jupyter_gpumem.report.build import build_report

FIXTURE = Path(__file__).parent.parent / "fixtures" / "cuda_trace_ddp_rank.json"
PARAMETERS = 1024 * 4096 * 4 + 4096 * 4 + 4096 * 1024 * 4 + 1024 * 4  # the model's weights


def _recording() -> tuple[CellRecording, dict]:
    data = json.loads(FIXTURE.read_text())
    window = TraceWindow(
        segments_before=(),  # CUDA came up with the rank: nothing was allocated before
        events=tuple(TraceEvent(**e) for e in data["events"]),
        **data["window"],
    )
    device = DeviceRecording(
        **data["device"],
        windows=(window,),
        samples=tuple(StepSample(**s) for s in data["samples"]),
        trace_problem=None,
        end_blocks=None,
        workspaces=tuple(Workspace(**w) for w in data["workspaces"]),
    )
    rec = CellRecording(
        started_at=data["started_at"],
        wall_s=data["wall_s"],
        cuda_available=True,
        devices={device.index: device},
        error=None,
        notes=(),
        tags=tuple(Tag(**t) for t in data["tags"]),
        marks=tuple(PhaseMark(**m) for m in data["marks"]),
        named={},
        steps=data["steps"],
        calls=tuple(ModuleCall(**c) for c in data["calls"]),
        scope_marks=tuple(ScopeMark(**s) for s in data["scope_marks"]),
    )
    return rec, data


def test_the_peak_is_the_ranks_own_counter_to_the_byte() -> None:
    rec, data = _recording()
    (device,) = build_report(rec).devices
    assert device.peak_allocated_bytes == data["device"]["max_allocated_after"]
    assert sum(device.breakdown.values()) == device.peak_allocated_bytes
    assert device.source == "allocator-trace"


def test_at_the_optimizer_peak_every_parameter_has_one_gradient_and_two_adam_states() -> None:
    rec, _ = _recording()
    (device,) = build_report(rec).devices
    breakdown = device.breakdown
    assert (device.peak_phase, device.peak_step) == ("optimizer", 1)
    assert breakdown["parameters"] == PARAMETERS
    # the temporary at a later gradient's address stays a temporary: one gradient each
    assert breakdown["gradients"] == PARAMETERS
    assert breakdown["optimizer_state"] == 2 * PARAMETERS
    assert breakdown["temporary"] == PARAMETERS  # AdamW's square roots, one per parameter
    assert breakdown["communication"] == 2 * PARAMETERS  # the first bucket set and the rebuilt one
