"""How long the larger answers take: ranks, the largest batch, the largest generate batch, a
search over ranks, all from the meta device.

    python bench/answer_speed.py OUT.json [--device=cuda] [--only=NAME,...] [--no-traced] [--in-turn]
                                          [--lived-in]

Each case runs in this process once with repeated blocks replayed and once with every block
traced (``block_replay.ENABLED``; ``--no-traced`` skips the second way, for the slow cases), after a
first answer that pays the imports, CUDA and the probe process; the batch searches are also timed
with their guesses from the line through the totals (``total_line``, ``search.PHASE_LINES``
off), as before each phase drew its own; ``--in-turn`` adds a run with
every estimate made one after the other (``forked.ENABLED``: the rank layouts and a search's
anchors are made at once, in forked children, where the host has the cores). ``equal`` says whether the two
ways gave the same figures (the peak and the breakdown of every rank; the batch found; the
search's winner and its estimate). Each way's ``_cpu_s`` and ``_load`` tell the time spent
estimating from the time spent waiting (see :func:`timed`). ``--lived-in`` first fills the
process as a kernel after an hour of work holds Python objects (2,000,000 small dicts, a
dataset's rows, as ``bench/scale.py``'s lived-in kernel): every full collection of the cycle
collector visits them. The targets (issue 55): one estimate of a 70B-class FSDP2 over
1,024 ranks <= 10 s; ``max_batch_size`` and ``max_generate_batch`` <= 5 s; a search over 1-8
ranks <= 30 s.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LLAMA_70B = dict(
    vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
    num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
)  # fmt: skip
LLAMA_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
)  # fmt: skip
LLAMA_1_5B = dict(
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096,
)  # fmt: skip


def llama(dims: dict[str, Any], dtype: Any = None) -> Any:
    import torch
    import transformers

    config = transformers.LlamaConfig(**dims)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config).to(dtype or torch.float32)


def lm_loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


def trial_of(dims: dict[str, Any], batch: tuple[int, int], device: str) -> Any:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    model = llama(dims)
    ids = torch.zeros(batch, dtype=torch.long, device="meta")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Trial(model, ids, lm_loss, optimizer=opt, warmup=1, steps=1, device=device)


def fsdp2_1024(dims: dict[str, Any], batch: tuple[int, int]) -> Callable[[str], Any]:
    """The case of one FSDP2 estimate over 1,024 ranks of a Llama of ``dims``."""

    def case(device: str) -> Callable[[], Any]:
        from jupyter_gpumem.techniques import Config

        trial = trial_of(dims, batch, device)

        def answer() -> Any:
            est = trial.estimate(config=Config(parallel="fsdp2", world_size=1024))
            if est.reason:
                return ("refused", est.reason)
            return [(r.rank, r.peak_bytes, r.peak_reserved_bytes, r.breakdown) for r in est.ranks]

        return answer

    return case


def max_batch(device: str) -> Callable[[], Any]:
    import torch

    trial = trial_of(LLAMA_1_5B, (1, 1024), device)

    def answer() -> Any:
        n = trial.max_batch_size(
            "60GiB",
            lambda n: torch.zeros(n, 1024, dtype=torch.long, device="meta"),
            precision="bf16-autocast",
        )
        found = trial.last_search
        return (n, found.estimate.peak_bytes if found.estimate else None, found.tried)

    return answer


def max_generate(device: str) -> Callable[[], Any]:
    import torch

    from jupyter_gpumem import max_generate_batch

    model = llama(LLAMA_8B, torch.bfloat16)

    def answer() -> Any:
        found = max_generate_batch(
            model, "60GiB", prompt_tokens=1024, max_new_tokens=256, device=device
        )
        return (
            found.batch_size,
            found.estimate.peak_bytes if found.estimate else None,
            found.tried,
        )

    return answer


def rank_search(device: str) -> Callable[[], Any]:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    model = llama(LLAMA_8B)
    ids = torch.zeros(4, 2048, dtype=torch.long, device="meta")

    def answer() -> Any:  # a trial of its own each time: a trial keeps what it estimated
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        trial = Trial(model, ids, lm_loss, optimizer=opt, warmup=1, steps=1, device=device)
        found = trial.search("70GiB", world_sizes=(1, 2, 4, 8), progress=False)
        return {
            "winner": None if found.config is None else str(found.config),
            "estimate": None if found.estimate is None else found.estimate.peak_bytes,
            "candidates": found.candidates,
            "anchors": found.anchors,
        }

    return answer


def small_rank_search(device: str) -> Callable[[], Any]:
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    model = llama(LLAMA_1_5B)
    ids = torch.zeros(2, 1024, dtype=torch.long, device="meta")

    def answer() -> Any:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        trial = Trial(model, ids, lm_loss, optimizer=opt, warmup=1, steps=1, device=device)
        found = trial.search("20GiB", world_sizes=(1, 2, 4, 8), progress=False)
        return {
            "winner": None if found.config is None else str(found.config),
            "estimate": None if found.estimate is None else found.estimate.peak_bytes,
            "candidates": found.candidates,
            "anchors": found.anchors,
        }

    return answer


CASES: dict[str, Callable[[str], Callable[[], Any]]] = {
    "llama-70b-fsdp2-1024-ranks": fsdp2_1024(LLAMA_70B, (1, 2048)),
    "llama-1.5b-fsdp2-1024-ranks": fsdp2_1024(LLAMA_1_5B, (1, 1024)),
    "llama-1.5b-search-1-2-4-8-ranks": small_rank_search,
    "llama-1.5b-max-batch-size-bf16-autocast": max_batch,
    "llama-8b-max-generate-batch": max_generate,
    "llama-8b-search-1-2-4-8-ranks": rank_search,
}


SIZE_SEARCHES = ("llama-1.5b-max-batch-size-bf16-autocast", "llama-8b-max-generate-batch")


def timed(row: dict[str, Any], way: str, answer: Callable[[], Any]) -> Any:
    """``answer()``, its wall time in ``row[way + "_s"]``; beside it the CPU time of this
    process and of the children it waited for (the forked estimates, the probes) and the host's
    load average as it began: a wall time far above the CPU time per busy core is time spent
    waiting (on the GPU, or on other work on the host), not estimating."""
    import resource

    def cpu() -> float:
        me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    row[f"{way}_load"] = os.getloadavg()[0]
    c0, t0 = cpu(), time.perf_counter()
    found = answer()
    row[f"{way}_s"], row[f"{way}_cpu_s"] = time.perf_counter() - t0, cpu() - c0
    return found


def one(name: str, device: str, traced: bool, in_turn: bool) -> dict[str, Any]:
    from jupyter_gpumem.tuner.estimation import block_replay, forked, search

    answer = CASES[name](device)
    row: dict[str, Any] = {"case": name}
    timed(row, "first", answer)
    replayed = timed(row, "replayed", answer)
    if name in SIZE_SEARCHES:  # the guesses from the line through the totals, as before
        search.PHASE_LINES = False
        try:
            found = timed(row, "total_line", answer)
        finally:
            search.PHASE_LINES = True
        row["total_line_found"] = json.loads(json.dumps(found, default=str))
    if in_turn:  # every estimate made one after the other, as before they were made at once
        forked.ENABLED = False
        try:
            found = timed(row, "in_turn", answer)
        finally:
            forked.ENABLED = True
        row["in_turn_equal"] = json.dumps(found, default=str) == json.dumps(replayed, default=str)
    if traced:
        block_replay.ENABLED = False
        try:
            found = timed(row, "traced", answer)
        finally:
            block_replay.ENABLED = True
        row["equal"] = json.dumps(found, default=str) == json.dumps(replayed, default=str)
        row["speedup"] = row["traced_s"] / row["replayed_s"]
    summary = replayed if isinstance(replayed, (tuple, dict)) else ("ranks", len(replayed))
    row["summary"] = json.loads(json.dumps(summary, default=str))
    return row


def main() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    device = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--device=")), "cpu")
    only = next(
        (a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")), None
    )
    traced = "--no-traced" not in sys.argv
    in_turn = "--in-turn" in sys.argv
    held = (
        [{"id": i, "label": i % 10, "text": f"sample {i}"} for i in range(2_000_000)]
        if "--lived-in" in sys.argv
        else []
    )
    out = Path(args[0] if args else "bench/results/answer_speed_cpu.json")
    rows = []
    for name in CASES:
        if only is not None and name not in only:
            continue
        row = one(name, device, traced, in_turn)
        print(json.dumps(row), flush=True)
        rows.append(row)
        meta = {**meta_of(device), "lived_in_objects": len(held)}
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


def _gpu_name() -> str:
    """The GPU's name, asked in a process of its own: CUDA initialised here would keep the
    next cases from forking their estimates."""
    import subprocess

    code = "import torch; print(torch.cuda.get_device_name())"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    ).stdout.strip()


def meta_of(device: str) -> dict[str, Any]:
    import torch
    import transformers

    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param

        pieces = hasattr(_fsdp_param, "_chunk_with_empty")
    except ImportError:
        pieces = False
    return {
        "device": _gpu_name() if device != "cpu" else "cpu",
        "fsdp2_pieces_on_demand": pieces,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    main()
