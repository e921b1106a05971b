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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from phf_megatron.models.attention import SDPA_BACKENDS

#: Qwen3-1.7B's attention (16 query heads, 8 KV heads of 128); ``--tiny``: 4 / 2 heads of 16.
SHAPES = {"1.7b": (16, 8, 128), "tiny": (4, 2, 16)}


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
               priority=[str(b) for b in getattr(torch._C, "_get_sdp_priority_order", list)()] if cuda else None,
               runs=[measure(None, base, args.lengths, 7, heads, device, dtype),
                     measure(SDPA_BACKENDS, base + 1, args.lengths, 7, heads, device, dtype)])
    for r in out["runs"]:
        print(f"backends {r['backends']}: {args.lengths} new lengths {r['new_s']:.3f} s, the same again "
              f"{r['again_s']:.3f} s", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
