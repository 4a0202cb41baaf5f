"""Will it run? The peak of a ``generate`` call, weights included, predicted on fake tensors.

The model's own ``generate`` runs, its parameters and buffers swapped for fakes (a meta model is
enough), on a prompt of ``batch_size x prompt_tokens`` token ids with an attention mask of ones,
as a tokenizer gives them, made where it would run. Where ``generate`` reads a value that fakes
do not have, it reads what a prompt without padding gives (the mask and what is made of it are
followed as all ones; any other read is false), and no sequence ends early: every sequence
takes ``max_new_tokens`` steps, the most memory the call can take. The model's calls
mark the ``prefill`` and ``decode`` phases, each lasting until the next call, and the cache each
call returns is ``kv_cache`` from its making, as a measured cell tags it (a growing cache's
tensors included, which the next call's concatenation replaces).

Known limitations:
- Decoding strategies that read scores to decide (beam search's early stopping, assisted
  decoding) are answered as above and may take other branches than a real call.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from jupyter_gpumem.tracking.devices import cuda_present
from jupyter_gpumem.tuner.estimation import cards, fake_peaks, graph_pool, without_cuda
from jupyter_gpumem.tuner.estimation.decode_steps import (
    STEADY_STEPS,
    DecodeClocks,
    Unfollowed,
    filled_in,
)
from jupyter_gpumem.tuner.estimation.estimate import (
    BatchSearch,
    Estimate,
    EstimateUnavailable,
    batch_search,
    from_peaks,
    unavailable,
)
from jupyter_gpumem.tuner.estimation.fake_objects import Faker, swapped
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun, reason, recording_mode, run_of
from jupyter_gpumem.tuner.estimation.known_values import known_values
from jupyter_gpumem.tuner.estimation.on_card import checked_count_held, counts_held, on_card
from jupyter_gpumem.tuner.estimation.predict import cuda_unusable
from jupyter_gpumem.tuner.estimation.search import (
    budget_of,
    largest_fitting,
    size_of,
    sizes_of,
)
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable
from jupyter_gpumem.tuner.estimation.untraced import untraced
from jupyter_gpumem.tuner.progress import progress_of
from jupyter_gpumem.tuner.rng import rng_kept
from jupyter_gpumem.tuner.workload import indexed

__all__ = ["estimate_generate", "max_generate_batch", "peaks_of"]


def estimate_generate(
    model: Any,
    *,
    batch_size: int,
    prompt_tokens: int,
    max_new_tokens: int,
    device: Any = None,
    gpu: str | None = None,
    count_held: bool = True,
    **generate_kwargs: Any,
) -> Estimate:
    """The peak of ``model.generate(...)`` for this batch, prompt and output, on ``device``.

    ``device`` is where it would run (the GPU present, else the CPU); ``gpu`` names a card to
    judge the verdict on (see :mod:`.cards`). ``generate_kwargs`` go to ``generate`` as given
    (``cache_implementation="static"``, ``do_sample=True``, ...). Nothing runs on the device.
    What the process already holds on the GPU is counted (``held_before``) unless
    ``count_held=False`` (a loaded copy the model will replace), and never for another card.
    """
    import torch

    checked_count_held(count_held)
    t0 = time.perf_counter()
    size_of("batch_size", batch_size)
    for name, value in (("prompt_tokens", prompt_tokens), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} is a whole number from 1 up, got {value!r}")
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"estimate_generate() takes a model with .generate(), got {type(model)}")
    for taken in ("input_ids", "attention_mask", "max_new_tokens", "max_length"):
        if taken in generate_kwargs:
            raise ValueError(f"{taken} comes from batch_size, prompt_tokens and max_new_tokens")
    device = indexed(torch, device or ("cuda" if cuda_present(torch) else "cpu"))
    label = f"generate: {batch_size} x {prompt_tokens} tokens + {max_new_tokens} new"
    from jupyter_gpumem.techniques import Config

    target = None if gpu is None else cards.card(gpu)
    sizes = (batch_size, prompt_tokens, max_new_tokens)
    if without_cuda.needed(torch, device, gpu):
        card = without_cuda.card_for(gpu)
        found = without_cuda.estimate_generate(
            model, card, sizes, generate_kwargs, label, generate_run
        )
        return _labelled(found, label)
    missing = cuda_unusable(torch, device)
    if missing is not None:
        return _labelled(unavailable(Config(), device, missing, batch_size, t0), label)
    facts = fake_peaks.device_facts(torch, device) if device.type == "cuda" else None
    graphs = None if facts is None else graph_pool.requests(facts.capability, facts.l2_cache_bytes)
    try:
        run, notes = generate_run(
            torch, model, device, sizes, generate_kwargs, facts is not None, graphs
        )
    except Unfakeable as exc:
        return _labelled(unavailable(Config(), device, str(exc), batch_size, t0), label)
    if facts is not None:
        segments, foreign = fake_peaks.start_layout(torch, device, ())
        counted = counts_held(count_held, facts, target)
        peaks = fake_peaks.cuda_peaks(
            run, segments, foreign, workspaces=facts.workspace_sizes, count_held=counted
        )
    else:
        peaks = fake_peaks.cpu_peaks(run)
    found = from_peaks(
        peaks, facts, label=label, device=str(device), t0=t0, batch_size=batch_size, notes=notes
    )
    return on_card(found, facts, target) if facts is not None else found


def generate_run(
    torch: Any,
    model: Any,
    device: Any,
    sizes: tuple[int, int, int],
    generate_kwargs: dict[str, Any],
    fill_in: bool,
    graphs: graph_pool.PoolRequests | None = None,
) -> tuple[FakeRun, tuple[str, ...]]:
    """The fake run of ``generate`` for (batch, prompt, new tokens), and its notes; decode
    steps skipped where they repeat (``fill_in``: filled in for the allocator model).
    ``graphs``: what a compiled call asks of its CUDA graph pool (:mod:`.graph_pool`), None
    where the device runs no CUDA graphs. Raises :class:`Unfakeable` where it cannot run on fake
    tensors."""
    notes: tuple[str, ...] = ()
    try:  # the allocator model places every step's blocks: the skipped ones filled in
        run = _run(
            torch, model, device, *sizes, generate_kwargs, graphs, skip=True, fill_in=fill_in
        )
    except _NoSkip:  # this transformers' generate runs its first call otherwise: every step
        run = _run(torch, model, device, *sizes, generate_kwargs, graphs, skip=False)
    except Unfollowed as exc:
        notes = (
            "every decode step ran: the steps skipped otherwise cannot be filled in for the "
            f"allocator model ({exc})",
        )
        run = _run(torch, model, device, *sizes, generate_kwargs, graphs, skip=False)
    return run, (*notes, graph_pool.NOTE) if run.pooled else notes


def max_generate_batch(
    model: Any,
    budget: int | str,
    *,
    prompt_tokens: int,
    max_new_tokens: int,
    low: int = 1,
    high: int | None = None,
    device: Any = None,
    gpu: str | None = None,
    count_held: bool = True,
    progress: Any = True,
    **generate_kwargs: Any,
) -> BatchSearch:
    """The largest batch whose ``generate`` (this prompt, this output) is estimated within ``budget``.

    ``budget`` is bytes or a size such as ``"20GiB"``; the peak compared is the allocated
    one, as ``torch.cuda.max_memory_allocated()`` reads it. 0 where even ``low`` does not
    fit. Raises :class:`~.estimate.EstimateUnavailable` where a batch cannot be estimated.
    ``gpu`` names the card to estimate for, as in :func:`estimate_generate`. ``progress``: True
    shows the estimate running once the call has taken two seconds, False nothing, a callable
    is told of each estimate as it begins.
    """
    budget_bytes = budget_of(budget)
    low, high = sizes_of(low, high)
    t0 = time.perf_counter()
    made: dict[int, Estimate] = {}

    def batch_of(n: int) -> Estimate:
        return estimate_generate(
            model,
            batch_size=n,
            prompt_tokens=prompt_tokens,
            max_new_tokens=max_new_tokens,
            device=device,
            gpu=gpu,
            count_held=count_held,
            **generate_kwargs,
        )

    peak = peaks_of(batch_of, made, "batch size {}")
    with progress_of(progress, "max_generate_batch") as say:
        size = largest_fitting(
            peak, budget_bytes, low, high, "batch size", say, lambda n: made[n].phase_peaks
        )
    return batch_search(size, low, budget_bytes, made, t0)


def peaks_of(
    estimate: Callable[[int], Estimate], made: dict[int, Estimate], what: str
) -> Callable[[int], int]:
    """The peak of each size for :func:`~.search.largest_fitting`, its estimate kept in
    ``made``; a size that cannot be estimated raises :class:`~.estimate.EstimateUnavailable`
    naming it (``what`` is formatted with the size: ``"batch size {}"``)."""

    def peak(n: int) -> int:
        made[n] = found = estimate(n)
        if found.peak_bytes is None:
            raise EstimateUnavailable(f"{what.format(n)} cannot be estimated: {found.reason}")
        return found.peak_bytes

    return peak


def _labelled(found: Estimate, label: str) -> Estimate:
    from dataclasses import replace

    return replace(found, label=label)


# With a cache that grows by concatenation, each decode step takes more than the one before
# it, and with a cache made ahead (static) each takes what the one before took, but for the
# tokens so far: either way the first steps and the last ones hold the call's peak, and the
# steps between are skipped (on a GPU, a growing cache's are filled in for the allocator model:
# its blocks are placed among the holes of every step before, see decode_steps).
FIRST_STEPS = 2  # the prefill and the first decode step, run as the call runs them
LAST_STEPS = 2  # the last decode steps, run on a cache filled to their length
# what makes a step's memory depend on more than its cache's length: kept step by step
_STEP_BY_STEP = ("num_beams", "num_beam_groups", "penalty_alpha", "assistant_model",
                 "prompt_lookup_num_tokens", "output_scores", "output_logits",
                 "output_attentions", "output_hidden_states", "past_key_values", "cache")  # fmt: skip
# what changes a step's work at a step counted from the prompt, which the last steps' call (its
# prompt the tokens so far) would count from its own: kept step by step
_FROM_PROMPT = ("exponential_decay_length_penalty", "begin_suppress_tokens")


def _run(
    torch: Any,
    model: Any,
    device: Any,
    batch_size: int,
    prompt_tokens: int,
    max_new_tokens: int,
    kwargs: dict[str, Any],
    graphs: graph_pool.PoolRequests | None = None,
    *,
    skip: bool,
    fill_in: bool = False,
) -> FakeRun:
    """The fake run of the call, its middle steps skipped where ``skip`` allows; with
    ``fill_in``, those of a growing cache filled in for the allocator model
    (:func:`~.decode_steps.filled_in`, which raises :class:`~.decode_steps.Unfollowed`).
    A compiled call's decode calls are placed in a CUDA graph pool asked for ``graphs``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    log = StorageLog(torch, device, mode)
    faker = Faker(torch, log, meta_to=device)
    pool = None if graphs is None else graph_pool.GraphPool(log, graphs)
    calls = [0]

    def mark(module: Any, args: Any) -> None:  # each call starts a step that lasts until the next
        log.step = calls[0]
        log.mark("decode" if calls[0] else "prefill")
        if calls[0] and pool is not None:
            pool.enter()
        calls[0] += 1

    def kept(module: Any, args: Any, output: Any) -> None:  # the cache a call returns
        caches = _caches_in(output)
        for cache in caches:
            _tag_cache(torch, log, cache)
        if pool is not None:
            pool.check(caches)
            pool.leave([t for cache in caches for t in _cache_tensors(cache, torch)])

    long = skip and max_new_tokens > FIRST_STEPS + LAST_STEPS
    long = long and not _counted_from_prompt(model, kwargs, max_new_tokens)
    steady = STEADY_STEPS if fill_in else 0  # the steps the filling-in reads its pattern from
    growing = long and max_new_tokens > FIRST_STEPS + steady + LAST_STEPS
    growing = growing and _grows_by_cat(model, kwargs)
    first_checks: list[int] = []  # the log's clock at each check of generate's loop
    last_checks: list[int] = []
    first_end = last_end = 0
    ahead = long and not growing and _made_ahead(model, kwargs)
    with rng_kept(torch), mode, swapped(torch, model, faker):
        ids = faker.fresh((batch_size, prompt_tokens), torch.long, "inputs")
        mask = faker.fresh((batch_size, prompt_tokens), torch.long, "inputs")
        faker.done()
        start = tuple(sorted(log.live().values()))
        prompt = {ids.untyped_storage()._cdata, mask.untyped_storage()._cdata}
        handles = (model.register_forward_pre_hook(mark), model.register_forward_hook(kept))
        try:
            with (
                recording_mode()(log),
                known_values([mask], strict=False),
                untraced(lambda: prompt, unpadded=True),
                torch.no_grad(),
            ):
                log.recording = True
                first = (
                    FIRST_STEPS + steady if growing else FIRST_STEPS if ahead else max_new_tokens
                )
                # a cache made ahead is made for every new token: the call asks for them all
                key, layers = _generate(
                    torch, model, log, ids, mask, first, kwargs, max_new_tokens, first_checks, pool
                )
                first_end = log.clock
                seen = prompt_tokens + max_new_tokens - LAST_STEPS
                if ahead:  # the last steps: their prompt's first call taken as one decode step
                    calls[0] = max_new_tokens - LAST_STEPS
                    with _positions_of(mask), _first_call_decodes(model):
                        _generate(
                            torch, model, log,
                            ids[:, :1].expand(batch_size, seen), mask[:, :1].expand(batch_size, seen),
                            LAST_STEPS, kwargs, pool=pool,
                        )  # fmt: skip
                if growing:
                    if layers is None:
                        raise Unfakeable("the cache generate made does not grow by concatenation")
                    # the last steps' prompt: the tokens so far, a view of the prompt's memory
                    # (the call holds the tokens it was given, the prompt, not the ones made)
                    cache = _filled(torch, layers, seen - 1, model)
                    _tag_cache(torch, log, cache)  # as the call before returned it
                    calls[0] = max_new_tokens - LAST_STEPS
                    tail = {**kwargs, key: cache}
                    del cache, layers
                    with _positions_of(mask):
                        _generate(
                            torch, model, log,
                            ids[:, :1].expand(batch_size, seen), mask[:, :1].expand(batch_size, seen),
                            LAST_STEPS, tail, checks=last_checks, pool=pool,
                        )  # fmt: skip
                    last_end = log.clock
                    del tail
                log.recording = False
        except (Unfakeable, _NoSkip):
            raise
        except Exception as exc:
            raise Unfakeable(reason(exc)) from exc
        finally:
            log.recording = False
            for handle in handles:
                handle.remove()
    run = run_of(log, device, (0, 0, start, frozenset(start)))
    if not (fill_in and growing):
        return run
    clocks = DecodeClocks(
        max_new_tokens, tuple(first_checks), first_end, tuple(last_checks), last_end
    )
    return filled_in(run, clocks)


def _generate(
    torch: Any,
    model: Any,
    log: StorageLog,
    ids: Any,
    mask: Any,
    steps: int,
    kwargs: dict[str, Any],
    new: int | None = None,
    checks: list[int] | None = None,
    pool: graph_pool.GraphPool | None = None,
) -> tuple[str, list[tuple[Any, Any, Any]] | None]:
    """One ``generate`` of ``new`` new tokens (``steps``, where none), cut after ``steps``.
    Returns the cache's key in the output, and its layers' (shape, dtype, device) where every
    layer is a plain growing one (None otherwise). ``checks`` gains the log's clock at each
    check of generate's loop. A call generate compiles is played eagerly, its decode calls
    placed in ``pool`` (without one: :class:`Unfakeable`)."""
    if new is None or not _made_ahead(model, kwargs):
        new = steps  # a growing cache is the same whatever the call asks for
    checked = None if checks is None else (lambda: checks.append(log.clock))
    deciding = graph_pool.deciding(pool, log.device.type)
    with _steps(steps, checked), deciding, warnings.catch_warnings():
        # min_new_tokens past the first steps' end, as the real call's are not
        warnings.filterwarnings("ignore", "Unfeasible length constraints", UserWarning)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            return_dict_in_generate=True,
            **kwargs,
        )
    # the returned cache, by its key (reading the old name warns in transformers 5)
    key = next((k for k in ("cache", "past_key_values") if k in out), "past_key_values")
    return key, _growing_layers(out.get(key))


@contextmanager
def _positions_of(mask: Any) -> Iterator[None]:
    """generate's position ids made from the prompt's mask, as the call made them when it began
    (it keeps them to the end), shaped as the longer prompt of the last steps."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.__dict__.get("_prepare_position_ids_for_generation")
    if original is None:  # a transformers that makes them step by step
        yield
        return

    def prepare(self: Any, inputs: Any, model_kwargs: dict[str, Any]) -> Any:
        given = {**model_kwargs, "attention_mask": mask} if "attention_mask" in model_kwargs else {}
        made = original(self, inputs[..., : mask.shape[-1]], given or model_kwargs)
        return made[..., :1].expand(*made.shape[:-1], inputs.shape[-1])

    GenerationMixin._prepare_position_ids_for_generation = prepare  # type: ignore[method-assign]
    try:
        yield
    finally:
        GenerationMixin._prepare_position_ids_for_generation = original  # type: ignore[method-assign]


def _grows_by_cat(model: Any, kwargs: dict[str, Any]) -> bool:
    """Whether this call's cache will be transformers' dynamic cache of plain growing layers,
    and nothing else a step keeps grows with the steps (beams, scores, assistants)."""
    setting = functools.partial(_setting, model, kwargs)

    def plain(value: Any) -> bool:  # off, or one beam
        return value is None or value is False or (type(value) is int and value == 1)

    if not all(plain(setting(name)) for name in _STEP_BY_STEP):
        return False
    if setting("cache_implementation") not in (None, "dynamic") or setting("use_cache") is False:
        return False
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        supports = model._supports_default_dynamic_cache()
        layers = DynamicCache(config=model.config.get_text_config(decoder=True)).layers
    except Exception:  # an older transformers, or a model that brings its own cache
        return False
    return bool(supports) and all(type(layer) is DynamicLayer for layer in layers)


def _counted_from_prompt(model: Any, kwargs: dict[str, Any], max_new_tokens: int) -> bool:
    """Whether a step's work changes at a step counted from the prompt (``_FROM_PROMPT``, or
    ``min_new_tokens`` ending before the call does)."""
    setting = functools.partial(_setting, model, kwargs)
    least = setting("min_new_tokens")
    ends_inside = bool(least) and least < max_new_tokens
    return ends_inside or any(setting(name) is not None for name in _FROM_PROMPT)


def _setting(model: Any, kwargs: dict[str, Any], name: str) -> Any:
    """generate's ``name`` for this call: as given, else the model's generation config's."""
    if name in kwargs:
        return kwargs[name]
    return getattr(getattr(model, "generation_config", None), name, None)


def _made_ahead(model: Any, kwargs: dict[str, Any]) -> bool:
    """Whether this call's cache is transformers' static one, made for every token ahead, and
    nothing else a step keeps grows with the steps but the tokens so far."""
    config = getattr(model, "generation_config", None)
    chosen = kwargs.get("cache_implementation", getattr(config, "cache_implementation", None))
    return chosen == "static" and _grows_by_cat(model, {**kwargs, "cache_implementation": None})


class _NoSkip(Exception):
    """The steps between cannot be skipped in this transformers' generate."""


@contextmanager
def _first_call_decodes(model: Any) -> Iterator[None]:
    """generate's first call on a prompt whose tokens are all but the last in the cache (made
    ahead): prepared as the decode step of that last token it stands for. Where generate has no
    such preparation, or the model is then called on more than one token, :class:`_NoSkip`."""
    import inspect

    prepare = model.prepare_inputs_for_generation
    params = inspect.signature(prepare).parameters
    if "next_sequence_length" not in params:
        raise _NoSkip
    state = {"prepared": False, "checked": False}

    def one_token(*args: Any, **kwargs: Any) -> Any:
        if not state["prepared"]:
            state["prepared"] = True
            kwargs.update(next_sequence_length=1, is_first_iteration=False)
        return prepare(*args, **kwargs)

    def check(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if not state["checked"]:
            state["checked"] = True
            given = kwargs.get("input_ids", args[0] if args else None)
            if given is None or given.shape[-1] != 1:
                raise _NoSkip

    model.prepare_inputs_for_generation = one_token
    handle = model.register_forward_pre_hook(check, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
        del model.prepare_inputs_for_generation  # the class's own again
    if not state["checked"]:
        raise _NoSkip


def _growing_layers(cache: Any) -> list[tuple[Any, Any, Any]] | None:
    """Each layer's (keys' shape, dtype, device) of a dynamic cache of plain growing layers."""
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return None
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    found = []
    layer: Any
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if keys is None or values is None or keys.shape != values.shape:
            return None
        found.append((tuple(keys.shape), keys.dtype, keys.device))
    return found


def _filled(torch: Any, layers: list[tuple[Any, Any, Any]], length: int, model: Any) -> Any:
    """A dynamic cache holding ``length`` tokens in every layer, as generate's own would: one
    storage for each layer's keys and one for its values, and nothing else made on the way
    (filled through ``update``, which copies, a layer would hold its tokens twice for a
    moment: a peak generate's own cache, grown a token at a time, never reaches)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    made: list[Any] = list(cache.layers)
    for i, (shape, dtype, device) in enumerate(layers):
        full = (*shape[:-2], length, shape[-1])
        keys = torch.zeros(full, dtype=dtype, device=device)
        values = torch.zeros(full, dtype=dtype, device=device)
        made[i].update(keys[..., :0, :], values[..., :0, :])  # set up by its own code, empty
        made[i].keys, made[i].values = keys, values
        del keys, values
    return cache


def _tag_cache(torch: Any, log: StorageLog, cache: Any) -> None:
    """``cache``'s tensors are ``kv_cache`` (a function: no loop variable outlives it, keeping
    a tensor alive past its free)."""
    for t in _cache_tensors(cache, torch):
        log.tag(t, "kv_cache")


def _caches_in(output: Any) -> list[Any]:
    """The transformers caches a model call's output carries at its top level."""
    from transformers.cache_utils import Cache

    if isinstance(output, Mapping):
        values: Any = output.values()
    elif isinstance(output, (tuple, list)):
        values = output
    else:
        return []
    return [value for value in values if isinstance(value, Cache)]


def _cache_tensors(cache: Any, torch: Any) -> list[Any]:
    """Every tensor a transformers cache holds, itself or in its layers (keys, values and their
    counters), read from their attributes: fake storages have no addresses to walk by."""
    if cache is None:
        return []
    holders = [cache, *(getattr(cache, "layers", None) or ())]
    found: list[Any] = []
    for holder in holders:
        for value in vars(holder).values():
            items = value if isinstance(value, (list, tuple)) else (value,)
            found.extend(t for t in items if isinstance(t, torch.Tensor))
    return found


@contextmanager
def _steps(max_new_tokens: int, checked: Callable[[], None] | None = None) -> Iterator[None]:
    """generate's loop runs ``max_new_tokens`` steps: no sequence ends early. ``checked`` is
    called at each check of the loop, before it is answered."""
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.__dict__.get("_has_unfinished_sequences")
    if original is None:
        raise Unfakeable("this transformers' generate has no _has_unfinished_sequences to count by")
    left = [max_new_tokens]

    def has_unfinished(self: Any, *args: Any, **kwargs: Any) -> bool:
        if checked is not None:
            checked()
        left[0] -= 1
        return left[0] >= 0

    GenerationMixin._has_unfinished_sequences = has_unfinished  # type: ignore[method-assign]
    try:
        yield
    finally:
        GenerationMixin._has_unfinished_sequences = original  # type: ignore[method-assign]
