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
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)      # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs                      # mass of strictly better tokens
        drop_sorted = mass_before >= params.top_p                               # never drops rank 0
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] → [B] (int64)."""
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(filter_logits(logits.float(), params), dim=-1)
    return torch.cat([torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)])


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
