"""A fake run's measured step played again on new storages, where the step is closed."""

from __future__ import annotations

from jupyter_gpumem.records import PhaseMark
from jupyter_gpumem.tuner.estimation.fake_step import FakeRun
from jupyter_gpumem.tuner.estimation.repeated_steps import repeated


def _run(events: tuple[tuple[str, int, int], ...], steps: int = 3) -> FakeRun:
    return FakeRun(
        device="cuda:0",
        sizes=(100, 200, 300, 400),
        real={},
        existing=(0,),
        events=events,
        window=1,
        window_clock=10,
        live_at_window=(0, 1),
        reachable=frozenset({0, 1}),
        tags=((0, "parameters"), (2, "activations"), (3, "temporary")),
        marks=(
            PhaseMark(1, "forward", 0),
            PhaseMark(10, "forward", 1),
            PhaseMark(12, "backward", 1),
        ),
        measured_steps=steps,
    )


CLOSED = (("alloc", 1, 2), ("alloc", 2, 11), ("alloc", 3, 12), ("free", 3, 13), ("free", 2, 14))


def test_a_closed_step_is_played_again_on_new_storages() -> None:
    run = repeated(_run(CLOSED), 3)
    assert run.events[:5] == CLOSED
    span = 14 - 10 + 1
    assert run.events[5:9] == (
        ("alloc", 4, 11 + span),
        ("alloc", 5, 12 + span),
        ("free", 5, 13 + span),
        ("free", 4, 14 + span),
    )
    assert run.events[9] == ("alloc", 6, 11 + 2 * span)
    assert run.sizes == (100, 200, 300, 400, 300, 400, 300, 400)
    assert (4, "activations") in run.tags and (7, "temporary") in run.tags
    assert (0, "parameters") in run.tags and len(run.tags) == 3 + 2 * 2
    assert [(m.time_us, m.phase, m.step) for m in run.marks[3:5]] == [
        (10 + span, "forward", 2),
        (12 + span, "backward", 2),
    ]
    assert run.measured_steps == 1


def test_a_step_that_frees_an_older_storage_or_keeps_a_new_one_is_left_alone() -> None:
    frees_older = (*CLOSED, ("free", 1, 15))
    keeps_new = CLOSED[:-1]
    for events in (frees_older, keeps_new):
        run = _run(events)
        assert repeated(run, 3) is run
    assert repeated(_run(CLOSED), 1).events == CLOSED


def test_a_trial_of_many_steps_is_estimated_as_its_first_steady_ones() -> None:
    """Once a played step ends in the layout the one before ended in, the rest are not played:
    a trial of 40 measured steps is estimated as one of 3, figure for figure."""
    import pytest

    torch = pytest.importorskip("torch")
    from jupyter_gpumem.tuner.trial import Trial

    def trial(steps: int) -> Trial:
        torch.manual_seed(0)
        with torch.device("meta"):
            model = torch.nn.Sequential(
                torch.nn.Linear(256, 1024), torch.nn.Dropout(0.1), torch.nn.Linear(1024, 256)
            )
        x = torch.zeros(512, 256, device="meta")
        opt = torch.optim.AdamW(model.parameters())
        loss = lambda m, b: m(b).square().mean()  # noqa: E731
        return Trial(model, x, loss, optimizer=opt, steps=steps, device="cuda")

    few, many = trial(3).estimate(gpu="H100-80GB"), trial(40).estimate(gpu="H100-80GB")
    assert few.peak_bytes is not None, few.reason
    for name in ("peak_bytes", "peak_reserved_bytes", "breakdown", "phase"):
        assert getattr(few, name) == getattr(many, name), name
