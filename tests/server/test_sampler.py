"""The sampler thread: one per sampler, bounded history, interval floor, clean stop."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time

import pytest
from traitlets import TraitError

from jupyter_gpumem.nvml.library import NvmlBackend, executable_name, process_command
from jupyter_gpumem.nvml.readings import Reason, Sample
from jupyter_gpumem.nvml.sampler import THREAD_NAME, Sampler
from jupyter_gpumem.server.extension import GpuMem
from tests.support.nvml_fake import FakeNvml, FakeNvmlBackend


def make(history_s: float = 600.0) -> tuple[Sampler, FakeNvml]:
    fake = FakeNvml.from_spec()
    return Sampler(fake.backend(use_environment=False), interval_s=0.25, history_s=history_s), fake


def threads() -> int:
    return sum(t.name == THREAD_NAME for t in threading.enumerate())


def test_interval_floor_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match=r"at least 0\.25 s"):
        Sampler(FakeNvml.from_spec().backend(), interval_s=0.1)
    with pytest.raises(Exception, match=r"GpuMem\.interval_s: .*at least 0\.25 s"):
        GpuMem(interval_s=0.2)
    assert GpuMem(interval_s=0.25).interval_s == 0.25


def test_backend_class_is_a_backend_and_a_stand_in_gets_its_spec() -> None:
    assert type(GpuMem().make_backend(list)) is NvmlBackend
    with pytest.raises(TraitError, match="subclass of"):
        GpuMem(backend_class="tests.support.nvml_fake.FakeNvml")  # the library, not a backend
    config = GpuMem(
        backend_class="tests.support.nvml_fake.FakeNvmlBackend",
        fake_spec={"devices": [{"name": "G0", "processes": [{"pid": "kernels"}]}]},
        visible_devices="0",
    )
    backend = config.make_backend(lambda: [4242])
    assert isinstance(backend, FakeNvmlBackend)
    (device,) = backend.read().devices
    assert device.name == "G0" and [p.pid for p in device.processes] == [4242]
    backend.close()


def test_the_kernels_keep_their_command_lines_whoever_owns_them() -> None:
    # The kernel is this test's process, run (so the stand-in says) by another user.
    kernel = {"pid": "kernels", "uid": os.getuid() + 1, "memory_bytes": 1}
    spec = {"devices": [{"name": "G0", "processes": [kernel]}]}
    command = process_command(os.getpid())
    assert command is not None and " " in command
    config = GpuMem(backend_class="tests.support.nvml_fake.FakeNvmlBackend", fake_spec=spec)
    served = config.make_backend(lambda: [os.getpid()])
    (process,) = served.read().devices[0].processes
    served.close()
    assert (process.pid, process.command) == (os.getpid(), command)
    # The same process, when it is no kernel the backend knows of, shows its executable only.
    fake = FakeNvml.from_spec(spec)
    fake.kernel_pids = lambda: [os.getpid()]
    (process,) = fake.backend(use_environment=False).read().devices[0].processes
    assert process.command == executable_name(command)


def test_fake_spec_is_warned_about_only_when_set_with_real_nvml(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test_gpumem_config")
    with caplog.at_level(logging.WARNING, logger=log.name):
        unset = GpuMem(log=log)
        assert unset.fake_spec is None  # not {}, which reads as "set"
        unset.make_backend(list)
        assert caplog.records == []
        GpuMem(log=log, fake_spec={"devices": []}).make_backend(list)
    (record,) = caplog.records
    assert "c.GpuMem.fake_spec is ignored" in record.getMessage()


def test_extend_keeps_the_history_in_time_order_and_bounded() -> None:
    sampler, fake = make(history_s=1.0)  # 4 samples
    template = fake.backend(use_environment=False).read(0.25)
    sampler.extend(dataclasses.replace(template, time=t) for t in (5.0, 1.0, 3.0, 2.0, 4.0))
    assert [s.time for s in sampler.history()] == [2.0, 3.0, 4.0, 5.0]
    latest = sampler.latest()
    assert latest is not None and latest.time == 5.0


def test_start_is_idempotent_and_stop_joins_and_closes() -> None:
    before = threads()
    sampler, fake = make()
    for _ in range(10):
        sampler.start()
    assert threads() == before + 1
    assert sampler.wait_first(5.0) is not None
    sampler.stop()
    assert sampler.thread is not None and not sampler.thread.is_alive()
    assert threads() == before
    assert not fake.initialized  # NVML shut down by the sampler thread
    sampler.start()  # a stopped sampler stays stopped
    assert threads() == before


def test_a_sample_the_caller_read_is_kept_and_the_next_read_waits_an_interval() -> None:
    backend = FakeNvml.from_spec().backend(use_environment=False)
    first = backend.read(0.25)
    sampler = Sampler(backend, interval_s=0.25)
    sampler.start(first)
    try:
        assert sampler.latest() is first and sampler.history() == [first]
        deadline = time.monotonic() + 5
        while sampler.passes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sampler.stop()
    kept = sampler.history()
    assert kept[0] is first and len(kept) >= 2
    assert kept[1].time - first.time >= 0.2


def test_history_is_bounded_and_filtered_by_since() -> None:
    sampler, _ = make(history_s=1.0)  # 4 samples at 0.25 s
    assert sampler.capacity == 4
    sampler.start()
    try:
        deadline = time.monotonic() + 10
        while sampler.passes < 7 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
    kept = sampler.history()
    assert len(kept) == 4 and sampler.passes >= 7
    assert [s.time for s in kept] == sorted(s.time for s in kept)
    assert sampler.history(since=kept[1].time) == kept[2:]
    assert sampler.latest() is kept[-1]


def test_a_failing_backend_does_not_end_the_sampler() -> None:
    class Broken:
        closed = False

        def read(self, interval_s: float = 0.0) -> Sample:
            raise RuntimeError("bug")

        def close(self) -> None:
            self.closed = True

    broken = Broken()
    sampler = Sampler(broken, interval_s=0.25)
    sampler.start()
    first = sampler.wait_first(5.0)
    assert first is not None and first.reason == Reason.INTERNAL.value
    assert sampler.thread is not None and sampler.thread.is_alive()
    sampler.stop()
    assert broken.closed
