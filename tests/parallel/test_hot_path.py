"""The hot path of a PHF step (teacher pass, student forward + backward, loss) on CPU, audited.

A tiny Qwen3 (4 layers) through Megatron's schedule, once as an OPSD step (no flow) and once
as a PHF step, after a warm-up step of each (and, for the host-sync audit, with the official
options ``top_k_loss`` and ``use_tinker_loss`` and on a step that collects the loss by token):

* no call from phf_megatron inside the passes makes the host wait for the device (on CUDA:
  ``.item()``, ``bool(tensor)``, ``nonzero``, boolean-mask indexing, ``.tolist()``, ...);
  ``PhfStep.prepare`` (one all-reduce and its counts, before the passes) and ``reduce_logs``
  (after the step) are outside the hot path by design;
* what PHF adds to the aten ops of each pass (about the kernels it launches on a GPU): the
  teacher's capture is one gather per layer plus a constant; the student's capture, flow and
  its backward stay a small number per layer (no per-layer kernel storm).
"""

import os

import pytest
import torch

from ..helpers.tiny_qwen3 import tiny_hf_model
from . import reference
from .harness import Layout, build_chunks
from .hot_path_audit import HostSyncAudit, OpCount
from .phf_ranks import VARIANTS, VOCAB

LAYERS = 4


def _pass(fb, step_fn, model, mbs, seq_length, forward_only):
    audit, ops = HostSyncAudit(), OpCount()
    with audit, ops:
        fb(forward_step_func=step_fn, data_iterator=iter(mbs), model=model, num_microbatches=len(mbs),
           seq_length=seq_length, micro_batch_size=mbs[0].batch_size, forward_only=forward_only)
    return audit, ops


@pytest.fixture(scope="module")
def audited():
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.objectives import ObjectiveConfig
    from phf_megatron.parallel import PhfStep, WindowCapture

    out, environ = {}, dict(os.environ)  # megatron_session leaves its rendezvous variables behind
    with megatron_session(1, 1):
        model = build_chunks(tiny_hf_model("gqa", seed=0), Layout(num_micro=2), ddp=True)
        capture = WindowCapture(model)
        groups = dict(tp_group=ps.get_tensor_model_parallel_group(), dp_group=ps.get_data_parallel_group())
        steps = {"opsd": PhfStep(ObjectiveConfig(flow_variant="none"), model[0].config, **groups),
                 "phf": PhfStep(VARIANTS["phf"], model[0].config, student_capture=capture, teacher_capture=capture,
                                **groups),
                 "top_k": PhfStep(ObjectiveConfig(flow_variant="none", top_k_loss=7), model[0].config, **groups),
                 "tinker": PhfStep(ObjectiveConfig(flow_variant="none", use_tinker_loss=True, jsd_clip=None),
                                   model[0].config, **groups),
                 "loss_tokens": PhfStep(VARIANTS["phf"], model[0].config, student_capture=capture,
                                        teacher_capture=capture, **groups)}
        steps["loss_tokens"].collect_loss_tokens = True
        fb = get_forward_backward_func()
        for repeat in range(2):  # the first round warms up
            for kind, step in steps.items():
                mbs = reference.microbatches(VOCAB, num_micro=2)
                step.prepare(mbs)
                with torch.no_grad():
                    teacher = _pass(fb, step.teacher_forward_step, model, mbs, mbs[0].teacher_tokens.shape[1], True)
                model[0].zero_grad_buffer()
                student = _pass(fb, step.student_forward_step, model, mbs,
                                step.student_seq_length(mbs[0].student_tokens.shape[1]), False)
                step.finish()
                out[kind] = dict(teacher=teacher, student=student, micro=len(mbs))
        capture.remove()
    os.environ.clear()
    os.environ.update(environ)
    return out


@pytest.mark.parametrize("kind", ["opsd", "phf", "top_k", "tinker", "loss_tokens"])
@pytest.mark.parametrize("phase", ["teacher", "student"])
def test_no_host_sync_from_our_code_in_the_passes(audited, kind, phase):
    audit, _ = audited[kind][phase]
    assert not audit.ours, dict(audit.ours)


def test_phf_adds_a_few_ops_per_layer(audited):
    micro = audited["phf"]["micro"]
    extra = {phase: (audited["phf"][phase][1].total - audited["opsd"][phase][1].total) / micro
             for phase in ("teacher", "student")}
    # Teacher: one index_select per layer + the session's index (arange, sub, clamp, mul, add,
    # empty) and the logit rows' bookkeeping; student: that, the flow's forward and backward
    # (eager equations on CPU: a fixed count, not per layer) and one index_add per layer backward.
    assert extra["teacher"] <= LAYERS + 12, extra
    assert extra["student"] <= 4 * LAYERS + 200, extra
