"""CPU cost of the server's NVML sampler thread (target: <= 1% of one core at 1 Hz, 8 GPUs).

    python bench/sampler_cpu.py out.json                   # the stand-in, 8 fake GPUs
    python bench/sampler_cpu.py out.json --backend real    # the machine's GPUs

The thread's own CPU time is read two ways: ``time.thread_time()`` inside the thread and
``/proc/self/task/<tid>/stat`` from outside (10 ms ticks). The steady-state figure leaves out
the first pass, which includes NVML initialisation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpumem.nvml.library import NvmlBackend
from jupyter_gpumem.nvml.sampler import Sampler
from tests.support.nvml_fake import FakeNvml

GiB = 2**30


def fake_spec(gpus: int, processes: int) -> dict[str, Any]:
    """``gpus`` busy H100s with ``processes`` processes each (pids of this process's family)."""
    pids = [os.getpid(), os.getppid()]
    return {
        "devices": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": f"GPU-bench-{i}",
                "memory_total_bytes": 80 * GiB,
                "memory_used_bytes": (i + 1) * GiB,
                "utilization_percent": 50,
                "temperature_c": 50,
                "power_w": 300.0,
                "processes": [
                    {"pid": pids[k % len(pids)] + 100 * k, "memory_bytes": GiB}
                    for k in range(processes)
                ],
            }
            for i in range(gpus)
        ]
    }


def proc_cpu_s(native_id: int) -> float | None:
    """utime + stime of one thread, from /proc (None off Linux)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where to write the JSON result")
    parser.add_argument("--backend", choices=("fake", "real"), default="fake")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs (stand-in only)")
    parser.add_argument("--processes", type=int, default=3, help="processes per fake GPU")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds to run")
    args = parser.parse_args()

    if args.backend == "fake":
        backend = FakeNvml.from_spec(fake_spec(args.gpus, args.processes)).backend(
            use_environment=False
        )
    else:
        backend = NvmlBackend(use_environment=False)
    sampler = Sampler(backend, interval_s=args.interval, history_s=max(60.0, args.duration))
    start_wall = time.monotonic()
    sampler.start()
    first = sampler.wait_first(30.0)
    assert sampler.thread is not None and sampler.thread.native_id is not None
    tid = sampler.thread.native_id
    warm_wall, warm_cpu, warm_proc = time.monotonic(), sampler.cpu_time_s, proc_cpu_s(tid)
    time.sleep(args.duration)
    end_wall, end_cpu, end_proc = time.monotonic(), sampler.cpu_time_s, proc_cpu_s(tid)
    passes = sampler.passes
    sampler.stop()

    steady_wall = end_wall - warm_wall
    steady_percent = 100.0 * (end_cpu - warm_cpu) / steady_wall
    proc_percent = (
        100.0 * (end_proc - warm_proc) / steady_wall
        if end_proc is not None and warm_proc is not None
        else None
    )
    devices = len(first.devices) if first is not None else 0
    result = {
        "backend": args.backend,
        "available": first.available if first is not None else False,
        "reason": first.reason if first is not None else "no sample",
        "devices": devices,
        "device_names": sorted({d.name or "?" for d in first.devices}) if first else [],
        "interval_s": args.interval,
        "duration_s": round(end_wall - start_wall, 3),
        "passes": passes,
        "first_pass_cpu_s": round(warm_cpu, 6),
        "steady_cpu_s": round(end_cpu - warm_cpu, 6),
        "steady_cpu_percent_of_one_core": round(steady_percent, 4),
        "proc_stat_cpu_percent_of_one_core": (
            round(proc_percent, 4) if proc_percent is not None else None
        ),
        "per_pass_ms": round(1000.0 * (end_cpu - warm_cpu) / max(1, passes - 1), 4),
        "target_percent": 1.0,
        "meets_target": steady_percent <= 1.0,
        "python": platform.python_version(),
        "machine": platform.node(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"sampler_cpu backend={args.backend} devices={devices} interval={args.interval}s "
        f"passes={passes}: {steady_percent:.3f}% of one core "
        f"({result['per_pass_ms']} ms/pass; /proc: {result['proc_stat_cpu_percent_of_one_core']}%)"
        f" target<=1% {'OK' if result['meets_target'] else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
