"""PHF and OPSD objectives: pure PyTorch, one device, no Megatron. The oracle for the rest.

Imports nothing of ours above it: the kernels and the distributed code build on these functions,
never the other way round (``hidden_flow_loss`` runs the terms function it is given, its own
``flow.flow_terms`` by default; ``phf_megatron.kernels`` chooses the fused kernels). Submodules
load on first use (``lazy_exports``): ``objectives.config`` imports without torch.

The equations of the paper's Section 3, each in one hop (reference function here -> distributed
code on Megatron-Core -> fused kernel -> tests). The flow terms reach the pipeline stages and the
kernels as one terms function (``flow.flow_terms`` / ``kernels.flow_cuda.flow_terms_cuda``):

=================  ==========================  ===============================  ==========================  =========================================
paper (Sec. 3)     reference (objectives/)     distributed (parallel/ ...)      kernel                      tests
=================  ==========================  ===============================  ==========================  =========================================
p_S, p_T (3.1)     data.batch                  step.PhfStep: teacher and        --                          data/test_batch.py
                   .build_distill_batch        student passes on the same y
L_OPSD (3.1)       opsd.opsd_loss              vocab_parallel_jsd               parallel/jsd_triton.py      objectives/test_opsd.py,
                   (generalized_jsd_terms,     .vocab_parallel_jsd              (Triton)                    parallel/test_vocab_parallel_jsd.py,
                   opsd_token_divergence)                                                                   parallel/test_jsd_triton.py
W, |W|<=128        window.select_window        window_rows, capture             --                          objectives/test_window.py,
(3.2, 3.6)                                     (rows at W, every layer)                                     parallel/test_window_rows.py
Delta h (3.2)      flow.transitions            stage_flow.stage_terms (runs     kernels.flow_cuda           objectives/test_flow.py (vs plain loops),
d (3.2)            flow.unit_directions        flow_terms on the stage's        .flow_terms_cuda (csrc/)    kernels/test_kernel_emulation.py,
L_dir (3.2)        flow.direction_loss         captured rows)                                               kernels/test_flow_cuda.py (GPU)
G, L_geo (3.2)     flow.gram, .geometry_loss
L_layer (3.2)      flow.layer_loss             StageFlowValues.layer_loss       (sum of kernel terms)       training/test_diagnostics.py,
                                                                                                            objectives/test_flow.py (per layer)
C, L_adj (3.2)     flow.cross_gram,            stage_plan (pairs crossing a     kernels.flow_cuda           parallel/test_stage_plan.py,
                   .adjacent_layer_loss,       stage: the input's rows)         .flow_terms_cuda            objectives/test_flow.py (per pair)
                   .per_sample_flow
Prop. 1 (3.3)      (invariances of the above)                                                               objectives/test_flow_invariance.py
EMA (3.4)          ema.ema_update              training/teacher.py              --                          objectives/test_ema_and_objective.py,
                                                                                                            training/test_teacher.py
L_local (3.5)      flow.per_sample_flow        stage shares with the global     --                          objectives/test_flow.py,
L_flow (3.5)       flow.hidden_flow_loss       counts (pipeline_stats), loss    kernels.hidden_flow_loss    parallel/test_stage_plan.py
                   (+ batch_mean)              (global N_flow)                  (backend="auto")
L_PHF (3.6)        phf.phf_objective           loss.phf_microbatch_loss         --                          objectives/test_ema_and_objective.py,
                                                                                                            parallel/test_phf_step.py (every layout)
=================  ==========================  ===============================  ==========================  =========================================

Baselines (references, not paper equations): the paper's SFT and GRPO rows, each an oracle for
the trainer's code as the table's functions are for PHF's.

* ``sft.sft_loss``: teacher-forced cross-entropy, the mean over the scored tokens (the response,
  or the prompt too as the official baseline's TRL ``SFTTrainer`` on plain text); tests:
  ``objectives/test_sft.py`` (vs ``F.cross_entropy`` and HF transformers' Qwen3 loss).
* ``grpo``: TRL 0.26.0's ``GRPOTrainer`` loss, one function per step: ``group_advantages``,
  ``log_importance_weights``, ``vllm_importance_ratio``, ``clipped_surrogate``, ``k3_kl``,
  ``grpo_token_loss``, ``token_weights`` (grpo / bnpo / dr_grpo / dapo), ``grpo_loss``; tests:
  ``objectives/test_grpo.py`` (vs a transcription of TRL's ``_compute_loss``). The reward is
  ``eval.rewards.reward_correctness`` (official OPSD's ``grpo_train.py``).
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ("FLOW_CHOICES", "FLOW_VARIANTS", "ObjectiveConfig"),
    "ema": ("ema_update",),
    "flow": ("FlowTerms", "LayerPlan", "TermsFunction", "adjacent_layer_loss", "batch_mean", "cross_gram",
             "direction_loss", "flow_terms", "geometry_loss", "gram", "hidden_flow_loss", "layer_loss",
             "per_sample_flow", "pointwise_mse_loss", "transitions", "unit_directions"),
    "grpo": ("group_advantages", "grpo_loss"),
    "phf": ("phf_objective",),
    "opsd": ("clip_statistics", "generalized_jsd_terms", "opsd_loss", "opsd_token_divergence", "restrict_to_top_k",
             "top_k_indices"),
    "sft": ("sft_loss",),
    "sampled_token": ("sampled_token_loss", "sampled_token_terms", "token_log_probs"),
    "window": ("select_window",),
})
