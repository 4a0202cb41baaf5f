"""A long decode's skipped steps filled in for the allocator model, on generate's loop by hand.

``estimate_generate`` runs a growing cache's first decode steps and its last two; on a GPU the
steps between are filled in (:func:`~jupyter_gpumem.tuner.estimation.decode_steps.filled_in`)
from the pattern of the first ones. Here a loop in small, the way transformers' runs, writes
the log of every step and that of the skipped run: the filled-in run is every step's, event for
event, and steps that do not repeat are refused. tests/unit/test_decode_steps_transformers.py
does the same with transformers' own generate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jupyter_gpumem.records import PhaseMark
from jupyter_gpumem.tuner.estimation.decode_steps import (
    STEADY_STEPS,
    DecodeClocks,
    Unfollowed,
    filled_in,
)
from jupyter_gpumem.tuner.estimation.fake_peaks import cuda_peaks
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun

TOKEN = 4096  # the cache's bytes a token
PROMPT = 16
Scratch = Callable[[int], tuple[int, ...]]  # step -> what its model call allocates for itself


def told(run: FakeRun) -> list[tuple[str, int, int]]:
    """The run's events, its storages numbered by birth (two runs number them otherwise)."""
    born: dict[int, int] = {}
    out = []
    for action, i, _ in run.events:
        if action == "alloc":
            born[i] = len(born)
        out.append((action, run.sizes[i], born.get(i, -1 - i)))
    return out


class _Log:
    """A storage log's events, marks and clock, written by hand."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.events: list[tuple[str, int, int]] = []
        self.marks: list[PhaseMark] = []
        self.clock = 0

    def alloc(self, size: int) -> int:
        self.sizes.append(size)
        self.clock += 1
        self.events.append(("alloc", len(self.sizes) - 1, self.clock))
        return len(self.sizes) - 1

    def free(self, *storages: int | None) -> None:
        for i in storages:
            if i is not None:
                self.clock += 1
                self.events.append(("free", i, self.clock))

    def run(self) -> FakeRun:
        events, marks = tuple(self.events), tuple(self.marks)
        return FakeRun(
            "cuda:0", tuple(self.sizes), {}, (), events, 0, 0, (), frozenset(), (), marks
        )


def _call(log: _Log, step: int, new: int, cache: int | None, scratch: Scratch) -> tuple[int, int]:
    """A model call on ``new`` tokens: its logits, and its cache grown by them (``torch.cat``)."""
    log.clock += 1
    log.marks.append(PhaseMark(log.clock, "decode" if step else "prefill", step))
    logits = log.alloc(4000 * new)
    grown = log.alloc(TOKEN * (new + (0 if cache is None else log.sizes[cache] // TOKEN)))
    log.free(cache, *[log.alloc(size) for size in scratch(step)])
    return logits, grown


def _generate(
    log: _Log, checks: list[int], tokens: int, steps: int, step: int, cache: int | None,
    *, keep: bool = False, scratch: Scratch = lambda step: (512,), held: int = 1,
) -> None:  # fmt: skip
    """generate's loop in small, from model call ``step`` on a prompt of ``tokens`` (all but
    one of them in ``cache``, where given): each step's scores, its ids a column longer (the
    scores kept, with ``keep``, as output_scores keeps them), the next step's preparation kept
    for ``held`` steps after (transformers 5.17 keeps a step's outputs for two); the end copies
    the ids out."""
    made = log.alloc(8)  # the unfinished sequences, to the end
    ids = log.alloc(8 * tokens)
    positions: list[int | None] = [None] * held
    logits, cache = _call(log, step, 1 if cache is not None else tokens, cache, scratch)
    for k in range(steps):
        checks.append(log.clock)
        if k:
            prepared = log.alloc(16)
            log.free(positions.pop(0))
            positions.append(prepared)
            logits, cache = _call(log, step + k, 1, cache, scratch)
        scores = log.alloc(4000)
        longer = log.alloc(log.sizes[ids] + 8)
        log.free(ids, logits, None if keep else scores)
        ids = longer
    checks.append(log.clock)  # the check that ends the loop
    log.free(log.alloc(log.sizes[ids]), made, ids, *positions, cache)


def _runs(new: int, **how: Any) -> tuple[FakeRun, FakeRun, DecodeClocks]:
    """The run of every step of a call of ``new`` tokens; its skipped run, and that one's clocks."""
    every = _Log()
    _generate(every, [], PROMPT, new, 0, None, **how)
    log, first, last = _Log(), [], []  # type: ignore[var-annotated]
    _generate(log, first, PROMPT, 2 + STEADY_STEPS, 0, None, **how)
    first_end = log.clock
    seen = PROMPT + new - 2  # the last steps' prompt, all but its last token in a stand-in cache
    _generate(log, last, seen, 2, new - 2, log.alloc(TOKEN * (seen - 1)), **how)
    return (
        every.run(),
        log.run(),
        DecodeClocks(new, tuple(first), first_end, tuple(last), log.clock),
    )


@pytest.mark.parametrize("held", [1, 2], ids=["freed-by-the-next-step", "kept-two-steps"])
def test_the_filled_in_run_is_every_steps_event_for_event(held: int) -> None:
    every, skipped, clocks = _runs(30, held=held)
    filled = filled_in(skipped, clocks)
    assert told(filled) == told(every) and filled.marks == every.marks
    assert [clock for *_, clock in filled.events] == [clock for *_, clock in every.events]
    # the end copies ids as long as the last steps' call's, not the first call's
    assert filled.sizes[[i for a, i, _ in filled.events if a == "alloc"][-1]] == 8 * (PROMPT + 30)
    placed, wanted = cuda_peaks(filled, ()), cuda_peaks(every, ())
    assert placed.peak_bytes == wanted.peak_bytes
    assert placed.peak_reserved_bytes == wanted.peak_reserved_bytes


@pytest.mark.parametrize(
    ("how", "why"),
    [
        ({"keep": True}, "keeps what it makes past the 2 steps after it"),
        ({"scratch": lambda step: (512 * step * step,)}, "last decode step's sizes do not grow"),
        ({"scratch": lambda step: (512,) * (1 + (step >= 20))}, "last decode step allocates"),
        ({"scratch": lambda step: (512,) * (1 + (step >= 3))}, "consecutive decode steps alloc"),
        ({"held": 3}, "consecutive decode steps allocate or free differently"),
    ],
    ids=[
        "scores-kept",
        "grows-by-its-square",
        "changes-midway",
        "changes-in-the-first-call",
        "kept-three-steps",
    ],
)
def test_steps_that_do_not_repeat_are_not_filled_in(how: dict[str, Any], why: str) -> None:
    _, skipped, clocks = _runs(30, **how)
    with pytest.raises(Unfollowed, match=why):
        filled_in(skipped, clocks)
