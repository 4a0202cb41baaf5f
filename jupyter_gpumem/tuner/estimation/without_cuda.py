"""A CUDA estimate on a torch without CUDA: the fake step on the stand-in device, in a child process.

Asked for a GPU from a CPU-only torch (``device="cuda"`` there, or ``gpu=`` with
``device="cpu"``), the estimate runs in a process forked for it: the model, optimizer and batch
are the kernel's, read and never written (the child's pages are its own copies), and the child
registers the stand-in device (:mod:`.cuda_stand_in`), which would change the kernel's torch for
good. There the model goes to the meta device (real weights only say their layout), the fake
step runs on the stand-in device, and the allocator model places its storages from a fresh
process's layout on the card. The figures come back as an :class:`~.estimate.Estimate`, with
the line "estimated without CUDA, for the <card>" first among its notes.

Known limitations:
- No GPU is asked about: the card's capacity, workspaces and CUDA context come from tables
  (:mod:`.cards`, :mod:`.cuda_stand_in`), and what the process already holds on a GPU is none.
- Ops that branch on ``device.type == "cuda"`` in the user's or a library's Python code take
  their other branch; kernels that allocate for themselves (cuDNN's convolution workspaces) are
  not modelled.
- Forking needs a POSIX system (Linux, macOS); elsewhere the estimate says so.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.estimation import cards, cuda_stand_in, fake_peaks
from jupyter_gpumem.tuner.estimation.estimate import Estimate, from_peaks, unavailable
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.tuner.workload import Workload

DEFAULT_CARD = "H100-80GB"  # the card of device="cuda" without gpu=, on a torch without CUDA


def needed(torch: Any, device: Any, gpu: str | None) -> bool:
    """Whether an estimate on ``device`` for ``gpu`` goes without CUDA: a CUDA device on a
    torch built without it, or a card named for a trial on another device."""
    if device.type == "cuda":
        return not torch.backends.cuda.is_built()
    return gpu is not None


def card_for(gpu: str | None) -> cards.Card:
    """The card an estimate without CUDA is for: ``gpu``, or :data:`DEFAULT_CARD`."""
    return cards.card(DEFAULT_CARD if gpu is None else gpu)


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
    """The estimate of ``workload`` under ``config`` on ``card``, made in a forked child."""
    import torch

    t0 = time.perf_counter()
    why = cuda_stand_in.unavailable(torch)
    if why is None and "fork" not in multiprocessing.get_all_start_methods():
        why = "estimating for a GPU without CUDA forks a process, which this system cannot"
    if why is not None:
        return unavailable(config, card.name, why, batch_size, t0)

    def child() -> Estimate:
        return _in_child(workload, config, card, batch, make_batch, batch_size, primed, t0)

    found = in_fork(child)
    if isinstance(found, str):
        return unavailable(config, card.name, found, batch_size, t0)
    return replace(found, notes=(*found.notes, *notes))


def in_fork(work: Callable[[], Any]) -> Any:
    """``work()`` run in a forked child, its result pickled back; a string says why it failed."""
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)

    def main() -> None:
        try:
            payload = pickle.dumps(("ok", work()))
        except BaseException as exc:  # everything goes back, as the reason
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            payload = pickle.dumps(("failed", detail))
        try:
            writer.send_bytes(payload)
        finally:
            os._exit(0)

    process = context.Process(target=main, daemon=True)
    process.start()
    writer.close()
    try:
        payload = reader.recv_bytes()
    except EOFError:
        process.join()
        return f"the estimate's process ended without an answer (exit code {process.exitcode})"
    finally:
        reader.close()
    process.join()
    status, value = pickle.loads(payload)
    return value if status == "ok" else str(value)


def _in_child(
    workload: Workload,
    config: Config,
    card: cards.Card,
    batch: Any,
    make_batch: Callable[[], Any] | None,
    batch_size: int | None,
    primed: bool,
    t0: float,
) -> Estimate:
    """The estimate, in the child: the stand-in device registered, the model on meta."""
    import torch
    from torch.utils._pytree import tree_map

    from jupyter_gpumem.tuner.estimation.fake_step import run_fake
    from jupyter_gpumem.tuner.estimation.on_card import on_card
    from jupyter_gpumem.tuner.estimation.predict import checkpoint_notes

    device = cuda_stand_in.device(torch)

    def to_meta(value: Any) -> Any:
        return value.to("meta") if isinstance(value, torch.Tensor) else value

    workload.model.to("meta")
    made = None if make_batch is None else (lambda: tree_map(to_meta, make_batch()))
    warmup = min(workload.warmup, 1)
    try:
        with cuda_stand_in.made_there()():
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
                inference=workload.inference,
                primed=primed,
            )
    except Unfakeable as exc:
        return unavailable(config, card.name, str(exc), batch_size, t0)
    facts = cuda_stand_in.facts(card)
    peaks = fake_peaks.cuda_peaks(run, cuda_stand_in.fresh_layout(card), count_held=False)
    notes = [headline(card), *checkpoint_notes(workload.model, config), *run.checks]
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
