"""The cycle collector is paused around our own work, and left as the user had it."""

from __future__ import annotations

import gc

import pytest

from jupyter_gpumem.gc_pause import paused, pausing


def test_paused_then_enabled_again_even_after_an_error() -> None:
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():  # nested: the outer pause keeps it off
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_the_user_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pausing_wraps_a_function() -> None:
    @pausing
    def state(x: int) -> tuple[int, bool]:
        """Doc kept."""
        return x, gc.isenabled()

    assert state(3) == (3, False) and gc.isenabled()
    assert state.__doc__ == "Doc kept."
