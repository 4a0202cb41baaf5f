"""Memory-saving techniques applied to a model in place and reverted (no UI here).

Reverting a pure cast (``fp32``, ``bf16``) casts the weights back and keeps the values trained
meanwhile, at the cast's precision.

A training step with a configuration applied::

    applied = apply(model, checkpoint="blocks", precision="bf16-autocast",
                    optimizer="sgd", optimizer_obj=opt)
    with applied.autocast():
        loss = model(x).loss
    applied.backward(loss)
    applied.step()
    applied.revert()
"""

from __future__ import annotations

from jupyter_gpumem.techniques.applied import Applied, apply, apply_config
from jupyter_gpumem.techniques.checkpointing import (
    BlockGroup,
    block_groups,
    blocks,
    checkpoint_targets,
)
from jupyter_gpumem.techniques.config import (
    CHECKPOINT_HELP,
    OFFLOADS,
    OPTIMIZERS,
    PARALLELS,
    PRECISIONS,
    Config,
)

__all__ = [
    "CHECKPOINT_HELP",
    "OFFLOADS",
    "OPTIMIZERS",
    "PARALLELS",
    "PRECISIONS",
    "Applied",
    "BlockGroup",
    "Config",
    "apply",
    "apply_config",
    "block_groups",
    "blocks",
    "checkpoint_targets",
]
