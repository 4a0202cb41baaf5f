"""Make it fit: the search over techniques on the CPU, its winner confirmed by a real run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from jupyter_gpumem.techniques import Config
from jupyter_gpumem.tuner.planning.plan import SAME_ALGORITHM
from jupyter_gpumem.tuner.trial import Trial
from tests.kernel.test_estimate import TinyGPT, _gpt, _gpt_batch, _gpt_loss, _trained


def _weights_heavy() -> Trial:
    """Four blocks whose weights and Adam state outweigh the activations of a small batch.

    Adam has no 8-bit variant to keep its algorithm with, so nothing in one process helps."""
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.GELU()) for _ in range(4)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x).square().mean()

    return Trial(model, torch.randn(8, 256), loss_fn, optimizer=opt, warmup=1, steps=2)


def test_the_winner_fits_when_measured_and_keeps_the_training_math() -> None:
    trial = _trained(_gpt())
    base = trial.run(Config())
    assert base.peak_allocated_bytes is not None
    budget = int(0.4 * base.peak_allocated_bytes)
    found = trial.search(budget)
    assert found.config is not None, found.text()
    assert found.reasoning[0].startswith("Keeps your optimizer, adamw")
    assert found.config.optimizer in (None, *SAME_ALGORITHM["adamw"])  # the same algorithm
    assert found.config.precision != "bf16"  # autocast at most: fp32 master weights
    assert found.candidates > found.anchors and found.front  # composed, not only estimated
    assert found.estimate is not None and found.estimate.peak_bytes is not None
    assert found.estimate.peak_bytes <= budget
    measured = found.verify()
    assert measured.status == "ok" and measured.peak_allocated_bytes is not None
    assert measured.peak_allocated_bytes <= budget, found.text()


def test_tf32_reuses_the_fp32_estimate_and_fp16_autocast_is_never_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_gpumem.tuner.planning import joint

    estimated: list[tuple[Config, bool]] = []
    real = joint.estimate_workload

    def counted(workload: object, config: Config, primed: bool = False, **kw: Any) -> object:
        estimated.append((config, primed))
        return real(workload, config, primed=primed, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(joint, "estimate_workload", counted)
    monkeypatch.setattr(joint, "estimated_at_once", lambda *a, **kw: {})  # all made here
    trial, budget = meta_gpt()
    found = trial.search(budget)
    assert not any(c.precision in ("tf32", "fp16-autocast") for c, _ in estimated)
    # no configuration estimated twice the same way: an anchor primed, a candidate whole
    assert len(set(estimated)) == len(estimated)
    assert found.config is not None and (found.config, False) in estimated
    assert joint.UNSEARCHED_FP16 in found.reasoning
    tf32 = trial.estimate(config=Config(precision="tf32"))
    fp32 = trial.estimate(config=Config())
    assert tf32.peak_bytes == fp32.peak_bytes and tf32.breakdown == fp32.breakdown


def test_a_second_search_of_the_same_trial_keeps_its_anchors_until_the_workload_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jupyter_gpumem.tuner.planning import joint

    estimated: list[tuple[Config, bool]] = []  # each with whether it was an anchor's
    timed: list[Config] = []
    real_estimate, real_time = joint.estimate_workload, Trial.step_time

    def counted(workload: object, config: Config, primed: bool = False, **kw: Any) -> object:
        estimated.append((config, primed))
        return real_estimate(workload, config, primed=primed, **kw)  # type: ignore[arg-type]

    def counted_time(self: Trial, config: Config, steps: int = 2) -> object:
        timed.append(config)
        return real_time(self, config, steps)

    monkeypatch.setattr(joint, "estimate_workload", counted)
    monkeypatch.setattr(joint, "estimated_at_once", lambda *a, **kw: {})  # all made here
    monkeypatch.setattr(Trial, "step_time", counted_time)
    trial = _trained(_gpt())
    base = trial.estimate()
    assert base.peak_bytes is not None
    untimed = trial.search(int(0.5 * base.peak_bytes), measure=False)
    assert estimated and not timed and untimed.predicted_step_s is None
    made = len(estimated)
    first = trial.search(int(0.5 * base.peak_bytes))  # the same anchors, now timed
    assert timed and len(set(estimated[made:]) & set(estimated[:made])) == 0
    assert not any("kept from" in line for line in first.reasoning)
    made, ran = len(estimated), len(timed)
    again = trial.search(int(0.5 * base.peak_bytes))  # the panel's Search clicked again
    assert (len(estimated), len(timed)) == (made, ran)  # nothing estimated or timed anew
    assert again.config == first.config and again.front == first.front
    assert any("kept from this trial's last search" in line for line in again.reasoning)
    tighter = trial.search(int(0.35 * base.peak_bytes))  # another budget: only its own confirms
    assert len(timed) == ran and not set(estimated[made:]) & set(estimated[:made])
    assert tighter.anchors == first.anchors
    trial.batch = _gpt_batch(16)  # another batch shape: new anchors
    trial.search(int(0.5 * base.peak_bytes))
    assert (Config(), True) in estimated[made:] and len(timed) > ran
    made, ran = len(estimated), len(timed)
    trial.model.blocks.append(nn.TransformerEncoderLayer(32, 4, 128, batch_first=True))
    trial.search(int(0.5 * base.peak_bytes))  # a block added: new anchors again
    assert (Config(), True) in estimated[made:] and len(timed) > ran


def meta_gpt() -> tuple[Trial, int]:
    """The tiny GPT built on the meta device, and half its estimated peak with weights."""
    base = _trained(_gpt()).estimate()
    assert base.peak_bytes is not None
    with torch.device("meta"):
        model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trial = Trial(
        model, _gpt_batch(8).to("meta"), _gpt_loss, optimizer=opt, warmup=1, steps=2, device="cpu"
    )
    return trial, int(0.5 * base.peak_bytes)


def test_a_meta_model_is_searched_without_runs_and_the_fewest_changes_win() -> None:
    torch.manual_seed(0)
    trial, budget = meta_gpt()
    model = trial.model
    found = trial.search(budget)
    assert found.config is not None and found.predicted_step_s is None
    assert "step times unknown" in found.text()
    assert all(p.is_meta for p in model.parameters())  # nothing materialised
    tried = [c.config for c in found.confirmed]
    assert tried[-1] == found.config
    assert all(str(c).count("·") <= str(found.config).count("·") for c in tried)


def test_anchors_made_at_once_in_forked_children_give_the_search_made_in_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over one and two ranks the tiny GPT's anchors are made in forked children, three at a
    time: the search composes, confirms and picks as it does with every anchor made here."""
    from jupyter_gpumem.tuner.estimation import forked
    from jupyter_gpumem.tuner.planning import anchors_at_once, joint

    works: list[int] = []
    real = forked.run_forked

    def counted(todo: Any, processes: int | None = None) -> Any:
        works.append(len(todo))
        return real(todo, processes)

    monkeypatch.setattr(anchors_at_once, "run_forked", counted)
    monkeypatch.setattr(anchors_at_once, "cores", lambda: 3)

    def searched() -> tuple[Any, ...]:
        trial, budget = meta_gpt()
        said: list[str] = []
        found = trial.search(budget // 2, world_sizes=(1, 2), progress=said.append)
        rows = [(c.config, c.composed_bytes, c.estimated_bytes) for c in found.confirmed]
        return (
            found.config,
            found.front,
            rows,
            found.reasoning,
            found.candidates,
            found.anchors,
        ), said

    (apart, said) = searched()
    assert works and sum(works) >= 5  # the baseline, precisions, optimizers, ranks, blocks
    assert any(line.startswith("estimating") and "at once" in line for line in said), said
    monkeypatch.setattr(joint, "estimated_at_once", lambda *a, **kw: {})
    (here, _) = searched()
    assert apart[0] is not None and apart[0].world_size in (1, 2)
    assert apart == here


def test_search_and_plan_say_each_step_to_their_progress() -> None:
    """``progress=`` a callable gets each step's line (True, the default, shows them past two
    seconds; tests/unit/test_progress.py); a value that is neither is refused up front."""
    trial, budget = meta_gpt()
    said: list[str] = []
    trial.search(budget, progress=said.append)
    assert said and said[0].startswith("estimating ")
    assert any(line.startswith("confirming ") for line in said), said
    planned: list[str] = []
    trial.plan(budget, progress=planned.append)
    assert planned and all(line.startswith("estimating ") for line in planned), planned
    with pytest.raises(TypeError, match="progress must be True"):
        trial.search(budget, progress="yes")


def test_on_more_ranks_the_fewest_gpus_that_fit_win_and_the_ranks_measure_within() -> None:
    """A model whose weights and Adam state outweigh its activations fits no single process
    below them, whatever is checkpointed or accumulated: FSDP2 on two ranks shards them."""
    trial = _weights_heavy()
    alone = trial.search(10**9, measure=False)  # everything fits: the least change, one process
    assert alone.config == Config()
    base = trial.estimate()
    assert base.peak_bytes is not None and base.breakdown is not None
    budget = int(0.8 * base.peak_bytes)
    assert trial.search(budget, measure=False).config is None  # one process cannot
    found = trial.search(budget, measure=False, world_sizes=(1, 2))
    assert found.config is not None, found.text()
    assert (found.config.parallel, found.config.world_size) == ("fsdp2", 2)
    assert found.config.optimizer is None and "on its worst rank" in found.reasoning[-1]
    measured = found.verify()
    assert measured.status == "ok", measured.error
    assert measured.peak_allocated_bytes is not None and measured.peak_allocated_bytes <= budget
    with pytest.raises(ValueError, match="world_size is the number of ranks"):
        trial.search(budget, world_sizes=(0,))


def test_lora_is_taken_only_when_allowed_and_its_winner_measures_within() -> None:
    """Weights and Adam state outweigh the activations: without LoRA no single process fits
    below them; allowed, adapters trained alone fit, and the first line says what changed."""
    pytest.importorskip("peft")
    trial = _weights_heavy()
    base = trial.estimate()
    assert base.peak_bytes is not None
    budget = int(0.8 * base.peak_bytes)
    kept = trial.search(budget, measure=False)
    assert kept.config is None and "The full model is trained" in kept.reasoning[0]
    found = trial.search(budget, measure=False, allow=("lora",))
    assert found.config is not None and found.config.lora is not None, found.text()
    assert "LoRA adapters may be trained" in found.reasoning[0]
    measured = found.verify()
    assert measured.status == "ok", measured.error
    assert measured.peak_allocated_bytes is not None and measured.peak_allocated_bytes <= budget


@pytest.mark.parametrize(
    "config",
    [
        Config(),
        Config(checkpoint="blocks", precision="bf16-autocast"),
        Config(precision="bf16"),
        Config(accumulate=4),
        Config(optimizer="adamw-8bit"),
        Config(lora=4),
        Config(optimizer="sgd-momentum", offload="model"),
    ],
    ids=str,
)
def test_an_anchor_warmed_by_its_optimizer_step_alone_has_the_whole_estimates_peak(
    config: Config,
) -> None:
    from jupyter_gpumem.tuner.estimation.predict import estimate_workload

    trial = _trained(_gpt())
    whole = trial.estimate(config=config)
    primed = estimate_workload(trial.workload, config, primed=True)
    assert whole.peak_bytes is not None, whole.reason
    assert (primed.peak_bytes, primed.breakdown) == (whole.peak_bytes, whole.breakdown)
    assert whole.breakdown is not None and whole.breakdown["optimizer_state"] > 0


def test_the_state_goes_to_the_cpu_only_where_nothing_else_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP2's CPU offload is the last resort: estimated only where no candidate with the state
    on the device fits, then composed with every one-process candidate. On this CPU nothing
    moves to host memory, so none fits there either; the GPU test
    (tests/gpu/test_state_offload_gpu.py) finds, confirms and measures one that does."""
    from jupyter_gpumem.tuner.planning import joint

    monkeypatch.setattr(joint, "moves_from", lambda device: True)  # as on a GPU
    estimated: list[Config] = []
    real = joint.estimate_workload

    def counted(workload: object, config: Config, primed: bool = False, **kw: Any) -> object:
        estimated.append(config)
        return real(workload, config, primed=primed, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(joint, "estimate_workload", counted)
    trial = _weights_heavy()
    base = trial.estimate()
    assert base.peak_bytes is not None
    roomy = trial.search(10**9, measure=False)
    assert roomy.config == Config() and not any(c.cpu_offload for c in estimated)
    assert not any("Nothing fits with the state" in line for line in roomy.reasoning)
    tight = trial.search(int(0.8 * base.peak_bytes), measure=False)
    alone = Config(parallel="fsdp2", world_size=1, cpu_offload=True)
    assert alone in estimated
    assert any(
        line.startswith("Nothing fits with the state on the GPU: FSDP2 on 1 rank with")
        for line in tight.reasoning
    )
    assert tight.candidates == 2 * roomy.candidates  # each one-process candidate, moved
    # on the CPU the state is in host memory already: none is predicted to fit, none confirmed
    assert tight.config is None and not any(c.config.cpu_offload for c in tight.confirmed)
