"""One timeline per front end: the report's bundle, and how the kernel learns what the front end draws."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from jupyter_gpumem.analysis.timeline import PhaseBand, Timeline
from jupyter_gpumem.ipython import display
from jupyter_gpumem.report.record import MIME_TYPE, DeviceReport, Report

TIMELINE = Timeline(
    t_s=(0.0, 0.5, 1.0),
    allocated_bytes=(0, 3 << 20, 1 << 20),
    reserved_bytes=(2 << 20, 4 << 20, 4 << 20),
    bands=(PhaseBand(0.0, 0.5, "forward", 0), PhaseBand(0.5, 1.0, "backward", 0)),
    peak_t_s=0.5,
    peak_bytes=3 << 20,
)


def _report() -> Report:
    device = DeviceReport(
        device="cuda:0",
        index=0,
        name="GPU",
        total_bytes=1 << 30,
        allocated_before_bytes=0,
        allocated_after_bytes=1 << 20,
        allocated_delta_bytes=1 << 20,
        peak_allocated_bytes=3 << 20,
        peak_reserved_bytes=4 << 20,
        reserved_after_bytes=4 << 20,
        cache_bytes=3 << 20,
        nvml_process_bytes=None,
        non_torch_bytes=None,
        source="allocator-trace",
        timeline=TIMELINE,
    )
    return Report(
        id="r",
        name="train",
        execution_count=1,
        started_at=0.0,
        wall_s=1.0,
        status="ok",
        error=None,
        cuda_available=True,
        source="allocator-trace",
        budget_bytes=None,
        devices=(device,),
    )


class FakeComm:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.closed = False
        self.on_msg_cb: Any = None
        self.on_close_cb: Any = None

    def on_msg(self, cb: Any) -> None:
        self.on_msg_cb = cb

    def on_close(self, cb: Any) -> None:
        self.on_close_cb = cb

    def close(self) -> None:
        self.closed = True


class Shell:
    kernel = object()  # a kernel runs this shell: comms and widgets can reach a front end


@pytest.fixture
def comms(monkeypatch: pytest.MonkeyPatch) -> list[FakeComm]:
    made: list[FakeComm] = []

    def create_comm(**kwargs: Any) -> FakeComm:
        made.append(FakeComm(**kwargs))
        return made[-1]

    import comm

    monkeypatch.setattr(comm, "create_comm", create_comm)
    return made


def test_the_bundle_has_one_timeline_unless_a_widget_view_is_asked_for() -> None:
    plain = display.bundle(_report(), widget=False)
    assert set(plain) == {"text/plain", "text/html", MIME_TYPE}
    assert plain["text/html"].count("<svg") == 1
    assert plain[MIME_TYPE]["main_device"] == "cuda:0"
    assert plain[MIME_TYPE]["over_budget"] is False

    with_widget = display.bundle(_report(), widget=True)
    view = with_widget[display.WIDGET_VIEW]
    import ipywidgets as widgets

    box = widgets.widget._instances[view["model_id"]]
    html, figure = box.children
    assert "<svg" not in html.value and "train" in html.value  # the timeline is the figure's
    assert type(figure).__name__ == "VBox"  # bqplot figure and its legend


def test_our_renderer_answers_and_no_widget_is_made(comms: list[FakeComm]) -> None:
    state = display.Frontend()
    state.ask(Shell())
    (comm,) = comms
    assert comm.kwargs["target_name"] == display.COMM_TARGET
    assert state.renderer is None
    comm.on_msg_cb({"content": {"data": {"renderer": MIME_TYPE}}})
    assert state.renderer is True
    comm.on_close_cb({})
    assert state.renderer is True
    state.ask(Shell())
    assert len(comms) == 2  # asked again after the comm closed
    state.forget()
    assert comms[1].closed and state.renderer is None


def test_a_front_end_without_our_renderer_closes_the_comm(comms: list[FakeComm]) -> None:
    state = display.Frontend()
    state.ask(Shell())
    comms[0].on_close_cb({})
    assert state.renderer is False


def test_plain_ipython_asks_nothing(comms: list[FakeComm]) -> None:
    state = display.Frontend()
    state.ask(object())
    assert comms == [] and state.renderer is None


def test_show_adds_the_widget_view_only_where_our_renderer_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown: list[dict[str, Any]] = []
    monkeypatch.setattr(display, "display", lambda data, raw: shown.append(data))
    for renderer in (None, True, False):
        monkeypatch.setattr(display.FRONTEND, "renderer", renderer)
        display.show(_report(), Shell())
    assert [display.WIDGET_VIEW in data for data in shown] == [False, False, True]
    assert all(MIME_TYPE in data and "text/html" in data for data in shown)


def test_show_without_bqplot_falls_back_to_the_svg(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[dict[str, Any]] = []
    monkeypatch.setattr(display, "display", lambda data, raw: shown.append(data))
    monkeypatch.setattr(display.FRONTEND, "renderer", False)
    monkeypatch.setitem(sys.modules, "bqplot", None)  # importing it raises ImportError
    monkeypatch.delitem(sys.modules, "jupyter_gpumem.widgets.charts", raising=False)
    display.show(_report(), Shell())
    assert display.WIDGET_VIEW not in shown[0] and "<svg" in shown[0]["text/html"]
