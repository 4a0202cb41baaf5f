"""`history` under load on a real Jupyter Server, and what it does to `health` meanwhile.

    python bench/server_history.py bench/results/server_history_cpu.json

Starts a Jupyter Server in this process on 127.0.0.1 (a random port, a random token, config
and data in a temporary folder) with the extension on the NVML stand-in: 8 GPUs x 16
processes sampled every 0.25 s. The sampler's ring buffer is filled at once with a full
history (10 minutes, 2400 samples) of synthetic samples shaped like the stand-in's. A
client in a subprocess (so that it does not share this process's interpreter) then, for
each scenario, sends a bounded number of ``history`` requests, ``--concurrency`` at a time,
while it times ``health`` in a loop; first ``health`` alone, for reference.

Scenarios (every page asked for counts as one request):
    full      ``history`` without a query: what a client that asks for everything gets
    pages     the whole history, every sample, page after page (``next_since``)
    sidebar   the sidebar's backfill: the requests its model sends on a page load, for
              its default 5-minute window polled every second
    legacy    the sidebar's backfill before issue 41: ``history?since=<now - 300>``

Targets: ``history`` p99 <= 200 ms and ``health`` p99 < 50 ms while history is hammered.
``bench/results/server_history_cpu_before.json`` is this benchmark run on the code before
history had pages (258687b, with `Sampler.extend` added to fill the buffer), by copying
this file into an export of that commit.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GiB = 2**30
HISTORY_TARGET_MS = 200.0
HEALTH_TARGET_MS = 50.0
SIDEBAR_WINDOW_S = 300.0  # the sidebar's default historyMinutes (5)
SIDEBAR_STEP_S = 1.0  # the sidebar's default poll interval
MAX_PAGES = 1000
SCENARIOS = ("full", "pages", "sidebar", "legacy")


def fake_spec(gpus: int, processes: int) -> dict[str, Any]:
    """Busy H100s with long command lines (about 26 kB a sample at 8 x 16, as in the issue)."""
    return {
        "driver_version": "550.54.15",
        "devices": [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": f"GPU-bench-{i:02d}-0000-4000-8000-000000000000",
                "memory_total_bytes": 80 * GiB,
                "memory_used_bytes": (i + 1) * GiB,
                "utilization_percent": 50,
                "temperature_c": 50,
                "power_w": 300.0,
                "processes": [
                    {
                        "pid": 100_000 + 100 * i + k,
                        "command": f"/opt/conda/envs/train/bin/python -m torch.distributed.run "
                        f"--nproc_per_node=8 train.py --config configs/run-{i}-{k}.yaml "
                        f"--output /scratch/runs/{i:02d}/{k:02d}",
                        "memory_bytes": (k + 1) * 2**26,
                    }
                    for k in range(processes)
                ],
            }
            for i in range(gpus)
        ],
    }


def synthetic_history(spec: dict[str, Any], interval_s: float, count: int) -> list[Any]:
    """``count`` samples ending now, every ``interval_s``; memory varies from one to the next."""
    from tests.support.nvml_fake import FakeNvml

    backend = FakeNvml.from_spec(spec).backend(use_environment=False)
    template = backend.read(interval_s)
    backend.close()
    now = time.time()
    samples = []
    for n in range(count):
        devices = tuple(
            dataclasses.replace(d, memory_used_bytes=(d.memory_used_bytes or 0) + n * 4096)
            for d in template.devices
        )
        at = now - (count - n) * interval_s
        samples.append(dataclasses.replace(template, time=at, devices=devices))
    return samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values_ms: list[float]) -> dict[str, Any]:
    def rounded(q: float) -> float | None:
        value = percentile(values_ms, q)
        return round(value, 2) if value is not None else None

    return {
        "count": len(values_ms),
        "p50_ms": rounded(50),
        "p99_ms": rounded(99),
        "max_ms": round(max(values_ms), 2) if values_ms else None,
    }


# --- the client (a subprocess) ----------------------------------------------------------


Get = Callable[[str], Awaitable[tuple[float, bytes]]]


async def health_loop(get: Get, stop: asyncio.Event, out: list[float]) -> None:
    """Time ``health`` every 10 ms until ``stop``."""
    while not stop.is_set():
        elapsed, _ = await get("health")
        out.append(elapsed)
        await asyncio.sleep(0.01)


async def hammer(get: Get, scenario: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options["requests"]`` history requests of ``scenario``, ``concurrency`` at a time,
    with ``health`` timed meanwhile; stops early at ``time_limit_s``."""
    history_ms: list[float] = []
    health_ms: list[float] = []
    sizes: list[float] = []
    left = options["requests"]
    deadline = time.monotonic() + options["time_limit_s"]

    async def one(path: str) -> float | None:
        """One request; the answer's ``next_since``, read from its end (parsing a whole
        page would cost this client more than the server)."""
        elapsed, body = await get(path)
        history_ms.append(elapsed)
        sizes.append(len(body))
        key = body.rfind(b'"next_since":')
        return json.loads(body[key + len(b'"next_since":') : -1]) if key >= 0 else None

    async def backfill() -> None:
        nonlocal left
        if scenario == "full":
            await one("history")
            return
        if scenario == "legacy":
            await one(f"history?since={time.time() - SIDEBAR_WINDOW_S}")
            return
        if scenario == "sidebar":
            query = f"view=memory&step={SIDEBAR_STEP_S}&since={time.time() - SIDEBAR_WINDOW_S}"
        else:  # every page of the whole history
            query = "view=full"
        for _ in range(MAX_PAGES):
            since = await one(f"history?{query}")
            if since is None or left <= 0:
                return
            left -= 1
            query = query.split("&since=")[0] + f"&since={since}"

    async def worker() -> None:
        nonlocal left
        while left > 0 and time.monotonic() < deadline:
            left -= 1
            await backfill()

    stop = asyncio.Event()
    health = asyncio.create_task(health_loop(get, stop, health_ms))
    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(options["concurrency"])))
    wall = time.monotonic() - started
    stop.set()
    await health
    return {
        "history": summary(history_ms),
        "health": summary(health_ms),
        "history_bytes_p50": int(percentile(sizes, 50) or 0),
        "history_bytes_max": int(max(sizes, default=0)),
        "wall_s": round(wall, 2),
        "stopped_by_time_limit": left > 0,
    }


async def client(options: dict[str, Any]) -> dict[str, Any]:
    """The figures of every scenario, after ``health`` alone for 3 s."""
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    headers = {"Authorization": f"token {options['token']}"}
    http = AsyncHTTPClient(
        force_instance=True, max_clients=options["concurrency"] + 2, max_body_size=2**30
    )

    async def get(path: str) -> tuple[float, bytes]:
        request = HTTPRequest(options["base"] + path, headers=headers, request_timeout=120.0)
        start = time.perf_counter()
        response = await http.fetch(request)
        return (time.perf_counter() - start) * 1000.0, response.body

    idle: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(health_loop(get, stop, idle))
    await asyncio.sleep(3.0)
    stop.set()
    await task
    result: dict[str, Any] = {"health_idle": summary(idle)}
    for scenario in options["scenarios"]:
        result[scenario] = await hammer(get, scenario, options)
    http.close()
    return result


# --- the server (this process) ----------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", help="where to write the JSON result")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=16, help="processes per GPU")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--minutes", type=float, default=10.0, help="history kept")
    parser.add_argument("--requests", type=int, default=1000, help="history requests per scenario")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per scenario")
    parser.add_argument(
        "--scenarios", default="full,pages,sidebar", help="comma-separated: " + ", ".join(SCENARIOS)
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the subprocess's role
    args = parser.parse_args()

    if args.client is not None:
        options = json.loads(args.client)
        options["token"] = os.environ["GPUMEM_BENCH_TOKEN"]
        print(json.dumps(asyncio.run(client(options))))
        return
    if args.out is None:
        parser.error("the output path is required")

    home = Path(tempfile.mkdtemp(prefix="gpumem-bench-"))
    for name in ("CONFIG", "DATA", "RUNTIME"):
        (home / name.lower()).mkdir()
        os.environ[f"JUPYTER_{name}_DIR"] = str(home / name.lower())
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"

    from jupyter_server.serverapp import ServerApp
    from traitlets.config import Config

    from jupyter_gpumem.server.handlers import SETTINGS_KEY

    spec = fake_spec(args.gpus, args.processes)
    token = secrets.token_hex(24)
    port = free_port()
    config = Config()
    config.ServerApp.ip = "127.0.0.1"
    config.ServerApp.port = port
    config.ServerApp.port_retries = 0
    config.ServerApp.open_browser = False
    config.ServerApp.allow_root = True  # containers run benchmarks as root
    config.ServerApp.log_level = "WARN"
    config.ServerApp.root_dir = str(home)
    config.ServerApp.jpserver_extensions = {"jupyter_gpumem": True}
    config.IdentityProvider.token = token
    config.GpuMem.backend_class = "tests.support.nvml_fake.FakeNvmlBackend"
    config.GpuMem.fake_spec = spec
    config.GpuMem.interval_s = args.interval
    config.GpuMem.history_minutes = args.minutes
    app = ServerApp.instance(config=config)
    app.initialize(argv=[])

    sampler = app.web_app.settings[SETTINGS_KEY]["sampler"]
    filled = time.perf_counter()
    sampler.extend(synthetic_history(spec, args.interval, sampler.capacity))
    filled = time.perf_counter() - filled
    kept = sampler.history()
    one_sample = len(json.dumps(kept[-1].to_json()))

    options = {
        "base": f"http://127.0.0.1:{port}/jupyter-gpumem/api/",
        "requests": args.requests,
        "concurrency": args.concurrency,
        "time_limit_s": args.time_limit,
        "scenarios": [s for s in args.scenarios.split(",") if s],
    }
    answer: dict[str, Any] = {}

    def run_client() -> None:
        process = subprocess.run(
            [sys.executable, __file__, "--client", json.dumps(options)],
            env={**os.environ, "GPUMEM_BENCH_TOKEN": token},
            capture_output=True,
            text=True,
            timeout=60 + len(options["scenarios"]) * (args.time_limit + 60),
        )
        answer["returncode"] = process.returncode
        answer["stdout"], answer["stderr"] = process.stdout, process.stderr
        app.io_loop.add_callback(app.stop)

    threading.Thread(target=run_client, daemon=True).start()
    app.start()  # returns once the client is done
    app.io_loop.run_sync(app.cleanup_extensions)

    if answer.get("returncode") != 0:
        raise SystemExit(f"the client failed:\n{answer.get('stderr', '')[-4000:]}")
    measured = json.loads(answer["stdout"].strip().splitlines()[-1])
    result: dict[str, Any] = {
        "gpus": args.gpus,
        "processes_per_gpu": args.processes,
        "interval_s": args.interval,
        "history_samples": len(kept),
        "history_fill_s": round(filled, 3),
        "one_sample_json_bytes": one_sample,
        "requests_per_scenario": args.requests,
        "concurrency": args.concurrency,
        "targets_ms": {"history_p99": HISTORY_TARGET_MS, "health_p99_under": HEALTH_TARGET_MS},
        **measured,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.node(),
    }
    for scenario in options["scenarios"]:
        figures = result[scenario]
        figures["meets_targets"] = (figures["history"]["p99_ms"] or 0) <= HISTORY_TARGET_MS and (
            figures["health"]["p99_ms"] or 0
        ) < HEALTH_TARGET_MS
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    idle = result["health_idle"]
    print(f"health alone: p50 {idle['p50_ms']} ms, p99 {idle['p99_ms']} ms")
    for scenario in options["scenarios"]:
        f = result[scenario]
        print(
            f"{scenario}: history p50 {f['history']['p50_ms']} ms p99 {f['history']['p99_ms']} ms "
            f"({f['history']['count']} requests, {f['history_bytes_p50']} bytes p50); "
            f"health p50 {f['health']['p50_ms']} ms p99 {f['health']['p99_ms']} ms "
            f"-> {'OK' if f['meets_targets'] else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
