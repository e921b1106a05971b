"""Packed SFT micro-batches (``training.packing``) give the padded step's update at every layout.

The same batch and oracle as ``test_sft_step`` (HF Qwen3's float64 cross-entropy on the whole
right-padded batch, and its gradient), but each micro-batch is packed into one row
(``SftMicroBatch.packed``: positions restarting per sequence, block-diagonal causal attention,
the row padded to the rank's one packed length, a multiple of TP under sequence parallelism,
with a trailing pad segment). The batch holds a one-token completion (sample 1), and the
layouts cut it so that some packed rows end exactly at the TP multiple and others carry a pad
segment. Loss and every parameter's gradient, at float32 tolerance against float64, at: one
process (2 micro-batches); TP=2 + SP (2 micro-batches: no pad segment; 4: each with one); PP=2
(tied, recompute); PP=2 x VPP=2; DP=2 (both loss conventions).
"""

import functools

import pytest

from ..helpers.spawn import run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model
from .harness import Layout, assert_grads_close, merge_rank_results
from .sft_ranks import SEED, global_batch, hf_sft_reference, run_sft_layouts, sft_microbatches

ONE_RANK = [("single", Layout(num_micro=2, packed=True), "gqa")]
TWO_RANKS = [
    ("tp2_sp", Layout(tp=2, sp=True, num_micro=2, packed=True), "gqa"),
    ("tp2_sp_pad_segment", Layout(tp=2, sp=True, num_micro=4, packed=True), "gqa"),
    ("pp2_tied_recompute", Layout(pp=2, num_micro=2, recompute=True, per_token_loss=False, packed=True), "tied"),
    ("pp2_vpp2", Layout(pp=2, vpp=2, num_micro=4, overrides={"batch_p2p_comm": False}, packed=True), "gqa"),
    ("dp2", Layout(num_micro=2, packed=True), "gqa"),
    ("dp2_legacy_loss", Layout(num_micro=2, per_token_loss=False, packed=True), "gqa"),
]
MODEL_OF = {name: model for name, _, model in ONE_RANK + TWO_RANKS}
CASES = [(name, p) for name in MODEL_OF for p in (False, True)]
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    merged = merge_rank_results(run_ranks(run_sft_layouts, 1, ONE_RANK))
    return merge_rank_results(run_ranks(run_sft_layouts, 2, TWO_RANKS), merged)


@functools.lru_cache(maxsize=None)
def _reference(model_name, with_prompt):
    return hf_sft_reference(tiny_hf_model(model_name, seed=SEED).double(), with_prompt)


@pytest.mark.parametrize("layout,with_prompt", CASES)
def test_packed_loss_and_gradients_equal_the_padded_step(layout, with_prompt, results):
    got, ref = results[(layout, with_prompt)], _reference(MODEL_OF[layout], with_prompt)
    assert got["metrics"]["loss"] == pytest.approx(ref["loss"], rel=REL_TOL)
    assert got["metrics"]["num_tokens"] == ref["num_tokens"]
    assert got["metrics"]["sequences"] == global_batch(with_prompt)[0].shape[0]
    assert_grads_close(got["grads"], ref["grads"], REL_TOL)


def test_the_layouts_cover_a_pad_segment_and_the_tp_boundary():
    """TP=2 + SP's packed rows: with 2 micro-batches each ends exactly at the multiple of 2 (no pad segment),
    with 4 each carries a trailing pad segment; every micro-batch is one row of the rank's one length and
    scores what the padded micro-batch scores."""
    for num_micro, pad_segment in ((2, False), (4, True)):
        mbs = sft_microbatches(True, num_micro=num_micro, packed=True, pad_multiple=2)
        seq_len = mbs[0].layout.seq_len
        assert seq_len % 2 == 0 and {mb.student_tokens.shape for mb in mbs} == {(1, seq_len)}
        assert all((int(mb.layout.lengths.sum()) < seq_len) == pad_segment for mb in mbs)
        for mb, ref in zip(mbs, sft_microbatches(True, num_micro=num_micro)):
            assert mb.num_tokens == ref.num_tokens and mb.num_sequences == ref.batch_size
            assert mb.score_tokens.tolist() == ref.score_tokens.tolist()
