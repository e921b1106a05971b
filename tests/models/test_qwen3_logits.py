"""Megatron Qwen3 (our spec, HF weights converted) gives HF transformers' logits.

fp32, max |Δlogit| <= 1e-4 (the issue's bound; observed ~1e-6: the same math in another
order), for GQA with head_dim ≠ hidden/heads (untied) and tied embeddings, at TP=1, TP=2 with
sequence parallelism, PP=2 and TP=2 x PP=2, all layouts in one 4-rank spawn.
"""

import torch

from .forward import megatron_logits
from .spawn import megatron_layout, run_ranks
from .tiny_qwen3 import hf_logits, tiny_hf_model

LAYOUTS = [(1, 1, False), (2, 1, True), (1, 2, False), (2, 2, True), (2, 2, False)]
TOL = 1e-4


def _check_layouts(rank, world_size, names):
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.convert.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model

    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 12))
    diffs = {}
    for name in names:
        hf = tiny_hf_model(name)
        ref = hf_logits(hf, ids)
        state, arch = hf.state_dict(), Qwen3Arch.from_hf(hf.config)
        for tp, pp, sp in LAYOUTS:
            megatron_layout(tp, pp)
            model = build_qwen3_model(hf.config, sp=sp, dtype=torch.float32)
            load_hf_weights(model, state.__getitem__, arch)
            logits = megatron_logits(model, ids)
            if logits is not None:
                diffs[(name, tp, pp, sp)] = (logits - ref).abs().max().item()
    return diffs


def test_logits_match_hf_at_every_layout():
    results = run_ranks(_check_layouts, 4, ["gqa", "tied"])
    merged = {k: v for r in results for k, v in r.items()}
    assert len(merged) == 2 * len(LAYOUTS), merged
    bad = {k: v for k, v in merged.items() if not v <= TOL}
    assert not bad, f"max |logit diff| above {TOL}: {bad}"
