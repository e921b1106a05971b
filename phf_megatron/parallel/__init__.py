"""PHF on Megatron-Core's parallel layouts: window capture under TP/SP/PP, the distributed loss.

Map (one idea per module):

* ``batch``: ``PhfMicroBatch`` (student/teacher sequences sharing the rollout, windows, OPSD
  score indices, validation) and ``step_normalizers`` (global counts of a step);
* ``window_rows``: the window rows of an ``[s, b, H]`` activation under sequence parallelism
  (``WindowIndex``: one gather forward, one scatter-add backward per layer, no host sync);
* ``capture``: ``WindowCapture`` hooks on the TransformerLayers and per-micro-batch
  ``CaptureSession``s (recomputation-safe; without autograd the hook only gathers);
* ``stage_plan``/``stage_flow``: which flow terms a pipeline stage owns; its share of the loss
  (the reference's terms function, or the kernels', on the stage's captured rows);
* ``pipeline_stats``: the running flow share travelling with the pipeline activation;
* ``vocab_parallel_jsd``: the clipped generalized JSD on vocabulary-sharded logits (chunked
  eager loop, or the fused Triton passes of ``jsd_triton`` on CUDA);
* ``logit_rows``: the last stage's logits at the scored positions only;
* ``loss``: ``L_OPSD + alpha L_flow`` per micro-batch in Megatron's loss conventions; logs;
* ``step``: ``PhfStep``, the teacher and student forward-step functions for
  ``forward_backward_func``;
* ``sft_step``, ``grpo_step``: the baselines' micro-batches and forward-step functions (SFT's
  cross-entropy; TRL 0.26's GRPO loss, with its old-policy and reference scoring passes);
* ``timing``: optional device-time regions of the PHF-only work (benchmarks).

The process group, Megatron's session and the CPU shims are ``phf_megatron.runtime``'s.
"""

from .batch import PhfMicroBatch, StepNormalizers, step_normalizers
from .capture import CaptureSession, WindowCapture
from .step import PhfStep
from .vocab_parallel_jsd import vocab_parallel_jsd
from .window_rows import gather_window_rows

__all__ = ["CaptureSession", "PhfMicroBatch", "PhfStep", "StepNormalizers", "WindowCapture", "gather_window_rows",
           "step_normalizers", "vocab_parallel_jsd"]
