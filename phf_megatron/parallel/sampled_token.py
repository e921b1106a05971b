"""The log-probability of the sampled token on vocabulary-sharded logits (official ``--use_tinker_loss``).

``objectives.sampled_token`` needs ``log p(y) = s_y - LSE(s)`` with ``s = z / tau`` for the
rollout token y of each scored position, student (differentiable) and teacher. Under tensor
parallelism rank r holds ``s[..., V_r]`` (ids ``[r V_r, (r+1) V_r)``), y lives on one rank:

    M      = max_r max_{v in V_r} s_v                      (all-reduce MAX)
    Z, s_y = sum_r sum_{v in V_r} exp(s_v - M),  sum_r [y in V_r] s_y     (one all-reduce of [2, c])
    log p(y) = s_y - M - log Z

Backward (no collective): ``d log p(y) / dz_v = ([v = y] - p_v) / tau`` on each rank's own
entries, with ``p_v = exp(s_v - LSE)`` from the saved ``LSE``. The tokens are walked in chunks of
``chunk_elements / V_r`` rows, as in ``vocab_parallel_jsd`` (Megatron's vocab-parallel
cross-entropy is the same computation at tau = 1, with the group taken from a global).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import all_reduce_, group_rank
from .timing import region
from .vocab_parallel_jsd import DEFAULT_CHUNK_ELEMENTS, compute_dtype, scaled, sum_exp_shifted, token_chunks


def _local_target(tokens: torch.Tensor, vocab_local: int, tp_group) -> tuple[torch.Tensor, torch.Tensor]:
    """``(column, owned)``: each token's column in this rank's shard (clamped) and whether it is here."""
    col = tokens - group_rank(tp_group) * vocab_local
    owned = (col >= 0) & (col < vocab_local)
    return col.clamp(0, vocab_local - 1), owned


class _VocabParallelTokenLogProb(torch.autograd.Function):
    """``[N]`` log p(y) from logits rows (by index) of a vocabulary shard."""

    @staticmethod
    def forward(ctx, logits, index, tokens, temperature, tp_group, chunk_elements):
        vocab_local = logits.shape[-1]
        flat = logits.reshape(-1, vocab_local)
        n = index.numel()
        out = torch.zeros(n, dtype=compute_dtype(flat), device=flat.device)
        lse = torch.zeros_like(out)
        col, owned = _local_target(tokens, vocab_local, tp_group)
        for lo, hi in token_chunks(n, vocab_local, chunk_elements):
            s = scaled(flat.index_select(0, index[lo:hi]), temperature)
            m = all_reduce_(s.max(-1).values, tp_group, dist.ReduceOp.MAX)
            picked = s.gather(-1, col[lo:hi, None]).squeeze(-1)
            z = all_reduce_(torch.stack([sum_exp_shifted(s, m), torch.where(owned[lo:hi], picked, 0.0)]), tp_group)
            lse[lo:hi] = m + z[0].log()
            out[lo:hi] = z[1] - lse[lo:hi]
        ctx.save_for_backward(logits, index, col, owned, lse)
        ctx.options = (temperature, chunk_elements)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, index, col, owned, lse = ctx.saved_tensors
        temperature, chunk_elements = ctx.options
        with region("token_logprob_bwd"):
            vocab_local = logits.shape[-1]
            flat = logits.reshape(-1, vocab_local)
            grad_flat = torch.zeros_like(flat)
            for lo, hi in token_chunks(index.numel(), vocab_local, chunk_elements):
                g = grad_out[lo:hi, None].to(lse.dtype)
                p = (scaled(flat.index_select(0, index[lo:hi]), temperature) - lse[lo:hi, None]).exp_()
                grad_rows = -p * g
                grad_rows.scatter_add_(-1, col[lo:hi, None], torch.where(owned[lo:hi, None], g, 0.0))
                grad_flat.index_copy_(0, index[lo:hi], (grad_rows / temperature).to(grad_flat.dtype))
        return grad_flat.view_as(logits), None, None, None, None, None


def vocab_parallel_token_logprob(
    logits: torch.Tensor,
    index: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    tp_group: dist.ProcessGroup | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """``log softmax(z / tau)[y]`` per scored token on vocabulary-sharded logits, differentiable.

    Equals ``objectives.sampled_token.token_log_probs`` on the gathered vocabulary.

    Args:
        logits: ``[..., V_r]`` this rank's shard (any leading layout), contiguous.
        index: ``[N]`` long, the row of each scored token in ``logits`` flattened to ``[-1, V_r]``.
        tokens: ``[N]`` long, the token y of each row (global vocabulary ids).
        temperature: tau.
        tp_group: the group the vocabulary is split over (None: not split).

    Returns:
        ``[N]`` (float32, or float64 for float64 logits), identical on every rank of ``tp_group``.
    """
    if index.dim() != 1 or index.dtype != torch.long or tokens.shape != index.shape or tokens.dtype != torch.long:
        raise ValueError(f"tokens: expected [N] long ids matching index [N] long, got {tokens.dtype} "
                         f"{tuple(tokens.shape)} and {index.dtype} {tuple(index.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    with region("token_logprob_fwd"):
        return _VocabParallelTokenLogProb.apply(logits.contiguous(), index, tokens, temperature, tp_group,
                                                chunk_elements)
