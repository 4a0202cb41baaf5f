"""Where an estimate misses on the GPU: the fake step's allocations beside the real run's, by size.

    python bench/allocation_diff.py OUTPUT_DIR CASE [BATCH]

For one case of :mod:`zoo` at its bench size, the estimate's fake run (from the meta device) and
the measured run (random weights, ``torch.cuda.memory._record_memory_history`` around the same steps in a
plain loop) give
two multisets of allocation sizes (rounded to 512 B, as the allocator rounds). What only the real
run allocates, by size with the Python frames that asked for it (cuDNN's workspaces, a kernel's
own buffers), and what only the estimate allocates go to ``OUTPUT_DIR/diff_<case>.json``.
Needs a GPU.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import model_zoo
import zoo


def _rounded(size: int) -> int:
    return -(-size // 512) * 512


def _frames(event: dict[str, Any]) -> list[str]:
    frames = [f for f in event.get("frames", ()) if f["filename"].endswith(".py")]
    return [f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in frames[:6]]


def fake_sizes(case: zoo.Case, n: int | None) -> tuple[list[int], Any]:
    """The estimate of ``case`` and the sizes its fake run allocated, in order."""
    from jupyter_gpumem.tuner.estimation import fake_peaks

    runs: list[Any] = []
    original = fake_peaks.cuda_peaks

    def spy(run: Any, *args: Any, **kwargs: Any) -> Any:
        runs.append(run)
        return original(run, *args, **kwargs)

    fake_peaks.cuda_peaks = spy
    try:
        built = case.build("meta", "bench")
        batch = None if n is None else built.make_batch(n)
        trial = model_zoo.trial_of(case, built, "cuda", batch)
        found = trial.estimate(config=model_zoo.config_of(case))
    finally:
        fake_peaks.cuda_peaks = original
    run = runs[-1]
    sizes = [_rounded(run.sizes[i]) for action, i, _ in run.events if action == "alloc"]
    return [s for s in sizes if s], found


def _plain_steps(case: zoo.Case, built: Any, n: int | None) -> None:
    """The trial's three steps (one warm-up, two measured) in a plain loop, for the trace: a
    ``Trial.run`` of its own records the allocator's history and would take the trace's place."""
    import contextlib

    import torch

    batch = built.batch if n is None else built.make_batch(n)
    params = [p for p in built.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    bf16 = case.precision == "bf16-autocast"
    for _ in range(3):
        with torch.autocast("cuda", torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = built.loss(built.model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize()


def main() -> None:
    import torch

    out, name = Path(sys.argv[1]), sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else None
    case = zoo.case(name)
    fake, found = fake_sizes(case, n)
    real_model = case.build("cuda", "bench")
    allocated, reserved = model_zoo.measured(case, real_model, "bench", n)
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    _plain_steps(case, real_model, n)
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    real = [e for e in trace if e["action"] == "alloc"]
    only_real = collections.Counter(e["size"] for e in real) - collections.Counter(fake)
    only_fake = collections.Counter(fake) - collections.Counter(e["size"] for e in real)
    biggest = sorted(only_real.items(), key=lambda kv: -kv[0] * kv[1])[:25]
    result = {
        "case": name,
        "batch": n,
        "estimated": [found.peak_bytes, found.peak_reserved_bytes],
        "measured": [allocated, reserved],
        "only_real_bytes": sum(k * v for k, v in only_real.items()),
        "only_fake_bytes": sum(k * v for k, v in only_fake.items()),
        "only_real": [
            {"size": s, "count": c, "frames": _frames(next(e for e in real if e["size"] == s))}
            for s, c in biggest
        ],
        "only_fake": sorted(only_fake.items(), key=lambda kv: -kv[0] * kv[1])[:25],
        "segments": [e["size"] for e in trace if e["action"] == "segment_alloc"],
        "cudnn": torch.backends.cudnn.version(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"diff_{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("case", "estimated", "measured", "only_real_bytes")}))


if __name__ == "__main__":
    main()
