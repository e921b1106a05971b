"""Loss and gradients of the Megatron Qwen3 equal HF's, through Megatron's pipeline schedule, DDP
and finalize_model_grads.

Checks what the SP-safe RMSNorm promises (its TP-partial weight gradient under sequence
parallelism is all-reduced by Megatron) and the other reductions Megatron does (q/k norms over
TP, tied embeddings over the pipeline), and the training fast paths: the chunked
vocabulary-parallel ``lm_cross_entropy`` (uneven chunks), the compiled RMSNorm/RoPE/SwiGLU
(``fused=True``) and compiled decoder layers (``compile_layers=True``), traced with the
``aot_eager`` backend here (the same graphs inductor compiles on GPU).
Losses: Σ logits·W for a fixed random W ("dot"), or the masked mean cross entropy ("ce").
fp32; |Δ| <= 1e-5 · max|ref| + 1e-6 for every gradient, 1e-5 relative for the loss.
"""

import torch
import torch.nn.functional as F

from ..helpers.spawn import megatron_layout, run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model

B, S, V = 2, 8, 256
# (model, tp, pp, sp, loss, model options)
CASES = [
    ("gqa", 2, 1, True, "dot", {}),
    ("tied", 2, 1, True, "dot", {}),
    ("gqa", 1, 2, False, "dot", {}),
    ("tied", 1, 2, False, "dot", {}),
    ("gqa", 2, 1, True, "ce", {"fused": True}),
    ("tied", 1, 2, False, "ce", {"fused": True}),
    ("tied", 2, 1, True, "ce", {"fused": True, "compile_layers": True}),
]


def _inputs():
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, S), generator=gen)
    weight = torch.randn(B, S, V, generator=gen)
    labels = torch.randint(0, V, (B, S), generator=gen)
    mask = torch.ones(B, S)
    mask[0, 5:] = 0  # right padding
    return ids, weight, labels, mask / mask.sum()


def _hf_loss_and_grads(hf, loss_kind):
    ids, weight, labels, token_weights = _inputs()
    hf.zero_grad()
    logits = hf(ids).logits
    if loss_kind == "dot":
        loss = (logits * weight).sum()
    else:
        loss = (F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
                * token_weights.reshape(-1)).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in hf.named_parameters()}
    if hf.config.tie_word_embeddings:
        grads.pop("lm_head.weight", None)
    return loss.item(), grads


def _megatron_loss_and_grads(model, arch, loss_kind):
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.convert.live_model import iter_hf_weights
    from phf_megatron.models.lm_head import final_hidden_states, lm_cross_entropy

    ids, weight, labels, token_weights = _inputs()
    positions = torch.arange(S)[None].expand(B, -1)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    w_shard = weight.chunk(tp, dim=-1)[parallel_state.get_tensor_model_parallel_rank()]
    model.config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    last_stage = parallel_state.is_pipeline_last_stage()

    def step(data_iterator, chunk):
        if loss_kind == "dot" or not last_stage:
            out = chunk(ids, positions, attention_mask=None)
            if loss_kind == "dot":
                return out, lambda logits: ((logits * w_shard).sum(), {"loss": (logits * w_shard).sum()})
            return out, None
        hidden = final_hidden_states(chunk, ids, positions)
        loss = lm_cross_entropy(chunk, hidden, labels, token_weights, chunk_tokens=5)
        return loss, lambda out: (out, {"loss": out.detach()})

    ddp.zero_grad_buffer()
    result = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=[ddp],
                                         num_microbatches=1, seq_length=S, micro_batch_size=B, forward_only=False)
    grads = dict(iter_hf_weights(model, arch, select=lambda p: p.main_grad,
                                 pp_group=parallel_state.get_pipeline_model_parallel_group()))
    loss = result[0]["loss"].item() if last_stage else None
    if loss is not None and loss_kind == "dot" and tp > 1:  # the dot loss is per vocabulary shard
        total = torch.tensor(loss)
        torch.distributed.all_reduce(total, group=parallel_state.get_tensor_model_parallel_group())
        loss = total.item()
    return loss, grads


def _check(rank, world_size):
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model, fused

    fused.set_compile_backend("aot_eager")
    report = {}
    for name, tp, pp, sp, loss_kind, options in CASES:
        hf = tiny_hf_model(name, num_layers=2)
        ref_loss, ref = _hf_loss_and_grads(hf, loss_kind)
        arch = Qwen3Arch.from_hf(hf.config)
        megatron_layout(tp, pp)
        model = build_qwen3_model(hf.config, sp=sp, dtype=torch.float32, **options)
        load_hf_weights(model, hf.state_dict().__getitem__, arch)
        loss, got = _megatron_loss_and_grads(model, arch, loss_kind)
        case = (name, tp, pp, sp, loss_kind, tuple(options))
        assert got.keys() == ref.keys(), (case, got.keys() ^ ref.keys())
        if loss is not None:
            assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (case, loss, ref_loss)
        for key, grad in got.items():
            err = (grad - ref[key]).abs().max().item()
            bound = 1e-5 * ref[key].abs().max().item() + 1e-6
            assert err <= bound, (case, key, err, bound)
        report[case] = loss
    return report


def test_loss_and_grads_match_hf():
    results = run_ranks(_check, 2)
    assert len(results[0]) == len(CASES)
    # every case had its loss checked on some rank (the last pipeline stage)
    for case in results[0]:
        assert any(r[case] is not None for r in results), case
