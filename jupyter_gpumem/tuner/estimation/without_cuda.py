"""A CUDA estimate on a torch without CUDA: the fake step on the stand-in device, in a worker process.

Asked for a GPU where torch has no CUDA or no GPU is present (``device="cuda"`` there, or
``gpu=`` with ``device="cpu"``), the estimate runs in a process of its own (:class:`Worker`),
which registers the stand-in device (:mod:`.cuda_stand_in`): that would change the kernel's torch
for good. The model, optimizer and batch travel as their layouts (every tensor a meta tensor,
no weights copied); the fake step runs on the stand-in device, and the allocator model places
its storages from a fresh process's layout on the card. The figures come back as an
:class:`~.estimate.Estimate`, with the line "estimated without CUDA, for the <card>" first among
its notes.

Known limitations:
- No GPU is asked about: the card's capacity, workspaces and CUDA context come from tables
  (:mod:`.cards`, :mod:`.cuda_stand_in`), and what the process already holds on a GPU is none.
- Ops that branch on ``device.type == "cuda"`` in the user's or a library's Python code take
  their other branch; cuDNN's and the attention kernels' workspaces, which an estimate on the GPU measures
  there (:mod:`.workspace_probes`), are not counted.
- The worker's first job imports torch and the model's libraries (seconds); later ones do
  not. What cannot be pickled (a loss function holding an open file) cannot travel, and the
  estimate says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tracking.devices import cuda_present
from jupyter_gpumem.tuner.estimation import (
    block_replay,
    cards,
    cuda_stand_in,
    fake_peaks,
    graph_pool,
)
from jupyter_gpumem.tuner.estimation.estimate import Estimate, from_peaks, unavailable
from jupyter_gpumem.tuner.estimation.fake_step import run_fake
from jupyter_gpumem.tuner.estimation.on_card import on_card
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.tuner.estimation.worker_process import Worker
from jupyter_gpumem.tuner.workload import Workload

DEFAULT_CARD = "H100-80GB"  # the card of device="cuda" without gpu=, on a torch without CUDA


def needed(torch: Any, device: Any, gpu: str | None) -> bool:
    """Whether an estimate on ``device`` for ``gpu`` goes without CUDA: a CUDA device where
    torch is built without it or no GPU is present, or a card named for a trial on another
    device."""
    if device.type == "cuda":
        return not torch.backends.cuda.is_built() or not cuda_present(torch)
    return gpu is not None


def card_for(gpu: str | None) -> cards.Card:
    """The card an estimate without CUDA is for: ``gpu``, or :data:`DEFAULT_CARD`."""
    return cards.card(DEFAULT_CARD if gpu is None else gpu)


def refused(card: cards.Card, config: Config, bf16: bool) -> str | None:
    """Why ``config`` cannot be estimated for ``card`` without CUDA; None where it can."""
    if config.parallel is not None:
        return (
            f"a parallel configuration ({config.parallel}) is estimated per rank where CUDA is "
            "built; without CUDA, estimate one process's configuration (parallel=None) or run "
            "where CUDA is"
        )
    if bf16 and not card.bf16:
        return f"the {card.name} has no bfloat16 support; choose fp16-autocast or fp32"
    return None


def headline(card: cards.Card) -> str:
    """The note that says how the estimate was made."""
    return f"estimated without CUDA, for the {card.name}"


def estimate(
    workload: Workload,
    config: Config,
    card: cards.Card,
    *,
    batch: Any = None,
    make_batch: Callable[[], Any] | None = None,
    batch_size: int | None = None,
    primed: bool = False,
    notes: tuple[str, ...] = (),
) -> Estimate:
    """The estimate of ``workload`` under ``config`` on ``card``, made in the worker process."""
    import torch

    t0 = time.perf_counter()
    why = cuda_stand_in.unavailable(torch)
    if why is not None:
        return unavailable(config, card.name, why, batch_size, t0)
    job = (workload, config, card, batch, make_batch, batch_size, primed)
    found = _answer(_estimate_job, job, config, card, batch_size, t0)
    return replace(found, notes=(*found.notes, *notes))


def estimate_generate(
    model: Any,
    card: cards.Card,
    sizes: tuple[int, int, int],
    generate_kwargs: dict[str, Any],
    label: str,
    run: Callable[..., tuple[Any, tuple[str, ...]]],
) -> Estimate:
    """The estimate of ``model.generate`` for (batch, prompt, new tokens) on ``card``;
    ``run(torch, model, device, sizes, generate_kwargs, fill_in)`` makes its fake run
    (:func:`.generation.generate_run`)."""
    import torch

    t0 = time.perf_counter()
    why = cuda_stand_in.unavailable(torch)
    if why is None and not card.bf16:
        if any(p.dtype == torch.bfloat16 for p in model.parameters()):
            why = f"the {card.name} has no bfloat16 support; load the model in float16 or float32"
    if why is not None:
        return unavailable(Config(), card.name, why, sizes[0], t0)
    job = (model, card, sizes, generate_kwargs, label, run)
    return _answer(_generate_job, job, Config(), card, sizes[0], t0)


def _answer(
    work: Callable[[Any], Any],
    job: Any,
    config: Config,
    card: cards.Card,
    batch_size: int | None,
    t0: float,
) -> Estimate:
    """``work(job)`` done by the worker, as an Estimate (the reason where it failed)."""
    switches = (block_replay.ENABLED, fake_peaks.CHECKED)  # as the worker is to see them
    try:
        found = WORKER.call(_switched, (work, job, switches))
    except BaseException:
        WORKER.stop()  # an interrupt leaves the worker mid-estimate: a fresh one next time
        raise
    if isinstance(found, str):
        return unavailable(config, card.name, found, batch_size, t0)
    return replace(found, wall_s=time.perf_counter() - t0)


def _switched(job: tuple[Any, ...]) -> Any:
    """``work(job)`` in the worker, with the caller's switches (:data:`.block_replay.ENABLED`,
    :data:`.fake_peaks.CHECKED`)."""
    work, inner, (block_replay.ENABLED, fake_peaks.CHECKED) = job
    return work(inner)


def _estimate_job(job: tuple[Any, ...]) -> Estimate:
    workload, config, card, batch, make_batch, batch_size, primed = job
    return _in_worker(
        workload, config, card, batch, make_batch, batch_size, primed, time.perf_counter()
    )


def _generate_job(job: tuple[Any, ...]) -> Estimate:
    """``generate``'s estimate, in the worker."""
    import torch

    model, card, sizes, generate_kwargs, label, generate_run = job
    t0 = time.perf_counter()
    device = cuda_stand_in.device(torch)
    cuda_stand_in.aim(card)
    model.to("meta")
    _as_constructed(model)
    try:
        with _compiles_as_on_cuda(torch):
            graphs = graph_pool.requests(card.capability, card.l2_cache_bytes)
            run, notes = generate_run(torch, model, device, sizes, generate_kwargs, True, graphs)
    except Unfakeable as exc:
        return unavailable(Config(), card.name, str(exc), sizes[0], t0)
    facts = cuda_stand_in.facts(card)
    peaks = fake_peaks.cuda_peaks(run, cuda_stand_in.fresh_layout(card), count_held=False)
    found = from_peaks(
        peaks, facts, label=label, device=card.name, t0=t0, batch_size=sizes[0],
        notes=(headline(card), *notes),
    )  # fmt: skip
    return on_card(found, facts, None)


def caveats(torch: Any, model: Any, config: Config) -> list[str]:
    """What the estimate without CUDA cannot model for this model and configuration, by op."""
    from jupyter_gpumem.tuner.estimation import cuda_autocast

    notes = []
    convolutions = (torch.nn.modules.conv._ConvNd,)
    if any(isinstance(m, convolutions) for m in model.modules()):
        notes.append(
            "cuDNN's convolution workspaces are not counted (an estimate on the GPU measures "
            "them): on an H200 they took the reserved peak of convolutional models up to 9% "
            "above an estimate without them (ResNet-50)"
        )
    unlisted = cuda_autocast.unlisted(torch)
    if unlisted and config.precision in ("bf16-autocast", "fp16-autocast"):
        notes.append(
            f"ops this torch autocasts on CUDA run uncast here ({', '.join(unlisted)}): where the "
            "model calls them, their outputs' dtype may differ from CUDA's"
        )
    return notes


def _as_constructed(model: Any) -> None:
    """What a model's construction records outside it, recorded again for one that arrived
    pickled: transformers' registry of the outputs each model class captures (keyed by class,
    filled in ``PreTrainedModel.__init__``; without it LLaVA's vision tower returns no hidden
    states)."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:
        return
    for module in model.modules():
        outputs = getattr(module, "_can_record_outputs", None)
        if outputs is not None:
            _CAN_RECORD_REGISTRY[module] = outputs


@contextmanager
def _compiles_as_on_cuda(torch: Any) -> Iterator[None]:
    """transformers' generate decides to compile where the model is on CUDA: on the stand-in
    device it decides as it would there (and the estimate then gives its reason)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:
        yield
        return
    original = GenerationMixin.__dict__.get("_valid_auto_compile_criteria")
    if original is None:
        yield
        return

    def criteria(self: Any, *args: Any, **kwargs: Any) -> bool:
        cls = type(self)
        own = cls.__dict__.get("device")
        cls.device = property(lambda _: torch.device("cuda", 0))  # type: ignore[attr-defined]
        try:
            return bool(original(self, *args, **kwargs))
        finally:
            if own is None:
                del cls.device  # type: ignore[attr-defined]
            else:
                cls.device = own  # type: ignore[attr-defined]

    GenerationMixin._valid_auto_compile_criteria = criteria  # type: ignore[method-assign]
    try:
        yield
    finally:
        GenerationMixin._valid_auto_compile_criteria = original  # type: ignore[method-assign]


def prepare() -> None:
    """The worker's first act: the stand-in device registered, before any backward runs
    (autograd sizes its device queues once per process, at its first backward)."""
    import torch

    cuda_stand_in.device(torch)


WORKER = Worker(prepare=f"{__name__}:prepare")


def _in_worker(
    workload: Workload,
    config: Config,
    card: cards.Card,
    batch: Any,
    make_batch: Callable[[], Any] | None,
    batch_size: int | None,
    primed: bool,
    t0: float,
) -> Estimate:
    """The estimate, in the worker: the model on the meta device, the step on the stand-in."""
    import torch
    from torch.utils._pytree import tree_map

    device = cuda_stand_in.device(torch)
    cuda_stand_in.aim(card)

    def to_meta(value: Any) -> Any:
        return value.to("meta") if isinstance(value, torch.Tensor) else value

    workload.model.to("meta")
    _as_constructed(workload.model)
    made = None if make_batch is None else (lambda: tree_map(to_meta, make_batch()))
    warmup = min(workload.warmup, 1)
    try:
        run = run_fake(
            workload.model,
            workload.optimizer,
            workload.loss_fn,
            device,
            config,
            batch=tree_map(to_meta, workload.batch if batch is None else batch),
            make_batch=made,
            warmup=warmup,
            steps=1 if warmup else min(workload.steps, 2),
            measured_steps=workload.steps if warmup else 1,
            inference=workload.inference,
            primed=primed,
        )
    except Unfakeable as exc:
        return unavailable(config, card.name, str(exc), batch_size, t0)
    facts = cuda_stand_in.facts(card)
    peaks = fake_peaks.cuda_peaks(run, cuda_stand_in.fresh_layout(card), count_held=False)
    notes = [
        headline(card),
        *caveats(torch, workload.model, config),
        *run.checks,
        *filter(None, [run.blocks]),
    ]
    found = from_peaks(
        peaks,
        facts,
        label=str(config),
        device=card.name,
        t0=t0,
        batch_size=batch_size,
        notes=tuple(notes),
        config=config,
    )
    return on_card(found, facts, None)
