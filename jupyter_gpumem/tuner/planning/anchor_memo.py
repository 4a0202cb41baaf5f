"""A trial's search anchors, kept for its next search while the workload stays the same.

An anchor's estimate and step time depend on the model's structure, the batch's shapes, the
optimizer and the loss function, not on the budget: a second search of the same trial (another
budget, the panel's Search clicked again) takes them from here and only confirms its own
winner. Any change to what the key holds (a layer replaced, a module's settings, another batch
shape, the optimizer's hyperparameters, a redefined loss function, the trial's steps) makes new
anchors; ``clear()`` drops them by hand.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from jupyter_gpumem.techniques.config import Config
from jupyter_gpumem.tuner.estimation.estimate import Estimate
from jupyter_gpumem.tuner.workload import Workload


@dataclass(frozen=True)
class Kept:
    """One anchor: its estimate and, where it was timed, its step time or why not."""

    estimate: Estimate
    timed: bool
    step_s: float | None = None
    error: str | None = None
    primed: bool = False  # an anchor's estimate (see fake_step.run_fake), not a candidate's own
    spread_s: float | None = None  # how far its timed steps spread


@dataclass
class AnchorMemo:
    """Anchors of the workload last searched, by configuration."""

    key: str | None = None
    anchors: dict[Config, Kept] = field(default_factory=dict)

    def for_workload(self, workload: Workload, *, count_held: bool = True) -> dict[Config, Kept]:
        """The anchors kept for this workload, estimated with this ``count_held``; emptied first
        where either changed."""
        key = f"{workload_key(workload)}:{count_held}"
        if key != self.key:
            self.key, self.anchors = key, {}
        return self.anchors

    def clear(self) -> None:
        self.key, self.anchors = None, {}


def workload_key(workload: Workload) -> str:
    """A digest of what an anchor depends on: structure, shapes, optimizer, loss, steps."""
    import torch

    model = workload.model
    parts: list[str] = [repr(model), repr(getattr(model, "config", None))]
    parts += [
        f"{n}:{tuple(t.shape)}:{t.dtype}:{t.device}:{t.requires_grad}"
        for n, t in (*model.named_parameters(), *model.named_buffers())
    ]
    parts.append(repr([m.training for m in model.modules()]))
    leaves = torch.utils._pytree.tree_leaves(workload.batch)
    parts += [
        f"{tuple(x.shape)}:{x.dtype}:{x.device}" if isinstance(x, torch.Tensor) else repr(x)
        for x in leaves
    ]
    opt = workload.optimizer
    if opt is not None:
        parts.append(type(opt).__qualname__)
        parts += [
            repr(sorted((k, repr(v)) for k, v in g.items() if k != "params"))
            + f":{len(g['params'])}"
            for g in opt.param_groups
        ]
    parts += [
        f"{id(workload.loss_fn)}",
        str(workload.device),
        f"{workload.warmup}/{workload.steps}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
