"""The `%%gpumem` report: its record, and its text, HTML and SVG renderings."""

from jupyter_gpumem.report.record import MIME_TYPE, DeviceReport, Report

__all__ = ["MIME_TYPE", "DeviceReport", "Report"]
