"""Run as ``TRITON_INTERPRET=1 python -m tests.parallel.jsd_triton_check OUT.json``: the Triton JSD on CPU.

Triton's interpreter executes the kernels of ``phf_megatron.parallel.jsd_triton`` on CPU
tensors (it must be switched on before Triton is imported, hence a separate process). Checked
against the reference ``objectives.opsd_token_divergence`` in float64: every beta branch and clip mode,
per-token values and the gradient of a weighted sum, single rank and the vocabulary split over
two gloo ranks (the all-reduced log-normalizers and sums; bf16 logits: the values and the gradient
apart, ``grad_*``), and in float32 the clip statistics
(divergence before the clip, entries cut: ``stats_*``, the counts exact). Writes ``{case: max
relative error}``.
"""

from __future__ import annotations

import json
import sys

import torch

from phf_megatron.objectives.opsd import clip_statistics, generalized_jsd_terms, log_probs, opsd_token_divergence
from phf_megatron.parallel.vocab_parallel_jsd import vocab_parallel_jsd

CASES = [(beta, clip, mode) for beta in (0.0, 0.5, 1.0, 0.3)
         for clip, mode in ((None, "element"), (0.02, "element"), ("median", "token"))]
VOCAB = 70  # two tiles of 64 on one rank, one partial tile per rank at TP=2


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    zs, zt = 3 * torch.randn(3, 7, VOCAB, generator=g), 3 * torch.randn(3, 7, VOCAB, generator=g)
    mask = torch.rand(3, 7, generator=g) > 0.3
    idx = mask.flatten().nonzero().flatten()
    weights = torch.linspace(0.5, 1.5, len(idx))
    return zs, zt, mask, idx, weights


def _reference(zs, zt, mask, weights, beta, clip, mode):
    """Reference values and gradient; a "median" token clip caps about half of the tokens."""
    if clip == "median":  # halfway between two middle values: no token sits on the cap
        values = opsd_token_divergence(zs.double(), zt.double(), beta, 1.1)[mask].sort().values
        clip = float(values[len(values) // 2 - 1: len(values) // 2 + 1].mean())
    full = zs.double().requires_grad_()
    ref = opsd_token_divergence(full, zt.double(), beta, 1.1, clip, mode)[mask]
    (grad,) = torch.autograd.grad((ref * weights.double()).sum(), full)
    return ref.detach(), grad, clip


def _rel(a, b):
    return float((a.detach().double() - b).abs().max() / b.abs().max())


def _stats_error(stats, zs, zt, mask, beta, clip, mode):
    """Relative error of the divergence before the clip, plus any difference in the counts cut."""
    terms = generalized_jsd_terms(log_probs(zs.double(), 1.1), log_probs(zt.double(), 1.1), beta)
    raw, cut = (x[mask] for x in clip_statistics(terms, clip, mode))
    return max(_rel(stats[0], raw), float((stats[1].double() - cut).abs().max()))


def single_rank(dtype=torch.float32) -> dict:
    errors = {}
    for k, (beta, clip, mode) in enumerate(CASES):
        zs, zt, mask, idx, w = _inputs(k)
        ref, ref_grad, clip = _reference(zs.to(dtype), zt.to(dtype), mask, w, beta, clip, mode)
        logits = zs.to(dtype).requires_grad_()
        out, stats = vocab_parallel_jsd(logits, zt.to(dtype).reshape(-1, VOCAB)[idx], idx, beta, 1.1, clip, mode,
                                        backend="triton", return_clip_stats=True)
        (grad,) = torch.autograd.grad((out * w).sum(), logits)
        name = f"{str(dtype).split('.')[-1]}_beta{beta}_{mode}{'_clip' if clip else ''}"
        if dtype == torch.float32:
            errors[name] = max(_rel(out, ref), _rel(grad, ref_grad))
        else:  # the values are float32 math on the bf16 inputs; only the bf16 gradient rounds to 8 bits
            errors[name], errors[f"grad_{name}"] = _rel(out, ref), _rel(grad, ref_grad)
        errors[f"unscored_rows_{name}"] = float(grad[~mask].abs().max())
        if dtype == torch.float32:
            errors[f"stats_{name}"] = _stats_error(stats, zs, zt, mask, beta, clip, mode)
    return errors


def two_ranks(rank, world_size) -> dict:
    from megatron.core import parallel_state as ps

    from ..helpers.spawn import megatron_layout

    megatron_layout(2, 1)
    half = VOCAB // 2
    cols = slice(half * rank, half * (rank + 1))
    errors = {}
    for k, (beta, clip, mode) in enumerate(CASES[::2]):
        zs, zt, mask, idx, w = _inputs(100 + k)
        ref, ref_grad, clip = _reference(zs, zt, mask, w, beta, clip, mode)
        shard = zs[..., cols].clone().requires_grad_()
        out, stats = vocab_parallel_jsd(shard, zt[..., cols].reshape(-1, half)[idx], idx, beta, 1.1, clip, mode,
                                        tp_group=ps.get_tensor_model_parallel_group(), backend="triton",
                                        return_clip_stats=True)
        (grad,) = torch.autograd.grad((out * w).sum(), shard)
        name = f"tp2_beta{beta}_{mode}{'_clip' if clip else ''}"
        errors[name] = max(_rel(out.detach(), ref), _rel(grad, ref_grad[..., cols]))
        errors[f"stats_{name}"] = _stats_error(stats, zs, zt, mask, beta, clip, mode)
    return errors


def main(out_path: str) -> None:
    from ..helpers.spawn import run_ranks

    errors = {**single_rank(torch.float32), **single_rank(torch.bfloat16)}
    for rank_errors in run_ranks(two_ranks, 2):
        errors.update({key: max(v, errors.get(key, 0.0)) for key, v in rank_errors.items()})
    with open(out_path, "w") as f:
        json.dump(errors, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
