"""What a new sequence length costs PyTorch's attention: the packed step's per-sequence SDPA calls (issue 23).

    python -m benchmarks.sdpa_plans --out runs/sdpa_plans.json            # a GPU: the 1.7B head layout, ~20 s
    python -m benchmarks.sdpa_plans --tiny --out /tmp/sdpa_plans.json     # CPU: the same code, seconds

On an H200 (torch 2.11+cu130) the packed PHF step took 2.5x the time of the packed + budget step that holds the
same samples, run right after it (``BENCHMARKS.md``, issue 23). The suspect: PyTorch on Hopper choosing cuDNN's
attention, whose plans are built per exact sequence length, so the first variant to meet a length pays the build.
Our attention (``models/attention.py``) now leaves cuDNN out (``SDPA_BACKENDS``); this measures the cause
itself, apart from our model: causal GQA attention forward + backward, one sequence at a time, laid out as
``_attend`` sees it (``v`` a view of a fused QKV tensor), over ``--lengths`` lengths never seen before, then the same
lengths again, once with every backend PyTorch has and once with ``SDPA_BACKENDS``. A plan build shows as
``new_s`` far above ``again_s`` in the first row only. Also recorded: torch and cuDNN versions, the device, the
backend order, and the backend PyTorch picks for such a call (``torch._fused_sdp_choice``: 0 math, 1 flash, 2
memory-efficient, 3 cuDNN).

``varlen`` (a GPU only; skipped on CPU with the reason recorded): the model's packed attention both ways,
``SDPACoreAttention`` with ``packed_attention`` ``'sdpa'`` (one causal SDPA call per sequence) and ``'varlen'`` (one
call of PyTorch's varlen flash attention, ``models/varlen.py``), forward + backward on the same lengths packed
``PER_MICROBATCH`` to a micro-batch, ``VARLEN_REPEATS`` times after a warm-up: ms per layer (one layer's attention of
one micro-batch, the median over repeats) each, and their ratio (``sdpa_over_varlen`` > 1: varlen is faster).
``varlen.gqa_without_repeat``: on a torch whose ``varlen_attn`` has no ``enable_gqa`` (2.11, the GPU image's) the
model repeats each key/value head first; this calls it once without the repeat on the first micro-batch and
records whether the kernel takes grouped heads as they are (the largest difference of output and gradients from
the repeated call's, relative to its largest value, or the error it raised) and both times, so a lease can tell
whether the repeat can go.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from phf_megatron.models.attention import SDPA_BACKENDS

#: Qwen3-1.7B's attention (16 query heads, 8 KV heads of 128); ``--tiny``: 4 / 2 heads of 16.
SHAPES = {"1.7b": (16, 8, 128), "tiny": (4, 2, 16)}
#: The varlen comparison: sequences per packed micro-batch (the 1.7B preset's micro_batch_size), timed repeats.
PER_MICROBATCH = 4
VARLEN_REPEATS = 5


def segment(n: int, heads: tuple[int, int, int], device: str, dtype: torch.dtype, grad: bool = False):
    """``q, k, v`` of one packed sequence of ``n`` tokens as ``_attend`` slices them: ``[1, heads, n, d]`` views of
    ``[n, heads, d]`` tensors, ``v`` a slice of a fused QKV projection (not contiguous)."""
    hq, hkv, d = heads
    bhsd = lambda t: t.unsqueeze(1).permute(1, 2, 0, 3)  # noqa: E731  [n, h, d] -> [1, h, n, d]
    q = torch.randn(n, hq, d, device=device, dtype=dtype, requires_grad=grad)
    k = torch.randn(n, hkv, d, device=device, dtype=dtype, requires_grad=grad)
    qkv = torch.randn(n, hkv, 4 * d, device=device, dtype=dtype, requires_grad=grad)
    return bhsd(q), bhsd(k), bhsd(qkv[..., 3 * d:])


def timed(lengths: list[int], heads, device: str, dtype: torch.dtype) -> float:
    """Seconds of causal GQA attention forward + backward at each length, one after the other."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for n in lengths:
        F.scaled_dot_product_attention(*segment(n, heads, device, dtype, grad=True), is_causal=True,
                                       enable_gqa=True).sum().backward()
    sync()
    return time.perf_counter() - start


def measure(backends: list[SDPBackend] | None, base: int, count: int, stride: int, heads, device, dtype) -> dict:
    """New lengths (``base``, ``base + stride``, ...) then the same again, under ``backends`` (None: all)."""
    lengths = [base + stride * i for i in range(count)]
    with sdpa_kernel(backends) if backends else contextlib.nullcontext():
        timed([base - 1], heads, device, dtype)   # (a warm-up at a length not measured)
        new = timed(lengths, heads, device, dtype)
        again = timed(lengths, heads, device, dtype)
    return dict(backends=[b.name for b in backends] if backends else "all", lengths=lengths, new_s=new, again_s=again)


def packed_attention_ms(packed: str, microbatches: list[list[int]], heads, device, dtype) -> float:
    """Median over ``VARLEN_REPEATS`` of one layer's packed attention, forward + backward, per micro-batch (ms), as
    the model runs it (``SDPACoreAttention`` with ``packed_attention=packed``; the per-sequence path reads the bounds
    to the host once per micro-batch, varlen not at all)."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.enums import AttnMaskType

    from benchmarks.shapes import qwen3_shape
    from phf_megatron.models.attention import SDPACoreAttention
    from phf_megatron.models.config import qwen3_transformer_config

    hq, hkv, d = heads
    config = qwen3_transformer_config(qwen3_shape("1.7b", num_attention_heads=hq, num_key_value_heads=hkv, head_dim=d),
                                      dtype=dtype, packed_attention=packed)
    attend = SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal).train()
    calls = []
    for lengths in microbatches:
        cu = torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lengths),
                                 max_seqlen_kv=max(lengths))
        qkv = [x[0].transpose(0, 1) for x in segment(sum(lengths), heads, device, dtype, grad=True)]   # [t, h, d]
        calls.append((qkv, params))

    def run() -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for (q, k, v), params in calls:
            attend(q, k, v, None, packed_seq_params=params).sum().backward()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3 / len(calls)

    run()   # warm-up
    return statistics.median(run() for _ in range(VARLEN_REPEATS))


def gqa_without_repeat(lengths: list[int], heads, device: str, dtype: torch.dtype) -> dict:
    """The installed ``varlen_attn`` on grouped key/value heads as they are, against the model's call that repeats
    them first (``VarlenCall.repeat_kv``), on one packed micro-batch of ``lengths`` (module docstring); ``skipped``
    on a torch that takes ``enable_gqa`` (the model passes it), ``error`` when the kernel refused the grouped heads."""
    from phf_megatron.models import varlen

    hq, hkv, d = heads
    parameters = varlen.varlen_parameters()
    if "enable_gqa" in parameters:
        return dict(skipped="this torch's varlen_attn takes enable_gqa: the model repeats no heads")
    call = varlen.varlen_call(parameters, hq, hkv, d, d ** -0.5, dtype=dtype)
    cu = torch.tensor([0, *lengths], device=device).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lengths), h, d, device=device, dtype=dtype, requires_grad=True) for h in (hq, hkv, hkv))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run(repeat: int) -> tuple[float, list[torch.Tensor]]:
        q.grad = k.grad = v.grad = None
        sync()
        start = time.perf_counter()
        kv = [x.repeat_interleave(repeat, dim=1) if repeat > 1 else x for x in (k, v)]
        out = varlen._varlen_attn()(q, *kv, cu, cu, max(lengths), max(lengths), **call.kwargs)
        out.float().square().sum().backward()
        sync()
        return (time.perf_counter() - start) * 1e3, [out.detach(), q.grad, k.grad, v.grad]

    run(call.repeat_kv)   # warm-up
    repeat_ms, reference = run(call.repeat_kv)
    try:
        run(1)
        native_ms, got = run(1)
    except Exception as err:   # noqa: BLE001 - the kernel's own refusal is the finding
        return dict(lengths=lengths, repeat_ms=repeat_ms, error=f"{type(err).__name__}: {err}"[:500])
    diff = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got, reference))
    return dict(lengths=lengths, repeat_ms=repeat_ms, native_ms=native_ms, max_rel_diff=diff)


def compare_varlen(lengths: list[int], heads, device: str, dtype: torch.dtype) -> dict:
    """Per-sequence SDPA vs varlen flash attention on ``lengths`` (module docstring); ``skipped`` says why not."""
    from phf_megatron.models.varlen import varlen_unavailable

    reason = varlen_unavailable() if device == "cuda" else "a CPU run (--tiny or no GPU): varlen_attn is CUDA only"
    if reason:
        return dict(skipped=reason)
    microbatches = [lengths[i: i + PER_MICROBATCH] for i in range(0, len(lengths), PER_MICROBATCH)]
    ms = {packed: packed_attention_ms(packed, microbatches, heads, device, dtype) for packed in ("sdpa", "varlen")}
    return dict(microbatches=microbatches, repeats=VARLEN_REPEATS, sdpa_per_sequence_ms_per_layer=ms["sdpa"],
                varlen_ms_per_layer=ms["varlen"], sdpa_over_varlen=ms["sdpa"] / ms["varlen"],
                gqa_without_repeat=gqa_without_repeat(microbatches[0], heads, device, dtype))


def attempt(said: dict, measurement, *args) -> dict:
    """``measurement(*args)``, or ``said`` with the ``error`` it raised (its traceback printed): one part's failure
    on a GPU lease leaves the other parts' numbers."""
    try:
        return measurement(*args)
    except Exception as err:   # noqa: BLE001 - recorded, and the benchmark goes on
        traceback.print_exc()
        return {**said, "error": f"{type(err).__name__}: {err}"[:500]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny head layout and short lengths (CPU check)")
    ap.add_argument("--lengths", type=int, default=32, help="new lengths per measurement")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.lengths < 1:
        ap.error(f"--lengths: at least 1 (got {args.lengths}; each measurement times that many new lengths)")
    cuda = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    heads = SHAPES["tiny" if args.tiny else "1.7b"]
    base = 37 if args.tiny else 700
    choice = None
    if cuda:   # (the choice first: PyTorch settles its backend order, cuDNN first or not, at the first choice)
        choice = int(torch._fused_sdp_choice(*segment(base, heads, device, dtype), is_causal=True, enable_gqa=True))
    out = dict(torch=torch.__version__, cudnn=torch.backends.cudnn.version(), device=torch.cuda.get_device_name()
               if cuda else "cpu", dtype=str(dtype), heads=heads, default_choice=choice,
               priority=[str(b) for b in getattr(torch._C, "_get_sdp_priority_order", list)()] if cuda else None)

    def save() -> None:   # after each part: a later part that fails or is cut keeps the earlier ones
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(out, indent=1))

    out["runs"] = [attempt(dict(backends=names), measure, backends, start, args.lengths, 7, heads, device, dtype)
                   for names, backends, start in (("all", None, base), ([b.name for b in SDPA_BACKENDS],
                                                                       SDPA_BACKENDS, base + 1))]
    for r in out["runs"]:
        print(f"backends {r['backends']}: " + (f"error ({r['error']})" if "error" in r else
              f"{args.lengths} new lengths {r['new_s']:.3f} s, the same again {r['again_s']:.3f} s"), flush=True)
    save()
    lengths = [base + 1 + 7 * i for i in range(args.lengths)]   # (the second run's)
    out["varlen"] = v = attempt({}, compare_varlen, lengths, heads, device, dtype)
    print(f"varlen: skipped ({v['skipped']})" if "skipped" in v else f"varlen: error ({v['error']})" if "error" in v
          else f"packed attention per layer and micro-batch, forward + backward: per-sequence SDPA "
               f"{v['sdpa_per_sequence_ms_per_layer']:.3f} ms, varlen {v['varlen_ms_per_layer']:.3f} ms, "
               f"ratio {v['sdpa_over_varlen']:.2f}", flush=True)
    save()
    return out


if __name__ == "__main__":
    main()
