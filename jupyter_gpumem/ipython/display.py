"""Show a report once, in the best form the front end can draw.

A report's display carries our JSON for the jupyter_gpumem renderer (JupyterLab and
Notebook 7 with the extension), HTML with the timeline as SVG (nbconvert, GitHub, any
front end), and text. Where the front end has widgets but not our renderer, it also
carries a widget view: the report's HTML with the timeline as a bqplot figure. Each front
end picks the one it draws best, so none shows two timelines.

Whether our renderer is there is asked once per kernel: loading the extension opens a
comm to the target ``jupyter_gpumem.frontend`` (a name on the wire, kept as it was), which
our labextension registers and answers; a front end without it closes the comm. Until an answer comes (or with no front
end at all, as under nbconvert) no widget is made, so bqplot is imported only where a
widget view is shown.
"""

from __future__ import annotations

import logging
from typing import Any

from IPython.display import display

from jupyter_gpumem.report.html import render_html
from jupyter_gpumem.report.record import Report

log = logging.getLogger(__name__)

COMM_TARGET = "jupyter_gpumem.frontend"  # answered by the labextension: part of the wire format
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class Frontend:
    """What the kernel knows of its front end: ``renderer`` is True, False or None (unknown)."""

    def __init__(self) -> None:
        self.renderer: bool | None = None
        self._comm: Any = None

    def ask(self, shell: Any) -> None:
        """Open the comm our labextension answers; without a kernel (plain IPython) do nothing."""
        if self._comm is not None or getattr(shell, "kernel", None) is None:
            return
        try:
            from comm import create_comm

            self._comm = create_comm(target_name=COMM_TARGET, data={})
        except Exception:
            log.debug("jupyter_gpumem: no comm to ask the front end", exc_info=True)
            return
        self._comm.on_msg(self._answered)
        self._comm.on_close(self._closed)

    def forget(self) -> None:
        comm, self._comm = self._comm, None
        self.renderer = None
        if comm is not None:
            try:
                comm.close()
            except Exception:
                log.debug("jupyter_gpumem: closing the front-end comm failed", exc_info=True)

    def _answered(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data", {})
        self.renderer = bool(data.get("renderer"))

    def _closed(self, msg: dict[str, Any]) -> None:
        if self.renderer is None:  # closed unanswered: no target for it in this front end
            self.renderer = False
        self._comm = None


FRONTEND = Frontend()


def bundle(report: Report, *, widget: bool) -> dict[str, Any]:
    """The report's mime bundle; with ``widget``, the widget view of it too."""
    data = report._repr_mimebundle_()
    if widget and report.timeline is not None and len(report.timeline.t_s) > 1:
        view = report_widget(report)
        data[WIDGET_VIEW] = {"version_major": 2, "version_minor": 0, "model_id": view.model_id}
    return data


def report_widget(report: Report) -> Any:
    """The report's HTML with its timeline as a bqplot figure, in one widget."""
    import ipywidgets as widgets

    from jupyter_gpumem.widgets.charts import timeline_figure

    assert report.timeline is not None
    figure = timeline_figure(report.timeline, title=report.name or "")
    return widgets.VBox([widgets.HTML(render_html(report, timeline=False)), figure.widget])


def show(report: Report, shell: Any = None) -> None:
    """Display ``report`` once; the widget view only where our renderer is known to be absent."""
    widget = FRONTEND.renderer is False and getattr(shell, "kernel", None) is not None
    try:
        data = bundle(report, widget=widget)
    except Exception:  # no ipywidgets or bqplot: the HTML has the timeline already
        log.debug("jupyter_gpumem: no widget view of the report", exc_info=True)
        data = bundle(report, widget=False)
    display(data, raw=True)
