"""Where an estimate's reserved bytes miss on the GPU: both runs' allocator events, kept for replay.

    python bench/allocator_check.py OUTPUT_DIR CASE [CASE ...]

For each case of :mod:`zoo` at its bench size, the estimate's fake run from the meta device (the
:class:`~jupyter_gpumem.tuner.estimation.fake_step.FakeRun` and the segments it was placed in)
and the measured run (the zoo's own measurement, whose ``Trial.run`` records the allocator's
history) go to ``OUTPUT_DIR/check_<case>.pickle.gz``: every snapshot the measured run took, its
trace events with their three innermost Python frames. ``bench/allocator_replay.py`` reads them
on any machine: it plays the real trace through the allocator model, to tell a model that
places blocks unlike the real allocator from a fake run whose events differ. Needs a GPU.
"""

from __future__ import annotations

import gzip
import pickle
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_zoo
import zoo


def _frames(entry: dict[str, Any]) -> list[str]:
    frames = [f for f in entry.get("frames", ()) if f["filename"].endswith(".py")]
    return [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in frames[:3]]


def _lean(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot without its frames, but for the trace events' innermost three."""
    segments = [
        {k: v for k, v in seg.items() if k != "blocks"}
        | {"blocks": [{k: v for k, v in b.items() if k != "frames"} for b in seg["blocks"]]}
        for seg in snapshot["segments"]
    ]
    traces = [
        [{k: v for k, v in e.items() if k != "frames"} | {"frames": _frames(e)} for e in trace]
        for trace in snapshot["device_traces"]
    ]
    return {"segments": segments, "device_traces": traces}


def check(name: str) -> dict[str, Any]:
    import torch

    from jupyter_gpumem.tuner.estimation import fake_peaks

    case = zoo.case(name)
    placed: list[Any] = []
    original_peaks = fake_peaks.cuda_peaks

    def spy(run: Any, segments: Any, *args: Any, **kwargs: Any) -> Any:
        placed.append((run, segments, args, kwargs))
        return original_peaks(run, segments, *args, **kwargs)

    fake_peaks.cuda_peaks = spy
    try:
        found, _ = model_zoo.estimate(case, "bench", "cuda")
    finally:
        fake_peaks.cuda_peaks = original_peaks
    snapshots: list[dict[str, Any]] = []
    original_snapshot = torch.cuda.memory._snapshot

    def keep(*args: Any, **kwargs: Any) -> Any:
        snapshot = original_snapshot(*args, **kwargs)
        snapshots.append(_lean(snapshot))
        return snapshot

    built = case.build("cuda", "bench")
    torch.cuda.memory._snapshot = keep
    try:
        allocated, reserved = model_zoo.measured(case, built, "bench")
    finally:
        torch.cuda.memory._snapshot = original_snapshot
    del built
    return {
        "case": name,
        "estimated": (found.peak_bytes, found.peak_reserved_bytes),
        "measured": (allocated, reserved),
        "fake": placed[-1],
        "snapshots": snapshots,
    }


def main() -> None:
    import gc

    import torch

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:]:
        result = check(name)
        with gzip.open(out / f"check_{name}.pickle.gz", "wb") as f:
            pickle.dump(result, f)
        print(name, "estimated", result["estimated"], "measured", result["measured"],
              "snapshots", len(result["snapshots"]), flush=True)  # fmt: skip
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
