"""The SFT step on Megatron-Core and its oracle, HF transformers' causal-LM cross-entropy.

The batch is ``reference``'s student sequences (prompt ; completion, right-padded): scored on the
completion only, or on every token but the first (``sft.loss_on_prompt``). ``sft_microbatches``
cuts any DP x micro-batch layout; ``run_sft_layouts`` runs ``SftStep`` through Megatron's
schedule on each spawned rank; ``hf_sft_reference`` is the reference cross-entropy on HF Qwen3's
float64 logits and its gradient.
"""

from __future__ import annotations

import torch

from phf_megatron.parallel.layout import packed_length
from phf_megatron.parallel.sft_step import SftMicroBatch
from phf_megatron.training.microbatch_plan import token_budget_plan

from ..helpers.tiny_qwen3 import tiny_hf_model
from .harness import build_chunks, hf_grads, init_layout
from .reference import SAMPLES, SEQ_STUDENT, _pad, sample_tokens

VOCAB = 256
SEED = 0


def global_batch(with_prompt: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [B, T], scored [B, T])`` of the whole step."""
    seqs = [s for s, _ in sample_tokens(VOCAB)]
    tokens, response = _pad(seqs, [n for *_, n in SAMPLES], SEQ_STUDENT)
    if not with_prompt:
        return tokens, response
    lengths = torch.tensor([len(s) for s in seqs])
    scored = torch.arange(SEQ_STUDENT)[None] < lengths[:, None]
    scored[:, 0] = False
    return tokens, scored


def sft_microbatches(with_prompt: bool, dp_rank: int = 0, dp_size: int = 1, num_micro: int = 1, packed: bool = False,
                     pad_multiple: int = 1, max_tokens: int | None = None) -> list[SftMicroBatch]:
    """This DP rank's contiguous share in ``num_micro`` micro-batches: right-padded, or ``packed`` into one row
    each, every one to the rank's ``packed_length`` (a multiple of ``pad_multiple``). ``max_tokens`` (packed):
    the rank's micro-batches of the token-budget plan instead (``token_budget_plan``: any samples, any count)."""
    tokens, scored = global_batch(with_prompt)
    lengths = torch.tensor([len(s) for s, _ in sample_tokens(VOCAB)])
    if max_tokens is not None:
        plan = token_budget_plan(lengths.tolist(), lengths.tolist(), dp_size=dp_size, max_tokens=max_tokens,
                                 pad_multiple=pad_multiple)
        cuts = [list(mb) for mb in plan.microbatches(dp_rank)]
    else:
        per_rank = tokens.shape[0] // dp_size
        size = per_rank // num_micro
        lo = dp_rank * per_rank
        cuts = [slice(lo + k * size, lo + (k + 1) * size) for k in range(num_micro)]
    if not packed:
        return [SftMicroBatch(tokens[sl], scored[sl]) for sl in cuts]
    total = packed_length([lengths[sl] for sl in cuts], pad_multiple)
    return [SftMicroBatch.packed(tokens[sl], scored[sl], lengths[sl], pad_multiple=pad_multiple, total=total)
            for sl in cuts]


def hf_sft_reference(model, with_prompt: bool) -> dict:
    """``objectives.sft_loss`` on HF Qwen3's float64 logits of the whole batch, and the gradient of every
    parameter. (HF's own ``labels=`` loss casts the logits to float32: ``test_sft_step`` checks it
    against this one at float32 precision.)"""
    from phf_megatron.objectives.sft import sft_loss

    tokens, scored = global_batch(with_prompt)
    model.zero_grad()
    logits = model(input_ids=tokens).logits[:, :-1]
    loss = sft_loss(logits, tokens[:, 1:], scored[:, 1:])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    targets, on = tokens[:, 1:], scored[:, 1:]
    nll = -logits.detach().log_softmax(-1).gather(-1, targets[..., None])[..., 0][on]   # each scored token's -log p
    return dict(loss=float(loss.detach()), num_tokens=int(scored.sum()), grads=grads, nll_scale=float(nll.abs().sum()),
                token_nll=torch.zeros(VOCAB, dtype=torch.float64).index_add(0, targets[on], nll),
                token_count=torch.bincount(targets[on], minlength=VOCAB))


def run_sft_layouts(rank, world_size, plans):
    """``plans``: ``(layout_name, Layout, model_name)``; every layout runs with and without prompt tokens."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.parallel.sft_step import SftStep

    out = {}
    for layout_name, layout, model_name in plans:
        init_layout(layout)
        hf = tiny_hf_model(model_name, seed=SEED)
        chunks = build_chunks(hf, layout, ddp=True)
        arch = Qwen3Arch.from_hf(hf.config)
        dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        for with_prompt in (False, True):
            mbs = sft_microbatches(with_prompt, dp_rank, dp, layout.num_micro, layout.packed,
                                   layout.tp if layout.sp else 1, layout.max_tokens)
            step = SftStep(chunks[0].config, tp_group=ps.get_tensor_model_parallel_group(),
                           dp_group=ps.get_data_parallel_group())
            step.collect_loss_tokens = True
            step.prepare(mbs)
            for chunk in chunks:
                chunk.zero_grad_buffer()
            n = len(chunks)
            logs = get_forward_backward_func()(
                forward_step_func=step.student_forward_step, data_iterator=[iter(mbs) for _ in range(n)] if n > 1
                else iter(mbs), model=chunks, num_microbatches=len(mbs),
                seq_length=step.student_seq_length(mbs[0].student_tokens.shape[1]), micro_batch_size=mbs[0].batch_size)
            metrics = step.reduce_logs(logs) if ps.is_pipeline_last_stage(ignore_virtual=True) else None
            grads = hf_grads(chunks, arch)
            if ps.get_tensor_model_parallel_rank() == 0 and dp_rank == 0:
                out[(layout_name, with_prompt)] = dict(metrics=metrics, grads=grads, num_microbatches=len(mbs))
    return out
