"""Rank-side helpers of the distributed PHF tests: build the models, run one step, collect grads.

Every layout runs Megatron-Core's own pieces: ``initialize_model_parallel``, ``GPTModel`` from
our provider with HF weights loaded by the converter, ``DistributedDataParallel`` +
``finalize_model_grads`` (DP reduction, tied-embedding and SP-norm all-reduces), and
``get_forward_backward_func`` (no pipelining, 1F1B, or interleaved 1F1B).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..helpers.spawn import megatron_layout


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    sp: bool = False
    vpp: int | None = None
    num_micro: int = 1
    recompute: bool = False
    per_token_loss: bool = True
    overrides: dict = field(default_factory=dict)
    step_options: dict = field(default_factory=dict)
    """Extra ``PhfStep`` keyword arguments (e.g. ``score_rows_only=False``)."""
    packed: bool = False
    """Micro-batches packed into one row (``parallel.layout``; the methods that support it)."""
    max_tokens: int | None = None
    """With ``packed``: micro-batches by the token-budget plan (``training.microbatch_plan``) instead of
    ``num_micro`` contiguous ones (the methods that support it)."""

    def config_overrides(self) -> dict:
        out = dict(calculate_per_token_loss=self.per_token_loss, **self.overrides)
        if self.vpp:
            out["virtual_pipeline_model_parallel_size"] = self.vpp
        if self.recompute:
            out.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        return out


def init_layout(layout: Layout, seed: int = 1234) -> None:
    megatron_layout(layout.tp, layout.pp, seed, vpp=layout.vpp)


def build_chunks(hf, layout: Layout, ddp: bool, **extra) -> list:
    """This rank's model chunks (one per virtual stage) with ``hf``'s weights, DDP-wrapped if asked."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model

    state, arch = hf.state_dict(), Qwen3Arch.from_hf(hf.config)
    chunks = []
    for vp in range(layout.vpp or 1):
        model = build_qwen3_model(hf.config, sp=layout.sp, dtype=torch.float32,
                                  vp_stage=vp if layout.vpp else None, **layout.config_overrides(), **extra)
        load_hf_weights(model, state.__getitem__, arch)
        if ddp:
            model.config.finalize_model_grads_func = finalize_model_grads
            model = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
        chunks.append(model)
    return chunks


def run_step(step, student, teacher, mbs, *, forward_only_student: bool = False):
    """Teacher pass (no grad) then student pass through Megatron's schedule; returns the logs."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    n = len(student)
    fb = get_forward_backward_func()
    step.prepare(mbs)
    b = mbs[0].batch_size
    with torch.no_grad():
        fb(forward_step_func=step.teacher_forward_step, data_iterator=[iter(mbs) for _ in range(n)] if n > 1 else iter(mbs),
           model=teacher, num_microbatches=len(mbs), seq_length=mbs[0].teacher_tokens.shape[1],
           micro_batch_size=b, forward_only=True)
    for chunk in student:
        chunk.zero_grad_buffer()
    logs = fb(forward_step_func=step.student_forward_step, data_iterator=[iter(mbs) for _ in range(n)] if n > 1 else iter(mbs),
              model=student, num_microbatches=len(mbs), seq_length=step.student_seq_length(mbs[0].student_tokens.shape[1]),
              micro_batch_size=b, forward_only=forward_only_student)
    step.finish()
    return logs


def hf_grads(chunks, arch) -> dict[str, torch.Tensor]:
    """HF-named full gradients of this pipeline stage (TP shards gathered, mapping inverted).

    Every TP rank must call it (one all-gather per sharded tensor).
    """
    from megatron.core import parallel_state

    from phf_megatron.convert.live_model import global_name
    from phf_megatron.models import unwrap
    from phf_megatron.convert.qwen3_mapping import mcore_to_hf
    from phf_megatron.convert.sharding import tp_merge

    tp_group = parallel_state.get_tensor_model_parallel_group()
    tp = dist.get_world_size(tp_group)
    out = {}
    for chunk in chunks:
        for name, param in unwrap(chunk).named_parameters():
            full = global_name(chunk, name)
            if full == "output_layer.weight" and arch.tie_word_embeddings:
                continue
            grad = param.main_grad.detach().clone()
            if tp > 1 and getattr(param, "tensor_model_parallel", False):
                shards = [torch.empty_like(grad) for _ in range(tp)]
                dist.all_gather(shards, grad.contiguous(), group=tp_group)
                grad = tp_merge(full, shards)
            for hf_name, tensor in mcore_to_hf(full, grad, arch):
                out[hf_name] = tensor
    return out


def merge_rank_results(per_rank: list[dict], merged: dict | None = None) -> dict:
    """``{key: {"metrics", "grads"}}`` from every rank's results: the metrics of the rank that has them
    (the last stage), the gradients of every stage."""
    merged = {} if merged is None else merged
    for rank_out in per_rank:
        for key, res in rank_out.items():
            m = merged.setdefault(key, dict(metrics=None, grads={}))
            m["metrics"] = m["metrics"] or res["metrics"]
            m["grads"].update(res["grads"])
    return merged


def assert_grads_close(grads: dict, ref_grads: dict, rel_tol: float) -> None:
    """The same parameters, each with ``max|g - g_ref| <= rel_tol * max|g_ref|``."""
    assert set(grads) == set(ref_grads)
    bad = {}
    for name, g_ref in ref_grads.items():
        err = (grads[name].double() - g_ref).abs().max() / g_ref.abs().max()
        if not err <= rel_tol:
            bad[name] = float(err)
    assert not bad, f"relative gradient error above {rel_tol}: {bad}"
