"""The plan's closing sentence: the measurement beside the prediction, with a caveat when far off."""

from __future__ import annotations

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.reasoning import verified_line
from jupyter_gpumem.tuner.results import TrialResult

MiB = 2**20


def _run(step_s: float) -> TrialResult:
    return TrialResult(Config(), "baseline", "ok", None, 11 * MiB, 11 * MiB, None, step_s, (), ())


def test_a_step_time_far_from_its_prediction_says_to_trust_the_measurement() -> None:
    close = verified_line(_run(0.029), True, 11 * MiB, 0.027)
    assert close.startswith("Verified by a measured run: peak 11.0 MiB (predicted 11.0 MiB)")
    assert close.endswith("it fits the budget.")  # 29 ms against 27 ms: no caveat
    far = verified_line(_run(1.25), True, 11 * MiB, 0.087)
    assert "The measured step time is 14 times the predicted one" in far
    assert far.endswith("a model of the recomputation, so trust the measurement.")
    fast = verified_line(_run(0.01), True, 11 * MiB, 0.087)
    assert "The measured step time is 0.11 times the predicted one" in fast
