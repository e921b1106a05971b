"""PHF and OPSD objectives: pure PyTorch, one device, no Megatron. The oracle for the rest."""

from .config import FLOW_CHOICES, ObjectiveConfig
from .ema import ema_update, phf_objective
from .flow import (
    FLOW_VARIANTS,
    FlowTerms,
    LayerPlan,
    adjacent_layer_loss,
    batch_mean,
    direction_loss,
    flow_terms,
    geometry_loss,
    hidden_flow_loss,
    layer_values,
    per_sample_flow,
    pointwise_mse_loss,
    transitions,
    unit_directions,
)
from .opsd import (
    clip_statistics,
    generalized_jsd_terms,
    opsd_loss,
    opsd_token_divergence,
    restrict_to_top_k,
    top_k_indices,
)
from .sampled_token import sampled_token_loss, sampled_token_terms, token_log_probs
from .window import select_window

__all__ = [
    "FLOW_CHOICES", "FLOW_VARIANTS", "FlowTerms", "LayerPlan", "ObjectiveConfig",
    "adjacent_layer_loss", "batch_mean", "clip_statistics", "direction_loss", "ema_update", "flow_terms",
    "generalized_jsd_terms", "geometry_loss", "hidden_flow_loss", "layer_values", "opsd_loss",
    "opsd_token_divergence", "per_sample_flow", "phf_objective", "pointwise_mse_loss", "restrict_to_top_k",
    "sampled_token_loss", "sampled_token_terms", "select_window", "token_log_probs", "top_k_indices",
    "transitions", "unit_directions",
]
