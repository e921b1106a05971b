"""The SFT baseline's micro-batch and forward-step function for Megatron's ``forward_backward_func``.

One pass, the student's, with gradient; no teacher pass, no capture, no flow. The last stage
projects only the scored rows (``logit_rows``) and takes ``log p(y)`` of each scored token with
the one vocabulary-parallel log-softmax (``sampled_token.vocab_parallel_token_logprob`` at
temperature 1). The step's loss is the token mean of ``objectives.sft_loss``: each micro-batch
returns its share ``sum_t -log p(y_t) / N_tok`` with ``N_tok`` the scored tokens of the whole step
(all micro-batches, all data-parallel ranks: one all-reduce in ``prepare``), handed to Megatron by
``loss.megatron_return`` as the PHF loss is. HF's causal-LM loss under gradient accumulation
(``num_items_in_batch``) and TRL's SFTTrainer normalize the same way.

    step = SftStep(model_config, tp_group=..., dp_group=...)
    step.prepare(microbatches)
    logs = fb(forward_step_func=step.student_forward_step, data_iterator=iter(microbatches), model=student,
              num_microbatches=n, seq_length=step.student_seq_length(T), micro_batch_size=b)
    metrics = step.reduce_logs(logs)   # last stage: loss, num_tokens, sequences
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist

from .batch import PhfMicroBatch
from .collectives import all_reduce_, group_size
from .layout import SequenceLayout
from .logit_rows import scored_logits
from .loss import LOSS, LOSS_TOKENS, LossConventions, _token_logs, megatron_return, sum_logs, top_loss_tokens
from .sampled_token import vocab_parallel_token_logprob
from .step import _no_loss, final_hidden_states
from .vocab_parallel_jsd import DEFAULT_CHUNK_ELEMENTS

class ScoredTokens:
    """What the SFT and GRPO micro-batches share: ``student_tokens``, ``scored`` and ``layout`` checked (one line
    naming the field), ``layout`` defaulted to ``SequenceLayout.pad``, and the scored tokens found:
    ``score_index [N]`` (flat positions that predict a scored token), ``score_tokens [N]``, ``num_tokens``."""

    student_tokens: torch.Tensor
    scored: torch.Tensor
    layout: SequenceLayout | None

    def __post_init__(self) -> None:
        if self.student_tokens.dim() != 2 or self.student_tokens.dtype != torch.long:
            raise ValueError(f"student_tokens: expected a [B, T] long tensor, got {self.student_tokens.dtype} "
                             f"{tuple(self.student_tokens.shape)}")
        if self.scored.shape != self.student_tokens.shape or self.scored.dtype != torch.bool:
            raise ValueError(f"scored: expected a bool tensor of shape {tuple(self.student_tokens.shape)}, got "
                             f"{self.scored.dtype} {tuple(self.scored.shape)}")
        if self.layout is None:
            self.layout = SequenceLayout.pad(self.student_tokens)
        elif self.layout.tokens is not self.student_tokens and not torch.equal(self.layout.tokens, self.student_tokens):
            raise ValueError("student_tokens: must be the layout's tokens")
        if bool((self.scored & self.layout.sequence_starts()).any()):
            raise ValueError("scored: a sequence's first token has no predecessor to predict it")
        self.score_index = PhfMicroBatch.score_index(self.scored)
        self.score_tokens = self.student_tokens.reshape(-1)[self.score_index + 1]
        self.num_tokens = int(self.score_index.numel())

    @property
    def batch_size(self) -> int:
        """Activation rows (the schedule's ``micro_batch_size``: 1 when packed)."""
        return self.student_tokens.shape[0]

    @property
    def num_sequences(self) -> int:
        return self.layout.num_sequences


@dataclass
class SftMicroBatch(ScoredTokens):
    """``student_tokens [b_act, S]`` (the activation: ``layout.tokens``), ``scored [b_act, S]`` bool (True on the
    tokens the loss predicts; never a sequence's first token) and the ``layout`` (default: right-padded rows,
    ``SequenceLayout.pad``). ``SftMicroBatch.packed`` builds the packed one from per-sample rows."""

    student_tokens: torch.Tensor
    scored: torch.Tensor
    layout: SequenceLayout | None = None

    @classmethod
    def packed(cls, tokens: torch.Tensor, scored: torch.Tensor, lengths: torch.Tensor, *, pad_multiple: int = 1,
               pad_id: int = 0, total: int | None = None) -> "SftMicroBatch":
        """Right-padded per-sample ``tokens``/``scored [B, T]`` with their ``lengths [B]``, packed into one row
        (``SequenceLayout.pack``)."""
        layout = SequenceLayout.pack(tokens, lengths, pad_multiple, pad_id, total)
        return cls(layout.tokens, layout.place(scored, False), layout)

    def to(self, device) -> "SftMicroBatch":
        return SftMicroBatch(self.student_tokens.to(device), self.scored.to(device), self.layout.to(device))


class SftStep:
    """The student pass of one SFT update (same interface as ``PhfStep``'s student side). ``GrpoStep``
    extends it (the same student pass over scored tokens, with its own loss and scoring passes).

    Args:
        config: the student's Megatron ``TransformerConfig``.
        tp_group, dp_group: tensor- and data-parallel groups (None: size 1).
        chunk_elements: the log-softmax's temporary size (float32 elements).
    """

    temperature = 1.0
    """Log-probs are of ``z / temperature`` (SFT: the model's own distribution)."""

    def __init__(self, config, *, tp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None,
                 chunk_elements: int = DEFAULT_CHUNK_ELEMENTS):
        self.config = config
        self.tp_group, self.dp_group = tp_group, dp_group
        self.sequence_parallel = bool(config.sequence_parallel)
        self.chunk_elements = chunk_elements
        self.collect_loss_tokens = False
        self.num_tokens: int | None = None
        self.conventions: LossConventions | None = None

    def prepare(self, microbatches: list[SftMicroBatch]) -> int:
        """The step's scored tokens over every micro-batch and data-parallel rank (one all-reduce)."""
        [self.num_tokens] = self._step_sums(microbatches, [sum(mb.num_tokens for mb in microbatches)])
        return self.num_tokens

    def _step_sums(self, microbatches: list, local: list[int]) -> list[int]:
        """This rank's counts ``local`` summed over the data-parallel ranks (one all-reduce); sets the step's
        loss conventions (``microbatches``: this rank's)."""
        total = all_reduce_(torch.tensor([float(v) for v in local], dtype=torch.float64,
                                         device="cuda" if torch.cuda.is_available() else "cpu"), self.dp_group)
        self.conventions = LossConventions(bool(self.config.calculate_per_token_loss), len(microbatches),
                                           group_size(self.dp_group))
        return [int(v) for v in total.tolist()]

    def student_seq_length(self, seq_len: int) -> int:
        return seq_len

    def student_forward_step(self, data_iterator, model):
        mb = next(data_iterator)
        if self.conventions is None:
            raise RuntimeError(f"{type(self).__name__}.prepare(microbatches) must run before the student pass")
        output, last = self._forward(model, mb)
        return output, (partial(self._loss, mb, model) if last else _no_loss)

    def _forward(self, model, mb):
        """``(output, last stage?)``: the last stage stops at the final norm (the loss projects scored rows)."""
        from ..models.provider import unwrap  # Megatron: on first use

        tokens, kwargs = mb.student_tokens, mb.layout.forward_kwargs()
        if unwrap(model).post_process:
            return final_hidden_states(model, tokens, **kwargs), True
        return model(input_ids=tokens, **kwargs), False

    def _token_logps(self, model, output, mb) -> torch.Tensor:
        """``[N]`` ``log softmax(z / temperature)[y_t]`` of the scored tokens (float32, differentiable)."""
        index = mb.score_index.to(output.device)
        logits = scored_logits(model, output, index, mb.student_tokens.shape[1], self.tp_group, self.sequence_parallel)
        rows = torch.arange(index.numel(), device=output.device)
        return vocab_parallel_token_logprob(logits, rows, mb.score_tokens.to(output.device), self.temperature,
                                            self.tp_group, self.chunk_elements)

    def _vocab(self, model) -> int:
        from ..models.lm_head import output_weight

        return output_weight(model).shape[0] * group_size(self.tp_group)

    def _loss(self, mb: SftMicroBatch, model, output):
        nll = -self._token_logps(model, output, mb)
        nll_sum = nll.sum()
        n_tok = max(self.num_tokens, 1)
        dev = nll_sum.device
        logs = {"nll_sum": nll_sum.detach().double().reshape(1),
                "num_tokens": torch.full((1,), mb.num_tokens, dtype=torch.float64, device=dev),
                "sequences": torch.full((1,), mb.num_sequences, dtype=torch.float64, device=dev)}
        if self.collect_loss_tokens:
            logs.update(_token_logs(nll.detach(), mb.score_tokens.to(dev), self._vocab(model)))
        return megatron_return(nll_sum / n_tok, mb.num_tokens, n_tok, self.conventions, logs)

    def reduce_logs(self, logs: list[dict]) -> dict | None:
        """``loss`` (the step's token-mean cross-entropy), ``num_tokens``, ``sequences`` (and ``loss_tokens`` when collected): last pipeline stage; None elsewhere."""
        if not logs:
            return None
        sums = sum_logs(logs, self.dp_group)
        metrics = {LOSS: float(sums["nll_sum"][0] / sums["num_tokens"][0].clamp(min=1)),
                   "num_tokens": int(sums["num_tokens"][0]), "sequences": int(sums["sequences"][0])}
        if "token_loss" in sums:
            metrics[LOSS_TOKENS] = top_loss_tokens(sums["token_loss"], sums["token_count"],
                                                   float(sums["token_abs_loss"][0]))
        return metrics

    def finish(self) -> None:
        """Nothing to detach (no capture)."""
