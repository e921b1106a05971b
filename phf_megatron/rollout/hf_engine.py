"""The transformers fallback engine: a batched sampling loop over a HF causal LM.

For machines without vLLM (the GPU image has none). It keeps its own copy of the model;
update_weights copies pushed tensors into it in place. Generation batches rows that share
sampling settings (left padding, one KV cache), with a per-row RNG so seeded requests are
reproducible whatever else is batched with them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from ..models.choices import as_dtype
from ..runtime.process_group import sees_gpus
from .engine import RolloutEngine
from .errors import EngineStartError, GenerationTimeoutError
from .sampling import filter_logits, row_generators, sample_tokens
from .sync import hf_reference_logprobs
from .types import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams
from .weights import WeightSpec



def engine_device(device: str | None) -> torch.device:
    """``device`` (default: cuda if available, else cpu); a ``ValueError`` naming the setting when it is not a device
    or a GPU past those this process sees (``cuda:5`` on 2: was torch's ``invalid device ordinal`` as the model
    moved, or later)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device: {device!r} is not a torch device (cpu, cuda, cuda:N)") from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if resolved.type == "cuda" and (resolved.index or 0) >= count:
        raise ValueError(f"device: {device!r}: {sees_gpus(count)}")
    return resolved


class HFEngine(RolloutEngine):
    """Rollouts with ``transformers`` (see the module docstring)."""

    def __init__(self, model_dir: str, *, dtype: str = "float32", device: str | None = None,
                 max_batch_size: int = 64, bucket_bytes: int = 1 << 30, timeout_s: float | None = None,
                 max_model_len: int | None = None, logprobs_mode: str = "raw"):
        torch_dtype = as_dtype(dtype)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        device = engine_device(device)
        try:
            config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, local_files_only=True)
        except Exception as exc:
            raise EngineStartError(f"transformers could not load {model_dir!r}: {type(exc).__name__}: {exc}") from exc
        self.model = model.to(device).eval()
        self.device = device
        self.max_batch_size = max_batch_size
        self.processed_logprobs = logprobs_mode == "processed"
        """``SamplingParams.logprobs`` of the filtered distribution the token was drawn from (``EngineConfig.logprobs_mode``)."""
        self.max_model_len = max_model_len or int(getattr(config, "max_position_embeddings", 1 << 30))
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = eos if eos is not None else config.eos_token_id
        self.eos_token_ids = tuple(eos if isinstance(eos, (list, tuple)) else ([] if eos is None else [eos]))
        tied = bool(getattr(config, "tie_word_embeddings", False))
        super().__init__(WeightSpec.from_module(self.model, tied=tied), bucket_bytes=bucket_bytes, timeout_s=timeout_s)
        self._params = dict(self.model.state_dict(keep_vars=True))

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def _load_bucket(self, bucket):
        for name, tensor in bucket:
            self._params[name].copy_(tensor.to(self.device, non_blocking=True))

    def _fingerprints(self, names, projections, seed):
        from .fingerprint import tensor_fingerprint
        return {n: tensor_fingerprint(self._params[n], n, projections, seed) if n in self._params else None
                for n in names}

    # ------------------------------------------------------------------ scoring
    def _score(self, prompt, completion):
        return hf_reference_logprobs(self.model, prompt, completion)

    # ------------------------------------------------------------------ generation
    def _generate(self, prompts, params, on_done):
        results: list[list[Completion | None]] = [[None] * p.n for p in params]
        rows_by_setting: dict[SamplingParams, list[tuple[int, int, torch.Generator]]] = defaultdict(list)
        for i, p in enumerate(params):
            key = dataclasses.replace(p, n=1, seed=None)
            for j, g in enumerate(row_generators(p, p.n, self.device)):
                rows_by_setting[key].append((i, j, g))
        for setting, rows in rows_by_setting.items():
            for start in range(0, len(rows), self.max_batch_size):
                chunk = rows[start:start + self.max_batch_size]
                outs = self._sample_batch([prompts[i] for i, _, _ in chunk], setting, [g for _, _, g in chunk])
                for (i, j, _), out in zip(chunk, outs):
                    results[i][j] = out
                if on_done:
                    on_done(len(outs), sum(len(o.token_ids) for o in outs))
        return results

    @torch.no_grad()
    def _sample_batch(self, prompts: list[list[int]], params: SamplingParams,
                      generators: list[torch.Generator]) -> list[Completion]:
        """Sample one completion per row; prompts are left-padded into one batch."""
        b, width = len(prompts), max(len(p) for p in prompts)
        budget = min(params.max_tokens, self.max_model_len - width)
        if budget < 1:
            raise ValueError(f"prompt of {width} tokens leaves no room under max_model_len={self.max_model_len}")
        stop = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        ids = torch.zeros(b, width, dtype=torch.long, device=self.device)
        mask = torch.zeros(b, width, dtype=torch.long, device=self.device)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p, device=self.device)
            mask[r, width - len(p):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)                                 # [B, T]
        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        tokens: list[list[int]] = [[] for _ in range(b)]
        logprobs: list[list[float]] = [[] for _ in range(b)]
        done = [False] * b
        last_pos = positions[:, -1:]
        for _ in range(budget):
            if self._cancel.is_set():
                raise GenerationTimeoutError("generation cancelled (timeout)")
            logits = out.logits[:, -1].float()                                         # [B, V]
            nxt = sample_tokens(logits, params, generators)                            # [B]
            if params.logprobs:
                drawn_from = filter_logits(logits, params) if self.processed_logprobs and not params.greedy else logits
                lp = torch.log_softmax(drawn_from, dim=-1).gather(-1, nxt[:, None])[:, 0].tolist()
            for r, t in enumerate(nxt.tolist()):
                if done[r]:
                    continue
                tokens[r].append(t)
                if params.logprobs:
                    logprobs[r].append(lp[r])
                done[r] = t in stop
            if all(done):
                break
            mask = torch.cat([mask, mask.new_ones(b, 1)], dim=-1)
            last_pos = last_pos + 1
            out = self.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos,
                             past_key_values=cache, use_cache=True)
        return [Completion(token_ids=tokens[r], finish_reason=FINISH_STOP if done[r] else FINISH_LENGTH,
                           logprobs=logprobs[r] if params.logprobs else None) for r in range(b)]
