"""GRPO, the paper's RL baseline: TRL 0.26.0's ``GRPOTrainer`` loss as pure functions (a reference, not a paper equation).

Transcribed from ``huggingface/trl`` tag ``v0.26.0`` (commit ``84794a7d03c748f3e1518cd3efc9a944b8cdd2bd``,
``VERSION`` = 0.26.0), ``trl/trainer/grpo_trainer.py``: the advantages in
``_generate_and_score_completions`` (lines 1936-1958), the vLLM importance-sampling ratio (1858-1887),
``_compute_loss`` (2115-2234); defaults and option values from ``trl/trainer/grpo_config.py``.

Per completion i of a micro-batch (``B`` completions, ``T`` positions, ``m_it`` the completion mask;
every log-probability is ``log softmax(z / temperature)[o_it]``, TRL divides the logits by the
sampling temperature, line 974):

    A_i      = (r_i - mean_g r) / (std_g r + 1e-4)                    group_advantages
    log w_it = log pi(o_it) - log pi_old(o_it)       (token)            log_importance_weights
             = sum_t m_it (...) / max(sum_t m_it, 1)  (sequence, GSPO)
    rho_it   = exp(log pi_old - log pi_vllm), capped at C              vllm_importance_ratio
    l_it     = -min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)         clipped_surrogate
    kl_it    = exp(ref - logp) - (ref - logp) - 1        (k3)          k3_kl
    l_it     = l_it * rho_it + beta * kl_it                            grpo_token_loss
    L_mb     = sum_it w_it l_it   (w: grpo / bnpo / dr_grpo / dapo)    token_weights, grpo_loss

``L_mb`` is what TRL's ``_compute_loss`` returns for ONE micro-batch (one device, one gradient
accumulation step). The optimizer step's gradient is the mean over the ``P`` processes (DDP) of
the sum over the ``GA`` micro-batches of ``grad L_mb``. Hence, per loss type, the step objective:

* ``grpo``: ``1/(GA B) sum_i 1/max(|o_i|,1) sum_t l_it`` per micro-batch: each sequence's token
  mean, averaged over the step's ``N_seq = P GA B`` sequences when every micro-batch holds ``B``
  completions (TRL's always do); micro-batches of unequal size weight their sequences unequally.
* ``bnpo``: ``1/GA sum_it l_it / max(n_tok(mb), 1)``: the token mean of each *micro-batch*, so the
  step depends on how completions fall into micro-batches and ranks (equal to ``grpo`` at B = 1).
* ``dr_grpo``: ``sum_it l_it / (B L_max GA)``: the step's sum over ``N_seq L_max``, layout-free.
* ``dapo`` (TRL's default): ``sum_it l_it / (N_tok / P)``: ``N_tok`` is every completion token of
  the *generation batch* over all processes (``num_items_in_batch``, lines 1687-1696: unmasked
  lengths, counted before ``mask_truncated_completions``); the step's global token mean, layout-free.
  TRL does not divide this one by ``GA`` (``compute_loss_func`` disables the Trainer's scaling).

Advantages are computed over the whole generation batch (all processes' rewards gathered), so a
group never needs to sit in one micro-batch. With ``num_iterations = 2`` (or the vLLM correction
on) ``log pi_old`` is a no-grad recompute by the trainer's own model at generation time; at the
first iteration it equals ``log pi`` and every ratio is 1. With ``num_iterations = 1`` and no
correction TRL uses ``log pi.detach()`` (``old_logps=None`` here). The vLLM ratio compares the
trainer's recompute with the engine's *processed* (temperature-scaled) log-probs (TRL builds its
engine with ``logprobs_mode="processed_logprobs"``, line 676): the two must be like for like.

Not transcribed (not used by the official baseline): ``loss_type`` ``cispo`` and ``sapo``,
``top_entropy_quantile``, tool masks, multi-reward weighting. Defaults below are TRL 0.26's.
"""

from __future__ import annotations

import torch

from .checks import check_same_shape
from .config import GRPO_IS_LEVELS as IS_LEVELS
from .config import GRPO_LOSS_TYPES as LOSS_TYPES
from .config import GRPO_SCALE_REWARDS as SCALE_REWARDS
from .config import GRPO_VLLM_IS_MODES as VLLM_IS_MODES

#: Added to the standard deviation before dividing (TRL's constant).
STD_EPS = 1e-4


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: must be one of {', '.join(allowed)}, got {value!r}")


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group") -> torch.Tensor:
    """``A_i = r_i - mean_g(r)``, divided by ``std + 1e-4`` unless ``scale_rewards="none"``.

    Args:
        rewards: ``[N]``, the generation batch's rewards, the ``group_size`` completions of each
            prompt consecutive (TRL: ``rewards.view(-1, num_generations)``).
        group_size: G, completions per prompt (TRL's ``num_generations``, which must be >= 2).
        scale_rewards: ``"group"``: the std of each group; ``"batch"``: the std of all N rewards
            (PPO-Lite); ``"none"``: no scaling (Dr. GRPO).

    The std is torch's unbiased one (Bessel's correction), as TRL's ``Tensor.std``. A group with
    equal rewards has advantage 0 (0 / (0 + 1e-4)); equal rewards inside a group get equal
    advantages. G = 1 is refused, as TRL's ``GRPOConfig`` refuses it (its unbiased std would be NaN).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected [N], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size: GRPO needs at least 2 completions per prompt (TRL's num_generations >= 2), "
                         f"got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"rewards: {rewards.numel()} rewards are not whole groups of {group_size}")
    _choice("scale_rewards", scale_rewards, SCALE_REWARDS)
    groups = rewards.view(-1, group_size)
    advantages = (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
    if scale_rewards == "none":
        return advantages
    if scale_rewards == "group":
        std = groups.std(dim=1).repeat_interleave(group_size)
    else:
        std = rewards.std().expand_as(rewards)
    return advantages / (std + STD_EPS)


def _weights(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: expected a bool tensor, got {mask.dtype}")
    check_same_shape("logps", like, "mask", mask)
    return mask.to(like.dtype)


def log_importance_weights(logps: torch.Tensor, old_logps: torch.Tensor, mask: torch.Tensor,
                           level: str = "token") -> torch.Tensor:
    """``log w``: ``[B, T]`` per token, or ``[B, 1]``, the masked mean over the sequence (``"sequence"``).

    ``logps`` carries the gradient; ``old_logps`` is a constant (detached here).
    """
    _choice("level", level, IS_LEVELS)
    check_same_shape("logps", logps, "old_logps", old_logps)
    log_ratio = logps - old_logps.detach()
    if level == "token":
        return log_ratio
    m = _weights(mask, logps)
    return ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)


def vllm_importance_ratio(old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor,
                          mode: str = "sequence_mask", cap: float = 3.0) -> torch.Tensor:
    """``rho = exp(log pi_old - log pi_vllm)`` on the masked tokens, a constant (no gradient).

    ``token_*``: ``[B, T]``, one ratio per token (1 on masked-out positions); ``sequence_*``:
    ``[B, 1]``, ``exp`` of the masked sum over the sequence. ``*_truncate``: ``min(rho, cap)``;
    ``*_mask``: ``rho > cap`` becomes 0 (that token, or the whole sequence, leaves the loss).
    """
    _choice("mode", mode, VLLM_IS_MODES)
    check_same_shape("old_logps", old_logps, "sampler_logps", sampler_logps)
    diff = (old_logps.detach() - sampler_logps.detach()) * _weights(mask, old_logps)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, max=cap)
    return ratio.masked_fill(ratio > cap, 0.0)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """``exp(ref - logp) - (ref - logp) - 1`` per token (Schulman's k3 estimator of KL(pi || ref), >= 0)."""
    check_same_shape("logps", logps, "ref_logps", ref_logps)
    delta = ref_logps.detach() - logps
    return torch.exp(delta) - delta - 1


def clipped_surrogate(log_weights: torch.Tensor, advantages: torch.Tensor, epsilon_low: float = 0.2,
                      epsilon_high: float | None = None, delta: float | None = None) -> torch.Tensor:
    """``-min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)`` with ``w = exp(log_weights)``.

    Args:
        log_weights: ``[B, T]`` or ``[B, 1]`` (:func:`log_importance_weights`).
        advantages: ``[B]`` or ``[B, T]`` (:func:`group_advantages`); a constant.
        epsilon_low, epsilon_high: TRL's ``epsilon`` and ``epsilon_high`` (None: = ``epsilon``).
        delta: INTELLECT-2's two-sided clip: the unclipped branch uses ``min(w, delta)``.
    """
    eps_high = epsilon_low if epsilon_high is None else epsilon_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    advantages = advantages.detach()
    w = torch.exp(log_weights)
    w_clipped = torch.clamp(w, 1 - epsilon_low, 1 + eps_high)
    if delta is not None:
        w = torch.clamp(w, max=delta)
    return -torch.min(w * advantages, w_clipped * advantages)


def grpo_token_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, advantages: torch.Tensor,
                   mask: torch.Tensor, *, epsilon_low: float = 0.2, epsilon_high: float | None = None,
                   delta: float | None = None, level: str = "token", is_ratio: torch.Tensor | None = None,
                   beta: float = 0.0, ref_logps: torch.Tensor | None = None,
                   kl_is_correction: bool = False) -> torch.Tensor:
    """``l = clipped_surrogate * rho + beta * kl``, in TRL's order (lines 2158-2217).

    Args:
        logps: ``[B, T]``, log pi of the completion tokens (the only input with a gradient).
        old_logps: ``[B, T]`` log pi_old, or None: ``logps.detach()`` (every ratio 1).
        advantages: ``[B]`` (or ``[B, T]``).
        mask: ``[B, T]`` bool, the completion tokens (used by the sequence-level ratio).
        is_ratio: the vLLM correction (:func:`vllm_importance_ratio`), None when off.
        beta: KL coefficient (0: no reference model, the term is skipped).
        ref_logps: ``[B, T]`` log pi_ref, required when ``beta != 0``.
        kl_is_correction: TRL's ``use_bias_correction_kl``: the KL term times the ratio w.

    Returns ``[B, T]``, or ``[B, 1]`` at the sequence level without KL or token-level correction.
    """
    old = logps.detach() if old_logps is None else old_logps
    log_w = log_importance_weights(logps, old, mask, level)
    loss = clipped_surrogate(log_w, advantages, epsilon_low, epsilon_high, delta)
    if is_ratio is not None:
        loss = loss * is_ratio.detach()
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("ref_logps: required when beta != 0 (the KL term needs the reference model's log-probs)")
        kl = k3_kl(logps, ref_logps)
        if kl_is_correction:
            kl = kl * torch.exp(log_w)
        loss = loss + beta * kl
    return loss


def token_weights(mask: torch.Tensor, loss_type: str = "dapo", *, grad_accum_steps: int = 1,
                  max_completion_length: int | None = None, num_items: float | None = None,
                  num_processes: int = 1) -> torch.Tensor:
    """``w [B, T]`` with TRL's micro-batch loss ``L_mb = sum w * l`` (module docstring, per loss type).

    Args:
        mask: ``[B, T]`` bool, the micro-batch's scored completion tokens.
        loss_type: ``grpo`` (sequence token-mean, mean over the micro-batch's B sequences), ``bnpo``
            (the micro-batch's token mean), ``dr_grpo`` (sum / (B max_completion_length)), ``dapo``
            (sum / (num_items / num_processes)).
        grad_accum_steps: GA, the micro-batches per optimizer step on one process (TRL's
            ``current_gradient_accumulation_steps``); divides grpo, bnpo and dr_grpo, not dapo.
        max_completion_length: ``dr_grpo``'s constant.
        num_items: ``dapo``'s ``num_items_in_batch``: the generation batch's completion tokens
            over all processes.
        num_processes: P (``dapo``).
    """
    _choice("loss_type", loss_type, LOSS_TYPES)
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"mask: expected a [B, T] bool tensor, got {mask.dtype} of shape {tuple(mask.shape)}")
    m = mask.to(torch.float64)
    if loss_type == "grpo":
        return m / (m.sum(-1, keepdim=True).clamp(min=1.0) * mask.shape[0] * grad_accum_steps)
    if loss_type == "bnpo":
        return m / (m.sum().clamp(min=1.0) * grad_accum_steps)
    if loss_type == "dr_grpo":
        if max_completion_length is None or max_completion_length < 1:
            raise ValueError(f"max_completion_length: dr_grpo needs a positive length, got {max_completion_length}")
        return m / (mask.shape[0] * max_completion_length * grad_accum_steps)
    if num_items is None or num_items <= 0:
        raise ValueError(f"num_items: dapo needs the generation batch's completion-token count, got {num_items}")
    return m * (num_processes / num_items)


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor | None, advantages: torch.Tensor, mask: torch.Tensor,
              *, loss_type: str = "dapo", grad_accum_steps: int = 1, max_completion_length: int | None = None,
              num_items: float | None = None, num_processes: int = 1, **token_loss) -> torch.Tensor:
    """TRL 0.26's ``_compute_loss`` for one micro-batch: ``sum(per_token_loss * token_weights)``.

    ``token_loss``: the keyword arguments of :func:`grpo_token_loss` (epsilons, delta, level,
    is_ratio, beta, ref_logps, kl_is_correction); the rest as :func:`token_weights`.
    """
    loss = grpo_token_loss(logps, old_logps, advantages, mask, **token_loss)
    w = token_weights(mask, loss_type, grad_accum_steps=grad_accum_steps, max_completion_length=max_completion_length,
                      num_items=num_items, num_processes=num_processes).to(loss.dtype)
    return (loss * w).sum()
