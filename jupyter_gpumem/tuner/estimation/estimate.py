"""An estimate's record: the predicted peak of one configuration, its display, the batch search.

The figures come from :mod:`~jupyter_gpumem.tuner.estimation.predict`. What cannot run on fake
tensors gives an Estimate with ``peak_bytes=None`` and the ``reason``.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.estimation.verdict import Verdict
from jupyter_gpumem.units import format_bytes, format_seconds


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
    verdict: Verdict | None = field(default=None, compare=False)  # on a card (GPU estimates)
    # the most bytes of each category held at once in the measured steps, whenever the peak
    most_bytes: dict[str, int] | None = None
    # on the GPU before the call and not the workload's (nor a library workspace); None: CPU
    held_bytes: int | None = None
    held_counted: bool = True  # whether held_bytes is in the peak (the breakdown's held_before)
    # reserved before the call by the process's CUDA graph pools, in peak_reserved_bytes
    held_pool_bytes: int = 0
    # how far below peak_bytes each phase's own peak lies (0: the peak's phase), so that what
    # moves the whole run (a card's workspaces) moves every phase; see phase_peaks
    phase_gaps: dict[str, int] | None = None

    @property
    def total_bytes(self) -> int | None:
        """What the process would hold on the device at the peak: reserved plus context."""
        if self.peak_reserved_bytes is None:
            return None
        return self.peak_reserved_bytes + (self.context_bytes or 0)

    @property
    def phase_peaks(self) -> dict[str, int] | None:
        """The most allocated in each phase of the measured steps (forward, backward, optimizer,
        prefill, decode, other): the batch searches draw a line through each."""
        if self.peak_bytes is None or self.phase_gaps is None:
            return None
        return {phase: self.peak_bytes - gap for phase, gap in self.phase_gaps.items()}

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
        judged = self.verdict
        out["verdict"] = (
            None
            if judged is None
            else {
                "card": judged.card.name,
                "capacity_bytes": judged.card.total_bytes,
                "fits": judged.fits,
                "needed_bytes": judged.needed_bytes,
                "headroom_bytes": judged.headroom_bytes,
                "margin_bytes": judged.margin_bytes,
                "line": judged.line(),
            }
        )
        out["ranks"] = [r.to_dict() for r in self.ranks]
        out["notes"] = list(self.notes)
        out["total_bytes"] = self.total_bytes
        out["phase_peaks"] = self.phase_peaks
        return out

    # -- display ---------------------------------------------------------------------------
    def text(self) -> str:
        head = self._head()
        if self.peak_bytes is None:
            return f"{head}\nnot available: {self.reason}"
        lines = [head, *self._verdict_lines()]
        lines.extend(f"{k:<28}{v:>12}" for k, v in self._rows())
        lines.extend(self._tail())
        return "\n".join(lines)

    def _head(self) -> str:
        head = f"gpumem estimate: {self.label} on {self.device}"
        return head if self.batch_size is None else f"{head}, batch {self.batch_size}"

    def _verdict_lines(self) -> list[str]:
        if self.verdict is None:
            return []
        return [self.verdict.line(), *(f"  {d}" for d in self.verdict.details())]

    def _tail(self) -> list[str]:
        """The breakdown at the peak, how it was made, the notes."""
        lines = []
        if self.breakdown and self.peak_bytes is not None:
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
        return lines

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
        head = esc(self._head())
        if self.peak_bytes is None:
            return (
                f"<div><strong>{head}</strong><p>Not available: {esc(str(self.reason))}</p></div>"
            )
        judged = ""
        if self.verdict is not None:
            kind = "fits" if self.verdict.fits else "does-not-fit"
            details = "".join(f"<li>{esc(d)}</li>" for d in self.verdict.details())
            judged = (
                f'<p class="jp-gpumem-verdict jp-gpumem-verdict-{kind}"><strong>'
                f"{esc(self.verdict.line())}</strong></p><ul>{details}</ul>"
            )
        cells = "".join(
            f'<tr><td style="padding-right:1em">{esc(k)}</td><td style="text-align:right">{esc(v)}</td></tr>'
            for k, v in self._rows()
        )
        return (
            f'<div class="jp-gpumem-estimate">{judged}<strong>{head}</strong><table>{cells}</table>'
            f'<pre style="margin:.4em 0">{esc(chr(10).join(self._tail()))}</pre></div>'
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self._repr_html_()}

    def __str__(self) -> str:
        return self.text()


@dataclass(frozen=True)
class BatchSearch:
    """How ``max_batch_size`` found its answer: the estimates it made, in order."""

    batch_size: int  # the largest batch that fits; 0 when none does, low included
    budget_bytes: int
    estimate: Estimate | None  # of batch_size
    above: Estimate | None  # of batch_size + 1 (of low where none fits); None where high fits
    tried: tuple[tuple[int, int], ...]  # (batch size, estimated peak bytes)
    wall_s: float


def batch_search(
    size: int, low: int, budget_bytes: int, made: Mapping[int, Estimate], t0: float
) -> BatchSearch:
    """The record of a search from ``low`` that found ``size`` (0: not even ``low`` fits),
    from the estimates ``made`` by batch size, timed from ``t0``."""
    tried = tuple((n, e.peak_bytes or 0) for n, e in made.items())
    above = made.get(low if size < low else size + 1)
    return BatchSearch(size, budget_bytes, made.get(size), above, tried, time.perf_counter() - t0)


def from_peaks(peaks: Any, facts: Any, *, t0: float, **fields: Any) -> Estimate:
    """The estimate of a fake run's ``peaks`` (:class:`.fake_peaks.Peaks`) on a device with
    ``facts`` (:class:`.fake_peaks.DeviceFacts`; None on the CPU), timed from ``t0``; ``fields``
    give the rest (``label``, ``device``, ...), ``resident_bytes`` over the peaks' own."""
    fields.setdefault("resident_bytes", peaks.resident_bytes)
    return Estimate(
        peak_bytes=peaks.peak_bytes,
        peak_reserved_bytes=peaks.peak_reserved_bytes,
        breakdown=peaks.breakdown,
        phase=peaks.phase,
        most_bytes=peaks.most,
        held_bytes=peaks.held_bytes,
        held_counted=peaks.held_counted,
        held_pool_bytes=peaks.pool_bytes,
        phase_gaps={phase: peaks.peak_bytes - most for phase, most in peaks.phases.items()},
        workspace_bytes=facts.workspace_bytes if facts else None,
        context_bytes=facts.context_bytes if facts else None,
        device_total_bytes=facts.total_bytes if facts else None,
        wall_s=time.perf_counter() - t0,
        **fields,
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
