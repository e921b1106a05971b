"""Token sampling for the transformers fallback: temperature, top-k, top-p, per-row RNG.

Same semantics as vLLM's sampler: temperature 0 is argmax; otherwise logits / T, then top-k,
then top-p (the smallest set of most likely tokens whose mass reaches p; the most likely token
is always kept), then one draw. Each row has its own ``torch.Generator`` so a seeded request
samples the same tokens whatever else shares its batch.
"""

from __future__ import annotations

import torch

from .types import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to ``logits`` [B, V] (float32); removed entries = -inf."""
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if params.top_k_enabled and params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]          # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = _top_p_filter(logits, params.top_p)
    return logits


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep token i iff the mass of tokens strictly more likely than i is < top_p.

    Sorting a 152k vocabulary every step dominates CPU decoding, so a top-256 candidate set
    is tried first: it holds the mass for peaked (trained) models. Flat rows fall back to a
    full sort (fast on GPU).
    """
    probs = torch.softmax(logits, dim=-1)                                       # [B, V]
    k = min(256, probs.shape[-1])
    top_probs, top_idx = torch.topk(probs, k, dim=-1)                           # sorted, descending
    if not bool((top_probs.sum(-1) >= top_p).all()):
        top_probs, top_idx = torch.sort(probs, dim=-1, descending=True)
    keep_sorted = (torch.cumsum(top_probs, dim=-1) - top_probs) < top_p         # never drops rank 0
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top_idx, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] → [B] (int64), by inverse-CDF with a per-row uniform."""
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits.float(), params).double(), dim=-1)        # [B, V]
    cdf = torch.cumsum(probs, dim=-1)
    u = torch.cat([torch.rand(1, generator=g, device=probs.device, dtype=probs.dtype) for g in generators])
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    # never land on a removed (zero-probability) entry at the top edge of the cdf
    return torch.minimum(idx, (probs > 0).cumsum(-1).argmax(-1))


def row_generators(params: SamplingParams, n_rows: int, device: torch.device) -> list[torch.Generator]:
    """Generators for the n completions of one request: seeded from (seed, j) when ``params.seed``
    is set, else from torch's global RNG (so torch.manual_seed still reproduces a run)."""
    gens = []
    for j in range(n_rows):
        if params.seed is None:
            s = int(torch.randint(0, 2**62, ()).item())
        else:
            s = (params.seed * 1_000_003 + j) % 2**63
        gens.append(torch.Generator(device=device).manual_seed(s))
    return gens
