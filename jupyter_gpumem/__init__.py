"""Where your PyTorch GPU memory goes, cell by cell, in Jupyter.

This module holds only the IPython and Jupyter Server entry points. Importing it
imports neither torch nor pynvml and never initialises CUDA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jupyter_gpumem.version import __version__

__all__ = [
    "Trial",
    "__version__",
    "estimate_generate",
    "generate_map",
    "history",
    "load_ipython_extension",
    "load_reports",
    "max_generate_batch",
    "max_generate_context",
    "record",
    "set_history_limit",
    "track",
    "tune",
    "unload_ipython_extension",
]

if TYPE_CHECKING:
    import os
    from collections.abc import Iterable
    from contextlib import AbstractContextManager

    import pandas as pd
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_gpumem.report.record import Report
    from jupyter_gpumem.session import Measurement
    from jupyter_gpumem.widgets.tuner import Tuner


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """`%load_ext jupyter_gpumem`: register the `%%gpumem` magics."""
    from jupyter_gpumem.ipython import magic

    magic.load(ipython)


def unload_ipython_extension(ipython: InteractiveShell) -> None:
    """`%unload_ext jupyter_gpumem`: remove every magic and hook the extension installed."""
    from jupyter_gpumem.ipython import magic

    magic.unload(ipython)


def history() -> pd.DataFrame:
    """Every `%%gpumem` report of this kernel, one row per cell and device."""
    from jupyter_gpumem.logbook import to_dataframe

    return to_dataframe()


def set_history_limit(limit: int) -> None:
    """Keep at most ``limit`` `%%gpumem` reports in this kernel (200 by default); oldest go first."""
    from jupyter_gpumem.logbook import set_limit

    set_limit(limit)


def track(obj: Any, name: str | None = None) -> Any:
    """Make a model, optimizer or tensor that is not in the notebook's namespace known to `%%gpumem`.

    Models and optimizers in the namespace are found without this. Returns ``obj``.
    """
    from jupyter_gpumem.tracking.namespace import track as _track

    return _track(obj, name)


def record(
    path: str | os.PathLike[str] | None = None, *, name: str | None = None
) -> AbstractContextManager[Measurement]:
    """``with jupyter_gpumem.record("run.json"):`` measures a block of a script (``torchrun``).

    Each rank writes its report to its own file, ``run.rank<N>.json``; ``load_reports``
    shows them in a notebook. Under a `%%gpumem` cell the path may be left out: the files
    then go to the cell's report.
    """
    from jupyter_gpumem.session import record as _record

    return _record(path, name=name)


def load_reports(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Report:
    """The reports that ``record`` wrote as one multi-rank report (a file, glob, folder or list)."""
    from jupyter_gpumem.workers.rank_reports import load_reports as _load

    return _load(paths)


def tune(
    model: Any,
    optimizer: str = "opt",
    trial: Any = None,
    *,
    budget: str | int | None = None,
    shell: Any = None,
) -> Tuner:
    """A panel to try memory-saving techniques on ``model``; ``optimizer`` names your optimizer variable."""
    from jupyter_gpumem.widgets.tuner import tune as _tune

    return _tune(model, optimizer, trial, budget=budget, shell=shell)


def __getattr__(name: str) -> Any:
    """``Trial`` and the ``generate`` what-ifs without importing torch first."""
    if name == "Trial":
        from jupyter_gpumem.tuner.trial import Trial

        return Trial
    if name in ("estimate_generate", "max_generate_batch"):
        from jupyter_gpumem.tuner.estimation import generation

        return getattr(generation, name)
    if name in ("max_generate_context", "generate_map"):
        from jupyter_gpumem.tuner.estimation import generate_map

        return getattr(generate_map, name)
    raise AttributeError(f"module 'jupyter_gpumem' has no attribute {name!r}")


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-gpumem"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from jupyter_gpumem.server import GpuMemApp

    return [{"module": "jupyter_gpumem.server", "app": GpuMemApp}]
