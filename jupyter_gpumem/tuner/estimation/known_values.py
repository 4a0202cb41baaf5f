"""Values a step reads from fake tensors that are known without data.

Fake tensors have no values, so a read (``bool(t)``, ``.item()``) has nothing to answer from.
Some answers hold whatever the data: a tensor made by ``ones`` (``ones_like``, ``new_ones``,
``full`` of 1) holds ones, and what is viewed, cut, picked, copied, cast or joined from such
tensors holds what they hold, as does what ``all``, ``any`` or ``not`` make of them and what
compares them with a number. A ``rand`` draw lies in [0, 1): compared with a number outside
that range, every element gives the same answer (transformers' LayerDrop at probability zero
reads ``torch.rand([]) < 0.0``). A tensor written in place, through any view of its storage,
is known no more.

A read that is the condition of a check (``torch._check_tensor_all``, ``torch._assert``,
transformers' ``torch_compilable_check``: LLaVA's count of image tokens against its image
features) reads as true whatever the data: the step the estimate stands for runs only where
the check passes, and a check decides nothing else. The mode lists each such check, for the
estimate's notes. A read whose value steers the step (a branch, a shape, a count) is no check.

:func:`known_values` answers those reads. Any other read is the caller's: ``strict`` (a
training step) leaves it to the fake mode, which refuses it; otherwise (``generate`` on a
prompt without padding) it reads as false, zero.
"""

from __future__ import annotations

import functools
import itertools
import sys
import traceback
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

from jupyter_gpumem.tuner.estimation.unfakeable import source_line


@dataclass(frozen=True)
class Span:
    """Every element lies in [low, high], or [low, high) where ``open``."""

    low: float
    high: float
    open: bool = False

    @property
    def value(self) -> float | None:
        """The one value of every element, where there is one."""
        return self.low if self.low == self.high and not self.open else None


ONE, ZERO, UNIT = Span(1, 1), Span(0, 0), Span(0, 1, open=True)

_SAME = ("alias.default", "view.default", "_unsafe_view.default", "slice.Tensor", "select.int",
         "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "expand.default",
         "permute.default", "transpose.int", "t.default", "clone.default", "detach.default",
         "index.Tensor", "index_select.default", "gather.default", "repeat.default",
         "flip.default")  # fmt: skip
_CASTS = ("_to_copy.default",)
_JOINS = ("cat.default", "stack.default")
_MAKERS = {"ones.default": ONE, "ones_like.default": ONE, "new_ones.default": ONE,
           "rand.default": UNIT, "rand.generator": UNIT, "rand_like.default": UNIT}  # fmt: skip
_FULL = {"full.default": 1, "full_like.default": 1, "new_full.default": 2}  # the fill's place
_ALL = ("all.default", "all.dim", "all.dims")
_ANY = ("any.default", "any.dim", "any.dims")
_NOTS = ("logical_not.default", "bitwise_not.default")
_NUMBER = (bool, int, float)
# Functions whose reads are the conditions of checks that raise where they fail: torch's own
# (in ``torch``'s top module) by name, and a library's by its top package and name.
_TORCH_CHECKS = frozenset({"_check", "_check_with", "_check_tensor_all", "_check_tensor_all_with",
                           "_check_index", "_check_value", "_check_type", "_check_not_implemented",
                           "_assert"})  # fmt: skip
_LIBRARY_CHECKS = frozenset({("transformers", "torch_compilable_check")})
_COMPARE = {
    f"{op}.{o}": (op, o)
    for op in ("eq", "ne", "lt", "le", "gt", "ge")
    for o in ("Scalar", "Tensor")
}


def compared(span: Span, op: str, number: float) -> Span | None:
    """What ``op`` (``lt``, ``eq``, ...) against ``number`` gives every element of ``span``,
    where it gives them all one answer."""
    low, high, open_ = span.low, span.high, span.open
    below = high < number or (open_ and high <= number)  # every element < number
    at_most = high <= number
    above = low > number
    at_least = low >= number
    outside = number < low or number > high or (open_ and number >= high)
    alone = span.value == number
    true, false = {
        "lt": (below, at_least),
        "le": (at_most, above),
        "gt": (above, at_most),
        "ge": (at_least, below),
        "eq": (alone, outside),
        "ne": (outside, alone),
    }[op]
    return ONE if true else ZERO if false else None


@contextmanager
def known_values(ones: Iterable[Any] = (), *, strict: bool) -> Iterator[Any]:
    """Reads of known values answered while the context lasts; ``ones`` are all ones.

    Yields the mode: ``mode.all_ones(t)`` says whether ``t`` is known to hold only ones, and
    ``mode.checks`` says which checks were taken to pass, as notes for the estimate.
    """
    with _mode()(list(ones), strict) as mode:
        yield mode


@functools.cache
def _mode() -> type:
    """The dispatch mode class, defined on first use so that importing needs no torch."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    rules: dict[Any, tuple[str, Any]] = {}
    for kind, names in (("same", _SAME), ("cast", _CASTS), ("join", _JOINS), ("all", _ALL),
                        ("any", _ANY), ("not", _NOTS)):  # fmt: skip
        for name in names:
            _rule(aten, rules, name, (kind, None))
    for name, place in _FULL.items():
        _rule(aten, rules, name, ("full", place))
    for name, span in _MAKERS.items():
        _rule(aten, rules, name, ("make", span))
    for name, how in _COMPARE.items():
        _rule(aten, rules, name, ("compare", how))
    read = aten._local_scalar_dense.default
    device_of = torch.ops.prim.device.default

    class _Known(TorchDispatchMode):
        def __init__(self, ones: list[Any], strict: bool) -> None:
            super().__init__()
            self.strict = strict
            self.checks: list[str] = []
            # by id, as tensors compare by value: (the tensor, its span, its storage)
            self._spans: dict[int, tuple[weakref.ref[Any], Span, int | None]] = {}
            self._writes: dict[Any, tuple[tuple[int, str], ...]] = {}
            self._limit = 256
            for t in ones:
                self._add(t, ONE)

        def all_ones(self, t: Any) -> bool:
            return self._span(t) == ONE

        def _span(self, t: Any) -> Span | None:
            entry = self._spans.get(id(t)) if isinstance(t, torch.Tensor) else None
            return entry[1] if entry is not None and entry[0]() is t else None

        def _add(self, t: Any, span: Span) -> None:
            if len(self._spans) > self._limit:  # the draws and masks of steps gone by
                self._spans = {i: e for i, e in self._spans.items() if e[0]() is not None}
                self._limit = max(256, 2 * len(self._spans))
            self._spans[id(t)] = (weakref.ref(t), span, _storage(t))

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func is device_of:  # a fake tensor's device, asked from C++: no value in it
                return func(*args)
            kwargs = kwargs or {}
            if func is read:
                span = self._span(args[0])
                if span is not None and span.value is not None:
                    return _scalar(torch, span.value, args[0].dtype)
                check = checked_at(sys._getframe(1)) if args[0].dtype == torch.bool else None
                if check is not None:
                    if check not in self.checks:
                        self.checks.append(check)
                    return True
                if self.strict:
                    return func(*args, **kwargs)
                return False if args[0].dtype == torch.bool else 0
            if self._spans:
                self._forget_written(func, args, kwargs)
            out = func(*args, **kwargs)
            rule = rules.get(func)
            if rule is not None and isinstance(out, torch.Tensor):
                span = self._rule_span(rule, args, out)
                if span is not None:
                    self._add(out, span)
            return out

        def _rule_span(self, rule: tuple[str, Any], args: Any, out: Any) -> Span | None:
            kind, how = rule
            if kind == "make":
                return how
            if kind == "full":
                fill = args[how] if len(args) > how else None
                return ONE if isinstance(fill, _NUMBER) and fill == 1 else None
            if kind == "join":
                spans = {self._span(t) for t in args[0]}
                return spans.pop() if len(spans) == 1 and args[0] else None
            span = self._span(args[0])
            if span is None:
                return None
            if kind == "same":
                return span
            if kind == "compare":
                op, overload = how
                other = args[1] if overload == "Scalar" else _value_of(self._span(args[1]))
                return compared(span, op, other) if isinstance(other, _NUMBER) else None
            value = span.value
            if value is None:
                return None
            if kind == "cast":
                return span
            if kind == "not":  # a bitwise not of integers is no boolean one
                return None if out.dtype != torch.bool else ZERO if value else ONE
            empty = args[0].numel() == 0  # all of nothing is true, any of nothing false
            if kind == "all":
                return ONE if empty or value else ZERO
            return ZERO if empty or not value else ONE  # any

        def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
            written = self._writes.get(func)
            if written is None:
                written = self._writes[func] = tuple(
                    (i, a.name)
                    for i, a in enumerate(func._schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write
                )
            if not written:
                return
            storages = set()
            for i, name in written:
                given = args[i] if i < len(args) else kwargs.get(name)
                for t in given if isinstance(given, (list, tuple)) else (given,):
                    if isinstance(t, torch.Tensor):
                        storages.add(_storage(t))
            if any(e[2] in storages for e in self._spans.values()):
                self._spans = {i: e for i, e in self._spans.items() if e[2] not in storages}

    return _Known


def checked_at(frame: FrameType | None) -> str | None:
    """A note naming the check whose condition the read at ``frame`` is, if it is one.

    Outward from the read, the dispatch (this package, torch's private modules) is passed
    over; the first frame beyond it must be a check, and the line is the one that calls the
    outermost check (transformers' ``torch_compilable_check`` over ``torch._check_tensor_all``).
    A read in the step's own code (``if t.any():``) or in torch's public functions is no check.
    """
    while frame is not None and _dispatching(frame):
        frame = frame.f_back
    if frame is None or not _is_check(frame):
        return None
    while frame.f_back is not None and _is_check(frame.f_back):
        frame = frame.f_back
    caller = frame.f_back
    if caller is None:
        return None
    where = getattr(caller.f_code, "co_qualname", caller.f_code.co_name)  # Python 3.11 on
    line = source_line(_summary(caller))
    return f"the check in {where} taken to pass, as the real step needs it to: {line}"


def _module(frame: FrameType) -> list[str]:
    return str(frame.f_globals.get("__name__") or "").split(".")


def _dispatching(frame: FrameType) -> bool:
    top, *rest = _module(frame)
    return top == "jupyter_gpumem" or (top == "torch" and any(p.startswith("_") for p in rest))


def _is_check(frame: FrameType) -> bool:
    module, name = _module(frame), frame.f_code.co_name
    if module == ["torch"]:
        return name in _TORCH_CHECKS
    return (module[0], name) in _LIBRARY_CHECKS


def _summary(frame: FrameType) -> traceback.FrameSummary:
    """The frame's line, spanning the whole call it is making (Python 3.11 on)."""
    code, first, span = frame.f_code, frame.f_lineno, {}
    positions = getattr(code, "co_positions", None)
    if positions is not None and frame.f_lasti >= 0:
        at = next(itertools.islice(positions(), frame.f_lasti // 2, None), None)
        if at is not None and at[0] is not None:
            first, span = at[0], {"end_lineno": at[1]}
    return traceback.FrameSummary(code.co_filename, first, code.co_name, **span)


def _rule(aten: Any, rules: dict[Any, Any], name: str, rule: tuple[str, Any]) -> None:
    packet, overload = name.split(".")
    op = getattr(getattr(aten, packet, None), overload, None)
    if op is not None:  # an overload this torch lacks: no rule
        rules[op] = rule


def _value_of(span: Span | None) -> float | None:
    return None if span is None else span.value


def _scalar(torch: Any, value: float, dtype: Any) -> Any:
    if dtype == torch.bool:
        return bool(value)
    return float(value) if dtype.is_floating_point else int(value)


def _storage(t: Any) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without a storage of its own
        return None
