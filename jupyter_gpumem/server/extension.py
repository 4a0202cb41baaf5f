"""The Jupyter Server extension: configuration, the one sampler, routes and shutdown.

Configuration (``jupyter_server_config.py``, or ``--GpuMem.interval_s=2`` on the command line)::

    c.GpuMem.interval_s = 1.0          # seconds between NVML reads, at least 0.25
    c.GpuMem.history_minutes = 10.0    # how much history the ring buffer keeps
    c.GpuMem.visible_devices = None    # a CUDA_VISIBLE_DEVICES value; None: the server's env
    c.GpuMem.backend_class = "..."     # tests only: a stand-in for NVML's NvmlBackend, e.g.
                                       #   "tests.support.nvml_fake.FakeNvmlBackend"
    c.GpuMem.fake_spec = {...}         # tests only: the stand-in's GPUs

The extension is a jupyter_server ``ExtensionApp`` (`GpuMemApp`). At start the server calls
its ``initialize_settings`` (the sampler's state goes into the server's settings) and
``initialize_handlers`` (`handlers.ROUTES`, which the app roots at ``base_url``); at
shutdown, its ``stop_extension``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Dict, Float, TraitError, Type, Unicode, validate
from traitlets.config import LoggingConfigurable

from jupyter_gpumem.nvml.library import NvmlBackend
from jupyter_gpumem.nvml.sampler import MIN_INTERVAL_S, Sampler, check_interval
from jupyter_gpumem.server.handlers import ROUTES, SETTINGS_KEY
from jupyter_gpumem.server.kernels import ReportedPids, kernel_trees, running_kernel_pids

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
    backend_class = Type(
        NvmlBackend,
        klass=NvmlBackend,
        help="The class that reads the GPUs: NvmlBackend (NVML). Any other class is a "
        "stand-in for tests, built with spec=fake_spec and kernel_pids= (the running "
        "kernels' pids) besides NvmlBackend's visible, use_environment, log and own_pids.",
    ).tag(config=True)
    # default_value by name: Dict's first positional parameter is the trait of its values,
    # and with that as None the default would be {}, as if the user had set it.
    fake_spec = Dict(
        default_value=None,
        allow_none=True,
        help="Tests only: the devices, processes and failures of a stand-in backend_class; "
        "None: the stand-in's default machine.",
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

    def make_backend(self, kernel_pids: Callable[[], list[int]]) -> NvmlBackend:
        """The configured backend; a stand-in also gets ``fake_spec`` and ``kernel_pids``."""
        options: dict[str, Any] = {
            "visible": self.visible_devices,
            "use_environment": self.visible_devices is None,
            "log": self.log,
            # The kernels' processes keep their command lines whoever owns them.
            "own_pids": lambda: kernel_trees(kernel_pids()),
        }
        if self.backend_class is NvmlBackend:
            if self.fake_spec is not None:
                self.log.warning(
                    "jupyter_gpumem: c.GpuMem.fake_spec is ignored: it describes the GPUs of a "
                    "stand-in backend_class, and backend_class is NvmlBackend (real NVML)"
                )
            return NvmlBackend(**options)
        name = f"{self.backend_class.__module__}.{self.backend_class.__qualname__}"
        self.log.warning("jupyter_gpumem: showing STAND-IN GPUs (%s)", name)
        # A stand-in takes NvmlBackend's options and these two (see `backend_class`).
        options.update(spec=self.fake_spec, kernel_pids=kernel_pids)
        return self.backend_class(**options)


class GpuMemApp(ExtensionApp):
    """The server extension: one sampler per server, the REST routes, a clean stop."""

    name = "jupyter_gpumem"
    load_other_extensions = True

    # Whether this load started the server's sampler (and so serves its routes).
    _started_sampler = False

    @property
    def _server(self) -> Any:
        assert self.serverapp is not None, "initialised by a running server"
        return self.serverapp

    def initialize_settings(self) -> None:
        # ExtensionApp has copied the server's settings into self.settings: a second load of
        # the extension finds the first one's state there and starts no second sampler.
        self._started_sampler = SETTINGS_KEY not in self.settings
        if not self._started_sampler:
            return
        config = GpuMem(parent=self._server)
        backend = config.make_backend(lambda: running_kernel_pids(self._server.kernel_manager))
        sampler = Sampler(
            backend,
            interval_s=config.interval_s,
            history_s=config.history_minutes * 60,
            log=self._server.log,
        )
        self.settings[SETTINGS_KEY] = {
            "config": config,
            "sampler": sampler,
            "backend": backend,
            "reported_pids": ReportedPids(),
            # One history page is encoded at a time: a second encoding thread would only
            # take the GIL from the event loop more often.
            "history_turn": asyncio.Semaphore(1),
        }
        sampler.start()
        source = type(backend).__name__
        self.log.info("jupyter_gpumem: sampling %s every %s s", source, config.interval_s)

    def initialize_handlers(self) -> None:
        if self._started_sampler:  # one set of routes per server, like the sampler
            self.handlers.extend(ROUTES)

    async def stop_extension(self) -> None:
        """Stop the sampler (its thread closes NVML) when the server shuts down."""
        state = self.settings.get(SETTINGS_KEY)
        if state is not None:
            await asyncio.to_thread(state["sampler"].stop)
