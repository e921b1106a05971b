"""bf16 logits of our Megatron Qwen3 vs HF transformers, at Qwen3-1.7B shape (GPU).

    python -m benchmarks.model_logits_check --out OUT/logits.json [--tiny]

Both models hold the same bf16 weights (HF random init, copied into Megatron). The reference is
HF in float32 with those same (bf16-rounded) weights, so only compute rounding differs. "Within
bf16 tolerance" means: our error against the fp32 reference is at most twice HF-bf16's own
(max and mean |Δlogit|, plus 1e-3), and the top-1 token agrees with the reference as often as
HF-bf16's does, to within 0.5 percentage points. Variants: Megatron eager (``plain``) and
``fused`` (compiled RMSNorm / RoPE / SwiGLU). Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.model_throughput import _device, hf_model, qwen3_config


def _errors(logits: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (logits.float() - ref).abs()
    return dict(max_abs=diff.max().item(), mean_abs=diff.mean().item(),
                top1_agree=(logits.argmax(-1) == ref.argmax(-1)).float().mean().item())


@torch.no_grad()
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the fused kernels")
    args = p.parse_args(argv)

    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model, fused

    fused.set_compile_backend(args.compile_backend)
    config = qwen3_config(args.tiny)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(2)).to(_device())
    hf16 = hf_model(config, torch.bfloat16).eval()
    state = {k: v.clone() for k, v in hf16.state_dict().items()}
    logits_hf16 = hf16(input_ids=ids).logits
    ref = hf16.float()(input_ids=ids).logits.float()  # same weights, float32 compute
    del hf16
    report = dict(shape=dict(batch=args.batch, seq=args.seq, layers=config.num_hidden_layers,
                             hidden=config.hidden_size, vocab=config.vocab_size),
                  hf_bf16=_errors(logits_hf16, ref), ref_logit_std=ref.std().item())
    del logits_hf16
    positions = torch.arange(args.seq, device=ids.device)[None].expand(args.batch, -1)
    arch = Qwen3Arch.from_hf(config)
    ok = True
    with megatron_session(1, 1):
        for name, options in (("plain", {}), ("fused", {"fused": True})):
            model = build_qwen3_model(arch, dtype=torch.bfloat16, **options).eval()
            load_hf_weights(model, state.__getitem__, arch)
            errs = _errors(model(ids, positions, None), ref)
            hf = report["hf_bf16"]
            errs["within_bf16_tolerance"] = (errs["max_abs"] <= 2 * hf["max_abs"] + 1e-3
                                             and errs["mean_abs"] <= 2 * hf["mean_abs"] + 1e-3
                                             and errs["top1_agree"] >= hf["top1_agree"] - 0.005)
            ok &= errs["within_bf16_tolerance"]
            report[f"mcore_{name}"] = errs
            del model
    report["ok"] = ok
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
