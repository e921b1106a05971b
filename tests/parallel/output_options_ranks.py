"""What each spawned rank runs for ``test_output_options_tp.py``: the output-loss options at TP=2.

* the pieces on their own, the vocabulary split 25 / 25 (float64): the global top-k JSD (on
  integer-valued logits, so the k-th value is tied across the ranks), the sampled token's
  log-probability, and the clip statistics of the eager path;
* one PHF step through Megatron's schedule (``phf_ranks.run_layouts``) per layout and option,
  collecting the loss by rollout token id.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from phf_megatron.objectives import ObjectiveConfig

from .harness import Layout, init_layout
from .phf_ranks import BASE, run_layouts

# Clips small enough to cut part of the tiny random model's divergences (~0.02-0.04 per token).
OPTIONS = {
    "top_k": ObjectiveConfig(flow_variant="phf", top_k_loss=7, **{**BASE, "jsd_clip": 0.004}),
    "top_k_wide_token_clip": ObjectiveConfig(flow_variant="phf", top_k_loss=200,
                                             **{**BASE, "jsd_clip": 0.03, "jsd_clip_mode": "token"}),
    "tinker": ObjectiveConfig(flow_variant="phf", use_tinker_loss=True, **{**BASE, "jsd_clip": None}),
    "plain": ObjectiveConfig(flow_variant="none", **{**BASE, "jsd_clip": 0.002}),
}
PLANS = [
    ("tp2_sp", Layout(tp=2, sp=True, num_micro=2), "gqa", list(OPTIONS)),
    ("pp2", Layout(pp=2, num_micro=2), "gqa", ["top_k", "tinker", "plain"]),
]


def run(rank, world_size):
    return {"collectives": collectives(rank), **run_layouts(rank, world_size, PLANS, False, OPTIONS, True)}


def collectives(rank):
    from megatron.core import parallel_state as ps

    from phf_megatron.objectives import clip_statistics, generalized_jsd_terms, opsd_token_divergence, token_log_probs
    from phf_megatron.objectives.opsd import log_probs, restrict_to_top_k
    from phf_megatron.parallel.sampled_token import vocab_parallel_token_logprob
    from phf_megatron.parallel.vocab_parallel_jsd import vocab_parallel_jsd

    init_layout(Layout(tp=2))
    group, r = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    half = slice(25 * r, 25 * (r + 1))
    g = torch.Generator().manual_seed(0)
    errors = {}
    tied_t = torch.randint(0, 4, (3, 6, 50), generator=g).double()
    smooth_t = 2 * torch.randn(3, 6, 50, generator=g, dtype=torch.float64)
    zs = 2 * torch.randn(3, 6, 50, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 6, generator=g) > 0.3
    idx = mask.flatten().nonzero().flatten()
    tokens = torch.randint(0, 50, (3, 6), generator=g)
    for name, zt in (("tied", tied_t), ("smooth", smooth_t)):
        for k, beta, clip, mode in ((1, 0.5, 0.02, "element"), (7, 0.5, 0.02, "element"), (30, 0.0, None, "element"),
                                    (50, 1.0, 0.3, "token"), (None, 0.5, 0.02, "element"), (None, 1.0, 0.3, "token")):
            full = zs.clone().requires_grad_()
            ref = opsd_token_divergence(full, zt, beta, 1.1, clip, mode, k)[mask]
            (ref_grad,) = torch.autograd.grad(ref.sum(), full)
            s, t = restrict_to_top_k(zs, zt, k) if k else (zs, zt)
            terms = generalized_jsd_terms(log_probs(s, 1.1), log_probs(t, 1.1), beta)
            ref_stats = torch.stack(clip_statistics(terms, clip, mode))[:, mask]
            shard = zs[..., half].clone().requires_grad_()
            out, stats = vocab_parallel_jsd(shard, zt[..., half].reshape(-1, 25)[idx], idx, beta, 1.1, clip, mode,
                                            tp_group=group, chunk_elements=60, top_k=k, return_clip_stats=True)
            (grad,) = torch.autograd.grad(out.sum(), shard)
            errors[f"jsd_{name}_k{k}_{mode}"] = max((out - ref).abs().max().item(),
                                                    (grad - ref_grad[..., half]).abs().max().item(),
                                                    (stats - ref_stats).abs().max().item())
    full = zs.clone().requires_grad_()
    ref = token_log_probs(full, tokens, 1.1)[mask]
    (ref_grad,) = torch.autograd.grad((ref * torch.arange(len(ref))).sum(), full)
    shard = zs[..., half].clone().requires_grad_()
    out = vocab_parallel_token_logprob(shard, idx, tokens[mask], 1.1, tp_group=group, chunk_elements=60)
    (grad,) = torch.autograd.grad((out * torch.arange(len(out))).sum(), shard)
    errors["token_logprob"] = max((out - ref).abs().max().item(), (grad - ref_grad[..., half]).abs().max().item())
    dist.barrier()
    return errors
