"""The training part of one OPSD step as the official code computes it, beside ours, on one batch.

    python -m benchmarks.opsd_reference_step OUTDIR --shapes 1.7b 8b     # GPU: both shapes, ~5 min
    python -m benchmarks.opsd_reference_step OUTDIR --tiny               # CPU smoke run + loss agreement

Three steps on the same batch (``phf_step.make_batch``: prompt 256, reference 512, rollouts of
1024/1024/896/768 tokens; the same random-init weights, LoRA r=64 / alpha=128 on the seven
projections, adapters zero-initialised, AdamW lr 5e-6 on the adapters):

* ``reference`` — official-style (OPSD ``opsd_trainer.py`` with ``--fixed_teacher``): HF
  transformers + PEFT; the teacher is the same model on the privileged sequence with the adapters
  disabled, no grad; the student forward + backward; full-vocabulary logits at every position,
  sliced to the rollout tokens; the generalized JSD (beta 0.5, temperature 1.1) with the
  per-element clip over the full vocabulary (``objectives.opsd_loss``, the official formula);
  ``torch.optim.AdamW``.
* ``ours_opsd`` — our Megatron-Core step (``parallel.PhfStep``, flow off) through Megatron's
  schedule, same LoRA, same AdamW;
* ``ours_phf`` — the same plus window capture at every layer and alpha x the flow loss.

Per step kind: median step time (teacher + student + optimizer), rollout tokens per second,
MFU and peak memory. MFU counts the FLOPs of what is computed, the same for all three: teacher
forward and student forward + backward through the frozen layers (activation gradients only),
attention (causal), the LM head at the scored rows, and LoRA (forward both, backward student).
Peak = the H100's 989 TFLOP/s dense bf16 (``--peak-tflops``). The variants run one after the
other in one process; each model is freed before the next is built, so each peak memory is its own.

``checks`` (fp32 on CPU, bf16 on GPU): our OPSD-only loss equals the reference's on the same
weights and batch (the adapters start at zero, so the teacher is the base model in both), and
our PHF step's JSD part equals it too. Writes ``OUTDIR/opsd_reference_step.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch

from benchmarks.phf_step import StepRunner, make_batch
from benchmarks.shapes import hf_config, qwen3_shape

SHAPES = ("1.7b", "8b", "tiny")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_peak() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None


def step_flops(shape: dict, mb, lora_rank: int) -> float:
    """Model FLOPs of one step (see the module docstring), on the padded batch all three compute."""
    h, f, layers, v = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["vocab_size"]
    nh, nkv, hd = shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"]
    b, ts, tt = mb.batch_size, mb.student_tokens.shape[1], mb.teacher_tokens.shape[1]
    rows = int(mb.student_response.sum())
    dims = [(h, nh * hd), (h, nkv * hd), (h, nkv * hd), (nh * hd, h), (h, f), (h, f), (f, h)]   # (in, out)
    dense = 2 * layers * sum(i * o for i, o in dims)                  # per token, forward
    lora = 2 * layers * sum(lora_rank * (i + o) for i, o in dims)
    attn = lambda t: 2 * layers * nh * hd * t * t                     # causal QK^T + PV per sequence (4 t^2 d / 2)
    head = 2 * h * v * rows
    teacher = b * (tt * (dense + lora) + attn(tt)) + head
    student_fwd = b * (ts * (dense + lora) + attn(ts)) + head
    student_bwd = b * (ts * (dense + 2 * lora) + 2 * attn(ts)) + head  # activation grads + adapter grads
    return float(teacher + student_fwd + student_bwd)


# ----------------------------------------------------------------- the official-style step

def build_reference(shape: dict, state: dict, dtype, device, lora_rank: int, checkpointing: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3ForCausalLM

    cfg = hf_config(shape)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    model.load_state_dict(state, strict=False)
    if shape.get("tie_word_embeddings"):
        model.tie_weights()
    model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                             target_modules=list(PROJECTIONS), task_type="CAUSAL_LM"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    return model


def reference_step(model, optimizer, mb, objective) -> dict:
    """Teacher (adapters off, no grad) → student fwd + bwd → clipped JSD over the full vocabulary → AdamW."""
    from phf_megatron.objectives import opsd_loss

    t0 = time.perf_counter()
    with torch.no_grad(), model.disable_adapter():
        t_logits = model(input_ids=mb.teacher_tokens).logits
    _sync()
    t1 = time.perf_counter()
    s_logits = model(input_ids=mb.student_tokens).logits
    n = int(mb.student_response.sum(1).max())
    s_rows, t_rows, mask = [], [], []
    for b in range(mb.batch_size):   # logits at position t predict token t + 1: shift onto the rollout
        si = mb.student_response[b].nonzero().flatten() - 1
        ti = mb.teacher_response[b].nonzero().flatten() - 1
        pad = n - len(si)
        s_rows.append(torch.cat([s_logits[b, si], s_logits.new_zeros(pad, s_logits.shape[-1])]))
        t_rows.append(torch.cat([t_logits[b, ti], t_logits.new_zeros(pad, t_logits.shape[-1])]))
        mask.append(torch.arange(n, device=si.device) < len(si))
    o = objective
    loss = opsd_loss(torch.stack(s_rows).float(), torch.stack(t_rows).float(), torch.stack(mask), o.jsd_beta,
                     o.jsd_temperature, o.jsd_clip, o.jsd_clip_mode)
    loss.backward()
    _sync()
    t2 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync()
    t3 = time.perf_counter()
    return dict(step_s=t3 - t0, teacher_s=t1 - t0, student_s=t2 - t1, optimizer_s=t3 - t2, loss=loss.item())


# ----------------------------------------------------------------- ours

def build_ours(shape: dict, state: dict, dtype, lora_rank: int, recompute: bool, fused: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.lora import LoraConfig, apply_lora
    from phf_megatron.lora.inject import adapter_parameters
    from phf_megatron.models import build_qwen3_model
    from phf_megatron.training.model_setup import _let_recompute_reach_the_adapters

    options = dict(fused=True) if fused else {}
    if recompute:
        options.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    hf_cfg = hf_config(shape)
    model = build_qwen3_model(hf_cfg, dtype=dtype, calculate_per_token_loss=True, **options)
    load_hf_weights(model, state.__getitem__, Qwen3Arch.from_hf(hf_cfg))
    apply_lora(model, LoraConfig(r=lora_rank, alpha=2.0 * lora_rank, dropout=0.0), seed=0)
    if recompute:
        _let_recompute_reach_the_adapters(model)
    model.config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    params = [p for _, p in adapter_parameters(model)]
    return ddp.train(), params


def ours_step(runner: StepRunner, step, optimizer) -> dict:
    t0 = time.perf_counter()
    res = runner.step(step)
    t1 = time.perf_counter()
    for p in optimizer.param_groups[0]["params"]:   # DDP's float32 main_grad, cast first: a bf16 tensor refuses
        g = getattr(p, "main_grad", None)            # a float32 .grad (torch >= 2.11, seen on the H100)
        g = p.grad if g is None else g
        p.grad = g.to(p.dtype) if g is not None else None
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync()
    t2 = time.perf_counter()
    return dict(step_s=t2 - t0, teacher_s=res["teacher"]["wall_s"], student_s=res["student"]["wall_s"],
                optimizer_s=t2 - t1, loss=res["metrics"]["loss"], opsd=res["metrics"]["loss_opsd"],
                flow=res["metrics"]["loss_flow"])


# ----------------------------------------------------------------- one shape

def _summary(runs: list[dict], flops: float, tokens: int, peak_tflops: float, peak_gib) -> dict:
    step = statistics.median(r["step_s"] for r in runs)
    return {"step_s_median": step, "teacher_s_median": statistics.median(r["teacher_s"] for r in runs),
            "student_s_median": statistics.median(r["student_s"] for r in runs),
            "optimizer_s_median": statistics.median(r["optimizer_s"] for r in runs),
            "tokens_per_s": tokens / step, "mfu": flops / step / (peak_tflops * 1e12), "peak_mem_gib": peak_gib,
            "first_loss": runs[0]["loss"], "step_s": [r["step_s"] for r in runs]}


def run_shape(name: str, args) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from transformers import Qwen3ForCausalLM

    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.objectives import ObjectiveConfig
    from phf_megatron.parallel import PhfStep, WindowCapture

    gpu = torch.cuda.is_available() and name != "tiny"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if gpu else torch.float32
    shape = qwen3_shape(name)
    big = name == "8b"
    recompute = big if args.recompute is None else args.recompute
    torch.manual_seed(0)
    with torch.device("cpu"):   # the shared random init, kept on the host while each variant runs
        init = Qwen3ForCausalLM(hf_config(shape)).to(dtype)
    state = {k: v.contiguous() for k, v in init.state_dict().items()}
    del init
    if name == "tiny":
        mb = make_batch(shape["vocab_size"], 8, 6, [12, 10, 7, 3], args.window, device)
    else:
        mb = make_batch(shape["vocab_size"], 256, 512, [1024, 1024, 896, 768], args.window, device)
    tokens = int(mb.student_response.sum())
    flops = step_flops(shape, mb, args.lora_rank)
    objective = ObjectiveConfig(flow_window=args.window)
    out = {"shape": name, "dtype": str(dtype), "batch": mb.batch_size, "student_seq": mb.student_tokens.shape[1],
           "teacher_seq": mb.teacher_tokens.shape[1], "rollout_tokens": tokens, "step_tflop": flops / 1e12,
           "recompute": recompute, "lora_rank": args.lora_rank}

    _reset_peak()
    ref = build_reference(shape, {k: v.to(device) for k, v in state.items()}, dtype, device, args.lora_rank, recompute)
    opt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=args.lr)
    runs = [reference_step(ref, opt, mb, objective) for _ in range(args.warmup + args.steps)]
    out["reference"] = _summary(runs[args.warmup:], flops, tokens, args.peak_tflops, _peak_gib())
    out["reference"]["first_loss"] = runs[0]["loss"]
    del ref, opt, runs
    _reset_peak()

    with megatron_session(1, 1):
        model, params = build_ours(shape, state, dtype, args.lora_rank, recompute, fused=gpu)
        capture = WindowCapture(model)
        groups = dict(tp_group=ps.get_tensor_model_parallel_group(), dp_group=ps.get_data_parallel_group())
        steps = {"ours_opsd": PhfStep(ObjectiveConfig(flow_variant="none"), model.config, **groups),
                 "ours_phf": PhfStep(objective, model.config, **groups, student_capture=capture, teacher_capture=capture)}
        runner = StepRunner(model, mb, get_forward_backward_func())
        for kind, step in steps.items():   # each from the same zero adapters: a fresh optimizer and adapter state
            snapshot = [p.detach().clone() for p in params]
            opt = torch.optim.AdamW(params, lr=args.lr)
            _reset_peak()
            runs = [ours_step(runner, step, opt) for _ in range(args.warmup + args.steps)]
            out[kind] = _summary(runs[args.warmup:], flops, tokens, args.peak_tflops, _peak_gib())
            out[kind].update(first_loss=runs[0]["loss"], first_opsd=runs[0]["opsd"], first_flow=runs[0]["flow"])
            with torch.no_grad():
                for p, s in zip(params, snapshot):
                    p.copy_(s)
            del opt
        capture.remove()
        del model, params
    _reset_peak()
    ref_loss = out["reference"]["first_loss"]
    rel = lambda a: abs(a - ref_loss) / max(abs(ref_loss), 1e-30)
    out["checks"] = {"ours_opsd_vs_reference_rel": rel(out["ours_opsd"]["first_loss"]),
                     "ours_phf_jsd_vs_reference_rel": rel(out["ours_phf"]["first_opsd"]),
                     "ours_phf_loss_minus_jsd": out["ours_phf"]["first_loss"] - out["ours_phf"]["first_opsd"]}
    out["ratios"] = {f"{k}_tokens_per_s_over_reference": out[k]["tokens_per_s"] / out["reference"]["tokens_per_s"]
                     for k in ("ours_opsd", "ours_phf")}
    if out["reference"]["peak_mem_gib"]:
        out["ratios"].update({f"{k}_peak_mem_over_reference": out[k]["peak_mem_gib"] / out["reference"]["peak_mem_gib"]
                              for k in ("ours_opsd", "ours_phf")})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--shapes", nargs="+", default=["1.7b"], choices=sorted(SHAPES))
    p.add_argument("--tiny", action="store_true", help="--shapes tiny (CPU smoke run)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--lora-rank", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-6)
    p.add_argument("--recompute", action=argparse.BooleanOptionalAction, default=None,
                   help="activation recompute / gradient checkpointing in both (default: at 8B only)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="default: bfloat16 on a GPU, float32 for --tiny / on CPU")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100 SXM)")
    args = p.parse_args(argv)
    if args.tiny:
        args.shapes = ["tiny"]
    os.makedirs(args.out_dir, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "args": vars(args), "shapes": {}}
    ok = True
    for name in args.shapes:
        try:
            result["shapes"][name] = run_shape(name, args)
        except Exception as e:  # noqa: BLE001 - unattended: keep the error, go on with the next shape
            ok = False
            result["shapes"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        print(json.dumps({name: {k: v for k, v in result["shapes"][name].items() if k != "traceback"}}, default=str),
              flush=True)
        with open(os.path.join(args.out_dir, "opsd_reference_step.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
