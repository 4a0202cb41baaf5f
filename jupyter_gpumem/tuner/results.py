"""A measured configuration as plain numbers (:class:`TrialResult`), read from its report.

Its step time is the median of its timed steps; how far those spread tells whether a change
against another configuration stands out of the noise (:mod:`jupyter_gpumem.tuner.step_change`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_gpumem.report import text
from jupyter_gpumem.report.record import Report
from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.step_change import StepChange, spread, step_change


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
    # the slowest less the fastest of the steps ``step_s`` is the median of; None for one step
    step_spread_s: float | None = None

    def step_change(self, baseline: TrialResult | None) -> StepChange | None:
        """This step time against ``baseline``'s, read against the wider of their spreads;
        None where either step time is unknown."""
        if baseline is None:
            return None
        return step_change(self.step_s, baseline.step_s, self.step_spread_s, baseline.step_spread_s)

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
        """A table row of plain numbers; deltas against ``baseline`` (None where unknown), and
        whether the step-time change is within noise (None where unknown)."""
        peak, step = self.peak_allocated_bytes, self.step_s
        base_peak = baseline.peak_allocated_bytes if baseline else None
        change = self.step_change(baseline)
        ok = self.status == "ok"
        fits = None if budget_bytes is None or peak is None else ok and peak <= budget_bytes
        return {
            "configuration": self.label,
            "status": self.status,
            "peak_bytes": peak,
            "step_ms": None if step is None else step * 1000,
            "delta_peak_bytes": None if peak is None or base_peak is None else peak - base_peak,
            "delta_peak_pct": _pct(peak, base_peak),
            "delta_step_pct": None if change is None else change.pct,
            "step_within_noise": None if change is None else change.within_noise,
            "fits_budget": fits,
        }


def _pct(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else 100 * (value - base) / base


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
    """The TrialResult of ``config`` measured in ``report``, read on ``device`` (None: the main)."""
    main = _device_report(report, device) if report is not None else None
    return TrialResult(
        config=config,
        label=str(config),
        status=status,
        error=error,
        peak_allocated_bytes=main.peak_allocated_bytes if main else None,
        peak_reserved_bytes=main.peak_reserved_bytes if main else None,
        breakdown=dict(main.breakdown) if main and main.breakdown is not None else None,
        step_s=statistics.median(times) if times else None,
        step_s_all=tuple(times),
        step_spread_s=spread(times),
        warnings=(*notes, *(text.warnings(report) if report else ())),
        report=report,
    )


def _device_report(report: Report, device: Any) -> Any:
    for d in report.devices:
        if d.device == str(device):
            return d
    return report.main


def cell_result(report: Report, config: Config, notes: Sequence[str]) -> TrialResult:
    """A TrialResult read from a `%%gpumem` cell's report; the first step is warm-up when there are more."""
    steps = step_times(report)
    timed = steps[1:] if len(steps) > 1 else steps
    found = list(notes)
    if not steps:
        found.append("no training steps were recognised: the step time is the cell's wall time")
    result = result_of(
        config,
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
