"""One SFT step on Megatron-Core equals HF transformers' causal-LM cross-entropy at every layout.

Oracle: ``objectives.sft_loss`` on HF Qwen3's float64 logits of the whole batch, and its gradient;
it equals HF's own causal-LM loss (``labels`` -100 off the scored tokens, ``ForCausalLMLoss``, a
token mean) to float32 precision, as HF computes that loss in float32. Under test: ``SftStep`` through Megatron's
schedules on the converted model, scored on the completion only and with the prompt tokens too
(``sft.loss_on_prompt``), at: one process (2 micro-batches); TP=2 with sequence parallelism;
PP=2 with tied embeddings and recomputation under the (loss, logs) convention; interleaved
PP=2 x VPP=2; DP=2 under both conventions. The harness builds float32 Megatron models (as
``test_phf_step``), so the tolerance is float32's against the float64 oracle: loss and every
parameter's gradient, per tensor ``max|g - g_ref| <= 1e-5 * max|g_ref|``.

Packed (``training.packing``, the ``*_packed`` layouts): each micro-batch packed into one row
(``SftMicroBatch.packed``: positions restarting per sequence, block-diagonal causal attention, the
row padded to the rank's one packed length, a multiple of TP under sequence parallelism, with a
trailing pad segment) gives the same loss and gradients against the same oracle. The batch holds
a one-token completion (sample 1); TP=2 + SP packed with 2 micro-batches ends every row exactly at
the TP multiple, with 4 every row carries a pad segment.

Token budget (``training.max_tokens_per_microbatch``, the ``*_budget`` layouts): the samples grouped by
``token_budget_plan`` (LPT over DP ranks, first-fit decreasing inside each), so DP ranks run different
numbers of micro-batches of different sizes: the same loss and gradients against the same oracle, and
equal to the fixed micro-batching's, under per-token and the legacy (loss, logs) convention.
"""

import dataclasses
import functools

import pytest

from ..helpers.spawn import run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model
from .harness import Layout, assert_grads_close, merge_rank_results
from .sft_ranks import SEED, global_batch, hf_sft_reference, run_sft_layouts, sft_microbatches

PADDED_ONE_RANK = [("single", Layout(num_micro=2), "gqa")]
PADDED_TWO_RANKS = [
    ("tp2_sp", Layout(tp=2, sp=True, num_micro=2), "gqa"),
    ("pp2_tied_recompute", Layout(pp=2, num_micro=2, recompute=True, per_token_loss=False), "tied"),
    ("pp2_vpp2", Layout(pp=2, vpp=2, num_micro=4, overrides={"batch_p2p_comm": False}), "gqa"),
    ("dp2", Layout(num_micro=2), "gqa"),
    ("dp2_legacy_loss", Layout(num_micro=2, per_token_loss=False), "gqa"),
]


def _packed(cases):
    return [(f"{name}_packed", dataclasses.replace(layout, packed=True), model) for name, layout, model in cases]


#: ``training.max_tokens_per_microbatch``: token-budget micro-batches (packed). Budget 20 on one rank: 4
#: micro-batches of 2 sequences; 18 over DP=2: 2 on rank 0, 3 on rank 1 (one of a single sequence), samples
#: spread by LPT, not contiguous (``test_the_budget_layouts_give_unequal_counts``).
BUDGET_ONE_RANK = [("single_budget", Layout(packed=True, max_tokens=20), "gqa")]
BUDGET_TWO_RANKS = [
    ("dp2_budget", Layout(packed=True, max_tokens=18), "gqa"),
    ("dp2_legacy_loss_budget", Layout(packed=True, max_tokens=18, per_token_loss=False), "gqa"),
    ("tp2_sp_budget", Layout(tp=2, sp=True, packed=True, max_tokens=18), "gqa"),
    ("pp2_budget", Layout(pp=2, packed=True, max_tokens=18), "gqa"),
]
ONE_RANK = PADDED_ONE_RANK + _packed(PADDED_ONE_RANK) + BUDGET_ONE_RANK
TWO_RANKS = PADDED_TWO_RANKS + _packed(PADDED_TWO_RANKS) + [
    ("tp2_sp_pad_segment_packed", Layout(tp=2, sp=True, num_micro=4, packed=True), "gqa")] + BUDGET_TWO_RANKS
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
def test_loss_and_gradients_equal_hf_cross_entropy(layout, with_prompt, results):
    got, ref = results[(layout, with_prompt)], _reference(MODEL_OF[layout], with_prompt)
    assert got["metrics"]["loss"] == pytest.approx(ref["loss"], rel=REL_TOL)
    assert got["metrics"]["num_tokens"] == ref["num_tokens"]
    assert got["metrics"]["sequences"] == global_batch(with_prompt)[0].shape[0]
    assert_grads_close(got["grads"], ref["grads"], REL_TOL)


@pytest.mark.parametrize("layout", ["single", "tp2_sp", "pp2_vpp2_packed", "dp2_budget"])
def test_the_loss_by_token_equals_the_oracles(layout, results):
    """``loss_tokens`` (the 20 token ids of largest summed ``-log p``, each as a share of ``sum_t |-log p_t|``,
    and its count) against the oracle's per-token cross-entropy."""
    for with_prompt in (False, True):
        top, ref = results[(layout, with_prompt)]["metrics"]["loss_tokens"], _reference(MODEL_OF[layout], with_prompt)
        assert len(top) == min(20, int((ref["token_count"] > 0).sum()))
        scale = ref["nll_scale"]
        assert top[0][1] * scale == pytest.approx(float(ref["token_nll"].max()), rel=REL_TOL)
        for token, share, count in top:
            assert count == int(ref["token_count"][token])
            assert share * scale == pytest.approx(float(ref["token_nll"][token]), abs=REL_TOL * scale)


def test_the_prompt_tokens_change_the_loss():
    """The two scorings differ (the prompt flag is not a no-op in the batch the test feeds)."""
    assert _reference("gqa", True)["num_tokens"] > _reference("gqa", False)["num_tokens"]
    assert _reference("gqa", True)["loss"] != pytest.approx(_reference("gqa", False)["loss"], rel=1e-3)


def test_hf_causal_lm_loss_equals_the_oracle():
    """HF's own loss (``labels``, -100 off the scored tokens; ``ForCausalLMLoss``) equals the oracle and its
    gradient, to float32 precision: HF casts the logits to float32 inside its loss even for a float64 model."""
    import torch

    model = tiny_hf_model("gqa", seed=SEED).double()
    for with_prompt in (False, True):
        tokens, scored = global_batch(with_prompt)
        ref = _reference("gqa", with_prompt)
        model.zero_grad()
        loss = model(input_ids=tokens, labels=torch.where(scored, tokens, torch.full_like(tokens, -100))).loss
        loss.backward()
        assert float(loss.detach()) == pytest.approx(ref["loss"], rel=1e-6)
        for name, p in model.named_parameters():
            g_ref = ref["grads"][name]
            assert float((p.grad - g_ref).abs().max() / g_ref.abs().max()) <= 1e-5, name


def test_the_packed_layouts_cover_a_pad_segment_and_the_tp_boundary():
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


def test_the_budget_layouts_give_unequal_counts():
    """The DP=2 budget spreads the samples unevenly in count (2 and 3 micro-batches) and not contiguously; every
    micro-batch stays within the budget, and the ranks together score every sample once."""
    ranks = [sft_microbatches(True, r, 2, packed=True, max_tokens=18) for r in range(2)]
    assert [len(mbs) for mbs in ranks] == [2, 3]
    assert all(int(mb.layout.lengths.sum()) <= 18 for mbs in ranks for mb in mbs)
    assert sum(mb.num_sequences for mbs in ranks for mb in mbs) == global_batch(True)[0].shape[0]
    assert sum(mb.num_tokens for mbs in ranks for mb in mbs) == int(global_batch(True)[1].sum())
    assert len(sft_microbatches(True, packed=True, max_tokens=20)) == 4


@pytest.mark.parametrize("budget,fixed", [("single_budget", "single_packed"), ("dp2_budget", "dp2_packed"),
                                          ("dp2_legacy_loss_budget", "dp2_legacy_loss_packed"),
                                          ("tp2_sp_budget", "tp2_sp_packed")])
def test_a_token_budget_gives_the_fixed_micro_batchings_update(budget, fixed, results):
    """Budget against fixed micro-batches on the same layout: loss and every gradient to float32 precision."""
    for with_prompt in (False, True):
        got, ref = results[(budget, with_prompt)], results[(fixed, with_prompt)]
        assert got["metrics"]["loss"] == pytest.approx(ref["metrics"]["loss"], rel=REL_TOL)
        assert got["metrics"]["num_tokens"] == ref["metrics"]["num_tokens"]
        assert_grads_close(got["grads"], ref["grads"], REL_TOL)


def test_the_student_pass_before_prepare_is_one_clear_error():
    """SFT and GRPO share the student pass: without the step's counts it names the missing call."""
    from types import SimpleNamespace

    from phf_megatron.objectives.config import GrpoConfig
    from phf_megatron.parallel.grpo_step import GrpoStep
    from phf_megatron.parallel.sft_step import SftStep

    config = SimpleNamespace(sequence_parallel=False, calculate_per_token_loss=True)
    steps = [SftStep(config, tp_group=None, dp_group=None),
             GrpoStep(config, GrpoConfig(), temperature=1.0, max_completion_length=8, tp_group=None, dp_group=None)]
    for step in steps:
        with pytest.raises(RuntimeError, match=rf"^{type(step).__name__}\.prepare\(microbatches\) must run before"):
            step.student_forward_step(iter([None]), model=None)
