"""What crosses the rollout engine's boundary: sampling parameters in, completions out.

The boundary is token ids on both sides (no text): the trainer tokenizes prompts with the
same tokenizer it trains with, and decodes only for grading or logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions for one prompt (the fields vLLM and the fallback share)."""

    n: int = 1
    """completions per prompt."""
    temperature: float = 1.0
    """0 = greedy (argmax); > 0 divides the logits before softmax."""
    top_p: float = 1.0
    """nucleus mass in (0, 1]; 1 = off."""
    top_k: int = -1
    """keep the k most likely tokens; 0 or -1 = off."""
    max_tokens: int = 256
    """most new tokens per completion."""
    seed: int | None = None
    """None = engine's RNG. Else the completions of a request are a function of (seed, prompt,
    params) alone, independent of what else is in the batch: run twice, get the same tokens
    (same backend, same weights; numerics may differ across batch shapes on some kernels)."""
    stop_token_ids: tuple[int, ...] = ()
    """stop after emitting any of these (the token is kept in the completion). Engines add the
    model's EOS ids unless ``ignore_eos``."""
    ignore_eos: bool = False
    """True: do not stop at the model's EOS ids (only ``stop_token_ids`` and ``max_tokens``)."""
    logprobs: bool = False
    """return the log-probability of each sampled token, float32: raw (log_softmax of the logits,
    before temperature / top-k / top-p) or, on an engine built with ``logprobs_mode="processed"``,
    of the distribution it was drawn from (after them; greedy requests: raw)."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n: must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must lie in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k: must be -1 or 0 (off) or a positive count, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids: must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0


#: ``Completion.finish_reason`` values.
FINISH_STOP = "stop"        # emitted EOS or a stop token (kept as the last token)
FINISH_LENGTH = "length"    # reached max_tokens or the model's context length


@dataclass
class Completion:
    """One sampled continuation of a prompt."""

    token_ids: list[int]
    """new tokens only (the prompt is not repeated); a stop token, when hit, is the last one."""
    finish_reason: str
    """"stop" or "length"."""
    logprobs: list[float] | None = None
    """log-prob of each token in ``token_ids`` (same length) when requested (raw or processed:
    the engine's ``logprobs_mode``)."""
    extra: dict = field(default_factory=dict)
    """backend-specific details (never needed by the trainer)."""


def normalize_requests(prompt_token_ids, params) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt; checks the prompts are non-empty lists of ints."""
    if isinstance(params, SamplingParams):
        per_prompt = [params] * len(prompt_token_ids)
    else:
        per_prompt = list(params)
        if len(per_prompt) != len(prompt_token_ids):
            raise ValueError(f"params: got {len(per_prompt)} SamplingParams for {len(prompt_token_ids)} prompts")
    for i, ids in enumerate(prompt_token_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt_token_ids[{i}]: empty prompt")
        if any(not isinstance(t, int) or t < 0 for t in ids):
            raise ValueError(f"prompt_token_ids[{i}]: must be a list of non-negative ints")
    return per_prompt
