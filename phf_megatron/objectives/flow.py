"""The hidden flow loss of PHF (paper Section 3.2 and 3.5), pure PyTorch.

Shapes: ``L`` layers, ``B`` samples, ``m`` window positions, ``H`` hidden size.
``h[l, b, i]`` is the output of transformer layer ``l`` (0-based here; the paper counts
1..L) at the i-th window position of sample b, before the final norm. ``valid[b]`` is a
True prefix of length ``m_b``; a sample with ``m_b < 2`` has no transition and is left out of
the batch mean. The teacher is a constant: no gradient reaches it.

This module is the oracle for the distributed loss (``phf_megatron.parallel``) and the fused
CUDA kernel (``csrc/``): both reproduce ``flow_terms`` term by term. It imports nothing of ours
above ``objectives``: ``hidden_flow_loss`` runs the terms function it is given (``flow_terms``,
this reference, unless a caller passes another), so the float64 reference never dispatches to a
kernel by itself; ``phf_megatron.kernels`` chooses between the reference and the kernels
(``kernels.flow_terms(backend)``, ``kernels.hidden_flow_loss(..., backend=)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .checks import check_finite, check_ndim, check_prefix_mask, check_same_shape
from .config import FLOW_VARIANTS


# ----------------------------------------------------------------------------- equations


def transitions(h: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (Δh): ``Δh_{l,i} = h_{l,w_{i+1}} - h_{l,w_i}``.

    Returns ``delta [L, B, m-1, H]`` and ``transition_valid [B, m-1]`` (both ends valid).
    """
    delta = h[:, :, 1:] - h[:, :, :-1]
    return delta, valid[:, 1:] & valid[:, :-1]


def unit_directions(delta: torch.Tensor, transition_valid: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. (d): ``d_{l,i} = Δh_{l,i} / (||Δh_{l,i}||_2 + eps)``; rows of invalid transitions are 0.

    ``Δh = 0`` (a repeated state) gives ``d = 0`` and a finite gradient (``(1/eps) dL/dd``; no NaN).
    """
    d = delta / (torch.linalg.vector_norm(delta, dim=-1, keepdim=True) + eps)
    return torch.where(transition_valid[None, :, :, None], d, torch.zeros_like(d))


def _num_transitions(transition_valid: torch.Tensor) -> torch.Tensor:
    """``m_b - 1`` per sample as the compute dtype's divisor, clamped to 1 for empty samples."""
    return transition_valid.sum(-1).clamp(min=1)


def direction_loss(d_s: torch.Tensor, d_t: torch.Tensor, transition_valid: torch.Tensor) -> torch.Tensor:
    """Eq. (L_dir): ``L_dir(l) = 1/(m-1) * sum_i (1 - <d^S_{l,i}, d^T_{l,i}>)``. Returns ``[L, B]``."""
    cos = (d_s * d_t).sum(-1)  # [L, B, m-1]
    per_step = torch.where(transition_valid[None], 1.0 - cos, torch.zeros_like(cos))
    return per_step.sum(-1) / _num_transitions(transition_valid).to(cos.dtype)


def gram(d: torch.Tensor) -> torch.Tensor:
    """``G_l = D_l D_l^T``: ``[L, B, m-1, m-1]`` cosines between the transitions of one layer."""
    return d @ d.transpose(-1, -2)


def geometry_loss(d_s: torch.Tensor, d_t: torch.Tensor, transition_valid: torch.Tensor) -> torch.Tensor:
    """Eq. (L_geo): ``L_geo(l) = ||G^S_l - G^T_l||_F^2 / (m-1)^2``. Returns ``[L, B]``.

    Invalid rows of ``D`` are zero, so the padded part of both Gram matrices is zero.
    """
    diff = gram(d_s) - gram(d_t)
    n = _num_transitions(transition_valid).to(diff.dtype)
    return diff.pow(2).sum((-1, -2)) / (n * n)


def cross_gram(d_lower: torch.Tensor, d_upper: torch.Tensor) -> torch.Tensor:
    """``C_{l,l+1} = D_l D_{l+1}^T``: how each move at layer l relates to the moves one layer up."""
    return d_lower @ d_upper.transpose(-1, -2)


def adjacent_layer_loss(
    d_s_lower: torch.Tensor,
    d_s_upper: torch.Tensor,
    d_t_lower: torch.Tensor,
    d_t_upper: torch.Tensor,
    transition_valid: torch.Tensor,
) -> torch.Tensor:
    """Eq. (L_adj) summand: ``||C^S_{l,l+1} - C^T_{l,l+1}||_F^2 / (m-1)^2`` for each layer pair.

    The four direction stacks are ``[P, B, m-1, H]``, pair p being (lower[p], upper[p]).
    Returns ``[P, B]``.
    """
    diff = cross_gram(d_s_lower, d_s_upper) - cross_gram(d_t_lower, d_t_upper)
    n = _num_transitions(transition_valid).to(diff.dtype)
    return diff.pow(2).sum((-1, -2)) / (n * n)


def rms_normalize(h: torch.Tensor, eps: float) -> torch.Tensor:
    """``h / sqrt(mean_k h_k^2 + eps)``: the scale-free state used by the pointwise control."""
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def pointwise_mse_loss(h_s: torch.Tensor, h_t: torch.Tensor, valid: torch.Tensor, eps: float) -> torch.Tensor:
    """The pointwise control of the ablations: normalized-state MSE at the window positions.

    ``L_mse(l) = 1/m_b * sum_i mean_k (hat h^S_{l,i,k} - hat h^T_{l,i,k})^2`` with
    ``hat h = rms_normalize(h)``, so a state and its positive multiple are the same point and the
    value lies in [0, 4]. Unlike ``direction_loss``/``geometry_loss`` it is anchored to positions:
    offsets, per-step rescaling and orthogonal maps all change it (Proposition 1's contrast).
    Returns ``[L, B]``.
    """
    sq = (rms_normalize(h_s, eps) - rms_normalize(h_t, eps)).pow(2).mean(-1)  # [L, B, m]
    sq = torch.where(valid[None], sq, torch.zeros_like(sq))
    return sq.sum(-1) / valid.sum(-1).clamp(min=1).to(sq.dtype)


# ----------------------------------------------------------------------------- aggregation


@dataclass(frozen=True)
class LayerPlan:
    """Which layers enter the local terms and which (l, l+1) pairs enter the adjacent term.

    With ``layers=None`` every layer and every neighbouring pair is used (all-layer
    aggregation, Section 3.5). With a selection (the selected-layers ablation) the local terms
    average over the selected layers and the adjacent term over pairs (l, l+1) with both
    layers selected.
    """

    layers: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]

    @staticmethod
    def build(num_layers: int, variant: str, layers: Sequence[int] | None = None) -> "LayerPlan":
        if variant not in FLOW_VARIANTS:
            raise ValueError(f"variant: unknown flow variant {variant!r}; choose one of {FLOW_VARIANTS}")
        if layers is None:
            chosen = tuple(range(num_layers))
        else:
            chosen = tuple(sorted(int(x) for x in layers))
            if not chosen:
                raise ValueError("layers: the selection is empty")
            if len(set(chosen)) != len(chosen):
                raise ValueError(f"layers: repeated layer index in {list(layers)}")
            if chosen[0] < 0 or chosen[-1] >= num_layers:
                raise ValueError(f"layers: indices must lie in [0, {num_layers}), got {list(layers)}")
        selected = set(chosen)
        pairs = tuple((l, l + 1) for l in chosen if l + 1 in selected)
        if variant == "phf" and not pairs:
            raise ValueError(
                f"layers: variant 'phf' needs at least one pair of neighbouring layers (l, l+1); "
                f"got layers={list(chosen)} of {num_layers}. Use variant 'local' for a single layer."
            )
        return LayerPlan(chosen, pairs)

    def layer_rows(self) -> slice | list[int]:
        """Where ``layers`` sit on the layer axis: a slice when they are contiguous (no index tensor,
        no host-to-device copy per call), else the index list."""
        if self.layers and self.layers == tuple(range(self.layers[0], self.layers[-1] + 1)):
            return slice(self.layers[0], self.layers[-1] + 1)
        return list(self.layers)

    def pair_runs(self) -> list[tuple[int, int]] | None:
        """The pairs as runs ``[a, b)`` of positions in ``layers``, in ``pairs`` order: pair k of a run
        is ``(layers[k], layers[k+1])``. None when a pair is not two neighbouring entries of ``layers``
        (a hand-made plan); ``build`` never makes one.
        """
        pos = {layer: k for k, layer in enumerate(self.layers)}
        runs: list[tuple[int, int]] = []
        for lower, upper in self.pairs:
            k = pos.get(lower)
            if k is None or pos.get(upper) != k + 1:
                return None
            if runs and runs[-1][1] == k:
                runs[-1] = (runs[-1][0], k + 1)
            else:
                runs.append((k, k + 1))
        return runs


@dataclass
class FlowTerms:
    """Per-layer, per-sample values of the flow equations (what every backend must agree on).

    ``direction``/``geometry``/``pointwise``: ``[len(plan.layers), B]`` (None when the variant
    does not use them); ``adjacent``: ``[len(plan.pairs), B]`` or None; ``sample_mask``: ``[B]``
    True where ``m_b >= 2``.
    """

    direction: torch.Tensor | None
    geometry: torch.Tensor | None
    adjacent: torch.Tensor | None
    pointwise: torch.Tensor | None
    sample_mask: torch.Tensor


def layer_loss(terms: FlowTerms, variant: str) -> torch.Tensor:
    """Eq. (L_layer): the per-layer loss ``[n_layers, B]`` the variant averages over depth.

    phf/local: ``L_layer(l) = 1/2 (L_dir(l) + L_geo(l))`` (the paper's per-layer transition loss);
    the ablations put their own term in its place: direction ``L_dir``, geometry ``L_geo``,
    pointwise_mse ``L_mse``. Also the layer-energy diagnostic of Section 4.
    """
    if variant in ("phf", "local"):
        return 0.5 * (terms.direction + terms.geometry)
    if variant == "direction":
        return terms.direction
    if variant == "geometry":
        return terms.geometry
    return terms.pointwise


def per_sample_flow(terms: FlowTerms, variant: str, num_layers: int, num_pairs: int) -> torch.Tensor:
    """Each sample's flow value ``[B]`` from (possibly a stage's share of) the layer terms.

    ``num_layers``/``num_pairs`` are the *global* counts of the plan, so that the shares of
    pipeline stages add up to Eq. (L_flow): ``1/2 L_local + 1/2 L_adj`` for phf, with
    ``L_local = 1/L sum_l L_layer(l)`` (Eq. L_local) and ``L_adj = 1/(L-1) sum_l adj(l, l+1)``
    (Eq. L_adj); the mean over layers of the variant's term otherwise.
    """
    local = layer_loss(terms, variant).sum(0) / num_layers
    if variant != "phf":
        return local
    adjacent = terms.adjacent.sum(0) / num_pairs if terms.adjacent is not None else torch.zeros_like(local)
    return 0.5 * local + 0.5 * adjacent


def batch_mean(per_sample: torch.Tensor, sample_mask: torch.Tensor) -> torch.Tensor:
    """Mean over samples with ``m_b >= 2``; 0 (with a zero gradient) when there are none."""
    weights = sample_mask.to(per_sample.dtype)
    return (per_sample * weights).sum() / weights.sum().clamp(min=1)


# ----------------------------------------------------------------------------- public API


def _validate(student, teacher, valid, check_inputs):
    check_ndim("student", student, 4, "[L, B, m, H]")
    check_same_shape("student", student, "teacher", teacher)
    L, B, m, _ = student.shape
    if valid is None:
        valid = torch.ones(B, m, dtype=torch.bool, device=student.device)
    if valid.shape != (B, m):
        raise ValueError(f"valid: shape {tuple(valid.shape)} does not match [B, m] = [{B}, {m}] of student")
    check_prefix_mask("valid", valid)
    if check_inputs:
        check_finite("student", student)
        check_finite("teacher", teacher)
    return valid


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


#: A terms function: ``(student, teacher, valid, plan, variant, eps) -> FlowTerms`` on inputs that
#: ``hidden_flow_loss`` has checked. ``flow_terms`` (below) is the reference;
#: ``kernels.flow_cuda.flow_terms_cuda`` the fused kernels; ``kernels.flow_terms(backend)`` picks.
TermsFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, LayerPlan, str, float], FlowTerms]


def flow_terms(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor | None,
    plan: LayerPlan,
    variant: str = "phf",
    eps: float = 1e-6,
) -> FlowTerms:
    """The reference terms function: the equations the variant needs on the plan's layers.

    ``student``/``teacher`` ``[L, B, m, H]`` (teacher detached here), ``valid [B, m]`` a True prefix
    per sample (None: all positions), as ``hidden_flow_loss`` checks them; no check and no host
    synchronisation here, so the distributed stage flow calls it on its captured rows too.
    Contiguous layers and neighbouring pairs are taken by slices (no index tensors).
    """
    if valid is None:
        valid = torch.ones(student.shape[1], student.shape[2], dtype=torch.bool, device=student.device)
    dtype = _compute_dtype(student)
    rows = plan.layer_rows()
    h_s = student[rows].to(dtype)
    h_t = teacher.detach()[rows].to(dtype)
    sample_mask = valid.sum(-1) >= 2
    if variant == "pointwise_mse":
        return FlowTerms(None, None, None, pointwise_mse_loss(h_s, h_t, valid, eps), sample_mask)

    delta_s, transition_valid = transitions(h_s, valid)
    delta_t, _ = transitions(h_t, valid)
    d_s = unit_directions(delta_s, transition_valid, eps)
    d_t = unit_directions(delta_t, transition_valid, eps)
    direction = direction_loss(d_s, d_t, transition_valid) if variant != "geometry" else None
    geometry = geometry_loss(d_s, d_t, transition_valid) if variant != "direction" else None
    adjacent = None
    if variant == "phf":
        adjacent = _adjacent_terms(d_s, d_t, transition_valid, plan)
    return FlowTerms(direction, geometry, adjacent, None, sample_mask)


def _adjacent_terms(d_s: torch.Tensor, d_t: torch.Tensor, transition_valid: torch.Tensor,
                    plan: LayerPlan) -> torch.Tensor:
    """``adjacent_layer_loss`` of every plan pair ``[P, B]`` from the plan layers' directions."""
    runs = plan.pair_runs()
    if runs is None:  # a hand-made plan: pairs by position lists
        pos = {layer: i for i, layer in enumerate(plan.layers)}
        lower, upper = [pos[a] for a, _ in plan.pairs], [pos[b] for _, b in plan.pairs]
        return adjacent_layer_loss(d_s[lower], d_s[upper], d_t[lower], d_t[upper], transition_valid)
    return torch.cat([
        adjacent_layer_loss(d_s[a:b], d_s[a + 1:b + 1], d_t[a:b], d_t[a + 1:b + 1], transition_valid)
        for a, b in runs
    ] + [d_s.new_zeros(0, transition_valid.shape[0])])


def hidden_flow_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor | None = None,
    variant: str = "phf",
    eps: float = 1e-6,
    layers: Sequence[int] | None = None,
    check_inputs: bool = True,
    terms: TermsFunction = flow_terms,
) -> torch.Tensor:
    """``L_flow`` (Eq. L_flow) for a batch: a scalar, differentiable in ``student`` only.

    Args:
        student, teacher: ``[L, B, m, H]`` hidden states at the window positions.
        valid: ``[B, m]`` bool, a True prefix per row (default: all positions valid).
        variant: ``"phf"`` (1/2 L_local + 1/2 L_adj), ``"local"`` (L_local), ``"direction"``
            (mean_l L_dir), ``"geometry"`` (mean_l L_geo), ``"pointwise_mse"`` (mean_l L_mse).
        eps: the normalizer's epsilon.
        layers: 0-based layer indices for the selected-layers ablation (default: all).
        check_inputs: check for NaN/Inf (one host sync); shapes and masks are always checked.
        terms: the terms function (``TermsFunction``): ``flow_terms``, this module's reference, by
            default. The fused CUDA kernels are ``phf_megatron.kernels``'s to choose:
            ``hidden_flow_loss(..., terms=kernels.flow_terms("auto"))``, or
            ``kernels.hidden_flow_loss(..., backend="auto")``.
    """
    check_ndim("student", student, 4, "[L, B, m, H]")
    plan = LayerPlan.build(student.shape[0], variant, layers)
    valid = _validate(student, teacher, valid, check_inputs)
    values = terms(student, teacher, valid, plan, variant, eps)
    per_sample = per_sample_flow(values, variant, len(plan.layers), len(plan.pairs))
    return batch_mean(per_sample, values.sample_mask).to(student.dtype)
