"""A long decode's skipped steps filled in for the allocator model, from the steps that ran.

With a growing cache, :func:`~.generation.estimate_generate` runs a ``generate`` call's first
steps, skips the ones between and runs the last two on a stand-in cache made fresh. The exact
storage bytes are a whole call's, but not the CUDA allocator's blocks: a real cache, grown by
``torch.cat`` a token at a time, lies in blocks chosen by best fit among the holes its
predecessors left (a large block is not split for a remainder of up to 1 MiB), and that slack is
in the measured peak. So the allocator model is handed every step, the skipped ones made from
the ones that ran: from the second decode step on, each step of generate's loop allocates and
frees as the step before it did, every allocation grown by what it grew by from that step (a
cache's keys and values by one token, the ids and the mask by one column). :func:`filled_in`
reads that pattern from two steps of the first call and checks it on the last two.

Pure: touches neither torch nor CUDA.

Known limitations:
- A step that differs from its neighbours only inside the skipped ones (a logits processor that
  starts and stops there) is not seen; one that differs from some step to the end is, in the
  last steps, and raises :class:`Unfollowed`, as does a step that keeps what it makes for more
  than the ``MAX_LAG`` steps after it (transformers 5.17 keeps a step's outputs for two).
- The allocator model places every step's blocks: its time grows with the steps (some 250
  events a step for a small Llama, 0.5 s for 200 steps), where the fake run's does not.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from jupyter_gpumem.records import PhaseMark
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun

MAX_LAG = 2  # a step may free what it made and what the MAX_LAG steps before it made
STEADY_STEPS = MAX_LAG + 1  # decode steps past the first one that the first call runs

# A step's events: ("alloc", 0, j) for its j-th allocation; ("free", lag, j) for the j-th
# allocation of the step ``lag`` steps before it (0: itself; at most MAX_LAG); ("free", -1, i)
# for storage i, made before that.
_Event = tuple[str, int, int]
_Events = Sequence[tuple[str, int, int]]


class Unfollowed(Exception):
    """The recorded steps do not repeat as :func:`filled_in` can follow; the message says how."""


@dataclass(frozen=True)
class DecodeClocks:
    """Where a skipped ``generate`` run's two calls lie on its log's clock."""

    new_tokens: int  # the steps of the call the run stands for
    first: tuple[int, ...]  # the first call's loop checks (the last one ended its loop)
    first_end: int  # when the first call had returned
    last: tuple[int, ...]  # the last steps' call's loop checks (the last one ended its loop)
    last_end: int


@dataclass(frozen=True)
class _Pattern:
    """A decode step as the ones from the second on go."""

    events: tuple[_Event, ...]
    made: tuple[int, ...]  # the storages the pattern's step (``step``) made, by number
    before: tuple[tuple[int, ...], ...]  # those the MAX_LAG - 1 steps before it made, oldest first
    grown: tuple[int, ...]  # the bytes each allocation grows by from one step to the next
    call: tuple[str, int]  # the phase its model call marks, and the events before the call
    step: int

    def sizes(self, sizes: Sequence[int], step: int) -> list[int]:
        return [
            sizes[i] + g * (step - self.step) for i, g in zip(self.made, self.grown, strict=True)
        ]


def filled_in(run: FakeRun, clocks: DecodeClocks) -> FakeRun:
    """``run`` as a call that runs every step would make it, for the allocator model.

    Its events to the end of the first call's loop, the skipped and the last steps made from
    the pattern of the first call's last two, then the first call's end (with the last call's
    sizes). What came after the first call (the stand-in cache, the last steps' call) is left
    out. Raises :class:`Unfollowed` where the steps do not repeat so.
    """
    on_clock = [clock for _, _, clock in run.events]
    pattern = _pattern_of(run, on_clock, clocks)
    _check_last(run, on_clock, clocks, pattern)
    return _whole(run, on_clock, clocks, pattern)


def _span(on_clock: Sequence[int], after: int, to: int) -> range:
    """The events after clock ``after``, up to clock ``to``."""
    return range(bisect.bisect_right(on_clock, after), bisect.bisect_right(on_clock, to))


def _told(
    events: _Events, span: range, step: int, born: dict[int, tuple[int, int]]
) -> list[_Event]:
    """The events of ``step`` (those in ``span``), told by what they make and free; ``born``
    gains the storages the step makes, as (step, number)."""
    out: list[_Event] = []
    made = 0
    for n in span:
        action, i, _ = events[n]
        if action == "alloc":
            born[i] = (step, made)
            out.append(("alloc", 0, made))
            made += 1
            continue
        where = born.get(i)
        if where is None or step - where[0] > MAX_LAG:
            out.append(("free", -1, i))
        else:
            out.append(("free", step - where[0], where[1]))
    return out


def _allocated(run: FakeRun, span: range) -> list[int]:
    return [i for action, i, _ in (run.events[n] for n in span) if action == "alloc"]


def _call_in(run: FakeRun, on_clock: Sequence[int], after: int, to: int) -> tuple[str, int]:
    """The phase the one model call between the clocks marks, and the events before it there."""
    inside = [m for m in run.marks if after < m.time_us <= to]
    if len(inside) != 1:
        raise Unfollowed("a decode step does not call the model once")
    before = _span(on_clock, after, inside[0].time_us)
    return inside[0].phase, len(before)


def _pattern_of(run: FakeRun, on_clock: Sequence[int], clocks: DecodeClocks) -> _Pattern:
    """The pattern of the first call's last two steps, which must go alike (the MAX_LAG steps
    before them tell what they free of their predecessors')."""
    first = clocks.first
    a, b = len(first) - 3, len(first) - 2  # generate's loop: step k from check k to check k+1
    if a < MAX_LAG or len(clocks.last) != 3 or clocks.new_tokens - 2 <= b:
        raise Unfollowed("the run is not a first call of several steps and a call of two last")
    steps = [_span(on_clock, first[k], first[k + 1]) for k in range(a - MAX_LAG, b + 1)]
    if run.window > steps[-2].start:
        raise Unfollowed("the run's measured steps begin inside the decode steps")
    born: dict[int, tuple[int, int]] = {}
    for k, span in zip(range(a - MAX_LAG, a), steps, strict=False):
        _told(run.events, span, k, born)
    told_a = _told(run.events, steps[-2], a, born)
    told = _told(run.events, steps[-1], b, born)
    if told != told_a:
        raise Unfollowed("two consecutive decode steps allocate or free differently")
    if any(e[0] == "free" and e[1] < 0 for e in told):
        raise Unfollowed(
            f"a decode step frees what a step more than {MAX_LAG} steps before it made"
        )
    made = {e[2] for e in told if e[0] == "alloc"}
    if made != {e[2] for e in told if e[0] == "free"}:  # lag 0 or 1: each once, or they pile up
        raise Unfollowed(f"a decode step keeps what it makes past the {MAX_LAG} steps after it")
    call = _call_in(run, on_clock, first[b], first[b + 1])
    if _call_in(run, on_clock, first[a], first[b]) != call:
        raise Unfollowed("two consecutive decode steps call the model at different points")
    now, before = _allocated(run, steps[-1]), _allocated(run, steps[-2])
    grown = tuple(run.sizes[i] - run.sizes[j] for i, j in zip(now, before, strict=True))
    older = tuple(tuple(_allocated(run, span)) for span in steps[-MAX_LAG:-1])
    return _Pattern(tuple(told), tuple(now), older, grown, call, b)


def _check_last(
    run: FakeRun, on_clock: Sequence[int], clocks: DecodeClocks, pattern: _Pattern
) -> None:
    """The last two steps allocate what the pattern gives them, in its order, and the last one
    frees what it makes as the pattern does (the one before it, on a stand-in cache made
    fresh, frees what came before it otherwise)."""
    new, last = clocks.new_tokens, clocks.last
    tail = _span(on_clock, last[1], last[2])

    def own(told: Sequence[_Event]) -> list[_Event]:  # what a step makes, and frees of it
        return [e for e in told if e[1] == 0]

    if own(_told(run.events, tail, 0, {})) != own(pattern.events):
        raise Unfollowed("the last decode step allocates or frees otherwise than the first ones")
    if [run.sizes[i] for i in _allocated(run, tail)] != pattern.sizes(run.sizes, new - 1):
        raise Unfollowed("the last decode step's sizes do not grow as the first ones' do")
    calls = [m for m in run.marks if m.step == new - 2 and clocks.first_end < m.time_us <= last[0]]
    if len(calls) != 1:
        raise Unfollowed("the last steps' call does not call the model once before its loop")
    before_call = sum(1 for e in pattern.events[: pattern.call[1]] if e[0] == "alloc")
    called = _span(on_clock, calls[0].time_us, last[1])
    expected = pattern.sizes(run.sizes, new - 2)[before_call:]
    if [run.sizes[i] for i in _allocated(run, called)] != expected:
        raise Unfollowed("the next to last decode step's sizes do not grow as the first ones' do")


def _whole(
    run: FakeRun, on_clock: Sequence[int], clocks: DecodeClocks, pattern: _Pattern
) -> FakeRun:
    """The first call's events through its loop, the pattern's steps to the last, the first
    call's end on them."""
    first = clocks.first
    loop_end = bisect.bisect_right(on_clock, first[-1])
    events: list[tuple[str, int, int]] = list(run.events[:loop_end])
    marks = [m for m in run.marks if m.time_us <= first[-1]]
    sizes = list(run.sizes)
    tags = list(run.tags)
    categories: dict[int, list[str]] = {}
    for i, category in run.tags:
        if category not in categories.setdefault(i, []):
            categories[i].append(category)
    clock = first[-1]

    def make(size: int, like: int) -> int:
        nonlocal clock
        made = len(sizes)
        sizes.append(size)
        tags.extend((made, category) for category in categories.get(like, ()))
        clock += 1
        events.append(("alloc", made, clock))
        return made

    def free(i: int) -> None:
        nonlocal clock
        clock += 1
        events.append(("free", i, clock))

    def call(step: int) -> None:
        nonlocal clock
        clock += 1
        marks.append(PhaseMark(clock, pattern.call[0], step))

    ran = [*pattern.before, pattern.made]  # the storages of the last MAX_LAG steps that ran
    recent: list[Sequence[int]] = list(ran)  # and of the last MAX_LAG steps made, oldest first
    for step in range(pattern.step + 1, clocks.new_tokens):
        now: list[int] = []
        grown = pattern.sizes(run.sizes, step)
        for n, e in enumerate(pattern.events):
            if n == pattern.call[1]:
                call(step)
            if e[0] == "alloc":
                now.append(make(grown[e[2]], pattern.made[e[2]]))
            else:
                free((now if e[1] == 0 else recent[-e[1]])[e[2]])
        if pattern.call[1] == len(pattern.events):
            call(step)
        recent = [*recent[1:], now]
    # the call's end: the first call's, on the last step's storages, with the last call's sizes
    ending = _span(on_clock, first[-1], clocks.first_end)
    sized = [
        run.sizes[i] for i in _allocated(run, _span(on_clock, clocks.last[-1], clocks.last_end))
    ]
    if len(sized) != len(_allocated(run, ending)):
        raise Unfollowed("the first call and the last steps' call end otherwise")
    twin: dict[int, int] = {}
    for before, after in zip(ran, recent, strict=True):
        twin.update(zip(before, after, strict=True))
    for n in ending:
        action, i, _ = run.events[n]
        if action == "alloc":
            twin[i] = make(sized.pop(0), i)
        else:
            free(twin.get(i, i))
    return dataclasses.replace(
        run, sizes=tuple(sizes), events=tuple(events), tags=tuple(tags), marks=tuple(marks)
    )
