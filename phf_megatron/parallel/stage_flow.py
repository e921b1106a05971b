"""One pipeline stage's share of the flow loss, computed from its captured window rows.

The stage evaluates the Foundation's equations (``objectives.flow``: transitions, unit
directions, L_dir, L_geo, the adjacent term, L_mse) on its captured stack: the boundary layer
(the input it received, when a pair crosses into the stage), then its own layers. The boundary
layer only feeds the crossing pair; its local terms belong to the previous stage.
``per_sample_flow`` with the *global* layer and pair counts makes the stages' shares add up to
Eq. (L_flow) per sample. (This is ``objectives.flow.flow_terms`` restricted to the stage, with
layer selection by slices: no index tensors built per step, no host synchronisation. With the
fused CUDA kernels built (``phf_megatron.kernels``, backend "auto"), the kernels evaluate the
same terms on the stage's stack in one launch each way.)

``attach_stage_flow`` puts the share into the autograd graph behind a node placed on the
stage's output tensor: its backward runs before any layer's backward of the stage (every layer
precedes the output), computes ``dL/drows`` for all captured layers at once and hands them to
the capture session, whose per-layer identities add them into the layer-output gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.dispatch import use_kernels
from ..objectives.flow import (FlowTerms, adjacent_layer_loss, direction_loss, geometry_loss, layer_values,
                               per_sample_flow, pointwise_mse_loss, transitions, unit_directions)
from .capture import CaptureSession, WindowCapture
from .stage_plan import StagePlan
from .timing import region


@dataclass(frozen=True)
class FlowSpec:
    """The flow objective as every stage needs it: variant, epsilon, the global counts, the backend."""

    variant: str
    eps: float
    num_layers: int
    """``len(plan.layers)`` of the global plan: the divisor of L_local."""
    num_pairs: int
    """``len(plan.pairs)`` of the global plan: the divisor of L_adj."""
    backend: str = "auto"
    """``kernels.dispatch`` backend: "auto" (fused CUDA kernels when built), "torch" or "cuda"."""


def flow_backend(rows: torch.Tensor, spec: FlowSpec) -> str:
    """``"cuda"`` when the stage's terms run on the fused kernels, else ``"torch"`` (the equations)."""
    return "cuda" if use_kernels(spec.backend, rows, rows, spec.variant) else "torch"


def stage_terms(student_rows: torch.Tensor, teacher_rows: torch.Tensor, valid: torch.Tensor,
                stage: StagePlan, spec: FlowSpec) -> FlowTerms:
    """The flow terms the stage owns: local terms of its own layers, the pairs it owns.

    ``student_rows``/``teacher_rows``: ``[len(stage.captured), B, m, H]``; ``valid [B, m]`` a
    True prefix per sample (checked when the micro-batch was built). Returns terms with
    ``[len(stage.own_layers), B]`` local values and ``[len(stage.pairs), B]`` adjacent values.
    """
    own = slice(1 if stage.boundary is not None else 0, None)
    if use_kernels(spec.backend, student_rows, teacher_rows, spec.variant):
        from ..kernels.flow_cuda import flow_terms_cuda

        terms = flow_terms_cuda(student_rows, teacher_rows.detach(), valid, stage.stack_plan, spec.variant, spec.eps)
        return FlowTerms(terms.direction[own] if terms.direction is not None else None,
                         terms.geometry[own] if terms.geometry is not None else None,
                         terms.adjacent, None, terms.sample_mask)
    dtype = torch.float32 if student_rows.dtype in (torch.float16, torch.bfloat16) else student_rows.dtype
    h_s, h_t = student_rows.to(dtype), teacher_rows.detach().to(dtype)
    sample_mask = valid.sum(-1) >= 2
    if spec.variant == "pointwise_mse":
        return FlowTerms(None, None, None, pointwise_mse_loss(h_s[own], h_t[own], valid, spec.eps), sample_mask)
    delta_s, transition_valid = transitions(h_s, valid)
    delta_t, _ = transitions(h_t, valid)
    d_s = unit_directions(delta_s, transition_valid, spec.eps)
    d_t = unit_directions(delta_t, transition_valid, spec.eps)
    direction = direction_loss(d_s[own], d_t[own], transition_valid) if spec.variant != "geometry" else None
    geometry = geometry_loss(d_s[own], d_t[own], transition_valid) if spec.variant != "direction" else None
    adjacent = None
    if spec.variant == "phf":
        adjacent = torch.cat([
            adjacent_layer_loss(d_s[a:b], d_s[a + 1:b + 1], d_t[a:b], d_t[a + 1:b + 1], transition_valid)
            for a, b in stage.pair_runs()
        ] + [d_s.new_zeros(0, valid.shape[0])])
    return FlowTerms(direction, geometry, adjacent, None, sample_mask)


@dataclass
class StageFlowValues:
    """Detached per-sample values of the stage's terms, for the layer-energy logs."""

    layer_values: torch.Tensor
    """``[len(stage.own_layers), B]``: the variant's per-layer local value (L_HTT, L_dir, ...)."""
    pair_values: torch.Tensor
    """``[len(stage.pairs), B]``: the adjacent term per owned pair (empty unless phf)."""


class _StageFlow(torch.autograd.Function):
    """Identity on the stage output; second output: the stage's per-sample flow share ``[B]``."""

    @staticmethod
    def forward(ctx, output, session, capture, teacher_rows, valid, spec):
        with region("flow_fwd"):
            rows = session.finish()
            with torch.enable_grad():
                leaves = rows.detach().requires_grad_()
                terms = stage_terms(leaves, teacher_rows, valid, session.stage, spec)
                share = per_sample_flow(terms, spec.variant, spec.num_layers, spec.num_pairs)
            b = valid.shape[0]
            session.values = StageFlowValues(
                layer_values(terms, spec.variant).detach(),
                terms.adjacent.detach() if terms.adjacent is not None else share.new_zeros(0, b),
            )
        ctx.session, ctx.capture, ctx.leaves, ctx.share = session, capture, leaves, share
        return output, share.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_share):
        session = ctx.session
        with region("flow_bwd"):
            (grad_rows,) = torch.autograd.grad(ctx.share, ctx.leaves, grad_share)
            session.set_grads(grad_rows)
        # A recomputed layer forward inside this stage's backward must feed this session again.
        ctx.capture.activate(session)
        ctx.leaves = ctx.share = None
        return grad_output, None, None, None, None, None


def attach_stage_flow(output: torch.Tensor, session: CaptureSession, capture: WindowCapture,
                      teacher_rows: torch.Tensor, valid: torch.Tensor, spec: FlowSpec):
    """Evaluate the stage's flow share and tie its gradient to the stage output.

    Args:
        output: the stage's output tensor (hidden states, or logits on the last stage): every
            layer of the stage precedes it in the graph.
        session: the student's capture session of this micro-batch and stage (not yet finished).
        capture: the hooks that filled it (re-activated for recomputation in the backward).
        teacher_rows: ``[len(stage.captured), B, m, H]``, the teacher's finished capture.
        valid: ``[B, m]`` bool window mask (a True prefix per sample).
        spec: the flow objective.

    Returns ``(output, share)``: ``output`` unchanged (to be used in place of the input tensor),
    ``share [B]`` float32, differentiable; ``session.values`` holds the detached per-layer values.
    """
    if teacher_rows.shape[0] != len(session.stage.captured):
        raise ValueError(
            f"teacher_rows: {teacher_rows.shape[0]} captured layers, the stage captures "
            f"{len(session.stage.captured)} ({list(session.stage.captured)})"
        )
    return _StageFlow.apply(output, session, capture, teacher_rows, valid, spec)
