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
from .opsd import generalized_jsd_terms, opsd_loss, opsd_token_divergence
from .window import select_window

__all__ = [
    "FLOW_CHOICES", "FLOW_VARIANTS", "FlowTerms", "LayerPlan", "ObjectiveConfig",
    "adjacent_layer_loss", "batch_mean", "direction_loss", "ema_update", "flow_terms",
    "generalized_jsd_terms", "geometry_loss", "hidden_flow_loss", "layer_values", "opsd_loss",
    "opsd_token_divergence", "per_sample_flow", "phf_objective", "pointwise_mse_loss",
    "select_window", "transitions", "unit_directions",
]
