"""Parse and format byte sizes and durations: the one place units are spelled.

Everything inside the package stores bytes as ``int`` and seconds as ``float``;
these functions are used only at the edges (options, text, HTML).
"""

from __future__ import annotations

import re
import reprlib

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")
SIZE_HELP = (
    "a size such as 512MiB, 16GiB, 2.5GB or 1000000 (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
)
MOST_BYTES = 2**60  # 1 EiB, more than any machine holds: sizes past it are refused


def parse_size(text: str) -> int:
    """Bytes in ``text`` ("512MiB", "2.5GB", "1024"); ValueError says what is allowed, once."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{echoed(text)} is not {SIZE_HELP}")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"{echoed(text)} must be greater than zero: give {SIZE_HELP}")
    if value > MOST_BYTES:  # infinity too, where the digits overflow a float
        raise ValueError(f"{echoed(text)} is more than 1 EiB: give {SIZE_HELP}")
    return round(value)


def format_bytes(n: int | None, *, signed: bool = False) -> str:
    """Binary units, three significant figures: ``1.50 GiB``; ``n/a`` for None."""
    if n is None:
        return "n/a"
    sign = ("+" if n > 0 else "-" if n < 0 else "±") if signed else ("-" if n < 0 else "")
    size = abs(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            digits = 2 if value < 10 else 1 if value < 100 else 0
            return f"{sign}{value:.{digits}f} {unit}"
    return f"{sign}{size} B"


def format_seconds(s: float | None) -> str:
    """``812 ms``, ``3.42 s``, ``2 min 05 s``; ``n/a`` for None."""
    if s is None:
        return "n/a"
    if s < 1:
        return f"{s * 1000:.0f} ms" if s >= 0.001 else f"{s * 1e6:.0f} µs"
    if s < 60:
        return f"{s:.2f} s"
    minutes, seconds = divmod(round(s), 60)
    return f"{minutes} min {seconds:02d} s"


ECHO_CHARS = 40  # of a value an error message quotes: a message never grows with its input
_ECHO = reprlib.Repr()  # bounds the work too: long strings and lists are cut before repr
_ECHO.maxstring = _ECHO.maxother = _ECHO.maxlong = ECHO_CHARS


def echoed(value: object) -> str:
    """``value`` as an error message quotes it: its repr, cut to 40 characters."""
    try:
        text = _ECHO.repr(value)
    except ValueError:  # an int past the 4,300 digits Python writes out, or a list of them
        digits = (
            f"{int(abs(value).bit_length() * 0.30103) + 1}-digit " if isinstance(value, int) else ""
        )
        text = f"<{digits}{type(value).__name__} too long to show>"
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 1] + "…"


def echoed_kind(value: object) -> str:
    """``value``'s type and :func:`echoed` repr, as a message says what it got."""
    return f"{type(value).__name__[:ECHO_CHARS]} {echoed(value)}"
