"""The output-loss options and the clip diagnostics under TP=2 (vocabulary split) and PP=2 equal the
single-process reference.

One spawn of 2 gloo ranks (``output_options_ranks``):

* the pieces: the global top-k JSD (with ties at the k-th value across the two vocabulary
  halves, k smaller and larger than a rank's 25 entries), the sampled token's log-probability,
  the clip statistics; values, gradients and statistics to 1e-12 (float64);
* one PHF step through Megatron's schedule at TP=2 + SP and at PP=2, for ``top_k_loss`` (with the
  element and the token clip), ``use_tinker_loss`` and the default JSD: loss, gradients, and the
  diagnostics (``opsd_unclipped``, ``clip_frac_tokens``, ``clip_frac_entries``, the loss by rollout
  token id) against ``reference.hf_reference`` (float64 HF Qwen3), ``1e-5`` relative as in
  ``test_phf_step.py``.
"""

import functools

import pytest

from ..helpers.spawn import run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model
from . import reference
from .harness import merge_rank_results
from .output_options_ranks import OPTIONS, PLANS, run
from .phf_ranks import STUDENT_SEED, TEACHER_SEED, VOCAB

REL_TOL = 1e-5
# The sampled-token loss -sg[b - a] a multiplies log-probs a, b ~ -log(256) by their small
# difference: float32 rounding of a and b (~3e-7 each) moves each token's term by ~2e-6 absolutely.
TINKER_ABS = 5e-6
CASES = [(name, v) for name, _, _, variants in PLANS for v in variants]


@pytest.fixture(scope="module")
def results():
    per_rank = run_ranks(run, 2)
    return merge_rank_results(per_rank, {"collectives": [r.pop("collectives") for r in per_rank]})


@functools.lru_cache(maxsize=None)
def _reference(variant):
    student = tiny_hf_model("gqa", seed=STUDENT_SEED).double()
    teacher = tiny_hf_model("gqa", seed=TEACHER_SEED).double()
    return reference.hf_reference(student, teacher, reference.microbatches(VOCAB), OPTIONS[variant],
                                  student.config.num_hidden_layers)


def test_pieces_equal_the_reference_with_the_vocabulary_split(results):
    for rank_errors in results["collectives"]:
        assert len(rank_errors) == 13 and all(e < 1e-12 for e in rank_errors.values()), rank_errors


@pytest.mark.parametrize("layout,variant", CASES)
def test_step_loss_gradients_and_diagnostics_equal_the_reference(results, layout, variant):
    got, ref = results[(layout, variant)], _reference(variant)
    metrics = got["metrics"]
    absolute = TINKER_ABS if OPTIONS[variant].use_tinker_loss else 1e-7
    for key in ("loss", "loss_opsd", "loss_flow"):
        assert metrics[key] == pytest.approx(ref[key], rel=REL_TOL, abs=absolute), key
    bad = {}
    for name, g_ref in ref["grads"].items():
        err = (got["grads"][name].double() - g_ref).abs().max() / g_ref.abs().max()
        if not err <= REL_TOL:
            bad[name] = float(err)
    assert set(got["grads"]) == set(ref["grads"]) and not bad, bad
    if OPTIONS[variant].use_tinker_loss:  # no divergence, nothing clipped: no clip diagnostics
        assert "clip_frac_tokens" not in metrics
        return
    for key in ("opsd_unclipped", "clip_frac_tokens", "clip_frac_entries"):
        assert (key in metrics) == (key in ref), key
        if key in ref:
            assert metrics[key] == pytest.approx(ref[key], rel=REL_TOL, abs=1e-9), key
    assert 0 < metrics["clip_frac_tokens"] < 1 and metrics["opsd_unclipped"] > metrics["loss_opsd"]
    # the 20 largest shares (ids with equal shares may come in either order), each id's share and count
    ref_by_id = {tok: (share, count) for tok, share, count in ref["loss_tokens"]}
    got = metrics["loss_tokens"]
    assert len(got) == 20 and [s for _, s, _ in got] == pytest.approx([s for _, s, _ in ref["loss_tokens"][:20]],
                                                                      rel=REL_TOL)
    for tok, share, count in got:
        assert share == pytest.approx(ref_by_id[tok][0], rel=REL_TOL) and count == ref_by_id[tok][1]
