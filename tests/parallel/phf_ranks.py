"""What each spawned rank runs for ``test_phf_step.py``: several layouts and variants per spawn.

For every layout the rank builds the student (DDP) and the teacher from the tiny HF models,
then for every objective variant runs one PHF step through Megatron's schedule and returns
(from the ranks that hold them) the step metrics, the HF-named gradients of its stage, the size
of every teacher capture, and how often the student's layers ran (2x under recomputation).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from phf_megatron.objectives import ObjectiveConfig

from ..helpers.tiny_qwen3 import tiny_hf_model
from . import reference
from .harness import Layout, build_chunks, hf_grads, init_layout, run_step

VOCAB = 256
BASE = dict(flow_alpha=0.5, jsd_temperature=1.1, jsd_beta=0.5, jsd_clip=0.05)
VARIANTS = {
    "phf": ObjectiveConfig(flow_variant="phf", **BASE),
    "local": ObjectiveConfig(flow_variant="local", **{**BASE, "jsd_clip": 0.17, "jsd_clip_mode": "token"}),
    "direction": ObjectiveConfig(flow_variant="direction", **{**BASE, "jsd_beta": 1.0, "jsd_clip": None}),
    "geometry": ObjectiveConfig(flow_variant="geometry", **{**BASE, "jsd_beta": 0.0}),
    "selected": ObjectiveConfig(flow_variant="phf", flow_layers=(1, 2), **BASE),
    "opsd": ObjectiveConfig(flow_variant="none", **BASE),
}
STUDENT_SEED, TEACHER_SEED = 0, 1


def run_layouts(rank, world_size, plans, with_collectives=False, variants_table=None, collect_loss_tokens=False):
    """``plans``: list of ``(layout_name, Layout, model_name, [variant names])``.

    ``with_collectives`` also runs ``tp2_collectives`` first (its errors under key "collectives").
    ``variants_table``: the objectives by variant name (default ``VARIANTS``); ``collect_loss_tokens``:
    the steps also collect the loss by rollout token id.
    """
    from megatron.core import parallel_state as ps

    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.parallel.capture import WindowCapture, chunk_layer_range, transformer_layers
    from phf_megatron.parallel.step import PhfStep

    out = {"collectives": tp2_collectives(rank, world_size)} if with_collectives else {}
    for layout_name, layout, model_name, variants in plans:
        init_layout(layout)
        hf_s, hf_t = tiny_hf_model(model_name, seed=STUDENT_SEED), tiny_hf_model(model_name, seed=TEACHER_SEED)
        student = build_chunks(hf_s, layout, ddp=True)
        teacher = build_chunks(hf_t, layout, ddp=False)
        arch = Qwen3Arch.from_hf(hf_s.config)
        captures = WindowCapture(student), WindowCapture(teacher)
        calls = [0]
        for chunk in student:
            for layer in transformer_layers(chunk):
                layer.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
        dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        reporter = ps.get_tensor_model_parallel_rank() == 0 and dp_rank == 0
        for variant in variants:
            mbs = reference.microbatches(VOCAB, dp_rank, dp, layout.num_micro, layout.packed,
                                         layout.tp if layout.sp else 1, layout.max_tokens)
            step = PhfStep((variants_table or VARIANTS)[variant], student[0].config,
                           tp_group=ps.get_tensor_model_parallel_group(), dp_group=ps.get_data_parallel_group(),
                           student_capture=captures[0], teacher_capture=captures[1], **layout.step_options)
            step.collect_loss_tokens = collect_loss_tokens
            calls[0] = 0
            logs = run_step(step, student, teacher, mbs)
            metrics = step.reduce_logs(logs) if ps.is_pipeline_last_stage(ignore_virtual=True) else None
            grads = hf_grads(student, arch)
            sizes = {}
            for chunk in teacher:
                first, stop = chunk_layer_range(chunk)
                sizes[(first, stop)] = [tuple(mb.teacher_out[first].shape) if first in mb.teacher_out else None
                                        for mb in mbs]
            if reporter:
                out[(layout_name, variant)] = dict(metrics=metrics, grads=grads, capture_shapes=sizes,
                                                   window=[tuple(mb.teacher_window.shape) for mb in mbs],
                                                   layer_calls=calls[0])
        captures[0].remove()
        captures[1].remove()
    return out


def tp2_collectives(rank, world_size):
    """The TP=2 pieces on their own: vocabulary-parallel JSD and the SP window-row gather."""
    from megatron.core import parallel_state as ps

    from phf_megatron.objectives.opsd import opsd_token_divergence
    from phf_megatron.parallel.vocab_parallel_jsd import vocab_parallel_jsd
    from phf_megatron.parallel.window_rows import gather_window_rows

    init_layout(Layout(tp=2))
    group, r = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
    g = torch.Generator().manual_seed(0)
    errors = {}
    # JSD: the same full logits on both ranks, each keeps its half of the vocabulary.
    zs = torch.randn(3, 6, 50, generator=g, dtype=torch.float64) * 2
    zt = torch.randn(3, 6, 50, generator=g, dtype=torch.float64) * 2
    mask = torch.rand(3, 6, generator=g) > 0.3
    idx = mask.flatten().nonzero().flatten()
    for beta, clip, mode in ((0.5, 0.02, "element"), (0.0, 0.3, "token"), (1.0, None, "element")):
        full = zs.clone().requires_grad_()
        ref = opsd_token_divergence(full, zt, beta, 1.1, clip, mode)[mask]
        (ref_grad,) = torch.autograd.grad(ref.sum(), full)
        shard = zs[..., 25 * r: 25 * (r + 1)].clone().requires_grad_()
        out = vocab_parallel_jsd(shard, zt[..., 25 * r: 25 * (r + 1)].reshape(-1, 25)[idx], idx, beta, 1.1, clip, mode,
                                 tp_group=group, chunk_elements=60)
        (grad,) = torch.autograd.grad(out.sum(), shard)
        errors[f"jsd_{beta}_{mode}"] = max((out - ref).abs().max().item(),
                                           (grad - ref_grad[..., 25 * r: 25 * (r + 1)]).abs().max().item())
    # Window rows under SP: rank r holds sequence rows [8 r, 8 r + 8).
    hidden = torch.randn(16, 3, 4, generator=g, dtype=torch.float64)
    positions = torch.tensor([[0, 7, 8, 15], [9, 10, 11, 11], [2, 3, 4, 5]])
    shard = hidden[8 * r: 8 * (r + 1)].clone().requires_grad_()
    rows = gather_window_rows(shard, positions, group, sequence_parallel=True)
    weights = torch.randn(3, 4, 4, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad((rows * weights).sum(), shard)
    full = hidden.clone().requires_grad_()
    expected = torch.stack([full[positions[b], b] for b in range(3)])
    (full_grad,) = torch.autograd.grad((expected * weights).sum(), full)
    errors["window_rows"] = max((rows - expected).abs().max().item(),
                                (grad - full_grad[8 * r: 8 * (r + 1)]).abs().max().item())
    dist.barrier()
    return errors
