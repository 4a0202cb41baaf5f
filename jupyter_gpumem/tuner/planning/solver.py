"""Which blocks to checkpoint: a peak model calibrated on two measured runs, and an exact solver.

Pure: numbers in, numbers out, so it is tested without torch.

The peak model. Blocks run in order ``0..n-1`` in forward and the other way in backward. For
a set ``S`` of checkpointed blocks, two moments can hold the peak:

- the start of backward, where every activation is alive: ``base - sum(saving[j] for j in S)``;
- the backward of block ``b``, where the blocks before it still hold what they keep, block
  ``b`` holds all it saves (brought back by recomputation when it is checkpointed, with its
  output made again beside the incoming gradient) and the gradients of the blocks from ``b``
  on are allocated: ``floor + sum(held[j] - saving[j]*(j in S) for j < b) + held[b] +
  output[b]*(b in S) + sum(grad[j] for j >= b)``.

``base`` is the measured peak with nothing checkpointed; ``floor`` (what the rest of the model
holds during the blocks' backward) is set so that the model stays at or under both measured
anchors, and the peak with everything checkpointed, also measured, is a floor for every set.
The step time is the measured one plus each checkpointed block's forward time, scaled so that
checkpointing every block costs what was measured.

The solver. The least step time whose predicted peak fits is a 0/1 knapsack with a constraint
per block on the savings before it. It goes through the blocks in order and keeps, after each,
only the choices that no other beats in both bytes saved and time spent (a Pareto front): a
choice that saves less and costs more can never lead to a better plan, because every
constraint asks for *at least* some saving. That is exact, and fast for the ~10-100 blocks of
real models (with blocks alike, the front holds one choice per count); past ``MAX_FRONT``
choices the front is thinned to one per ``budget / MAX_FRONT`` bytes of saving and the answer
is then within that of the optimum, which the result says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_FRONT = 4096
TIE_S = 1e-9  # added to each block's cost in the search, so that equal times favour fewer blocks


@dataclass(frozen=True)
class BlockCost:
    """One block for the solver: calibrated bytes and seconds."""

    name: str
    saving_bytes: int  # freed by checkpointing it
    held_bytes: int  # what it saves for backward (all back during its backward)
    grad_bytes: int  # its parameters' gradients
    recompute_s: float  # added to the step when it is checkpointed
    output_bytes: int = 0  # its largest output, made again when it is recomputed


@dataclass(frozen=True)
class PeakModel:
    """Predicted peak and step time of any set of checkpointed blocks (indices into ``blocks``)."""

    blocks: tuple[BlockCost, ...]  # in forward order
    base_peak_bytes: int  # measured, nothing checkpointed
    base_step_s: float
    all_peak_bytes: int  # measured, every block checkpointed: a floor for every set
    floor_bytes: int  # the rest of the model during the blocks' backward

    def peak(self, chosen: Iterable[int]) -> int:
        picked = set(chosen)
        if not picked:
            return self.base_peak_bytes
        if len(picked) == len(self.blocks):
            return self.all_peak_bytes  # measured
        start = self.base_peak_bytes - sum(self.blocks[j].saving_bytes for j in picked)
        return max(start, self._backward_peak(picked), self.all_peak_bytes)

    def step_s(self, chosen: Iterable[int]) -> float:
        return self.base_step_s + sum(self.blocks[j].recompute_s for j in set(chosen))

    def _backward_peak(self, picked: set[int]) -> int:
        highest = 0
        before = 0  # held by the blocks before b
        grads_from = sum(b.grad_bytes for b in self.blocks)
        for b, block in enumerate(self.blocks):
            again = block.output_bytes if b in picked else 0
            highest = max(highest, before + block.held_bytes + again + grads_from)
            before += block.held_bytes - (block.saving_bytes if b in picked else 0)
            grads_from -= block.grad_bytes
        return self.floor_bytes + highest


def calibrated(
    blocks: Sequence[BlockCost],
    *,
    base_peak_bytes: int,
    base_step_s: float,
    all_peak_bytes: int,
    all_step_s: float,
    half_peak_bytes: int | None = None,
) -> tuple[PeakModel, float, float]:
    """The model for profiled ``blocks`` and the measured anchors; with the two scales used.

    Returns ``(model, saving_scale, time_scale)``. ``half_peak_bytes``, the measured peak with
    the first ``len(blocks) // 2`` blocks checkpointed, scales the savings to what
    checkpointing really freed there (at the start of backward, where the first blocks free
    their whole saving): the profile counts what each block saved, and a model can keep some
    of it alive by other references (a cache passed to every block). Without it, the
    savings are scaled up (never down) when checkpointing every block freed more than the
    profile saw. The recompute times are scaled so that all of them add up to the measured
    cost of checkpointing everything (0 when that cost was not measurable).
    """
    profiled = sum(b.saving_bytes for b in blocks)
    drop = base_peak_bytes - all_peak_bytes
    saving_scale = max(1.0, drop / profiled) if profiled > 0 and drop > 0 else 1.0
    half = sum(b.saving_bytes for b in blocks[: len(blocks) // 2])
    if half_peak_bytes is not None and half > 0 and base_peak_bytes > half_peak_bytes:
        saving_scale = (base_peak_bytes - half_peak_bytes) / half
    forward = sum(b.recompute_s for b in blocks)
    time_scale = max(0.0, (all_step_s - base_step_s) / forward) if forward > 0 else 0.0
    scaled = tuple(
        BlockCost(
            b.name,
            round(b.saving_bytes * saving_scale),
            round(b.held_bytes * saving_scale),
            b.grad_bytes,
            b.recompute_s * time_scale,
            b.output_bytes,
        )
        for b in blocks
    )
    unfloored = PeakModel(scaled, base_peak_bytes, base_step_s, all_peak_bytes, 0)
    everything = set(range(len(scaled)))
    floor = min(
        base_peak_bytes - unfloored._backward_peak(set()),
        all_peak_bytes - unfloored._backward_peak(everything),
    )
    model = PeakModel(scaled, base_peak_bytes, base_step_s, all_peak_bytes, max(0, floor))
    return model, saving_scale, time_scale


@dataclass(frozen=True)
class Choice:
    """The blocks to checkpoint for one budget, as the model predicts them."""

    chosen: tuple[int, ...]  # indices, in forward order
    peak_bytes: int
    step_s: float
    exact: bool  # False when the front was thinned (see MAX_FRONT)


def solve(model: PeakModel, budget_bytes: int) -> Choice | None:
    """The set of blocks with the least predicted step time whose predicted peak fits.

    None when checkpointing every block, as measured, does not fit; every block when only
    that fits. Ties in step time go to fewer blocks, then to earlier ones.
    """
    if model.base_peak_bytes <= budget_bytes:
        return Choice((), model.base_peak_bytes, model.base_step_s, True)
    if model.all_peak_bytes > budget_bytes:
        return None
    blocks = model.blocks
    # (saved, seconds, chosen): start with nothing chosen
    front: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
    held_before = 0
    grads_from = sum(b.grad_bytes for b in blocks)
    exact = True
    for b, block in enumerate(blocks):
        # the backward of block b: what the blocks before it kept must fit with it
        need = model.floor_bytes + held_before + block.held_bytes + grads_from - budget_bytes
        front = [state for state in front if state[0] >= need]
        if not front:
            everything = tuple(range(len(blocks)))
            return Choice(everything, model.all_peak_bytes, model.step_s(everything), exact)
        if block.saving_bytes > 0:
            taking = need + block.output_bytes  # its output is made again when recomputed
            # A block never costs nothing: of two choices equal in time, fewer blocks win.
            cost = block.recompute_s + TIE_S
            front += [
                (s + block.saving_bytes, t + cost, (*c, b)) for s, t, c in front if s >= taking
            ]
            front, thinned = _pareto(front, budget_bytes)
            exact = exact and not thinned
        held_before += block.held_bytes
        grads_from -= block.grad_bytes
    need = model.base_peak_bytes - budget_bytes
    fitting = [state for state in front if state[0] >= need]
    if not fitting:  # the model's linear savings fall short; the measured run fits
        everything = tuple(range(len(blocks)))
        return Choice(everything, model.all_peak_bytes, model.step_s(everything), exact)
    _, _, chosen = min(fitting, key=lambda state: (state[1], len(state[2]), state[2]))
    if len(chosen) == len(blocks):
        return Choice(chosen, model.all_peak_bytes, model.step_s(chosen), exact)
    peak = model.peak(chosen)
    if peak > budget_bytes:  # the all-checkpointed floor: cannot happen once it fits, kept safe
        return None
    return Choice(chosen, peak, model.step_s(chosen), exact)


def _pareto(
    states: list[tuple[int, float, tuple[int, ...]]], budget_bytes: int
) -> tuple[list[tuple[int, float, tuple[int, ...]]], bool]:
    """The states no other beats in both saving (more) and time (less); thinned if too many."""
    states.sort(key=lambda state: (-state[0], state[1], len(state[2]), state[2]))
    kept: list[tuple[int, float, tuple[int, ...]]] = []
    best_time = float("inf")
    for state in states:
        if state[1] < best_time:
            kept.append(state)
            best_time = state[1]
    if len(kept) <= MAX_FRONT:
        return kept, False
    step = max(1, budget_bytes // MAX_FRONT)
    buckets: dict[int, tuple[int, float, tuple[int, ...]]] = {}
    for state in kept:  # largest saving first: each bucket keeps its fastest, which came last
        buckets[state[0] // step] = state
    return sorted(buckets.values(), key=lambda state: -state[0]), True
