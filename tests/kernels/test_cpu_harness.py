"""The real ``csrc/`` kernel sources, compiled as host code and run on the CPU (any machine with
g++ and the CUDA headers; skipped elsewhere).

``cpu_harness/`` runs each CTA's threads (512, or 256 for the finalize kernel) as std::threads
with real barriers and warp exchanges, and stands in for ``ldmatrix`` / ``mma.sync`` lane by
lane with the fragment layouts of the PTX ISA (bf16 and TF32 operands, accumulation rounded
toward zero as on the tensor cores), checking 16-byte alignment, shared-memory bounds and that
TF32 operands were rounded. The binary is built with AddressSanitizer and UBSan, the workspace
and each launch's dynamic shared memory are sized exactly (and start as NaN), so out-of-bounds
indexing fails here rather than on the GPU. Outputs start as NaN. What this cannot show: races
between warps that the barriers would hide, the hardware's exact rounding, GPU timing.
"""

import hashlib
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from phf_megatron.kernels.flow_cuda import KernelPlan, precision_mode
from phf_megatron.objectives.flow import LayerPlan, flow_terms

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent / "cpu_harness"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
EPS = 1e-6
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
RAW = {torch.float32: torch.float32, torch.float16: torch.int16, torch.bfloat16: torch.int16}

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or not (CUDA_INCLUDE / "cuda_fp16.h").exists(),
    reason="needs g++ and the CUDA headers (cuda_fp16.h) to compile the kernels as host code",
)


@pytest.fixture(scope="module")
def harness() -> Path:
    sources = sorted((ROOT / "csrc").glob("*")) + sorted(HARNESS.glob("*"))
    digest = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:12]
    out_dir = Path.home() / ".cache" / "phf_megatron" / "cpu_harness" / digest
    binary = out_dir / "flow_cpu_harness"
    if not binary.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out_dir / f"build-{os.getpid()}"
        cmd = ["g++", "-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
               "-fno-omit-frame-pointer", "-pthread", "-DPHF_FLOW_CPU_EMULATION", f"-I{ROOT / 'csrc'}",
               f"-I{HARNESS}", f"-I{CUDA_INCLUDE}", str(HARNESS / "flow_cpu_harness.cpp"), "-o", str(tmp)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(tmp, binary)
    return binary


def run_harness(binary, s, t, valid, plan, variant, precision, weights, n_chunks=0, slots=132, tmp_path=None):
    kp = KernelPlan.build(plan, variant)
    L, B, m, H = s.shape
    n_l, n_p = len(kp.layers), len(kp.pairs)
    lengths = valid.sum(-1).to(torch.int32)
    header = [DTYPE_CODE[s.dtype], L, B, m, H, kp.n_tasks, n_l, n_p, int(kp.need_dir), int(kp.need_geo),
              precision_mode(precision, s.dtype), n_chunks, slots]
    blob = struct.pack("<13if", *header, EPS)
    blob += s.contiguous().view(RAW[s.dtype]).numpy().tobytes() + t.contiguous().view(RAW[t.dtype]).numpy().tobytes()
    blob += lengths.numpy().tobytes() + torch.tensor(kp.meta, dtype=torch.int32).numpy().tobytes()
    for key, n in (("dir", n_l), ("geo", n_l), ("adj", n_p)):  # adj: only phf has kernel pairs
        blob += weights[key].float().reshape(-1)[: n * B].contiguous().numpy().tobytes()
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(blob)
    # An in-process vLLM started earlier in the session puts its allocator into LD_PRELOAD, which
    # ASan refuses to follow: run the harness without it.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    proc = subprocess.run([str(binary), str(src), str(dst)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = dst.read_bytes()
    floats = torch.frombuffer(bytearray(data[: 4 * (2 * n_l + n_p) * B]), dtype=torch.float32)
    out = {"dir": floats[: n_l * B].view(n_l, B), "geo": floats[n_l * B : 2 * n_l * B].view(n_l, B),
           "adj": floats[2 * n_l * B :].view(n_p, B)}
    nbytes = s.numel() * s.element_size()
    start = 4 * (2 * n_l + n_p) * B
    grad = torch.frombuffer(bytearray(data[start : start + nbytes]), dtype=RAW[s.dtype]).view(s.dtype).view(s.shape)
    (chunks,) = struct.unpack("<i", data[start + nbytes :])
    keep = {"dir": kp.need_dir, "geo": kp.need_geo, "adj": variant == "phf"}
    return {k: v for k, v in out.items() if keep[k]}, grad, chunks


def _rel(got, ref):
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm().clamp(min=1e-30))


# variant, L, layers, B, m, H, lengths, repeats, n_chunks
CASES = [
    ("phf", 3, None, 2, 20, 70, [20, 2], [("s", 1, 0, 4)], 2),
    ("phf", 4, [0, 1, 3], 2, 128, 36, [128, 45], [("t", 0, 1, 7)], 0),
    ("local", 2, None, 3, 9, 131, [9, 1, 6], [("s", 0, 2, 0)], 3),
    ("direction", 2, None, 2, 7, 40, [7, 5], [], 1),
    ("geometry", 3, [0, 2], 2, 12, 100, [12, 3], [], 2),
]
#: (precision, dtype, tolerance of the terms, of the gradient). The terms of half-precision inputs are
#: float32 math on their values except in the "bf16" mode (transitions rounded to bf16); every
#: half-precision gradient is rounded to its dtype (2^-9 relative for bf16).
MODES = [("fp32", torch.float32, 1e-5, 1e-5), ("3xtf32", torch.float32, 1e-5, 1e-5), ("bf16", torch.bfloat16, 1e-2, 1e-2),
         ("3xbf16", torch.bfloat16, 1e-4, 1e-2), ("auto", torch.float16, 1e-4, 1e-2)]


@pytest.mark.parametrize("mode", MODES, ids=[f"{p}-{str(d).split('.')[-1]}" for p, d, _, _ in MODES])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-L{c[1]}-m{c[4]}-H{c[5]}" for c in CASES])
def test_kernel_sources_run_on_cpu_equal_float64_reference(harness, case, mode, tmp_path):
    precision, dtype, tol, grad_tol = mode
    variant, L, layers, B, m, H, lengths, repeats, n_chunks = case
    s = torch.randn(L, B, m, H) + 2.0 * torch.randn(L, B, 1, H)
    t = torch.randn(L, B, m, H) + 2.0 * torch.randn(L, B, 1, H)
    for which, l, b, i in repeats:
        if dtype != torch.float16:  # (1/eps)·g at Δh = 0 overflows float16
            (s if which == "s" else t)[l, b, i + 1] = (s if which == "s" else t)[l, b, i]
    s, t = s.to(dtype), t.to(dtype)
    valid = torch.arange(m)[None] < torch.tensor(lengths)[:, None]
    plan = LayerPlan.build(L, variant, layers)
    n_l, n_p = len(plan.layers), len(plan.pairs)
    weights = {"dir": torch.rand(n_l, B, dtype=torch.float64), "geo": torch.rand(n_l, B, dtype=torch.float64),
               "adj": torch.rand(n_p, B, dtype=torch.float64)}

    s64 = s.double().requires_grad_(True)
    terms = flow_terms(s64, t.double(), valid, plan, variant, EPS)
    ref = {"dir": terms.direction, "geo": terms.geometry, "adj": terms.adjacent}
    loss = sum((weights[k] * v).sum() for k, v in ref.items() if v is not None)
    (ref_grad,) = torch.autograd.grad(loss, s64)

    got, grad, chunks = run_harness(harness, s, t, valid, plan, variant, precision, weights, n_chunks, tmp_path=tmp_path)
    assert chunks >= 1 and (n_chunks == 0 or chunks == min(n_chunks, -(-H // 64)))
    assert set(got) == {k for k, v in ref.items() if v is not None}
    for k, v in got.items():
        assert torch.isfinite(v).all(), f"{k}: unwritten (NaN) entries"
        assert _rel(v, ref[k]) <= tol, f"{k}: rel {_rel(v, ref[k]):.2e}"
    assert torch.isfinite(grad).all(), "gradient: unwritten (NaN) entries"
    assert _rel(grad, ref_grad) <= grad_tol, f"gradient: rel {_rel(grad, ref_grad):.2e}"
