"""ipywidgets + bqplot user interfaces that run in the kernel: `monitor` (live GPU gauges)."""
