"""Independent peak counters over a stand-in allocator with torch's own stats functions."""

from __future__ import annotations

import types
from typing import Any

import pytest

from jupyter_gpumem.tracking.counters import PeakCounters

# torch/cuda/memory.py's functions, as far as peaks go: they look each other up as module
# globals, so wrapping one in the module changes what the others return, as in torch.
MEMORY_PY = """
def memory_stats_as_nested_dict(device=None):
    if not is_initialized():
        return {}
    return torch._C._cuda_memoryStats(_get_device_index(device, optional=True))

def memory_stats(device=None):
    out = {}
    def flatten(prefix, obj):
        for k, v in obj.items():
            if isinstance(v, dict):
                flatten(prefix + k + ".", v)
            else:
                out[prefix + k] = v
    flatten("", memory_stats_as_nested_dict(device))
    return out

def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)

def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)

def reset_peak_memory_stats(device=None):
    return torch._C._cuda_resetPeakMemoryStats(_get_device_index(device, optional=True))
"""


class Allocator:
    """Current and peak bytes per device, as the caching allocator keeps them."""

    def __init__(self) -> None:
        self.current = {0: 0, 1: 0}
        self.peak = {0: 0, 1: 0}

    def alloc(self, n: int, device: int = 0) -> None:
        self.current[device] += n
        self.peak[device] = max(self.peak[device], self.current[device])

    def free(self, n: int, device: int = 0) -> None:
        self.current[device] -= n

    def stats(self, device: int) -> dict[str, Any]:
        entry = {"current": self.current[device], "peak": self.peak[device]}
        return {
            "allocated_bytes": {"all": dict(entry), "large_pool": dict(entry)},
            "reserved_bytes": {"all": {"current": 2 * entry["current"], "peak": 2 * entry["peak"]}},
            "num_ooms": 0,
        }

    def reset(self, device: int) -> None:
        self.peak[device] = self.current[device]


@pytest.fixture
def fake() -> tuple[Any, Allocator]:
    allocator = Allocator()
    torch = types.SimpleNamespace()
    torch._C = types.SimpleNamespace(
        _cuda_memoryStats=allocator.stats, _cuda_resetPeakMemoryStats=allocator.reset
    )
    memory = types.ModuleType("fake_torch_cuda_memory")
    memory.torch = torch  # type: ignore[attr-defined]
    memory.is_initialized = lambda: True  # type: ignore[attr-defined]
    memory._get_device_index = lambda device, optional=False: 0 if device is None else int(device)  # type: ignore[attr-defined]
    exec(MEMORY_PY, memory.__dict__)
    torch.cuda = types.SimpleNamespace(
        memory=memory,
        is_initialized=lambda: True,
        reset_peak_memory_stats=memory.reset_peak_memory_stats,
        memory_stats_as_nested_dict=memory.memory_stats_as_nested_dict,
    )
    return torch, allocator


def test_an_interval_keeps_its_own_peak_through_the_users_resets(
    fake: tuple[Any, Allocator],
) -> None:
    torch, alloc = fake
    counters = PeakCounters()
    counters.install(torch)
    alloc.alloc(100)
    interval = counters.open(0)
    alloc.alloc(500)
    alloc.free(500)
    torch.cuda.reset_peak_memory_stats()  # the user's reset, half-way
    alloc.alloc(50)
    assert counters.close(interval) == (600, 1200)


def test_an_interval_interrupted_while_closing_still_ends(fake: tuple[Any, Allocator]) -> None:
    torch, alloc = fake
    counters = PeakCounters()
    counters.install(torch)
    interval = counters.open(0)
    alloc.alloc(300)
    stats = torch._C._cuda_memoryStats

    def interrupted(device: int) -> dict[str, Any]:
        raise KeyboardInterrupt  # Ctrl-C while the cell's counters are read

    torch._C._cuda_memoryStats = interrupted
    with pytest.raises(KeyboardInterrupt):
        counters.close(interval)
    torch._C._cuda_memoryStats = stats
    assert not interval.open and counters._intervals == []
    later = counters.open(0)  # the next cell's interval is the only one, with its own peak
    alloc.alloc(100)
    assert counters._intervals == [later] and counters.close(later)[0] == 400


def test_the_user_still_sees_the_peak_our_reset_took_away(fake: tuple[Any, Allocator]) -> None:
    torch, alloc = fake
    counters = PeakCounters()
    counters.install(torch)
    alloc.alloc(1000)
    alloc.free(900)
    interval = counters.open(0)  # resets the real counters: their peak is now 100
    assert alloc.peak[0] == 100
    assert torch.cuda.memory.max_memory_allocated() == 1000
    assert torch.cuda.memory.max_memory_reserved() == 2000
    counters.close(interval)
    assert torch.cuda.memory.max_memory_allocated() == 1000
    torch.cuda.memory.reset_peak_memory_stats(0)  # the user's reset ends what was held
    assert torch.cuda.memory.max_memory_allocated() == 100


def test_samples_give_the_peak_of_each_stretch_and_intervals_keep_the_whole(
    fake: tuple[Any, Allocator],
) -> None:
    torch, alloc = fake
    counters = PeakCounters()
    counters.install(torch)
    cell = counters.open(0)
    peaks = []
    for size in (300, 700, 200):
        alloc.alloc(size)
        alloc.free(size)
        peaks.append(counters.sample(0).peak_allocated)
    assert peaks == [300, 700, 200]
    assert counters.close(cell)[0] == 700


def test_devices_are_kept_apart(fake: tuple[Any, Allocator]) -> None:
    torch, alloc = fake
    counters = PeakCounters()
    counters.install(torch)
    first, second = counters.open(0), counters.open(1)
    alloc.alloc(10, device=0)
    alloc.alloc(70, device=1)
    torch.cuda.reset_peak_memory_stats(1)
    assert counters.close(first)[0] == 10
    assert counters.close(second)[0] == 70


def test_uninstall_restores_torchs_functions(fake: tuple[Any, Allocator]) -> None:
    torch, _ = fake
    reset, stats = (
        torch.cuda.memory.reset_peak_memory_stats,
        torch.cuda.memory.memory_stats_as_nested_dict,
    )
    counters = PeakCounters()
    counters.install(torch)
    assert torch.cuda.memory.reset_peak_memory_stats is not reset
    assert torch.cuda.reset_peak_memory_stats.__wrapped__ is reset
    counters.uninstall()
    assert torch.cuda.memory.reset_peak_memory_stats is reset
    assert torch.cuda.memory.memory_stats_as_nested_dict is stats
    assert torch.cuda.reset_peak_memory_stats is reset
