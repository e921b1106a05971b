"""The fused CUDA flow loss as an autograd Function returning the reference's ``FlowTerms``.

``flow_terms_cuda`` computes the same per-(layer, sample) and per-(pair, sample) terms as
:func:`phf_megatron.objectives.flow.flow_terms` (direction, geometry, adjacent), so the
aggregation (``per_sample_flow``, ``batch_mean``) and the pipeline-parallel reuse stay shared.
Gradients flow into the student only; the teacher is a constant. ``pointwise_mse`` is not
implemented here (the reference handles it).

Product precision (``precision``, how the 128 x 128 products run; see csrc/warp_tile.cuh):
``"auto"`` = ``"3xtf32"`` for float32 inputs and ``"3xbf16"`` for bfloat16/float16 inputs;
``"3xtf32"`` = TF32 tensor cores with a big + small operand split and round-to-nearest fp32
sums (fp32-level accuracy); ``"3xbf16"`` = bf16 tensor cores with a hi + lo split (operands
to ~2^-17); ``"bf16"`` = the transitions and coefficient matrices rounded to bfloat16 (the
fastest; ~1e-3 relative on typical terms, but a term that is itself a small difference, e.g.
a single transition on a short hidden axis, can be off by more than 1e-2); ``"fp32"`` = plain
fp32 FMA on CUDA cores. Norms, cosines and everything pointwise are fp32 in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..objectives.flow import FlowTerms, LayerPlan
from .loader import require

PRECISIONS = {"fp32": 0, "bf16": 1, "3xtf32": 2, "3xbf16": 3}  # csrc/flow_params.h Mode
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_POSITIONS = 128  # m: the kernel pads transitions to one 128-row tile
KINDS = {"gram_s": 0, "gram_t": 1, "cross_s": 2, "cross_t": 3}


@dataclass(frozen=True)
class KernelPlan:
    """The plan's tables as the kernels read them (see csrc/flow_binding.cpp for ``meta``)."""

    layers: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]
    need_dir: bool
    need_geo: bool
    n_tasks: int
    meta: tuple[int, ...]

    @staticmethod
    def build(plan: LayerPlan, variant: str) -> "KernelPlan":
        if variant == "pointwise_mse":
            raise ValueError("variant: 'pointwise_mse' has no CUDA kernel; use the reference")
        need_dir = variant in ("phf", "local", "direction")
        need_geo = variant in ("phf", "local", "geometry")
        pairs = plan.pairs if variant == "phf" else ()
        pos = {layer: i for i, layer in enumerate(plan.layers)}
        pair_lo = [pos[a] for a, _ in pairs]
        pair_hi = [pos[c] for _, c in pairs]
        up, dn = [-1] * len(plan.layers), [-1] * len(plan.layers)
        for p, (lo, hi) in enumerate(zip(pair_lo, pair_hi)):
            up[lo], dn[hi] = p, p
        # Tasks touching the same hidden states are adjacent, so their reads share L2.
        tasks: list[tuple[int, int, int, int]] = []
        for i, layer in enumerate(plan.layers):
            tasks.append((KINDS["gram_s"], layer, layer, i))  # row statistics (+ RS if geometry)
            if need_geo:
                tasks.append((KINDS["gram_t"], layer, layer, i))
            if up[i] >= 0:
                upper = plan.layers[pair_hi[up[i]]]
                tasks.append((KINDS["cross_s"], layer, upper, up[i]))
                tasks.append((KINDS["cross_t"], layer, upper, up[i]))
        meta = [x for task in tasks for x in task] + list(plan.layers) + pair_lo + pair_hi + up + dn
        return KernelPlan(plan.layers, tuple(pairs), need_dir, need_geo, len(tasks), tuple(meta))


_META_CACHE: dict[tuple, torch.Tensor] = {}


def _meta_tensor(kplan: KernelPlan, device: torch.device) -> torch.Tensor:
    key = (kplan.meta, str(device))
    if key not in _META_CACHE:
        _META_CACHE[key] = torch.tensor(kplan.meta, dtype=torch.int32, device=device)
    return _META_CACHE[key]


def precision_mode(precision: str, dtype: torch.dtype) -> int:
    if precision == "auto":
        return PRECISIONS["3xtf32"] if dtype == torch.float32 else PRECISIONS["3xbf16"]
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown value {precision!r}; choose 'auto' or one of {tuple(PRECISIONS)}")
    return PRECISIONS[precision]


class FlowTermsFunction(torch.autograd.Function):
    """(student, teacher, lengths, meta, ...) -> (dir [nL, B], geo [nL, B], adj [nP, B])."""

    @staticmethod
    def forward(ctx, student, teacher, lengths, meta, kplan: KernelPlan, eps: float, mode: int, n_chunks: int,
                poison: bool):
        ext = require()
        nL, nP = len(kplan.layers), len(kplan.pairs)
        common = (nL, nP, kplan.n_tasks)
        dir_, geo, adj, mats, stats, vecs, chunks = ext.forward(
            student, teacher, lengths, meta, *common, kplan.need_dir, kplan.need_geo, eps, mode, n_chunks, poison
        )
        ctx.save_for_backward(student, teacher, lengths, meta, mats, stats, vecs)
        ctx.args = (common, kplan, eps, mode, poison)
        ctx.n_chunks = chunks
        return dir_, geo, adj

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_dir, g_geo, g_adj):
        student, teacher, lengths, meta, mats, stats, vecs = ctx.saved_tensors
        common, kplan, eps, mode, poison = ctx.args
        grads = [g.float().contiguous() for g in (g_dir, g_geo, g_adj)]
        grad = require().backward(
            student, teacher, lengths, meta, *common, list(kplan.layers), kplan.need_dir, kplan.need_geo, eps, mode,
            mats, stats, vecs, *grads, poison,
        )
        return grad, None, None, None, None, None, None, None, None


def flow_terms_cuda(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    plan: LayerPlan,
    variant: str = "phf",
    eps: float = 1e-6,
    precision: str = "auto",
    n_chunks: int = 0,
    poison: bool = False,
) -> FlowTerms:
    """The reference's ``flow_terms`` on the fused kernels (inputs already validated).

    Args:
        student, teacher: ``[L, B, m, H]`` CUDA tensors (float32/bfloat16/float16), ``m <= 128``.
        valid: ``[B, m]`` bool True-prefix mask.
        plan, variant, eps: as in ``flow_terms`` (variant not ``pointwise_mse``).
        precision: product precision (module docstring).
        n_chunks: CTAs per task along the hidden axis in the forward (0 = automatic).
        poison: fill outputs with NaN before each launch (tests: unwritten elements show).
    """
    kplan = KernelPlan.build(plan, variant)
    lengths = valid.sum(-1, dtype=torch.int32)
    meta = _meta_tensor(kplan, student.device)
    mode = precision_mode(precision, student.dtype)
    dir_, geo, adj = FlowTermsFunction.apply(
        student.contiguous(), teacher.detach().contiguous(), lengths, meta, kplan, float(eps), mode, int(n_chunks),
        bool(poison),
    )
    return FlowTerms(
        direction=dir_ if kplan.need_dir else None,
        geometry=geo if kplan.need_geo else None,
        adjacent=adj if variant == "phf" else None,
        pointwise=None,
        sample_mask=lengths >= 2,
    )
