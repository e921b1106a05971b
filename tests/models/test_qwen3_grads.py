"""Gradients of the Megatron Qwen3 equal HF's, after Megatron's own DDP + finalize_model_grads.

This checks what the SP-safe RMSNorm promises (its weight gradient, partial per TP rank under
sequence parallelism, is all-reduced by Megatron) and the other gradient reductions Megatron
does (q/k-norm over TP, tied embeddings over the pipeline). Loss: Σ logits·W for a fixed random
W, through Megatron's pipeline schedule; fp32, |Δgrad| <= 1e-5 · max|grad| + 1e-6.
"""

import torch

from .spawn import megatron_layout, run_ranks
from .tiny_qwen3 import tiny_hf_model

LAYOUTS = [(2, 1, True), (1, 2, False)]


def _hf_grads(hf, ids, weight):
    hf.zero_grad()
    (hf(ids).logits * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in hf.named_parameters()}
    if hf.config.tie_word_embeddings:
        grads.pop("lm_head.weight", None)
    return grads


def _check_grads(rank, world_size, names):
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.convert.live_model import iter_hf_weights, load_hf_weights
    from phf_megatron.convert.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model

    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (2, 8), generator=gen)
    weight = torch.randn(2, 8, 256, generator=gen)
    worst = {}
    for name in names:
        hf = tiny_hf_model(name, num_layers=2)
        ref = _hf_grads(hf, ids, weight)
        arch = Qwen3Arch.from_hf(hf.config)
        for tp, pp, sp in LAYOUTS:
            megatron_layout(tp, pp)
            model = build_qwen3_model(hf.config, sp=sp, dtype=torch.float32)
            load_hf_weights(model, hf.state_dict().__getitem__, arch)
            model.config.finalize_model_grads_func = finalize_model_grads
            ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            w_shard = weight.chunk(tp, dim=-1)[tp_rank]

            def step(data_iterator, chunk):
                out = chunk(ids, torch.arange(8)[None].expand(2, -1), attention_mask=None)
                return out, lambda logits: ((logits * w_shard).sum(), {})

            ddp.zero_grad_buffer()
            get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=[ddp],
                                        num_microbatches=1, seq_length=8, micro_batch_size=2, forward_only=False)
            got = dict(iter_hf_weights(model, arch, select=lambda p: p.main_grad,
                                       pp_group=parallel_state.get_pipeline_model_parallel_group()))
            assert got.keys() == ref.keys(), (name, tp, pp, got.keys() ^ ref.keys())
            for key, grad in got.items():
                err = (grad - ref[key]).abs().max().item()
                bound = 1e-5 * ref[key].abs().max().item() + 1e-6
                assert err <= bound, (name, tp, pp, sp, key, err, bound)
                worst[(name, tp, pp)] = max(worst.get((name, tp, pp), 0.0), err)
    return worst


def test_grads_match_hf_under_tp_sp_and_pp():
    results = run_ranks(_check_grads, 2, ["gqa", "tied"])
    assert len(results[0]) == 4
