"""Composing technique combinations from anchors: pure arithmetic, checked by hand."""

from __future__ import annotations

import dataclasses

from jupyter_gpumem.tuner.planning.composed import (
    Anchor,
    Anchors,
    Choice,
    compose,
    corrected,
    dominated,
    front,
    ranked,
)

MiB = 2**20


def _anchors(timed: bool = True) -> Anchors:
    def a(peak: int, static: int, opt: int, step: float) -> Anchor:
        return Anchor(peak * MiB, static * MiB, opt * MiB, step if timed else None)

    base = a(100, 40, 20, 1.0)  # 60 MiB of activations and temporaries
    return Anchors(
        base=base,
        precision={None: base, "bf16-autocast": a(80, 40, 20, 0.5)},  # 40 dynamic
        optimizer={None: base, "adamw-8bit": a(85, 25, 5, 1.1)},  # 15 MiB less state
        all_blocks={None: a(55, 40, 20, 1.3), "bf16-autocast": a(50, 40, 20, 0.7)},
        most_micro={None: a(70, 40, 20, 1.2), "bf16-autocast": a(60, 40, 20, 0.6)},
        blocks=4,
        most_accumulate=4,
    )


def test_each_anchor_is_composed_back_to_itself() -> None:
    anchors = _anchors()
    assert anchors.peak(Choice(None, None, 0, 1)) == 100 * MiB
    assert anchors.peak(Choice("bf16-autocast", None, 0, 1)) == 80 * MiB
    assert anchors.peak(Choice(None, "adamw-8bit", 0, 1)) == 85 * MiB
    assert anchors.peak(Choice(None, None, 4, 1)) == 55 * MiB
    assert anchors.peak(Choice(None, None, 0, 4)) == 70 * MiB
    assert anchors.step_s(Choice(None, None, 4, 1)) == 1.3


def test_combinations_scale_the_dynamic_part_and_swap_the_optimizer_state() -> None:
    anchors = _anchors()
    # half the blocks: the dynamic 60 MiB keeps half of the way to 15 of 60 (0.625); with
    # 2 micro-batches, (1 - 1/2) / (1 - 1/4) = 2/3 of the way to 30 of 60 (2/3 kept)
    kept = (1 + (15 / 60 - 1) * 0.5) * (1 + (30 / 60 - 1) * (2 / 3))
    expected = 40 * MiB - 15 * MiB + 60 * MiB * kept
    assert anchors.peak(Choice(None, "adamw-8bit", 2, 2)) == int(expected)
    step = anchors.step_s(Choice("bf16-autocast", "adamw-8bit", 2, 1))
    # bf16's compute with half the blocks recomputed, plus the 8-bit step's own 0.1 s
    assert step is not None and abs(step - (0.5 * (1 + (0.7 / 0.5 - 1) * 0.5) + 0.1)) < 1e-12
    assert _anchors(timed=False).step_s(Choice(None, None, 0, 1)) is None


def test_the_front_and_the_ranking() -> None:
    anchors = _anchors()
    choices = [
        Choice(p, o, k, a)
        for p in (None, "bf16-autocast")
        for o in (None, "adamw-8bit")
        for k in range(5)
        for a in (1, 2, 4)
    ]
    points = compose(anchors, choices)
    assert len(points) == 60
    edge = front(points)
    for p in edge:  # nothing both smaller and cheaper
        assert not any(
            q.peak_bytes < p.peak_bytes and (q.step_s or 0) < (p.step_s or 0) for q in points
        )
    fitting = ranked(points, 60 * MiB)
    assert fitting and all(p.peak_bytes <= 60 * MiB for p in fitting)
    assert [p.step_s for p in fitting] == sorted(p.step_s for p in fitting)  # type: ignore[type-var]
    untimed = ranked(compose(_anchors(timed=False), choices), 60 * MiB)
    assert [p.choice.changes for p in untimed] == sorted(p.choice.changes for p in untimed)


def test_offloading_keeps_its_share_of_the_dynamic_part_and_costs_its_step_time() -> None:
    anchors = _anchors()
    moved = Anchor(70 * MiB, 40 * MiB, 20 * MiB, 1.5)  # 30 of the 60 dynamic MiB kept
    anchors = dataclasses.replace(anchors, offload={"model": moved})
    alone = Choice(None, None, 0, 1, offload="model")
    assert anchors.peak(alone) == 70 * MiB and anchors.step_s(alone) == 1.5
    assert alone.changes == 1
    # with bf16 autocast: what offloading keeps is taken in bytes (30 MiB, the loss's and a
    # block's, which bf16 does not halve), the lesser beside bf16's own 40; the copies cost
    # seconds by the bytes moved (40 of 60), added to bf16's faster compute, not a factor of it
    both = Choice("bf16-autocast", None, 0, 1, offload="model")
    assert anchors.peak(both) == 40 * MiB + 30 * MiB
    assert abs(anchors.step_s(both) - (0.5 + 0.5 * 40 / 60)) < 1e-12
    # with every block checkpointed (15 of 60 MiB left to save), little is left to copy, and
    # what stays is the lesser of what each kept alone: here checkpointing's 15 MiB
    saved = Choice(None, None, 4, 1, offload="model")
    assert abs(anchors.step_s(saved) - (1.3 + 0.5 * 15 / 60)) < 1e-12
    assert anchors.peak(saved) == anchors.peak(Choice(None, None, 4, 1)) == 55 * MiB
    # and where offloading alone keeps less (10 MiB), its share, never the product of the two
    tighter = dataclasses.replace(
        anchors, offload={"model": dataclasses.replace(moved, peak_bytes=50 * MiB)}
    )
    assert tighter.peak(saved) == tighter.peak(alone) == 50 * MiB
    # micro-batches copy the whole batch's bytes, a slice at a time
    micro = Choice(None, None, 0, 4, offload="model")
    assert abs(anchors.step_s(micro) - (1.2 + 0.5)) < 1e-12
    untimed = dataclasses.replace(
        anchors, offload={"model": dataclasses.replace(moved, step_s=None)}
    )
    assert untimed.step_s(alone) is None
    # where step times are unknown, checkpointing comes before offloading at equal changes
    checkpointed = Choice(None, None, 4, 1)
    untimed_all = dataclasses.replace(_anchors(timed=False), offload={"model": moved})
    points = compose(untimed_all, [alone, checkpointed])
    assert [p.choice for p in ranked(points, 100 * MiB)] == [checkpointed, alone]


def test_a_failed_confirmation_moves_its_family_by_its_error() -> None:
    anchors = _anchors()
    choices = [Choice(p, o, 4, 1) for p in (None, "bf16-autocast") for o in (None, "adamw-8bit")]
    points = compose(anchors, choices)
    wrong = points[0]  # as is, AdamW: its own estimate came out 7 MiB over the composition
    moved = corrected(points, wrong, wrong.peak_bytes + 7 * MiB)
    same = [q.peak_bytes - p.peak_bytes for p, q in zip(points, moved, strict=True)]
    # the 8-bit twin shares the family (the optimizer's bytes are exact); bf16's do not
    assert same == [7 * MiB, 7 * MiB, 0, 0]
    # the blocks' and the whole model's offloading leave alike floors: one family, apart from
    # the same choice kept on the device
    kept = Anchor(70 * MiB, 40 * MiB, 20 * MiB, 1.5)
    offloaded = dataclasses.replace(anchors, offload={"model": kept, "blocks": kept})
    where = [Choice(None, None, 4, 1, offload=w) for w in ("blocks", "model")]
    alike = compose(offloaded, [*where, Choice(None, None, 4, 1)])
    shifted = corrected(alike, alike[0], alike[0].peak_bytes + 5 * MiB)
    assert [q.peak_bytes - p.peak_bytes for p, q in zip(alike, shifted, strict=True)] == [
        5 * MiB,
        5 * MiB,
        0,
    ]
    assert [p.choice for p in moved] == choices and [p.step_s for p in moved] == [
        p.step_s for p in points
    ]


def test_a_precision_beaten_alone_on_bytes_and_time_is_named_with_its_better() -> None:
    fp32 = Anchor(100 * MiB, 40 * MiB, 20 * MiB, 1.0)
    tf32 = dataclasses.replace(fp32, step_s=0.8)  # the same bytes, faster
    bf16 = Anchor(80 * MiB, 40 * MiB, 20 * MiB, 0.5)  # fewer activations, faster still
    slow_small = Anchor(60 * MiB, 20 * MiB, 20 * MiB, 2.0)  # smallest, slowest: beaten by none
    found = dominated({None: fp32, "tf32": tf32, "bf16-autocast": bf16, "bf16": slow_small})
    assert found == {None: "tf32", "tf32": "bf16-autocast"}
    # alike on every count: neither beats the other
    assert dominated({None: fp32, "tf32": dataclasses.replace(fp32)}) == {}
    # untimed (a model on the meta device): nothing is left out
    assert dominated({None: dataclasses.replace(fp32, step_s=None), "bf16-autocast": bf16}) == {}


def test_a_step_time_within_the_timings_spread_leaves_no_precision_out() -> None:
    """The tiny GPT on the CPU: bf16 autocast has fewer activations and, run to run, steps
    0.6 ms faster or slower than fp32 within 1.1 ms of spread. Whether fp32 was left out
    (and the search composed 39 candidates or 72) followed the noise."""
    fp32 = Anchor(3_639_992, 416_368, 0, 0.01336, 0.00112)
    bf16 = Anchor(3_001_016, 416_368, 0, 0.01300, 0.00018)  # 0.36 ms faster: within the spread
    assert dominated({None: fp32, "bf16-autocast": bf16}) == {}
    faster = dataclasses.replace(bf16, step_s=0.01100)  # 2.4 ms faster: beyond it
    assert dominated({None: fp32, "bf16-autocast": faster}) == {None: "bf16-autocast"}
    # untimed spreads (one step each): the times compare as they are
    once = {
        None: dataclasses.replace(fp32, spread_s=None),
        "b": dataclasses.replace(bf16, spread_s=None),
    }
    assert dominated(once) == {None: "b"}


def test_the_state_on_the_cpu_changes_the_static_part_as_its_rank_alone_did() -> None:
    anchors = dataclasses.replace(
        _anchors(),
        state_on_cpu={1: Anchor(70 * MiB, 0, 0, None)},  # 30 MiB of state gone
    )
    plain = Choice("bf16-autocast", None, 4, 1)
    moved = dataclasses.replace(plain, parallel="fsdp2", world_size=1, cpu_offload=True)
    assert moved.group == ("fsdp2", 1, True) and plain.group == (None, 1, False)
    assert anchors.peak(moved) == anchors.peak(plain) - 30 * MiB
    assert anchors.step_s(moved) == anchors.step_s(plain)  # the ranks' time is not composed
