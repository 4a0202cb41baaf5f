"""Estimates made in forked children of this process, as many at once as it has cores.

A fake step is Python-bound: one estimate keeps one core busy. The estimates a search needs
before it can compose (its anchors) and the distinct rank layouts of a parallel configuration
share nothing, so where the host has cores to spare each is made in a child forked from here,
and its result comes back pickled. A child sees the model as this process has it, and copies
only the pages it writes.

A child forked after this process initialised CUDA cannot use it, so :func:`can_fork` is false
then (and on macOS, where a forked child may not use the system's frameworks). A Ctrl-C while
children work ends every one of them at once, waits for them, and is raised here.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_gpumem.tracking.ranks import stop_inherited

ENABLED = True  # False: one child at a time, where one is needed at all (the benches' before)
_IN_CHILD = False


@dataclass(frozen=True)
class Done:
    """What one child's work gave: its value and warnings, or why it failed."""

    value: Any = None
    warnings: tuple[str, ...] = ()
    error: str | None = None  # "TypeName: message" where the work raised


def cores() -> int:
    """The cores this process may run on; one in a child (its siblings have the others)."""
    if _IN_CHILD or not ENABLED:
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork(torch: Any) -> bool:
    """Whether a forked child of this process can make an estimate."""
    return hasattr(os, "fork") and sys.platform != "darwin" and not torch.cuda.is_initialized()


def run_forked(works: Sequence[Callable[[], Any]], processes: int | None = None) -> list[Done]:
    """Each of ``works`` called in a forked child, at most ``processes`` at a time (default:
    :func:`cores`); their outcomes, in order."""
    width = max(1, min(processes or cores(), len(works)))
    done: list[Done | None] = [None] * len(works)
    running: dict[int, tuple[int, int, bytearray]] = {}  # read end -> (work, pid, bytes read)
    waiting = iter(range(len(works)))
    with selectors.DefaultSelector() as selector:

        def start(k: int) -> None:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                for fd in running:  # the siblings' pipes are the parent's
                    os.close(fd)
                _child(works[k], write)
            os.close(write)
            running[read] = (k, pid, bytearray())
            selector.register(read, selectors.EVENT_READ)

        try:
            for k in waiting:
                start(k)
                if len(running) == width:
                    break
            while running:
                for key, _ in selector.select():
                    fd = key.fd
                    k, pid, got = running[fd]
                    chunk = os.read(fd, 1 << 20)
                    if chunk:
                        got.extend(chunk)
                        continue
                    selector.unregister(fd)
                    os.close(fd)
                    del running[fd]
                    _, status = os.waitpid(pid, 0)
                    done[k] = _outcome(bytes(got), status)
                    nxt = next(waiting, None)
                    if nxt is not None:
                        start(nxt)
        except BaseException:  # a Ctrl-C: the children's work is no one's now
            for fd, (_, pid, _) in running.items():
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(fd)
            raise
    return [d for d in done if d is not None]


def _child(work: Callable[[], Any], write: int) -> None:
    """The child's whole life: the work, its outcome written to ``write``; never returns."""
    global _IN_CHILD
    _IN_CHILD = True
    try:
        stop_inherited()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = work()
        answer = Done(value, tuple(dict.fromkeys(str(w.message) for w in caught)))
    except BaseException as exc:
        answer = Done(error=f"{type(exc).__name__}: {exc}")
    try:
        data = pickle.dumps(answer)
    except Exception as exc:
        data = pickle.dumps(Done(error=f"its result could not be sent back: {exc!r}"))
    try:
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
    finally:
        os._exit(0)


def _outcome(data: bytes, status: int) -> Done:
    if not data:
        return Done(error=f"the process ended with no answer (wait status {status})")
    found = pickle.loads(data)
    assert isinstance(found, Done)
    return found
