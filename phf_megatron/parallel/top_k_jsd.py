"""The OPSD divergence over the teacher's top-k entries (official ``--top_k_loss``) on vocabulary-sharded logits.

``objectives.opsd.restrict_to_top_k`` keeps, per token, the k entries ``I`` with the largest
teacher logits (ties to the lower vocabulary index) and renormalizes both distributions over
them. Tensor parallelism splits the vocabulary (rank r holds the contiguous ids ``[r V_r, (r+1) V_r)``),
so ``I`` is a global top-k:

1. each rank takes its local top-k candidates (``min(k, V_r)`` per token, same order); every
   entry of the global top-k is among its own rank's candidates (fewer than k entries beat it
   globally, so fewer than k beat it locally);
2. one all-gather of the candidates' values and global ids (``[tp, 2, N, k_r]``, float64 holds
   both exactly); the global top-k of the pool, whose columns run in ascending global id,
   uses the same tie rule, so every layout selects the same ``I``;
3. each rank writes the logits it owns at ``I`` (zeros elsewhere) and one all-reduce completes
   ``z_S[I]`` and ``z_T[I]`` (``[N, k]``) on every rank; its backward is the identity, so each
   rank's shard receives the gradient of the entries it owns (``collectives.AllReduceSum``);
4. the divergence of ``objectives.opsd`` on the ``[N, k]`` rows, identical on every rank.

Only k entries per token travel (k ≪ V). The selection walks the tokens in chunks of
``chunk_elements / V_r`` rows, so its temporaries stay bounded. There is no Triton path:
``vocab_parallel_jsd`` takes this one whenever ``top_k`` is set.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..objectives.opsd import (
    clip_statistics,
    clipped_token_divergence,
    generalized_jsd_terms,
    log_probs,
    top_k_indices,
)
from .collectives import AllReduceSum, all_gather, group_rank, group_size


def global_top_k(teacher_rows: torch.Tensor, k: int, tp_group: dist.ProcessGroup | None,
                 chunk_rows: int) -> torch.Tensor:
    """``[N, k]`` global vocabulary ids of each token's teacher top-k (see the module docstring, steps 1-2)."""
    n, vocab_local = teacher_rows.shape
    tp = group_size(tp_group)
    k_local = min(k, vocab_local)
    start = group_rank(tp_group) * vocab_local
    values = torch.empty(n, k_local, dtype=torch.float64, device=teacher_rows.device)
    ids = torch.empty(n, k_local, dtype=torch.long, device=teacher_rows.device)
    for lo in range(0, n, chunk_rows):
        rows = teacher_rows[lo: lo + chunk_rows]
        local = top_k_indices(rows, k_local)  # ascending local column
        values[lo: lo + chunk_rows] = rows.gather(-1, local).double()
        ids[lo: lo + chunk_rows] = local + start
    if tp == 1:
        return ids  # k_local == k
    pool = all_gather(torch.stack([values, ids.double()]), tp_group)  # [tp, 2, N, k_r]
    pool_values = pool[:, 0].permute(1, 0, 2).reshape(n, tp * k_local)  # rank-major: ascending global id
    pool_ids = pool[:, 1].permute(1, 0, 2).reshape(n, tp * k_local).long()
    return pool_ids.gather(-1, top_k_indices(pool_values, k))


def gather_owned(rows_source: torch.Tensor, row_index: torch.Tensor, ids: torch.Tensor,
                 tp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """``[N, k]`` = ``z[row, ids]`` over the whole vocabulary, on every rank (differentiable; step 3).

    ``rows_source``: ``[R, V_r]`` this rank's shard; ``row_index [N]``: the row of each token.
    """
    vocab_local = rows_source.shape[-1]
    if group_size(tp_group) == 1:
        return rows_source[row_index[:, None], ids]
    col = ids - group_rank(tp_group) * vocab_local
    owned = (col >= 0) & (col < vocab_local)
    part = rows_source[row_index[:, None], col.clamp(0, vocab_local - 1)]
    return AllReduceSum.apply(torch.where(owned, part, torch.zeros_like(part)), tp_group)


def top_k_jsd(student_logits: torch.Tensor, teacher_rows: torch.Tensor, student_index: torch.Tensor, k: int,
              beta: float, temperature: float, clip: float | None, clip_mode: str,
              tp_group: dist.ProcessGroup | None, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped divergence over the teacher's top-k ``[N]`` and the clip statistics ``[2, N]``.

    Arguments as ``vocab_parallel_jsd``'s. The statistics are ``objectives.opsd.clip_statistics``
    over the k entries (divergence before the clip, entries or token cut).
    """
    flat = student_logits.reshape(-1, student_logits.shape[-1])
    with torch.no_grad():
        ids = global_top_k(teacher_rows.detach(), k, tp_group, chunk_rows)
        t_k = gather_owned(teacher_rows.detach(), torch.arange(ids.shape[0], device=ids.device), ids, tp_group)
    s_k = gather_owned(flat, student_index, ids, tp_group)
    terms = generalized_jsd_terms(log_probs(s_k, temperature), log_probs(t_k, temperature), beta)
    stats = torch.stack(clip_statistics(terms.detach(), clip, clip_mode))
    return clipped_token_divergence(terms, clip, clip_mode), stats
