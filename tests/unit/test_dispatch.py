"""The CPU event source against hand counts, torch's own allocator accounting and the replay."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

from jupyter_gpumem.analysis.replay import replay_exact
from jupyter_gpumem.records import TraceEvent

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import (  # noqa: E402
    TorchDispatchMode,
    _get_current_dispatch_mode_stack,
)

from jupyter_gpumem.tracking.dispatch import DispatchRecorder  # noqa: E402


def ev(action: str, address: int, size: int) -> TraceEvent:
    return TraceEvent(action, address, size)


def free(address: int, size: int) -> list[TraceEvent]:
    return [ev("free_requested", address, size), ev("free_completed", address, size)]


def allocs(events: tuple[TraceEvent, ...]) -> list[TraceEvent]:
    return [e for e in events if e.action == "alloc"]


def live_addresses(events: tuple[TraceEvent, ...]) -> set[int]:
    live: set[int] = set()
    for e in events:
        if e.action == "alloc":
            live.add(e.address)
        elif e.action == "free_requested":
            live.discard(e.address)
    return live


class Counting(TorchDispatchMode):
    """A user's own mode: counts the ops it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


# -- replay_exact --------------------------------------------------------------------
def test_replay_exact_counts_exact_sizes() -> None:
    events = [ev("alloc", 0x10, 100), ev("alloc", 0x20, 7), *free(0x10, 100), ev("alloc", 0x30, 1)]
    r = replay_exact(events)
    assert r.exact and r.reason is None
    assert r.allocated_series == (100, 107, 7, 7, 8)
    assert r.reserved_series == r.allocated_series
    assert (r.peak_allocated, r.peak_reserved, r.peak_index) == (107, 107, 1)
    assert sorted((b.address, b.size, b.requested_size, b.event_index) for b in r.live_at_peak) == [
        (0x10, 100, 100, 0),
        (0x20, 7, 7, 1),
    ]
    assert r.allocated_end == 8


def test_replay_exact_start_and_oom() -> None:
    events = [ev("alloc", 0x10, 10), ev("oom", 0, 1 << 40), *free(0x10, 10)]
    r = replay_exact(events, allocated_start=50)
    assert r.exact
    assert r.allocated_series == (60, 60, 50, 50)
    assert (r.peak_allocated, r.peak_index, r.oom_index) == (60, 0, 1)
    assert [b.address for b in r.live_at_oom] == [0x10]
    assert replay_exact([*free(0x10, 10)], allocated_start=50).peak_index == -1


def test_replay_exact_is_inexact_on_unknown_free_and_double_alloc() -> None:
    r = replay_exact([ev("alloc", 0x10, 10), *free(0x99, 4)], allocated_start=4)
    assert not r.exact and "0x99" in (r.reason or "")
    assert r.allocated_end == 10
    r = replay_exact([ev("alloc", 0x10, 10), ev("alloc", 0x10, 10)])
    assert not r.exact and "already live" in (r.reason or "")
    assert not replay_exact([ev("free_completed", 0x10, 10)]).exact


# -- the recorder --------------------------------------------------------------------
def test_hand_counted_peak_of_a_fixed_sequence() -> None:
    before = torch.ones(1000)  # not the cell's: never counted
    with DispatchRecorder() as rec:
        a = torch.ones(1000)  # 4000
        b = a * 2  # 8000
        # a+b: 12000; (a+b)+before: 16000; a+b freed: 12000; sum: 12004; a+b+before freed: 8004
        c = (a + b + before).sum()
        del b  # 4004
    r = replay_exact(rec.events)
    assert r.exact
    assert r.peak_allocated == 16000
    assert r.allocated_end == a.untyped_storage().nbytes() + c.untyped_storage().nbytes() == 4004
    assert [e.size for e in allocs(rec.events)] == [4000, 4000, 4000, 4000, 4]


def test_adam_mlp_two_steps_matches_torch_allocator_accounting() -> None:
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with DispatchRecorder() as rec:
            model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
            opt = torch.optim.Adam(model.parameters())
            for _ in range(2):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
    r = replay_exact(rec.events)
    assert r.exact, r.reason

    # What the cell left alive, counted by hand from the objects themselves.
    kept = {p.untyped_storage() for p in model.parameters()}
    kept |= {v.untyped_storage() for s in opt.state.values() for v in s.values()}
    kept.add(loss.untyped_storage())
    n, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    # parameters 4N, Adam's moments 8N, an fp32 step per parameter, the loss; grads are None
    loss_bytes = loss.untyped_storage().nbytes()  # a reduction's buffer: more than 4 bytes
    assert sum(st.nbytes() for st in kept) == 4 * n + 8 * n + 4 * tensors + loss_bytes
    assert r.allocated_end == sum(st.nbytes() for st in kept)
    assert live_addresses(rec.events) == {st.data_ptr() for st in kept}

    # The peak, from torch's CPU allocator as the profiler reports it (kernel scratch included).
    total = peak = 0
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            total += e.nbytes()
            peak = max(peak, total)
    assert r.peak_allocated == peak
    assert r.allocated_end == total


def test_views_and_in_place_ops_allocate_nothing() -> None:
    old = torch.zeros(8, 8)
    with DispatchRecorder() as rec:
        a = torch.zeros(4, 4)
        views = [a.view(16), a.t(), a[1:], a.detach(), a.reshape(2, 8), a.unsqueeze(0)]
        a.add_(1).mul_(2)
        views[0].zero_()
        views += [old.view(64), old[0], old.T, old.detach()]
        old.add_(1)
        views += [nn.Parameter(a), a.to(torch.float32)]  # share a's storage
    assert [e.size for e in allocs(rec.events)] == [64]
    assert {v.untyped_storage().data_ptr() for v in views} == {a.data_ptr(), old.data_ptr()}
    assert rec.events[0].address == a.data_ptr()
    assert replay_exact(rec.events).peak_allocated == 64


def test_a_freed_temporary_gives_free_events() -> None:
    a = torch.ones(256)
    with DispatchRecorder() as rec:
        b = a * 3
        address, size = b.untyped_storage().data_ptr(), b.untyped_storage().nbytes()
        del b
        c = a + 1
    actions = [(e.action, e.address, e.size) for e in rec.events]
    assert actions[:3] == [
        ("alloc", address, size),
        ("free_requested", address, size),
        ("free_completed", address, size),
    ]
    assert actions[3] == ("alloc", c.data_ptr(), 1024)
    r = replay_exact(rec.events)
    assert (r.peak_allocated, r.allocated_end) == (1024, 1024)


def test_frames_name_the_line_that_allocated() -> None:
    def make() -> Any:
        return torch.empty(10)

    here = sys._getframe().f_code.co_name
    with DispatchRecorder() as rec:
        layer_line = sys._getframe().f_lineno + 1
        layer = nn.Linear(3, 3)  # torch.empty inside torch.nn
        make_line = sys._getframe().f_lineno + 1
        made = make()
    first, last = allocs(rec.events)[0].frames, allocs(rec.events)[-1].frames
    assert first[0] == {"filename": __file__, "line": layer_line, "name": here}
    assert last[0] == {
        "filename": __file__,
        "line": make.__code__.co_firstlineno + 1,
        "name": "make",
    }
    assert last[1] == {"filename": __file__, "line": make_line, "name": here}
    assert 2 <= len(last) <= 8
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    assert not any(f["filename"].startswith(torch_dir) for e in rec.events for f in e.frames)
    assert layer.weight.untyped_storage().data_ptr() == allocs(rec.events)[0].address
    assert made.data_ptr() == allocs(rec.events)[-1].address


def test_the_users_own_modes_keep_working() -> None:
    outer, inner = Counting(), Counting()
    with outer, DispatchRecorder() as rec:
        a = torch.ones(4) * 2
        with inner:
            b = a + 1
    assert "aten.mul.Tensor" in outer.ops and "aten.add.Tensor" in outer.ops
    assert inner.ops == ["aten.add.Tensor"]
    assert [e.address for e in allocs(rec.events)][-1] == b.data_ptr()
    assert _get_current_dispatch_mode_stack() == []


def test_an_exception_leaves_no_mode_on_the_stack() -> None:
    with pytest.raises(ZeroDivisionError), DispatchRecorder():
        torch.ones(3) * 2
        _ = 1 / 0
    assert _get_current_dispatch_mode_stack() == []
    assert torch._C._len_torch_dispatch_stack() == 0

    # A mode the cell entered and never left stays; ours goes.
    rec, left_open = DispatchRecorder(), Counting()
    rec.start()
    left_open.__enter__()
    rec.stop()
    assert _get_current_dispatch_mode_stack() == [left_open]
    left_open.__exit__(None, None, None)
    assert _get_current_dispatch_mode_stack() == []


def test_factories_lifted_tensors_and_out_arguments() -> None:
    import numpy as np

    with DispatchRecorder() as rec:
        t = torch.tensor([1.0, 2.0])  # 8, through lift_fresh
        shared = torch.from_numpy(np.ones(3))  # numpy's memory: not ours
        out = torch.empty(0)
        torch.add(t, t, out=out)  # resized from 0 to 8 bytes
        d = t.to(torch.float64)  # 16
    assert [(e.address, e.size) for e in allocs(rec.events)] == [
        (t.data_ptr(), 8),
        (out.data_ptr(), 8),
        (d.data_ptr(), 16),
    ]
    assert shared.data_ptr() not in live_addresses(rec.events)


def test_tensor_subclasses_are_recorded_by_their_inner_tensors() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    x = TwoTensor(torch.zeros(4), torch.ones(4))
    with DispatchRecorder() as rec:
        y = x * 2
    assert isinstance(y, TwoTensor)
    assert {e.address for e in allocs(rec.events)} == {y.a.data_ptr(), y.b.data_ptr()}
    assert replay_exact(rec.events).allocated_end == 32


def test_frees_after_stop_are_not_reported_and_restart_is_fresh() -> None:
    rec = DispatchRecorder()
    with rec:
        a = torch.ones(10)
    del a
    assert [e.action for e in rec.events] == ["alloc"]
    with rec:
        b = torch.ones(3)
    assert [(e.action, e.size) for e in rec.events] == [("alloc", 12)]
    assert b.numel() == 3
    with pytest.raises(RuntimeError, match="already started"), rec:
        rec.start()


def test_other_threads_are_not_recorded_but_their_frees_are() -> None:
    made: list[Any] = []
    with DispatchRecorder() as rec:
        a = torch.ones(100)
        box = [a]
        del a

        def work() -> None:
            made.append(torch.ones(50))  # this thread has no dispatch modes
            box.clear()  # drops the last reference to the recorded tensor

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    assert [(e.action, e.size) for e in rec.events] == [
        ("alloc", 400),
        ("free_requested", 400),
        ("free_completed", 400),
    ]
    assert made[0].numel() == 50


def test_meta_tensors_when_asked_and_bad_devices_refused() -> None:
    with DispatchRecorder(devices=("meta",)) as rec:
        m = torch.empty(5, device="meta")
        torch.ones(5)
    [alloc] = allocs(rec.events)
    assert alloc.size == 20 and alloc.address == m.untyped_storage()._cdata
    with pytest.raises(ValueError, match="allowed"):
        DispatchRecorder(devices=("cuda",))


def test_fake_tensors_are_recorded_with_their_sizes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), DispatchRecorder() as rec:
        x = torch.empty(100)  # a FakeTensor on the fake cpu device: no real memory
        y = x * 2
        del y
    assert [(e.action, e.size) for e in rec.events] == [
        ("alloc", 400),
        ("alloc", 400),
        ("free_requested", 400),
        ("free_completed", 400),
    ]
    assert replay_exact(rec.events).peak_allocated == 800
    assert x.untyped_storage().device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_are_ignored() -> None:
    with DispatchRecorder() as rec:
        g = torch.ones(100, device="cuda") * 2
        c = torch.ones(10)
    assert [(e.address, e.size) for e in allocs(rec.events)] == [(c.data_ptr(), 40)]
    assert g.is_cuda


def test_importing_the_recorder_does_not_import_torch() -> None:
    code = "import sys, jupyter_gpumem.tracking.dispatch; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
