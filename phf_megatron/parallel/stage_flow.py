"""One pipeline stage's share of the flow loss, computed from its captured window rows.

The stage runs the same terms function as the reference (``objectives.flow.flow_terms``, or the
fused CUDA kernels when ``kernels.flow_backend`` picks them) on its captured stack with the
stack's layer plan (``StagePlan.stack_plan``): the boundary layer (the input it received, when a
pair crosses into the stage), then its own layers. The boundary layer only feeds the crossing
pair; its local terms belong to the previous stage and are dropped here. ``per_sample_flow``
with the *global* layer and pair counts makes the stages' shares add up to Eq. (L_flow) per
sample. The stack's layers are contiguous and its pairs neighbours, so the terms function takes
them by slices: no index tensors built per step, no host synchronisation.

``attach_stage_flow`` puts the share into the autograd graph behind a node placed on the
stage's output tensor: its backward runs before any layer's backward of the stage (every layer
precedes the output), computes ``dL/drows`` for all captured layers at once and hands them to
the capture session, whose per-layer identities add them into the layer-output gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import flow_backend, flow_terms
from ..objectives.flow import FlowTerms, layer_loss, per_sample_flow
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
    """``kernels.flow_backend`` request: "auto" (fused CUDA kernels when built), "torch" or "cuda"."""


def stage_terms(student_rows: torch.Tensor, teacher_rows: torch.Tensor, valid: torch.Tensor,
                stage: StagePlan, spec: FlowSpec, backend: str | None = None) -> FlowTerms:
    """The flow terms the stage owns: local terms of its own layers, the pairs it owns.

    ``student_rows``/``teacher_rows``: ``[len(stage.captured), B, m, H]``; ``valid [B, m]`` a
    True prefix per sample (checked when the micro-batch was built). ``backend``: ``"torch"`` or
    ``"cuda"`` as ``kernels.flow_backend`` decided it (None: decide here from ``spec.backend``).
    Returns terms with ``[len(stage.own_layers), B]`` local values and ``[len(stage.pairs), B]``
    adjacent values.
    """
    backend = backend or flow_backend(spec.backend, student_rows, teacher_rows, spec.variant)
    terms = flow_terms(backend)(student_rows, teacher_rows.detach(), valid, stage.stack_plan, spec.variant, spec.eps)
    own = slice(1 if stage.boundary is not None else 0, None)  # the boundary's local terms are not the stage's

    def owned(local: torch.Tensor | None) -> torch.Tensor | None:
        return local[own] if local is not None else None

    return FlowTerms(owned(terms.direction), owned(terms.geometry), terms.adjacent, owned(terms.pointwise),
                     terms.sample_mask)


@dataclass
class StageFlowValues:
    """Detached per-sample values of the stage's terms, for the layer-energy logs."""

    layer_loss: torch.Tensor
    """``[len(stage.own_layers), B]``: the variant's per-layer loss (L_layer, L_dir, ...)."""
    pair_values: torch.Tensor
    """``[len(stage.pairs), B]``: the adjacent term per owned pair (empty unless phf)."""
    backend: str
    """What evaluated the terms: "cuda" (the fused kernels) or "torch" (the reference equations)."""


class _StageFlow(torch.autograd.Function):
    """Identity on the stage output; second output: the stage's per-sample flow share ``[B]``."""

    @staticmethod
    def forward(ctx, output, session, capture, teacher_rows, valid, spec):
        with region("flow_fwd"):
            rows = session.finish()
            with torch.enable_grad():
                leaves = rows.detach().requires_grad_()
                backend = flow_backend(spec.backend, leaves, teacher_rows, spec.variant)  # the one decision
                terms = stage_terms(leaves, teacher_rows, valid, session.stage, spec, backend)
                share = per_sample_flow(terms, spec.variant, spec.num_layers, spec.num_pairs)
            b = valid.shape[0]
            session.values = StageFlowValues(
                layer_loss(terms, spec.variant).detach(),
                terms.adjacent.detach() if terms.adjacent is not None else share.new_zeros(0, b),
                backend,
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
    ``share [B]`` float32, differentiable; ``session.values`` holds the detached per-layer values
    and the backend that computed them.
    """
    if teacher_rows.shape[0] != len(session.stage.captured):
        raise ValueError(
            f"teacher_rows: {teacher_rows.shape[0]} captured layers, the stage captures "
            f"{len(session.stage.captured)} ({list(session.stage.captured)})"
        )
    return _StageFlow.apply(output, session, capture, teacher_rows, valid, spec)
