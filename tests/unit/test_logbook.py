"""`%gpumem history`: a compact table of the kernel's reports, exact at a fixed layout."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from jupyter_gpumem import logbook
from jupyter_gpumem.report.record import DeviceReport, Report

MiB = 2**20
CPU = DeviceReport(
    device="cpu", index=0, name="CPU tensors", total_bytes=None, allocated_before_bytes=0,
    allocated_after_bytes=MiB, allocated_delta_bytes=MiB, peak_allocated_bytes=5945425,
    peak_reserved_bytes=5945425, reserved_after_bytes=MiB, cache_bytes=0, nvml_process_bytes=None,
    non_torch_bytes=None, source="cpu-dispatch", peak_phase="backward", peak_step=1,
)  # fmt: skip


def _report(**kw: object) -> Report:
    fields: dict[str, object] = dict(
        id="0f" * 16, name="train", execution_count=3, started_at=0.0, wall_s=0.4213, status="ok",
        error=None, cuda_available=False, source="cpu-dispatch", budget_bytes=None, devices=(CPU,),
    )  # fmt: skip
    fields.update(kw)
    return Report(**fields)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    logbook.clear()
    yield
    logbook.clear()


def test_empty_history_says_so() -> None:
    assert str(logbook.summary()) == "No %%gpumem reports in this kernel yet."
    assert "No %%gpumem reports" in logbook.summary()._repr_html_()


def test_one_short_row_per_cell_with_units() -> None:
    logbook.keep(_report())
    logbook.keep(
        _report(name=None, execution_count=4, wall_s=2.5, devices=(replace(CPU, peak_phase=None),))
    )
    assert str(logbook.summary()) == "\n".join(
        [
            "#  name       peak  reserved  peak at             wall",
            "3  train  5.67 MiB  5.67 MiB  backward, step 1  421 ms",
            "4         5.67 MiB  5.67 MiB                    2.50 s",
        ]
    )


def test_status_and_device_columns_appear_only_when_they_vary() -> None:
    logbook.keep(_report())
    gpu = replace(
        CPU, device="cuda:0", peak_allocated_bytes=3 * 2**30, peak_reserved_bytes=4 * 2**30
    )
    logbook.keep(_report(name="oom <b>", status="oom", devices=(gpu,)))
    logbook.keep(_report(name="no torch", devices=()))
    shown = logbook.summary()
    assert str(shown) == "\n".join(
        [
            "#  name      status  device      peak  reserved  peak at             wall",
            "3  train     ok      cpu     5.67 MiB  5.67 MiB  backward, step 1  421 ms",
            "3  oom <b>   oom     cuda:0  3.00 GiB  4.00 GiB  backward, step 1  421 ms",
            "3  no torch  ok                                                    421 ms",
        ]
    )
    page = shown._repr_mimebundle_()["text/html"]
    assert "oom &lt;b&gt;" in page and "<b>" not in page
    assert page.count("white-space:nowrap") == 8 * 4  # header and three rows, no cell wraps
    assert "nan" not in page.lower() and "0f0f" not in page  # no ids, no missing-value markers


def test_the_full_frame_is_still_there() -> None:
    logbook.keep(_report())
    frame = logbook.to_dataframe()
    assert len(frame.columns) == len(logbook.COLUMNS) and frame["id"][0] == "0f" * 16
