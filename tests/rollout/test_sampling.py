"""Sampling filters against brute-force definitions; SamplingParams validation."""

import math

import pytest
import torch

from phf_megatron.rollout.sampling import filter_logits, row_generators, sample_tokens
from phf_megatron.rollout.types import SamplingParams


def _reference_keep(logits_row, top_k, top_p):
    """Brute force: rank tokens; keep rank < k, and the smallest prefix with mass >= p."""
    order = sorted(range(len(logits_row)), key=lambda i: -logits_row[i])
    if top_k > 0:
        order = order[:top_k]
    if top_p >= 1.0:
        return set(order)
    top = logits_row[order[0]]
    z = sum(math.exp(logits_row[i] - top) for i in order)
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += math.exp(logits_row[i] - top) / z
        if mass >= top_p:
            break
    return set(kept)


@pytest.mark.parametrize("vocab,spread", [(40, 2.0), (3000, 2.0), (3000, 12.0)], ids=["small", "flat", "peaked"])
@pytest.mark.parametrize("top_k,top_p", [(-1, 1.0), (5, 1.0), (0, 0.7), (7, 0.5), (3, 0.999), (-1, 0.05), (-1, 0.9)])
def test_filter_keeps_exactly_the_reference_set(top_k, top_p, vocab, spread):
    """"peaked" takes the top-256 candidate path of top-p, "flat" the full-sort fallback."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, vocab, generator=g, dtype=torch.float64) * spread
    params = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p)
    out = filter_logits(logits, params)
    for r in range(4):
        kept = set(torch.nonzero(torch.isfinite(out[r])).flatten().tolist())
        assert kept == _reference_keep((logits[r] / 0.8).tolist(), top_k, top_p)
        # kept entries are the tempered logits, unchanged
        idx = sorted(kept)
        torch.testing.assert_close(out[r, idx], logits[r, idx] / 0.8)


def test_sampled_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).repeat(20000, 1)
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=3, n=20000)
    draws = sample_tokens(logits, params, row_generators(params, 20000, torch.device("cpu")))
    want = torch.softmax(filter_logits(logits[:1].double(), params), dim=-1)[0]
    freq = torch.bincount(draws, minlength=6).double() / 20000
    assert want[-2:].sum() == 0 and freq[-2:].sum() == 0          # filtered tokens are never drawn
    sigma = (want * (1 - want) / 20000).sqrt()
    assert bool(((freq - want).abs() <= 4 * sigma + 1e-12).all()), (freq, want)


def test_seeded_rows_do_not_depend_on_their_batch_neighbours():
    params = SamplingParams(temperature=1.0, seed=11, n=3)
    logits = torch.randn(3, 50)
    alone = sample_tokens(logits[1:2], params, row_generators(params, 3, torch.device("cpu"))[1:2])
    batched = sample_tokens(logits, params, row_generators(params, 3, torch.device("cpu")))
    assert alone.item() == batched[1].item()


def test_greedy_is_argmax():
    logits = torch.randn(5, 30)
    assert torch.equal(sample_tokens(logits, SamplingParams(temperature=0.0), []), logits.argmax(-1))


@pytest.mark.parametrize("kwargs,field", [
    (dict(n=0), "n"), (dict(temperature=-1), "temperature"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"), (dict(max_tokens=0), "max_tokens"),
    (dict(stop_token_ids=(-1,)), "stop_token_ids"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)
