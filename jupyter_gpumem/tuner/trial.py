"""Trials: run a few training steps under a configuration and measure them as `%%gpumem` would.

:class:`Trial` is the face of the tuner's engines, each taking the trial's
:class:`~jupyter_gpumem.tuner.workload.Workload`: measured runs (:mod:`~jupyter_gpumem.tuner.runner`),
estimates on fake tensors (:mod:`~jupyter_gpumem.tuner.estimation.predict`) and plans
(:mod:`~jupyter_gpumem.tuner.planning.plan`). The trial owns the step, so techniques that need it
(fp16 loss scaling) are never a silent no-op, and it keeps each configuration's estimate to set
beside the later measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.estimation.estimate import BatchSearch, Estimate
from jupyter_gpumem.tuner.estimation.predict import config_of, estimate_workload, max_batch_size
from jupyter_gpumem.tuner.planning.anchor_memo import AnchorMemo
from jupyter_gpumem.tuner.planning.joint import Search, search
from jupyter_gpumem.tuner.planning.plan import Plan, plan
from jupyter_gpumem.tuner.progress import progress_of
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.runner import Runner
from jupyter_gpumem.tuner.steps import Timing
from jupyter_gpumem.tuner.workload import (
    LossFn,
    Workload,
    check_config,
    check_trainable,
    checked_workload,
    needs_weights,
)
from jupyter_gpumem.units import echoed_kind


class Trial:
    """Measure training steps of ``model`` under memory-saving configurations.

    ``loss_fn(model, batch)`` runs the forward pass and returns the scalar loss; the trial does
    the backward pass and the optimizer step. ``device`` (default: the first parameter's) is the
    device whose peak is reported and that is synchronised around each timed step::

        trial = Trial(model, batch, lambda m, b: m(b).loss, optimizer=opt)
        base, bf16 = trial.compare([Config(precision="bf16")])

    Each trial starts from the user's weights and buffers, with no gradients, empty optimizer
    state and the same random state; after the last, all of it is as it was, bit for bit. A run
    takes ``warmup`` steps, then ``steps`` tracked steps for the memory, then as many more (three
    at most) with nothing tracked for the step time.

    ``inference=True`` makes an inference trial: each step is the forward alone,
    ``loss_fn(model, batch)`` returning the outputs (no backward, no optimizer), and
    ``Config(inference_mode=True)`` runs it under ``torch.inference_mode()``::

        trial = Trial(model, batch, lambda m, b: m(b).logits, inference=True)
        as_is, no_autograd = trial.compare([Config(inference_mode=True)])

    A model built on the meta device (``with torch.device("meta")``, transformers'
    ``from_config`` under it, accelerate's ``init_empty_weights``), with its optimizer and a
    batch of meta tensors, is estimated without a byte of weights anywhere; ``device`` is
    where it would run (default: the GPU present, else the CPU). Measuring it needs weights.
    """

    def __init__(
        self,
        model: Any,
        batch: Any,
        loss_fn: LossFn,
        *,
        optimizer: Any = None,
        warmup: int = 2,
        steps: int = 5,
        device: Any = None,
        inference: bool = False,
    ) -> None:
        given = checked_workload(
            model,
            batch,
            loss_fn,
            optimizer=optimizer,
            warmup=warmup,
            steps=steps,
            device=device,
            inference=inference,
        )
        self.model = given.model
        self.batch = given.batch
        self.loss_fn = given.loss_fn
        self.optimizer = given.optimizer
        self.warmup = given.warmup
        self.steps = given.steps
        self.device = given.device
        self.inference = given.inference
        self._runner = Runner()
        self._estimates: dict[Config, tuple[int, Estimate]] = {}  # the last, by configuration
        self.last_search: BatchSearch | None = None  # max_batch_size's estimates
        self.anchor_memo = AnchorMemo()  # search's anchors, for its next search

    @property
    def workload(self) -> Workload:
        """What the engines run: the trial's model, batch, loss, optimizer, device and steps."""
        return Workload(
            self.model,
            self.batch,
            self.loss_fn,
            self.optimizer,
            self.device,
            self.warmup,
            self.steps,
            self.inference,
        )

    def run(self, config: Config) -> TrialResult:
        """Measure one configuration; the model and optimizer come back unchanged."""
        if not isinstance(config, Config):
            raise TypeError(
                f"run takes a Config, e.g. Config(precision='bf16'); got {echoed_kind(config)}"
            )
        workload = self.workload
        check_config(workload, config)
        needs_weights(workload, "run()")
        with self._runner.preserved(workload):
            return self._with_estimate(self._runner.fresh_run(workload, config))

    def step_time(self, config: Config, steps: int = 2) -> Timing:
        """One configuration's step time with nothing tracked: the median of ``steps`` steps
        after one warm-up step (None, with the reason, where a step fails). One process only;
        the model and optimizer come back unchanged."""
        if not isinstance(config, Config) or config.parallel is not None:
            raise TypeError(f"step_time takes a one-process Config; got {echoed_kind(config)}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps is a whole number of at least 1, got {steps!r}")
        workload = self.workload
        check_config(workload, config)
        needs_weights(workload, "step_time()")
        with self._runner.preserved(workload):
            return self._runner.fresh_timing(workload, config, steps)

    @contextmanager
    def preserved(self) -> Iterator[None]:
        """Runs inside share one saved copy of the user's state, put back once at the end."""
        with self._runner.preserved(self.workload):
            yield

    def compare(self, configs: Sequence[Config]) -> list[TrialResult]:
        """The baseline ``Config()`` first, then each configuration once, all from the same start."""
        if isinstance(configs, (str, Config)) or not all(isinstance(c, Config) for c in configs):
            raise TypeError(
                "compare takes a list of Config, e.g. [Config(precision='bf16')]; got "
                f"{echoed_kind(configs)}"
            )
        baseline = Config()
        ordered = [baseline, *(c for c in dict.fromkeys(configs) if c != baseline)]
        workload = self.workload
        for config in ordered:
            check_config(workload, config)
        needs_weights(workload, "compare()")
        with self._runner.preserved(workload):
            return [self._with_estimate(self._runner.fresh_run(workload, c)) for c in ordered]

    def plan(
        self,
        budget: int | str,
        techniques: Sequence[str] = ("checkpoint", "precision", "optimizer"),
        *,
        allow: Sequence[str] = (),
        parallel: str | None = None,
        world_size: int = 1,
        count_held: bool = True,
        progress: Any = True,
    ) -> Plan:
        """The configuration with the least predicted step time that fits ``budget``.

        It keeps the training math (the optimizer's algorithm, fp32 master weights) unless
        ``allow`` names "optimizer" or "pure-bf16". With ``parallel`` ("ddp" or "fsdp2") and
        ``world_size``, it plans for that many ranks, measured as ``run()`` measures them,
        the budget per rank. See :mod:`jupyter_gpumem.tuner.planning.plan`;
        ``plan.verify()`` measures it. For a model on the meta device: the fewest changes
        estimated to fit, step times unknown (:mod:`jupyter_gpumem.tuner.planning.unmeasured`);
        ``count_held`` as in :meth:`estimate`, for those estimates. ``progress``: a line of
        what it is doing once it has run two seconds (False: none; a callable: called with
        each step's line instead).
        """
        self._training_only("plan()")
        with progress_of(progress, "plan") as say:
            return plan(
                self,
                budget,
                techniques,
                allow=allow,
                parallel=parallel,
                world_size=world_size,
                count_held=count_held,
                progress=say,
            )

    def search(
        self,
        budget: int | str,
        *,
        allow: Sequence[str] = (),
        measure: bool | None = None,
        world_sizes: Sequence[int] = (1,),
        count_held: bool = True,
        progress: Any = True,
    ) -> Search:
        """The cheapest combination of checkpointed blocks, precision, optimizer variant and
        gradient accumulation estimated within ``budget``, keeping the training math unless
        ``allow`` names "optimizer" or "pure-bf16"; with ``world_sizes`` beyond 1, DDP and
        FSDP2 on those ranks too (the budget per rank, the fewest GPUs first). See
        :mod:`jupyter_gpumem.tuner.planning.joint`; ``search.verify()`` measures the winner.
        ``count_held`` and ``progress`` as in :meth:`plan`."""
        self._training_only("search()")
        with progress_of(progress, "search") as say:
            return search(
                self,
                budget,
                allow=allow,
                measure=measure,
                world_sizes=world_sizes,
                count_held=count_held,
                progress=say,
            )

    def estimate(
        self, batch: Any = None, *, gpu: str | None = None, count_held: bool = True, **config: Any
    ) -> Estimate:
        """The peak ``run()`` would measure, predicted on fake tensors; nothing runs on the GPU.

        ``config`` holds ``checkpoint=``, ``every=``, ``precision=``, ``optimizer=`` (as in
        ``techniques.apply``) or ``config=Config(...)``; ``batch`` replaces the trial's batch.
        On a GPU the estimate carries its verdict (does it fit?) on the card present, or on
        ``gpu``, a card by name (``"H100-80GB"``, ``"A100-40GB"``, ``"L4"``, ...; see
        :mod:`jupyter_gpumem.tuner.estimation.cards`). A later ``run()`` of the same
        configuration and batch carries the estimate. What the process already holds on the
        GPU is counted (the run finds it there) and named ``held_before``; ``count_held=False``
        leaves it out (a fresh process), and a verdict for another card never counts it. See
        :mod:`jupyter_gpumem.tuner.estimation.predict`.
        """
        chosen = config_of(config)
        check_config(self.workload, chosen)
        found = estimate_workload(
            self.workload, chosen, batch=batch, gpu=gpu, count_held=count_held
        )
        same_run = (batch is None or batch is self.batch) and gpu is None and count_held
        if same_run and found.peak_bytes is not None:
            self._estimates[chosen] = (id(self.batch), found)
        return found

    def max_batch_size(
        self,
        budget: int | str,
        make_batch: Callable[[int], Any],
        low: int = 1,
        high: int | None = None,
        *,
        gpu: str | None = None,
        count_held: bool = True,
        progress: Any = True,
        **config: Any,
    ) -> int:
        """The largest batch ``make_batch(n)`` whose estimated peak fits ``budget``.

        ``make_batch`` is called under the fake mode, so its tensors take no memory; the
        estimates are in ``trial.last_search``. Raises EstimateUnavailable with the reason
        where a size cannot be estimated. ``gpu`` and ``count_held`` as in :meth:`estimate`,
        ``progress`` as in :meth:`plan`.
        """
        chosen = config_of(config)
        check_config(self.workload, chosen)
        with progress_of(progress, "max_batch_size") as say:
            search = max_batch_size(
                self.workload,
                budget,
                make_batch,
                low=low,
                high=high,
                config=chosen,
                count_held=count_held,
                gpu=gpu,
                progress=say,
            )
        self.last_search = search
        return search.batch_size

    def _training_only(self, what: str) -> None:
        if self.inference:
            raise ValueError(
                f"{what} plans training steps; for an inference trial, compare() or estimate() "
                "configurations of precision, checkpoint, offload and inference_mode"
            )
        check_trainable(self.workload, what)

    def _with_estimate(self, result: TrialResult) -> TrialResult:
        """The result with the estimate made for its configuration and the trial's batch."""
        made = self._estimates.get(result.config)
        if made is None or made[0] != id(self.batch):
            return result
        estimate = made[1]
        by_rank = {e.rank: e for e in estimate.ranks}
        ranks = tuple(replace(r, estimate=by_rank.get(r.rank)) for r in result.ranks)
        return replace(result, estimate=estimate, ranks=ranks)
