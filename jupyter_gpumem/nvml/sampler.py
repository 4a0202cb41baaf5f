"""A background thread that reads NVML at a fixed interval into a ring buffer.

The server runs one: its handlers only read the latest sample or a copy of the history, so
however many clients poll, NVML is read once per interval, and never on the event loop. The
kernel's `%gpumem monitor` widget runs its own, updating its gauges from ``on_sample``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from jupyter_gpumem.nvml.readings import Reason, Sample

__all__ = ["MIN_INTERVAL_S", "Backend", "Sampler", "check_interval"]

MIN_INTERVAL_S = 0.25
THREAD_NAME = "jupyter-gpumem-sampler"


class Backend(Protocol):
    """What the sampler reads: `NvmlBackend` (with real NVML or the stand-in)."""

    def read(self, interval_s: float = ...) -> Sample: ...

    def close(self) -> None: ...


def check_interval(interval_s: float) -> float:
    """The interval if allowed; ValueError saying what is allowed otherwise."""
    if not (math.isfinite(interval_s) and interval_s >= MIN_INTERVAL_S):
        raise ValueError(
            f"sampling interval {interval_s!r} s is too short: use at least {MIN_INTERVAL_S} s "
            "(NVML queries cost CPU time on every GPU)"
        )
    return float(interval_s)


class Sampler:
    """Samples ``backend`` every ``interval_s`` seconds and keeps ``history_s`` seconds of it.

    `start` is idempotent and thread-safe, so exactly one thread runs however often it is
    called. The backend is used only from that thread, which also closes it on `stop`.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        interval_s: float = 1.0,
        history_s: float = 600.0,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.time,
        on_sample: Callable[[Sample], None] | None = None,
        thread_name: str = THREAD_NAME,
    ) -> None:
        self.interval_s = check_interval(interval_s)
        self._on_sample = on_sample  # called on the sampling thread after each read
        self._thread_name = thread_name
        if history_s < interval_s:
            raise ValueError(f"history of {history_s} s must cover at least one interval")
        self._backend = backend
        self._log = log or logging.getLogger(__name__)
        self._clock = clock
        self._history: deque[Sample] = deque(maxlen=max(1, math.ceil(history_s / interval_s)))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._latest: Sample | None = None
        self.cpu_time_s = 0.0  # this thread's CPU time so far (time.thread_time)
        self.passes = 0

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    @property
    def capacity(self) -> int:
        """How many samples the history keeps."""
        return self._history.maxlen or 0

    def start(self, first: Sample | None = None) -> None:
        """Start the sampling thread unless it already runs (or was stopped).

        ``first`` is a sample the caller has just read: it is kept as the first one, and the
        thread's first read waits one interval instead of repeating it.
        """
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            if first is not None:
                self._keep(first)
            self._thread = threading.Thread(
                target=self._run, args=(first is None,), name=self._thread_name, daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread, wait for it, and let it close the backend. Idempotent."""
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                self._log.warning("jupyter_gpumem sampler did not stop within %s s", timeout_s)

    def _read(self) -> Sample:
        try:
            return self._backend.read(self.interval_s)
        # A bug in a backend must not end the one sampler of the server: report it instead.
        except Exception:
            self._log.exception("jupyter_gpumem sampler: reading the backend failed")
            return Sample.unavailable(self._clock(), self.interval_s, Reason.INTERNAL)

    def _keep(self, sample: Sample) -> None:
        """Append to the history; the caller holds the lock."""
        self._history.append(sample)
        self._latest = sample
        self._first.set()

    def extend(self, samples: Iterable[Sample]) -> None:
        """Add samples read elsewhere, kept in time order (the oldest fall out first).

        For benchmarks and tests that need a full history without waiting for it.
        """
        with self._lock:
            merged = sorted([*self._history, *samples], key=lambda s: s.time)
            self._history.clear()
            self._history.extend(merged)
            if self._history:
                self._latest = self._history[-1]
                self._first.set()

    def _run(self, read_now: bool) -> None:
        start = time.monotonic()
        try:
            if not read_now:
                self._stop.wait(self.interval_s)
            while not self._stop.is_set():
                sample = self._read()
                with self._lock:
                    self._keep(sample)
                self.passes += 1
                self.cpu_time_s = time.thread_time()
                if self._on_sample is not None and not self._stop.is_set():
                    self._deliver(sample)
                # Fixed-rate schedule: a slow pass shortens the next wait instead of drifting.
                elapsed = time.monotonic() - start
                self._stop.wait(self.interval_s - elapsed % self.interval_s)
        finally:
            self._backend.close()
            self._first.set()

    def _deliver(self, sample: Sample) -> None:
        assert self._on_sample is not None
        try:
            self._on_sample(sample)
        except Exception:  # a failing listener must not end the sampling
            self._log.exception("jupyter_gpumem sampler: on_sample failed")

    def latest(self) -> Sample | None:
        """The newest sample, or None before the first pass finished."""
        return self._latest

    def wait_first(self, timeout_s: float) -> Sample | None:
        """Block up to ``timeout_s`` for the first sample (for use off the event loop)."""
        self._first.wait(timeout_s)
        return self._latest

    def history(self, since: float | None = None) -> list[Sample]:
        """Kept samples, oldest first; only those newer than ``since`` (unix s) if given."""
        with self._lock:
            samples = list(self._history)
        if since is None:
            return samples
        return [s for s in samples if s.time > since]
