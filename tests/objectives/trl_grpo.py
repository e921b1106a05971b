"""A float64 transcription of TRL 0.26.0's GRPO loss, for the tests (not used by the package).

Source: ``huggingface/trl`` tag ``v0.26.0`` (commit ``84794a7d03c748f3e1518cd3efc9a944b8cdd2bd``),
``trl/trainer/grpo_trainer.py``:

* ``trl_advantages``: ``_generate_and_score_completions`` lines 1936-1958;
* ``trl_vllm_is_ratio``: the same method, lines 1858-1887 (under ``torch.no_grad()``);
* ``trl_compute_loss``: ``_compute_loss`` lines 2148-2234, the model call replaced by the given
  ``per_token_logps`` and ``self``/``self.args`` by ``args`` (entropy mask and tools off).

Written from those lines, statement by statement; it shares no code with ``phf_megatron.objectives``.
"""

from types import SimpleNamespace

import torch


def trl_args(**overrides):
    """GRPOConfig's 0.26.0 defaults for the fields ``_compute_loss`` reads."""
    base = dict(loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2, delta=None, beta=0.0,
                importance_sampling_level="token", use_bias_correction_kl=False, use_vllm=True,
                vllm_importance_sampling_correction=False, vllm_importance_sampling_mode="sequence_mask",
                vllm_importance_sampling_cap=3.0, current_gradient_accumulation_steps=1, max_completion_length=None,
                num_processes=1, scale_rewards="group", num_generations=2)
    base.update(overrides)
    return SimpleNamespace(**base)


def trl_advantages(rewards, self):
    num_generations = self.num_generations
    mean_grouped_rewards = rewards.view(-1, num_generations).mean(dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    if self.scale_rewards in ["group", "none"]:
        std_rewards = rewards.view(-1, num_generations).std(dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    elif self.scale_rewards == "batch":
        std_rewards = rewards.std().expand_as(rewards)
    else:
        raise ValueError(self.scale_rewards)
    if self.scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


def trl_vllm_is_ratio(old_per_token_logps, sampling_per_token_logps, completion_mask, self):
    with torch.no_grad():
        mask = completion_mask
        per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
        sequence_level_is = self.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]
        if sequence_level_is:
            per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
            logps_diff = per_sequence_logps_diff
        else:
            logps_diff = per_token_logps_diff
        vllm_importance_sampling_ratio = torch.exp(logps_diff)
        if self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:
            vllm_importance_sampling_ratio = torch.clamp(vllm_importance_sampling_ratio,
                                                         max=self.vllm_importance_sampling_cap)
        elif self.vllm_importance_sampling_mode in ["sequence_mask", "token_mask"]:
            vllm_importance_sampling_ratio = vllm_importance_sampling_ratio.masked_fill(
                vllm_importance_sampling_ratio > self.vllm_importance_sampling_cap, value=0.0)
        else:
            raise ValueError(self.vllm_importance_sampling_mode)
    return vllm_importance_sampling_ratio


def trl_compute_loss(per_token_logps, inputs, self):
    """``inputs``: completion_mask (float 0/1), advantages [B], and as TRL's optional
    old_per_token_logps, ref_per_token_logps, importance_sampling_ratio, num_items_in_batch."""
    completion_mask = inputs["completion_mask"]
    advantages = inputs["advantages"]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    old_per_token_logps = inputs.get("old_per_token_logps")
    old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps

    log_ratio = per_token_logps - old_per_token_logps
    if self.importance_sampling_level == "token":
        log_importance_weights = log_ratio
    elif self.importance_sampling_level == "sequence":
        mask = completion_mask
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    else:
        raise ValueError(self.importance_sampling_level)

    coef_1 = torch.exp(log_importance_weights)

    if self.beta != 0.0:
        ref_per_token_logps = inputs["ref_per_token_logps"]
        per_token_kl = (torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1)
        if self.use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1

    if self.loss_type in ["grpo", "bnpo", "dr_grpo", "dapo"]:
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
        if self.delta is not None:
            coef_1 = torch.clamp(coef_1, max=self.delta)
        per_token_loss1 = coef_1 * advantages
        per_token_loss2 = coef_2 * advantages
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
    else:
        raise ValueError(self.loss_type)

    if self.use_vllm and self.vllm_importance_sampling_correction:
        per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]

    if self.beta != 0.0:
        per_token_loss = per_token_loss + self.beta * per_token_kl

    mask = completion_mask
    if self.loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        loss = loss / self.current_gradient_accumulation_steps
    elif self.loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
        loss = loss / self.current_gradient_accumulation_steps
    elif self.loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)
        loss = loss / self.current_gradient_accumulation_steps
    elif self.loss_type == "dapo":
        normalizer = inputs["num_items_in_batch"] / self.num_processes
        loss = (per_token_loss * mask).sum() / normalizer
    else:
        raise ValueError(self.loss_type)
    return loss
