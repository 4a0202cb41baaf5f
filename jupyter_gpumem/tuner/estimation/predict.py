"""Predict a trial's peak before running it: its steps on fake tensors, the allocator modelled.

``Trial.estimate()`` runs the trial's step (forward, backward, optimizer step; a warm-up step
first, so that the optimizer state exists) on fake tensors of the model, optimizer and batch
(:mod:`~jupyter_gpumem.tuner.estimation.fake_step`), then turns what it allocated into the peak the trial
would measure (:mod:`~jupyter_gpumem.tuner.estimation.fake_peaks`): on a GPU through a model of the caching
allocator started from the device's real layout, its library workspaces included; on the CPU as
the dispatch source counts. No GPU memory is used beyond the library workspaces a first run
makes anyway, and the user's model, optimizer and random state are untouched::

    est = workload.estimate(checkpoint="blocks")      # Estimate: peak_bytes, breakdown, phase
    n = workload.max_batch_size("20GiB", lambda n: torch.randint(0, 50257, (n, 1024), device="cuda"))
    workload.run(Config(checkpoint="blocks")).vs_estimate  # "estimated 6.9 GiB, measured 7.0 GiB (-1.2%)"

What cannot run on fake tensors gives an Estimate with ``peak_bytes=None`` and the ``reason``;
:func:`max_batch_size` then raises :class:`EstimateUnavailable` with it. The estimate's notes carry
what the run will warn about its checkpointed regions (e.g. "blocks" that are single layers).

Known limitations:
- Workspaces that kernels allocate for themselves inside one op (cuDNN convolutions, attention
  backward) are not seen: they matter only where they coincide with the peak.
- One device: the trial's. Streams other than the current one are left alone.
- The budget is compared with the peak allocated bytes, as the tuner's "fits" column does; the
  CUDA context and the allocator's cache come on top (``Estimate.total_bytes``).
- What the process already holds on the GPU (a tensor of the user's, a loaded copy of a meta
  model) is in the peak, as ``held_before``, since the trial would find it there;
  ``count_held=False`` leaves it out, and a verdict for another card never counts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tracking.devices import cuda_present
from jupyter_gpumem.tuner.estimation import cards, fake_peaks, without_cuda
from jupyter_gpumem.tuner.estimation.estimate import (
    BatchSearch,
    Estimate,
    EstimateUnavailable,
    batch_search,
    from_peaks,
    unavailable,
)
from jupyter_gpumem.tuner.estimation.fake_step import run_fake
from jupyter_gpumem.tuner.estimation.on_card import checked_count_held, counts_held, on_card
from jupyter_gpumem.tuner.estimation.quantized import paged_note
from jupyter_gpumem.tuner.estimation.rank_estimates import estimate_ranks
from jupyter_gpumem.tuner.estimation.search import budget_of, largest_fitting, sizes_of
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.tuner.workload import Workload

_SETTINGS = (
    "checkpoint",
    "every",
    "precision",
    "optimizer",
    "parallel",
    "world_size",
    "accumulate",
    "lora",
    "offload",
    "cpu_offload",
    "inference_mode",
)


def config_of(settings: Mapping[str, Any]) -> Config:
    """The Config that ``**settings`` names: ``config=Config(...)`` or its fields."""
    if "config" in settings:
        config = settings["config"]
        if len(settings) > 1 or not isinstance(config, Config):
            raise TypeError(
                "pass either config=Config(...) or the settings checkpoint=, every=, "
                "precision=, optimizer= (as in techniques.apply), not both"
            )
        return config
    unknown = sorted(set(settings) - set(_SETTINGS))
    if unknown:
        raise TypeError(
            f"unknown setting {', '.join(unknown)}; allowed: {', '.join(_SETTINGS)} "
            "(as in techniques.apply), or config=Config(...)"
        )
    return Config(**settings)


def estimate_workload(
    workload: Workload,
    config: Config,
    *,
    batch: Any = None,
    make_batch: Callable[[], Any] | None = None,
    batch_size: int | None = None,
    gpu: str | None = None,
    primed: bool = False,
    count_held: bool = True,
) -> Estimate:
    """The estimate of ``workload`` under ``config``, with its batch unless one is given.

    ``gpu`` names the card to judge it on (see :mod:`.cards`); by default the GPU present.
    ``primed`` warms up as :func:`.fake_step.run_fake` says (a search's anchors: the same
    allocated peak at about half the cost; one process only). ``count_held=False`` leaves out
    what the process already holds on the GPU (the estimate of a fresh process).
    """
    import torch

    checked_count_held(count_held)
    t0 = time.perf_counter()
    device = workload.device
    target = None if gpu is None else cards.card(gpu)
    if without_cuda.needed(torch, device, gpu):
        card = without_cuda.card_for(gpu)
        why = without_cuda.refused(card, config, _uses_bf16(workload, config))
        if why is not None:
            return unavailable(config, card.name, why, batch_size, t0)
        return without_cuda.estimate(
            workload, config, card, batch=batch, make_batch=make_batch,
            batch_size=batch_size, primed=primed,
            notes=tuple(checkpoint_notes(workload.model, config)),
        )  # fmt: skip
    missing = cuda_unusable(torch, device)
    if missing is None and target is not None and not target.bf16 and _uses_bf16(workload, config):
        missing = f"the {target.name} has no bfloat16 support; choose fp16-autocast or fp32"
    if missing is not None:
        return unavailable(config, device, missing, batch_size, t0)
    if config.parallel is not None:
        return estimate_ranks(
            workload, config, batch=batch, make_batch=make_batch, batch_size=batch_size, gpu=target
        )
    own_batch = make_batch is None and (batch is None or batch is workload.batch)
    cuda = device.type == "cuda"
    facts = fake_peaks.device_facts(torch, device) if cuda else None
    warmup = min(workload.warmup, 1)
    try:
        run = run_fake(
            workload.model,
            workload.optimizer,
            workload.loss_fn,
            device,
            config,
            batch=workload.batch if batch is None else batch,
            make_batch=make_batch,
            warmup=warmup,
            steps=1 if warmup else min(workload.steps, 2),
            measured_steps=workload.steps if warmup else 1,
            inference=workload.inference,
            primed=primed,
        )
    except Unfakeable as exc:
        return unavailable(config, device, str(exc), batch_size, t0)
    notes = [
        *checkpoint_notes(workload.model, config),
        *run.checks,
        *filter(None, [run.blocks]),
        *run.kernels,
    ]
    if run.left_out_bytes:
        notes.append(paged_note(run.left_out_bytes))
    if cuda:
        assert facts is not None
        drop = _cleared(torch, workload, device, keep=set(run.real.values()), batch=not own_batch)
        segments, foreign = fake_peaks.start_layout(torch, device, drop)
        counted = counts_held(count_held, facts, target)
        peaks = fake_peaks.cuda_peaks(
            run, segments, foreign, workspaces=facts.workspace_sizes, count_held=counted
        )
        notes.extend(fake_peaks.allocator_notes())
    else:
        peaks = fake_peaks.cpu_peaks(run)
    found = from_peaks(
        peaks,
        facts,
        label=str(config),
        device=str(device),
        t0=t0,
        batch_size=batch_size,
        notes=tuple(notes),
        config=config,
    )
    return on_card(found, facts, target) if facts is not None else found


def _uses_bf16(workload: Workload, config: Config) -> bool:
    import torch

    if config.precision in ("bf16", "bf16-autocast"):
        return True
    return any(p.dtype == torch.bfloat16 for p in workload.model.parameters())


def cuda_unusable(torch: Any, device: Any) -> str | None:
    """Why a CUDA estimate cannot run in this process, if it cannot.

    Fake CUDA tensors need a torch built with CUDA (no GPU is needed to build them): on a
    CPU-only build, autograd over them aborts the whole process, so it is never tried.
    """
    if device.type != "cuda":
        return None
    if not torch.backends.cuda.is_built():
        return (
            f"this torch ({torch.__version__}) is built without CUDA, and fake CUDA tensors "
            "need a CUDA build (no GPU is needed): pip install torch --index-url "
            "https://download.pytorch.org/whl/cu128, or estimate on device='cpu'"
        )
    if not cuda_present(torch):  # asked without poisoning fork: ranks may be forked next
        return (
            "no GPU is present, and the estimate starts from the GPU's own layout and library "
            "workspaces: run it where the GPU is, or estimate on device='cpu'"
        )
    return None


def checkpoint_notes(model: Any, config: Config) -> list[str]:
    """What the run will warn about its checkpointed regions (single layers that free nothing,
    BatchNorm updated twice, a region too big to save), so that the estimate says it too."""
    from jupyter_gpumem.techniques.checkpointing import checkpoint_targets, region_warnings

    if config.checkpoint is None:
        return []
    try:
        targets = checkpoint_targets(model, config.checkpoint, config.every)
    except ValueError:  # the fake step fails on it and the estimate gives the reason
        return []
    return region_warnings(model, targets)


def _cleared(
    torch: Any, workload: Workload, device: Any, *, keep: set[int], batch: bool
) -> set[int]:
    """Addresses of what the trial frees before it starts: the user's gradients and optimizer
    state, and the trial's own batch where another one replaces it."""
    tensors: list[Any] = [p.grad for p in workload.model.parameters() if p.grad is not None]
    if workload.optimizer is not None:
        for state in workload.optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    if batch:
        from torch.utils._pytree import tree_leaves

        tensors.extend(t for t in tree_leaves(workload.batch) if isinstance(t, torch.Tensor))
    out = set()
    for t in tensors:
        if t.device == device:
            address = t.untyped_storage().data_ptr()
            if address not in keep:
                out.add(address)
    return out


def max_batch_size(
    workload: Workload,
    budget: int | str,
    make_batch: Callable[[int], Any],
    *,
    low: int = 1,
    high: int | None = None,
    config: Config | None = None,
    count_held: bool = True,
    gpu: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> BatchSearch:
    """The largest batch size in [low, high] whose estimate fits ``budget``; 0 where even
    ``low`` does not (with a warning that says so).

    Peaks grow about linearly with the batch, so each guess is where the first phase's line
    through the nearest estimates on both sides crosses the budget (doubling while none is
    above), kept strictly inside the bracket: a handful of fake runs. Raises
    :class:`EstimateUnavailable` when a size cannot be estimated.
    ``count_held`` and ``gpu`` as in :func:`estimate_workload`; ``progress`` is told of each
    estimate as it begins.
    """
    budget_bytes = budget_of(budget)
    checked_count_held(count_held)
    if not callable(make_batch):
        raise TypeError("make_batch must be a callable make_batch(n) -> a batch of n samples")
    low, high = sizes_of(low, high)
    t0 = time.perf_counter()
    config = config if config is not None else Config()
    made: dict[int, Estimate] = {}

    def peak(n: int) -> int:
        if n not in made:
            made[n] = estimate_workload(
                workload,
                config,
                make_batch=lambda: make_batch(n),
                batch_size=n,
                gpu=gpu,
                count_held=count_held,
            )
        est = made[n]
        if est.peak_bytes is None:
            raise EstimateUnavailable(f"batch size {n} cannot be estimated: {est.reason}")
        return est.peak_bytes

    size = largest_fitting(
        peak, budget_bytes, low, high, "batch size", progress, lambda n: made[n].phase_peaks
    )
    return batch_search(size, low, budget_bytes, made, t0)
