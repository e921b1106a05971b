"""PHF and OPSD objectives: pure PyTorch, one device, no Megatron. The oracle for the rest.

Submodules load on first use (``lazy_exports``): ``objectives.config`` imports without torch.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ("FLOW_CHOICES", "FLOW_VARIANTS", "ObjectiveConfig"),
    "ema": ("ema_update", "phf_objective"),
    "flow": ("FlowTerms", "LayerPlan", "adjacent_layer_loss", "batch_mean", "direction_loss", "flow_terms",
             "geometry_loss", "hidden_flow_loss", "layer_values", "per_sample_flow", "pointwise_mse_loss",
             "transitions", "unit_directions"),
    "opsd": ("clip_statistics", "generalized_jsd_terms", "opsd_loss", "opsd_token_divergence", "restrict_to_top_k",
             "top_k_indices"),
    "sampled_token": ("sampled_token_loss", "sampled_token_terms", "token_log_probs"),
    "window": ("select_window",),
})
