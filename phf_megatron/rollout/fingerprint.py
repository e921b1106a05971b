"""Per-tensor fingerprints: what the engine loaded, checked against what the trainer pushed.

The logprob probe compares outputs, so at bf16 it needs a loose tolerance (one bf16 rounding
of a logit of 16-32 is 0.06-0.125) and then cannot tell a sync that did nothing from one that
worked: an update at lr 5e-6 moves logprobs far less than that. A fingerprint compares the
weights themselves. For a tensor T (viewed as rows x cols) and fixed random vectors u_k, v_k
(standard normal, seeded by the tensor's name):

    f_k(T) = u_k^T T v_k,  k = 1..K,        plus  ||T||_F

accumulated in float64 (no TF32, no bf16 sums), so the trainer's and the engine's values for
the same bits agree to ~1e-12 relative while any changed region moves f_k by about the norm of
the change. Both sides compute it: the trainer on each tensor as it is pushed
(``sync.sync_weights``), the engine on what it holds afterwards (``vllm_worker.
loaded_weight_fingerprints``, read back from vLLM's fused and TP-sharded parameters).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import torch

#: default number of projections per tensor
DEFAULT_PROJECTIONS = 2
#: |f_k(engine) - f_k(trainer)| allowed, relative to ||T||_F (float64 sums of identical bits agree to ~1e-12)
FINGERPRINT_RTOL = 1e-6
_CHUNK_ELEMENTS = 1 << 25


def projection_vectors(name: str, rows: int, cols: int, projections: int, seed: int):
    """The fixed (u [rows, K], v [cols, K]) of tensor ``name``: float64 on CPU, equal on every host."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    u = torch.randn(rows, projections, generator=g, dtype=torch.float64)
    v = torch.randn(cols, projections, generator=g, dtype=torch.float64)
    return u, v


@torch.no_grad()
def tensor_fingerprint(tensor: torch.Tensor, name: str, projections: int = DEFAULT_PROJECTIONS,
                       seed: int = 0) -> list[float]:
    """``[f_1, ..., f_K, ||T||_F]`` of ``tensor`` (see the module docstring), in float64 by row blocks."""
    t = tensor.detach()
    t = t.reshape(t.shape[0], -1) if t.dim() >= 2 else t.reshape(-1, 1)
    rows, cols = t.shape
    u, v = projection_vectors(name, rows, cols, projections, seed)
    u, v = u.to(t.device), v.to(t.device)
    acc = torch.zeros(projections, dtype=torch.float64, device=t.device)
    sq = torch.zeros((), dtype=torch.float64, device=t.device)
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    for r0 in range(0, rows, step):
        block = t[r0:r0 + step].to(torch.float64)
        acc += ((block @ v) * u[r0:r0 + step]).sum(0)
        sq += block.square().sum()
    return acc.tolist() + [float(sq.sqrt())]


def compare_fingerprints(expected: Mapping[str, Sequence[float]], got: Mapping[str, Sequence[float] | None],
                         rtol: float = FINGERPRINT_RTOL) -> tuple[int, float, str | None]:
    """(tensors compared, max relative deviation, first mismatching name or None).

    Names the engine cannot read back (``None``) are skipped; a name it does not report at all
    counts as a mismatch (the engine does not hold it).
    """
    checked, worst, culprit = 0, 0.0, None
    for name, exp in expected.items():
        if name not in got:
            return checked, float("inf"), name
        val = got[name]
        if val is None:
            continue
        checked += 1
        scale = max(abs(exp[-1]), 1e-30)
        dev = max(abs(a - b) for a, b in zip(val, exp)) / scale
        if dev > worst:
            worst = dev
        if dev > rtol and culprit is None:
            culprit = name
    return checked, worst, culprit
