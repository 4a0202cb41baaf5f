"""A process of the estimate's own: started on first use, kept for the next job, given jobs over a socket.

An estimate runs work apart from the kernel where doing it in the kernel would change the
kernel for good (the stand-in device of :mod:`.without_cuda`) or touch the user's GPU memory
(the convolution probes of :mod:`.workspace_probes`). :class:`Worker` is that process: a new
interpreter, not a fork, which imports nothing of the caller's ``__main__``. A job travels
pickled by value (cloudpickle), every tensor as its layout alone (a meta tensor of the same
storage), so a model's weights are never copied.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any


class Worker:
    """One process that runs jobs: ``prepare`` ("module:function", called once with no
    arguments) readies it, ``env`` is added to its environment; where ``idle_s`` is given the
    process ends after that many seconds without a job (the next call starts another)."""

    def __init__(
        self, prepare: str = "", env: Mapping[str, str] | None = None, idle_s: float | None = None
    ) -> None:
        self.prepare = prepare
        self.env = dict(env or {})
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None
        self._timer: threading.Timer | None = None
        self._calls = 0

    def call(self, work: Callable[[Any], Any], job: Any) -> Any:
        """``work(job)`` in the worker; a string says why it failed."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            payload = layouts(job)
            if not self.alive():
                self._stop()
                try:
                    self._start()
                except (OSError, ValueError) as exc:  # no socket pair or fd passing here
                    return f"the estimate's process could not start ({exc})"
            try:
                self._conn.send_bytes(pickle.dumps(sys.path))  # modules imported since
                self._conn.send_bytes(layouts(work))
                self._conn.send_bytes(payload)
                answer = self._conn.recv_bytes()
            except (EOFError, OSError):
                code = self._process.poll() if self._process is not None else None
                self._stop()
                return f"the estimate's process ended without an answer (exit code {code})"
            self._idle_from_now()
        status, value = pickle.loads(answer)
        return value if status == "ok" else str(value)

    def start(self) -> None:
        """Start the process now, where none runs, so that it readies itself (``prepare``)
        while the caller goes on; the idle time counts from now."""
        with self._lock:
            if self.alive():
                return
            self._stop()
            try:
                self._start()
            except (OSError, ValueError):
                return  # the first call says why
            self._idle_from_now()

    def _idle_from_now(self) -> None:
        self._calls += 1
        if self.idle_s is not None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.idle_s, self._idle, (self._calls,))
            self._timer.daemon = True
            self._timer.start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        code = f"from {__name__} import serve; serve({theirs.fileno()}, {self.prepare!r})"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            **self.env,
        }
        self._process = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=[theirs.fileno()], env=env
        )
        theirs.close()
        self._conn = Connection(ours.detach())

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """End the worker (the next call starts another)."""
        with self._lock:
            self._stop()

    def _idle(self, calls: int) -> None:
        with self._lock:
            if calls == self._calls:  # no job since the timer began
                self._stop()

    def _stop(self) -> None:
        if self.alive():
            self._process.kill()
            self._process.wait()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None


def layouts(obj: Any) -> bytes:
    """``obj`` pickled by value (cloudpickle), each tensor storage as its size alone."""
    import cloudpickle
    import torch

    seen: dict[int, int] = {}

    class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # untyped base
        def persistent_id(self, o: Any) -> Any:
            if isinstance(o, torch.storage.TypedStorage):
                untyped, dtype = o._untyped_storage, o.dtype
            elif isinstance(o, torch.UntypedStorage):
                untyped, dtype = o, None
            else:
                return None
            key = seen.setdefault(untyped._cdata, len(seen))  # one storage, however many views
            return ("storage", key, dtype, untyped.nbytes())

    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


def from_layouts(data: bytes) -> Any:
    """What :func:`layouts` pickled, every storage on the meta device."""
    import torch

    made: dict[int, Any] = {}

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            _, key, dtype, nbytes = pid
            if key not in made:
                made[key] = torch.UntypedStorage(nbytes, device="meta")
            if dtype is None:
                return made[key]
            return torch.storage.TypedStorage(wrap_storage=made[key], dtype=dtype, _internal=True)

    return _Unpickler(io.BytesIO(data)).load()


def serve(fd: int, prepare: str = "") -> None:
    """The worker's loop on the socket ``fd``: ``prepare`` first, then one job after another."""
    conn = Connection(fd)
    if prepare:
        module, _, name = prepare.partition(":")
        getattr(importlib.import_module(module), name)()
    while True:
        try:
            path, work_bytes, job_bytes = conn.recv_bytes(), conn.recv_bytes(), conn.recv_bytes()
        except EOFError:
            return
        sys.path[:] = [*sys.path, *(p for p in pickle.loads(path) if p not in sys.path)]
        try:
            work = pickle.loads(work_bytes)
            answer = pickle.dumps(("ok", work(from_layouts(job_bytes))))
        except BaseException as exc:  # every failure goes back as the reason
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            answer = pickle.dumps(("failed", detail))
        conn.send_bytes(answer)
