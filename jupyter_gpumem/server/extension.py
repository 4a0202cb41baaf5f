"""The Jupyter Server extension: configuration, the one sampler, routes and shutdown.

Configuration (``jupyter_server_config.py``, or ``--GpuMem.interval_s=2`` on the command line)::

    c.GpuMem.interval_s = 1.0          # seconds between NVML reads, at least 0.25
    c.GpuMem.history_minutes = 10.0    # how much history the ring buffer keeps
    c.GpuMem.visible_devices = None    # a CUDA_VISIBLE_DEVICES value; None: the server's env
    c.GpuMem.nvml_library = None       # tests only: a stand-in class for the NVML library,
    c.GpuMem.library_spec = {...}      #   e.g. "tests.support.nvml_fake.FakeNvml", and its GPUs

The extension is a jupyter_server ``ExtensionApp`` (`GpuMemApp`): the server calls its
``initialize_settings``/``initialize_handlers`` at start and ``stop_extension`` at shutdown.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Dict, Float, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable
from traitlets.utils.importstring import import_item

from jupyter_gpumem.nvml.library import NvmlBackend
from jupyter_gpumem.nvml.sampler import MIN_INTERVAL_S, Sampler, check_interval
from jupyter_gpumem.server.handlers import SETTINGS_KEY, handlers
from jupyter_gpumem.server.kernels import ReportedPids, running_kernel_pids

__all__ = ["GpuMem", "GpuMemApp"]


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
    nvml_library = Unicode(
        None,
        allow_none=True,
        help="Tests only: the importable name of a class that stands in for the NVML library "
        "(built with its from_spec(library_spec)); None reads the GPUs.",
    ).tag(config=True)
    library_spec = Dict(
        None,
        allow_none=True,
        help="Tests only: the stand-in's devices, processes and failures.",
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
        """The configured backend, and the stand-in library when one is configured."""
        environment = self.visible_devices is None
        if self.nvml_library is None:
            return NvmlBackend(
                visible=self.visible_devices, use_environment=environment, log=self.log
            ), None
        library = import_item(self.nvml_library).from_spec(self.library_spec)
        if kernel_manager is not None:
            library.kernel_pids = lambda: running_kernel_pids(kernel_manager)
        self.log.warning("jupyter_gpumem: showing STAND-IN GPUs (%s)", self.nvml_library)
        backend = library.backend(
            visible=self.visible_devices, use_environment=environment, log=self.log
        )
        return backend, library


class GpuMemApp(ExtensionApp):
    """The server extension: one sampler per server, the REST routes, a clean stop."""

    name = "jupyter_gpumem"
    load_other_extensions = True

    @property
    def _server(self) -> Any:
        assert self.serverapp is not None, "initialised by a running server"
        return self.serverapp

    def initialize_settings(self) -> None:
        settings = self._server.web_app.settings
        if SETTINGS_KEY in settings:
            return  # loaded already: still one sampler
        config = GpuMem(parent=self._server)
        backend, library = config.make_backend(getattr(self._server, "kernel_manager", None))
        sampler = Sampler(
            backend,
            interval_s=config.interval_s,
            history_s=config.history_minutes * 60,
            log=self._server.log,
        )
        settings[SETTINGS_KEY] = {
            "config": config,
            "sampler": sampler,
            "library": library,
            "reported_pids": ReportedPids(),
        }
        sampler.start()
        source = config.nvml_library or "NVML"
        self.log.info("jupyter_gpumem: sampling %s every %s s", source, config.interval_s)

    def initialize_handlers(self) -> None:
        web_app = self._server.web_app
        if not web_app.settings[SETTINGS_KEY].get("routes"):
            web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
            web_app.settings[SETTINGS_KEY]["routes"] = True

    async def stop_extension(self) -> None:
        """Stop the sampler (its thread closes NVML) when the server shuts down."""
        state = self._server.web_app.settings.get(SETTINGS_KEY)
        if state is not None:
            await asyncio.to_thread(state["sampler"].stop)
