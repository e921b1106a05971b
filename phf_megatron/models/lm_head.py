"""Language-model loss without [tokens, vocab] float32 tensors: chunked, vocabulary-parallel.

At Qwen3's 151,936-entry vocabulary the logits dominate memory: 4 x 1536 tokens give a 1.9 GB
bf16 logits tensor, and the usual ``logits.float()`` + log-softmax + its backward add several
3.7 GB float32 copies. Here the last stage stops at the final norm
(``final_hidden_states``) and ``lm_cross_entropy`` runs the output projection and the cross
entropy together over chunks of tokens, computing each chunk's gradients in the forward pass
(the loss is a weighted sum, so its backward is a scale). Peak extra memory: one chunk's
logits (``chunk_tokens`` x V/tp, bf16 + fp32) and a float32 gradient of the output weight.

    loss = Σ_i w_i · (logsumexp_v(z_iv) - z_{i, y_i}),   z_i = W h_i   (W: [V/tp, H] on TP rank r)

Vocabulary-parallel as Megatron's cross entropy: max, Σexp and the target logit are
all-reduced over TP. The hidden states enter through Megatron's own conjugate collectives
(sequence-parallel all-gather / reduce-scatter, or copy / all-reduce), which also sum the
TP-partial input gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import (copy_to_tensor_model_parallel_region,
                                           gather_from_sequence_parallel_region)

from phf_megatron.models import fused
from phf_megatron.models.provider import unwrap


def final_hidden_states(model, input_ids, position_ids, attention_mask=None, **kwargs) -> torch.Tensor:
    """Last pipeline stage: hidden states after the final norm, [s, b, h] ([s/tp, b, h] under SP).

    Runs ``model`` (a GPTModel, possibly wrapped) with its output layer skipped.
    """
    inner = unwrap(model)
    if not inner.post_process:
        raise ValueError("model: final_hidden_states needs the last pipeline stage (post_process=True)")
    inner.post_process = False  # GPTModel returns the decoder output when not post-processing
    try:
        return model(input_ids, position_ids, attention_mask, **kwargs)
    finally:
        inner.post_process = True


def output_weight(model) -> torch.Tensor:
    """The output projection [V/tp, H] of the last stage (the embedding when tied)."""
    inner = unwrap(model)
    if inner.share_embeddings_and_output_weights:
        return inner.shared_embedding_or_output_weight()
    return inner.output_layer.weight


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Σ_i w_i·CE(W h_i, y_i) over a TP-sharded vocabulary; gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, token_weights, tp_group, chunk_tokens, chunk_fn=None):
        # hidden [N, H], weight [V/tp, H], labels [N] (global ids), token_weights [N] fp32;
        # chunk_fn: fused single-rank (loss, grad logits) of a chunk (fused._cross_entropy_chunk)
        acc = torch.promote_types(hidden.dtype, torch.float32)  # fp32 math for bf16/fp32, fp64 stays
        v_local = weight.shape[0]
        v_start = dist.get_rank(tp_group) * v_local if tp_group is not None else 0
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start:start + chunk_tokens]
            y, w = labels[start:start + chunk_tokens], token_weights[start:start + chunk_tokens]
            if chunk_fn is not None and (tp_group is None or dist.get_world_size(tp_group) == 1):
                loss, g = chunk_fn(h @ weight.t(), y, w.to(acc))
                total += loss
                grad_hidden[start:start + chunk_tokens] = g @ weight
                grad_weight += (g.t() @ h).to(acc)
                continue
            z = (h @ weight.t()).to(acc)  # [c, V/tp]
            zmax = z.max(dim=-1).values
            _all_reduce(zmax, dist.ReduceOp.MAX, tp_group)
            z.sub_(zmax[:, None])
            local = (y >= v_start) & (y < v_start + v_local)
            idx = torch.where(local, y - v_start, torch.zeros_like(y))
            rows = torch.arange(z.shape[0], device=z.device)
            target = torch.where(local, z[rows, idx], torch.zeros_like(zmax))
            _all_reduce(target, dist.ReduceOp.SUM, tp_group)
            z.exp_()
            sumexp = z.sum(dim=-1)
            _all_reduce(sumexp, dist.ReduceOp.SUM, tp_group)
            total += (w * (sumexp.log() - target)).sum()
            # d loss / d z = w · (softmax - onehot)
            z.mul_((w / sumexp)[:, None])
            z[rows, idx] -= torch.where(local, w, torch.zeros_like(w))
            g = z.to(hidden.dtype)
            del z
            grad_hidden[start:start + chunk_tokens] = g @ weight
            grad_weight += (g.t() @ h).to(acc)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden * grad_total.to(grad_hidden.dtype), (grad_weight * grad_total).to(ctx.weight_dtype),
                None, None, None, None, None)


def _all_reduce(t: torch.Tensor, op, group) -> None:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)


def lm_cross_entropy(model, hidden: torch.Tensor, labels: torch.Tensor, loss_weights: torch.Tensor,
                     chunk_tokens: int = 2048) -> torch.Tensor:
    """Σ_{b,s} loss_weights · CE(logits, labels) from ``final_hidden_states`` output.

    Args:
        hidden: [s, b, h] ([s/tp, b, h] under sequence parallelism), after the final norm.
        labels: [b, s] global token ids (any value where ``loss_weights`` is 0).
        loss_weights: [b, s], e.g. ``mask / mask.sum()`` for the mean over valid tokens.
        chunk_tokens: tokens per chunk (peak memory ~ chunk_tokens x V/tp x 6 bytes).
    Returns a scalar, equal on every TP rank.
    """
    inner = unwrap(model)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    if inner.config.sequence_parallel:
        hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=True, group=tp_group)
    elif dist.get_world_size(tp_group) > 1:
        hidden = copy_to_tensor_model_parallel_region(hidden, group=tp_group)
    s, b, h = hidden.shape
    if labels.shape != (b, s) or loss_weights.shape != (b, s):
        raise ValueError(f"labels/loss_weights: expected shape {(b, s)}, got {tuple(labels.shape)} "
                         f"and {tuple(loss_weights.shape)}")
    return _ChunkedLinearCrossEntropy.apply(
        hidden.reshape(s * b, h), output_weight(model), labels.t().reshape(-1),
        loss_weights.t().reshape(-1).to(torch.promote_types(hidden.dtype, torch.float32)), tp_group, chunk_tokens,
        fused.cross_entropy_chunk_fn(inner.config))
