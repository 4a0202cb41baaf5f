"""The autograd engine's sums of gradients: found among a fake backward's ops as the real engine
makes them (counted by the profiler on real CPU tensors, where no dispatch mode is in the way),
and placed in the old buffer's block by the storage log."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from jupyter_gpumem.tuner.estimation.grad_sums import GradSums, dense  # noqa: E402
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog  # noqa: E402
from tests.support.squared import Squared  # noqa: E402


class Tied(torch.nn.Module):
    """Tied embeddings and two residual blocks: gradients meet in three kinds of place."""

    def __init__(self, vocab: int = 64, width: int = 16) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(2))
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: Any) -> Any:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + torch.relu(block(h))  # the residual stream's gradient is summed
        return self.head(h).logsumexp(-1).mean()


def _adds_of_real_backward(model: Any, ids: Any) -> tuple[int, int]:
    """(in place, out of place): the adds of a real CPU backward, which the engine's sums are
    (the forward's adds are made before the profile starts)."""
    loss = model(ids)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss.backward()
    names = [e.name for e in prof.events()]
    return names.count("aten::add_"), names.count("aten::add")


class _Recording(TorchDispatchMode):
    """What the fake step's mode does with the engine's sums, alone."""

    def __init__(self, log: StorageLog, sums: GradSums) -> None:
        super().__init__()
        self.log = log
        self.sums = sums
        self.found = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.log.record(out, args, kwargs)
        if self.sums.is_sum(func, args, kwargs):
            self.found += 1
            self.log.summed(out, args[0])
        return out


def test_the_sums_found_and_made_in_place_are_the_real_engines() -> None:
    torch.manual_seed(0)
    in_place, out_of_place = _adds_of_real_backward(Tied(), torch.randint(0, 64, (4, 8)))
    assert in_place >= 1  # the tied weight's two gradients, at least
    mode = FakeTensorMode()
    log = StorageLog(torch, torch.device("cpu"), mode)
    with mode:
        model = Tied()
        loss = model(torch.randint(0, 64, (4, 8)))
        sums = GradSums(torch)
        recording = _Recording(log, sums)
        log.recording = True
        with sums.watching(loss), recording:
            loss.backward()
    assert out_of_place >= 1  # the residual streams': each old buffer is a view (of a reshape)
    assert recording.found == log.sums_in_place == in_place


def test_no_sum_is_found_outside_a_watched_backward_or_with_grad_mode_on() -> None:
    with FakeTensorMode():
        model = Tied()
        sums = GradSums(torch)
        recording = _Recording(StorageLog(torch, torch.device("cpu"), FakeTensorMode()), sums)
        loss = model(torch.randint(0, 64, (4, 8)))
        with recording:
            loss.backward()  # not watched
        assert recording.found == 0
        loss = model(torch.randint(0, 64, (4, 8)))
        with sums.watching(loss), recording:
            loss.backward(create_graph=True)  # the engine sums out of place under grad mode
        assert recording.found == 0


def test_dense_layouts() -> None:
    assert dense((4, 3), (3, 1))
    assert dense((4, 3), (1, 4))  # transposed, still dense
    assert dense((4, 1, 3), (3, 99, 1))  # a size-1 dimension's stride does not matter
    assert not dense((4, 3), (4, 1))  # a gap between rows
    assert not dense((4, 3), (0, 1))  # broadcast: rows overlap


def _log() -> tuple[StorageLog, FakeTensorMode]:
    mode = FakeTensorMode()
    log = StorageLog(torch, torch.device("cpu"), mode)
    log.recording = True
    return log, mode


def test_a_sum_whose_old_buffer_dies_takes_its_block() -> None:
    log, mode = _log()
    with mode:
        old = torch.empty(256)
        log.record(old, (), {})
        out = torch.empty(256)
        log.record(out, (), {})
        log.summed(out, old)
        del old  # the engine lets the old buffer go as the sum replaces it
        assert [a for a, _, _ in log.events] == ["alloc"]
        log.tag(out, "gradients")
        del out
    assert [(a, i) for a, i, _ in log.events] == [("alloc", 0), ("free", 0)]
    assert log.tags == [(0, "gradients")]


def test_a_sum_whose_old_buffer_lives_on_is_its_own_block() -> None:
    log, mode = _log()
    with mode:
        old = torch.empty(256)
        log.record(old, (), {})
        held = old  # saved elsewhere: the engine would not sum in place
        out = torch.empty(256)
        log.record(out, (), {})
        log.summed(out, old)
        other = torch.empty(8)
        log.record(other, (), {})
        del old, held
    assert [(a, i) for a, i, _ in log.events] == [
        ("alloc", 0),
        ("alloc", 1),
        ("alloc", 2),
        ("free", 0),
    ]


def test_a_stand_in_estimate_sums_gradients_in_place_as_the_gpu_does() -> None:
    """At the sum the step holds its input, ``h`` (saved), and the two gradients of ``h``; the
    GPU adds the second into the first, where a fake step would make a fifth tensor."""
    from jupyter_gpumem.tuner.trial import Trial

    rows, width = 4096, 256
    unit = rows * width * 4
    with torch.device("meta"):
        model = Squared(width)
    x = torch.zeros(rows, width, device="meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trial = Trial(model, x, lambda m, b: m(b), optimizer=opt, device="cuda")
    found = trial.estimate(gpu="H100-80GB")
    assert found.peak_bytes is not None, found.reason
    step = found.peak_bytes - found.breakdown["library_workspace"] - found.breakdown["parameters"]
    assert 4 * unit <= step < 4.5 * unit, found.breakdown
