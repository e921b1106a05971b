"""The Python side of the extension on CPU: ``flow_terms_cuda`` / ``FlowTermsFunction`` driven
against a stand-in module whose ``forward``/``backward`` take exactly the parameters of
``csrc/flow_binding.cpp`` (checked by parsing it) and compute with ``kernel_emulation``. This
checks the argument order, the saved tensors and the autograd wiring; the CUDA math itself is
checked by test_cpu_harness.py and, on a GPU, test_flow_cuda.py."""

import inspect
import re
from pathlib import Path

import pytest
import torch

from phf_megatron.kernels import flow_cuda
from phf_megatron.kernels.flow_cuda import KernelPlan
from phf_megatron.objectives.flow import LayerPlan, batch_mean, flow_terms, per_sample_flow

from . import kernel_emulation as emu

BINDING = Path(__file__).resolve().parents[2] / "csrc" / "flow_binding.cpp"


def _cpp_params(function: str) -> list[str]:
    text = BINDING.read_text()
    match = re.search(rf"\b{function}\(([^)]*)\)\s*{{", text)
    assert match, f"{function} not found in {BINDING}"
    return [re.split(r"[\s&*]+", p.strip())[-1] for p in match.group(1).split(",")]


def _plan_from_meta(meta, n_layers, n_pairs, n_tasks, need_dir, need_geo) -> KernelPlan:
    meta = tuple(int(x) for x in meta.tolist())
    layers = meta[4 * n_tasks : 4 * n_tasks + n_layers]
    lo = meta[4 * n_tasks + n_layers : 4 * n_tasks + n_layers + n_pairs]
    hi = meta[4 * n_tasks + n_layers + n_pairs : 4 * n_tasks + n_layers + 2 * n_pairs]
    return KernelPlan(layers, tuple((layers[a], layers[b]) for a, b in zip(lo, hi)), need_dir, need_geo, n_tasks, meta)


class FakeExtension:
    """Same parameters as the C++ functions; the workspace travels as flat float64 tensors."""

    NAMES = ("rs", "rt", "xs", "xt", "nsq_s", "nsq_t", "dot_st", "cos", "rho_geo", "rho_up", "rho_dn")

    def forward(self, student, teacher, lengths, meta, n_layers, n_pairs, n_tasks, need_dir, need_geo, eps, mode,
                n_chunks, poison):
        kp = _plan_from_meta(meta, n_layers, n_pairs, n_tasks, need_dir, need_geo)
        ws = emu.products(student.double(), teacher.double(), lengths, kp, 64 * max(n_chunks, 1), torch.float64, "exact")
        out = emu.finalize(ws, lengths, kp, eps)
        self.shapes = {k: ws[k].shape for k in self.NAMES}
        mats = torch.cat([ws[k].flatten() for k in self.NAMES[:4]])
        stats = torch.cat([ws[k].flatten() for k in self.NAMES[4:7]])
        vecs = torch.cat([ws[k].flatten() for k in self.NAMES[7:]])
        return out["dir"].float(), out["geo"].float(), out["adj"].float(), mats, stats, vecs, max(n_chunks, 1)

    def backward(self, student, teacher, lengths, meta, n_layers, n_pairs, n_tasks, layers, need_dir, need_geo, eps,
                 mode, mats, stats, vecs, g_dir, g_geo, g_adj, poison):
        kp = _plan_from_meta(meta, n_layers, n_pairs, n_tasks, need_dir, need_geo)
        assert list(layers) == list(kp.layers)
        ws, flat = {}, {0: mats, 1: stats, 2: vecs}
        groups = (self.NAMES[:4], self.NAMES[4:7], self.NAMES[7:])
        for g, names in enumerate(groups):
            offset = 0
            for name in names:
                n = int(torch.Size(self.shapes[name]).numel())
                ws[name] = flat[g][offset : offset + n].view(self.shapes[name])
                offset += n
        grad = emu.backward(student.double(), teacher.double(), lengths, kp, ws, g_dir.double(), g_geo.double(),
                            g_adj.double(), eps, "exact")
        return grad.to(student.dtype)


@pytest.mark.parametrize("function,method", [("flow_forward", "forward"), ("flow_backward", "backward")])
def test_stand_in_has_the_binding_parameters(function, method):
    python = list(inspect.signature(getattr(FakeExtension, method)).parameters)[1:]
    assert python == _cpp_params(function)


@pytest.mark.parametrize("variant,layers", [("phf", None), ("phf", [0, 1, 3]), ("local", None), ("direction", [1, 2]),
                                            ("geometry", None)])
def test_autograd_function_through_the_batch_loss(variant, layers, monkeypatch):
    fake = FakeExtension()
    monkeypatch.setattr(flow_cuda, "require", lambda: fake)
    L, B, m, H = 4, 3, 9, 37
    s = torch.randn(L, B, m, H, dtype=torch.float64)
    t = torch.randn(L, B, m, H, dtype=torch.float64)
    valid = torch.arange(m)[None] < torch.tensor([9, 1, 5])[:, None]
    plan = LayerPlan.build(L, variant, layers)

    def loss_of(terms):
        return batch_mean(per_sample_flow(terms, variant, len(plan.layers), len(plan.pairs)), terms.sample_mask)

    s_ref = s.clone().requires_grad_(True)
    ref = loss_of(flow_terms(s_ref, t, valid, plan, variant))
    ref.backward()
    s_got = s.float().requires_grad_(True)
    t_got = t.float().requires_grad_(True)
    terms = flow_cuda.flow_terms_cuda(s_got, t_got, valid, plan, variant, poison=True)
    assert (terms.adjacent is None) == (variant != "phf")
    got = loss_of(terms)
    got.backward()
    assert t_got.grad is None  # the teacher is a constant
    torch.testing.assert_close(got.double(), ref.detach(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(s_got.grad.double(), s_ref.grad, rtol=1e-4, atol=1e-7)
