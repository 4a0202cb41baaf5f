"""Predict a trial's peak before running it: its steps on fake tensors, the allocator modelled.

``Trial.estimate()`` runs the trial's step (forward, backward, optimizer step; a warm-up step
first, so that the optimizer state exists) on fake tensors of the model, optimizer and batch
(:mod:`~jupyter_gpumem.tuner.fake_step`), then turns what it allocated into the peak the trial
would measure (:mod:`~jupyter_gpumem.tuner.fake_peaks`): on a GPU through a model of the caching
allocator started from the device's real layout, its library workspaces included; on the CPU as
the dispatch source counts. No GPU memory is used beyond the library workspaces a first run
makes anyway, and the user's model, optimizer and random state are untouched::

    est = trial.estimate(checkpoint="blocks")      # Estimate: peak_bytes, breakdown, phase
    n = trial.max_batch_size("20GiB", lambda n: torch.randint(0, 50257, (n, 1024), device="cuda"))
    trial.run(Config(checkpoint="blocks")).vs_estimate  # "estimated 6.9 GiB, measured 7.0 GiB (-1.2%)"

What cannot run on fake tensors gives an Estimate with ``peak_bytes=None`` and the ``reason``;
:func:`max_batch_size` then raises :class:`EstimateUnavailable` with it.

Known limitations:
- Workspaces that kernels allocate for themselves inside one op (cuDNN convolutions, attention
  backward) are not seen: they matter only where they coincide with the peak.
- One device: the trial's. Streams other than the current one are left alone.
- The budget is compared with the peak allocated bytes, as the tuner's "fits" column does; the
  CUDA context and the allocator's cache come on top (``Estimate.total_bytes``).
"""

from __future__ import annotations

import html
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.units import format_bytes, format_seconds, parse_size

if TYPE_CHECKING:
    from jupyter_gpumem.tuner.trial import Trial

_SETTINGS = ("checkpoint", "every", "precision", "optimizer", "parallel", "world_size")
_LARGEST = 1 << 20  # batch sizes searched without a high bound


class EstimateUnavailable(RuntimeError):
    """A configuration that cannot be estimated; the message says why."""


@dataclass(frozen=True)
class Estimate:
    """The predicted peak of one configuration's measured steps, in plain bytes."""

    label: str  # the configuration, as Config labels it
    device: str
    peak_bytes: int | None  # predicted peak allocated; None when it could not be estimated
    peak_reserved_bytes: int | None
    breakdown: dict[str, int] | None  # the report's categories, summing to peak_bytes
    phase: str | None  # forward, backward, optimizer or other
    reason: str | None = None  # why there is no estimate
    batch_size: int | None = None  # where the batch came from make_batch(n)
    resident_bytes: int | None = None  # on the GPU already, not the trial's (workspaces too)
    workspace_bytes: int | None = None  # library workspaces the first run on the device makes
    context_bytes: int | None = None  # CUDA context and other memory outside PyTorch's allocator
    device_total_bytes: int | None = None
    wall_s: float = 0.0
    notes: tuple[str, ...] = ()
    config: Config = field(default_factory=Config, compare=False, repr=False)
    rank: int | None = None  # this estimate's rank, for one rank of a parallel configuration
    # one estimate per rank for a parallel configuration (the worst rank's peak is peak_bytes)
    ranks: tuple[Estimate, ...] = field(default=(), compare=False, repr=False)

    @property
    def total_bytes(self) -> int | None:
        """What the process would hold on the device at the peak: reserved plus context."""
        if self.peak_reserved_bytes is None:
            return None
        return self.peak_reserved_bytes + (self.context_bytes or 0)

    def fits(self, budget_bytes: int) -> bool | None:
        """Whether the predicted peak stays within ``budget_bytes``; None without an estimate."""
        return None if self.peak_bytes is None else self.peak_bytes <= budget_bytes

    def error_pct(self, measured_bytes: int | None) -> float | None:
        """How far the estimate was from ``measured_bytes``, in percent of the measurement."""
        if self.peak_bytes is None or not measured_bytes:
            return None
        return 100 * (self.peak_bytes - measured_bytes) / measured_bytes

    def against(self, measured_bytes: int | None) -> str:
        """``estimated 14.7 GiB, measured 14.6 GiB (error +0.4%)``."""
        if self.peak_bytes is None:
            return f"not estimated ({self.reason}), measured {format_bytes(measured_bytes)}"
        error = self.error_pct(measured_bytes)
        tail = "" if error is None else f" (error {error:+.1f}%)"
        return f"estimated {format_bytes(self.peak_bytes)}, measured {format_bytes(measured_bytes)}{tail}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("config")
        out["ranks"] = [r.to_dict() for r in self.ranks]
        out["notes"] = list(self.notes)
        out["total_bytes"] = self.total_bytes
        return out

    # -- display ---------------------------------------------------------------------------
    def text(self) -> str:
        head = f"gpumem estimate: {self.label} on {self.device}"
        if self.batch_size is not None:
            head += f", batch {self.batch_size}"
        if self.peak_bytes is None:
            return f"{head}\nnot available: {self.reason}"
        lines = [head, *(f"{k:<28}{v:>12}" for k, v in self._rows())]
        if self.breakdown:
            where = f" ({self.phase})" if self.phase else ""
            lines.append(f"at the peak{where}:")
            total = max(1, self.peak_bytes)
            for category, n in sorted(self.breakdown.items(), key=lambda kv: -kv[1]):
                if n:
                    lines.append(
                        f"  {category.replace('_', ' '):<18}{format_bytes(n):>11}  {100 * n / total:3.0f}%"
                    )
        lines.append(self._footer())
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _rows(self) -> list[tuple[str, str]]:
        rows = [
            ("peak allocated", format_bytes(self.peak_bytes)),
            ("peak reserved", format_bytes(self.peak_reserved_bytes)),
        ]
        if self.context_bytes is not None:
            rows.append(("CUDA context and libraries", format_bytes(self.context_bytes)))
            rows.append(("device memory at the peak", format_bytes(self.total_bytes)))
        if self.device_total_bytes is not None:
            rows.append(("device size", format_bytes(self.device_total_bytes)))
        return rows

    def _footer(self) -> str:
        return f"predicted on fake tensors in {format_seconds(self.wall_s)}"

    def _repr_html_(self) -> str:
        esc = html.escape
        head = esc(self.text().splitlines()[0])
        if self.peak_bytes is None:
            return (
                f"<div><strong>{head}</strong><p>Not available: {esc(str(self.reason))}</p></div>"
            )
        cells = "".join(
            f'<tr><td style="padding-right:1em">{esc(k)}</td><td style="text-align:right">{esc(v)}</td></tr>'
            for k, v in self._rows()
        )
        body = self.text().splitlines()[1 + len(self._rows()) :]
        return (
            f'<div class="jp-gpumem-estimate"><strong>{head}</strong><table>{cells}</table>'
            f'<pre style="margin:.4em 0">{esc(chr(10).join(body))}</pre></div>'
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self._repr_html_()}

    def __str__(self) -> str:
        return self.text()


@dataclass(frozen=True)
class BatchSearch:
    """How ``max_batch_size`` found its answer: the estimates it made, in order."""

    batch_size: int  # the largest batch that fits; low - 1 when none does
    budget_bytes: int
    estimate: Estimate | None  # of batch_size
    above: Estimate | None  # of batch_size + 1, which does not fit; None where high fits
    tried: tuple[tuple[int, int], ...]  # (batch size, estimated peak bytes)
    wall_s: float


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


def estimate_trial(
    trial: Trial,
    config: Config,
    *,
    batch: Any = None,
    make_batch: Callable[[], Any] | None = None,
    batch_size: int | None = None,
) -> Estimate:
    """The estimate of ``trial`` under ``config``, with the trial's batch unless one is given."""
    import torch

    from jupyter_gpumem.tuner import fake_peaks
    from jupyter_gpumem.tuner.fake_step import Unfakeable, run_fake

    if config.parallel is not None:
        from jupyter_gpumem.tuner.rank_estimates import estimate_ranks

        return estimate_ranks(
            trial, config, batch=batch, make_batch=make_batch, batch_size=batch_size
        )
    t0 = time.perf_counter()
    device = trial.device
    own_batch = make_batch is None and (batch is None or batch is trial.batch)
    cuda = device.type == "cuda"
    facts = fake_peaks.device_facts(torch, device) if cuda else None
    warmup = min(trial.warmup, 1)
    try:
        run = run_fake(
            trial.model,
            trial.optimizer,
            trial.loss_fn,
            device,
            config,
            batch=trial.batch if batch is None else batch,
            make_batch=make_batch,
            warmup=warmup,
            steps=1 if warmup else min(trial.steps, 2),
        )
    except Unfakeable as exc:
        return unavailable(config, device, str(exc), batch_size, t0)
    notes: list[str] = []
    if cuda:
        assert facts is not None
        drop = _cleared(torch, trial, device, keep=set(run.real.values()), batch=not own_batch)
        segments, foreign = fake_peaks.start_layout(torch, device, drop)
        peaks = fake_peaks.cuda_peaks(run, segments, foreign)
        notes.extend(fake_peaks.allocator_notes())
    else:
        peaks = fake_peaks.cpu_peaks(run)
    return Estimate(
        label=str(config),
        device=str(device),
        peak_bytes=peaks.peak_bytes,
        peak_reserved_bytes=peaks.peak_reserved_bytes,
        breakdown=peaks.breakdown,
        phase=peaks.phase,
        resident_bytes=peaks.resident_bytes,
        workspace_bytes=facts.workspace_bytes if facts else None,
        context_bytes=facts.context_bytes if facts else None,
        device_total_bytes=facts.total_bytes if facts else None,
        wall_s=time.perf_counter() - t0,
        batch_size=batch_size,
        notes=tuple(notes),
        config=config,
    )


def unavailable(
    config: Config, device: Any, reason: str, batch_size: int | None, t0: float
) -> Estimate:
    """The estimate of what cannot run on fake tensors: no figures, the reason."""
    return Estimate(
        label=str(config),
        device=str(device),
        peak_bytes=None,
        peak_reserved_bytes=None,
        breakdown=None,
        phase=None,
        reason=reason,
        batch_size=batch_size,
        wall_s=time.perf_counter() - t0,
        config=config,
    )


def _cleared(torch: Any, trial: Trial, device: Any, *, keep: set[int], batch: bool) -> set[int]:
    """Addresses of what the trial frees before it starts: the user's gradients and optimizer
    state, and the trial's own batch where another one replaces it."""
    tensors: list[Any] = [p.grad for p in trial.model.parameters() if p.grad is not None]
    if trial.optimizer is not None:
        for state in trial.optimizer.state.values():
            tensors.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    if batch:
        from torch.utils._pytree import tree_leaves

        tensors.extend(t for t in tree_leaves(trial.batch) if isinstance(t, torch.Tensor))
    out = set()
    for t in tensors:
        if t.device == device:
            address = t.untyped_storage().data_ptr()
            if address not in keep:
                out.add(address)
    return out


def max_batch_size(
    trial: Trial,
    budget: int | str,
    make_batch: Callable[[int], Any],
    *,
    low: int = 1,
    high: int | None = None,
    config: Config | None = None,
) -> BatchSearch:
    """The largest batch size in [low, high] whose estimate fits ``budget``.

    Peaks grow about linearly with the batch, so each guess is the line through the nearest
    estimates on both sides (doubling while none is above), kept strictly inside the bracket:
    a handful of fake runs. Raises :class:`EstimateUnavailable` when a size cannot be estimated.
    """
    try:
        budget_bytes = parse_size(budget) if isinstance(budget, str) else budget
    except ValueError as exc:
        raise ValueError(f"budget: {exc}") from None
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ValueError(
            f"budget must be a positive number of bytes or a size like '20GiB', got {budget!r}"
        )
    if not callable(make_batch):
        raise TypeError("make_batch must be a callable make_batch(n) -> a batch of n samples")
    for name, value in (("low", low), ("high", high)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if high is not None and high < low:
        raise ValueError(f"high ({high}) must be >= low ({low})")
    t0 = time.perf_counter()
    config = config if config is not None else Config()
    made: dict[int, Estimate] = {}

    def peak(n: int) -> int:
        if n not in made:
            made[n] = estimate_trial(trial, config, make_batch=lambda: make_batch(n), batch_size=n)
        est = made[n]
        if est.peak_bytes is None:
            raise EstimateUnavailable(f"batch size {n} cannot be estimated: {est.reason}")
        return est.peak_bytes

    def result(size: int) -> BatchSearch:
        tried = tuple((n, e.peak_bytes or 0) for n, e in made.items())
        return BatchSearch(
            size, budget_bytes, made.get(size), made.get(size + 1), tried, time.perf_counter() - t0
        )

    lo, hi = low, high
    if peak(lo) > budget_bytes:
        warnings.warn(
            f"even batch size {low} is estimated at {format_bytes(made[low].peak_bytes)}, over "
            f"the budget of {format_bytes(budget_bytes)}",
            stacklevel=3,
        )
        return result(low - 1)
    if hi is not None:
        if peak(hi) <= budget_bytes:
            return result(hi)
    while hi is None:  # grow past the budget
        if lo >= _LARGEST:
            warnings.warn(
                f"batch size {lo} still fits the budget; the search stops there (pass high=)",
                stacklevel=3,
            )
            return result(lo)
        below = sorted(n for n in made if made[n].peak_bytes is not None and n <= lo)
        guess = 2 * lo
        if len(below) >= 2:
            guess = _crossing(below[-2], peak(below[-2]), lo, peak(lo), budget_bytes) + 1
        guess = max(lo + 1, min(guess, 8 * lo))
        if peak(guess) <= budget_bytes:
            lo = guess
        else:
            hi = guess
    while hi - lo > 1:
        guess = _crossing(lo, peak(lo), hi, peak(hi), budget_bytes)
        guess = max(lo + 1, min(guess, hi - 1))
        if peak(guess) <= budget_bytes:
            lo = guess
        else:
            hi = guess
    return result(lo)


def _crossing(n0: int, p0: int, n1: int, p1: int, budget: int) -> int:
    """The largest n on the line through (n0, p0) and (n1, p1) at or under ``budget``."""
    if p1 <= p0:
        return n1 * 2
    return n0 + int((budget - p0) * (n1 - n0) // (p1 - p0))
