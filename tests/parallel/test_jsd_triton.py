"""The Triton JSD kernels equal the reference ``objectives.opsd_token_divergence`` (values and gradients).

* With Triton (installed, or on CPU machines the one ``scripts/setup_env.sh`` puts in
  ``<venv>/triton-interp``, off the venv's import path: ``requirements/triton-interp.txt``), its
  interpreter runs the kernels on CPU tensors in a subprocess (``jsd_triton_check``), every beta
  branch and clip mode, float32 (1e-5 relative against float64) and bf16 logits (values 1e-5 against
  float64 on the same bf16 logits: float32 math; the gradient 1e-2, its own rounding to bf16), single
  rank and vocabulary-split over TP=2 gloo ranks, and the clip statistics in float32 (``stats_*``:
  1e-5, so the counts of entries cut are exact).
* On a GPU: the kernels against the chunked eager backend at the real vocabulary size.
"""

import importlib.util
import json
import os
import sys

import pytest
import torch

from phf_megatron.parallel.vocab_parallel_jsd import vocab_parallel_jsd
from tests.helpers import python_env, run_python

#: Where scripts/setup_env.sh installs the interpreter check's Triton (not importable in the venv
#: itself); PHF_TRITON_INTERP names another such ``pip install --target`` directory.
TRITON_INTERP = os.environ.get("PHF_TRITON_INTERP") or os.path.join(sys.prefix, "triton-interp")


def triton_path() -> str | None:
    """What the check's subprocess needs on PYTHONPATH for Triton: "" when this environment has it,
    ``TRITON_INTERP`` when it holds one, else None."""
    if importlib.util.find_spec("triton") is not None:
        return ""
    return TRITON_INTERP if os.path.isdir(os.path.join(TRITON_INTERP, "triton")) else None


@pytest.mark.skipif(triton_path() is None, reason=f"Triton is not installed, nor in {TRITON_INTERP} "
                                                   "(bash scripts/setup_env.sh puts it there)")
def test_interpreted_kernels_equal_the_reference(tmp_path):
    out = tmp_path / "errors.json"
    path = os.pathsep.join(p for p in (python_env()["PYTHONPATH"], triton_path()) if p)
    proc = run_python(["-m", "tests.parallel.jsd_triton_check", str(out)], timeout=600, TRITON_INTERPRET="1",
                      PYTHONPATH=path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(out.read_text())
    assert len(errors) == 84
    for name, err in errors.items():  # bf16 values are float32 math too (1e-5); their gradient rounds to bf16
        limit = 0.0 if name.startswith("unscored") else 1e-2 if name.startswith("grad_bfloat16") else 1e-5
        assert err <= limit, (name, err)


def test_triton_backend_is_refused_where_it_cannot_run():
    logits, rows = torch.zeros(2, 3, 8, dtype=torch.float64), torch.zeros(1, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="backend: 'triton'"):
        vocab_parallel_jsd(logits, rows, torch.tensor([0]), backend="triton")
    with pytest.raises(ValueError, match="backend"):
        vocab_parallel_jsd(logits, rows, torch.tensor([0]), backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("beta,clip,mode", [(0.5, 0.05, "element"), (0.0, None, "element"), (1.0, 0.3, "token")])
def test_gpu_kernels_equal_the_eager_backend(dtype, beta, clip, mode):
    g = torch.Generator(device="cuda").manual_seed(0)
    zs = (4 * torch.randn(2, 150, 151936, generator=g, device="cuda")).to(dtype)
    zt = (4 * torch.randn(2, 150, 151936, generator=g, device="cuda")).to(dtype)
    idx = torch.arange(20, 290, device="cuda")
    rows = zt.reshape(-1, zt.shape[-1])[idx]
    w = torch.rand(len(idx), generator=g, device="cuda")
    if mode == "token":  # cap at the median token divergence: half the tokens clipped, half not
        with torch.no_grad():
            clip = float(vocab_parallel_jsd(zs, rows, idx, beta, 1.1, None, mode, backend="torch").median())
    results = []
    for backend in ("torch", "triton"):
        x = zs.clone().requires_grad_()
        out, stats = vocab_parallel_jsd(x, rows, idx, beta, 1.1, clip, mode, backend=backend, return_clip_stats=True)
        (grad,) = torch.autograd.grad((out * w).sum(), x)
        results.append((out, grad.float(), stats))
    (ref, ref_grad, ref_stats), (out, grad, stats) = results
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=1e-6)
    torch.testing.assert_close(stats[0], ref_stats[0], rtol=2e-5, atol=1e-6)  # the divergence before the clip
    # entries cut: a summand within float32 rounding of the cap may land on either side
    assert float((stats[1] - ref_stats[1]).abs().sum()) <= 1e-4 * max(1.0, float(ref_stats[1].sum()))
    grad_tol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # bf16 gradients round to 8 bits
    assert float(ref_grad.abs().max()) > 0, "the case clips every token: it would test nothing"
    assert float((grad - ref_grad).abs().max() / ref_grad.abs().max()) <= grad_tol
