"""Make it fit: one search over checkpointed blocks x precision x optimizer variant x gradient
accumulation x activation offloading, the cheapest candidate that fits a budget, confirmed by its
own estimate.

A handful of anchors are estimated on fake tensors (and, where the model holds weights, timed
with nothing tracked, from one saved copy of the user's state): each precision alone, each
optimizer variant alone, each precision with every block checkpointed and with the most
micro-batches, and each offloading alone (on a GPU: on the CPU it moves nothing; the whole
model's first, so that the blocks' reuses the host memory it pinned, and one step timed, its
copies' seconds being steady; the pinned memory is given back when the search ends). An
anchor's estimate warms up by its optimizer step alone (the same allocated peak at about half
the cost); a timed precision that another beats alone on bytes and time is not combined with
checkpointing or micro-batches. A TF32 anchor takes the fp32 one's estimate (TF32 changes how
matmuls round, not what they allocate), and fp16 autocast is left out (its loss scaling reads
values that fake tensors do not have). What cannot help on the trial's device is left out,
and the reasoning says why once (:mod:`jupyter_gpumem.techniques.on_device`: TF32, paging and
offloading act on a GPU only). Every combination's peak and step time
is then composed from them (:mod:`.composed`), hundreds of candidates in microseconds each. The
candidates that fit are taken cheapest first (least predicted step time; fewest changes where
times are unknown) and each is estimated on its own until one fits (one that does not moves its
family's composed peaks by its error, :func:`.composed.corrected`): that one is the winner,
its figures the estimate's, never the composition's. ``verify()`` measures it. The winner's
step-time change against the baseline is made once for its prediction
(``predicted_change``) and once for its measurement (``measured_change``), each "within
noise" where the timings it comes from spread as far (:mod:`jupyter_gpumem.tuner.step_change`);
the text, the HTML and the tuner's widgets all write those two. The anchors and
confirmations are kept on the trial (:mod:`.anchor_memo`): its next search of the same workload
makes none of them again.

It keeps the user's training math unless ``allow`` says otherwise: the same optimizer algorithm
(its fused and 8-bit variants are allowed), autocast but not pure bf16, the full model trained.
Offloading keeps it (the same arithmetic, on copies brought back), so it is always a candidate.
The reasoning's first line says which.

With ``world_sizes``, DDP and FSDP2 on N ranks are candidates too: each strategy and world size
is estimated alone (its worst rank), and what it changes is added to every combination. Where
nothing fits with the state on the GPU, FSDP2 with parameters, gradients and optimizer state
in host memory (``cpu_offload``, on one rank too) is the last resort, estimated and composed
then: it keeps the training math, but the optimizer steps on the CPU.

Known limitations:
- Step times on N ranks are not predicted.
- Blocks are checkpointed from the first on (alike blocks free alike bytes).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_gpumem.techniques import OFFLOADS, OPTIMIZERS, PARALLELS, PRECISIONS, Config, blocks
from jupyter_gpumem.techniques.accumulation import micro_batches
from jupyter_gpumem.techniques.config import MAX_WORLD_SIZE
from jupyter_gpumem.techniques.offloading import moves_from
from jupyter_gpumem.techniques.on_device import Unhelpful, left_out_line, unhelpful, usable
from jupyter_gpumem.techniques.optimizers import optimizer_name
from jupyter_gpumem.techniques.pinning import release_cached
from jupyter_gpumem.techniques.precision import precision_name
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.estimation.on_card import checked_count_held
from jupyter_gpumem.tuner.estimation.predict import estimate_workload
from jupyter_gpumem.tuner.estimation.search import budget_of
from jupyter_gpumem.tuner.planning.anchor_memo import Kept
from jupyter_gpumem.tuner.planning.anchors_at_once import estimated_at_once
from jupyter_gpumem.tuner.planning.composed import (
    Anchor,
    Anchors,
    Choice,
    Point,
    compose,
    corrected,
    dominated,
    front,
    ranked,
)
from jupyter_gpumem.tuner.planning.plan import SAFETY, SAME_ALGORITHM, changes_of, math_line
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.step_change import StepChange, spread, step_change
from jupyter_gpumem.tuner.workload import holds_no_weights
from jupyter_gpumem.units import echoed_kind, format_bytes, format_seconds

__all__ = ["Search", "search"]

ACCUMULATE = (2, 4, 8)  # micro-batches tried, where the batch splits so
CONFIRM = 8  # candidates estimated on their own, at most, before the search gives up
TIMED_STEPS = 2  # an anchor's steps timed, after one warm-up step
# an offloaded anchor's: its step is its copies' seconds, steady from step to step, and the
# longest of all (its warm-up pins the host memory)
OFFLOADED_TIMED_STEPS = 1
UNSEARCHED_FP16 = (
    "fp16-autocast: not searched, its loss scaling reads tensor values (the overflow check), "
    "which fake tensors do not have; bf16-autocast saves the same memory without it."
)
LORA_RANK = 16  # the adapters' rank where LoRA is allowed
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Confirmed:
    """A candidate estimated on its own: composed beside estimated."""

    config: Config
    composed_bytes: int
    estimated_bytes: int | None
    reason: str | None = None


@dataclass
class Search:
    """The cheapest candidate that fits the budget, and what the search went through."""

    budget_bytes: int
    config: Config | None  # the winner; None when no candidate fits
    estimate: Estimate | None  # the winner's own estimate
    predicted_step_s: float | None
    candidates: int  # combinations composed
    front: tuple[tuple[Config, int, float | None], ...]  # (config, composed peak, step time)
    confirmed: tuple[Confirmed, ...]
    reasoning: tuple[str, ...]
    wall_s: float  # before verification
    anchors: int  # configurations estimated (and measured, where the model holds weights)
    result: TrialResult | None = field(default=None, repr=False)
    trial: Any = field(default=None, repr=False, compare=False)
    base: Anchor | None = field(default=None, repr=False)  # Config()'s figures, where estimated
    # each front point's predicted step time against the baseline's timed one, in front order
    front_changes: tuple[StepChange | None, ...] = field(default=(), repr=False)
    # the winner's, likewise
    predicted_change: StepChange | None = field(default=None, repr=False)
    # the measured winner against the baseline, once verified
    measured_change: StepChange | None = field(default=None, repr=False)

    @property
    def fits(self) -> bool:
        return self.config is not None

    @property
    def baseline_peak_bytes(self) -> int | None:
        """The baseline's (``Config()``'s) composed peak: what the candidates save against."""
        return None if self.base is None else self.base.peak_bytes

    @property
    def baseline_step_s(self) -> float | None:
        """The baseline's measured step time; None where nothing ran."""
        return None if self.base is None else self.base.step_s

    def verify(self, baseline: TrialResult | None = None) -> TrialResult:
        """Measure the winner with a real run; ``result`` keeps it, and ``measured_change``
        its step time against ``baseline``'s (a measured ``Config()``), else against the
        baseline's timed steps in the search."""
        if self.config is None:
            raise ValueError("no candidate fits the budget: there is nothing to verify")
        if holds_no_weights(self.trial.workload.model):
            raise ValueError("the model holds no weights (meta device): load them to verify")
        self.result = result = self.trial.run(self.config)
        if baseline is not None:
            self.measured_change = result.step_change(baseline)
        elif self.base is not None:
            self.measured_change = step_change(
                result.step_s, self.base.step_s, result.step_spread_s, self.base.spread_s
            )
        return result

    def verified_lines(self) -> list[str]:
        """What the winner's measured run found, once ``verify()`` ran."""
        result = self.result
        if result is None:
            return []
        if result.status != "ok" or result.peak_allocated_bytes is None:
            return [f"The winner's measured run: {result.status}: {result.error or 'no peak'}."]
        peak = result.peak_allocated_bytes
        where = "within" if peak <= self.budget_bytes else "over"
        step = ""
        if result.step_s is not None:
            change = self.measured_change
            step = f"; {format_seconds(result.step_s)} a step" + (
                "" if change is None else f", {change.against('the baseline')}"
            )
        return [f"Verified by a measured run: {format_bytes(peak)}, {where} the budget{step}."]

    def text(self) -> str:
        return "\n".join((*self.reasoning, *self.verified_lines()))

    def __repr__(self) -> str:
        return self.text()


def search(
    trial: Any,
    budget: int | str,
    *,
    allow: Sequence[str] = (),
    measure: bool | None = None,
    world_sizes: Sequence[int] = (1,),
    confirm: int = CONFIRM,
    progress: Progress | None = None,
    count_held: bool = True,
) -> Search:
    """The cheapest combination of techniques estimated within ``budget`` (bytes or a size).

    ``allow`` names changes to the training math ("optimizer", "pure-bf16", "lora"); ``measure`` runs
    the anchors for their step times (by default where the model holds weights). With
    ``world_sizes`` beyond 1, DDP and FSDP2 on those ranks are searched too, the budget per
    rank: the fewest GPUs that fit win, DDP before FSDP2, then the cheapest candidate.
    ``count_held=False`` leaves what the process already holds on the GPU out of the estimates.
    """
    t0 = time.perf_counter()
    budget_bytes = budget_of(budget)
    checked_count_held(count_held)
    allow = (allow,) if isinstance(allow, str) else tuple(allow)
    model = trial.workload.model
    measure = not holds_no_weights(model) if measure is None else measure
    if measure and holds_no_weights(model):
        raise ValueError("measure=True needs a model with weights; this one is on the meta device")
    sizes = _world_sizes(world_sizes)
    with trial.preserved() if measure else nullcontext():  # the state saved once, for every anchor
        found = _search(
            trial, budget_bytes, allow, measure, sizes, confirm, progress, t0, count_held
        )
    if measure and moves_from(trial.workload.device):
        release_cached()  # the host memory its offloaded anchors pinned
        found.wall_s = time.perf_counter() - t0
    return found


def _search(
    trial: Any,
    budget_bytes: int,
    allow: tuple[str, ...],
    measure: bool,
    sizes: list[int],
    confirm: int,
    progress: Progress | None,
    t0: float,
    count_held: bool,
) -> Search:
    lora_allowed = "lora" in allow
    changes = changes_of([a for a in allow if a != "lora"])
    say = progress or (lambda _: None)
    workload = trial.workload
    model = workload.model
    limit = int(budget_bytes * (1 - SAFETY))
    own = optimizer_name(workload.optimizer)
    trained = (
        " LoRA adapters may be trained in place of the full model (allowed), which changes what "
        "is trained."
        if lora_allowed
        else " The full model is trained (allow 'lora' for adapters)."
    )
    lines = [math_line(own, changes) + trained, f"Budget: {format_bytes(budget_bytes)}."]
    now = precision_name(model)
    device = workload.device
    left_out: list[Unhelpful] = []
    precisions: list[str | None] = [
        None,
        *(p for p in PRECISIONS if p != now and (p != "bf16" or "pure-bf16" in changes)),
    ]
    if "fp16-autocast" in precisions:
        precisions.remove("fp16-autocast")
        lines.append(UNSEARCHED_FP16)
    precisions = usable("precision", precisions, device, left_out)
    optimizers: list[str | None] = [None]
    if own is not None:
        same = SAME_ALGORITHM.get(own, ())
        others = [o for o in OPTIMIZERS if o != own and ("optimizer" in changes or o in same)]
        optimizers = usable("optimizer", [None, *others], device, left_out)
    moves = moves_from(device)  # on the CPU, offloading moves nothing
    if not moves:
        left_out += _why_not(("offload", "cpu_offload"), device)
    if left_out:
        lines.append(left_out_line(left_out, device))
    names = tuple(blocks(model))
    splits = [a for a in ACCUMULATE if _splits(workload.batch, a)]
    most = max(splits, default=1)
    made: dict[Config, Estimate] = {}

    # the last search's, where nothing changed
    kept = trial.anchor_memo.for_workload(workload, count_held=count_held)
    reused: list[Config] = []

    ready: dict[Config, Estimate] = {}  # made at once in forked children, not yet taken

    def at_once(configs: list[Config]) -> dict[Config, Estimate]:
        wanted = [c for c in configs if c not in kept]
        return estimated_at_once(workload, wanted, count_held=count_held, say=say)

    def anchor(config: Config, *, timed: bool = True) -> Anchor | None:
        wants_time = measure and timed
        old = kept.get(config)
        if old is not None:  # estimated by the last search; timed there too, where it had to be
            found = old.estimate
        else:
            alike = (
                made.get(replace(config, precision=None)) if config.precision == "tf32" else None
            )
            if config in ready:
                found = ready.pop(config)
            elif alike is None:
                say(f"estimating {config}")
                found = estimate_workload(workload, config, primed=True, count_held=count_held)
            else:  # TF32 changes how matmuls round, not what they allocate
                found = replace(alike, config=config, label=str(config))
        if old is not None and (old.timed or not wants_time):
            reused.append(config)
            step, error, spread_s = (
                (old.step_s, old.error, old.spread_s) if wants_time else (None, None, None)
            )
        else:
            step, error, spread_s = None, None, None
            if wants_time and found.peak_bytes is not None and found.breakdown is not None:
                say(f"timing {config}")
                steps = OFFLOADED_TIMED_STEPS if config.offload else TIMED_STEPS
                timing = trial.step_time(config, steps)
                step, error, spread_s = timing.step_s, timing.error, spread(timing.times)
            kept[config] = Kept(found, wants_time, step, error, primed=True, spread_s=spread_s)
        made[config] = found
        if found.peak_bytes is None or found.breakdown is None:
            lines.append(f"{config}: not estimated, {found.reason}.")
            return None
        if error is not None:
            lines.append(f"{config}: its step time is not known, the step failed: {error}.")
        return Anchor.of(found.peak_bytes, found.breakdown, step, spread_s)

    lora_asked = lora_allowed and own is not None
    each_alone = [
        Config(),
        *(Config(precision=p) for p in precisions[1:] if p != "tf32"),
        *(Config(optimizer=o) for o in optimizers[1:]),
        *[Config(lora=LORA_RANK)] * lora_asked,
        *(Config(parallel=s, world_size=n) for n in sizes if n > 1 for s in PARALLELS),
    ]
    ready.update(at_once(each_alone))
    base = anchor(Config())
    if base is None:
        return _none(budget_bytes, lines, t0, made, trial)
    by_precision = {None: base, **{p: anchor(Config(precision=p)) for p in precisions[1:]}}
    by_optimizer = {None: base, **{o: anchor(Config(optimizer=o)) for o in optimizers[1:]}}
    kept_p = [p for p in precisions if by_precision[p] is not None]
    kept_o = [o for o in optimizers if by_optimizer[o] is not None]
    all_blocks: dict[str | None, Anchor] = {}
    most_micro: dict[str | None, Anchor] = {}
    beaten = dominated({p: by_precision[p] for p in kept_p})  # type: ignore[misc]
    for p, by in beaten.items():
        lines.append(
            f"{p or now or 'as is'}: not combined with checkpointing or micro-batches; "
            f"{by or now or 'as is'} alone is as small or smaller, and faster."
        )
    combined = [p for p in kept_p if p not in beaten]
    ready.update(
        at_once(
            [Config(checkpoint=names, precision=p) for p in combined if names]
            + [Config(precision=p, accumulate=most) for p in combined if most > 1]
        )
    )
    for p in combined:
        if names:
            whole = anchor(Config(checkpoint=names, precision=p))
            if whole is not None:
                all_blocks[p] = whole
        if most > 1:
            micro = anchor(Config(precision=p, accumulate=most))
            if micro is not None:
                most_micro[p] = micro
    counts = range(len(names) + 1)
    choices = [
        Choice(p, o, k, a)
        for p, o, k, a in itertools.product(kept_p, kept_o, counts, [1, *splits])
        if (not k or p in all_blocks) and (a == 1 or p in most_micro)
    ]
    lora = anchor(Config(lora=LORA_RANK)) if lora_asked else None
    if lora is not None:
        choices += [replace(c, lora=LORA_RANK) for c in choices if c.optimizer is None]
    offload: dict[str, Anchor] = {}
    if moves:
        # the whole model's first: the blocks' host copies then reuse the blocks it pinned
        for where in sorted(OFFLOADS, key="model".__ne__) if names else ("model",):
            alone = anchor(Config(offload=where))
            if alone is not None:
                offload[where] = alone
    choices += [replace(c, offload=w) for w in offload for c in choices]
    ranks: dict[tuple[str, int], Anchor] = {}
    for n in sizes:
        for strategy in PARALLELS if n > 1 else ():
            alone = anchor(Config(parallel=strategy, world_size=n), timed=False)
            if alone is not None:
                ranks[(strategy, n)] = alone
    groups: list[tuple[str | None, int, bool]] = [(None, 1, False)] * (1 in sizes) + [
        (s, n, False) for s, n in sorted(ranks, key=lambda g: (g[1], PARALLELS.index(g[0])))
    ]
    single = choices
    choices = [replace(c, parallel=g[0], world_size=g[1]) for g in groups for c in single]
    anchors = Anchors(
        base, {p: by_precision[p] for p in kept_p}, {o: by_optimizer[o] for o in kept_o},  # type: ignore[misc]
        all_blocks, most_micro, len(names), most, ranks, lora, offload,
    )  # fmt: skip
    points = compose(anchors, choices)
    lines.append(
        f"{len(points)} candidates composed from {len(made)} estimated configurations"
        + (
            " (each also timed for its step time)."
            if measure
            else "; step times unknown, so the fewest changes win."
        )
    )
    if reused:
        lines.append(
            f"{len(reused)} of them kept from this trial's last search: the model, batch, "
            "optimizer and loss are unchanged (trial.anchor_memo.clear() makes them anew)."
        )
    confirmed: list[Confirmed] = []

    def confirm_in(mine: list[Point]) -> tuple[Point, Estimate] | None:
        """The first of ``mine``, cheapest first, whose own estimate fits; each one that does
        not moves its family by its error before the next is taken."""
        for _ in range(confirm):
            order = ranked(mine, limit)
            if not order:
                return None
            point = order[0]
            config = _config(point.choice, names)
            say(f"confirming {config}")
            found = _kept_estimate(kept, workload, config, count_held)
            confirmed.append(Confirmed(config, point.peak_bytes, found.peak_bytes, found.reason))
            if found.peak_bytes is not None and found.peak_bytes <= limit:
                return point, found
            mine = [p for p in mine if p is not point]
            if found.peak_bytes is not None:
                mine = corrected(mine, point, found.peak_bytes)
        return None

    winner: tuple[Point, Estimate] | None = None
    for group in groups:  # the fewest GPUs first
        winner = confirm_in([p for p in points if p.choice.group == group])
        if winner is not None:
            break
    if winner is None and moves:  # the last resort: the state on the CPU
        for n in sizes:
            alone = anchor(Config(parallel="fsdp2", world_size=n, cpu_offload=True), timed=False)
            if alone is None:
                continue
            anchors = replace(anchors, state_on_cpu={**anchors.state_on_cpu, n: alone})
            groups.append(("fsdp2", n, True))
            more = compose(
                anchors,
                [replace(c, parallel="fsdp2", world_size=n, cpu_offload=True) for c in single],
            )
            points += more
            lines.append(
                f"Nothing fits with the state on the GPU{'s' if n > 1 else ''}: FSDP2 on {n} "
                f"rank{'s' if n > 1 else ''} with parameters, gradients and optimizer state in "
                f"host memory adds {len(more)} candidates (the optimizer steps on the CPU: much "
                "slower, its step time not predicted)."
            )
            winner = confirm_in(more)
            if winner is not None:
                break
    chosen = groups[0] if winner is None else winner[0].choice.group
    on_front = front([p for p in points if p.choice.group == chosen])
    shown = tuple((_config(p.choice, names), p.peak_bytes, p.step_s) for p in on_front)
    shown_changes = tuple(step_change(p.step_s, base.step_s, p.noise_s) for p in on_front)
    for c in confirmed:
        what = (
            "not estimated"
            if c.estimated_bytes is None
            else f"estimated {format_bytes(c.estimated_bytes)}"
        )
        lines.append(f"{c.config}: composed {format_bytes(c.composed_bytes)}, {what}.")
    if winner is None:
        lines.append(
            f"No candidate is estimated within {format_bytes(limit)} (the budget less {SAFETY:.0%})."
        )
        return Search(
            budget_bytes, None, None, None, len(points), shown, tuple(confirmed),
            tuple(lines), time.perf_counter() - t0, len(made), trial=trial, base=base,
            front_changes=shown_changes,
        )  # fmt: skip
    point, found = winner
    config = _config(point.choice, names)
    step_s = point.step_s if config.parallel is None else None  # one rank's compute, no more
    change = step_change(step_s, base.step_s, point.noise_s)
    step = "" if step_s is None else f", about {format_seconds(step_s)} a step"
    if change is not None:
        step += f" ({change.against('the baseline')})"
    per = "" if config.parallel is None else " on its worst rank; step time on ranks not predicted"
    lines.append(f"Winner: {config}: estimated {format_bytes(found.peak_bytes or 0)}{per}{step}.")
    return Search(
        budget_bytes, config, found, step_s, len(points), shown, tuple(confirmed),
        tuple(lines), time.perf_counter() - t0, len(made), trial=trial, base=base,
        predicted_change=change, front_changes=shown_changes,
    )  # fmt: skip


def _kept_estimate(
    kept: dict[Config, Kept], workload: Any, config: Config, count_held: bool
) -> Estimate:
    """A candidate's own estimate, made once per workload (an anchor's is made again, whole:
    its figures become the winner's)."""
    old = kept.get(config)
    if old is None:
        found = estimate_workload(workload, config, count_held=count_held)
        old = kept[config] = Kept(found, timed=False)
    elif old.primed:
        found = estimate_workload(workload, config, count_held=count_held)
        old = kept[config] = replace(old, estimate=found, primed=False)
    return old.estimate


def _config(c: Choice, names: Sequence[str]) -> Config:
    return Config(
        checkpoint=tuple(names[: c.blocks]) or None,
        precision=c.precision,
        optimizer=c.optimizer,
        accumulate=c.accumulate,
        parallel=c.parallel,
        world_size=c.world_size,
        lora=c.lora,
        offload=c.offload,
        cpu_offload=c.cpu_offload,
    )


def _world_sizes(sizes: Sequence[int]) -> list[int]:
    """The world sizes searched, checked (a range before it is made into a list); ValueError
    saying what is allowed."""
    allowed = "world_sizes is a list of rank counts such as (1, 2, 4)"
    if not isinstance(sizes, (list, tuple, range)) or not sizes:
        raise ValueError(f"{allowed}, got {echoed_kind(sizes)}")
    if sizes[MAX_WORLD_SIZE:]:  # a slice, as len() of a huge range overflows
        raise ValueError(
            f"{allowed}, at most {MAX_WORLD_SIZE} of them, each from 1 to {MAX_WORLD_SIZE}; "
            f"got {echoed_kind(sizes)}"
        )
    if any(isinstance(n, bool) or not isinstance(n, int) for n in sizes):
        raise ValueError(f"{allowed}, got {echoed_kind(sizes)}")
    for n in sizes:
        Config(parallel="ddp" if n > 1 else None, world_size=n)  # WORLD_SIZES_HELP where wrong
    return sorted(set(sizes))


def _why_not(kinds: Sequence[str], device: Any) -> list[Unhelpful]:
    """Why each of ``kinds`` (a technique as a whole) cannot help on ``device``."""
    found = (unhelpful(kind, kind, device) for kind in kinds)
    return [u for u in found if u is not None]


def _splits(batch: Any, k: int) -> bool:
    try:
        micro_batches(batch, k)
    except ValueError:
        return False
    return True


def _none(
    budget_bytes: int, lines: list[str], t0: float, made: dict[Config, Estimate], trial: Any
) -> Search:
    lines.append("The model's own step cannot be estimated, so nothing is composed.")
    return Search(
        budget_bytes, None, None, None, 0, (), (), tuple(lines), time.perf_counter() - t0,
        len(made), trial=trial,
    )  # fmt: skip
