"""``L_PHF = L_OPSD + alpha * L_flow`` for one micro-batch, in Megatron's loss-function conventions.

The reference normalizes over the whole optimizer step: L_OPSD is the mean over all scored
rollout tokens, L_flow the mean over all samples with ``m_b >= 2`` (``objectives.opsd_loss`` and
``objectives.flow.batch_mean``). With micro-batches and data parallelism each micro-batch only
sees its own sums, so the global counts (``StepNormalizers``, one all-reduce before the step)
enter here: the micro-batch's share of L_PHF is ``objectives.phf_objective(S_opsd / N_tok,
S_flow / N_flow)``, and the shares of all micro-batches and ranks add up to the step's L_PHF.

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
step's metrics (``LOSS``, ``LOSS_OPSD``, ``LOSS_FLOW``: the names ``metrics.jsonl`` keeps), including the per-layer flow values of the layer-energy diagnostics and the clip
diagnostics (official OPSD issues #3, #20: collapse driven by style tokens):

* ``opsd_unclipped``: the mean over tokens of the divergence before the clip;
* ``clip_frac_tokens``: the fraction of tokens the clip changed (an entry above the cap for the
  element clip, the token's sum for the token clip);
* ``clip_frac_entries``: the fraction of (token, vocabulary entry) summands above the cap
  (element clip only; over the k entries with ``top_k_loss``);
* ``loss_tokens`` (on the steps that ask for it): the rollout token ids with the largest share of
  the step's OPSD loss, ``[[id, share, count], ...]``: ``share_v = L_v / sum_t |l_t|`` with ``L_v``
  the summed loss of the tokens with id v, ranked by ``|L_v|`` (the JSD's terms are >= 0, so this
  is the plain share of the sum; the sampled-token loss has terms of either sign).

All come from tensors the loss computes anyway (``vocab_parallel_jsd``'s clip statistics, the
per-token values) and travel in the one all-reduce of ``reduce_logs``: no host sync per
micro-batch. The loss-by-token sums are ``[V]`` vectors, built only on the steps that write them.
The output loss is the clipped JSD (optionally over the teacher's top-k) or, with
``objective.use_tinker_loss``, the sampled-token loss (``objectives.sampled_token``), which has
no clip statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..objectives.config import ObjectiveConfig
from ..objectives.phf import phf_objective
from ..objectives.sampled_token import sampled_token_terms
from .batch import PhfMicroBatch, StepNormalizers
from .collectives import all_reduce_, group_size
from .sampled_token import vocab_parallel_token_logprob
from .vocab_parallel_jsd import DEFAULT_CHUNK_ELEMENTS, vocab_parallel_jsd

#: metric names of the step (``reduce_logs``; ``training.metrics`` writes them as they are)
LOSS = "loss"            # L_PHF = L_OPSD + alpha * L_flow, the optimized total
LOSS_OPSD = "loss_opsd"  # L_OPSD, the clipped JSD term (or the sampled-token loss)
LOSS_FLOW = "loss_flow"  # L_flow (before alpha)
#: metric names of the diagnostics (see the module docstring)
OPSD_UNCLIPPED = "opsd_unclipped"
CLIP_FRAC_TOKENS = "clip_frac_tokens"
CLIP_FRAC_ENTRIES = "clip_frac_entries"
LOSS_TOKENS = "loss_tokens"
TOP_LOSS_TOKENS = 20


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
    loss_tokens: bool = False,
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
        jsd_backend: a ``vocab_parallel_jsd`` backend, or the path ``PhfStep`` resolved for it.
        loss_tokens: also log the loss summed per rollout token id (``[V]``, for ``loss_tokens``).
    """
    per_token, clip_stats = output_loss_terms(logits, student_index, mb, objective, tp_group, chunk_elements,
                                              jsd_backend)
    opsd_sum = per_token.sum()
    mask = mb.flow_sample_mask.to(logits.device)
    n_tok = max(normalizers.num_tokens, 1)
    n_flow = max(normalizers.num_flow_samples, 1)
    if flow_share is not None:
        flow_sum = torch.where(mask, flow_share, torch.zeros_like(flow_share)).sum()
    else:
        flow_sum = torch.zeros_like(opsd_sum)
    share = phf_objective(opsd_sum / n_tok, flow_sum / n_flow, objective.flow_alpha)  # of the step's L_PHF
    logs = _logs(opsd_sum, flow_sum, mb, mask, flow_values)
    vocab = logits.shape[-1] * group_size(tp_group)
    if clip_stats is not None:
        entries = objective.top_k_loss or vocab
        logs.update(_clip_logs(clip_stats, mb.num_tokens * entries))
    if loss_tokens:
        logs.update(_token_logs(per_token, mb.score_tokens.to(logits.device), vocab))
    return megatron_return(share, mb.num_tokens, n_tok, conventions, logs)


def megatron_return(share: torch.Tensor, mb_tokens: int, step_tokens: int, conventions: LossConventions, logs: dict):
    """What the loss function hands Megatron for a micro-batch's ``share`` of the step's loss (module
    docstring): ``(share * N_tok, n_tok_mb, logs)`` under per-token loss, else ``(share * n_mb * dp, logs)``."""
    if conventions.per_token_loss:
        return share * step_tokens, torch.full((), mb_tokens, dtype=torch.int, device=share.device), logs
    return share * (conventions.num_microbatches * conventions.dp_size), logs


def output_loss_terms(logits, student_index, mb: PhfMicroBatch, objective: ObjectiveConfig,
                      tp_group: dist.ProcessGroup | None, chunk_elements: int, jsd_backend: str):
    """``(per_token [N], clip_stats [2, N] or None)``: the output loss of each scored token.

    The clipped JSD of ``vocab_parallel_jsd`` (over the teacher's top-k with ``top_k_loss``), or
    with ``use_tinker_loss`` the sampled-token loss ``-sg[log p_T(y) - log p_S(y)] log p_S(y)``
    (the teacher's log-probs from its kept logit rows, without gradient; no clip statistics).
    """
    teacher_rows = mb.teacher_out["logits"]
    if objective.use_tinker_loss:
        tokens = mb.score_tokens.to(logits.device)
        student_lp = vocab_parallel_token_logprob(logits, student_index, tokens, objective.jsd_temperature, tp_group,
                                                  chunk_elements)
        with torch.no_grad():
            rows = torch.arange(tokens.numel(), device=logits.device)
            teacher_lp = vocab_parallel_token_logprob(teacher_rows, rows, tokens, objective.jsd_temperature, tp_group,
                                                      chunk_elements)
        return sampled_token_terms(student_lp, teacher_lp), None
    return vocab_parallel_jsd(logits, teacher_rows, student_index, objective.jsd_beta, objective.jsd_temperature,
                              objective.jsd_clip, objective.jsd_clip_mode, tp_group, chunk_elements, jsd_backend,
                              top_k=objective.top_k_loss, return_clip_stats=True)


def _clip_logs(clip_stats: torch.Tensor, entries: int) -> dict[str, torch.Tensor]:
    """Sums of the clip statistics of one micro-batch (``entries``: tokens x vocabulary entries)."""
    raw, cut = clip_stats.double()
    return {
        "clip_raw_sum": raw.sum().reshape(1),
        "clip_cut_entries": cut.sum().reshape(1),
        "clip_cut_tokens": (cut > 0).sum().double().reshape(1),
        "clip_entries": torch.full((1,), float(entries), dtype=torch.float64, device=raw.device),
    }


def _token_logs(per_token: torch.Tensor, tokens: torch.Tensor, vocab: int) -> dict[str, torch.Tensor]:
    """The loss and the count of each rollout token id, ``[V]`` each, and ``sum_t |l_t|`` (summed over
    the micro-batch)."""
    values = per_token.detach().double()
    zeros = torch.zeros(vocab, dtype=torch.float64, device=values.device)
    return {"token_loss": zeros.index_add(0, tokens, values),
            "token_count": zeros.index_add(0, tokens, torch.ones_like(values)),
            "token_abs_loss": values.abs().sum().reshape(1)}


def top_loss_tokens(token_loss: torch.Tensor, token_count: torch.Tensor, abs_total: float,
                    top: int = TOP_LOSS_TOKENS) -> list[list[float]]:
    """``[[id, share, count], ...]``: the ``top`` token ids by ``|L_v|``, ``share = L_v / abs_total``."""
    k = min(top, int((token_count > 0).sum()))
    if k == 0:
        return []
    ids = token_loss.abs().topk(k).indices.tolist()
    denom = abs_total if abs_total != 0 else float("nan")
    return [[int(i), float(token_loss[i]) / denom, int(token_count[i])] for i in ids]


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
    of the j-th plan layer (L_layer for phf/local), ``pair_flow[p]`` the adjacent term of pair p.
    """
    if not logs:
        return None
    sums = sum_logs(logs, dp_group)
    opsd = float(sums["opsd_sum"][0] / sums["num_tokens"][0].clamp(min=1))
    n_flow = sums["flow_samples"][0].clamp(min=1)
    flow = float(sums["flow_sum"][0] / n_flow)
    metrics = {LOSS: phf_objective(opsd, flow, objective.flow_alpha) if objective.uses_flow else opsd,
               LOSS_OPSD: opsd, LOSS_FLOW: flow, "num_tokens": int(sums["num_tokens"][0]),
               "flow_samples": int(sums["flow_samples"][0])}
    if "value_sums" in sums:
        per = (sums["value_sums"] / n_flow).tolist()
        metrics["layer_flow"] = per[1: 1 + num_layers]
        metrics["pair_flow"] = per[1 + num_layers:]
    if "clip_raw_sum" in sums:
        n_tok = sums["num_tokens"][0].clamp(min=1)
        metrics[OPSD_UNCLIPPED] = float(sums["clip_raw_sum"][0] / n_tok)
        metrics[CLIP_FRAC_TOKENS] = float(sums["clip_cut_tokens"][0] / n_tok)
        if objective.jsd_clip is None or objective.jsd_clip_mode == "element":
            metrics[CLIP_FRAC_ENTRIES] = float(sums["clip_cut_entries"][0] / sums["clip_entries"][0].clamp(min=1))
    if "token_loss" in sums:
        metrics[LOSS_TOKENS] = top_loss_tokens(sums["token_loss"], sums["token_count"], float(sums["token_abs_loss"][0]))
    return metrics


def sum_logs(logs: list[dict[str, torch.Tensor]], dp_group: dist.ProcessGroup | None) -> dict[str, torch.Tensor]:
    """Each log entry summed over the micro-batches and the data-parallel ranks: one all-reduce,
    one device-to-host copy for every metric (every DP rank of the last stage must call it)."""
    keys = sorted(logs[0])
    total = torch.cat([sum(d[k] for d in logs).reshape(-1) for k in keys])
    total = all_reduce_(total, dp_group).cpu()
    sums, offset = {}, 0
    for k in keys:
        n = logs[0][k].numel()
        sums[k], offset = total[offset: offset + n], offset + n
    return sums
