"""The model zoo on the GPU: every case estimated from the meta device beside the same case measured.

    python bench/model_zoo.py bench/results/model_zoo_<kind>.json [--only CASE ...] [--jobs N]
    python bench/model_zoo.py --table bench/results/model_zoo_<kind>.json   # the README's table

Each case (:mod:`zoo`) runs in a process of its own. The model is built on the meta device and
estimated: ``Trial.estimate()`` for training and inference rows, ``estimate_generate`` for
``generate`` rows. Then the same architecture is built on the GPU with random weights and
measured as a user reads it: ``max_memory_allocated()`` and ``max_memory_reserved()`` after
``reset_peak_memory_stats()`` around ``Trial.run()`` or ``generate``. Error = estimate /
measured - 1; targets: allocated within 2%, reserved within 5%.

The "fits" promise: at a budget 1.6 times the row's estimate, ``max_batch_size`` (training)
or ``max_generate_batch`` (LMs) answers n from the meta model; batches n and n + 1 then run on
the GPU, with nothing else of the case held (the row's own batch is let go first, as the
estimates of n were made without it). n must measure within the budget and n + 1 over it;
``fits_estimated`` keeps the estimates of both beside ``fits_measured``.

Cases run ``--jobs`` at a time on the one GPU: each process reads its own allocator's counters,
which other processes do not touch (estimate times are then those of a shared host). Each has
an Inductor cache of its own, empty: a compiled case compiles as on a fresh machine, its
kernels benchmarked, never taken from another case's compile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo

BUDGET_FACTOR = 1.6


# -- the estimate --------------------------------------------------------------------------------
def trial_of(case: zoo.Case, built: zoo.Built, device: str, batch: Any = None) -> Any:
    """The Trial a user would make of ``built`` for ``case``."""
    import torch

    from jupyter_gpumem.tuner.trial import Trial

    batch = built.batch if batch is None else batch
    if case.workload == "inference":
        return Trial(
            built.model, batch, built.loss, inference=True, warmup=1, steps=2, device=device
        )
    params = [p for p in built.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    return Trial(built.model, batch, built.loss, optimizer=opt, warmup=1, steps=2, device=device)


def config_of(case: zoo.Case) -> Any:
    from jupyter_gpumem.techniques import Config

    if case.workload == "inference":
        return Config(precision=case.precision, inference_mode=True)
    return Config(precision=case.precision)


def generate_kwargs(case: zoo.Case, new: int) -> dict[str, Any]:
    """generate's arguments: every sequence runs all its new tokens, as the estimate assumes."""
    return {"pad_token_id": 0, "min_new_tokens": new, **case.generate}


def estimate(case: zoo.Case, size: str, device: str) -> tuple[Any, Any]:
    """(the estimate of ``case`` from the meta device, the meta Built)."""
    from jupyter_gpumem import estimate_generate

    built = case.build("meta", size)
    if case.workload == "generate":
        batch, prompt, new = zoo.GENERATE[size]
        found = estimate_generate(
            built.model, batch_size=batch, prompt_tokens=prompt, max_new_tokens=new,
            device=device, **generate_kwargs(case, new),
        )  # fmt: skip
        return found, built
    return trial_of(case, built, device).estimate(config=config_of(case)), built


def largest_batch(
    case: zoo.Case, built: zoo.Built, size: str, budget: int, device: str
) -> tuple[int, list[tuple[int, int | None, int | None]]]:
    """The batch the estimator says fits ``budget``, and the estimates (batch, allocated,
    reserved) of it and of one more."""
    from jupyter_gpumem import max_generate_batch

    if case.workload == "generate":
        _, prompt, new = zoo.GENERATE[size]
        search = max_generate_batch(
            built.model, budget, prompt_tokens=prompt, max_new_tokens=new, device=device,
            **generate_kwargs(case, new),
        )  # fmt: skip
    else:
        trial = trial_of(case, built, device)
        trial.max_batch_size(budget, built.make_batch, config=config_of(case))
        search = trial.last_search
    n = search.batch_size
    estimates = [
        (m, e.peak_bytes, e.peak_reserved_bytes)
        for m, e in ((n, search.estimate), (n + 1, search.above))
        if e is not None
    ]
    return n, estimates


# -- the measurement -----------------------------------------------------------------------------
def measured(case: zoo.Case, built: zoo.Built, size: str, n: int | None = None) -> tuple[int, int]:
    """(peak allocated, peak reserved) of the case's run on the GPU, batch ``n`` or the row's."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # as after loading weights: what building them left cached goes
    torch.cuda.reset_peak_memory_stats()
    if case.workload == "generate":
        batch, prompt, new = zoo.GENERATE[size]
        batch = n or batch
        ids = torch.randint(1, 100, (batch, prompt), device="cuda")
        with torch.no_grad():
            out = built.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                **generate_kwargs(case, new),
            )  # fmt: skip
        assert out.shape[-1] == prompt + new, out.shape
        del out, ids
    else:
        batch = None if n is None else built.make_batch(n)
        result = trial_of(case, built, "cuda", batch).run(config_of(case))
        assert result.status == "ok", (result.status, getattr(result, "error", None))
        del result, batch
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()


def one(name: str, size: str, fits: bool = True) -> dict[str, Any]:
    import torch

    case = zoo.case(name)
    row: dict[str, Any] = {"case": name, "family": case.family, "workload": case.workload}
    row.update(precision=case.precision, dtype=case.dtype, attention=case.attention)
    t0 = time.perf_counter()
    found, meta = estimate(case, size, "cuda")
    row["estimate_s"] = time.perf_counter() - t0
    row["nothing_materialised"] = all(p.is_meta for p in meta.model.parameters())
    row["label"] = found.label
    row["reason"] = found.reason
    row["estimated_allocated"] = found.peak_bytes
    row["estimated_reserved"] = found.peak_reserved_bytes
    row["breakdown"] = found.breakdown
    row["phase"] = found.phase
    row["notes"] = list(found.notes)
    answer = None
    if found.peak_bytes is not None and fits:
        budget = int(found.peak_bytes * BUDGET_FACTOR)
        t0 = time.perf_counter()
        try:
            answer, row["fits_estimated"] = largest_batch(case, meta, size, budget, "cuda")
        except Exception as exc:
            row["fits_error"] = f"{type(exc).__name__}: {exc}"
        row.update(budget=budget, fits_batch=answer, fits_search_s=time.perf_counter() - t0)
    del meta, found
    real = case.build("cuda", size)
    allocated, reserved = measured(case, real, size)
    row.update(measured_allocated=allocated, measured_reserved=reserved)
    if row["estimated_allocated"] is not None:
        row["error_allocated_pct"] = 100 * (row["estimated_allocated"] / allocated - 1)
        row["error_reserved_pct"] = 100 * (row["estimated_reserved"] / reserved - 1)
    if answer is not None:
        # batches n and n + 1 alone, as they were estimated: the row's own batch goes first
        real = zoo.Built(real.model, None, real.loss, real.make_batch)
        row["fits_measured"] = [(n, *measured(case, real, size, n)) for n in (answer, answer + 1)]
        over = row["fits_measured"][0][1] > row["budget"]
        row["fits_then_over_budget"] = over
        row["one_more_fits"] = row["fits_measured"][1][1] <= row["budget"]
    row.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    row["transformers"] = __import__("transformers").__version__
    return row


# -- the table -----------------------------------------------------------------------------------
def _gb(n: int | None) -> str:
    return "" if n is None else f"{n / 1e9:.3f}"


# rows a results file keeps from a run of earlier code (its "code" field), marked in the table
EARLIER = {"grad_sums": " ²", "workspace_probes": " ³"}


def table(results: dict[str, Any]) -> str:
    """The README's markdown table of a results file."""
    lines = [
        "| case | workload | estimated alloc. / res. (GB) | measured alloc. / res. (GB) "
        "| error alloc. / res. | estimate | fits n (n+1) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["cases"]:
        if "failed" in r:
            lines.append(f"| {r['case']} | | | | failed to run ({r['failed']}) | | |")
            continue
        measured = f"{_gb(r['measured_allocated'])} / {_gb(r['measured_reserved'])}"
        if r["estimated_allocated"] is None:
            cells = ["refused", measured, r["reason"].replace("|", "/")[:160], "", ""]
        else:
            fits = ""
            if r.get("fits_measured"):
                (n, a, _), (_, a1, _) = r["fits_measured"]
                ok = "ok" if a <= r["budget"] < a1 else ("OOM" if a > r["budget"] else "left one")
                fits = f"{n} ({ok})"
            cells = [
                f"{_gb(r['estimated_allocated'])} / {_gb(r['estimated_reserved'])}",
                measured,
                f"{r['error_allocated_pct']:+.2f}% / {r['error_reserved_pct']:+.2f}%",
                f"{r['estimate_s']:.1f} s",
                fits,
            ]
        name = r["case"] + (" ¹" if r.get("from_first_run") else EARLIER.get(r.get("code"), ""))
        lines.append(
            f"| {name} | {r['workload']} {r['precision'] or r['dtype']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """How many rows meet the targets, how many are refused, and the "fits" promise's count."""
    rows = [r for r in results["cases"] if "failed" not in r]
    estimated = [r for r in rows if r["estimated_allocated"] is not None]
    within = [
        r
        for r in estimated
        if abs(r["error_allocated_pct"]) <= 2 and abs(r["error_reserved_pct"]) <= 5
    ]
    answered = [r for r in estimated if r.get("fits_measured")]
    over = [r["case"] for r in answered if r["fits_then_over_budget"]]
    left = [r["case"] for r in answered if r["one_more_fits"]]
    return (
        f"{len(rows)} rows: {len(within)} within 2% allocated and 5% reserved, "
        f"{len(estimated) - len(within)} outside, {len(rows) - len(estimated)} refused; "
        f"'fits' answers: {len(answered)}, followed by an out-of-memory (over the budget): "
        f"{len(over)} {over or ''}, leaving a batch on the table: {len(left)} {left or ''}"
    )


def main() -> None:
    names = [c.name for c in zoo.CASES]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--only", choices=names, action="append")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--size", choices=zoo.SIZES, default="bench")
    parser.add_argument("--table", action="store_true", help="print the table of OUTPUT")
    parser.add_argument("--no-fits", action="store_true", help="estimate and measure only")
    parser.add_argument("--case", choices=names, help=argparse.SUPPRESS)  # one, in this process
    args = parser.parse_args()
    if args.table:
        results = json.loads(args.output.read_text())
        print(table(results), summary(results), sep="\n\n")
        return
    if args.case:
        args.output.write_text(
            json.dumps(one(args.case, args.size, not args.no_fits), indent=1, default=str)
        )
        return
    chosen = [zoo.case(n) for n in (args.only or names)]
    results: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def save() -> None:  # after every case: a run cut short keeps what it measured
        with lock:
            ordered = [results[c.name] for c in chosen if c.name in results]
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(
                json.dumps(
                    {"machine": platform.node(), "size": args.size, "cases": ordered}, indent=1
                )
            )

    def run(case: zoo.Case) -> None:
        missing = zoo.available(case)
        if missing is not None:
            results[case.name] = {"case": case.name, "failed": missing}
            save()
            return
        part = args.output.with_suffix(f".{case.name}.json")
        cmd = [sys.executable, __file__, str(part), "--case", case.name, "--size", args.size]
        cmd += ["--no-fits"] if args.no_fits else []
        with tempfile.TemporaryDirectory() as cache:  # compiled as on a fresh machine
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            done = subprocess.run(cmd, text=True, capture_output=True, env=env)
        if done.returncode or not part.exists():
            tail = (done.stderr or "").strip().splitlines()[-1:] or [""]
            results[case.name] = {"case": case.name, "failed": f"{done.returncode}: {tail[0]}"}
            print(f"{case.name}: failed\n{done.stderr[-3000:]}", flush=True)
            save()
            return
        results[case.name] = json.loads(part.read_text())
        part.unlink()
        save()
        r = results[case.name]
        print(
            json.dumps({k: v for k, v in r.items() if k not in ("breakdown", "notes")}), flush=True
        )

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(run, chosen))
    save()


if __name__ == "__main__":
    main()
