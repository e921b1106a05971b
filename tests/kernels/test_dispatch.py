"""Backend dispatch and the extension loader on any machine (CPU CI included)."""

import re
from pathlib import Path

import pytest
import torch

from phf_megatron import kernels
from phf_megatron.kernels.flow_cuda import PRECISIONS, KernelPlan, precision_mode
from phf_megatron.kernels import hidden_flow_loss
from phf_megatron.objectives.flow import LayerPlan

HAS_KERNELS = torch.cuda.is_available() and kernels.available()


def _pair(L=3, B=2, m=6, H=5):
    return torch.randn(L, B, m, H, dtype=torch.float64), torch.randn(L, B, m, H, dtype=torch.float64)


@pytest.mark.parametrize("variant", ["phf", "local", "direction", "geometry", "pointwise_mse"])
def test_auto_on_cpu_tensors_is_the_reference(variant, monkeypatch):
    def no_load():  # CPU tensors must not even try to load (or build) the extension
        raise AssertionError("the loader was consulted for CPU tensors")

    monkeypatch.setattr(kernels.loader, "available", no_load)
    s, t = _pair()
    s_auto, s_ref = s.clone().requires_grad_(True), s.clone().requires_grad_(True)
    auto = hidden_flow_loss(s_auto, t, variant=variant)
    ref = hidden_flow_loss(s_ref, t, variant=variant, backend="torch")
    auto.backward()
    ref.backward()
    assert torch.equal(auto, ref)
    assert torch.equal(s_auto.grad, s_ref.grad)


def test_unknown_backend_is_a_value_error():
    s, t = _pair()
    with pytest.raises(ValueError, match="backend"):
        hidden_flow_loss(s, t, backend="triton")


@pytest.mark.skipif(HAS_KERNELS, reason="the extension is available here")
def test_loader_reports_why_the_extension_is_unavailable():
    assert not kernels.available()
    assert kernels.load_extension() is None
    reason = kernels.unavailable_reason()
    assert isinstance(reason, str) and "_flow_cuda" in reason
    if torch.version.cuda is None:
        assert "CPU-only" in reason


@pytest.mark.skipif(HAS_KERNELS, reason="the extension is available here")
def test_cuda_backend_without_the_extension_raises_a_clear_error():
    s, t = _pair()
    with pytest.raises(RuntimeError, match="extension is unavailable: .+"):
        hidden_flow_loss(s, t, backend="cuda")
    with pytest.raises(RuntimeError, match="unavailable"):
        kernels.require()


def test_cuda_backend_names_unsupported_inputs():
    s, t = _pair()
    assert "CUDA tensors" in kernels.kernel_unsupported(s, t)
    if HAS_KERNELS:
        with pytest.raises(ValueError, match="student: backend='cuda' needs CUDA tensors"):
            hidden_flow_loss(s, t, backend="cuda")


def test_kernel_plan_tables_for_a_layer_selection():
    plan = LayerPlan.build(6, "phf", [0, 1, 3, 4, 5])
    kp = KernelPlan.build(plan, "phf")
    assert kp.pairs == ((0, 1), (3, 4), (4, 5))
    n_l, n_p = 5, 3
    assert kp.n_tasks == 2 * n_l + 2 * n_p
    assert len(kp.meta) == 4 * kp.n_tasks + 3 * n_l + 2 * n_p
    tasks = [kp.meta[4 * i : 4 * i + 4] for i in range(kp.n_tasks)]
    assert tasks[:4] == [(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 1, 0), (3, 0, 1, 0)]  # kind, layer, layer, slot
    tail = kp.meta[4 * kp.n_tasks :]
    layer_ids, pair_lo, pair_hi = tail[:n_l], tail[n_l : n_l + n_p], tail[n_l + n_p : n_l + 2 * n_p]
    up, dn = tail[n_l + 2 * n_p : 2 * n_l + 2 * n_p], tail[2 * n_l + 2 * n_p :]
    assert layer_ids == (0, 1, 3, 4, 5)
    assert (pair_lo, pair_hi) == ((0, 2, 3), (1, 3, 4))
    assert up == (0, -1, 1, 2, -1) and dn == (-1, 0, -1, 1, 2)
    direction = KernelPlan.build(LayerPlan.build(6, "direction"), "direction")
    assert direction.n_tasks == 6 and not direction.need_geo and direction.pairs == ()
    with pytest.raises(ValueError, match="variant"):
        KernelPlan.build(LayerPlan.build(6, "pointwise_mse"), "pointwise_mse")


def test_precision_modes():
    assert precision_mode("auto", torch.float32) == PRECISIONS["3xtf32"]
    assert precision_mode("auto", torch.bfloat16) == PRECISIONS["3xbf16"]
    assert precision_mode("auto", torch.float16) == PRECISIONS["3xbf16"]
    assert precision_mode("bf16", torch.float32) == PRECISIONS["bf16"]
    with pytest.raises(ValueError, match="precision"):
        precision_mode("tf32", torch.float32)


def test_precision_codes_match_the_kernel_modes():
    """PRECISIONS must use the numbers of csrc/flow_params.h's `enum Mode`."""
    header = (Path(__file__).resolve().parents[2] / "csrc" / "flow_params.h").read_text()
    enum = re.search(r"enum Mode : int \{([^}]*)\}", header).group(1)
    modes = {name.strip(): int(value) for name, value in (item.split("=") for item in enum.split(","))}
    names = {"fp32": "kSimt", "bf16": "kBf16", "3xtf32": "kTf32x3", "3xbf16": "kBf16x3"}
    assert {p: modes[names[p]] for p in PRECISIONS} == PRECISIONS
