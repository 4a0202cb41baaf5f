"""The plan's reasoning: plain sentences from the numbers the planner measured and predicted.

Pure text: it reads trial results, the peak model and the profile, and formats units only
here, through :mod:`jupyter_gpumem.units`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.profile import StepProfile
from jupyter_gpumem.tuner.planning.solver import PeakModel
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.step_change import StepChange
from jupyter_gpumem.units import format_bytes, format_seconds


@dataclass(frozen=True)
class Option:
    """One precision and optimizer with its blocks to checkpoint, as the planner predicts them."""

    precision: str | None
    optimizer: str | None
    chosen: tuple[str, ...]
    peak_bytes: int
    step_s: float
    fits: bool
    noise_s: float | None = None  # the widest spread of the timings step_s comes from

    @property
    def changes(self) -> int:
        return (self.precision is not None) + (self.optimizer is not None)


def ok(r: TrialResult) -> bool:
    """Whether a trial ran to the end with a peak and a step time."""
    return r.status == "ok" and r.peak_allocated_bytes is not None and r.step_s is not None


def peak_of(r: TrialResult) -> int:
    assert r.peak_allocated_bytes is not None
    return r.peak_allocated_bytes


def step_of(r: TrialResult) -> float:
    assert r.step_s is not None
    return r.step_s


def why(r: TrialResult) -> str:
    """Why a trial gave no usable measurement, as a clause."""
    if r.status == "oom":
        return "it ran out of memory"
    if r.status != "ok":
        return f"it failed ({r.error})"
    return "it has no measurement"


def label(o: Option) -> str:
    """The option as the Config label of tables and charts."""
    return str(Config(checkpoint=o.chosen or None, precision=o.precision, optimizer=o.optimizer))


def names(chosen: Sequence[str], candidates: Sequence[str]) -> str:
    """``h.0-h.4`` style runs of consecutive candidates."""
    index = {name: i for i, name in enumerate(candidates)}
    runs: list[list[str]] = []
    for name in chosen:
        if runs and index.get(name, -2) == index.get(runs[-1][-1], -9) + 1:
            runs[-1].append(name)
        else:
            runs.append([name])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def profile_lines(
    profile: StepProfile,
    model: PeakModel,
    base: TrialResult,
    anchor: TrialResult,
    half: TrialResult | None,
    saving_scale: float,
    precision: str | None,
) -> list[str]:
    """What was measured and profiled, and how the solver works."""
    n = len(profile.blocks)
    under = f" under {precision}" if precision else ""
    savings = [b.saving_bytes for b in model.blocks]
    recompute = statistics.median(b.recompute_s for b in model.blocks)
    forward = statistics.median(b.forward_s for b in profile.blocks)
    spread = (
        f" (from {format_bytes(min(savings))} to {format_bytes(max(savings))})"
        if min(savings) != max(savings)
        else ""
    )
    halfway = ""
    if half is not None and ok(half):
        halfway = f"; with the first {n // 2}, {format_bytes(peak_of(half))}"
    lines = [
        f"Measured{under}: with nothing checkpointed, the peak is {format_bytes(peak_of(base))} "
        f"at {format_seconds(step_of(base))} a step; with all {n} blocks checkpointed, "
        f"{format_bytes(peak_of(anchor))} at {format_seconds(step_of(anchor))}{halfway}.",
        f"Profiled step, measured against those runs: checkpointing a block frees "
        f"{format_bytes(round(statistics.median(savings)))}{spread} and recomputing it costs "
        f"about {format_seconds(recompute)} (its forward took {format_seconds(forward)} in the "
        "profiled step).",
    ]
    if abs(saving_scale - 1) > 0.02:
        lines.append(
            f"Checkpointing frees {saving_scale:.0%} of what the profiled step saw each block "
            "save for backward"
            + (
                " (the rest stays referenced from elsewhere)."
                if saving_scale < 1
                else " (the rest is saved where the profile cannot see)."
            )
        )
    if profile.unused:
        lines.append(f"Not run in the step, so left out: {', '.join(profile.unused)}.")
    lines.append(
        f"Solver: exact search over the subsets of the {n} blocks, a knapsack taken in block "
        "order that keeps only the choices no other beats in both bytes freed and time; the "
        "peak is the higher of the start of backward and each block's backward, where a "
        "checkpointed block's activations come back."
    )
    return lines


def fewer_line(model: PeakModel, o: Option, limit: int) -> list[str]:
    """Why not fewer blocks: the plan without its cheapest-to-drop block."""
    index = {b.name: j for j, b in enumerate(model.blocks)}
    chosen = [index[n] for n in o.chosen if n in index]
    if not chosen:
        return []
    drop = min(chosen, key=lambda j: (model.blocks[j].saving_bytes, -j))
    rest = [j for j in chosen if j != drop]
    peak = model.peak(rest) + (o.peak_bytes - model.peak(chosen))
    if peak <= limit:
        return []
    return [
        f"No faster set of blocks is predicted to fit: without {model.blocks[drop].name}, the "
        f"peak would be {format_bytes(peak)}."
    ]


BLOCK_GROUPS = 6  # more groups of alike blocks than this: one line for all of them


def block_lines(
    block_bytes: Mapping[str, int],
    checkpoint: Sequence[str],
    candidates: Sequence[str],
    precision: str | None,
    activations_bytes: int | None = None,
) -> list[str]:
    """Each block's activation bytes at the peak of the run with nothing checkpointed, and
    whether the plan checkpoints it; consecutive blocks with the same figure share a line."""
    shown = [n for n in candidates if n in block_bytes]
    if not shown:
        return []
    under = f" under {precision}" if precision else ""
    held = format_bytes(sum(block_bytes[n] for n in shown))
    lines = [
        f"Activations at the peak of the run with nothing checkpointed{under}: "
        + (
            f"{held} in the {len(shown)} blocks."
            if activations_bytes is None
            else f"{format_bytes(activations_bytes)}, {held} of it in the {len(shown)} blocks."
        )
    ]
    groups: list[list[str]] = []
    for name in shown:
        if groups and block_bytes[groups[-1][-1]] == block_bytes[name]:
            groups[-1].append(name)
        else:
            groups.append([name])
    if len(groups) > BLOCK_GROUPS:
        low = min(shown, key=block_bytes.__getitem__)
        high = max(shown, key=block_bytes.__getitem__)
        chosen = [n for n in shown if n in checkpoint]
        lines.append(
            f"  From {format_bytes(block_bytes[low])} ({low}) to "
            f"{format_bytes(block_bytes[high])} ({high}) a block; "
            + (f"checkpointed: {names(chosen, candidates)}." if chosen else "none checkpointed.")
        )
        return lines
    for group in groups:
        figure = format_bytes(block_bytes[group[0]])
        if len(group) == 1:
            lines.append(f"  {group[0]}: {figure}, {_kept(group, checkpoint, candidates)}.")
        else:
            lines.append(
                f"  {group[0]} to {group[-1]}: {figure} each, "
                f"{_kept(group, checkpoint, candidates)}."
            )
    return lines


def _kept(group: Sequence[str], checkpoint: Sequence[str], candidates: Sequence[str]) -> str:
    """``checkpointed``, ``kept``, or which of ``group`` are checkpointed."""
    chosen = [n for n in group if n in checkpoint]
    if not chosen:
        return "kept"
    if len(chosen) == len(group):
        return "checkpointed"
    return f"checkpointed: {names(chosen, candidates)}; the rest kept"


SAME_UPDATE = {frozenset({"adamw", "adamw-fused"})}


def optimizer_note(new: str, old: str | None) -> str:
    if old is not None and frozenset({new, old}) in SAME_UPDATE:
        return f"{new} runs the same update as your {old}, in a fused kernel."
    return (
        f"Note: {new} replaces your {old or 'optimizer'}; its updates differ, so check the "
        "training curve."
    )


def choice_lines(
    o: Option,
    options: list[Option],
    budget_bytes: int,
    reserve: int,
    candidates: Sequence[str],
    *,
    change: StepChange | None,
) -> list[str]:
    """The plan, its step-time ``change`` against the model as it is, what it leaves of the
    budget, and the runners-up."""
    lines = []
    if len({(x.precision, x.optimizer) for x in options}) > 1:
        lines.append(
            f"Compared {len(options)} combinations of precision and optimizer, each with its "
            "own blocks to checkpoint."
        )
    what = []
    if o.chosen:
        what.append(
            f"checkpoint {len(o.chosen)} of {len(candidates)} blocks ({names(o.chosen, candidates)})"
        )
    what.append(f"precision {o.precision or 'as it is'}")
    what.append(f"optimizer {o.optimizer or 'as it is'}")
    cost = "" if change is None else f" ({change.against('as it is')})"
    head = "Plan" if o.fits else "Nothing fits; the lowest predicted peak is"
    lines.append(
        f"{head}: {', '.join(what)}: predicted peak {format_bytes(o.peak_bytes)} at "
        f"{format_seconds(o.step_s)} a step{cost}."
    )
    if o.fits:
        lines.append(
            f"That leaves {format_bytes(budget_bytes - o.peak_bytes)} of the budget, "
            f"{format_bytes(reserve)} of it kept free for what the prediction does not see."
        )
    else:
        lines.append(
            f"It is {format_bytes(o.peak_bytes - budget_bytes + reserve)} over what the budget "
            "allows: shrink the batch, or allow more techniques."
        )
    if not o.chosen and o.fits and o.changes == 0:
        lines.append("As it is, the model fits: nothing needs to change.")
    fitting = sorted((x for x in options if x.fits and x != o), key=lambda x: x.step_s)
    # the fastest others, and the fastest that keep the optimizer, or change nothing but blocks
    shown = fitting[:3]
    for keep in (
        lambda x: x.optimizer is None,
        lambda x: x.optimizer is None and x.precision is None,
    ):
        best = next((x for x in fitting if keep(x)), None)
        if best is not None and best not in shown:
            shown.append(best)
    for x in sorted(shown, key=lambda x: x.step_s):
        lines.append(
            f"  also fits: {label(x)}: {format_bytes(x.peak_bytes)} at {format_seconds(x.step_s)}."
        )
    return lines


FAR_OFF = 2.0  # a measured step this many times the predicted one (or a 1/FAR_OFF of it)


def verified_line(
    r: TrialResult,
    fits: bool | None,
    predicted_peak: int | None,
    predicted_step: float | None,
    *,
    change: StepChange | None = None,
) -> str:
    """The sentence that closes a verified plan's reasoning, with the measured step-time
    ``change`` against the model as it is; where the measured step time is far from the
    predicted one, a second sentence says so."""
    if r.status != "ok":
        return f"Verified by a measured run: it {why(r)}."
    against = "" if change is None else f", {change.against('as it is')}"
    line = (
        f"Verified by a measured run: peak {format_bytes(r.peak_allocated_bytes)} (predicted "
        f"{format_bytes(predicted_peak)}), {format_seconds(r.step_s)} a step "
        f"(predicted {format_seconds(predicted_step)}){against}; it "
        f"{'fits' if fits else 'does not fit'} the budget."
    )
    if r.step_s and predicted_step and not 1 / FAR_OFF < r.step_s / predicted_step < FAR_OFF:
        line += (
            f" The measured step time is {r.step_s / predicted_step:.2g} times the predicted "
            "one: the prediction comes from shorter runs and a model of the recomputation, so "
            "trust the measurement."
        )
    return line
