"""``PhfStep`` refuses configurations it cannot serve, with errors that name the culprit."""

from types import SimpleNamespace

import pytest
import torch

from phf_megatron.objectives import ObjectiveConfig
from phf_megatron.parallel import PhfStep
from phf_megatron.parallel.capture import WindowCapture

from .reference import microbatches


def _config(**kw):
    base = dict(num_layers=4, hidden_size=64, sequence_parallel=False, pipeline_dtype=torch.bfloat16,
                params_dtype=torch.bfloat16, calculate_per_token_loss=True, context_parallel_size=1)
    return SimpleNamespace(**{**base, **kw})


def test_context_parallelism_is_refused():
    with pytest.raises(ValueError, match="context_parallel_size"):
        PhfStep(ObjectiveConfig(flow_variant="none"), _config(context_parallel_size=2), tp_group=None, dp_group=None)


def test_flow_without_capture_hooks_is_refused():
    with pytest.raises(ValueError, match="student_capture/teacher_capture"):
        PhfStep(ObjectiveConfig(), _config(), tp_group=None, dp_group=None)


def test_student_pass_before_prepare_is_refused():
    step = PhfStep(ObjectiveConfig(flow_variant="none"), _config(), tp_group=None, dp_group=None)
    with pytest.raises(RuntimeError, match="prepare"):
        step.student_forward_step(iter(microbatches(256)), model=None)


def test_plan_and_stats_rows_follow_the_objective():
    hooks = WindowCapture([])
    phf = PhfStep(ObjectiveConfig(), _config(), tp_group=None, dp_group=None, student_capture=hooks, teacher_capture=hooks)
    assert phf.plan.pairs == ((0, 1), (1, 2), (2, 3)) and phf.num_values == 1 + 4 + 3
    with pytest.raises(RuntimeError, match=r"^PhfStep.prepare\(microbatches\) must run before student_seq_length"):
        phf.student_seq_length(16)   # the stats rows are sized by the step's micro-batches
    local = PhfStep(ObjectiveConfig(flow_variant="local", flow_layers=(1, 2)), _config(), tp_group=None, dp_group=None,
                    student_capture=hooks, teacher_capture=hooks)
    assert local.plan.layers == (1, 2) and local.plan.pairs == ()  # no adjacent term: no boundary capture
    opsd = PhfStep(ObjectiveConfig(flow_variant="none"), _config(), tp_group=None, dp_group=None)
    assert opsd.plan is None and opsd.student_seq_length(16) == 16
    norm = phf.prepare(microbatches(256, num_micro=2))
    assert (norm.num_tokens, phf.conventions.num_microbatches, phf.conventions.dp_size) == (46, 2, 1)
    assert phf.num_stats_rows == 1 and phf.student_seq_length(16) == 17


def test_student_pass_without_the_teacher_pass_is_refused():
    step = PhfStep(ObjectiveConfig(flow_variant="none"), _config(), tp_group=None, dp_group=None)
    mbs = microbatches(256)
    step.prepare(mbs)
    last_stage = SimpleNamespace(pre_process=True, post_process=True)
    with pytest.raises(RuntimeError, match="teacher logits: missing"):
        step.student_forward_step(iter(mbs), model=last_stage)
