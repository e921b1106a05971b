"""``L_PHF = L_OPSD + alpha * L_flow`` for one micro-batch, in Megatron's loss-function conventions.

The reference normalizes over the whole optimizer step: L_OPSD is the mean over all scored
rollout tokens, L_flow the mean over all samples with ``m_b >= 2`` (Foundation's ``opsd_loss``
and ``batch_mean``). With micro-batches and data parallelism each micro-batch only sees its own
sums, so the global counts (``StepNormalizers``, one all-reduce before the step) enter here.

Megatron (0.16 and 0.19 alike) accepts two return forms from the loss function:

* ``calculate_per_token_loss=True``: ``(loss_sum, num_tokens, logs)``. The schedule leaves the
  loss as is, DDP sums gradients over DP, and ``finalize_model_grads`` divides them by the
  global token count. We return ``S_opsd + alpha * (N_tok / N_flow) * S_flow``, so the gradient
  is that of ``S_opsd / N_tok + alpha * S_flow / N_flow`` summed over the step: the reference's.
* otherwise ``(loss, logs)``. The schedule divides by the number of micro-batches and DDP
  averages over DP, so we return ``(S_opsd / N_tok + alpha * S_flow / N_flow) * n_mb * dp``.

(The third form, ``(loss, num_tokens, logs)`` without per-token loss, divides each micro-batch
by its own token count: a mean of means, not the reference; we do not use it.)

``logs`` holds detached sums; ``reduce_logs`` turns the list the schedule returns into the
step's metrics, including the per-layer flow values of the layer-energy diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..objectives.config import ObjectiveConfig
from .batch import PhfMicroBatch, StepNormalizers
from .collectives import all_reduce_
from .vocab_parallel_jsd import DEFAULT_CHUNK_ELEMENTS, vocab_parallel_jsd


@dataclass(frozen=True)
class LossConventions:
    """How the schedule and DDP will scale what the loss function returns."""

    per_token_loss: bool
    """Megatron's ``config.calculate_per_token_loss``."""
    num_microbatches: int
    dp_size: int


def phf_microbatch_loss(
    logits: torch.Tensor,
    student_index: torch.Tensor,
    mb: PhfMicroBatch,
    flow_share: torch.Tensor | None,
    flow_values: torch.Tensor | None,
    objective: ObjectiveConfig,
    normalizers: StepNormalizers,
    conventions: LossConventions,
    tp_group: dist.ProcessGroup | None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    jsd_backend: str = "auto",
):
    """The loss function's body on the last pipeline stage.

    Args:
        logits: ``[..., V/tp]`` student logits: the scored rows ``[N, V/tp]`` (``logit_rows``), or
            Megatron's GPTModel output ``[B, Ts, V/tp]``.
        student_index: ``[N]`` long, the row of ``logits`` (flattened to ``[-1, V/tp]``) of each
            scored token.
        mb: the micro-batch; ``mb.teacher_out["logits"]`` holds the teacher's ``[N, V/tp]`` rows.
        flow_share: ``[B]`` the summed flow shares of all stages (differentiable), None if no flow.
        flow_values: ``[B, 1 + n_layers + n_pairs]`` their detached values (share, per layer, per pair).
    """
    per_token = vocab_parallel_jsd(
        logits, mb.teacher_out["logits"], student_index, objective.jsd_beta,
        objective.jsd_temperature, objective.jsd_clip, objective.jsd_clip_mode, tp_group, chunk_elements, jsd_backend,
    )
    opsd_sum = per_token.sum()
    mask = mb.flow_sample_mask.to(logits.device)
    n_tok = max(normalizers.num_tokens, 1)
    n_flow = max(normalizers.num_flow_samples, 1)
    if flow_share is not None:
        flow_sum = torch.where(mask, flow_share, torch.zeros_like(flow_share)).sum()
        loss_sum = opsd_sum + objective.flow_alpha * (n_tok / n_flow) * flow_sum
    else:
        flow_sum = torch.zeros_like(opsd_sum)
        loss_sum = opsd_sum
    logs = _logs(opsd_sum, flow_sum, mb, mask, flow_values)
    if conventions.per_token_loss:
        return loss_sum, torch.full((), mb.num_tokens, dtype=torch.int, device=logits.device), logs
    return loss_sum / n_tok * (conventions.num_microbatches * conventions.dp_size), logs


def _logs(opsd_sum, flow_sum, mb, mask, flow_values) -> dict[str, torch.Tensor]:
    dev = opsd_sum.device
    logs = {
        "opsd_sum": opsd_sum.detach().double().reshape(1),
        "num_tokens": torch.full((1,), mb.num_tokens, dtype=torch.float64, device=dev),  # no host-to-device copy
        "flow_sum": flow_sum.detach().double().reshape(1),
        "flow_samples": mask.sum().double().reshape(1),
    }
    if flow_values is not None:
        per_value = (flow_values.double() * mask[:, None]).sum(0)  # [1 + n_layers + n_pairs]
        logs["value_sums"] = per_value
    return logs


def reduce_logs(logs: list[dict[str, torch.Tensor]], objective: ObjectiveConfig, num_layers: int,
                dp_group: dist.ProcessGroup | None) -> dict[str, float | list[float]] | None:
    """Step metrics from the schedule's per-micro-batch logs (last pipeline stage; None elsewhere).

    Sums over micro-batches and data-parallel ranks (one all-reduce; every DP rank of the last
    stage must call it). ``layer_flow[j]`` is the mean over samples of the variant's local value
    of the j-th plan layer (L_HTT for phf/local), ``pair_flow[p]`` the adjacent term of pair p.
    """
    if not logs:
        return None
    keys = sorted(logs[0])
    total = torch.cat([sum(d[k] for d in logs).reshape(-1) for k in keys])
    all_reduce_(total, dp_group)
    sums, offset = {}, 0
    for k in keys:
        n = logs[0][k].numel()
        sums[k], offset = total[offset: offset + n], offset + n
    opsd = float(sums["opsd_sum"][0] / sums["num_tokens"][0].clamp(min=1))
    n_flow = sums["flow_samples"][0].clamp(min=1)
    flow = float(sums["flow_sum"][0] / n_flow)
    metrics = {"loss": opsd + objective.flow_alpha * flow if objective.uses_flow else opsd, "opsd": opsd,
               "flow": flow, "num_tokens": int(sums["num_tokens"][0]), "flow_samples": int(sums["flow_samples"][0])}
    if "value_sums" in sums:
        per = (sums["value_sums"] / n_flow).tolist()
        metrics["layer_flow"] = per[1: 1 + num_layers]
        metrics["pair_flow"] = per[1 + num_layers:]
    return metrics
