"""Trainer-side log-probabilities of a short sequence, through Megatron's own schedule.

Used to verify the rollout engine after a weight sync: both sides score the same fixed
(prompt, completion) ids and must agree (``rollout.sync.SyncProbe``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


@torch.no_grad()
def megatron_logprobs(student, prompt_ids: list[int], completion_ids: list[int]) -> list[float] | None:
    """Raw log p(completion_t | prefix) under the student (a collective); the values on every rank
    (each engine's host checks its engine against them), None if no stage computed them."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = next(p for c in student.chunks for p in c.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    seq = ids.shape[1]
    tp = ps.get_tensor_model_parallel_world_size()
    if student.config.sequence_parallel and seq % tp:
        ids = torch.cat([ids, ids.new_zeros(1, tp - seq % tp)], 1)  # right padding: causal, so harmless
    positions = torch.arange(ids.shape[1], device=device)[None]
    result = {}

    def step(data_iterator, model):
        next(data_iterator)
        output = model(input_ids=ids, position_ids=positions, attention_mask=None)

        def collect(logits):
            logits = logits[0, len(prompt_ids) - 1: seq - 1].float()  # [C, V/tp]
            parts = [torch.empty_like(logits) for _ in range(tp)]
            dist.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
            full = torch.cat(parts, -1)
            target = torch.tensor(completion_ids, device=full.device)[:, None]
            result["logprobs"] = torch.log_softmax(full, -1).gather(-1, target)[:, 0].cpu().tolist()
            return logits.new_zeros(()), {}

        return output, collect

    chunks = student.chunks
    # an interleaved pipeline runs a multiple of PP micro-batches (Megatron refuses 1): the same one PP times
    count = ps.get_pipeline_model_parallel_world_size() if len(chunks) > 1 else 1
    was_training = [c.training for c in chunks]
    for c in chunks:
        c.eval()
    try:
        get_forward_backward_func()(
            forward_step_func=step, data_iterator=[iter([None] * count) for _ in chunks] if len(chunks) > 1 else
            iter([None]), model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=count, seq_length=ids.shape[1],
            micro_batch_size=1, forward_only=True)
    finally:
        for c, mode in zip(chunks, was_training):
            c.train(mode)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result.get("logprobs"))
    return next((g for g in gathered if g is not None), None)
