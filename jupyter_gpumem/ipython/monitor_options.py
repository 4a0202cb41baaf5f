"""`%gpumem monitor` options, checked before the widget starts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NoReturn

from IPython.core.error import UsageError

from jupyter_gpumem.nvml.sampler import MIN_INTERVAL_S
from jupyter_gpumem.units import echoed

# The sampler waits this long between reads; longer is no live gauge (widgets.monitor agrees).
MAX_INTERVAL_S = 3600.0
INTERVAL_HELP = f"seconds between reads, from {MIN_INTERVAL_S} to {MAX_INTERVAL_S:g}"
DEVICE_HELP = "a device index (0, 1, ...)"
MONITOR_USAGE = (
    f"usage: %gpumem monitor [--interval SECONDS (>= {MIN_INTERVAL_S})] [--device N ...]\n"
    f"  --interval SECONDS  {INTERVAL_HELP} (default 1)\n"
    f"  --device N          {DEVICE_HELP}; repeat it for more (default: every device)"
)


@dataclass(frozen=True)
class MonitorOptions:
    """The gauge's refresh interval and the devices it shows (None: every device)."""

    interval_s: float = 1.0
    devices: tuple[int, ...] | None = None


def parse_monitor(words: list[str]) -> MonitorOptions:
    """``--interval S`` (once) and ``--device N`` (any number of times); a UsageError otherwise."""
    interval_s: float | None = None
    devices: list[int] = []
    it = iter(words)
    for word in it:
        if word not in ("--interval", "--device"):
            _refuse(f"the options are --interval and --device, got {echoed(word)}")
        value = next(it, None)
        if value is None:
            _refuse(
                f"{word} needs a value: {INTERVAL_HELP if word == '--interval' else DEVICE_HELP}"
            )
        if word == "--interval":
            if interval_s is not None:
                _refuse("--interval is given once")
            interval_s = _interval(value)
        else:
            devices.append(_device(value))
    return MonitorOptions(
        1.0 if interval_s is None else interval_s, tuple(dict.fromkeys(devices)) or None
    )


def _interval(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:  # NaN and infinities fail too
        _refuse(f"--interval takes {INTERVAL_HELP}, got {echoed(value)}")
    return seconds


def _device(value: str) -> int:
    digits = value.isascii() and value.isdigit() and len(value) < 10  # no sign, no "1e3"
    index = int(value) if digits else -1
    if index < 0:
        _refuse(f"--device takes {DEVICE_HELP}, got {echoed(value)}")
    return index


def _refuse(problem: str) -> NoReturn:
    raise UsageError(f"%gpumem monitor: {problem}\n{MONITOR_USAGE}")
