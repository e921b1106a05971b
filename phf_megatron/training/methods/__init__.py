"""The one choice point between training methods: ``build_method(cfg, student, ...)`` (``TrainConfig.method``).

A method supplies what differs between PHF and its baselines; the loop, the update
(``update.run_update``), the step objects and the batch builder never test its name:

* ``rollout_driver(...)``: the rollout engines (PHF), or a driver without engines (SFT);
* ``row_inputs(tokenizer, row, prompt_config)``: a row's ``PromptPair`` (SFT: the student prompt twice);
  ``check_rows(planner)``: the rows whose prompt (or, under a token budget, longest sequence) can never fit,
  named at load (``StepPlanner.check_rows``);
* ``training_samples(planner, plan, samples, group)``: ``(pairs, completions)`` of the step's samples;
* ``microbatches(batch, micro_batch_size, samples)``: the rank's padded batch cut into the method's
  micro-batches (padded or packed: ``batches.Packing``); ``samples[r]``: the step's index of row ``r``;
* ``step(student)``: the forward-step object of one update (``parallel.PhfStep`` / ``SftStep``),
  ``passes(step, mbs)``: its forward-only ``update.ScoringPass``es before the student's (PHF: the teacher);
* ``after_step()`` (PHF: the EMA), ``parts()`` (checkpoint parts of its own), ``step_metrics()``,
  ``implementations()`` (its loss kernels, for the start-up line), ``close()``;
* ``iterations``: optimizer steps per rollout batch (GRPO's ``grpo.num_iterations``; else 1). The
  loop samples, calls ``training_samples`` and builds the micro-batches at a batch's first step
  only, keeps them for the next ``iterations - 1`` steps, and advances the sampler and pushes the
  weights after its last.

GRPO (``grpo.py``): its passes are the old-policy and reference log-probs (at a batch's first step),
its micro-batches carry per-sample scalars (advantages) and per-token tensors (sampler log-probs).
"""

from __future__ import annotations


def build_method(cfg, student):
    """The run's method on this rank (``cfg.method``), built after the student."""
    if cfg.method == "sft":
        from .sft import SftMethod

        return SftMethod(cfg)
    if cfg.method == "grpo":
        from .grpo import GrpoMethod

        return GrpoMethod(cfg, student)
    from .phf import PhfMethod

    return PhfMethod(cfg, student)
