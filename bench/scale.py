"""What `%%gpumem` costs on real training cells, as the user feels it: the whole cell.

    python bench/scale.py --out bench/results/scale_h100.json       # GPU machine
    python bench/scale.py --quick --out /tmp/scale.json             # a smoke run, any machine

Cells (GPU): a tiny cell (``_z = 1``); GPT-2 124M for 3 and 10 steps (batch 8 x 1024, fp32
AdamW); a 6 x Linear(512) MLP with Adam for 200 steps at batch 64 (host-bound); a 4-layer
TransformerEncoder(256) with AdamW for 1000 steps. The tiny cell and the same MLP also run on
the CPU, in a child process that sees no CUDA device. ``--quick`` runs small versions of every
cell.

Kernels (``--kernel``): ``fresh`` holds only each cell's own objects; ``lived-in`` first fills
the namespace the way an hour of work does (see :func:`lived_in`): 20,000 live tensors in a
list, ViT-B/16, BERT-base and GPT-2 with AdamW state, a list of 2,000,000 small dicts and a
5,000,000-row DataFrame (the CPU child's kernel holds the same without the three models).
Tiny `%%gpumem` cells then run until the namespace scan has walked everything once; their
times are ``settling_whole_s``. ``both`` runs every cell in a fresh kernel, then every cell
again after the namespace is filled (the fresh figures stay beside the lived-in ones).

Each cell runs through ``shell.run_cell`` in one IPython shell with the extension loaded,
plain and under ``%%gpumem`` alternately, for ``--rounds`` rounds (three times as many for
cells under 2 s) after one untimed run of each. ``whole_s`` is the wall time of ``run_cell`` (the magic's analysis and the report's
display, all of its mime types, included); ``in_cell_s`` is what the cell body timed itself.
``whole_overhead`` is the median over rounds of the two runs' ratio (adjacent runs share the
machine's state, so drift cancels), with the ratios of medians and of minima beside it.
``outside_ms`` is what `%%gpumem` adds outside the body (the median of ``whole_s - in_cell_s``
under it, less the same for plain runs): its start, analysis and display, which the body's own
time does not carry. Where a host's plain runs spread by more than the overhead (a long cell on
a busy host), it and ``in_cell_overhead`` say apart what the ratio of wholes cannot.
``rss_growth_bytes`` is the rise of the process's peak resident memory during the cell
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``), and ``trace_events`` the
allocator (or CPU dispatch) events the analysis received.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

SHORT_CELL_S = 2.0

BODY = """
_t0 = time.perf_counter()
for _step in range({steps}):
    {step}
sync()
_in_cell_s = time.perf_counter() - _t0
"""


@dataclass
class Cell:
    """A training cell: how to build its objects, its step line, and how many steps."""

    name: str
    steps: int
    build: Callable[[torch.device], dict[str, Any]]
    step: str = "train_step()"


@dataclass
class Result:
    cell: str
    device: str
    steps: int
    plain_whole_s: list[float] = field(default_factory=list)
    plain_in_cell_s: list[float] = field(default_factory=list)
    gpumem_whole_s: list[float] = field(default_factory=list)
    gpumem_in_cell_s: list[float] = field(default_factory=list)
    plain_rss_growth_bytes: list[int] = field(default_factory=list)
    gpumem_rss_growth_bytes: list[int] = field(default_factory=list)
    trace_events: list[int] = field(default_factory=list)
    peak_allocated_bytes: int | None = None
    source: str | None = None
    kernel: str = "fresh"
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)

    def summarise(self) -> None:
        med = statistics.median
        pw, gw = med(self.plain_whole_s), med(self.gpumem_whole_s)
        pi, gi = med(self.plain_in_cell_s), med(self.gpumem_in_cell_s)
        pairs = zip(self.gpumem_whole_s, self.plain_whole_s, strict=True)
        self.summary = {
            "plain_whole_s": pw,
            "gpumem_whole_s": gw,
            # each round's two runs are adjacent, so their ratio cancels the machine's drift
            "whole_overhead": med([g / p - 1 for g, p in pairs]),
            "whole_overhead_of_medians": gw / pw - 1,
            "whole_overhead_of_minima": min(self.gpumem_whole_s) / min(self.plain_whole_s) - 1,
            "whole_overhead_ms": (gw - pw) * 1e3,
            "outside_ms": (
                med(w - i for w, i in zip(self.gpumem_whole_s, self.gpumem_in_cell_s, strict=True))
                - med(w - i for w, i in zip(self.plain_whole_s, self.plain_in_cell_s, strict=True))
            )
            * 1e3,
            "plain_in_cell_s": pi,
            "gpumem_in_cell_s": gi,
            "in_cell_overhead": gi / pi - 1,
            "rss_growth_mb": (med(self.gpumem_rss_growth_bytes) - med(self.plain_rss_growth_bytes))
            / 1e6,
            "trace_events": med(self.trace_events) if self.trace_events else 0,
        }


# -- workloads -------------------------------------------------------------------------------
def _gpt2(device: torch.device, quick: bool) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    if quick:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=64)
        batch, seq = 2, 64
    else:
        config, batch, seq = GPT2Config(), 8, 1024
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)

    def train_step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"model": model, "opt": opt, "ids": ids, "train_step": train_step}


def _mlp(device: torch.device, quick: bool) -> dict[str, Any]:
    return mlp(device, 64 if quick else 512)


def mlp(device: torch.device, width: int) -> dict[str, Any]:
    """The host-bound cell's namespace: 6 x Linear(width) with Adam at batch 64."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(6):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=device)

    def train_step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"model": model, "opt": opt, "x": x, "train_step": train_step}


def _encoder(device: torch.device, quick: bool) -> dict[str, Any]:
    d = 32 if quick else 256
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8 if quick else 32, 16 if quick else 128, d, device=device)

    def train_step() -> None:
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"model": model, "opt": opt, "x": x, "train_step": train_step}


def cells(quick: bool, cpu: bool) -> list[Cell]:
    tiny = Cell("tiny", 1, lambda d: {}, step="_z = 1")
    if cpu:
        return [
            replace(tiny, name="tiny_cpu"),
            Cell("mlp_200_steps_cpu", 20 if quick else 200, lambda d: _mlp(d, quick)),
        ]
    return [
        tiny,
        Cell("gpt2_3_steps", 3, lambda d: _gpt2(d, quick)),
        Cell("gpt2_10_steps", 10, lambda d: _gpt2(d, quick)),
        Cell("mlp_200_steps", 20 if quick else 200, lambda d: _mlp(d, quick)),
        Cell("encoder_1000_steps", 30 if quick else 1000, lambda d: _encoder(d, quick)),
    ]


# -- the lived-in kernel ---------------------------------------------------------------------


def lived_in(device: torch.device, quick: bool, models: bool = True) -> dict[str, Any]:
    """What a notebook holds after an hour of work, as namespace entries.

    20,000 live tensors of mixed small sizes in a list (cached features); ViT-B/16, BERT-base
    and GPT-2 (from their configs, random weights) each with AdamW state after one step
    (``models``; the CPU kernel goes without); a list of 2,000,000 small dicts (a dataset as
    Python objects); a 5,000,000-row DataFrame. ``quick`` shrinks the models and the data,
    not the tensor count's order.
    """
    import numpy as np
    import pandas as pd

    n_rows, n_df = (200_000, 500_000) if quick else (2_000_000, 5_000_000)
    torch.manual_seed(0)
    ns: dict[str, Any] = {
        "cached": [torch.randn(64 + 64 * (i % 13), device=device) for i in range(20_000)],
    }
    for name, model in (_three_models(quick) if models else {}).items():
        model = model.to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for p in model.parameters():  # one step's worth of state, without a forward
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ns[name], ns[f"{name}_opt"] = model, opt
    ns["rows"] = [{"id": i, "label": i % 10, "text": f"sample {i}"} for i in range(n_rows)]
    rng = np.random.default_rng(0)
    ns["df"] = pd.DataFrame(
        {"id": np.arange(n_df), "x": rng.random(n_df), "label": rng.integers(0, 10, n_df)}
    )
    return ns


def _three_models(quick: bool) -> dict[str, torch.nn.Module]:
    """ViT-B/16, BERT-base and GPT-2 where their libraries are installed; MLPs of similar
    parameter counts stand in for those that are not (the CPU machine has no transformers)."""
    models: dict[str, torch.nn.Module] = {}
    try:
        from torchvision.models import vit_b_16

        models["vit"] = vit_b_16(image_size=32 if quick else 224)
    except ImportError:
        models["vit"] = _stand_in(12, 64 if quick else 768)
    try:
        from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

        small = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2}
        models["bert"] = BertModel(BertConfig(**(small if quick else {})))
        gpt = {"n_layer": 2, "n_embd": 64, "n_head": 2} if quick else {}
        models["gpt2"] = GPT2LMHeadModel(GPT2Config(**gpt))
    except ImportError:
        models["bert"] = _stand_in(12, 64 if quick else 768)
        models["gpt2"] = _stand_in(12, 64 if quick else 768)
    return models


def _stand_in(blocks: int, width: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * width, width),
        ]
        layers.append(torch.nn.LayerNorm(width))
    return torch.nn.Sequential(*layers)


# -- measuring -------------------------------------------------------------------------------
def _rss_peak_reset() -> int:
    """The current resident bytes, after resetting the peak (Linux; 0 elsewhere)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status("VmRSS")
    except OSError:
        return 0


def _status(key: str) -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Bench:
    def __init__(self, device: torch.device, *, natural_gc: bool = False) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        import jupyter_gpumem.report.build as analysis

        self.device = device
        self.natural_gc = natural_gc  # no collection before each run: they fall where they would
        self.shell = InteractiveShell.instance()
        self.shell.run_line_magic("load_ext", "jupyter_gpumem")
        self.events: list[int] = []
        self.warnings: list[str] = []  # what the cells printed as warnings, first run included
        build = analysis.build_report

        def counting(rec: Any, **kwargs: Any) -> Any:
            n = sum(len(w.events) for d in rec.devices.values() for w in d.windows)
            self.events.append(n + len(rec.cpu_events or ()))
            return build(rec, **kwargs)

        import jupyter_gpumem.session as session

        session.build_report = counting  # type: ignore[assignment]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, cell: Cell, rounds: int, kernel: str = "fresh") -> Result:
        ns = self.shell.user_ns
        ns.update(cell.build(self.device), time=time, sync=self.sync, torch=torch)
        body = BODY.format(steps=cell.steps, step=cell.step)
        result = Result(cell.name, str(self.device), cell.steps, kernel=kernel)
        self.warnings.clear()
        warm, _, _ = self._once(body)  # warm-up: kernels, cuBLAS workspaces, optimizer state
        self._once("%%gpumem --quiet\n" + body)
        if warm < SHORT_CELL_S:  # short cells are noisier: more rounds for the same time
            rounds *= 3
        for i in range(rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            for tracked in order:
                whole, in_cell, rss = self._once(("%%gpumem -o r\n" if tracked else "") + body)
                if tracked:
                    result.gpumem_whole_s.append(whole)
                    result.gpumem_in_cell_s.append(in_cell)
                    result.gpumem_rss_growth_bytes.append(rss)
                    result.trace_events.append(self.events[-1])
                    report = ns["r"]
                    result.peak_allocated_bytes = report.peak_allocated_bytes
                    result.source = report.source
                    result.notes = list(report.notes)
                else:
                    result.plain_whole_s.append(whole)
                    result.plain_in_cell_s.append(in_cell)
                    result.plain_rss_growth_bytes.append(rss)
        for key in ("model", "opt", "ids", "x", "train_step", "r", "_"):
            ns.pop(key, None)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        result.warnings = sorted(set(self.warnings))
        result.summarise()
        return result

    def settle(self) -> list[float]:
        """Run tiny `%%gpumem` cells until the namespace scan has walked every variable once
        (it walks a budget of objects per cell); their whole-cell times, in order."""
        from jupyter_gpumem.held.namespace_scan import SCAN_BUDGET

        self.shell.user_ns.update(time=time, sync=self.sync)
        body = BODY.format(steps=1, step="_z = 1")
        cells = 20_000 // SCAN_BUDGET + 2  # the lived-in kernel's tensor list, a cell a budget
        return [self._once("%%gpumem --quiet\n" + body)[0] for _ in range(cells)]

    def _once(self, source: str) -> tuple[float, float, int]:
        if not self.natural_gc:
            gc.collect()
        self.sync()
        rss = _rss_peak_reset()
        t0 = time.perf_counter()
        with (
            contextlib.redirect_stdout(io.StringIO()),  # the report's text, as a notebook shows it
            warnings.catch_warnings(record=True) as caught,
        ):
            warnings.simplefilter("always")
            outcome = self.shell.run_cell(source)
        whole = time.perf_counter() - t0
        self.warnings.extend(str(w.message) for w in caught)
        outcome.raise_error()
        return whole, float(self.shell.user_ns["_in_cell_s"]), max(0, _status("VmHWM") - rss)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small cells, a smoke run")
    parser.add_argument("--cpu", action="store_true", help="(internal) the CPU cell only")
    parser.add_argument("--only", nargs="*", help="cell names to run")
    parser.add_argument(
        "--kernel",
        choices=("fresh", "lived-in", "both"),
        default="both",
        help="what the kernel holds besides each cell's objects (default: both, fresh first)",
    )
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device("cuda" if cuda else "cpu")
    bench = Bench(device)
    results = []
    settling: list[float] = []
    kernels = ["fresh", "lived-in"] if args.kernel == "both" else [args.kernel]
    for kernel in kernels:
        if kernel == "lived-in":
            t0 = time.perf_counter()
            bench.shell.user_ns.update(lived_in(device, args.quick, models=cuda))
            gc.collect()
            print(f"lived-in kernel filled in {time.perf_counter() - t0:.1f} s", flush=True)
            settling = bench.settle()
            print(
                f"namespace scan settled in {len(settling)} tiny cells, "
                f"{1e3 * max(settling):.0f} ms at most",
                flush=True,
            )
        for cell in cells(args.quick, cpu=not cuda):
            if args.only and cell.name not in args.only:
                continue
            try:
                results.append(asdict(bench.run(cell, args.rounds, kernel)))
            except ImportError as exc:  # transformers, where it is not installed
                results.append({"cell": cell.name, "kernel": kernel, "skipped": repr(exc)})
            shown = ("cell", "kernel", "summary", "skipped", "warnings")
            print(json.dumps({k: v for k, v in results[-1].items() if k in shown}), flush=True)
    if cuda and not args.cpu:
        results.extend(_cpu_child(args))
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "rounds": args.rounds,
        "quick": args.quick,
        "kernel": args.kernel,
        "settling_whole_s": settling,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


def _cpu_child(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The CPU cell in a process that sees no CUDA device, as on a machine without one."""
    out = args.out.with_suffix(".cpu.json")
    cmd = [sys.executable, __file__, "--cpu", "--out", str(out), "--rounds", str(args.rounds)]
    cmd += ["--kernel", args.kernel]
    if args.quick:
        cmd.append("--quick")
    if args.only:
        cmd += ["--only", *args.only]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    subprocess.run(cmd, check=True, env=env)
    results: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    out.unlink()
    return results


if __name__ == "__main__":
    main()
