"""Step-time overhead of `%%gpumem` on a GPT-2 124M training step, next to torch's own tools.

    python bench/gpt2_overhead.py --out results.json            # GPU: 124M, batch 8 x 1024, fp32
    python bench/gpt2_overhead.py --out r.json --small          # tiny model, CPU without CUDA

Every configuration runs in this one process, interleaved: R rounds, each running every
configuration once for K steps in a rotated order. A configuration's step time is the median
over rounds of (K-step block time) / K, with the device synchronised around the block. Ratios
are taken against ``plain_cell`` (the same cell body through ``shell.run_cell`` without the
magic, so IPython's own cost cancels) for the ``gpumem*`` rows and against ``plain`` otherwise.

Cell rows time the steps inside the cell body, so the step overhead is the cost of recording;
what the magic adds around the body (snapshot, analysis, report) is ``analysis_s``: the
``run_cell`` time minus the report's ``wall_s``, less IPython's own share measured on
``plain_cell``. ``display_s`` times ``report._repr_mimebundle_()``. Hooks, profilers and
trackers are entered and left outside the timed block; leaving them is reported as
``teardown_s``. Before each block: ``gc.collect()``, ``empty_cache()`` and one untimed step, so
every configuration starts from the same allocator and optimizer state.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

CONFIGS = (
    "plain",
    "plain_cell",
    "gpumem",
    "gpumem_no_trace",
    "record_memory_history",
    "profiler",
    "memtracker",
)
BASELINE = {
    "plain_cell": "plain",
    "gpumem": "plain_cell",
    "gpumem_no_trace": "plain_cell",
    "record_memory_history": "plain",
    "profiler": "plain",
    "memtracker": "plain",
}
CELL_BODY = "_bench_block_s = train_block()\n"
CELL_MAGICS = {
    "plain_cell": "",
    "gpumem": "%%gpumem --quiet -o r\n",
    "gpumem_no_trace": "%%gpumem --no-trace --quiet\n",
}
WARMUP_STEPS = 3


@dataclass
class Workload:
    """Model, optimizer and batch of one training step; ``block()`` times K steps."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    input_ids: torch.Tensor
    steps: int
    device: torch.device

    def step(self) -> None:
        loss = self.model(input_ids=self.input_ids, labels=self.input_ids).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def block(self, before_step: Callable[[], None] | None = None) -> float:
        """Seconds for ``steps`` steps, synchronised on both sides."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(self.steps):
            if before_step is not None:
                before_step()
            self.step()
        self.sync()
        return time.perf_counter() - t0

    def settle(self) -> None:
        """Free what can be freed, then one untimed step to bring the allocator back."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.step()
        self.sync()


@dataclass
class Row:
    """What one configuration measured, round by round."""

    status: str = "ok"
    block_s: list[float] = field(default_factory=list)
    cell_s: list[float] = field(default_factory=list)  # whole shell.run_cell
    teardown_s: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def build_workload(args: argparse.Namespace, device: torch.device) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel

    if args.small:
        config = GPT2Config(
            n_layer=2,
            n_embd=128,
            n_head=2,
            vocab_size=1000,
            n_positions=args.seq,
            bos_token_id=0,
            eos_token_id=0,
        )
    else:
        config = GPT2Config()
    torch.manual_seed(0)
    model: torch.nn.Module = GPT2LMHeadModel(config)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=device)
    return Workload(model, optimizer, input_ids, args.steps, device)


class Runner:
    """Runs each configuration once; keeps the IPython shell with the extension loaded."""

    def __init__(self, work: Workload) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        self.work = work
        self.cuda = work.device.type == "cuda"
        self.shell = InteractiveShell.instance()
        manager = self.shell.extension_manager
        self._loaded_here = manager is None or "jupyter_gpumem" not in manager.loaded
        self.shell.run_line_magic("load_ext", "jupyter_gpumem")
        self.shell.user_ns.update(
            model=work.model,
            optimizer=work.optimizer,
            input_ids=work.input_ids,
            train_step=work.step,
            train_block=work.block,
        )

    def close(self) -> None:
        for name in ("model", "optimizer", "input_ids", "train_step", "train_block", "r"):
            self.shell.user_ns.pop(name, None)
        if self._loaded_here:
            self.shell.run_line_magic("unload_ext", "jupyter_gpumem")

    def run(self, name: str, row: Row) -> None:
        if name == "plain":
            self._plain(row)
        elif name in CELL_MAGICS:
            self._cell(name, row)
        else:
            self._anchor(name, row)

    def _plain(self, row: Row) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.work.device)
        row.block_s.append(self.work.block())
        if self.cuda:
            row.extra["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(
                self.work.device
            )

    def _cell(self, name: str, row: Row) -> None:
        ns = self.shell.user_ns
        ns.pop("_bench_block_s", None)
        ns.pop("r", None)
        t0 = time.perf_counter()
        result = self.shell.run_cell(CELL_MAGICS[name] + CELL_BODY, store_history=True)
        total = time.perf_counter() - t0
        result.raise_error()
        if "_bench_block_s" not in ns:
            raise RuntimeError(f"{name}: the cell body did not run")
        row.block_s.append(ns["_bench_block_s"])
        row.cell_s.append(total)
        if name == "plain_cell":
            row.extra.setdefault("ipython_s", []).append(total - ns["_bench_block_s"])
        if name != "gpumem":
            return
        report = ns["r"]
        row.extra.setdefault("magic_s", []).append(total - report.wall_s)
        t0 = time.perf_counter()
        report._repr_mimebundle_()
        row.extra.setdefault("display_s", []).append(time.perf_counter() - t0)
        row.extra.update(
            peak_allocated_bytes=report.peak_allocated_bytes,
            source=report.source,
            notes=list(report.notes),
            warnings=list(report.warnings),
        )

    def _anchor(self, name: str, row: Row) -> None:
        with anchor(name, self.work) as tool:
            row.block_s.append(self.work.block(tool.before_step))
        row.teardown_s.append(tool.teardown_s)


@dataclass
class Tool:
    """A tool entered around the block: its per-step call, and the time spent leaving it."""

    before_step: Callable[[], None] | None = None
    teardown_s: float = 0.0


@contextlib.contextmanager
def anchor(name: str, work: Workload) -> Iterator[Tool]:
    """Enter one of torch's own memory tools around the block."""
    tool = Tool()
    if name == "record_memory_history":
        record = torch.cuda.memory._record_memory_history
        record(enabled="all", context="all", stacks="python")
        leave: Callable[[], Any] = lambda: record(enabled=None)  # noqa: E731
    elif name == "profiler":
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if work.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, profile_memory=True, record_shapes=False)
        prof.__enter__()
        leave = lambda: prof.__exit__(None, None, None)  # noqa: E731
    elif name == "memtracker":
        from torch.distributed._tools.mem_tracker import MemTracker

        mt = MemTracker()
        mt.track_external(work.model, work.optimizer)
        mt.__enter__()
        # MemTracker refuses a second forward of a module unless its stats are reset.
        tool.before_step = mt.reset_mod_stats
        leave = lambda: mt.__exit__(None, None, None)  # noqa: E731
    else:
        raise ValueError(f"unknown configuration {name!r}")
    try:
        yield tool
    finally:
        t0 = time.perf_counter()
        leave()
        tool.teardown_s = time.perf_counter() - t0


def skip_reason(name: str, cuda: bool) -> str | None:
    """Why a configuration cannot run here; None when it can."""
    if name == "record_memory_history" and not cuda:
        return "skipped: no CUDA"
    if name == "memtracker":
        try:
            from torch.distributed._tools.mem_tracker import MemTracker
        except ImportError as exc:
            return f"unavailable: {exc}"
        if not hasattr(MemTracker, "track_external"):
            return "unavailable: MemTracker has no track_external in this torch"
    return None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the interleaved rounds and return the results record."""
    cuda = torch.cuda.is_available()
    if not cuda and not args.small:
        raise SystemExit("gpt2_overhead.py needs CUDA for the full model; use --small on CPU")
    device = torch.device("cuda" if cuda else "cpu")
    work = build_workload(args, device)
    rows = {name: Row() for name in CONFIGS}
    for name, row in rows.items():
        row.status = skip_reason(name, cuda) or "ok"
    for _ in range(WARMUP_STEPS):
        work.step()
    work.sync()
    runner = Runner(work)
    try:
        for rnd in range(args.rounds):
            k = rnd % len(CONFIGS)
            for name in CONFIGS[k:] + CONFIGS[:k]:
                row = rows[name]
                if row.status != "ok":
                    continue
                work.settle()
                try:
                    runner.run(name, row)
                except Exception as exc:  # one broken tool must not lose the other rows
                    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
                    row.status = f"failed: {last}"
                    traceback.print_exc()
    finally:
        runner.close()
    return summarise(args, rows, device, work)


def summarise(
    args: argparse.Namespace, rows: dict[str, Row], device: torch.device, work: Workload
) -> dict[str, Any]:
    configs: dict[str, dict[str, Any]] = {}
    for name, row in rows.items():
        entry: dict[str, Any] = {"status": row.status}
        if row.status == "ok" and row.block_s:
            per_step = [b / args.steps for b in row.block_s]
            entry.update(step_s=statistics.median(per_step), step_s_rounds=per_step)
            if row.cell_s:
                entry["cell_s"] = statistics.median(row.cell_s)
            if row.teardown_s:
                entry["teardown_s"] = statistics.median(row.teardown_s)
            entry.update(
                {
                    k: v
                    for k, v in row.extra.items()
                    if k not in ("magic_s", "display_s", "ipython_s")
                }
            )
        configs[name] = entry
    for name, base in BASELINE.items():
        a, b = configs[name].get("step_s"), configs[base].get("step_s")
        configs[name]["baseline"] = base
        configs[name]["overhead"] = a / b - 1 if a is not None and b else None
    gm, pc = rows["gpumem"].extra, rows["plain_cell"].extra
    ipython_s = statistics.median(pc["ipython_s"]) if pc.get("ipython_s") else 0.0
    magic_s = statistics.median(gm["magic_s"]) if gm.get("magic_s") else None
    display_s = statistics.median(gm["display_s"]) if gm.get("display_s") else None
    analysis_s = None if magic_s is None else max(magic_s - ipython_s, 0.0)
    n_params = sum(p.numel() for p in work.model.parameters())
    return {
        "benchmark": "gpt2_overhead",
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "ipython": _version("IPython"),
        "python": platform.python_version(),
        "model": {
            "small": args.small,
            "parameters": n_params,
            "batch": args.batch,
            "seq": args.seq,
            "dtype": "float32",
            "optimizer": "AdamW (foreach default)",
            "attn_implementation": getattr(work.model.config, "_attn_implementation", None),
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup_steps": WARMUP_STEPS,
        "configs": configs,
        "analysis_s": analysis_s,  # magic's own time around a K-step cell, IPython's share removed
        "analysis_raw_s": magic_s,  # run_cell time minus report.wall_s
        "ipython_s": ipython_s,  # run_cell time minus body time, plain_cell
        "display_s": display_s,
        "peak": {
            "plain_max_memory_allocated_bytes": configs["plain"].get("max_memory_allocated_bytes"),
            "gpumem_peak_allocated_bytes": configs["gpumem"].get("peak_allocated_bytes"),
            "gpumem_source": configs["gpumem"].get("source"),
        },
        "analysis_plus_display_s": None
        if analysis_s is None or display_s is None
        else analysis_s + display_s,
    }


def _version(module: str) -> str | None:
    mod = sys.modules.get(module)
    return getattr(mod, "__version__", None) if mod else None


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"{results['device']}, torch {results['torch']}, {results['model']['parameters'] / 1e6:.1f}M params, "
        f"batch {results['model']['batch']} x {results['model']['seq']}, "
        f"{results['rounds']} rounds x {results['steps']} steps",
        "",
        "| configuration | step ms | overhead vs baseline |",
        "| --- | --- | --- |",
    ]
    for name, c in results["configs"].items():
        if c.get("step_s") is None:
            lines.append(f"| {name} | {c['status']} | |")
            continue
        overhead = (
            f"{c['overhead'] * 100:+.1f}% vs {c['baseline']}"
            if c.get("overhead") is not None
            else ""
        )
        lines.append(f"| {name} | {c['step_s'] * 1e3:.1f} | {overhead} |")
    lines.append("")
    for key in ("analysis_s", "display_s", "analysis_plus_display_s", "ipython_s"):
        value = results[key]
        lines.append(f"{key}: {'n/a' if value is None else f'{value * 1e3:.1f} ms'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="write the JSON results here")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="training steps per configuration run")
    p.add_argument("--batch", type=int, default=None, help="default 8 (2 with --small)")
    p.add_argument("--seq", type=int, default=None, help="default 1024 (64 with --small)")
    p.add_argument("--small", action="store_true", help="tiny GPT-2; runs on CPU without CUDA")
    args = p.parse_args(argv)
    args.batch = args.batch or (2 if args.small else 8)
    args.seq = args.seq or (64 if args.small else 1024)
    for name in ("rounds", "steps", "batch", "seq"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results = measure(args)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
