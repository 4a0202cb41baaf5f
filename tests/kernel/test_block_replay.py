"""Replayed blocks give the full trace's estimate, to the byte, on every family of the CPU zoo.

Each case of ``bench/zoo.py`` (training, LoRA and inference rows) is built on the meta device
at size ``"tiny"`` with six layers, so that its blocks repeat often enough to be replayed,
and estimated on the CPU twice: with replay and with every block traced
(``block_replay.ENABLED = False``). Every figure of the two estimates is the same. On a few
families the techniques change: precisions, checkpointing, accumulation, offloading, and FSDP2's
ranks, every rank's figures compared.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import model_zoo  # noqa: E402 (bench/ on the path first)
import zoo  # noqa: E402
import zoo_shapes  # noqa: E402

from jupyter_gpumem.techniques import Config, blocks  # noqa: E402
from jupyter_gpumem.tuner.estimation import block_replay  # noqa: E402

LAYERS = 6
FIELDS = ("peak_bytes", "peak_reserved_bytes", "breakdown", "phase", "most_bytes", "reason")
TECHNIQUES = {
    "fp32": {},
    "bf16-autocast": {"precision": "bf16-autocast"},
    "bf16": {"precision": "bf16"},
    "checkpoint-all": {"checkpoint": "blocks"},
    "checkpoint-some": {"checkpoint": "blocks", "every": 2},
    "accumulate": {"accumulate": 2},
    "accumulate-bf16-autocast": {"accumulate": 2, "precision": "bf16-autocast"},
    "offload": {"offload": "blocks"},
}
TECHNIQUE_FAMILIES = ("llama-eager-fp32", "gpt2-fp32", "bert-fp32", "vit-bf16-autocast")


@pytest.fixture
def deep(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    monkeypatch.setitem(
        zoo_shapes.LM, "tiny", {**zoo_shapes.LM["tiny"], "num_hidden_layers": LAYERS}
    )


def _both(case: zoo.Case, config: Any) -> tuple[Any, Any]:
    """(the estimate with replay, the estimate with every block traced)."""
    found = []
    for enabled in (True, False):
        built = case.build("meta", "tiny")
        trial = model_zoo.trial_of(case, built, "cpu")
        block_replay.ENABLED = enabled
        try:
            found.append(trial.estimate(config=config))
        finally:
            block_replay.ENABLED = True
    return found[0], found[1]


def _assert_same(replayed: Any, traced: Any) -> None:
    for name in FIELDS:
        assert getattr(replayed, name) == getattr(traced, name), name
    if traced.peak_bytes is not None:  # switched off, an estimate says how it ran its blocks
        assert any("every block traced" in n for n in traced.notes), traced.notes


def _cases(*workloads: str, only: tuple[str, ...] = ()) -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=pytest.mark.skipif(bool(why), reason=why or ""))
        for c in zoo.CASES
        if c.workload in workloads and (not only or c.name in only)
        for why in [zoo.available(c)]
    ]


@pytest.mark.parametrize("case", _cases("train", "lora", "inference"))
def test_every_family_estimates_the_same_with_blocks_replayed(deep: None, case: zoo.Case) -> None:
    config = model_zoo.config_of(case)
    replayed, traced = _both(case, config)
    _assert_same(replayed, traced)
    if replayed.peak_bytes is not None:  # deep enough to replay: it says how; else nothing
        kinds, _ = block_replay.eligible(torch, case.build("meta", "tiny").model, config)
        told = [n for n in replayed.notes if "replayed from block" in n or "block traced" in n]
        assert len(told) == (1 if kinds else 0), replayed.notes


@pytest.mark.parametrize("case", _cases("train", "lora"))
def test_every_family_checkpointed_estimates_the_same_with_blocks_replayed(
    deep: None, case: zoo.Case
) -> None:
    """Every block checkpointed: the blocks' recompute in backward, and what their frames keep
    until the whole backward ends."""
    config = dataclasses.replace(model_zoo.config_of(case), checkpoint="blocks")
    replayed, traced = _both(case, config)
    _assert_same(replayed, traced)
    assert traced.peak_bytes is not None, traced.reason


@pytest.mark.parametrize("technique", list(TECHNIQUES))
@pytest.mark.parametrize("case", _cases("train", only=TECHNIQUE_FAMILIES))
def test_every_technique_estimates_the_same_with_blocks_replayed(
    deep: None, case: zoo.Case, technique: str
) -> None:
    settings = {"precision": case.precision, **TECHNIQUES[technique]}
    replayed, traced = _both(case, Config(**settings))
    _assert_same(replayed, traced)
    assert traced.peak_bytes is not None, traced.reason  # each technique runs on each family


def test_a_deep_decoder_is_replayed_and_says_so(deep: None) -> None:
    replayed, traced = _both(zoo.case("llama-eager-fp32"), Config())
    _assert_same(replayed, traced)
    assert f"blocks 3-4 of {LAYERS} (LlamaDecoderLayer) replayed from block 2" in " ".join(
        replayed.notes
    ), replayed.notes


@pytest.mark.parametrize("every", [1, 2])
@pytest.mark.parametrize("case", _cases("train", only=("llama-eager-fp32", "gpt2-fp32")))
def test_checkpointed_blocks_are_replayed_and_say_so(
    monkeypatch: pytest.MonkeyPatch, case: zoo.Case, every: int
) -> None:
    """A checkpointed block's input and recomputed tensors live until the whole backward ends;
    replayed, they are freed with their twin's. Every other block checkpointed makes two kinds
    whose calls alternate, each replayed on its own."""
    import transformers

    transformers.logging.set_verbosity_error()
    layers = 12
    monkeypatch.setitem(
        zoo_shapes.LM, "tiny", {**zoo_shapes.LM["tiny"], "num_hidden_layers": layers}
    )
    config = Config(precision=case.precision, checkpoint="blocks", every=every)
    replayed, traced = _both(case, config)
    _assert_same(replayed, traced)
    told = " ".join(replayed.notes)
    model = case.build("meta", "tiny").model
    label = type(model.get_submodule(blocks(model)[0])).__name__
    kinds = [f"({label}, checkpointed) replayed"] + ([f"({label}) replayed"] if every == 2 else [])
    assert all(k in told for k in kinds), replayed.notes


@pytest.mark.parametrize("case", _cases("lora", only=("llama-lora", "mistral-lora")))
def test_a_lora_decoder_is_replayed_from_its_second_and_third_blocks(
    deep: None, case: zoo.Case
) -> None:
    """The first block of a LoRA model is given an input that needs no gradient (the frozen
    embedding's), so its events are its own; the second and third are the twins."""
    replayed, traced = _both(case, model_zoo.config_of(case))
    _assert_same(replayed, traced)
    told = " ".join(replayed.notes)
    assert f"blocks 4 of {LAYERS} (" in told and "replayed from block 3" in told, replayed.notes


FSDP2_TECHNIQUES = ("fp32", "bf16-autocast", "checkpoint-all", "accumulate")


@pytest.mark.parametrize("technique", FSDP2_TECHNIQUES)
@pytest.mark.parametrize("case", _cases("train", only=TECHNIQUE_FAMILIES))
def test_fsdp2_ranks_estimate_the_same_with_blocks_replayed(
    deep: None, case: zoo.Case, technique: str
) -> None:
    """FSDP2 gathers a block's parameters before its forward and its backward, and reduces and
    reshards after them: around a replayed block those run for real. Over three ranks, whose
    pieces differ, every rank's figures equal the full trace's."""
    settings = {"precision": case.precision, **TECHNIQUES[technique]}
    _assert_ranks_same(case, Config(**settings, parallel="fsdp2", world_size=3))


@pytest.mark.parametrize("case", _cases("lora", only=("llama-lora", "mistral-lora")))
def test_fsdp2_lora_ranks_estimate_the_same_with_blocks_replayed(
    deep: None, case: zoo.Case
) -> None:
    """LoRA under FSDP2: the frozen weights gathered, only the adapters' gradients reduced."""
    config = dataclasses.replace(model_zoo.config_of(case), parallel="fsdp2", world_size=3)
    _assert_ranks_same(case, config)


def _assert_ranks_same(case: zoo.Case, config: Config) -> None:
    """Every rank's figures with blocks replayed are the full trace's, and the replay says so
    where the model is deep enough (ViT's tiny size is not)."""
    replayed, traced = _both(case, config)
    _assert_same(replayed, traced)
    assert traced.peak_bytes is not None, traced.reason
    figures = [
        [(r.rank, r.peak_bytes, r.peak_reserved_bytes, r.breakdown, r.phase) for r in e.ranks]
        for e in (replayed, traced)
    ]
    assert len(figures[0]) == config.world_size and figures[0] == figures[1]
    kinds, _ = block_replay.eligible(torch, case.build("meta", "tiny").model, config)
    if kinds:
        assert any("replayed from block" in n for n in replayed.notes), replayed.notes


def test_parallel_ranks_say_they_trace_every_block() -> None:
    why = block_replay.eligible(torch, torch.nn.Linear(2, 2), Config(parallel="ddp", world_size=2))
    assert why == ([], "every block traced: parallel ranks (ddp) are traced whole")


@pytest.fixture
def cuda_like_cpu(deep: None) -> Any:
    """The CPU runs as CUDA's kernels would (:mod:`.cuda_like`): the kernels' own buffers, and
    the engine's sums of gradients in place (``grad_sums``)."""
    from jupyter_gpumem.tuner.estimation import cuda_like

    cuda_like.aim("cpu", cuda_like.Multiprocessors(132, 2048))
    yield
    cuda_like._AIMED.pop("cpu", None)


@pytest.mark.parametrize(
    "technique", ["fp32", "checkpoint-all", "checkpoint-some", "accumulate-bf16-autocast"]
)
@pytest.mark.parametrize("case", _cases("train", only=TECHNIQUE_FAMILIES))
def test_blocks_whose_gradients_are_summed_in_place_replay_the_same(
    cuda_like_cpu: None, case: zoo.Case, technique: str
) -> None:
    settings = {"precision": case.precision, **TECHNIQUES[technique]}
    replayed, traced = _both(case, Config(**settings))
    _assert_same(replayed, traced)
    if technique == "fp32" and case.name in ("llama-eager-fp32", "gpt2-fp32"):
        # replayed, with the sums in place: a block's input gradient is the one it was given
        assert any("replayed from block" in n for n in replayed.notes), replayed.notes
