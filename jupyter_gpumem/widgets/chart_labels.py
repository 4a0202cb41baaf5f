"""Short names of configurations for the tuner's charts; the table keeps the full ones.

A chart names its bars and points on one line in a margin of at most 220 px, where a label
such as ``ckpt transformer.h.0,transformer.h.1 · sgd-momentum`` would be cut at its start.
So a checkpoint of named blocks reads as their runs (``ckpt h.0-h.3``) or their count
(``ckpt 5 blocks``), a label is cut at its end, never its start, and labels that come out
alike get a number.
"""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_gpumem.techniques import Config

__all__ = ["WIDTH", "chart_label", "cut", "numbered", "short_names"]

WIDTH = 28  # characters: about 200 px at 7 px a character
ELLIPSIS = "…"
NAMES_WIDTH = 16  # a checkpoint's names longer than this read as a count


def cut(text: str, width: int = WIDTH) -> str:
    """``text``, cut at its end to ``width`` characters, the last one an ellipsis."""
    return text if len(text) <= width else text[: width - 1].rstrip() + ELLIPSIS


def _tail(name: str) -> str:
    """The last two parts of a qualified name: ``transformer.h.0`` -> ``h.0``."""
    return ".".join(name.split(".")[-2:])


def short_names(names: Sequence[str], blocks: Sequence[str]) -> str:
    """Runs of consecutive blocks by their short names: ``h.0-h.3, h.6``."""
    index = {name: i for i, name in enumerate(blocks)}
    runs: list[list[str]] = []
    for name in names:
        if runs and name in index and index.get(runs[-1][-1], -2) + 1 == index[name]:
            runs[-1].append(name)
        else:
            runs.append([name])
    return ", ".join(_tail(r[0]) if len(r) == 1 else f"{_tail(r[0])}-{_tail(r[-1])}" for r in runs)


def _checkpoint(config: Config, blocks: Sequence[str]) -> str:
    spec = config.checkpoint
    if spec == "blocks":
        text = "ckpt blocks"
    elif isinstance(spec, str):
        text = f"ckpt /{cut(spec, 12)}/"
    else:
        names = tuple(spec or ())
        runs = short_names(names, blocks)
        kind = "block" if all(n in blocks for n in names) else "module"
        many = f"{len(names)} {kind}{'s' if len(names) != 1 else ''}"
        text = f"ckpt {runs if len(runs) <= NAMES_WIDTH else many}"
    return text + (f" every {config.every}" if config.every > 1 else "")


def chart_label(config: Config, blocks: Sequence[str] = (), prefix: str = "") -> str:
    """``config`` named for a chart, at most WIDTH characters: ``ckpt h.0-h.3 · bf16``."""
    parts = [] if config.checkpoint is None else [_checkpoint(config, blocks)]
    parts += [p for p in (config.precision, config.optimizer) if p is not None]
    if config.offload is not None:
        parts.append(f"offload {config.offload}")
    if config.inference_mode:
        parts.append("inference mode")
    if config.parallel is not None:
        parts.append(f"{config.parallel} × {config.world_size}")  # noqa: RUF001  # as Config
    if config.cpu_offload:
        parts.append("state on cpu")
    return cut(prefix + (" · ".join(parts) or "baseline"))


def numbered(labels: Sequence[str]) -> list[str]:
    """``labels`` made unique for a chart's categories: the second ``sgd`` is ``sgd #2``."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else cut(label, WIDTH - 3) + f" #{seen[label]}")
    return out
