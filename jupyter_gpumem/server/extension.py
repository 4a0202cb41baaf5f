"""The Jupyter Server extension: configuration, the one sampler, routes and shutdown.

Configuration (``jupyter_server_config.py``, or ``--GpuMem.interval_s=2`` on the command line)::

    c.GpuMem.interval_s = 1.0          # seconds between NVML reads, at least 0.25
    c.GpuMem.history_minutes = 10.0    # how much history the ring buffer keeps
    c.GpuMem.visible_devices = None    # a CUDA_VISIBLE_DEVICES value; None: the server's env
    c.GpuMem.backend = "nvml"          # "fake": the stand-in of jupyter_gpumem.server.fake
    c.GpuMem.fake_spec = {...}         # the stand-in's GPUs (tests only)
"""

from __future__ import annotations

import asyncio
from typing import Any

from traitlets import CaselessStrEnum, Dict, Float, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from jupyter_gpumem.server.handlers import SETTINGS_KEY, handlers
from jupyter_gpumem.server.kernels import ReportedPids, running_kernel_pids
from jupyter_gpumem.server.nvml import NvmlBackend
from jupyter_gpumem.server.sampler import MIN_INTERVAL_S, Sampler, check_interval

__all__ = ["GpuMem", "load_extension"]


class GpuMem(LoggingConfigurable):
    """Settings of the live GPU view (``c.GpuMem.*``)."""

    interval_s = Float(
        1.0, help=f"Seconds between NVML reads (one read serves every client); >= {MIN_INTERVAL_S}."
    ).tag(config=True)
    history_minutes = Float(10.0, help="Minutes of samples kept for `history`.").tag(config=True)
    visible_devices = Unicode(
        None,
        allow_none=True,
        help="A CUDA_VISIBLE_DEVICES value to number devices as kernels see them; "
        "None uses the server's environment.",
    ).tag(config=True)
    backend = CaselessStrEnum(
        ["nvml", "fake"],
        default_value="nvml",
        help='"nvml" reads the GPUs; "fake" is the NVML stand-in for tests and UI tests.',
    ).tag(config=True)
    fake_spec = Dict(
        None,
        allow_none=True,
        help="The stand-in's devices, processes and failures (see jupyter_gpumem.server.fake); "
        "None: two fake GPUs, one of them MIG.",
    ).tag(config=True)

    @validate("interval_s")
    def _check_interval(self, proposal: dict[str, Any]) -> float:
        try:
            return check_interval(proposal["value"])
        except ValueError as error:
            raise TraitError(f"GpuMem.interval_s: {error}") from error

    @validate("history_minutes")
    def _check_history(self, proposal: dict[str, Any]) -> float:
        minutes = proposal["value"]
        if not 0 < minutes <= 24 * 60:
            raise TraitError(f"GpuMem.history_minutes={minutes} must be > 0 and <= 1440")
        return float(minutes)

    def make_backend(self, kernel_manager: Any = None) -> tuple[NvmlBackend, Any]:
        """The configured backend, and the stand-in library when ``backend`` is "fake"."""
        environment = self.visible_devices is None
        if self.backend == "nvml":
            return NvmlBackend(
                visible=self.visible_devices, use_environment=environment, log=self.log
            ), None
        from jupyter_gpumem.server.fake import FakeNvml

        fake = FakeNvml.from_spec(self.fake_spec)
        if kernel_manager is not None:
            fake.kernel_pids = lambda: running_kernel_pids(kernel_manager)
        self.log.warning("jupyter_gpumem: showing FAKE GPUs (c.GpuMem.backend = 'fake')")
        backend = fake.backend(
            visible=self.visible_devices, use_environment=environment, log=self.log
        )
        return backend, fake


def _stop_at_shutdown(serverapp: Any, sampler: Sampler) -> None:
    """Stop the sampler when the server cleans up.

    jupyter_server calls stop hooks only on ExtensionApp subclasses; a module extension gets
    none, so the server's own ``cleanup_extensions`` step is chained instead.
    """
    cleanup = serverapp.cleanup_extensions

    async def cleanup_extensions() -> None:
        await asyncio.to_thread(sampler.stop)
        await cleanup()

    serverapp.cleanup_extensions = cleanup_extensions


def load_extension(serverapp: Any) -> None:
    """Configure, start the one sampler of this server, and add the routes."""
    settings = serverapp.web_app.settings
    if SETTINGS_KEY in settings:
        return  # loaded already: still one sampler
    config = GpuMem(parent=serverapp)
    backend, fake = config.make_backend(getattr(serverapp, "kernel_manager", None))
    sampler = Sampler(
        backend,
        interval_s=config.interval_s,
        history_s=config.history_minutes * 60,
        log=serverapp.log,
    )
    settings[SETTINGS_KEY] = {
        "config": config,
        "sampler": sampler,
        "fake": fake,
        "reported_pids": ReportedPids(),
    }
    serverapp.web_app.add_handlers(".*$", handlers(serverapp.web_app.settings["base_url"]))
    _stop_at_shutdown(serverapp, sampler)
    sampler.start()
    serverapp.log.info("jupyter_gpumem: sampling %s every %s s", config.backend, config.interval_s)
