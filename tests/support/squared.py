"""A model whose backward peaks where the autograd engine sums two gradients.

``(h * h).sum()``: its gradient is a view of one number, and the gradients of both factors are
new tensors, summed into ``h``'s input buffer, in place on a real GPU (``grad_sums``).
"""

from __future__ import annotations

from typing import Any

import torch


class Squared(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x: Any) -> Any:
        h = self.linear(x)
        return (h * h).sum()
