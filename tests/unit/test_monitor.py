"""The `%gpumem monitor` widget over the NVML stand-in: values update, threads stop on close."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

pytest.importorskip("bqplot")

from jupyter_gpumem.widgets.monitor import THREAD_NAME, GpuMonitor, show
from tests.support.nvml_fake import FakeNvml

GiB = 2**30
SPEC: dict[str, Any] = {
    "devices": [
        {"name": "Fake A", "memory_total_bytes": 80 * GiB, "memory_used_bytes": 8 * GiB},
        {"name": "Fake B", "memory_total_bytes": 40 * GiB, "memory_used_bytes": 0},
    ]
}


def monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def until(condition: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def make(spec: dict[str, Any] = SPEC, **kwargs: Any) -> tuple[GpuMonitor, FakeNvml]:
    fake = FakeNvml.from_spec(spec)
    return show(0.25, backend=fake.backend(use_environment=False), **kwargs), fake


def test_values_update_and_close_stops_the_thread() -> None:
    before = len(monitor_threads())
    widget, fake = make()
    try:
        a, b = widget.views
        assert a.title.value == "GPU 0: Fake A" and b.title.value == "GPU 1: Fake B"
        assert a.bar.value == pytest.approx(0.1)
        assert a.text.value.startswith("8.00 GiB / 80.0 GiB (10%)")
        assert len(monitor_threads()) == before + 1
        fake.devices[0].memory_used_bytes = 76 * GiB
        assert until(lambda: a.bar.value == pytest.approx(0.95))
        assert a.bar.bar_style == "danger"
        assert until(lambda: len(a.line.y) >= 3)
        assert a.line.y[-1] == pytest.approx(76.0)
        assert list(a.line.x) == sorted(a.line.x)
    finally:
        widget.close()
    assert widget.thread is not None and not widget.thread.is_alive()
    assert len(monitor_threads()) == before
    assert not fake.initialized  # NVML shut down by the thread on its way out


def test_device_subset_and_unknown_device() -> None:
    widget, _ = make(devices=[1])
    try:
        assert [v.index for v in widget.views] == [1]
    finally:
        widget.close()
    with pytest.raises(ValueError, match=r"no device \[5\] here; devices are \[0, 1\]"):
        make(devices=[5])


def test_unavailable_nvml_shows_the_reason_and_starts_no_thread() -> None:
    before = len(monitor_threads())
    widget, _ = make({"init_error": "driver_not_loaded", **SPEC})
    assert "NVML unavailable: driver not loaded" in widget.status.value
    assert widget.views == [] and widget.thread is None
    assert len(monitor_threads()) == before
    widget.close()


def test_interval_floor() -> None:
    with pytest.raises(ValueError, match=r"interval_s takes seconds from 0\.25 to 3600, got 0\.1$"):
        show(0.1, backend=FakeNvml.from_spec(SPEC).backend(use_environment=False))


DEVICES = "devices takes device indices (0, 1, ...), e.g. [0, 1], or None for every device"


@pytest.mark.parametrize(
    ("kwargs", "error", "said"),
    [
        ({"interval_s": 1e308}, ValueError, "interval_s takes seconds from 0.25 to 3600, got 1e+308"),
        ({"interval_s": float("nan")}, ValueError, "interval_s takes seconds from 0.25 to 3600, got nan"),
        ({"interval_s": "1"}, TypeError, "interval_s takes seconds from 0.25 to 3600, got str '1'"),
        ({"interval_s": True}, TypeError, "interval_s takes seconds from 0.25 to 3600, got bool True"),
        ({"history_s": 1e300}, ValueError, "history_s takes seconds from 1 to 86400, got 1e+300"),
        ({"history_s": 0.5}, ValueError, "history_s takes seconds from 1 to 86400, got 0.5"),
        ({"devices": [-3]}, ValueError, f"{DEVICES}; got -3 among them"),
        ({"devices": 0}, TypeError, f"{DEVICES}; got int 0"),
        ({"devices": "0"}, TypeError, f"{DEVICES}; got str '0'"),
        ({"devices": [True]}, TypeError, f"{DEVICES}; got bool True among them"),
        ({"devices": [-(10**5000)]}, ValueError, f"{DEVICES}; got <5001-digit int too long to show> among them"),
        ({"devices": ["x" * 10_000]}, TypeError, f"{DEVICES}; got str 'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx' among them"),
    ],
)  # fmt: skip
def test_wrong_arguments_say_what_is_allowed_before_nvml_starts(
    kwargs: dict[str, Any], error: type[Exception], said: str
) -> None:
    fake = FakeNvml.from_spec(SPEC)
    with pytest.raises(error) as raised:
        show(backend=fake.backend(use_environment=False), **kwargs)
    assert str(raised.value) == said
    assert not fake.initialized


def test_the_magic_and_the_widget_allow_the_same_intervals() -> None:
    from jupyter_gpumem.ipython import monitor_options
    from jupyter_gpumem.widgets import monitor

    assert monitor_options.MAX_INTERVAL_S == monitor.MAX_INTERVAL_S


def test_many_unknown_devices_are_not_all_echoed() -> None:
    with pytest.raises(ValueError) as raised:
        make(devices=range(2, 100_000))
    assert str(raised.value) == "no device [2, 3, 4, 5, 6, 7, ...] here; devices are [0, 1]"


def test_stop_is_idempotent() -> None:
    widget, _ = make()
    widget.stop()
    widget.stop()
    assert widget.thread is not None and not widget.thread.is_alive()
    widget.close()
