"""The worker side of per-rank reports: each process a measured block starts records itself.

While a measured block runs, ``torch.multiprocessing.spawn._wrap`` (the target that
``start_processes`` and ``spawn``, and with them accelerate's ``notebook_launcher``, give
every worker, looked up when they are called) is a :class:`RankWorker`. In the worker it
stops the recording a forked child inherits from the kernel, starts the worker's own
measurement, runs torch's ``_wrap`` with the user's function as it is (so a failure's
traceback is the plain one), and in a ``finally`` writes the worker's report into the
block's rank folder as ``rank-<i>-pid-<pid>.json``, under a temporary name first and then
renamed, so a reader never sees half a file.

A ``RankWorker`` is pickled by value (the folder, and the measurement's factory by
reference), so spawn and forkserver workers get the folder too: a forkserver started
before the block does not see the environment variable set for it.

Known limitations:
- A worker killed by a signal (SIGKILL from the out-of-memory killer, SIGTERM from
  ``start_processes`` after another rank failed) writes nothing; the collecting side
  reports its exit status instead.
- gloo keeps each collective's thread-local state, which holds the recording's dispatch
  mode and saved-tensor hooks, and its worker threads release that state under the GIL. A
  rank that frees its process group right after its last collective (dropping its DDP model
  after ``destroy_process_group``) would join such a thread while holding the GIL, and hang.
  While the worker runs, ``torch.distributed.destroy_process_group`` therefore first sleeps
  ``SETTLE_S``, which lets the threads finish; a ``destroy_process_group`` imported by name
  before the worker started, or a collective still running then, is not covered.
- Workers started some other way (a plain ``multiprocessing.Process``, ``torchrun`` in a
  shell line) are not wrapped; ``jupyter_gpumem.record()`` in their code writes into the
  folder named by :data:`RANKS_DIR_ENV`.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

SETTLE_S = 0.05  # what gloo's threads need to release a finished collective's state
RANKS_DIR_ENV = "JUPYTER_GPUMEM_RANKS_DIR"  # the measured block's rank folder, while it runs
REPORT_GLOB = "rank-*.json"

# Recordings running in this process: token -> (pid that started it, how to stop it).
_RUNNING: dict[int, tuple[int, Callable[[], Any]]] = {}


class RankFinish(Protocol):
    """Ends a worker's measurement: its report as a JSON-ready dict, or None if ours failed.

    ``failure`` is the last line of the traceback torch's ``_wrap`` passes to the parent
    (``ValueError: ...``) when the user's function raised; ``error`` what ended the worker
    otherwise (``SystemExit``), or None.
    """

    def __call__(
        self, error: BaseException | None, failure: str | None
    ) -> Mapping[str, Any] | None: ...


class RankMeasure(Protocol):
    """Starts worker ``rank``'s measurement (a module-level function: spawn pickles it)."""

    def __call__(self, rank: int) -> RankFinish: ...


def recording_started(stop: Callable[[], Any]) -> int:
    """Register a running recording; a forked worker stops its copy before recording itself."""
    token = id(stop)
    _RUNNING[token] = (os.getpid(), stop)
    return token


def recording_stopped(token: int) -> None:
    _RUNNING.pop(token, None)


def stop_inherited() -> None:
    """In a forked child: stop every recording copied from the parent, which it must not feed.

    Without this, the kernel's dispatch mode, hooks and saved-tensor hooks would go on
    recording the worker's tensors into a copy of the kernel's recorder, and pausing that
    copy would pop the worker's own saved-tensor hooks.
    """
    pid = os.getpid()
    for token, (owner, stop) in list(_RUNNING.items()):
        if owner == pid:
            continue
        del _RUNNING[token]
        try:
            stop()
        except Exception:
            log.debug("jupyter_gpumem: stopping an inherited recording failed", exc_info=True)


class RankWorker:
    """Stands in for ``torch.multiprocessing.spawn._wrap`` while a measured block runs."""

    def __init__(
        self, directory: str, measure: RankMeasure, original: Callable[..., Any] | None = None
    ) -> None:
        self.directory = directory
        self.measure = measure
        self.original = original  # torch's _wrap; not pickled, a spawned worker imports it

    def __call__(
        self, fn: Callable[..., Any], i: int, args: tuple[Any, ...], error_file: str
    ) -> None:
        stop_inherited()
        wrap = self.original or _torch_wrap()  # imports torch first in a spawned worker
        finish: RankFinish | None = None
        try:
            finish = self.measure(i)
        except Exception as exc:
            log.warning("jupyter_gpumem: rank %d is not measured: %r", i, exc)
        error: BaseException | None = None
        try:
            with _settled_teardown():
                wrap(fn, i, args, error_file)
        except BaseException as exc:  # SystemExit(1) after a failure, or the user's own exit
            error = exc
            raise
        finally:
            if finish is not None:
                self._write(i, finish, error, _failure(error_file))

    def _write(
        self, rank: int, finish: RankFinish, error: BaseException | None, failure: str | None
    ) -> None:
        try:
            report = finish(error, failure)
            if report is not None:
                write_report(self.directory, rank, report)
        except Exception as exc:
            print(
                f"jupyter_gpumem: rank {rank} could not write its report: {exc!r}", file=sys.stderr
            )

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankWorker, (self.directory, self.measure))


@contextmanager
def _settled_teardown() -> Iterator[None]:
    """``torch.distributed.destroy_process_group`` lets gloo's threads settle before it runs."""
    dist = sys.modules.get("torch.distributed")
    original = getattr(dist, "destroy_process_group", None)
    if original is None:
        yield
        return

    @functools.wraps(original)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SETTLE_S)  # blocks without the GIL, so the threads can take it
        return original(*args, **kwargs)

    dist.destroy_process_group = destroy_process_group  # type: ignore[union-attr]
    try:
        yield
    finally:
        if getattr(dist, "destroy_process_group", None) is destroy_process_group:
            dist.destroy_process_group = original  # type: ignore[union-attr]


def _torch_wrap() -> Callable[..., Any]:
    """torch's own ``_wrap``, in a worker that was not forked (a fresh import of torch)."""
    wrap = importlib.import_module("torch.multiprocessing.spawn")._wrap
    if isinstance(wrap, RankWorker):
        raise RuntimeError("torch's _wrap is replaced and its original was not handed down")
    return wrap  # type: ignore[no-any-return]


def _failure(error_file: str) -> str | None:
    """The last line of the traceback ``_wrap`` wrote for the parent, if it wrote one."""
    try:
        with open(error_file, "rb") as fh:
            text = pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else None


def report_name(rank: int, pid: int | None = None) -> str:
    return f"rank-{rank}-pid-{os.getpid() if pid is None else pid}.json"


def write_report(directory: str | os.PathLike[str], rank: int, report: Mapping[str, Any]) -> Path:
    """Write ``report`` as the rank's file in ``directory`` (made if need be); the file's path."""
    folder = Path(directory)
    folder.mkdir(mode=0o700, exist_ok=True)
    return write_json(folder / report_name(rank), report)


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Write ``data`` to ``path`` under a temporary name, then rename: never half a file, and
    nothing left beside it when the write fails (a full disk)."""
    target = Path(path)
    text = json.dumps(data)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target


def read_reports(directory: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The rank reports written so far (never waits) and a note for each unreadable file."""
    found: list[dict[str, Any]] = []
    problems: list[str] = []
    if not os.path.isdir(directory):
        return found, problems
    for path in sorted(Path(directory).glob(REPORT_GLOB)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name} could not be read: {exc}")
            continue
        if isinstance(data, dict):
            found.append(data)
        else:
            problems.append(f"{path.name} holds no report")
    return found, problems
