"""Megatron Qwen3 (our spec, HF weights converted) gives HF transformers' logits.

fp32, max |Δlogit| <= 1e-4 (the issue's bound; observed ~1e-6: the same math in another
order), for GQA with head_dim ≠ hidden/heads (untied) and tied embeddings, at TP=1, TP=2 with
sequence parallelism, PP=2 and TP=2 x PP=2, all layouts in one 4-rank spawn. The same spawn
checks that ``iter_hf_weights`` gives back every HF tensor bit-exactly on every rank of every
layout (TP gather + PP broadcast), and that two sequences packed into one row (qkv_format
'thd': per-sequence RoPE and block-diagonal attention) give each sequence's own HF logits.
"""

import torch

from ..helpers.forward import megatron_logits
from ..helpers.spawn import megatron_layout, run_ranks
from ..helpers.tiny_qwen3 import hf_logits, tiny_hf_model

LAYOUTS = [(1, 1, False), (2, 1, True), (1, 2, False), (2, 2, True), (2, 2, False)]
TOL = 1e-4


def _check_layouts(rank, world_size, names):
    from megatron.core import parallel_state

    from phf_megatron.convert.live_model import iter_hf_weights, load_hf_weights
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model

    from megatron.core.packed_seq_params import PackedSeqParams

    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 12))
    lengths = (5, 7)  # packed: ids[0, :5] and ids[1, :7] in one row of 12 tokens
    packed = torch.cat([ids[0, :5], ids[1, :7]])[None]
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    packing = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    diffs = {}
    for name in names:
        hf = tiny_hf_model(name)
        ref = hf_logits(hf, ids)
        packed_ref = torch.cat([hf_logits(hf, ids[i:i + 1, :n]) for i, n in enumerate(lengths)], dim=1)
        state, arch = hf.state_dict(), Qwen3Arch.from_hf(hf.config)
        for tp, pp, sp in LAYOUTS:
            megatron_layout(tp, pp)
            model = build_qwen3_model(hf.config, sp=sp, dtype=torch.float32)
            load_hf_weights(model, state.__getitem__, arch)
            logits = megatron_logits(model, ids)
            if logits is not None:
                diffs[(name, tp, pp, sp)] = (logits - ref).abs().max().item()
            logits = megatron_logits(model, packed, packed_seq_params=packing)
            if logits is not None:
                diffs[(name, tp, pp, sp, "packed")] = (logits - packed_ref).abs().max().item()
            exported = dict(iter_hf_weights(model, arch, pp_group=parallel_state.get_pipeline_model_parallel_group()))
            tied_head = {"lm_head.weight"} if arch.tie_word_embeddings else set()
            assert exported.keys() == state.keys() - tied_head, (name, tp, pp)
            for key, tensor in exported.items():
                assert torch.equal(tensor, state[key]), (key, name, tp, pp)
    return diffs


def test_logits_match_hf_at_every_layout():
    results = run_ranks(_check_layouts, 4, ["gqa", "tied"])
    merged = {k: v for r in results for k, v in r.items()}
    assert len(merged) == 2 * 2 * len(LAYOUTS), merged
    bad = {k: v for k, v in merged.items() if not v <= TOL}
    assert not bad, f"max |logit diff| above {TOL}: {bad}"
