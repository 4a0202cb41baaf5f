"""One case per family of the model zoo on the GPU: estimated from the meta device, then measured.

The cases of ``bench/zoo.py`` at their tiny size (seconds each), the first of each family and
every ``generate`` cache: the estimate is within 2% of the measured allocated peak and 5% of
the reserved one, or it is refused with its reason (a cache that generate compiles).
``bench/model_zoo.py`` runs every case at its bench size.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import model_zoo  # noqa: E402 (bench/ on the path first)
import zoo  # noqa: E402

from jupyter_gpumem.tuner.estimation import graph_pool  # noqa: E402

SIZE = "tiny"


def _one_per_family() -> list[Any]:
    return [
        pytest.param(c, id=c.name, marks=pytest.mark.skipif(bool(why), reason=why or ""))
        for c in zoo.first_of_each_family(generate=True)
        for why in [zoo.available(c)]
    ]


@pytest.mark.parametrize("case", _one_per_family())
def test_the_zoo_case_is_estimated_as_measured(case: zoo.Case) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    found, meta = model_zoo.estimate(case, SIZE, "cuda")
    assert all(p.is_meta for p in meta.model.parameters())
    del meta
    real = case.build("cuda", SIZE)
    allocated, reserved = model_zoo.measured(case, real, SIZE)
    if found.peak_bytes is None:  # a sliding window's count, guarded on by the compiled call
        assert case.generate.get("cache_implementation") == "static", found.reason
        assert found.reason == graph_pool.RECOMPILES.format("StaticSlidingWindowLayer")
        return
    assert found.peak_reserved_bytes is not None
    assert found.peak_bytes == pytest.approx(allocated, rel=0.02), found.breakdown
    assert found.peak_reserved_bytes == pytest.approx(reserved, rel=0.05)
