"""Full-vocabulary logits of a (TP/PP-sharded) Megatron model, through Megatron's own schedule."""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """[b, s, V/tp] shards -> [b, s, V] on every TP rank."""
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    size = dist.get_world_size(group)
    if size == 1:
        return logits
    parts = [torch.empty_like(logits) for _ in range(size)]
    dist.all_gather(parts, logits.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def megatron_logits(model, ids: torch.Tensor, packed_seq_params=None, position_ids=None):
    """Forward ``ids`` [b, s] through the pipeline; full logits [b, s, V] on the last stage, else None."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    b, s = ids.shape
    positions = torch.arange(s)[None].expand(b, -1) if position_ids is None else position_ids

    def step(data_iterator, model_chunk):
        out = model_chunk(ids, positions, attention_mask=None, packed_seq_params=packed_seq_params)

        def collect(output):
            return output.sum() * 0, {"logits": gather_vocab(output.float()).detach()}

        return out, collect

    model.eval()
    result = get_forward_backward_func()(
        forward_step_func=step, data_iterator=iter([None]), model=[model], num_microbatches=1,
        seq_length=s, micro_batch_size=b, forward_only=True)
    if not parallel_state.is_pipeline_last_stage():
        return None
    return result[0]["logits"]
