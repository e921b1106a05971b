"""The GRPO step on Megatron-Core and its oracle, TRL 0.26's GRPO loss on HF transformers' float64 log-probs.

The batch is ``sft_ranks``' completions (prompt ; completion, right-padded, scored on the
completion), two groups of four with fixed rewards. Three policies of one architecture: the
student (``tiny_hf_model``), the old policy (the student plus noise: the ratios differ from 1 and
some are clipped) and the reference (other noise: the KL and its gradient are not 0). The
engine's log-probs are the old policy's float64 ones plus designed noise: one sequence's sum
exceeds the cap, one token alone exceeds it, the rest stay well below.

``run_grpo_layouts`` runs ``GrpoStep`` through Megatron's schedules on each spawned rank (old
pass, reference pass, student pass); ``hf_grpo_reference`` is ``objectives.grpo.grpo_loss`` per
TRL micro-batch (``GA`` = micro-batches per rank, ``P`` = DP size) on HF Qwen3's float64
log-probs at the temperature, averaged over the processes, and its gradient.
"""

from __future__ import annotations

import torch

from phf_megatron.objectives.config import GrpoConfig
from phf_megatron.objectives.grpo import (
    grpo_loss,
    grpo_token_loss,
    group_advantages,
    log_importance_weights,
    token_weights,
    vllm_importance_ratio,
)
from phf_megatron.parallel.grpo_step import GrpoMicroBatch
from phf_megatron.parallel.layout import packed_length

from ..helpers.tiny_qwen3 import tiny_hf_model
from .harness import build_chunks, hf_grads, init_layout
from .reference import sample_tokens
from .sft_ranks import VOCAB, global_batch

SEED = 0
TEMPERATURE = 1.2  # log-probs of z / 1.2: a missing division changes every value
MAX_COMPLETION = 12  # dr_grpo's L_max (the longest completion has 10 tokens)
REWARDS = [1.0, 0.0, 0.5, 0.0, 0.2, 1.0, 1.0, 0.0]
GROUP = 4
PERTURB = {"old": (1, 0.02), "ref": (2, 0.03)}  # (seed, noise std) added to every student weight
#: the main configuration (the official run's, with a KL term so the reference pass is exercised)
MAIN = dict(loss_type="grpo", num_iterations=2, vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="sequence_mask", beta=0.04)
#: option cases: overrides of MAIN (``zero_advantages``: every advantage 0)
CASES = {
    "main": {},
    "bnpo": dict(loss_type="bnpo"),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "dapo": dict(loss_type="dapo"),
    "mu1_no_correction": dict(num_iterations=1, vllm_importance_sampling_correction=False),
    "mu1_correction": dict(num_iterations=1),
    "token_truncate": dict(vllm_importance_sampling_mode="token_truncate"),
    "token_mask": dict(vllm_importance_sampling_mode="token_mask"),
    "sequence_truncate": dict(vllm_importance_sampling_mode="sequence_truncate"),
    "sequence_level": dict(importance_sampling_level="sequence"),
    "sequence_level_token_mask": dict(importance_sampling_level="sequence", vllm_importance_sampling_mode="token_mask"),
    "no_kl": dict(beta=0.0),
    "eps_high_delta": dict(epsilon_high=0.28, delta=1.5),
    "zero_advantages": dict(beta=0.0, zero_advantages=True),
}


def grpo_config(case: str) -> GrpoConfig:
    options = {k: v for k, v in {**MAIN, **CASES[case]}.items() if k != "zero_advantages"}
    return GrpoConfig(**options)


def old_policy(case: str) -> str:
    """TRL recomputes the old log-probs at generation time: the current weights at ``num_iterations`` 1,
    an earlier policy (here: ``old``) on the later iterations."""
    return "old" if grpo_config(case).num_iterations > 1 else "student"


def advantages(case: str) -> torch.Tensor:
    adv = group_advantages(torch.tensor(REWARDS, dtype=torch.float64), GROUP)
    return torch.zeros_like(adv) if CASES[case].get("zero_advantages") else adv


def policy_model(model_name: str, policy: str):
    """The HF model of ``policy`` (student, old, ref), float32 as ``tiny_hf_model``."""
    hf = tiny_hf_model(model_name, seed=SEED)
    if policy != "student":
        seed, std = PERTURB[policy]
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(std * torch.randn(p.shape, generator=g))
    return hf


def token_logps(model, tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: ``log softmax(z / TEMPERATURE)[token]`` of every token from its predecessor (0 at position 0),
    differentiable; off the completion these are real values, as TRL's (the loss must not depend on them)."""
    logits = model(input_ids=tokens).logits[:, :-1] / TEMPERATURE
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def sampler_logps(model_name: str, policy: str) -> torch.Tensor:
    """``[B, T]`` float32: the engine's log-probs, the old policy's float64 ones plus noise (0 off the completion).
    Sequence 3 (10 tokens) is 0.2 less likely per token (ratio ~e^2 > 3: over the cap as a sequence), token 2 of
    sequence 5 is 1.6 less likely (~e^1.6 > 3: over the cap as a token, and its sequence too)."""
    tokens, scored = global_batch(False)
    with torch.no_grad():
        old = token_logps(policy_model(model_name, policy).double(), tokens)
    noise = 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    rows = [torch.nonzero(scored[b]).squeeze(1) for b in range(scored.shape[0])]
    noise[3, rows[3]] += 0.2
    noise[5, rows[5][2]] += 1.6
    return torch.where(scored, old - noise, 0.0).float()


def grpo_microbatches(case: str, sampler: torch.Tensor, dp_rank: int = 0, dp_size: int = 1,
                      num_micro: int = 1, packed: bool = False, pad_multiple: int = 1) -> list[GrpoMicroBatch]:
    """This DP rank's contiguous share in ``num_micro`` micro-batches: right-padded, or ``packed`` into one row
    each, every one to the rank's ``packed_length`` (a multiple of ``pad_multiple``), as ``sft_ranks``."""
    tokens, scored = global_batch(False)
    lengths = torch.tensor([len(s) for s, _ in sample_tokens(VOCAB)])
    adv = advantages(case)
    use_sampler = grpo_config(case).vllm_importance_sampling_correction
    per_rank = tokens.shape[0] // dp_size
    size = per_rank // num_micro
    cuts = [slice(dp_rank * per_rank + k * size, dp_rank * per_rank + (k + 1) * size) for k in range(num_micro)]
    if not packed:
        return [GrpoMicroBatch(tokens[sl], scored[sl], adv[sl], sampler[sl] if use_sampler else None) for sl in cuts]
    total = packed_length([lengths[sl] for sl in cuts], pad_multiple)
    return [GrpoMicroBatch.packed(tokens[sl], scored[sl], adv[sl], lengths[sl], sampler[sl] if use_sampler else None,
                                  pad_multiple=pad_multiple, total=total) for sl in cuts]


def trl_terms(case: str, logps, old, ref, sampler, scored, dp_size: int, num_micro: int):
    """TRL's step loss: ``grpo_loss`` per micro-batch of each process, summed over GA, averaged over P; and its
    terms ``w_it l_it / P`` ``[B, T]`` (their magnitudes are the loss's scale: advantages sum to 0 in a group, so
    the loss is a difference of terms each known to float32's precision)."""
    cfg, adv = grpo_config(case), advantages(case)
    n = scored.shape[0]
    size = n // (dp_size * num_micro)
    weights = dict(loss_type=cfg.loss_type, grad_accum_steps=num_micro, max_completion_length=MAX_COMPLETION,
                   num_items=float(scored.sum()), num_processes=dp_size)
    total, terms_of = 0.0, []
    for start in range(0, n, size):
        sl = slice(start, start + size)
        ratio = (vllm_importance_ratio(old[sl], sampler[sl].double(), scored[sl], cfg.vllm_importance_sampling_mode,
                                       cfg.vllm_importance_sampling_cap)
                 if cfg.vllm_importance_sampling_correction else None)
        token_loss = dict(epsilon_low=cfg.epsilon, epsilon_high=cfg.epsilon_high, delta=cfg.delta,
                          level=cfg.importance_sampling_level, is_ratio=ratio, beta=cfg.beta,
                          ref_logps=ref[sl] if cfg.beta else None)
        old_mb = old[sl] if cfg.needs_old_logps else None
        total = total + grpo_loss(logps[sl], old_mb, adv[sl], scored[sl], **weights, **token_loss)
        terms = grpo_token_loss(logps[sl], old_mb, adv[sl], scored[sl], **token_loss).detach()
        terms_of.append(terms * token_weights(scored[sl], **weights) / dp_size)
    return total / dp_size, torch.cat(terms_of)


def hf_grpo_reference(model_name: str, case: str, sampler: torch.Tensor, dp_size: int, num_micro: int) -> dict:
    """The oracle of ``case`` at a layout of ``dp_size`` processes x ``num_micro`` micro-batches: loss (and its
    scale, ``trl_terms``), gradient of every student parameter, and TRL's clip and correction statistics over the
    step (and the distance of the nearest ratio to a clip bound or the cap), the loss summed by token id."""
    tokens, scored = global_batch(False)
    cfg = grpo_config(case)
    with torch.no_grad():
        old = token_logps(policy_model(model_name, old_policy(case)).double(), tokens)
        ref = token_logps(policy_model(model_name, "ref").double(), tokens)
    model = policy_model(model_name, "student").double()
    model.zero_grad()
    logps = token_logps(model, tokens)
    loss, terms = trl_terms(case, logps, old, ref, sampler, scored, dp_size, num_micro)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    old_eff = old if cfg.needs_old_logps else logps.detach()
    coef = torch.exp(log_importance_weights(logps.detach(), old_eff, scored, cfg.importance_sampling_level))
    a = advantages(case)[:, None]
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    low, high = (coef < 1 - cfg.epsilon) & (a < 0), (coef > 1 + eps_high) & (a > 0)
    where = scored if coef.shape == scored.shape else torch.ones_like(coef, dtype=torch.bool)
    on = terms[scored]
    out = dict(loss=float(loss.detach()), loss_scale=float(on.abs().sum()), num_tokens=int(scored.sum()), grads=grads,
               token_loss=torch.zeros(VOCAB, dtype=torch.float64).index_add(0, tokens[scored], on),
               token_count=torch.bincount(tokens[scored], minlength=VOCAB),
               clip_low=float(low[where].double().mean()), clip_high=float(high[where].double().mean()),
               clip_region=float((low | high)[where].double().mean()),
               coef_margin=float(torch.min((coef[where] - (1 - cfg.epsilon)).abs().min(),
                                           (coef[where] - (1 + eps_high)).abs().min())))
    if cfg.vllm_importance_sampling_correction:
        raw = vllm_importance_ratio(old, sampler.double(), scored, cfg.vllm_importance_sampling_mode.split("_")[0]
                                    + "_truncate", float("inf"))
        entries = scored if raw.shape == scored.shape else torch.ones_like(raw, dtype=torch.bool)
        out.update(is_capped=float((raw[entries] > cfg.vllm_importance_sampling_cap).double().mean()),
                   is_margin=float((raw[entries] - cfg.vllm_importance_sampling_cap).abs().min()))
    return out


def run_grpo_layouts(rank, world_size, plans, samplers):
    """``plans``: ``(layout_name, Layout, model_name, cases)``; ``samplers[(model_name, old policy)]``: the engine's
    log-probs. One model build per layout (student, old, ref), every case on it."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.parallel.grpo_step import GrpoStep

    out = {}
    fb = get_forward_backward_func
    for layout_name, layout, model_name, cases in plans:
        init_layout(layout)
        student = build_chunks(policy_model(model_name, "student"), layout, ddp=True)
        models = dict(student=student, old=build_chunks(policy_model(model_name, "old"), layout, ddp=False),
                      ref=build_chunks(policy_model(model_name, "ref"), layout, ddp=False))
        arch = Qwen3Arch.from_hf(policy_model(model_name, "student").config)
        dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        n = len(student)
        for case in cases:
            cfg = grpo_config(case)
            mbs = grpo_microbatches(case, samplers[(model_name, old_policy(case))], dp_rank, dp, layout.num_micro,
                                    layout.packed, layout.tp if layout.sp else 1)
            step = GrpoStep(student[0].config, cfg, temperature=TEMPERATURE, max_completion_length=MAX_COMPLETION,
                            tp_group=ps.get_tensor_model_parallel_group(), dp_group=ps.get_data_parallel_group())
            step.collect_loss_tokens = True
            step.prepare(mbs)
            iterators = lambda: [iter(mbs) for _ in range(n)] if n > 1 else iter(mbs)  # noqa: E731
            kw = dict(num_microbatches=len(mbs), seq_length=step.student_seq_length(mbs[0].student_tokens.shape[1]),
                      micro_batch_size=mbs[0].batch_size)
            passes = [(step.old_forward_step, models[old_policy(case)])] if cfg.needs_old_logps else []
            passes += [(step.ref_forward_step, models["ref"])] if cfg.beta else []
            for forward_step, chunks in passes:
                with torch.no_grad():
                    fb()(forward_step_func=forward_step, data_iterator=iterators(), model=chunks, forward_only=True,
                         **kw)
            for chunk in student:
                chunk.zero_grad_buffer()
            logs = fb()(forward_step_func=step.student_forward_step, data_iterator=iterators(), model=student, **kw)
            metrics = step.reduce_logs(logs) if ps.is_pipeline_last_stage(ignore_virtual=True) else None
            step.finish()
            grads = hf_grads(student, arch)
            if ps.get_tensor_model_parallel_rank() == 0 and dp_rank == 0:
                out[(layout_name, case)] = dict(metrics=metrics, grads=grads)
    return out
