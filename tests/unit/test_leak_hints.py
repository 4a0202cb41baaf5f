"""Leak hints from measured numbers: growth across re-runs, hint texts, the `free` record."""

from __future__ import annotations

import pytest

from jupyter_gpumem.analysis.leak_hints import (
    Freed,
    LeakHint,
    cycles_hint,
    graph_hint,
    growth_hint,
    output_cache_hint,
    traceback_hint,
)

MiB = 2**20


def test_steady_growth_per_run_is_reported() -> None:
    hint = growth_hint([100 * MiB, 164 * MiB, 228 * MiB, 292 * MiB], label="cell 7")
    assert hint is not None
    assert (hint.kind, hint.bytes, hint.where) == ("growth", 64 * MiB, ("cell 7",))
    assert hint.message == "cell 7 grows by 64.0 MiB per run (+192 MiB over the last 4 runs)."
    assert ".item()" in hint.fix


def test_similar_but_not_equal_growth_counts() -> None:
    hint = growth_hint([0, 10 * MiB, 21 * MiB, 30 * MiB])
    assert hint is not None and hint.bytes == 10 * MiB


@pytest.mark.parametrize(
    "after",
    [
        [100 * MiB] * 5,  # flat
        [0, 64 * MiB],  # too few runs
        [0, 10 * MiB, 50 * MiB, 52 * MiB],  # erratic
        [0, 10 * MiB, 20 * MiB, 10 * MiB],  # freed on the last run
        [0, 100_000, 200_000, 300_000],  # below the noise floor
        [300 * MiB, 200 * MiB, 100 * MiB],  # shrinking
    ],
)
def test_no_growth_hint(after: list[int]) -> None:
    assert growth_hint(after) is None


def test_growth_counts_only_the_latest_streak() -> None:
    # memory was flat, then the cell started to leak 8 MiB per run
    hint = growth_hint([50 * MiB, 50 * MiB, 58 * MiB, 66 * MiB, 74 * MiB])
    assert hint is not None and hint.bytes == 8 * MiB
    assert "over the last 4 runs" in hint.message


def test_growth_thresholds_are_options() -> None:
    assert growth_hint([0, 1000, 2000], min_growth_bytes=500) is not None
    assert growth_hint([0, MiB * 2, MiB * 4], min_runs=4) is None
    with pytest.raises(ValueError, match="at least 2"):
        growth_hint([0, 1], min_runs=1)


def test_hints_name_their_holders_and_are_absent_when_nothing_is_held() -> None:
    out = output_cache_hint(4 * MiB, ["Out[3]", "_"])
    assert out == LeakHint(
        "output-cache",
        4 * MiB,
        "IPython's output cache holds {bytes} of tensors that nothing else references (Out[3], _).",
        out.fix if out else "",
        ("Out[3]", "_"),
        {"bytes": 4 * MiB},
    )
    assert out.message == (
        "IPython's output cache holds 4.00 MiB of tensors that nothing else references (Out[3], _)."
    )
    braces = graph_hint(MiB, ["d['{x}']"])
    assert braces is not None and braces.message.startswith("d['{x}'] keeps its autograd graph")
    assert "%gpumem free" in out.fix  # type: ignore[union-attr]
    tb = traceback_hint(2 * MiB, ["forward() line 12"])
    assert tb is not None and "forward() line 12" in tb.message
    many = graph_hint(MiB, [f"loss{i}" for i in range(6)])
    assert many is not None and "loss3 and 2 more keep their autograd graph" in many.message
    assert "loss.item()" in many.fix
    cyc = cycles_hint(3 * MiB, 2)
    assert cyc is not None and "3.00 MiB in 2 tensor(s)" in cyc.message
    assert [
        output_cache_hint(0, []),
        traceback_hint(0, []),
        graph_hint(0, []),
        cycles_hint(0, 0),
    ] == [None] * 4


def test_hint_to_dict_is_plain_json() -> None:
    hint = LeakHint("traceback", 5, "m {bytes}", "f", ("a",), {"bytes": 5 * MiB})
    assert hint.to_dict() == {
        "kind": "traceback",
        "bytes": 5,
        "message": "m 5.00 MiB",
        "template": "m {bytes}",
        "amounts": {"bytes": 5 * MiB},
        "fix": "f",
        "where": ["a"],
    }


def test_freed_says_what_was_measured() -> None:
    cpu_only = Freed(
        cuda_bytes=None, cpu_bytes=4 * MiB, cache_returned_bytes=None, cleared=("Out[2]",)
    )
    assert cpu_only.total_bytes == 4 * MiB
    assert str(cpu_only) == "freed 4.00 MiB of CPU tensors (cleared: Out[2])"
    gpu = Freed(cuda_bytes=2 * MiB, cpu_bytes=0, cache_returned_bytes=6 * MiB, cleared=())
    assert gpu.total_bytes == 2 * MiB
    assert str(gpu) == (
        "freed 2.00 MiB of CUDA tensors and 0 B of CPU tensors; "
        "6.00 MiB of cache returned to the driver (cleared: nothing to clear)"
    )
    nothing = Freed(None, None, None, ())
    assert nothing.total_bytes == 0
    assert "torch not imported" in str(nothing)
