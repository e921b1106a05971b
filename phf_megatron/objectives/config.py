"""Objective hyperparameters with the paper's defaults (Appendix C, Table "Hyperparameters").

Imports no torch: the command line builds (and ``--help`` describes) this config before any
heavy import. The loss modules take their defaults and choices from here.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_EMA_DECAY = 0.999
"""rho of the EMA teacher (paper: 0.999)."""
DEFAULT_FLOW_ALPHA = 0.05
"""alpha, the flow coefficient (paper: 0.05 at every scale)."""
DEFAULT_WINDOW_BUDGET = 128
"""|W|, the most rollout positions the flow sees per sample (paper: 128)."""
#: The flow variants of ``hidden_flow_loss`` (``flow.py``).
FLOW_VARIANTS = ("phf", "local", "direction", "geometry", "pointwise_mse")
#: How the JSD clip applies (``opsd.py``): per vocabulary summand (official) or per token.
CLIP_MODES = ("element", "token")
#: ``flow_variant`` values: the paper's variants plus ``"none"`` (the OPSD-only ablation).
FLOW_CHOICES = FLOW_VARIANTS + ("none",)
#: ``TrainConfig.method``: what a step trains on (``training.methods``).
METHODS = ("phf", "sft", "grpo")
DEFAULT_SFT_MAX_LENGTH = 16000
#: GRPO's choices (TRL 0.26 ``GRPOConfig``; ``grpo.py`` transcribes each).
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
GRPO_SCALE_REWARDS = ("group", "batch", "none")
GRPO_IS_LEVELS = ("token", "sequence")
GRPO_VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class ObjectiveConfig:
    """What one PHF update optimizes: ``L_OPSD + flow_alpha * L_flow``."""

    flow_alpha: float = DEFAULT_FLOW_ALPHA
    """alpha, the one flow coefficient (paper: 0.05 at every scale)."""
    flow_variant: str = "phf"
    """phf (1/2 local + 1/2 adjacent) | local | direction | geometry | pointwise_mse | none (OPSD only)."""
    flow_layers: tuple[int, ...] | None = None
    """0-based layer indices for the selected-layers ablation; None = all layers (paper)."""
    flow_window: int = DEFAULT_WINDOW_BUDGET
    """|W|, the most rollout positions the flow sees per sample (paper: 128)."""
    flow_eps: float = 1e-6
    """epsilon of the direction normalizer ||dh|| + eps."""
    jsd_beta: float = 0.5
    """beta of the generalized JSD: 0.5 = the Jensen-Shannon divergence of the PHF paper (default);
    0 = forward KL(T||S), what every official OPSD script since the clip runs (--beta 0 at
    7448751); 1 = reverse KL(S||T). README "Recipe" lists the other differences."""
    jsd_temperature: float = 1.1
    """softmax temperature of the divergence; the official code uses the rollout temperature."""
    jsd_clip: float | None = 0.05
    """JSD clip (paper: 0.05 for 1.7B/4B, 0.06 for 8B), applied as ``jsd_clip_mode`` says (default: to each
    vocabulary summand, as the official code does); None disables it."""
    jsd_clip_mode: str = "element"
    """element (official: clamp each vocabulary summand) | token (clamp the token's sum)."""
    ema_decay: float = DEFAULT_EMA_DECAY
    """rho of the EMA teacher (paper: 0.999)."""
    top_k_loss: int | None = None
    """k: the divergence over the teacher's k most likely entries only, both distributions
    renormalized over them (official ``--top_k_loss``, ``opsd_trainer.py`` lines 430-435 at
    7448751; its 0 = off is None here); None: the whole vocabulary (paper, official scripts)."""
    use_tinker_loss: bool = False
    """The sampled-token loss ``-sg[log p_T(y) - log p_S(y)] * log p_S(y)`` instead of the JSD
    (official ``--use_tinker_loss``, lines 705-726; no clip, no beta, no top-k:
    ``objectives.sampled_token``); False: the clipped JSD (paper)."""

    def __post_init__(self) -> None:
        if self.flow_variant not in FLOW_CHOICES:
            raise ValueError(f"flow_variant: {self.flow_variant!r} is not one of {FLOW_CHOICES}")
        if self.flow_alpha < 0:
            raise ValueError(f"flow_alpha: must be >= 0, got {self.flow_alpha}")
        if self.flow_window < 2:
            raise ValueError(f"flow_window: needs at least 2 positions for one transition, got {self.flow_window}")
        if self.flow_eps <= 0:
            raise ValueError(f"flow_eps: must be > 0, got {self.flow_eps}")
        if not 0.0 <= self.jsd_beta <= 1.0:
            raise ValueError(f"jsd_beta: must lie in [0, 1], got {self.jsd_beta}")
        if self.jsd_temperature <= 0:
            raise ValueError(f"jsd_temperature: must be > 0, got {self.jsd_temperature}")
        if self.jsd_clip is not None and self.jsd_clip <= 0:
            raise ValueError(f"jsd_clip: must be > 0 or None (no clip), got {self.jsd_clip}")
        if self.jsd_clip_mode not in CLIP_MODES:
            raise ValueError(f"jsd_clip_mode: {self.jsd_clip_mode!r} is not one of {CLIP_MODES}")
        if not 0.0 <= self.ema_decay <= 1.0:
            raise ValueError(f"ema_decay: must lie in [0, 1], got {self.ema_decay}")
        if self.flow_layers is not None:
            self.flow_layers = tuple(int(x) for x in self.flow_layers)
        if self.top_k_loss is not None and self.top_k_loss < 1:
            raise ValueError(f"top_k_loss: must be >= 1, or None for the whole vocabulary (the official 0), "
                             f"got {self.top_k_loss}")
        if self.use_tinker_loss and self.top_k_loss is not None:
            raise ValueError("top_k_loss: the sampled-token loss (use_tinker_loss) scores one token, not a "
                             "vocabulary; set --objective.top_k_loss=null")
        if self.use_tinker_loss and self.jsd_clip is not None:
            raise ValueError("jsd_clip: the sampled-token loss (use_tinker_loss) has no clip (the official code "
                             "ignores --jsd_token_clip there); set --objective.jsd_clip=null")

    @property
    def uses_flow(self) -> bool:
        """False for the OPSD-only ablation (no capture, no flow term)."""
        return self.flow_variant != "none" and self.flow_alpha > 0


@dataclass
class SftConfig:
    """The SFT baseline (``--method sft``): teacher-forced cross-entropy on ``chat(problem) ; solution``.

    The paper's other SFT settings are existing ones, already at its values: LoRA r 64 / alpha 128
    (``lora.r``, ``lora.alpha``), lr 5e-6 (``optimizer.lr``), effective batch 32
    (``training.global_batch_size``; the official run: 64), step 100 (``training.train_iters``).
    """

    max_length: int = DEFAULT_SFT_MAX_LENGTH
    """Most tokens of one sequence, prompt + solution + EOS (paper and official ``--max_length``:
    16000); a longer one is cut at the end as TRL 0.26's SFTTrainer does (``truncate_dataset``)
    and counted in the metrics (``sft_truncated``)."""
    loss_on_prompt: bool = False
    """Also score the prompt tokens (the official baseline: TRL's SFTTrainer on a plain ``text``
    data set); False: the solution tokens only (paper)."""

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ValueError(f"max_length: needs at least 2 tokens (one predicted), got {self.max_length}")


@dataclass
class GrpoConfig:
    """The GRPO baseline (``--method grpo``): TRL 0.26's ``GRPOTrainer`` loss on the trainer's own rollouts.

    G, the completions per prompt, is ``rollout.n`` (TRL's ``num_generations``; paper 8). The paper's
    other GRPO settings are existing ones: effective batch 32 completions
    (``training.global_batch_size``), lr 5e-6 (``optimizer.lr``), LoRA, step 100. The official run
    (``scripts/run_grpo.sh`` at 7448751) also samples at temperature 1.2 (``rollout.temperature``)
    up to 16,000 tokens (``rollout.max_tokens``). Where the paper is silent the defaults below are
    the official run's values (TRL 0.26's defaults where the script sets nothing).
    """

    loss_type: str = "grpo"
    """How token losses are averaged (``objectives.grpo.token_weights``): grpo (each sequence's token
    mean, averaged over sequences; official) | bnpo | dr_grpo | dapo (TRL's default)."""
    scale_rewards: str = "group"
    """Advantage scaling: group (divide by each group's std; official) | batch | none (Dr. GRPO)."""
    num_iterations: int = 2
    """Optimizer steps per rollout batch (TRL's mu; official 2): the batch sampled for step k also
    trains step k+1, whose ratio to the sampling policy is then no longer 1."""
    epsilon: float = 0.2
    """Lower clip of the ratio, 1 - epsilon (official 0.2)."""
    epsilon_high: float | None = None
    """Upper clip, 1 + epsilon_high (None: = epsilon, as TRL)."""
    delta: float | None = None
    """INTELLECT-2's two-sided clip of the unclipped branch (None: off, as TRL)."""
    importance_sampling_level: str = "token"
    """token (GRPO) | sequence (GSPO): one ratio per token or the sequence's mean log-ratio."""
    beta: float = 0.0
    """KL coefficient against the reference model (adapters off); 0 (paper and official): no reference pass."""
    vllm_importance_sampling_correction: bool = True
    """Correct for the engine's sampling distribution differing from the trainer's (TRL's default, on
    in the official run): the loss times ``exp(log pi_old - log pi_engine)``, capped."""
    vllm_importance_sampling_mode: str = "sequence_mask"
    """token_truncate | token_mask | sequence_truncate | sequence_mask (TRL's default): per token or
    per sequence; truncate caps the ratio, mask drops what exceeds the cap."""
    vllm_importance_sampling_cap: float = 3.0
    """The cap C of the correction (TRL's default 3)."""
    mask_truncated_completions: bool = False
    """Leave completions cut at ``rollout.max_tokens`` out of the loss (TRL's default False)."""

    def __post_init__(self) -> None:
        for name, value, allowed in (("loss_type", self.loss_type, GRPO_LOSS_TYPES),
                                     ("scale_rewards", self.scale_rewards, GRPO_SCALE_REWARDS),
                                     ("importance_sampling_level", self.importance_sampling_level, GRPO_IS_LEVELS),
                                     ("vllm_importance_sampling_mode", self.vllm_importance_sampling_mode,
                                      GRPO_VLLM_IS_MODES)):
            if value not in allowed:
                raise ValueError(f"{name}: must be one of {', '.join(allowed)}, got {value!r}")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations: must be >= 1, got {self.num_iterations}")
        if not 0 < self.epsilon < 1:
            raise ValueError(f"epsilon: must lie in (0, 1), got {self.epsilon}")
        if self.epsilon_high is not None and self.epsilon_high <= 0:
            raise ValueError(f"epsilon_high: must be > 0, got {self.epsilon_high}")
        if self.delta is not None and self.delta <= 1:
            raise ValueError(f"delta: must be > 1 (a cap above the ratio 1), got {self.delta}")
        if self.beta < 0:
            raise ValueError(f"beta: must be >= 0, got {self.beta}")
        if self.vllm_importance_sampling_cap <= 0:
            raise ValueError(f"vllm_importance_sampling_cap: must be > 0, got {self.vllm_importance_sampling_cap}")

    @property
    def needs_old_logps(self) -> bool:
        """The old policy's log-probs are recomputed (a scoring pass) when a ratio can differ from 1
        or the engine's correction compares with them (TRL: ``num_iterations > 1`` or the correction)."""
        return self.num_iterations > 1 or self.vllm_importance_sampling_correction
