"""A memory plan for a budget: which blocks to checkpoint, which precision and optimizer.

``Trial.plan(budget)`` measures a few runs, profiles the blocks, and returns the :class:`Plan`
with the least predicted step time whose predicted peak fits; ``plan.verify()`` measures it::

    plan = trial.plan("12GiB", techniques=("checkpoint",))
    plan.checkpoint, plan.predicted_peak_bytes, plan.reasoning
    plan.verify().measured_peak_bytes

What is measured (each with the trial's warm-up and steps, through the same recorder as
`%%gpumem`), and kept on the trial for later plans:

- the model as it is, under each precision allowed, and with each optimizer allowed;
- every block checkpointed, and the first half of them, under each precision that needs
  checkpointing to fit;
- one profiled step per such precision: per block, the activation bytes that checkpointing
  it frees and its forward time (:mod:`jupyter_gpumem.tuner.planning.profile`).

The checkpointed blocks come from an exact solver over a calibrated peak model
(:mod:`jupyter_gpumem.tuner.planning.solver`), one per precision and optimizer. An optimizer's effect
is taken as measured with the model's own precision, its state scaled by the parameters'
size under the other precisions. Step times within ``TIE`` of the least, or within the noise
of the timings they come from, count as equal, and then the plan that changes fewer things
wins: a technique is not switched for noise. What cannot help on the trial's device (TF32 off
CUDA: :mod:`jupyter_gpumem.techniques.on_device`) is not measured, and the reasoning says why.
``SAFETY`` of the budget is kept free for what the model does not see.

The plan's step-time change against the model as it is is made once for its prediction
(``predicted_change``) and, after ``verify()``, once for its measurement
(``measured_change``), "within noise" where the timings spread as far
(:mod:`jupyter_gpumem.tuner.step_change`); the reasoning and the tuner's widgets write those.

On ``world_size`` ranks of ``parallel`` ("ddp" or "fsdp2"), every run above (the profile
included) is one of that strategy's jobs, its ranks forked or spawned as ``Trial.run`` starts
them; the budget is per rank, and each peak is the worst rank's.

``plan.block_bytes`` holds each candidate block's activation bytes at the peak of the run
with nothing checkpointed, from that run's peak by module (``Report.by_module``); the
reasoning gives them beside whether the plan checkpoints each block.

Known limitations:

- Blocks are checkpointed whole; candidates are the model's repeated blocks ("blocks").
- The model of the peak assumes blocks run one after another, each once per step.
- Measurements are kept per trial and batch; build a new Trial after changing the model.
- A model on the meta device is planned for one process; ``Trial.search`` with
  ``world_sizes`` estimates it on ranks.
"""

from __future__ import annotations

import json
import statistics
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_gpumem.techniques import OPTIMIZERS, PRECISIONS, Config, blocks
from jupyter_gpumem.techniques.on_device import Unhelpful, left_out_line, usable
from jupyter_gpumem.techniques.optimizers import optimizer_name
from jupyter_gpumem.techniques.precision import precision_name
from jupyter_gpumem.tuner.estimation.on_card import checked_count_held
from jupyter_gpumem.tuner.estimation.search import budget_of
from jupyter_gpumem.tuner.planning.blocks_at_peak import block_activations
from jupyter_gpumem.tuner.planning.profile import StepProfile, profile_step
from jupyter_gpumem.tuner.planning.reasoning import (
    Option,
    block_lines,
    choice_lines,
    fewer_line,
    label,
    ok,
    optimizer_note,
    peak_of,
    profile_lines,
    step_of,
    verified_line,
    why,
)
from jupyter_gpumem.tuner.planning.solver import BlockCost, PeakModel, calibrated, solve
from jupyter_gpumem.tuner.planning.unmeasured import (
    NO_WEIGHTS,
    NOT_VERIFIED,
    candidate_lines,
    cheapest_fit,
)
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.runner import Measures
from jupyter_gpumem.tuner.step_change import StepChange, step_change, widest
from jupyter_gpumem.tuner.workload import holds_no_weights
from jupyter_gpumem.units import format_bytes, format_seconds

__all__ = ["TECHNIQUES", "Plan", "fit_plan", "plan"]

TECHNIQUES = ("checkpoint", "precision", "optimizer")
# What a plan changes of the user's training math only when allowed: convergence differs.
CHANGES = ("optimizer", "pure-bf16")
# Variants that run the same update (fused kernels, 8-bit state): allowed by default. The paged
# 8-bit variant is left to the user: its state lives outside PyTorch's allocator, where neither
# an estimate nor a measured peak sees it, so a plan would pick it for bytes it only hides.
_ADAMW = ("adamw", "adamw-fused", "adamw-8bit")
SAME_ALGORITHM = {
    name: tuple(o for o in _ADAMW if o != name) for name in (*_ADAMW, "adamw-paged-8bit")
}
TIE = 0.02  # step times within 2% of the least count as equal
SAFETY = 0.01  # share of the budget kept free for what the model does not see
PAIR_ROUNDS = 3  # precision-and-optimizer pairs measured together before the final pick
Progress = Callable[[str], None]


@dataclass
class Plan:
    """A configuration for a budget, its prediction, and (after ``verify()``) its measurement."""

    budget_bytes: int
    checkpoint: tuple[str, ...]  # module names to checkpoint, in module order
    precision: str | None  # one of PRECISIONS; None: as it is
    optimizer: str | None  # one of OPTIMIZERS; None: the trial's own
    predicted_peak_bytes: int | None
    predicted_step_s: float | None
    reasoning: tuple[str, ...]
    fits: bool  # predicted to fit
    blocks: tuple[str, ...] = ()  # the candidates
    # each candidate's activation bytes at the peak of the run with nothing checkpointed (under
    # the plan's precision); empty where that run's report has no peak by module
    block_bytes: dict[str, int] = field(default_factory=dict)
    measured_peak_bytes: int | None = None
    measured_step_s: float | None = None
    result: TrialResult | None = field(default=None, repr=False, compare=False)
    baseline: TrialResult | None = field(default=None, repr=False, compare=False)
    # every block checkpointed, under the plan's precision: measured when the plan needed it
    all_checkpointed: TrialResult | None = field(default=None, repr=False, compare=False)
    trial: Measures | None = field(default=None, repr=False, compare=False)
    parallel: str | None = None  # the strategy every run used; the budget is per rank
    world_size: int = 1
    # the predicted step time against the baseline's measured one
    predicted_change: StepChange | None = field(default=None, compare=False)
    # the measured plan against the baseline, after ``verify()``
    measured_change: StepChange | None = field(default=None, compare=False)
    # a run of exactly this configuration made while planning: verify() takes it
    planned_run: TrialResult | None = field(default=None, repr=False, compare=False)

    @property
    def config(self) -> Config:
        """The plan as a Config, for ``apply_config``, ``Trial.run`` or ``Tuner.set``."""
        return Config(
            checkpoint=self.checkpoint or None,
            precision=self.precision,
            optimizer=self.optimizer,
            parallel=self.parallel,
            world_size=self.world_size,
        )

    @property
    def measured_fits(self) -> bool | None:
        """Whether the measured peak fits the budget; None before ``verify()``."""
        if self.result is None:
            return None
        peak = self.measured_peak_bytes
        return self.result.status == "ok" and peak is not None and peak <= self.budget_bytes

    def verify(self) -> Plan:
        """Measure the plan with its Trial; fills ``measured_peak_bytes`` and ``measured_step_s``.

        Where planning measured exactly this configuration already (the first half of the
        blocks checkpointed, say), that run is the measurement: it is not made twice."""
        if self.trial is None:
            raise RuntimeError("this plan has no Trial to verify it with")
        result = self.planned_run or self.trial.run(self.config)
        self.result = result
        self.measured_peak_bytes = result.peak_allocated_bytes
        self.measured_step_s = result.step_s
        self.measured_change = result.step_change(self.baseline)
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers and strings (JSON-native): the plan, its prediction and measurement."""
        out = {
            "budget_bytes": self.budget_bytes,
            "checkpoint": list(self.checkpoint),
            "blocks": list(self.blocks),
            "block_bytes": dict(self.block_bytes),
            "precision": self.precision,
            "optimizer": self.optimizer,
            "parallel": self.parallel,
            "world_size": self.world_size,
            "configuration": str(self.config),
            "fits": self.fits,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_step_s": self.predicted_step_s,
            "measured_peak_bytes": self.measured_peak_bytes,
            "measured_step_s": self.measured_step_s,
            "measured_fits": self.measured_fits,
            "measured_status": None if self.result is None else self.result.status,
            "measured_error": None if self.result is None else self.result.error,
            "reasoning": list(self.reasoning),
        }
        for key, change in (
            ("predicted", self.predicted_change),
            ("measured", self.measured_change),
        ):
            out[f"{key}_step_pct"] = None if change is None else change.pct
            out[f"{key}_step_within_noise"] = None if change is None else change.within_noise
        for key, run in (("baseline", self.baseline), ("all_checkpointed", self.all_checkpointed)):
            out[f"{key}_peak_bytes"] = None if run is None else run.peak_allocated_bytes
            out[f"{key}_step_s"] = None if run is None else run.step_s
        return json.loads(json.dumps(out))

    def __str__(self) -> str:
        return "\n".join(self.reasoning)


# -- what was measured, kept per trial --------------------------------------------------------
@dataclass
class _Store:
    """Results by configuration as the planner names it, one process; each ran on ``ranks``."""

    key: tuple[Any, ...]
    ranks: Config  # the strategy and world size every run gets (Config(): one process)
    results: dict[Config, TrialResult] = field(default_factory=dict)
    profiles: dict[str | None, StepProfile] = field(default_factory=dict)

    def on_ranks(self, config: Config) -> Config:
        """``config`` as it runs: on the store's ranks."""
        return replace(config, parallel=self.ranks.parallel, world_size=self.ranks.world_size)


_STORES: weakref.WeakKeyDictionary[Measures, _Store] = weakref.WeakKeyDictionary()


def _store(trial: Measures, candidates: tuple[str, ...], ranks: Config) -> _Store:
    key = (
        id(trial.workload.batch),
        candidates,
        trial.workload.warmup,
        trial.workload.steps,
        id(trial.workload.optimizer),
        ranks,
    )
    store = _STORES.get(trial)
    if store is None or store.key != key:
        store = _STORES[trial] = _Store(key, ranks)
    return store


def _measure(trial: Measures, store: _Store, configs: list[Config], progress: Progress) -> None:
    missing = [c for c in dict.fromkeys(configs) if c not in store.results]
    if not missing:
        return
    if Config() in store.results or store.ranks.parallel is not None:
        for config in missing:  # compare() would measure the baseline again, in one process
            progress(f"measuring {store.on_ranks(config)}")
            store.results[config] = trial.run(store.on_ranks(config))
        return
    progress(f"measuring {len(missing)} configuration(s)")
    for result in trial.compare(missing):
        store.results.setdefault(result.config, result)


def _profile(
    trial: Measures,
    store: _Store,
    candidates: tuple[str, ...],
    precision: str | None,
    progress: Progress,
) -> StepProfile:
    if precision not in store.profiles:
        progress(f"profiling the blocks ({precision or 'as is'})")
        store.profiles[precision] = profile_step(
            trial.workload, candidates, store.on_ranks(Config(precision=precision))
        )
    return store.profiles[precision]


# -- planning ---------------------------------------------------------------------------------
def plan(
    trial: Measures,
    budget: int | str,
    techniques: Sequence[str] = TECHNIQUES,
    *,
    allow: Sequence[str] = (),
    headroom_bytes: int = 0,
    progress: Progress | None = None,
    parallel: str | None = None,
    world_size: int = 1,
    count_held: bool = True,
) -> Plan:
    """The configuration with the least predicted step time whose predicted peak fits ``budget``.

    ``techniques`` names what the plan may change: "checkpoint", "precision", "optimizer".
    It keeps the user's training math unless ``allow`` names a change: the optimizer's
    algorithm ("optimizer"; its fused and 8-bit variants are always allowed) and pure bf16
    weights ("pure-bf16"; autocast is always allowed). The reasoning's first line says which.
    ``headroom_bytes`` is kept free on top of ``SAFETY`` (``fit_plan`` sets it after a
    verification that came out over). ``progress`` is called with a line before each run.
    With ``parallel`` and ``world_size``, every run is on that many ranks of that strategy,
    and the budget is per rank. ``count_held=False`` leaves what the process already holds on
    the GPU out of the estimates of a model with no weights; a plan that measures runs counts
    it, as they hold it, and refuses False.
    """
    budget_bytes = budget_of(budget)
    checked_count_held(count_held)
    allowed = _techniques(techniques)
    changes = changes_of(allow)
    ranks = _ranks(parallel, world_size)
    say = progress or (lambda _: None)
    model = trial.workload.model
    own = optimizer_name(trial.workload.optimizer)
    lines = [math_line(own, changes), f"Budget: {format_bytes(budget_bytes)}."]
    if ranks.parallel is not None:
        lines.append(
            f"On {ranks.world_size} ranks of {ranks.parallel}: the budget is per rank, and every "
            "peak is the worst rank's."
        )
    candidates: tuple[str, ...] = ()
    if "checkpoint" in allowed:
        candidates = tuple(blocks(model))
        if not candidates:
            lines.append("The model has no repeated blocks, so nothing is checkpointed.")
    device = trial.workload.device
    unhelpful: list[Unhelpful] = []
    precisions: list[str | None] = [None]
    if "precision" in allowed:
        now = precision_name(model)
        kept = [p for p in PRECISIONS if p != "bf16" or "pure-bf16" in changes]
        # "fp32" of an fp32 model is as is
        precisions = usable("precision", [None, *(p for p in kept if p != now)], device, unhelpful)
    optimizers: list[str | None] = [None]
    if "optimizer" in allowed and own is not None:
        same = SAME_ALGORITHM.get(own, ())
        others = [o for o in OPTIMIZERS if o != own and ("optimizer" in changes or o in same)]
        optimizers = usable("optimizer", [None, *others], device, unhelpful)
    if unhelpful:
        lines.append(left_out_line(unhelpful, device))
    if holds_no_weights(model):
        if ranks.parallel is not None:
            raise ValueError(
                f"the model holds no weights (meta device), and a plan on {ranks.world_size} "
                "ranks measures them: trial.search(budget, world_sizes="
                f"({ranks.world_size},)) estimates it on ranks, or plan it for one process"
            )
        return _plan_unmeasured(
            trial,
            budget_bytes,
            headroom_bytes,
            precisions,
            optimizers,
            candidates,
            lines,
            say,
            count_held,
        )
    if not count_held:
        raise ValueError(
            "count_held=False leaves out of estimates what the process already holds on the GPU, "
            "but this model holds weights, so the plan measures runs, which hold it too: free "
            "it first (del it, then torch.cuda.empty_cache()), or plan with count_held=True"
        )
    store = _store(trial, candidates, ranks)

    first = [Config(precision=p) for p in precisions] + [Config(optimizer=o) for o in optimizers]
    if candidates:
        first.append(Config(checkpoint=candidates))
    _measure(trial, store, first, say)
    results = store.results
    base = results[Config()]
    reserve = round(SAFETY * budget_bytes) + max(0, headroom_bytes)
    limit = budget_bytes - reserve
    left_out: list[str] = []
    precisions = [
        p
        for p in precisions
        if p is None or _usable(results[Config(precision=p)], f"Precision {p}", left_out)
    ]
    optimizers = [
        o
        for o in optimizers
        if o is None or _usable(results[Config(optimizer=o)], f"Optimizer {o}", left_out)
    ]
    if not ok(base):
        lines.append(f"The model as it is could not be measured: {why(base)}.")
        lines.extend(left_out)
        return Plan(budget_bytes, (), None, None, None, None, tuple(lines), False, candidates,
                    baseline=base, trial=trial, parallel=ranks.parallel,
                    world_size=ranks.world_size)  # fmt: skip

    # Checkpointing data for the precisions that cannot fit without it.
    least = min(_shift(results, None, o)[0] for o in optimizers)
    need = [
        p
        for p in precisions
        if candidates and peak_of(results[Config(precision=p)]) + _scaled(results, p, least) > limit
    ]
    _measure(trial, store, [Config(checkpoint=candidates, precision=p) for p in need], say)
    profiles: dict[str | None, StepProfile] = {}
    for p in need:
        found = _profile(trial, store, candidates, p, say)
        anchor = results[Config(checkpoint=candidates, precision=p)]
        where = f"Checkpointing under {p or 'the precision as it is'}: left out"
        if found.result is not None and not ok(found.result):
            left_out.append(f"{where}, profiling {why(found.result)}.")
        elif not ok(anchor):
            left_out.append(f"{where}, all blocks checkpointed {why(anchor)}.")
        elif found.blocks:
            profiles[p] = found
    # The first half of the blocks checkpointed: what checkpointing really frees per block.
    halves = {p: _first_half(model, found) for p, found in profiles.items()}
    _measure(trial, store, [Config(checkpoint=h, precision=p) for p, h in halves.items() if h], say)
    models: dict[str | None, tuple[PeakModel, StepProfile]] = {}
    scales: dict[str | None, tuple[TrialResult | None, float]] = {}
    for p, found in profiles.items():
        half = results.get(Config(checkpoint=halves[p], precision=p)) if halves[p] else None
        anchor = results[Config(checkpoint=candidates, precision=p)]
        peak_model, scale = _model(found, results[Config(precision=p)], anchor, half)
        models[p] = (peak_model, found)
        scales[p] = (half, scale)

    # Pick; where the pick's precision and optimizer were only estimated together, measure
    # them together and pick again (at most a few times: each round measures one more pair).
    for rounds_left in range(PAIR_ROUNDS, -1, -1):
        options = [
            _option(results, models, p, o, limit, model)
            for p in precisions
            for o in optimizers
            if _together(results, p, o) is not False
        ]
        chosen, tie_note = _pick(options)
        pair = Config(precision=chosen.precision, optimizer=chosen.optimizer)
        if not rounds_left or chosen.precision is None or chosen.optimizer is None:
            break
        if pair in results:
            break
        _measure(trial, store, [pair], say)
    if chosen.precision in models:
        peak_model, found = models[chosen.precision]
        anchor = results[Config(checkpoint=candidates, precision=chosen.precision)]
        base_p = results[Config(precision=chosen.precision)]
        half, scale = scales[chosen.precision]
        lines.extend(
            profile_lines(found, peak_model, base_p, anchor, half, scale, chosen.precision)
        )
    change = step_change(chosen.step_s, step_of(base), chosen.noise_s)
    lines.extend(choice_lines(chosen, options, budget_bytes, reserve, candidates, change=change))
    if chosen.chosen and chosen.precision in models:
        lines.extend(fewer_line(models[chosen.precision][0], chosen, limit))
    unchecked = results.get(Config(precision=chosen.precision), base)
    block_bytes = block_activations(unchecked.report, candidates) if ok(unchecked) else {}
    activations = (unchecked.breakdown or {}).get("activations")
    lines.extend(block_lines(block_bytes, chosen.chosen, candidates, chosen.precision, activations))
    if tie_note:
        lines.append(tie_note)
    if chosen.optimizer is not None:
        lines.append(optimizer_note(chosen.optimizer, optimizer_name(trial.workload.optimizer)))
    lines.extend(left_out)
    return Plan(
        budget_bytes,
        chosen.chosen,
        chosen.precision,
        chosen.optimizer,
        chosen.peak_bytes,
        chosen.step_s,
        tuple(lines),
        chosen.fits,
        candidates,
        block_bytes,
        baseline=base,
        all_checkpointed=results.get(Config(checkpoint=candidates, precision=chosen.precision))
        if candidates
        else None,
        trial=trial,
        parallel=ranks.parallel,
        world_size=ranks.world_size,
        predicted_change=change,
        planned_run=results.get(
            Config(
                checkpoint=chosen.chosen or None,
                precision=chosen.precision,
                optimizer=chosen.optimizer,
            )
        ),
    )


def _plan_unmeasured(
    trial: Measures,
    budget_bytes: int,
    headroom_bytes: int,
    precisions: list[str | None],
    optimizers: list[str | None],
    candidates: tuple[str, ...],
    lines: list[str],
    say: Progress,
    count_held: bool,
) -> Plan:
    """:func:`plan` for a model that holds no weights (see :mod:`.unmeasured`)."""
    reserve = round(SAFETY * budget_bytes) + max(0, headroom_bytes)
    limit = budget_bytes - reserve
    chosen, tried = cheapest_fit(
        trial.workload, limit, precisions, optimizers, candidates, say, count_held=count_held
    )
    lines.append(NO_WEIGHTS)
    lines.extend(candidate_lines(tried, candidates, limit))
    if chosen is None:
        lines.append(
            f"Nothing estimated fits {format_bytes(limit)} (the budget less {format_bytes(reserve)} kept free)."
        )
        return Plan(budget_bytes, (), None, None, None, None, tuple(lines), False, candidates,
                    trial=trial)  # fmt: skip
    config = chosen.config(candidates)
    lines.insert(2, f"Plan: {config}, estimated {format_bytes(chosen.peak_bytes or 0)}.")
    if chosen.optimizer is not None:
        lines.append(optimizer_note(chosen.optimizer, optimizer_name(trial.workload.optimizer)))
    return Plan(
        budget_bytes,
        tuple(candidates[: chosen.blocks]),
        chosen.precision,
        chosen.optimizer,
        chosen.peak_bytes,
        None,
        tuple(lines),
        True,
        candidates,
        trial=trial,
    )


def _usable(r: TrialResult, what: str, left_out: list[str]) -> bool:
    if ok(r):
        return True
    left_out.append(f"{what}: left out, {why(r)}.")
    return False


def _together(results: dict[Config, TrialResult], p: str | None, o: str | None) -> bool | None:
    """Whether precision ``p`` with optimizer ``o`` ran; None where they were not measured together."""
    r = results.get(Config(precision=p, optimizer=o))
    return None if r is None else ok(r)


def _shift(results: dict[Config, TrialResult], p: str | None, o: str | None) -> tuple[int, float]:
    """Bytes and seconds that optimizer ``o`` adds under precision ``p``: measured, else estimated."""
    base = results[Config(precision=p)]
    pair = results.get(Config(precision=p, optimizer=o))
    if pair is not None and ok(pair):
        return peak_of(pair) - peak_of(base), step_of(pair) - step_of(base)
    alone, plain = results[Config(optimizer=o)], results[Config()]
    return _scaled(results, p, peak_of(alone) - peak_of(plain)), step_of(alone) - step_of(plain)


def _scaled(results: dict[Config, TrialResult], p: str | None, nbytes: int) -> int:
    """Optimizer-state bytes measured as the model is, under precision ``p``: scaled by the
    parameters' size (pure bf16 halves them)."""
    base = results[Config()].breakdown or {}
    other = results[Config(precision=p)].breakdown or {}
    if not base.get("parameters") or not other.get("parameters"):
        return nbytes
    return round(nbytes * other["parameters"] / base["parameters"])


def _option(
    results: dict[Config, TrialResult],
    models: dict[str | None, tuple[PeakModel, StepProfile]],
    p: str | None,
    o: str | None,
    limit: int,
    model: Any,
) -> Option:
    extra_bytes, extra_s = _shift(results, p, o)
    noise = _noise(results, p, o, checkpointed=p in models)
    if p not in models:
        r = results[Config(precision=p)]
        peak, step = peak_of(r) + extra_bytes, max(0.0, step_of(r) + extra_s)
        return Option(p, o, (), peak, step, peak <= limit, noise)
    peak_model = models[p][0]
    choice = solve(peak_model, limit - extra_bytes)
    everything = tuple(j for j, b in enumerate(peak_model.blocks) if b.saving_bytes > 0)
    chosen = choice.chosen if choice is not None else everything
    names = _in_order(model, [peak_model.blocks[j].name for j in chosen])
    peak = peak_model.peak(chosen) + extra_bytes
    step = max(0.0, peak_model.step_s(chosen) + extra_s)  # an estimate off by noise
    return Option(p, o, names, peak, step, peak <= limit, noise)


def _noise(
    results: dict[Config, TrialResult], p: str | None, o: str | None, *, checkpointed: bool
) -> float | None:
    """The widest spread of the timed steps of the runs an option's step time comes from:
    the baseline, the precision, the optimizer (with the precision where they ran together)
    and, where blocks are checkpointed, the precision's checkpointed runs."""
    pair = results.get(Config(precision=p, optimizer=o))
    used = [results[Config()], results[Config(precision=p)]]
    used.append(pair if pair is not None and ok(pair) else results[Config(optimizer=o)])
    if checkpointed:
        used += [
            r
            for c, r in results.items()
            if c.checkpoint is not None and c.precision == p and c.optimizer is None
        ]
    return widest(*(r.step_spread_s for r in used))


def fit_plan(
    trial: Measures,
    budget: int | str,
    techniques: Sequence[str] = TECHNIQUES,
    *,
    allow: Sequence[str] = (),
    attempts: int = 3,
    progress: Progress | None = None,
    parallel: str | None = None,
    world_size: int = 1,
) -> Plan:
    """``plan()`` then ``verify()``; a plan measured over the budget is planned again.

    The next attempt keeps free what the measurement exceeded the budget by (and what it
    exceeded the prediction by), so each attempt is at least as cautious as the last. The
    returned plan is verified; its reasoning says how each attempt went.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    budget_bytes = budget_of(budget)
    say = progress or (lambda _: None)
    headroom = 0
    history: list[str] = []
    result: Plan | None = None
    for attempt in range(1, attempts + 1):
        result = plan(
            trial,
            budget_bytes,
            techniques,
            allow=allow,
            headroom_bytes=headroom,
            progress=progress,
            parallel=parallel,
            world_size=world_size,
        )
        if not result.fits:
            break
        if holds_no_weights(trial.workload.model):
            result.reasoning = (*result.reasoning, NOT_VERIFIED)
            break
        say(f"verifying the plan: {result.config}")
        result.verify()
        measured = result.measured_peak_bytes
        if result.measured_fits or measured is None or result.predicted_peak_bytes is None:
            break
        over = measured - budget_bytes
        missed = measured - result.predicted_peak_bytes
        history.append(
            f"Attempt {attempt}: {result.config} measured {format_bytes(measured)}, "
            f"{format_bytes(over)} over the budget (predicted {format_bytes(result.predicted_peak_bytes)})."
        )
        headroom += max(over, missed, 1)
    assert result is not None
    if history:
        if result.measured_fits:
            history.append(f"Planned again with {format_bytes(headroom)} more kept free.")
        result.reasoning = (*result.reasoning, *history)
    if result.result is not None:
        line = verified_line(
            result.result,
            result.measured_fits,
            result.predicted_peak_bytes,
            result.predicted_step_s,
            change=result.measured_change,
        )
        if result.result is result.planned_run:
            line += " That run was made while planning, of exactly this configuration."
        result.reasoning = (*result.reasoning, line)
    return result


# -- helpers ----------------------------------------------------------------------------------
def changes_of(allow: Sequence[str]) -> tuple[str, ...]:
    if isinstance(allow, str):
        allow = (allow,)
    unknown = [a for a in allow if a not in CHANGES]
    if unknown:
        raise ValueError(
            f"allow names changes to the training math: some of {', '.join(CHANGES)}; "
            f"got {tuple(allow)!r}"
        )
    return tuple(allow)


def math_line(own: str | None, changes: tuple[str, ...]) -> str:
    """The reasoning's first line: what of the user's training math the plan may change."""
    kept = []
    if own is not None and "optimizer" not in changes:
        variants = SAME_ALGORITHM.get(own, ())
        also = f" (or its variants {', '.join(variants)})" if variants else ""
        kept.append(f"your optimizer, {own}{also}")
    if "pure-bf16" not in changes:
        kept.append("fp32 master weights (autocast, not pure bf16)")
    allowed = [
        {"optimizer": "another optimizer algorithm", "pure-bf16": "pure bf16 weights"}[c]
        for c in changes
    ]
    head = f"Keeps {' and '.join(kept)}" if kept else "Keeps nothing of the training math fixed"
    tail = (
        f"; allowed to change: {', '.join(allowed)}, which changes convergence."
        if allowed
        else "; allow=('optimizer', 'pure-bf16') lets it change them."
    )
    return head + tail


def _ranks(parallel: str | None, world_size: int) -> Config:
    """The strategy and world size every run of the plan gets; ValueError saying what is allowed."""
    return Config(parallel=parallel, world_size=world_size)  # Config checks them


def _techniques(techniques: Sequence[str]) -> tuple[str, ...]:
    if isinstance(techniques, str):
        techniques = (techniques,)
    unknown = [t for t in techniques if t not in TECHNIQUES]
    if unknown or not techniques:
        raise ValueError(
            f"techniques must name some of {', '.join(TECHNIQUES)}; got {tuple(techniques)!r}"
        )
    return tuple(techniques)


def _first_half(model: Any, profile: StepProfile) -> tuple[str, ...]:
    """The first half of the profiled blocks, in module order (empty for a single block)."""
    return _in_order(model, [b.name for b in profile.blocks[: len(profile.blocks) // 2]])


def _model(
    profile: StepProfile, base: TrialResult, anchor: TrialResult, half: TrialResult | None
) -> tuple[PeakModel, float]:
    # Blocks alike (same bytes) cost alike: their median forward time, so that noise between
    # them does not decide which ones are checkpointed, and ties go to the earlier ones.
    alike: dict[tuple[int, int], list[float]] = {}
    for b in profile.blocks:
        alike.setdefault((b.saved_bytes, b.saving_bytes), []).append(b.forward_s)
    costs = [
        BlockCost(
            b.name,
            b.saving_bytes,
            b.saved_bytes,
            b.grad_bytes,
            statistics.median(alike[(b.saved_bytes, b.saving_bytes)]),
            b.output_bytes,
        )
        for b in profile.blocks
    ]
    model, saving_scale, _ = calibrated(
        costs,
        base_peak_bytes=peak_of(base),
        base_step_s=step_of(base),
        all_peak_bytes=peak_of(anchor),
        all_step_s=step_of(anchor),
        half_peak_bytes=peak_of(half) if half is not None and ok(half) else None,
    )
    return model, saving_scale


def _in_order(model: Any, names: Sequence[str]) -> tuple[str, ...]:
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return tuple(sorted(names, key=order.__getitem__))


def _pick(options: list[Option]) -> tuple[Option, str | None]:
    """The fitting option of least step time, fewer changes winning within TIE or within the
    noise of the timings the two come from; else the lowest peak."""
    fitting = [o for o in options if o.fits]
    if not fitting:
        return min(options, key=lambda o: (o.peak_bytes, o.step_s)), None
    fastest = min(fitting, key=lambda o: (o.step_s, o.changes, len(o.chosen)))

    def margin(o: Option) -> float:
        return max(TIE * abs(fastest.step_s), widest(o.noise_s, fastest.noise_s) or 0.0)

    tied = [o for o in fitting if o.step_s <= fastest.step_s + margin(o)]
    best = min(tied, key=lambda o: (o.changes, o.step_s, len(o.chosen)))
    if best is fastest:
        return best, None
    within = (
        f"within {TIE:.0%}"
        if best.step_s <= fastest.step_s + TIE * abs(fastest.step_s)
        else "within the noise of the timings they come from"
    )
    return best, (
        f"{label(fastest)} is predicted {format_seconds(best.step_s - fastest.step_s)} faster, "
        f"{within}: the plan that changes less is kept."
    )
