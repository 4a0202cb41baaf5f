"""The allocator model fed two real GPU traces reserves what the GPU reserved, to the byte.

``tests/fixtures/h200_allocator_traces.json.gz`` holds, for DeBERTa-v3 (bf16 autocast) and
GPT-2 (fp32) training steps of the zoo, the caching allocator's segments after the warm-up step
and its events through the two measured steps on an H200, as ``bench/allocator_check.py``
recorded them (in each, the second measured step reserves a 250 MiB segment more than the
first). Every request is made of the model in the GPU's order; the model must take the same
segments.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from jupyter_gpumem.tracking.snapshot import read_segments
from jupyter_gpumem.tuner.estimation.allocator_model import CachingAllocator

TRACES = json.loads(
    gzip.decompress(
        (Path(__file__).parents[1] / "fixtures" / "h200_allocator_traces.json.gz").read_bytes()
    )
)


@pytest.mark.parametrize("case", sorted(TRACES))
def test_the_gpus_requests_reserve_what_the_gpu_reserved(case: str) -> None:
    recorded = TRACES[case]
    start = read_segments(recorded["start_segments"], 0)
    model = CachingAllocator(start)
    gpu = peak_gpu = sum(s.total_size for s in start)
    peak_model = model.reserved
    placed: dict[int, int] = {}
    for action, address, size in recorded["events"]:
        if action == "alloc":
            placed[address] = model.malloc(size)
        elif action == "free":
            model.free(placed.pop(address))
        else:  # the GPU reserved a segment
            gpu += size
            peak_gpu = max(peak_gpu, gpu)
        peak_model = max(peak_model, model.reserved)
    assert peak_gpu == recorded["measured_reserved"]
    assert peak_model == peak_gpu
    assert not placed  # the steps free all they make
