"""`%gpumem monitor` options, checked before the widget starts."""

from __future__ import annotations

import math
from dataclasses import dataclass

from IPython.core.error import UsageError

MONITOR_USAGE = "usage: %gpumem monitor [--interval SECONDS (>= 0.25)] [--device N ...]"


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
        value = next(it, None)
        try:
            if word == "--interval" and value is not None and interval_s is None:
                interval_s = float(value)
                if not math.isfinite(interval_s):
                    raise ValueError(value)
            elif word == "--device" and value is not None:
                devices.append(int(value))
            else:
                raise ValueError(word)
        except ValueError:
            raise UsageError(
                f"%gpumem monitor: bad argument {word!r} {value or ''}\n{MONITOR_USAGE}"
            ) from None
    return MonitorOptions(1.0 if interval_s is None else interval_s, tuple(devices) or None)
