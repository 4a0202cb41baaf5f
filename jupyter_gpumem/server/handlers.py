"""REST handlers under ``{base_url}/jupyter-gpumem/api/``: thin readers of the sampler.

`ROUTES` are relative to the server's ``base_url``; the ExtensionApp roots them there. Every
verb is authenticated and authorised. No handler calls NVML: they read the latest
sample (waiting briefly, without blocking the event loop, for the very first one), or a
page of the history (`history`), encoded on a worker thread. The kernel host memory
handler reads a few small ``/proc`` files, which never block.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler

from jupyter_gpumem.nvml.readings import Reason, Sample
from jupyter_gpumem.nvml.sampler import Sampler
from jupyter_gpumem.server.history import HistoryQuery, history_page
from jupyter_gpumem.server.host import kernel_host
from jupyter_gpumem.server.kernels import ReportedPids, kernel_processes
from jupyter_gpumem.version import __version__

__all__ = ["API_PREFIX", "ROUTES", "SETTINGS_KEY"]

API_PREFIX = "jupyter-gpumem/api"
SETTINGS_KEY = "jupyter_gpumem_state"  # "jupyter_gpumem" holds the ExtensionApp itself
FIRST_SAMPLE_WAIT_S = 2.0


class GpuMemHandler(APIHandler):
    """Shared access to the server's sampler."""

    auth_resource = "gpumem"

    @property
    def sampler(self) -> Sampler:
        return self.settings[SETTINGS_KEY]["sampler"]

    async def latest_sample(self) -> Sample:
        """The newest sample; before the first one exists, wait a little, then say so."""
        sampler = self.sampler
        deadline = time.monotonic() + FIRST_SAMPLE_WAIT_S
        sample = sampler.latest()
        while sample is None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            sample = sampler.latest()
        if sample is None:
            return Sample.unavailable(time.time(), sampler.interval_s, Reason.STARTING)
        return sample

    def finish_json(self, body: dict[str, Any] | str) -> None:
        """Answer ``body``: a JSON-able dict, or JSON text already encoded."""
        self.set_header("Cache-Control", "no-store")
        self.finish(body)


class HealthHandler(GpuMemHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        sample = await self.latest_sample()
        self.finish_json(
            {
                "status": "ok",
                "version": __version__,
                "nvml": {"available": sample.available, "reason": sample.reason},
            }
        )


class SampleHandler(GpuMemHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish_json((await self.latest_sample()).to_json())


class HistoryHandler(GpuMemHandler):
    """Pages of the kept samples (see `history`), encoded on a worker thread."""

    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        try:
            query = HistoryQuery.parse(lambda name: self.get_query_argument(name, None))
        except ValueError as error:
            raise tornado.web.HTTPError(400, str(error)) from None
        sampler = self.sampler
        async with self.settings[SETTINGS_KEY]["history_turn"]:
            page = await asyncio.to_thread(
                history_page, sampler.history(), sampler.interval_s, query
            )
        self.finish_json(page)


class KernelHandler(GpuMemHandler):
    """Shared by the routes about one kernel: the running kernel of an id, or 404."""

    auth_resource = "kernels"

    def running_kernel(self, kernel_id: str) -> Any:
        if kernel_id not in self.kernel_manager:
            raise tornado.web.HTTPError(404, f"no running kernel with id {kernel_id!r}")
        return self.kernel_manager.get_kernel(kernel_id)


class KernelProcessesHandler(KernelHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        kernel = self.running_kernel(kernel_id)
        reported: ReportedPids = self.settings[SETTINGS_KEY]["reported_pids"]
        reported.keep_only(self.kernel_manager.list_kernel_ids())
        answer = await kernel_processes(kernel_id, kernel, self.sampler.latest(), reported)
        self.finish_json(answer.to_json())


class KernelHostHandler(KernelHandler):
    """The host memory (RSS) of a kernel's process tree: the live view without a GPU."""

    @tornado.web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        self.finish_json(kernel_host(kernel_id, self.running_kernel(kernel_id)).to_json())


_KERNEL = r"kernels/(?P<kernel_id>[\w-]+)"
ROUTES: tuple[tuple[str, type[tornado.web.RequestHandler]], ...] = (
    (f"{API_PREFIX}/health", HealthHandler),
    (f"{API_PREFIX}/sample", SampleHandler),
    (f"{API_PREFIX}/history", HistoryHandler),
    (f"{API_PREFIX}/{_KERNEL}/processes", KernelProcessesHandler),
    (f"{API_PREFIX}/{_KERNEL}/host", KernelHostHandler),
)
