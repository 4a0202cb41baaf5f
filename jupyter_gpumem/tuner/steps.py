"""Measure a workload's training steps in this process, as `%%gpumem` would measure a cell.

Warm-up steps run under their own tracker (their report is built only if one fails), then the
measured steps: exact peak and breakdown from the same recorder and analysis as the magic. The
step time comes from as many steps again with nothing tracked (``TIMED_STEPS`` at most: a long
run pays three steps more, not twice its steps), since the tracker's cost varies with the number
of allocations (checkpointing makes more of them) and would tilt comparisons.
:func:`time_config` times steps alone, for a search that only needs a configuration's step time.
"""

from __future__ import annotations

import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from jupyter_gpumem.report.record import Report, status_of
from jupyter_gpumem.session import Measurement, MeasureOptions
from jupyter_gpumem.techniques import Applied, Config, apply_config
from jupyter_gpumem.tuner.results import TrialResult, result_of
from jupyter_gpumem.tuner.saved_state import release
from jupyter_gpumem.tuner.workload import Workload

TIMED_STEPS = 3  # the most untracked steps a measured run times, after its measured ones


def measure_config(workload: Workload, config: Config) -> TrialResult:
    """Apply ``config`` to the workload's model, measure its steps, revert it."""
    try:
        applied = apply_config(workload.model, config, workload.optimizer)
    except Exception as exc:
        return failed(config, exc, "applying the configuration", None, workload.device, ())
    try:
        return measure_steps(workload, config, applied)
    finally:
        applied.revert()  # the state comes back before the next trial and after the last


class Timing(NamedTuple):
    """A configuration's step time, untracked: the median of ``times``; None with the reason
    where a step failed."""

    step_s: float | None
    error: str | None = None
    times: tuple[float, ...] = ()  # each timed step's seconds


def time_config(workload: Workload, config: Config, steps: int) -> Timing:
    """Apply ``config``, run one warm-up step and ``steps`` timed ones, revert: the median."""
    try:
        applied = apply_config(workload.model, config, workload.optimizer)
    except Exception as exc:
        return Timing(None, f"{type(exc).__name__}: {exc}")
    try:
        times, error = _untracked_times(workload, applied, 1 + steps)
    finally:
        applied.revert()
    if error is not None:
        return Timing(None, error)
    timed = tuple(times[1:])
    return Timing(statistics.median(timed), None, timed)


def measure_steps(
    workload: Workload,
    config: Config,
    applied: Applied,
    before_measured: Callable[[], Any] | None = None,
    after_measured: Callable[[], Any] | None = None,
) -> TrialResult:
    """Warm up, measure, then time; ``before_measured`` and ``after_measured`` run around the
    measured steps (a rank resets and reads its own peak)."""
    notes = tuple(applied.warnings)
    for phase, count in (("warm-up", workload.warmup), ("measured", workload.steps)):
        if phase == "measured" and before_measured is not None:
            before_measured()
        report, times, error, step = _phase(
            workload, applied, count, str(config), keep=phase == "measured"
        )
        if error is not None:
            where = f"{phase} step {step + 1} of {count}"
            return failed(config, error, where, report, workload.device, notes)
    assert report is not None
    if after_measured is not None:
        after_measured()
    timed = min(workload.steps, TIMED_STEPS)
    untracked, timing_error = _untracked_times(workload, applied, timed)
    if timing_error is not None:  # the memory was measured: keep it, with the tracked times
        notes = (*notes, f"the untracked steps failed ({timing_error}): the step time includes "
                 "the memory tracker's cost")  # fmt: skip
    return result_of(config, report, workload.device, times=untracked or times, notes=notes)


def _untracked_times(
    workload: Workload, applied: Applied, count: int
) -> tuple[list[float], str | None]:
    """``count`` steps timed with nothing tracked; on a failure, none and the reason."""
    try:
        return [_timed_step(workload, applied) for _ in range(count)], None
    except Exception as exc:
        _let_go(exc)
        return [], f"{type(exc).__name__}: {exc}"


def _phase(
    workload: Workload, applied: Applied, count: int, label: str, *, keep: bool
) -> tuple[Report | None, list[float], BaseException | None, int]:
    """Run ``count`` steps under a tracker; the report is built when kept or on failure."""
    if count == 0:
        return None, [], None, 0
    ns = {"model": applied.model, "optimizer": applied.optimizer, "batch": workload.batch}
    measurement = Measurement(MeasureOptions(name=label, log=False), ns)
    times: list[float] = []
    error: BaseException | None = None
    measurement.start()
    try:
        for _ in range(count):
            times.append(_timed_step(workload, applied))
    except Exception as exc:
        error = exc
    finally:
        try:
            report = measurement.finish(error, analyse=keep or error is not None)
        finally:
            measurement.close()  # already done, unless a Ctrl-C cut finish short
    return report, times, error, len(times)


def _timed_step(workload: Workload, applied: Applied) -> float:
    _sync(workload.device)
    t0 = time.perf_counter()
    if workload.inference:  # the outputs live to the step's end, as a loss does
        with applied.grad_mode(), applied.autocast():
            outputs = workload.loss_fn(applied.model, workload.batch)
        _sync(workload.device)
        del outputs
        return time.perf_counter() - t0
    for micro in applied.micro_batches(workload.batch):
        with applied.autocast():
            loss = workload.loss_fn(applied.model, micro)
        applied.backward(loss)
    applied.step()  # the loss stays alive through the step, as in a usual training loop
    _sync(workload.device)
    return time.perf_counter() - t0


def _sync(device: Any) -> None:
    if device.type == "cuda":
        sys.modules["torch"].cuda.synchronize(device)


def failed(
    config: Config,
    error: BaseException,
    where: str,
    report: Report | None,
    device: Any,
    notes: tuple[str, ...],
) -> TrialResult:
    """An out-of-memory or failed trial; its frames are cleared so their tensors can be freed."""
    status = status_of(error)
    message = f"{type(error).__name__}: {error} ({where})"
    _let_go(error)
    return result_of(config, report, device, notes=notes, status=status, error=message)


def _let_go(error: BaseException) -> None:
    """Clear the frames of a failed step's traceback and free the tensors they held."""
    if error.__traceback__ is not None:
        traceback.clear_frames(error.__traceback__)
    release(sys.modules["torch"], collect=True)
