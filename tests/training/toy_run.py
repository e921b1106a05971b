"""A toy training run that draws on every state a checkpoint must carry.

Each step takes sample indices from a ``ToySampler`` (data position), draws noise from Python
``random``, NumPy and torch's global generator (RNG states), runs a model with dropout, steps an
optimizer and a Megatron LR scheduler, and updates an EMA copy of the weights. If any of these
is not saved or restored exactly, "4 steps straight" and "2 steps + save + resume + 2 steps"
part ways.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from phf_megatron.objectives.ema import ema_update


class ToySampler:
    """Shuffled epochs over ``num_rows`` indices; its position is its whole state."""

    def __init__(self, num_rows: int, seed: int):
        self.num_rows, self.seed, self.epoch, self.offset = num_rows, seed, 0, 0

    def _order(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(self.num_rows, generator=g).tolist()

    def take(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            order = self._order()
            need = count - len(out)
            out += order[self.offset:self.offset + need]
            self.offset += need
            if self.offset >= self.num_rows:
                self.epoch, self.offset = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "num_rows": self.num_rows}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]


def features(indices: list[int], dim: int) -> torch.Tensor:
    """Deterministic inputs for the sampled rows: ``[len(indices), dim]``."""
    return torch.stack([torch.randn(dim, generator=torch.Generator().manual_seed(1 + i)) for i in indices])


def noisy_batch(indices: list[int], dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs plus noise from all three global generators, and regression targets."""
    x = features(indices, dim)
    x = x + 0.1 * torch.randn_like(x) + torch.from_numpy(np.random.normal(0, 0.1, size=x.shape)).to(x.dtype)
    x = x * (1.0 + 0.05 * random.random())
    return x, x.sum(-1, keepdim=True).sin()


def ema_step(ema: dict[str, torch.Tensor], params: dict[str, torch.Tensor], decay: float) -> None:
    names = sorted(params)
    ema_update([ema[n] for n in names], [params[n].detach() for n in names], decay)
