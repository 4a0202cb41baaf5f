"""The measured step of a fake run played again, for the caching allocator's later steps.

The caching allocator keeps what a step freed and hands it out again in the next: a step that
allocates the same sizes in the same order can still find its blocks taken (the optimizer's
state sits where the first forward's activations were) and reserve a segment more, in the
second measured step as much as in the first. On an H200 the second measured step of DeBERTa-v3
and of GPT-2 each reserved one 250 MiB segment more than the first (``bench/allocator_check.py``).

A fake step's measured step is deterministic: the step after it makes the same ops on the same
shapes. Where the step is closed (every storage it makes it frees, and it frees none older),
its events are those of the next step too, on new storages; :func:`repeated` writes them
``times`` times in a row, so that the allocator model plays as many steps as the trial measures
(:func:`~.fake_peaks.cuda_peaks` stops once a step ends in the layout the one before ended in:
the model is deterministic, so every later step plays the same). Pure: touches neither torch
nor CUDA.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.estimation.fake_step import FakeRun


def repeated(run: FakeRun, times: int) -> FakeRun:
    """``run`` with its measured step made ``times`` times; ``run`` itself where ``times`` is
    one or the step is not closed."""
    window = run.events[run.window :]
    if times <= 1 or not window:
        return run
    born = [i for action, i, _ in window if action == "alloc"]
    made = set(born)
    if made != {i for action, i, _ in window if action == "free"}:
        return run
    span = window[-1][2] - run.window_clock + 1
    sizes = list(run.sizes)
    events = list(run.events)
    tags = list(run.tags)
    marks = list(run.marks)
    communication = dict(run.communication)
    pooled = set(run.pooled)
    step_tags = [(i, category) for i, category in run.tags if i in made]
    step_marks = [m for m in run.marks if m.time_us >= run.window_clock]
    for k in range(1, times):
        copy = {i: len(sizes) + n for n, i in enumerate(born)}
        sizes.extend(run.sizes[i] for i in born)
        events.extend((action, copy[i], clock + k * span) for action, i, clock in window)
        tags.extend((copy[i], category) for i, category in step_tags)
        marks.extend(
            dataclasses.replace(m, time_us=m.time_us + k * span, step=m.step + k)
            for m in step_marks
        )
        communication.update({copy[i]: communication[i] for i in born if i in run.communication})
        pooled.update(copy[i] for i in born if i in run.pooled)
    return dataclasses.replace(
        run,
        sizes=tuple(sizes),
        events=tuple(events),
        tags=tuple(tags),
        marks=tuple(marks),
        communication=communication,
        pooled=frozenset(pooled),
        measured_steps=1,
    )
