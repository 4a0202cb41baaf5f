"""Run configurations of a workload from the same start, and put the user's state back after.

Each run starts from the user's weights and buffers, with no gradients, empty optimizer state
and the same random state; a parallel configuration starts its ranks. After the last run the
model, its gradients, the optimizer state, training flags and the random generators are as
they were before the first, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.forked_ranks import Collect, RankRun, run_job, run_ranks
from jupyter_gpumem.tuner.results import TrialResult
from jupyter_gpumem.tuner.saved_state import SavedState
from jupyter_gpumem.tuner.steps import Timing, measure_config, time_config
from jupyter_gpumem.tuner.workload import Workload


class Measures(Protocol):
    """What the planner needs of a trial: its workload, and configurations measured on it."""

    @property
    def workload(self) -> Workload: ...

    def run(self, config: Config) -> TrialResult: ...

    def compare(self, configs: Sequence[Config]) -> list[TrialResult]: ...


class Runner:
    """Measures configurations of one workload; state is saved once per outermost call."""

    def __init__(self) -> None:
        self._saved: SavedState | None = None

    @contextmanager
    def preserved(self, workload: Workload) -> Iterator[None]:
        """Save the state once for a run or a comparison; put it back and drop it at the end."""
        if self._saved is not None:  # nested: the outer call restores
            yield
            return
        self._saved = SavedState(workload.model, workload.optimizer)
        try:
            yield
        finally:
            saved, self._saved = self._saved, None
            try:
                saved.restore(final=True)
            except KeyboardInterrupt:
                saved.restore(final=True)  # a Ctrl-C in the restore: finish it, then stop
                raise

    def fresh_run(self, workload: Workload, config: Config) -> TrialResult:
        """One configuration from the saved start; call it inside :meth:`preserved`."""
        assert self._saved is not None, "inside preserved()"
        self._saved.reset_for_trial()
        if config.parallel is not None:
            return run_ranks(workload, config)
        return measure_config(workload, config)

    def fresh_timing(self, workload: Workload, config: Config, steps: int) -> Timing:
        """One configuration's step time from the saved start, untracked; call it inside
        :meth:`preserved`. One process only."""
        assert self._saved is not None, "inside preserved()"
        assert config.parallel is None, "one process"
        self._saved.reset_for_trial()
        return time_config(workload, config, steps)

    def fresh_job(self, workload: Workload, config: Config, collect: Collect) -> RankRun:
        """A parallel configuration from the saved start, ``collect()`` called in each rank
        after its steps; call it inside :meth:`preserved`."""
        assert self._saved is not None, "inside preserved()"
        assert config.parallel is not None, "a parallel configuration"
        self._saved.reset_for_trial()
        return run_job(workload, config, collect)


def run_once(workload: Workload, config: Config) -> TrialResult:
    """Measure one configuration of ``workload``; the user's state comes back unchanged."""
    runner = Runner()
    with runner.preserved(workload):
        return runner.fresh_run(workload, config)


def job_once(workload: Workload, config: Config, collect: Collect) -> RankRun:
    """Run one parallel configuration with ``collect()`` in each rank; the user's state comes
    back unchanged."""
    runner = Runner()
    with runner.preserved(workload):
        return runner.fresh_job(workload, config, collect)
