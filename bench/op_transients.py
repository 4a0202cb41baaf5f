"""What each op of a zoo case allocates for itself on the GPU while it runs (cuDNN's workspaces).

    python bench/op_transients.py OUTPUT.json CASE[:BATCH] [CASE[:BATCH] ...]

For each case of :mod:`zoo` at its bench size, three training steps run on the GPU with random
weights (AdamW, the case's precision) under a dispatch mode that reads the allocator's counters
around every op: ``transient`` is what the op held at its highest beyond what it held before
and after (memory no tensor of the step owns: a library's workspace), ``reserved`` what the op
made the allocator reserve. Ops are grouped by name, input shapes and dtypes; the largest go to
OUTPUT. An estimate's fake step sees the same ops, so this is what it would have to add:
``modelled`` is what the estimate adds for the op (reductions' staging buffers, kernels'
temporaries, the probed workspaces), and ``missed`` lists the ops where the two differ. A
batch after the case's name (``vit-bf16-autocast:61``) runs that batch instead of the bench's.
Needs a GPU.
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo


def _signature(func: Any, args: Any) -> str:
    import torch

    parts = []
    for a in torch.utils._pytree.tree_leaves(args):
        if isinstance(a, torch.Tensor):
            parts.append(f"{tuple(a.shape)}:{str(a.dtype).removeprefix('torch.')}")
        elif isinstance(a, (int, bool)):
            parts.append(str(a))
    return f"{func} " + " ".join(parts)


def modelled(torch: Any, func: Any, args: Any, kwargs: Any) -> int:
    """What an estimate adds for the op beyond its outputs, for these (real) arguments."""
    from jupyter_gpumem.tuner.estimation import (
        kernel_temporaries,
        reduce_buffers,
        workspace_probes,
    )

    rounded = [-(-n // 512) * 512 for n in (
        *reduce_buffers.sizes(torch, func, args, kwargs),
        *kernel_temporaries.sizes(torch, func, args, kwargs),
    )]  # fmt: skip
    extra = sum(rounded)
    if getattr(func, "__name__", None) in workspace_probes.OPS:
        prober = workspace_probes.prober_for(torch, args[0].device)
        probe = prober.probe(workspace_probes.signature(torch, func.__name__, args, kwargs))
        extra += probe.extra if not isinstance(probe, str) else 0
    return extra


def transients(case: zoo.Case, batch: int | None = None) -> dict[str, Any]:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    built = case.build("cuda", "bench")
    data = built.batch if batch is None else built.make_batch(batch)
    params = [p for p in built.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    found: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])  # n, max, reserved
    ours: dict[str, int] = {}  # op -> what the estimate adds for it, at its largest

    class Counters(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            before = torch.cuda.memory_allocated()
            reserved = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            out = func(*args, **(kwargs or {}))
            high = torch.cuda.max_memory_allocated()
            extra = high - max(before, torch.cuda.memory_allocated())
            grew = torch.cuda.memory_reserved() - reserved
            key = _signature(func, args)
            ours[key] = max(ours.get(key, 0), modelled(torch, func, args, kwargs))
            if extra > 0 or grew > 0 or ours[key] > 0:
                row = found[key]
                row[0] += 1
                row[1] = max(row[1], extra)
                row[2] += grew
            return out

    autocast = (
        torch.autocast("cuda", torch.bfloat16)
        if case.precision == "bf16-autocast"
        else contextlib.nullcontext()
    )
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    with Counters():
        for _ in range(3):
            with autocast:
                loss = built.loss(built.model, data)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
    torch.cuda.synchronize()
    rows = sorted(found.items(), key=lambda kv: -kv[1][1])
    missed = [
        {"op": k, "calls": n, "transient": t, "modelled": ours.get(k, 0)}
        for k, (n, t, _) in rows
        if abs(t - ours.get(k, 0)) > 1 << 20
    ]
    return {
        "case": case.name,
        "batch": batch,
        "missed_bytes": sum(abs(m["transient"] - m["modelled"]) for m in missed),
        "missed": missed[:40],
        "cudnn": torch.backends.cudnn.version(),
        "ops_with_transients": sum(1 for _, r in rows if r[1] > 0),
        "largest_transient": rows[0][1][1] if rows else 0,
        "rows": [
            {"op": k, "calls": n, "transient": t, "modelled": ours.get(k, 0), "reserved_grown": g}
            for k, (n, t, g) in rows[:60]
        ],
    }


def main() -> None:
    out = Path(sys.argv[1])
    results = []
    for arg in sys.argv[2:]:
        name, _, batch = arg.partition(":")
        r = transients(zoo.case(name), int(batch) if batch else None)
        results.append(r)
        print(
            json.dumps({k: r[k] for k in ("case", "batch", "ops_with_transients", "missed_bytes")})
        )
        for m in r["missed"][:8]:
            print(f"  {m['transient']:>11} {m['modelled']:>11} x{m['calls']:<3} {m['op'][:150]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
