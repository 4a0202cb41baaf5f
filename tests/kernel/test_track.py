"""Objects outside the namespace are found once registered with `jupyter_gpumem.track`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

import jupyter_gpumem


def test_tracked_model_parameters_are_attributed(shell: InteractiveShell) -> None:
    setup = (
        "import torch, jupyter_gpumem\n"
        "def build():\n"
        "    m = torch.nn.Linear(128, 128)\n"
        "    jupyter_gpumem.track(m, 'hidden_model')\n"
        "    return [m]\n"
        "holder = {'models': build()}  # not a top-level module: invisible without track()\n"
    )
    assert shell.run_cell(setup).success
    assert shell.run_cell("%%gpumem -o r\ny = holder['models'][0](torch.randn(4, 128))").success
    r = shell.user_ns["r"]
    assert r.breakdown["parameters"] == (128 * 128 + 128) * 4
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes


@pytest.fixture
def tracked() -> Iterator[Any]:
    """The tracked objects, none at the start or the end of the test."""
    from jupyter_gpumem.tracking import namespace

    namespace._TRACKED.clear()
    yield namespace._TRACKED
    namespace._TRACKED.clear()


def test_an_object_gone_leaves_the_others_their_labels(
    shell: InteractiveShell, tracked: Any
) -> None:
    cell = (
        "import torch, jupyter_gpumem\n"
        "a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)\n"
        "jupyter_gpumem.track(a)\n"
        "jupyter_gpumem.track(b)\n"
        "del a\n"
        "jupyter_gpumem.track(c);\n"
    )
    assert shell.run_cell(cell).success
    b, c = shell.user_ns["b"], shell.user_ns["c"]
    labels = {id(obj): label for label, obj in tracked.items()}
    assert len(tracked) == 2, labels  # b kept its label, c took a new one
    assert _number(labels[id(b)]) < _number(labels[id(c)])


def _number(label: str) -> int:
    assert label.startswith("tracked[") and label.endswith("]"), label
    return int(label[len("tracked[") : -1])


def test_a_label_chosen_by_the_user_is_not_handed_out(tracked: Any) -> None:
    import torch

    import jupyter_gpumem

    first, second = torch.ones(1), torch.ones(2)
    jupyter_gpumem.track(first)
    number = _number(next(iter(tracked)))
    jupyter_gpumem.track(first, f"tracked[{number + 1}]")
    jupyter_gpumem.track(second)
    assert sorted(tracked.items(), key=lambda kv: kv[0]) == sorted(
        [(f"tracked[{number}]", first), (f"tracked[{number + 1}]", first),
         (f"tracked[{number + 2}]", second)],
        key=lambda kv: kv[0],
    )  # fmt: skip


def test_a_name_that_is_not_a_string_is_blamed(shell: InteractiveShell, tracked: Any) -> None:
    result = shell.run_cell(
        "import torch, jupyter_gpumem\nt = torch.ones(1)\njupyter_gpumem.track(t, name=['x'])"
    )
    error = result.error_in_exec
    assert isinstance(error, TypeError), error
    assert str(error) == (
        "track() takes a name that is a string (or None for tracked[N]), got list ['x']"
    )
    assert len(tracked) == 0
    with pytest.raises(TypeError, match=r"got list \['xxxxxx.{0,40}$") as raised:
        jupyter_gpumem.track(shell.user_ns["t"], name=["x" * 100_000])  # type: ignore[arg-type]
    assert len(str(raised.value)) < 150
    with pytest.raises(TypeError, match=r"got int <5001-digit int too long to show>$"):
        jupyter_gpumem.track(shell.user_ns["t"], name=10**5000)  # type: ignore[arg-type]


def test_an_object_without_weak_references_is_refused(tracked: Any) -> None:
    with pytest.raises(TypeError) as raised:
        jupyter_gpumem.track(5)
    assert str(raised.value) == (
        "track() needs an object that supports weak references (a module, an optimizer or a "
        "tensor), got int 5"
    )
    with pytest.raises(TypeError, match="weak references"):
        jupyter_gpumem.track("x" * 100_000, name="long")
    assert len(tracked) == 0
