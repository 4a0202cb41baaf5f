"""Ranks side by side: a rank's tensors on another rank's GPU, a rank above the others, and
what each rank's process holds outside PyTorch's allocator."""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpumem.workers.rank_balance import rank_notes
from jupyter_gpumem.workers.rank_reports import with_ranks
from tests.unit.test_rank_reports import GiB, _device, _rank

MiB = 2**20


def test_even_ranks_get_no_note() -> None:
    ranks = [_rank(i, 6 * GiB, GiB) for i in range(4)]
    assert rank_notes(ranks) == ()
    assert rank_notes(ranks[:1]) == ()


def test_a_rank_that_allocated_on_another_ranks_gpu_is_pointed_out() -> None:
    ranks = [_rank(0, 6 * GiB, GiB)]
    stray = replace(_device(0, 300 * MiB, 0), peak_allocated_bytes=300 * MiB)
    ranks += [_rank(i, 6 * GiB, GiB, devices=(_device(i, 6 * GiB, GiB), stray)) for i in (1, 2, 3)]
    notes = rank_notes(ranks)
    strays = [n for n in notes if "also allocated" in n]
    assert len(strays) == 3
    assert strays[0].startswith("rank 1 also allocated 300 MiB at its peak on cuda:0, not its own")
    assert "torch.cuda.set_device(1)" in strays[0]


def test_a_rank_above_the_others_is_named_with_the_category_that_differs() -> None:
    ranks = [_rank(i, 6 * GiB, GiB) for i in range(3)]
    ranks.append(_rank(3, 8 * GiB, 3 * GiB))
    notes = rank_notes(ranks)
    assert notes == (
        "rank 3's peak is 2.00 GiB above the other ranks' (8.00 GiB against 6.00 GiB on "
        "cuda:3): most of it activations (+2.00 GiB)",
    )
    small = [_rank(i, 6 * GiB, GiB) for i in range(3)] + [_rank(3, 6 * GiB + 10 * MiB, GiB)]
    assert rank_notes(small) == ()  # within the noise a rank's own work makes
    failed = [*ranks[:3], replace(ranks[3], status="oom")]
    assert rank_notes(failed[2:]) == ()  # a rank that failed stopped short of its peak


def test_memory_outside_the_allocator_is_named_per_rank() -> None:
    ranks = [
        _rank(
            i,
            6 * GiB,
            GiB,
            devices=(replace(_device(i, 6 * GiB, GiB), non_torch_bytes=(600 + i) * MiB),),
        )
        for i in range(2)
    ]
    (note,) = rank_notes(ranks)
    assert note == (
        "outside PyTorch's allocator (CUDA context, NCCL's buffers, library workspaces): "
        "rank 0 600 MiB on cuda:0, rank 1 601 MiB on cuda:1"
    )


def test_the_notes_come_with_the_ranks_in_the_cells_report() -> None:
    ranks = [_rank(i, 6 * GiB, GiB) for i in range(3)] + [_rank(3, 9 * GiB, 4 * GiB)]
    cell = replace(_rank(0, GiB, 0), rank=None, name="cell")
    joined = with_ranks(cell, ranks, ())
    assert any(n.startswith("rank 3's peak is 3.00 GiB above") for n in joined.notes)
