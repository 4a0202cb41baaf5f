"""Peaks and step times of technique combinations, composed from a few measured or estimated
anchors: numbers in, numbers out, so it is tested without torch.

An anchor is one configuration's figures: its peak, the bytes of its parameters, gradients and
optimizer state at that peak (the *static* part, which the precision and the optimizer decide)
and the rest (the *dynamic* part: activations, temporaries, the batch, which checkpointing and
gradient accumulation shrink), and, where it ran, its step time. A combination of a precision
``p``, an optimizer ``o``, ``k`` of ``n`` blocks checkpointed and ``a`` micro-batches is composed
as:

- static: the precision's anchor, with the optimizer state changed as the optimizer's anchor
  changed it from the baseline;
- dynamic: the precision's anchor, scaled by the share that checkpointing all blocks kept
  (taken ``k / n`` of the way) and by the share that the most micro-batches kept (taken
  ``(1 - 1/a) / (1 - 1/A)`` of the way: activations go with the micro-batch);
- step time: the baseline's, times each technique's measured factor, scaled the same ways; the
  optimizer's change in seconds added (its step costs the same whatever the compute's
  precision, checkpointing or micro-batches); its noise, the widest spread of the timed steps
  of the anchors it was composed from;
- with LoRA (where allowed): its own anchor's static part in place of the base's, its dynamic
  part's share kept;
- with activations offloaded (to the blocks' or the whole forward's extent): the dynamic bytes
  that offloading alone kept, or what checkpointing kept where that is less (checkpointed
  blocks save only their inputs, and those are moved too), and the seconds its copies took
  alone, by the share of saved bytes still copied;
- on N ranks: what the strategy alone changes of the worst rank's peak, added (its step time is
  one rank's compute, the same for every candidate of that strategy and world size); with the
  state in host memory (FSDP2's CPU offload, one rank too), what that changes, the same way.

It ranks candidates; it is not the answer. The search confirms the winner with an estimate of its
own before it says it fits. A candidate whose own estimate did not fit tells how far its family
(the same precision, micro-batches, LoRA and ranks, offloaded or not: composed alike) was off, and
:func:`corrected` moves the family's other points by as much before the next is taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from jupyter_gpumem.tuner.step_change import widest

STATIC = ("parameters", "gradients", "optimizer_state")


@dataclass(frozen=True)
class Anchor:
    """One configuration's figures at its peak."""

    peak_bytes: int
    static_bytes: int  # parameters, gradients and optimizer state at the peak
    optimizer_bytes: int  # of which optimizer state
    step_s: float | None = None  # measured; None where nothing ran
    spread_s: float | None = None  # how far its timed steps spread; None: fewer than two

    @property
    def dynamic_bytes(self) -> int:
        return self.peak_bytes - self.static_bytes

    @classmethod
    def of(
        cls,
        peak_bytes: int,
        breakdown: Mapping[str, int],
        step_s: float | None = None,
        spread_s: float | None = None,
    ) -> Anchor:
        static = sum(breakdown.get(c, 0) for c in STATIC)
        return cls(peak_bytes, static, breakdown.get("optimizer_state", 0), step_s, spread_s)


@dataclass(frozen=True)
class Choice:
    """One combination: ``blocks`` of the model's first blocks checkpointed, on
    ``world_size`` ranks of ``parallel`` (None: one process)."""

    precision: str | None
    optimizer: str | None
    blocks: int
    accumulate: int
    parallel: str | None = None
    world_size: int = 1
    lora: int | None = None  # the adapters' rank: the base frozen, the adapters trained
    offload: str | None = None  # "blocks" or "model": what is saved waits in host memory
    cpu_offload: bool = False  # FSDP2's shards, gradients and optimizer state in host memory

    @property
    def group(self) -> tuple[str | None, int, bool]:
        """Where it runs: the strategy, the ranks, and whether the state is in host memory."""
        return (self.parallel, self.world_size, self.cpu_offload)

    @property
    def changes(self) -> int:
        """How many techniques it changes from the user's step."""
        changed = (self.precision, self.optimizer, self.lora, self.offload)
        return sum(c is not None for c in changed) + (self.blocks > 0) + (self.accumulate > 1)


@dataclass(frozen=True)
class Anchors:
    """What the composition starts from (every dict keyed by precision, None the model's own)."""

    base: Anchor  # nothing changed
    precision: Mapping[str | None, Anchor]  # each precision alone (None: the base)
    optimizer: Mapping[str | None, Anchor]  # each optimizer alone, at the model's precision
    all_blocks: Mapping[str | None, Anchor]  # each precision with every block checkpointed
    most_micro: Mapping[str | None, Anchor]  # each precision with ``most_accumulate`` micro-batches
    blocks: int  # the model's blocks that can be checkpointed
    most_accumulate: int  # the most micro-batches tried (1: accumulation not tried)
    # each strategy and world size alone, its worst rank: what it changes is added to the rest
    ranks: Mapping[tuple[str, int], Anchor] = field(default_factory=dict)
    lora: Anchor | None = None  # LoRA alone, where allowed
    offload: Mapping[str, Anchor] = field(default_factory=dict)  # each offloading alone
    # FSDP2 on each world size with the state in host memory, alone: its worst rank
    state_on_cpu: Mapping[int, Anchor] = field(default_factory=dict)

    def peak(self, c: Choice) -> int:
        mine = self.precision[c.precision]
        optimizer = self.optimizer[c.optimizer].optimizer_bytes - self.base.optimizer_bytes
        static = mine.static_bytes + optimizer
        dynamic = mine.dynamic_bytes * self._kept(c)
        if c.offload is not None:
            # checkpointed blocks save their inputs alone, and offloading moves those too: what
            # stays is the lesser of what checkpointing kept and what offloading alone kept, in
            # bytes (the rest of the model's activations, a block brought back or recomputed in
            # backward; a lower precision shrinks the blocks' share of it, not the loss's)
            floor = self.offload[c.offload].dynamic_bytes * self._kept(replace(c, blocks=0))
            dynamic = min(dynamic, floor)
        if c.lora is not None and self.lora is not None:  # its gradients and state, the adapters'
            static += self.lora.static_bytes - self.base.static_bytes
            dynamic *= self.lora.dynamic_bytes / max(self.base.dynamic_bytes, 1)
        if c.parallel is not None:
            alone = (
                self.state_on_cpu[c.world_size]
                if c.cpu_offload
                else self.ranks[(c.parallel, c.world_size)]
            )
            static += alone.peak_bytes - self.base.peak_bytes
        return max(0, int(static + dynamic))

    def step_s(self, c: Choice) -> float | None:
        """The predicted step time; None unless every anchor it scales by ran."""
        base = self.base.step_s
        own = self.precision[c.precision].step_s
        other = self.optimizer[c.optimizer].step_s
        if base is None or own is None or other is None or min(base, own, other) <= 0:
            return None
        factor = own / base
        # the optimizer's own seconds: one step per optimizer step, in fp32 master weights,
        # whatever the precision of the compute, the blocks recomputed or the micro-batches
        optimizer = other - base
        if c.lora is not None:
            if self.lora is None or self.lora.step_s is None:
                return None
            factor *= self.lora.step_s / base
        extra = 0.0  # offloading's copies: seconds by the bytes moved, not a share of compute
        if c.offload is not None:
            moved = self.offload[c.offload].step_s
            if moved is None:
                return None
            extra = max(moved - base, 0.0) * self._offloaded_share(c)
        if c.blocks:
            whole = self.all_blocks[c.precision].step_s
            if whole is None:
                return None
            factor *= 1 + (whole / own - 1) * c.blocks / self.blocks
        if c.accumulate > 1:
            most = self.most_micro[c.precision].step_s
            if most is None:
                return None
            factor *= 1 + (most / own - 1) * self._micro_share(c.accumulate)
        return base * factor + optimizer + extra

    def noise_s(self, c: Choice) -> float | None:
        """The widest spread of the timed steps of the anchors ``step_s`` composes ``c`` from."""
        used = [self.base, self.precision[c.precision], self.optimizer[c.optimizer]]
        if c.lora is not None and self.lora is not None:
            used.append(self.lora)
        if c.offload is not None:
            used.append(self.offload[c.offload])
        if c.blocks:
            used.append(self.all_blocks[c.precision])
        if c.accumulate > 1:
            used.append(self.most_micro[c.precision])
        return widest(*(a.spread_s for a in used))

    def _offloaded_share(self, c: Choice) -> float:
        """What the choice saves for backward against the baseline: the share of the bytes
        offloading copies (micro-batches copy the whole batch's, a slice at a time)."""
        mine = self.precision[c.precision].dynamic_bytes
        share = mine / max(self.base.dynamic_bytes, 1)
        if c.blocks and mine > 0:
            whole = self.all_blocks[c.precision].dynamic_bytes / mine
            share *= 1 + (whole - 1) * c.blocks / self.blocks
        return max(share, 0.0)

    def _kept(self, c: Choice) -> float:
        """The share of the precision's dynamic bytes that the choice keeps."""
        mine = self.precision[c.precision].dynamic_bytes
        if mine <= 0:
            return 1.0
        kept = 1.0
        if c.blocks:
            whole = self.all_blocks[c.precision].dynamic_bytes / mine
            kept *= 1 + (whole - 1) * c.blocks / self.blocks
        if c.accumulate > 1:
            most = self.most_micro[c.precision].dynamic_bytes / mine
            kept *= 1 + (most - 1) * self._micro_share(c.accumulate)
        return max(kept, 0.0)

    def _micro_share(self, a: int) -> float:
        """How far ``a`` micro-batches go from one to the most tried, as activations shrink."""
        most = self.most_accumulate
        return (1 - 1 / a) / (1 - 1 / most) if most > 1 else 0.0


@dataclass(frozen=True)
class Point:
    """A composed candidate: its predicted peak and step time."""

    choice: Choice
    peak_bytes: int
    step_s: float | None
    noise_s: float | None = None  # see Anchors.noise_s


def compose(anchors: Anchors, choices: Iterable[Choice]) -> list[Point]:
    return [Point(c, anchors.peak(c), anchors.step_s(c), anchors.noise_s(c)) for c in choices]


def family(c: Choice) -> tuple[object, ...]:
    """What a candidate's composition error carries over to: the same precision, micro-batches,
    LoRA and ranks, offloaded or not (the optimizer's bytes are static and exact; checkpointing
    is interpolated and the blocks' and the whole model's offloading leave alike floors, so
    they are left free)."""
    return (c.precision, c.offload is not None, c.accumulate, c.lora, c.group)


def corrected(points: Sequence[Point], wrong: Point, estimated_bytes: int) -> list[Point]:
    """``points`` with ``wrong``'s family moved by how far its own estimate was from it."""
    error = estimated_bytes - wrong.peak_bytes
    mine = family(wrong.choice)
    return [
        replace(p, peak_bytes=max(0, p.peak_bytes + error)) if family(p.choice) == mine else p
        for p in points
    ]


def front(points: Sequence[Point]) -> list[Point]:
    """The points no other beats in both peak and step time (fewer changes where times are
    unknown), by increasing peak."""

    def cost(p: Point) -> tuple[float, int]:
        return (p.step_s if p.step_s is not None else 0.0, p.choice.changes)

    kept: list[Point] = []
    best: tuple[float, int] | None = None
    for p in sorted(points, key=lambda p: (p.peak_bytes, cost(p))):
        if best is None or cost(p) < best:
            kept.append(p)
            best = cost(p)
    return kept


def ranked(points: Sequence[Point], limit: int) -> list[Point]:
    """The points predicted within ``limit``, cheapest first: the least step time where known,
    then the fewest changes, checkpointing before offloading (offloading waits on the bus), then
    the fewest checkpointed blocks and micro-batches."""
    fitting = [p for p in points if p.peak_bytes <= limit]
    return sorted(
        fitting,
        key=lambda p: (
            p.step_s if p.step_s is not None else 0.0,
            p.choice.changes,
            p.choice.offload is not None,
            p.choice.blocks,
            p.choice.accumulate,
            p.peak_bytes,
        ),
    )


def dominated(alone: Mapping[str | None, Anchor]) -> dict[str | None, str | None]:
    """The precisions another beats alone, where step times were measured: no more static or
    dynamic bytes, no slower by more than their timings spread, and better on one of the three.
    Each is mapped to the one that beats it. The search combines them with nothing else, the
    winner being smaller and faster alone (a heuristic: checkpointing and micro-batches are
    taken to scale both alike). Step times within each other's spread (a tiny model on the
    CPU) tell neither apart, so neither is left out on their account."""
    out: dict[str | None, str | None] = {}
    for p, mine in alone.items():
        for q, theirs in alone.items():
            if q == p or mine.step_s is None or theirs.step_s is None:
                continue
            sizes = (
                (theirs.static_bytes, mine.static_bytes),
                (theirs.dynamic_bytes, mine.dynamic_bytes),
            )
            noise = max(theirs.spread_s or 0.0, mine.spread_s or 0.0)
            no_slower = (
                theirs.step_s + noise <= mine.step_s if noise else (theirs.step_s <= mine.step_s)
            )
            better = any(a < b for a, b in sizes) or theirs.step_s < mine.step_s
            if all(a <= b for a, b in sizes) and no_slower and better:
                out[p] = q
                break
    return out
