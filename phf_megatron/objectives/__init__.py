"""PHF and OPSD objectives: pure PyTorch, one device, no Megatron. The oracle for the rest.

Submodules load on first use (``lazy_exports``): ``objectives.config`` imports without torch.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ("FLOW_CHOICES", "FLOW_VARIANTS", "ObjectiveConfig"),
    "ema": ("ema_update",),
    "flow": ("FlowTerms", "LayerPlan", "TermsFunction", "adjacent_layer_loss", "batch_mean", "cross_gram",
             "direction_loss", "flow_terms", "geometry_loss", "gram", "hidden_flow_loss", "layer_loss",
             "per_sample_flow", "pointwise_mse_loss", "transitions", "unit_directions"),
    "phf": ("phf_objective",),
    "opsd": ("clip_statistics", "generalized_jsd_terms", "opsd_loss", "opsd_token_divergence", "restrict_to_top_k",
             "top_k_indices"),
    "sampled_token": ("sampled_token_loss", "sampled_token_terms", "token_log_probs"),
    "window": ("select_window",),
})
