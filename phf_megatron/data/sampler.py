"""Deterministic, resumable epoch order over a dataset's rows.

Epoch ``e`` visits the rows in a permutation fixed by ``(seed, e)`` alone: a Fisher-Yates
shuffle driven by SplitMix64, written out here so the order never changes with a Python,
NumPy or PyTorch version. The position is ``(epoch, index)``; ``state_dict()`` /
``load_state_dict()`` carry it through a checkpoint, so a resumed run reads exactly the rows
the uninterrupted run would have read. Every rank builds the same sampler and takes the same
global batch; the trainer then splits it across data-parallel ranks.
"""

from __future__ import annotations

from typing import Any

_MASK64 = (1 << 64) - 1


def _splitmix64(state: int) -> tuple[int, int]:
    """One SplitMix64 step: ``(new_state, output)``, both 64-bit."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def epoch_permutation(num_rows: int, seed: int, epoch: int) -> list[int]:
    """The row order of ``epoch``: a permutation of ``range(num_rows)`` fixed by (seed, epoch)."""
    order = list(range(num_rows))
    state = (seed * 0x100000001B3 + epoch * 0x9E3779B1 + 1) & _MASK64
    for i in range(num_rows - 1, 0, -1):
        state, r = _splitmix64(state)
        j = r % (i + 1)  # modulo bias < i / 2**64: negligible
        order[i], order[j] = order[j], order[i]
    return order


class EpochSampler:
    """Row indices in epoch order, crossing epoch boundaries without a gap.

    Args:
        num_rows: the dataset size (> 0).
        seed: the shuffle seed.
        shuffle: False visits rows in file order every epoch.
    """

    def __init__(self, num_rows: int, seed: int = 0, shuffle: bool = True):
        if not isinstance(num_rows, int) or num_rows <= 0:
            raise ValueError(f"num_rows: must be a positive int, got {num_rows!r}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed: must be a non-negative int, got {seed!r}")
        self.num_rows, self.seed, self.shuffle = num_rows, seed, bool(shuffle)
        self.epoch, self.index = 0, 0
        self._order: list[int] | None = None

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            self._order = (epoch_permutation(self.num_rows, self.seed, self.epoch)
                           if self.shuffle else list(range(self.num_rows)))
        return self._order

    def take(self, count: int) -> list[int]:
        """The next ``count`` row indices; advances the position (into later epochs if needed)."""
        if not isinstance(count, int) or count < 0:
            raise ValueError(f"count: must be a non-negative int, got {count!r}")
        out: list[int] = []
        while len(out) < count:
            order = self._epoch_order()
            step = min(count - len(out), self.num_rows - self.index)
            out += order[self.index:self.index + step]
            self.index += step
            if self.index == self.num_rows:
                self.epoch, self.index, self._order = self.epoch + 1, 0, None
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed,
                "num_rows": self.num_rows, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict` from a sampler over the same data."""
        for key in ("epoch", "index", "seed", "num_rows", "shuffle"):
            if key not in state:
                raise ValueError(f"state: missing key {key!r}")
        for key in ("seed", "num_rows", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state[{key!r}]: checkpoint has {state[key]!r}, this sampler has "
                                 f"{getattr(self, key)!r} (a different dataset or seed)")
        epoch, index = state["epoch"], state["index"]
        if not (isinstance(epoch, int) and epoch >= 0):
            raise ValueError(f"state['epoch']: must be a non-negative int, got {epoch!r}")
        if not (isinstance(index, int) and 0 <= index < self.num_rows):
            raise ValueError(f"state['index']: must lie in [0, {self.num_rows}), got {index!r}")
        self.epoch, self.index, self._order = epoch, index, None
