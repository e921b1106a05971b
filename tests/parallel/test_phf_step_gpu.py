"""On a GPU (no CPU shims, NCCL): one PHF step at TP=1 equals the HF reference, float32.

Tolerance 1e-4 relative (cuBLAS/SDPA reduce in other orders than the CPU kernels; TF32 stays off
for float32 matmuls by default). Default backends (Triton JSD; fused flow kernels, 3xTF32 for
float32, when the extension builds; scored logit rows only) and the reference ones (eager JSD,
flow equations, Megatron's full output layer); and packed micro-batches (``PhfMicroBatch.packed``: the
per-sequence causal SDPA calls, flash on CUDA, and the THD RoPE on the device). Run on a GPU machine: ``pytest -m gpu tests/parallel``.
"""

import pytest
import torch

from ..helpers.tiny_qwen3 import tiny_hf_model
from . import reference
from .harness import Layout, build_chunks, hf_grads, run_step
from .phf_ranks import STUDENT_SEED, TEACHER_SEED, VARIANTS, VOCAB

pytestmark = pytest.mark.gpu


REFERENCE_BACKENDS = dict(flow_backend="torch", jsd_backend="torch", score_rows_only=False)


@pytest.mark.parametrize("variant,options,packed", [("phf", {}, False), ("selected", {}, False),
                                                    ("phf", REFERENCE_BACKENDS, False), ("phf", {}, True),
                                                    ("opsd", {}, True)])
def test_phf_step_on_gpu_equals_the_reference(variant, options, packed):
    from megatron.core import parallel_state as ps

    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.parallel import PhfStep, WindowCapture

    hf_s, hf_t = tiny_hf_model("gqa", seed=STUDENT_SEED), tiny_hf_model("gqa", seed=TEACHER_SEED)
    with megatron_session(1, 1):
        layout = Layout(num_micro=2, recompute=True)
        student, teacher = build_chunks(hf_s, layout, ddp=True), build_chunks(hf_t, layout, ddp=False)
        captures = WindowCapture(student), WindowCapture(teacher)
        mbs = [mb.to("cuda") for mb in reference.microbatches(VOCAB, num_micro=2, packed=packed)]
        step = PhfStep(VARIANTS[variant], student[0].config, tp_group=ps.get_tensor_model_parallel_group(),
                       dp_group=ps.get_data_parallel_group(), student_capture=captures[0], teacher_capture=captures[1],
                       **options)
        metrics = step.reduce_logs(run_step(step, student, teacher, mbs))
        grads = hf_grads(student, Qwen3Arch.from_hf(hf_s.config))
    ref = reference.hf_reference(hf_s.double(), hf_t.double(), reference.microbatches(VOCAB), VARIANTS[variant], 4)
    for key in ("loss", "loss_opsd", "loss_flow"):
        assert metrics[key] == pytest.approx(ref[key], rel=1e-4), key
    for name, g_ref in ref["grads"].items():
        err = (grads[name].double().cpu() - g_ref).abs().max() / g_ref.abs().max()
        assert err <= 1e-4, (name, float(err))
