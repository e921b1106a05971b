"""A packed micro-batch (``parallel.layout.SequenceLayout.pack``) through our Megatron Qwen3 gives
HF transformers' logits of each sequence run alone.

fp32, max |Δlogit| <= 1e-4 (``test_qwen3_logits``'s bound), at TP=1, TP=2 with sequence
parallelism and PP=2, on two packed rows: one whose sequences fill it exactly to the TP multiple
(no pad segment) and one with a trailing pad segment; both hold one-token and two-token
sequences (a one-token completion after a one-token prompt). The layout's own forward arguments
are used (positions restarting per sequence, ``PackedSeqParams`` with ``max_seqlen`` the longest
segment); the attention is ``models.attention.SDPACoreAttention``'s one causal SDPA call per sequence.
"""

import torch

from ..helpers.forward import megatron_logits
from ..helpers.spawn import megatron_layout, run_ranks
from ..helpers.tiny_qwen3 import hf_logits, tiny_hf_model

LAYOUTS = [(1, 1, False), (2, 1, True), (1, 2, False)]
PACKS = {"at_multiple": [1, 6, 3, 4], "pad_segment": [5, 2, 1, 1]}  # 14 tokens: no pad; 9 -> 10
TOL = 1e-4


def _rows(lengths):
    g = torch.Generator().manual_seed(sum(lengths))
    tokens = torch.randint(0, 256, (len(lengths), max(lengths)), generator=g)
    return tokens, torch.tensor(lengths)


def _check(rank, world_size):
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.models import build_qwen3_model
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.parallel.layout import SequenceLayout

    hf = tiny_hf_model("gqa")
    state, arch = hf.state_dict(), Qwen3Arch.from_hf(hf.config)
    diffs = {}
    for tp, pp, sp in LAYOUTS:
        megatron_layout(tp, pp)
        model = build_qwen3_model(hf.config, sp=sp, dtype=torch.float32)
        load_hf_weights(model, state.__getitem__, arch)
        for name, lengths in PACKS.items():
            tokens, n = _rows(lengths)
            layout = SequenceLayout.pack(tokens, n, pad_multiple=2)
            kwargs = layout.forward_kwargs()
            logits = megatron_logits(model, layout.tokens, kwargs["packed_seq_params"], kwargs["position_ids"])
            if logits is None:
                continue
            got = logits[0][: int(n.sum())]
            ref = torch.cat([hf_logits(hf, tokens[b: b + 1, :k])[0] for b, k in enumerate(lengths)])
            diffs[(tp, pp, sp, name, layout.seq_len)] = (got - ref).abs().max().item()
    return diffs


def test_packed_logits_equal_hf_on_each_sequence_alone():
    merged = {k: v for r in run_ranks(_check, 2) for k, v in r.items()}
    assert {k[:4] for k in merged} == {(*lay, name) for lay in LAYOUTS for name in PACKS}, merged
    assert {k[3:] for k in merged} == {("at_multiple", 14), ("pad_segment", 10)}
    bad = {k: v for k, v in merged.items() if not v <= TOL}
    assert not bad, f"max |logit diff| above {TOL}: {bad}"
