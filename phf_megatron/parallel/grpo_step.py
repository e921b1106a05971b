"""The GRPO baseline's micro-batch and forward-step functions for Megatron's ``forward_backward_func``.

TRL 0.26's ``GRPOTrainer`` loss (``objectives.grpo``, whose docstring derives the step objective
of each loss type) on any TP/SP/PP/VPP/DP layout. Up to three passes per update, all on the
student's model (``training.update.run_update`` drives them):

    old pass  (forward only, no grad)    mb.old_logps = log pi_old(o_t)   when grpo.needs_old_logps
    ref pass  (forward only, adapters off by the caller)  mb.ref_logps    when grpo.beta != 0
    student   (forward + backward)       the micro-batch's share of the step's GRPO objective

Every log-probability is ``log softmax(z / temperature)[o_t]`` (TRL divides the logits by the
sampling temperature) of the scored tokens only: the last stage projects the scored rows
(``logit_rows.scored_logits``) and takes the one vocabulary-parallel log-softmax
(``sampled_token.vocab_parallel_token_logprob``), as ``SftStep``. The ``[N]`` per-token values are
laid back on the micro-batch's per-SAMPLE ``[B, T]`` grid (``GrpoMicroBatch.grid_shape``: one row per
sequence, ``T`` its longest; zeros off the scored tokens) so that the transcription
(``objectives.grpo.grpo_token_loss``, ``vllm_importance_ratio``) runs unchanged, sequence-level
reductions and ``grpo``'s per-sequence token mean included (a sequence lives in one micro-batch).
Right-padded, that grid is the activation; packed (``training.packing``, ``GrpoMicroBatch.packed``:
the activation is one row ``[1, S]``, ``parallel.layout``) it is not, and the per-sample grid keeps
every per-sequence reduction per sequence.

Normalization (``step_token_weights``): each micro-batch returns its SHARE of the step objective,
with the step's counts from ``prepare`` (one all-reduce over DP), handed to Megatron by
``loss.megatron_return`` (both of its loss conventions). With ``N_seq`` the step's sequences,
``N_tok`` its completion tokens (every micro-batch, every DP rank), ``n_mb`` the micro-batches per
rank and ``P`` the data-parallel size (TRL: ``P`` processes x ``GA`` micro-batches):

* ``grpo``:    ``l_it / (|o_i| N_seq)``, each sequence's token mean averaged over the step's
  sequences; TRL's when its micro-batches hold equal numbers of completions (they always do, and
  Megatron's schedules need equal micro-batches too);
* ``dr_grpo``: ``l_it / (N_seq L_max)``, layout-free;
* ``dapo``:    ``l_it / N_tok``, layout-free (``N_tok``: TRL's ``num_items_in_batch``);
* ``bnpo``:    ``l_it / (n_tok(mb) n_mb P)``: each micro-batch's token mean, averaged over the
  step's micro-batches. LAYOUT-DEPENDENT, as in TRL: the value and gradient change with how the
  completions fall into micro-batches and ranks (equal to TRL's at ``GA = n_mb``, ``P`` = DP size).

    step = GrpoStep(model_config, cfg.grpo, temperature=1.2, max_completion_length=L, tp_group=..., dp_group=...)
    step.prepare(microbatches)
    fb(forward_step_func=step.old_forward_step, ..., forward_only=True)    # under no_grad (if needs_old_logps)
    fb(forward_step_func=step.ref_forward_step, ..., forward_only=True)    # adapters off (if beta != 0)
    logs = fb(forward_step_func=step.student_forward_step, ...)
    metrics = step.reduce_logs(logs)   # last stage: loss, num_tokens, sequences, GRPO metrics
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..objectives.config import GrpoConfig
from ..objectives.grpo import grpo_token_loss, k3_kl, log_importance_weights, vllm_importance_ratio
from .layout import SequenceLayout
from .loss import LOSS, LOSS_TOKENS, LossConventions, _token_logs, megatron_return, sum_logs, top_loss_tokens
from .sft_step import ScoredTokens, SftStep
from .step import _no_loss
from .vocab_parallel_jsd import DEFAULT_CHUNK_ELEMENTS

#: metric names of the step (``reduce_logs``), besides ``loss``, ``num_tokens``, ``sequences``
CLIP_LOW = "grpo_clip_low"          # TRL's clip_ratio/low_mean: ratio < 1 - eps with A < 0
CLIP_HIGH = "grpo_clip_high"        # clip_ratio/high_mean: ratio > 1 + eps_high with A > 0
CLIP_REGION = "grpo_clip_region"    # clip_ratio/region_mean: either
KL = "grpo_kl"                      # the token mean of k3 (beta != 0)
IS_RATIO = "grpo_is_ratio"          # mean vLLM importance ratio as applied (capped / masked)
IS_CAPPED = "grpo_is_capped"        # fraction of ratios above the cap (masked or truncated)
SAMPLER_LOGP_DIFF = "grpo_sampler_logp_diff"  # token mean |log pi_old - log pi_engine|
ADVANTAGE = "grpo_advantage"        # mean advantage over the step's sequences


@dataclass
class GrpoMicroBatch(ScoredTokens):
    """``student_tokens [b_act, S]`` (the activation, ``layout.tokens``: prompt ; completion, right-padded
    rows by default), ``scored [b_act, S]`` bool (True on the completion tokens; never a sequence's first
    token), ``advantages [B]`` float64 (one per completion, over the whole step), ``sampler_logps [b_act, S]``
    float32 (the engine's log-prob of each scored token, 0 elsewhere; None when the vLLM correction is off),
    ``layout`` (default ``SequenceLayout.pad``; ``GrpoMicroBatch.packed`` builds the packed one). ``num_items``: this micro-batch's count toward
    dapo's ``N_tok`` (TRL's ``num_items_in_batch`` counts completions before
    ``mask_truncated_completions`` drops them; None: ``num_tokens``). The passes set ``old_logps``
    and ``ref_logps`` ``[N]`` (per scored token, on the last pipeline stage); ``to`` carries them, but what a
    pass sets on a copy stays on the copy (``run_update`` moves micro-batches to the GPU: a method that
    reuses a batch's old log-probs on a later iteration keeps the objects the pass wrote)."""

    student_tokens: torch.Tensor
    scored: torch.Tensor
    advantages: torch.Tensor
    sampler_logps: torch.Tensor | None = None
    num_items: int | None = None
    old_logps: torch.Tensor | None = field(default=None, repr=False)
    ref_logps: torch.Tensor | None = field(default=None, repr=False)
    layout: SequenceLayout | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        shape = tuple(self.student_tokens.shape)
        if tuple(self.advantages.shape) != (self.num_sequences,) or self.advantages.dtype != torch.float64:
            raise ValueError(f"advantages: expected a float64 tensor of shape {(self.num_sequences,)}, got "
                             f"{self.advantages.dtype} {tuple(self.advantages.shape)}")
        if self.sampler_logps is not None and (tuple(self.sampler_logps.shape) != shape
                                               or self.sampler_logps.dtype != torch.float32):
            raise ValueError(f"sampler_logps: expected a float32 tensor of shape {shape} or None, got "
                             f"{self.sampler_logps.dtype} {tuple(self.sampler_logps.shape)}")
        self.grid_shape, self.grid_positions = _sample_grid(self.layout, self.score_index + 1)
        if self.num_items is not None and self.num_items < self.num_tokens:
            raise ValueError(f"num_items: must count at least the {self.num_tokens} scored tokens, "
                             f"got {self.num_items}")

    def to(self, device) -> "GrpoMicroBatch":
        move = (lambda t: None if t is None else t.to(device))  # noqa: E731
        return GrpoMicroBatch(self.student_tokens.to(device), self.scored.to(device), self.advantages.to(device),
                              move(self.sampler_logps), self.num_items, move(self.old_logps), move(self.ref_logps),
                              self.layout.to(device))

    @classmethod
    def packed(cls, tokens: torch.Tensor, scored: torch.Tensor, advantages: torch.Tensor, lengths: torch.Tensor,
               sampler_logps: torch.Tensor | None = None, num_items: int | None = None, *, pad_multiple: int = 1,
               pad_id: int = 0, total: int | None = None) -> "GrpoMicroBatch":
        """Right-padded per-sample ``tokens``/``scored``/``sampler_logps [B, T]`` with their ``lengths [B]``, packed
        into one row (``SequenceLayout.pack``); ``advantages [B]`` and ``num_items`` as given."""
        layout = SequenceLayout.pack(tokens, lengths, pad_multiple, pad_id, total)
        sampler = None if sampler_logps is None else layout.place(sampler_logps, 0.0)
        return cls(layout.tokens, layout.place(scored, False), advantages, sampler, num_items, layout=layout)


def _sample_grid(layout: SequenceLayout, positions: torch.Tensor) -> tuple[tuple[int, int], torch.Tensor]:
    """``((B, T), [N])``: the per-sample grid (``T`` the longest sample) and, for each activation position in
    ``positions`` (flat ``column S + start + t``), its flat ``b T + t`` on that grid (the identity when padded)."""
    dev = layout.tokens.device
    t = int(layout.lengths.max())
    keep = torch.arange(t, device=dev)[None] < layout.lengths[:, None]
    sample, pos = keep.nonzero(as_tuple=True)
    inverse = torch.full((layout.tokens.numel(),), -1, dtype=torch.long, device=dev)
    inverse[layout.flat_index(sample, pos)] = sample * t + pos
    return (layout.num_sequences, t), inverse[positions.to(dev)]


@dataclass(frozen=True)
class GrpoCounts:
    """The step's counts over every micro-batch and DP rank (``GrpoStep.prepare``)."""

    num_tokens: int
    """Scored completion tokens (Megatron's per-token divisor)."""
    num_sequences: int
    num_items: int
    """dapo's ``N_tok`` (``GrpoMicroBatch.num_items``; = ``num_tokens`` unless the method says otherwise)."""


def step_token_weights(mask: torch.Tensor, loss_type: str, counts: GrpoCounts, conventions: LossConventions,
                       max_completion_length: int) -> torch.Tensor:
    """``w [B, T]``: a micro-batch's weights in the STEP objective ``sum_mb sum_it w_it l_it`` (module
    docstring): TRL's ``objectives.grpo.token_weights`` with the step's counts, divided by ``P``."""
    m = mask.to(torch.float32)
    if loss_type == "grpo":
        return m / (m.sum(-1, keepdim=True).clamp(min=1.0) * max(counts.num_sequences, 1))
    if loss_type == "bnpo":
        return m / (m.sum().clamp(min=1.0) * conventions.num_microbatches * conventions.dp_size)
    if loss_type == "dr_grpo":
        return m / (max(counts.num_sequences, 1) * max_completion_length)
    return m / max(counts.num_items, 1)


def _grid(values: torch.Tensor, positions: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``[N]`` per-token values laid on the ``[B, T]`` grid at ``positions`` (flat ``b T + t``), zeros elsewhere."""
    flat = torch.zeros(shape[0] * shape[1], dtype=values.dtype, device=values.device)
    return flat.index_copy(0, positions, values).view(shape)


class GrpoStep(SftStep):
    """The scoring passes and the student pass of one GRPO update (``SftStep``'s student pass with the
    clipped policy-gradient loss, plus ``old_forward_step`` and ``ref_forward_step``).

    Args:
        config: the student's Megatron ``TransformerConfig``.
        grpo: the loss settings (``objectives.config.GrpoConfig``).
        temperature: the sampling temperature (log-probs are of ``z / temperature``).
        max_completion_length: ``L_max`` of ``dr_grpo`` (the rollout's ``max_tokens``).
        tp_group, dp_group: tensor- and data-parallel groups (None: size 1).
        chunk_elements: the log-softmax's temporary size (float32 elements).
    """

    def __init__(self, config, grpo: GrpoConfig, *, temperature: float, max_completion_length: int,
                 tp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None,
                 chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
        if temperature <= 0:
            raise ValueError(f"temperature: must be > 0, got {temperature}")
        if grpo.loss_type == "dr_grpo" and max_completion_length < 1:
            raise ValueError(f"max_completion_length: dr_grpo needs a positive length, got {max_completion_length}")
        super().__init__(config, tp_group=tp_group, dp_group=dp_group, chunk_elements=chunk_elements)
        self.grpo = grpo
        self.temperature, self.max_completion_length = temperature, max_completion_length
        self.counts: GrpoCounts | None = None

    # ------------------------------------------------------------------ step bookkeeping

    def prepare(self, microbatches: list[GrpoMicroBatch]) -> GrpoCounts:
        """The step's scored tokens, sequences and dapo items over every micro-batch and DP rank (one all-reduce)."""
        local = [sum(mb.num_tokens for mb in microbatches), sum(mb.num_sequences for mb in microbatches),
                 sum(mb.num_tokens if mb.num_items is None else mb.num_items for mb in microbatches)]
        self.counts = GrpoCounts(*self._step_sums(microbatches, local))
        self.num_tokens = self.counts.num_tokens
        return self.counts

    # ------------------------------------------------------------------ passes

    @torch.no_grad()
    def _scoring_step(self, name: str, data_iterator, model):
        mb: GrpoMicroBatch = next(data_iterator)
        output, last = self._forward(model, mb)
        if last:
            setattr(mb, name, self._token_logps(model, output, mb).detach())
        return output, _no_loss

    def old_forward_step(self, data_iterator, model):
        """Forward only: ``mb.old_logps``, log pi_old of the scored tokens under the current weights (last stage)."""
        return self._scoring_step("old_logps", data_iterator, model)

    def ref_forward_step(self, data_iterator, model):
        """Forward only under the reference weights (the caller's context): ``mb.ref_logps`` (last stage)."""
        return self._scoring_step("ref_logps", data_iterator, model)

    # ------------------------------------------------------------------ loss

    def _loss(self, mb: GrpoMicroBatch, model, output):
        g = self.grpo
        if g.needs_old_logps and mb.old_logps is None:
            raise RuntimeError("old_logps: missing for this micro-batch; run the old pass (old_forward_step) first "
                               "(grpo.num_iterations > 1 or the vLLM correction needs it)")
        if g.beta != 0.0 and mb.ref_logps is None:
            raise RuntimeError("ref_logps: missing for this micro-batch; run the reference pass (ref_forward_step) "
                               "first (grpo.beta != 0)")
        if g.vllm_importance_sampling_correction and mb.sampler_logps is None:
            raise RuntimeError("sampler_logps: required by grpo.vllm_importance_sampling_correction (the engine's "
                               "log-probs of the completion tokens)")
        dev = output.device
        shape = mb.grid_shape  # per sample (module docstring): the activation's grid only when padded
        positions = mb.grid_positions.to(dev)
        mask = torch.zeros(shape[0] * shape[1], dtype=torch.bool, device=dev).index_fill_(0, positions, True).view(shape)
        token_logps = self._token_logps(model, output, mb)
        logps = _grid(token_logps, positions, shape)
        old = _grid(mb.old_logps.to(dev), positions, shape) if g.needs_old_logps else None
        ref = _grid(mb.ref_logps.to(dev), positions, shape) if g.beta != 0.0 else None
        advantages = mb.advantages.to(dev, logps.dtype)
        is_ratio = raw_ratio = None
        if g.vllm_importance_sampling_correction:
            sampler = _grid(mb.sampler_logps.to(dev).reshape(-1)[(mb.score_index + 1).to(dev)], positions, shape)
            is_ratio = vllm_importance_ratio(old, sampler, mask, g.vllm_importance_sampling_mode,
                                             g.vllm_importance_sampling_cap)
            level = g.vllm_importance_sampling_mode.split("_")[0]
            raw_ratio = vllm_importance_ratio(old, sampler, mask, f"{level}_truncate", float("inf"))
        per_token = grpo_token_loss(logps, old, advantages, mask, epsilon_low=g.epsilon, epsilon_high=g.epsilon_high,
                                    delta=g.delta, level=g.importance_sampling_level, is_ratio=is_ratio, beta=g.beta,
                                    ref_logps=ref)
        weighted = per_token * step_token_weights(mask, g.loss_type, self.counts, self.conventions,
                                                  self.max_completion_length)
        share = weighted.sum()
        with torch.no_grad():
            logs = self._logs(share, mb, mask, logps, old, ref, advantages, is_ratio, raw_ratio,
                              None if is_ratio is None else sampler)
            if self.collect_loss_tokens:  # each scored token's term of the step objective
                logs.update(_token_logs(weighted.detach().reshape(-1)[positions], mb.score_tokens.to(dev),
                                        self._vocab(model)))
        return megatron_return(share, mb.num_tokens, max(self.counts.num_tokens, 1), self.conventions, logs)

    def _logs(self, share, mb, mask, logps, old, ref, advantages, is_ratio, raw_ratio,
              sampler) -> dict[str, torch.Tensor]:
        """Detached sums of one micro-batch (``reduce_logs`` divides them by the step's counts)."""
        g = self.grpo
        dev = share.device
        one = lambda x: x.double().sum().reshape(1)  # noqa: E731
        m = mask.double()
        logs = {"loss_sum": one(share.detach()),
                "num_tokens": torch.full((1,), mb.num_tokens, dtype=torch.float64, device=dev),
                "sequences": torch.full((1,), mb.num_sequences, dtype=torch.float64, device=dev),
                "advantage_sum": one(mb.advantages.to(dev))}
        # TRL's clip fractions: coef = exp(log w); per token (masked) or per sequence ([B, 1], every sequence)
        old_eff = logps if old is None else old
        coef = torch.exp(log_importance_weights(logps, old_eff, mask, g.importance_sampling_level))
        eps_high = g.epsilon if g.epsilon_high is None else g.epsilon_high
        a = advantages.unsqueeze(1)
        low, high = (coef < 1 - g.epsilon) & (a < 0), (coef > 1 + eps_high) & (a > 0)
        weight = m if coef.shape == mask.shape else torch.ones_like(coef, dtype=torch.float64)
        logs.update(clip_low=one(low * weight), clip_high=one(high * weight), clip_region=one((low | high) * weight))
        if ref is not None:
            logs["kl_sum"] = one(k3_kl(logps, ref) * m)
        if is_ratio is not None:
            entries = m if is_ratio.shape == mask.shape else torch.ones_like(is_ratio, dtype=torch.float64)
            capped = raw_ratio > g.vllm_importance_sampling_cap
            logs.update(is_sum=one(is_ratio * entries), is_capped=one(capped * entries), is_entries=one(entries),
                        logp_diff_sum=one((old - sampler).abs() * m))
        return logs

    def reduce_logs(self, logs: list[dict]) -> dict | None:
        """The step's metrics on the last pipeline stage (None elsewhere): ``loss`` (the step objective),
        ``num_tokens``, ``sequences``, the clip fractions (over the step's tokens, or its sequences at
        the sequence level; TRL logs the mean of per-micro-batch fractions), the KL's token mean
        (beta != 0), the applied vLLM ratio's mean and the fraction above the cap (correction on), the
        mean advantage; ``loss_tokens`` when collected."""
        if not logs:
            return None
        sums = sum_logs(logs, self.dp_group)
        n_tok, n_seq = sums["num_tokens"][0].clamp(min=1), sums["sequences"][0].clamp(min=1)
        clip_den = n_tok if self.grpo.importance_sampling_level == "token" else n_seq
        metrics = {LOSS: float(sums["loss_sum"][0]), "num_tokens": int(sums["num_tokens"][0]),
                   "sequences": int(sums["sequences"][0]), ADVANTAGE: float(sums["advantage_sum"][0] / n_seq),
                   CLIP_LOW: float(sums["clip_low"][0] / clip_den), CLIP_HIGH: float(sums["clip_high"][0] / clip_den),
                   CLIP_REGION: float(sums["clip_region"][0] / clip_den)}
        if "kl_sum" in sums:
            metrics[KL] = float(sums["kl_sum"][0] / n_tok)
        if "is_sum" in sums:
            entries = sums["is_entries"][0].clamp(min=1)
            metrics.update({IS_RATIO: float(sums["is_sum"][0] / entries),
                            IS_CAPPED: float(sums["is_capped"][0] / entries),
                            SAMPLER_LOGP_DIFF: float(sums["logp_diff_sum"][0] / n_tok)})
        if "token_loss" in sums:
            metrics[LOSS_TOKENS] = top_loss_tokens(sums["token_loss"], sums["token_count"],
                                                   float(sums["token_abs_loss"][0]))
        return metrics

    def finish(self) -> None:
        """Nothing to detach (no capture)."""
