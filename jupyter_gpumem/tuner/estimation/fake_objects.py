"""Fakes of the user's objects for a fake run, and everything put back afterwards.

The model's parameters and buffers are swapped, in the module objects themselves, for fake
tensors of the same layout: one fake storage per real storage, so tied weights stay tied and
views stay views. The optimizer is a shallow copy over the fake parameters with no state. The
batch's tensors become fakes of the same layout. When the run ends every module attribute is put
back by identity (what the forward wrote on a module goes), and so are the random generators.

Known limitations:
- Tensors that the forward writes into objects other than the model's modules (a global
  cache, say) keep the fake values it wrote.
- Optimizers that keep references to the parameters outside ``param_groups`` and ``state``
  step the fake parameters only where they read them from ``param_groups``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from jupyter_gpumem.tuner.estimation.quantized import fake_4bit, is_4bit, ready_to_step
from jupyter_gpumem.tuner.estimation.storage_log import StorageLog, fake_class
from jupyter_gpumem.tuner.estimation.unfakeable import Unfakeable


class Faker:
    """Fake tensors laid out as real ones: one fake storage per real storage.

    With ``device``, the fakes are made there and stand for no real storage: a rank's own
    copies, in a process that does not exist yet. Tensors on the meta device (a model that
    holds no weights) are faked on ``meta_to``, where the run happens, and stand for no real
    storage either.
    """

    def __init__(
        self, torch: Any, log: StorageLog, device: Any = None, *, meta_to: Any = None
    ) -> None:
        self.torch = torch
        self.log = log
        self.device = device
        self.meta_to = meta_to
        self._bases: dict[int, Any] = {}  # real StorageImpl address -> fake uint8 storage
        self.by_id: dict[int, Any] = {}  # id(real tensor) -> its fake

    def fake(self, t: Any, category: str | None) -> Any:
        """The fake of ``t``, tagged ``category``; a 4-bit weight's carries its quant state."""
        if id(t) not in self.by_id and is_4bit(t):
            self.by_id[id(t)] = fake_4bit(self.torch, self, t)
        return self.fake_plain(t, category)

    def fake_plain(self, t: Any, category: str | None) -> Any:
        """The fake of ``t`` as a tensor of its layout, whatever its class."""
        torch = self.torch
        made = self.by_id.get(id(t))
        if made is None:
            st = t.untyped_storage()
            device = self.device
            if device is None:
                device = self.meta_to if t.is_meta and self.meta_to is not None else t.device
            base = self._bases.get(st._cdata)
            if base is None and t.storage_offset() == 0 and _extent(t) == st.nbytes():
                # the tensor spans its whole storage (nearly every parameter): one op, not three
                made = self._bases[st._cdata] = torch.empty_strided(
                    t.size(), t.stride(), dtype=t.dtype, device=device
                )
            else:
                if base is None:
                    base = torch.empty(st.nbytes(), dtype=torch.uint8, device=device)
                elif base.dtype != torch.uint8 or base.dim() != 1:
                    base = _bytes_of(torch, base)
                self._bases[st._cdata] = base
                try:
                    made = base.view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())
                except RuntimeError:  # a storage whose size is no multiple of the dtype's
                    made = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
            if isinstance(t, torch.nn.Parameter):
                made = torch.nn.Parameter(made, requires_grad=t.requires_grad)
            else:
                made = made.detach().requires_grad_(t.requires_grad)
            self.by_id[id(t)] = made
            real = st.data_ptr() if t.device.type == "cuda" and self.device is None else None
            self.log.adopt(made, real, category)
        elif category is not None:
            self.log.tag(made, category)
        return made

    def fresh(self, shape: tuple[int, ...], dtype: Any, category: str) -> Any:
        """A fake storage of its own where the run happens, standing for no real one."""
        made = self.torch.empty(shape, dtype=dtype, device=self.device or self.meta_to)
        self.log.adopt(made, None, category)
        return made

    def done(self) -> None:
        """Forget the fakes, so that a fake storage dies when the run drops it (a cast)."""
        self._bases.clear()
        self.by_id.clear()


@contextmanager
def swapped(torch: Any, model: Any, faker: Faker) -> Iterator[None]:
    """The model's parameters and buffers replaced by fakes; every module attribute put back."""
    modules = list(model.modules())
    saved = [(m, vars(m).copy(), dict(m._parameters), dict(m._buffers)) for m in modules]
    # hooks the step registers (transformers' output capturing, once per model) go with the
    # flag that says they are there: left behind, the next real call would add them twice
    hooks = [
        (d, dict(d))
        for m in modules
        for k, d in vars(m).items()
        if "hooks" in k and isinstance(d, dict)
    ]
    try:
        for m in modules:
            for name, p in list(m._parameters.items()):
                if p is not None:
                    m._parameters[name] = faker.fake(p, "parameters")
            for name, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[name] = faker.fake(b, "parameters")
        yield
    finally:
        for d, contents in hooks:
            d.clear()
            d.update(contents)
        for m, attrs, params, buffers in saved:
            m._parameters.clear()
            m._parameters.update(params)
            m._buffers.clear()
            m._buffers.update(buffers)
            now = vars(m)
            for key in [k for k in now if k not in attrs]:
                del now[key]
            for key, value in attrs.items():
                if now.get(key, _MISSING) is not value:
                    now[key] = value


_MISSING = object()


def _extent(t: Any) -> int:
    """The bytes from the start of ``t``'s first element to the end of its last."""
    if t.numel() == 0:
        return 0
    return (
        1 + sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True))
    ) * t.element_size()


def _bytes_of(torch: Any, whole: Any) -> Any:
    """A fake that spans its whole storage, as the storage's bytes (uint8, one dimension)."""
    count = whole.untyped_storage().nbytes() // whole.element_size()
    return whole.as_strided((count,), (1,), 0).view(torch.uint8)


@contextmanager
def fake_copy(torch: Any, model: Any, faker: Faker) -> Iterator[Any]:
    """A deep copy of the model over fakes of its parameters and buffers; the model untouched.

    For what changes a model for good (FSDP2 shards it, DDP registers hooks on it).
    """
    memo: dict[int, Any] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                memo[id(p)] = faker.fake(p, "parameters")
        for b in m._buffers.values():
            if b is not None:
                memo[id(b)] = faker.fake(b, "parameters")
    copied = copy.deepcopy(model, memo)
    memo.clear()  # the fakes live as long as the copy holds them
    yield copied


def fake_optimizer(torch: Any, optimizer: Any, faker: Faker) -> Any:
    """A shallow copy of ``optimizer`` over the fake parameters, with no state."""
    fake = copy.copy(optimizer)  # torch's __getstate__ keeps defaults, state and param_groups
    attrs = vars(fake)
    for key, value in vars(optimizer).items():  # a subclass's own (bitsandbytes' maps and args)
        if key not in attrs and not key.endswith("_hooks"):
            attrs[key] = value
    for key, value in list(attrs.items()):
        # an instance attribute shadowing a method (an LR scheduler's step wrapper) would
        # call the user's optimizer
        if callable(value) and hasattr(type(optimizer), key):
            del attrs[key]
        elif isinstance(value, OrderedDict) and key.endswith("_hooks"):
            attrs[key] = OrderedDict(value)
    groups = []
    for group in optimizer.param_groups:
        copied = {}
        for key, value in group.items():
            if key == "params":
                copied[key] = [faker.fake(p, "parameters") for p in value]
            elif isinstance(value, torch.Tensor):
                copied[key] = faker.fake(value, None)
            else:
                copied[key] = copy.deepcopy(value)
        groups.append(copied)
    fake.param_groups = groups
    fake.state = defaultdict(dict)
    ready_to_step(fake)
    return fake


def fake_batch(torch: Any, batch: Any, faker: Faker, *, weights_on: Any = None) -> Any:
    """The batch with its tensors faked; a meta tensor moves to the run's device only where the
    model holds no weights either. With weights on ``weights_on``, the real step fails on a
    meta tensor (two devices in one op), and so does this: :class:`Unfakeable` says why."""
    from torch.utils._pytree import tree_map

    fake_type: Any = fake_class()

    def one(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and weights_on is not None and value.is_meta:
            raise Unfakeable(
                f"the batch holds a tensor on the meta device (shape {tuple(value.shape)}) and "
                f"the model's weights are on {weights_on}: the real step fails on tensors of "
                f"two devices; make the batch on {weights_on}, or build the model on the meta "
                "device too"
            )
        if isinstance(value, torch.Tensor) and not isinstance(value, fake_type):
            return faker.fake(value, "inputs")
        if not isinstance(value, fake_type):
            return value
        if value.device.type == "meta" and faker.meta_to is not None:
            return faker.fake_plain(value, "inputs")  # make_batch(n) made it on the meta device
        faker.log.tag(value, "inputs")
        return value

    return tree_map(one, batch)


def foreach_as_real(torch: Any, optimizer: Any, real_of: Mapping[int, Any]) -> None:
    """The foreach choice the real parameters would get: fake ones never default to it."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    for group in optimizer.param_groups:
        if "foreach" not in group or group["foreach"] is not None or group.get("fused"):
            continue
        real: list[Any] = [real_of.get(id(p)) for p in group["params"]]
        if any(r is None for r in real):
            continue
        _, foreach = _default_to_fused_or_foreach(real, group.get("differentiable", False))
        group["foreach"] = foreach


def foreach_on(torch: Any, optimizer: Any, device: Any) -> None:
    """The foreach choice torch makes for parameters on ``device`` (a rank's own copies).

    torch steps with foreach kernels by default where its foreach kernels run on the device
    (CUDA), for plain tensors, parameters and DTensors alike.
    """
    from torch.optim.optimizer import _get_foreach_kernels_supported_devices

    on = device.type in _get_foreach_kernels_supported_devices()
    for group in optimizer.param_groups:
        if "foreach" not in group or group["foreach"] is not None or group.get("fused"):
            continue
        group["foreach"] = on and not group.get("differentiable", False)
