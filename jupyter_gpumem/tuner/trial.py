"""Trials: run a few training steps under a configuration and measure them as `%%gpumem` would.

:class:`Trial` owns the step, so techniques that need it (fp16 loss scaling) are never a silent
no-op. Each trial starts from the user's weights and buffers, with no gradients, empty optimizer
state and the same random state; warms up; measures ``steps`` steps with the same tracker and
analysis as `%%gpumem` (exact peak, breakdown); then reverts the configuration. After the last
trial the model, its gradients, the optimizer state, training flags and the random generators
are as they were before the first, bit for bit.

Known limitations:

- The saved copy lives in host memory; restored gradients and optimizer state are new tensors
  with the old values (parameters and buffers keep their identity).
- Step times include the tracker's cost: small with the CUDA allocator trace, large with the CPU
  stand-in, so CPU timings only compare configurations with each other.
- Random generators other than Python's, NumPy's and torch's (CPU and CUDA) are not restored.
"""

from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.report import text
from jupyter_gpumem.report.record import Report, status_of
from jupyter_gpumem.session import Measurement, MeasureOptions
from jupyter_gpumem.tuner.rng import rng_state, set_rng_state

if TYPE_CHECKING:
    from jupyter_gpumem.techniques import Applied, Config
    from jupyter_gpumem.tuner.estimate import BatchSearch, Estimate
    from jupyter_gpumem.tuner.plan import Plan

LossFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class TrialResult:
    """One configuration's measured steps: plain bytes and seconds, and the full report."""

    config: Config
    label: str
    status: str  # "ok", "oom" or "error"
    error: str | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    breakdown: dict[str, int] | None
    step_s: float | None  # median of the measured steps
    step_s_all: tuple[float, ...]
    warnings: tuple[str, ...]
    report: Report | None = field(default=None, compare=False, repr=False)
    # the trial's estimate of this configuration and batch, made before it was measured
    estimate: Estimate | None = field(default=None, compare=False, repr=False)
    rank: int | None = None  # this result's rank, for one rank of a parallel configuration
    # the rank's own torch.cuda.max_memory_allocated() over its measured steps (GPU ranks)
    own_peak_bytes: int | None = None
    # one result per rank for a parallel configuration; the fields above are the worst rank's
    ranks: tuple[TrialResult, ...] = field(default=(), compare=False, repr=False)

    @property
    def vs_estimate(self) -> str | None:
        """``estimated 14.7 GiB, measured 14.6 GiB (error +0.4%)``; None without an estimate.

        For a parallel configuration, one line per rank: ``rank 0: estimated ...``.
        """
        if self.estimate is None:
            return None
        if self.ranks and self.estimate.ranks:
            return "\n".join(
                f"rank {r.rank}: {e.against(r.peak_allocated_bytes)}"
                for r, e in zip(self.ranks, self.estimate.ranks, strict=False)
            )
        return self.estimate.against(self.peak_allocated_bytes)

    def to_row(
        self, baseline: TrialResult | None = None, budget_bytes: int | None = None
    ) -> dict[str, Any]:
        """A table row of plain numbers; deltas against ``baseline`` (None where unknown)."""
        peak, step = self.peak_allocated_bytes, self.step_s
        base_peak = baseline.peak_allocated_bytes if baseline else None
        ok = self.status == "ok"
        fits = None if budget_bytes is None or peak is None else ok and peak <= budget_bytes
        return {
            "configuration": self.label,
            "status": self.status,
            "peak_bytes": peak,
            "step_ms": None if step is None else step * 1000,
            "delta_peak_bytes": None if peak is None or base_peak is None else peak - base_peak,
            "delta_peak_pct": _pct(peak, base_peak),
            "delta_step_pct": _pct(step, baseline.step_s if baseline else None),
            "fits_budget": fits,
        }


def _pct(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else 100 * (value - base) / base


class Trial:
    """Measure training steps of ``model`` under memory-saving configurations.

    ``loss_fn(model, batch)`` runs the forward pass and returns the scalar loss; the trial does
    the backward pass and the optimizer step. ``device`` (default: the first parameter's) is the
    device whose peak is reported and that is synchronised around each timed step::

        trial = Trial(model, batch, lambda m, b: m(b).loss, optimizer=opt)
        base, bf16 = trial.compare([Config(precision="bf16")])
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
    ) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError("loss_fn must be a callable loss_fn(model, batch) -> loss tensor")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}"
            )
        for name, value, least in (("warmup", warmup, 0), ("steps", steps, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(
                    f"{name} must be a whole number of steps >= {least}, got {value!r}"
                )
        self.model = model
        self.batch = batch
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.warmup = warmup
        self.steps = steps
        self.device = _device(torch, model, device)
        self._saved: _Saved | None = None
        self._estimates: dict[Config, tuple[int, Estimate]] = {}  # the last, by configuration
        self.last_search: BatchSearch | None = None  # max_batch_size's estimates

    def run(self, config: Config) -> TrialResult:
        """Measure one configuration; the model and optimizer come back unchanged."""
        with self._preserved():
            return self._run(config)

    def compare(self, configs: Sequence[Config]) -> list[TrialResult]:
        """The baseline ``Config()`` first, then each configuration once, all from the same start."""
        from jupyter_gpumem.techniques import Config

        baseline = Config()
        ordered = [baseline, *(c for c in dict.fromkeys(configs) if c != baseline)]
        with self._preserved():
            return [self._run(c) for c in ordered]

    def _run(self, config: Config) -> TrialResult:
        from jupyter_gpumem.techniques import apply_config

        assert self._saved is not None
        self._saved.reset_for_trial()
        if config.parallel is not None:
            from jupyter_gpumem.tuner.forked_ranks import run_ranks

            return self._with_estimate(run_ranks(self, config))
        label = str(config)
        try:
            applied = apply_config(self.model, config, self.optimizer)
        except Exception as exc:
            return _failed(config, label, exc, "applying the configuration", None, self.device, ())
        try:
            return self._with_estimate(self._measure(config, label, applied))
        finally:
            applied.revert()  # the state comes back before the next trial and after the last

    def _measure(
        self,
        config: Config,
        label: str,
        applied: Applied,
        before_measured: Callable[[], Any] | None = None,
    ) -> TrialResult:
        notes = tuple(applied.warnings)
        for phase, count in (("warm-up", self.warmup), ("measured", self.steps)):
            if phase == "measured" and before_measured is not None:
                before_measured()
            report, times, error, step = self._phase(
                applied, count, label, keep=phase == "measured"
            )
            if error is not None:
                where = f"{phase} step {step + 1} of {count}"
                return _failed(config, label, error, where, report, self.device, notes)
        assert report is not None
        return _result(config, label, report, self.device, times=times, notes=notes)

    def _phase(
        self, applied: Applied, count: int, label: str, *, keep: bool
    ) -> tuple[Report | None, list[float], BaseException | None, int]:
        """Run ``count`` steps under a tracker; the report is built when kept or on failure."""
        if count == 0:
            return None, [], None, 0
        ns = {"model": applied.model, "optimizer": applied.optimizer, "batch": self.batch}
        measurement = Measurement(MeasureOptions(name=label, log=False), ns)
        times: list[float] = []
        error: BaseException | None = None
        measurement.start()
        try:
            for _ in range(count):
                times.append(self._timed_step(applied))
        except Exception as exc:
            error = exc
        finally:
            report = measurement.finish(error, analyse=keep or error is not None)
        return report, times, error, len(times)

    def _timed_step(self, applied: Applied) -> float:
        self._sync()
        t0 = time.perf_counter()
        with applied.autocast():
            loss = self.loss_fn(applied.model, self.batch)
        applied.backward(loss)
        applied.step()  # the loss stays alive through the step, as in a usual training loop
        self._sync()
        return time.perf_counter() - t0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def plan(
        self,
        budget: int | str,
        techniques: Sequence[str] = ("checkpoint", "precision", "optimizer"),
    ) -> Plan:
        """The configuration with the least predicted step time that fits ``budget``.

        See :mod:`jupyter_gpumem.tuner.plan`; ``plan.verify()`` measures it.
        """
        from jupyter_gpumem.tuner.plan import plan

        return plan(self, budget, techniques)

    def estimate(self, batch: Any = None, **config: Any) -> Estimate:
        """The peak ``run()`` would measure, predicted on fake tensors; nothing runs on the GPU.

        ``config`` holds ``checkpoint=``, ``every=``, ``precision=``, ``optimizer=`` (as in
        ``techniques.apply``) or ``config=Config(...)``; ``batch`` replaces the trial's batch.
        A later ``run()`` of the same configuration and batch carries the estimate. See
        :mod:`jupyter_gpumem.tuner.estimate`.
        """
        from jupyter_gpumem.tuner.estimate import config_of, estimate_trial

        chosen = config_of(config)
        found = estimate_trial(self, chosen, batch=batch)
        if (batch is None or batch is self.batch) and found.peak_bytes is not None:
            self._estimates[chosen] = (id(self.batch), found)
        return found

    def max_batch_size(
        self,
        budget: int | str,
        make_batch: Callable[[int], Any],
        low: int = 1,
        high: int | None = None,
        **config: Any,
    ) -> int:
        """The largest batch ``make_batch(n)`` whose estimated peak fits ``budget``.

        ``make_batch`` is called under the fake mode, so its tensors take no memory; the
        estimates are in ``trial.last_search``. Raises EstimateUnavailable with the reason
        where a size cannot be estimated.
        """
        from jupyter_gpumem.tuner.estimate import config_of, max_batch_size

        search = max_batch_size(
            self, budget, make_batch, low=low, high=high, config=config_of(config)
        )
        self.last_search = search
        return search.batch_size

    def _with_estimate(self, result: TrialResult) -> TrialResult:
        """The result with the estimate made for its configuration and the trial's batch."""
        made = self._estimates.get(result.config)
        if made is None or made[0] != id(self.batch):
            return result
        estimate = made[1]
        by_rank = {e.rank: e for e in estimate.ranks}
        ranks = tuple(replace(r, estimate=by_rank.get(r.rank)) for r in result.ranks)
        return replace(result, estimate=estimate, ranks=ranks)

    @contextmanager
    def _preserved(self) -> Iterator[None]:
        """Save the state once for a run or a comparison; put it back and drop it at the end."""
        if self._saved is not None:  # nested: the outer call restores
            yield
            return
        self._saved = _Saved(self.model, self.optimizer)
        try:
            yield
        finally:
            saved, self._saved = self._saved, None
            saved.restore(final=True)


class _Saved:
    """A host copy of what a trial may change, and how to put it back."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.optimizer = optimizer
        with torch.no_grad():
            weights = [*model.parameters(), *model.buffers()]
            self.tensors = [(t, _Host.of(t).value) for t in weights]
            self.grads = [
                (p, p.grad if p.grad is None else _Host.of(p.grad)) for p in model.parameters()
            ]
        self.training = [(m, m.training) for m in model.modules()]
        self.opt_state: list[tuple[Any, dict[str, Any]]] = []
        self.opt_groups: list[dict[str, Any]] = []
        if optimizer is not None:
            for p, state in optimizer.state.items():
                self.opt_state.append((p, {k: _Host.of(v) for k, v in state.items()}))
            self.opt_groups = [
                copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                for g in optimizer.param_groups
            ]
        self.rng = rng_state(torch)

    def reset_for_trial(self) -> None:
        """The user's weights and random state, with no gradients and no optimizer state."""
        self.restore()
        for p in self.model.parameters():
            p.grad = None
        if self.optimizer is not None:
            self.optimizer.state.clear()
        _release(self.torch, collect=False)

    def restore(self, *, final: bool = False) -> None:
        """Weights, buffers, training flags, hyperparameters and RNG; grads and state when final."""
        torch = self.torch
        with torch.no_grad():
            for t, saved in self.tensors:
                if t.dtype == saved.dtype and t.shape == saved.shape:
                    t.copy_(saved)
                else:
                    warnings.warn(
                        f"a {t.dtype} tensor of shape {tuple(t.shape)} was saved as {saved.dtype} "
                        f"{tuple(saved.shape)}: the configuration did not revert it; restored the "
                        "saved values",
                        stacklevel=3,
                    )
                    t.data = saved.to(t.device)
        for module, flag in self.training:
            module.training = flag
        if self.optimizer is not None:
            for group, hyper in zip(self.optimizer.param_groups, self.opt_groups, strict=True):
                group.update(copy.deepcopy(hyper))
        set_rng_state(torch, self.rng)
        if not final:
            return
        for p, grad in self.grads:
            p.grad = None if grad is None else grad.back()
        if self.optimizer is not None:
            self.optimizer.state.clear()
            for p, state in self.opt_state:
                self.optimizer.state[p] = {k: v.back() for k, v in state.items()}
        _release(self.torch, collect=True)


# -- helpers ---------------------------------------------------------------------------------
def _device(torch: Any, model: Any, device: Any) -> Any:
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # without initialising CUDA, which would keep forked ranks from using it
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        device = torch.device("cuda", index)
    return device


@dataclass(frozen=True)
class _Host:
    """A value saved apart from the original: tensors in host memory with their device."""

    value: Any
    device: Any = None

    @classmethod
    def of(cls, value: Any) -> _Host:
        if isinstance(value, sys.modules["torch"].Tensor):
            return cls(value.detach().to("cpu", copy=True), value.device)
        return cls(copy.deepcopy(value))

    def back(self) -> Any:
        """A fresh copy where the original lived, so the saved value survives repeated restores."""
        if self.device is None:
            return copy.deepcopy(self.value)
        return self.value.to(self.device, copy=True)


def _release(torch: Any, *, collect: bool) -> None:
    """Free what a trial left (an OOM's frames included) and empty the cache for a fair start."""
    if collect:
        gc.collect()
    if torch.cuda.is_initialized():  # never is_available(): it would poison fork
        torch.cuda.empty_cache()


def _device_report(report: Report, device: Any) -> Any:
    for d in report.devices:
        if d.device == str(device):
            return d
    return report.main


def _failed(
    config: Config,
    label: str,
    error: BaseException,
    where: str,
    report: Report | None,
    device: Any,
    notes: tuple[str, ...],
) -> TrialResult:
    """An out-of-memory or failed trial; its frames are cleared so their tensors can be freed."""
    status = status_of(error)
    message = f"{type(error).__name__}: {error} ({where})"
    if error.__traceback__ is not None:
        traceback.clear_frames(error.__traceback__)
    _release(sys.modules["torch"], collect=True)
    return _result(config, label, report, device, notes=notes, status=status, error=message)


def _result(
    config: Config,
    label: str,
    report: Report | None,
    device: Any,
    *,
    times: Sequence[float] = (),
    notes: tuple[str, ...] = (),
    status: str = "ok",
    error: str | None = None,
) -> TrialResult:
    main = _device_report(report, device) if report is not None else None
    return TrialResult(
        config=config,
        label=label,
        status=status,
        error=error,
        peak_allocated_bytes=main.peak_allocated_bytes if main else None,
        peak_reserved_bytes=main.peak_reserved_bytes if main else None,
        breakdown=dict(main.breakdown) if main and main.breakdown is not None else None,
        step_s=statistics.median(times) if times else None,
        step_s_all=tuple(times),
        warnings=(*notes, *(text.warnings(report) if report else ())),
        report=report,
    )


def result_of(
    config: Config,
    report: Report | None,
    device: Any,
    *,
    times: Sequence[float] = (),
    notes: tuple[str, ...] = (),
    status: str = "ok",
    error: str | None = None,
) -> TrialResult:
    """The TrialResult of a measured report read back (a forked rank's), on ``device``."""
    return _result(
        config, str(config), report, device, times=times, notes=notes, status=status, error=error
    )


def cell_result(report: Report, config: Config, notes: Sequence[str]) -> TrialResult:
    """A TrialResult read from a `%%gpumem` cell's report; the first step is warm-up when there are more."""
    steps = step_times(report)
    timed = steps[1:] if len(steps) > 1 else steps
    found = list(notes)
    if not steps:
        found.append("no training steps were recognised: the step time is the cell's wall time")
    result = _result(
        config,
        str(config),
        report,
        None,
        times=timed or (report.wall_s,),
        notes=tuple(found),
        status=report.status,
        error=report.error,
    )
    return replace(result, step_s_all=steps or (report.wall_s,))


def step_times(report: Report) -> tuple[float, ...]:
    """Seconds per training step, from the phase bands: start of one step to the next."""
    bands = report.timeline.bands if report.timeline is not None else ()
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for b in bands:
        starts[b.step] = min(starts.get(b.step, b.start_s), b.start_s)
        ends[b.step] = max(ends.get(b.step, b.end_s), b.end_s)
    steps = sorted(starts)
    return tuple(
        (starts[steps[i + 1]] if i + 1 < len(steps) else ends[s]) - starts[s]
        for i, s in enumerate(steps)
    )
