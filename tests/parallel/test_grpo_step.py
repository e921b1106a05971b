"""One GRPO step on Megatron-Core equals TRL 0.26's GRPO loss (``objectives.grpo``) at every layout.

Oracle (``grpo_ranks``): HF Qwen3's float64 log-probs of the whole batch at temperature 1.2, then
``objectives.grpo.grpo_loss`` per TRL micro-batch with TRL's ``grad_accum_steps`` (micro-batches
per rank) and ``num_processes`` (DP size), averaged over the processes, and its gradient by
autograd. Under test: ``GrpoStep`` through Megatron's schedules on the converted models (the old
policy's pass, the reference pass, the student's pass) at: one process (2 micro-batches); TP=2
with sequence parallelism; PP=2 with tied embeddings and recomputation under the (loss, logs)
convention; interleaved PP=2 x VPP=2; DP=2 under both conventions; all with the main
configuration (grpo loss, num_iterations 2, the sequence_mask correction, a KL term). The option
cases (every loss type, num_iterations 1 with and without the correction, every correction mode,
the sequence level, no KL, epsilon_high and delta, zero advantages) run at one process and at DP=2
(bnpo's value depends on that layout, as TRL's). The Megatron models are float32: loss and every
parameter's gradient within ``max|g - g_ref| <= 1e-5 * max|g_ref|`` of the float64 oracle (the loss
within 1e-5 of the sum of its terms' magnitudes: a group's advantages sum to 0, so the loss is a
near-cancelling sum of terms each known to float32's relative precision), the
clip and correction statistics equal to the oracle's (the oracle checks that no ratio lies within
float32 noise of a clip bound or the cap), and the loss by token id (``loss_tokens``) equal to the
oracle's.

Packed (``training.packing``, the ``*_packed`` layouts): each micro-batch packed into one row
(``GrpoMicroBatch.packed``, as ``test_sft_step``'s), the same oracle: the per-sequence reductions (the
sequence level, the sequence correction modes, ``grpo``'s per-sequence token mean, bnpo's per-micro-batch
mean) run on the per-sample grid, not the ``[1, S]`` activation. Main configuration at every layout; the
sequence level and the sequence correction modes, and bnpo, at one process.
"""

import dataclasses
import functools

import pytest
import torch

from ..helpers.spawn import run_ranks
from .grpo_ranks import CASES, grpo_config, hf_grpo_reference, old_policy, sampler_logps
from .grpo_ranks import advantages, run_grpo_layouts
from .harness import Layout, assert_grads_close, merge_rank_results

OPTIONS = [c for c in CASES if c not in ("main", "zero_advantages")]
ONE_RANK = [("single", Layout(num_micro=2), "gqa", ["main", *OPTIONS, "zero_advantages"])]
TWO_RANKS = [
    ("tp2_sp", Layout(tp=2, sp=True, num_micro=2), "gqa", ["main"]),
    ("pp2_tied_recompute", Layout(pp=2, num_micro=2, recompute=True, per_token_loss=False), "tied", ["main"]),
    ("pp2_vpp2", Layout(pp=2, vpp=2, num_micro=4, overrides={"batch_p2p_comm": False}), "gqa", ["main"]),
    ("dp2", Layout(num_micro=2), "gqa", ["main", *OPTIONS]),
    ("dp2_legacy_loss", Layout(num_micro=2, per_token_loss=False), "gqa", ["main"]),
]
PACKED_ONE_RANK = [("single_packed", Layout(num_micro=2, packed=True), "gqa",
                    ["main", "sequence_level", "sequence_level_token_mask", "sequence_truncate", "bnpo"])]
PACKED_TWO_RANKS = [(f"{name}_packed", dataclasses.replace(layout, packed=True), model, ["main"])
                    for name, layout, model, _ in TWO_RANKS]
ONE_RANK, TWO_RANKS = ONE_RANK + PACKED_ONE_RANK, TWO_RANKS + PACKED_TWO_RANKS
PLANS = {name: (layout, model, cases) for name, layout, model, cases in ONE_RANK + TWO_RANKS}
DP = {"dp2": 2, "dp2_legacy_loss": 2, "dp2_packed": 2, "dp2_legacy_loss_packed": 2}
PARAMS = [(name, case) for name, (_, _, cases) in PLANS.items() for case in cases if case != "zero_advantages"]
REL_TOL = 1e-5


@functools.lru_cache(maxsize=None)
def _sampler(model_name, policy):
    return sampler_logps(model_name, policy)


def _samplers():
    return {(model, policy): _sampler(model, policy) for _, model, _ in PLANS.values() for policy in ("old", "student")}


@pytest.fixture(scope="module")
def results():
    merged = merge_rank_results(run_ranks(run_grpo_layouts, 1, ONE_RANK, _samplers()))
    return merge_rank_results(run_ranks(run_grpo_layouts, 2, TWO_RANKS, _samplers()), merged)


@functools.lru_cache(maxsize=None)
def _reference(layout_name, case):
    layout, model, _ = PLANS[layout_name]
    dp = DP.get(layout_name, 1)
    return hf_grpo_reference(model, case, _sampler(model, old_policy(case)), dp, layout.num_micro)


@pytest.mark.parametrize("layout,case", PARAMS)
def test_loss_gradients_and_statistics_equal_trl(layout, case, results):
    got, ref = results[(layout, case)], _reference(layout, case)
    metrics = got["metrics"]
    assert abs(metrics["loss"] - ref["loss"]) <= REL_TOL * ref["loss_scale"]
    assert metrics["num_tokens"] == ref["num_tokens"]
    assert metrics["sequences"] == 8
    assert metrics["grpo_advantage"] == pytest.approx(float(advantages(case).mean()), abs=1e-12)
    assert ref["coef_margin"] > 1e-4  # no ratio on a clip bound: float32 and float64 clip the same tokens
    for key in ("clip_low", "clip_high", "clip_region"):
        assert metrics[f"grpo_{key}"] == pytest.approx(ref[key], abs=1e-12), key
    cfg = grpo_config(case)
    if cfg.vllm_importance_sampling_correction:
        assert ref["is_margin"] > 1e-3
        assert metrics["grpo_is_capped"] == pytest.approx(ref["is_capped"], abs=1e-12)
    else:
        assert "grpo_is_capped" not in metrics
    assert ("grpo_kl" in metrics) == (cfg.beta != 0)
    assert_grads_close(got["grads"], ref["grads"], REL_TOL)
    top = metrics["loss_tokens"]
    assert len(top) == 20
    for token, share, count in top:
        assert count == int(ref["token_count"][token])
        scale = ref["loss_scale"]
        assert share * scale == pytest.approx(float(ref["token_loss"][token]), abs=REL_TOL * scale)


def test_the_cases_exercise_clipping_the_correction_and_the_layout():
    """Some tokens are clipped at each bound, some ratios exceed the cap (not all), bnpo depends on the layout
    and the others do not, every option changes the loss."""
    main = _reference("single", "main")
    assert main["clip_low"] > 0 and main["clip_high"] > 0
    assert 0 < main["is_capped"] < 0.5
    assert 0 < _reference("single", "token_mask")["is_capped"] < 0.1
    assert _reference("single", "sequence_level")["clip_region"] > 0
    assert _reference("single", "mu1_no_correction")["clip_region"] == 0
    assert _reference("dp2", "bnpo")["loss"] != pytest.approx(_reference("single", "bnpo")["loss"], rel=1e-3)
    for case in ("main", "dr_grpo", "dapo"):
        assert _reference("dp2", case)["loss"] == pytest.approx(_reference("single", case)["loss"], rel=1e-12)
    losses = {case: _reference("single", case)["loss"] for case in OPTIONS + ["main"]}
    assert len({round(v, 9) for v in losses.values()}) == len(losses), losses


def test_zero_advantages_give_zero_loss_and_gradient(results):
    """A step whose groups all have equal rewards (every advantage 0, no KL) moves nothing."""
    got = results[("single", "zero_advantages")]
    assert got["metrics"]["loss"] == 0.0
    assert got["grads"] and all(float(g.abs().max()) == 0.0 for g in got["grads"].values())


def _mb(**change):
    from phf_megatron.parallel.grpo_step import GrpoMicroBatch

    tokens = torch.zeros(2, 5, dtype=torch.long)
    scored = torch.zeros(2, 5, dtype=torch.bool)
    scored[:, 2:4] = True
    args = dict(student_tokens=tokens, scored=scored, advantages=torch.zeros(2, dtype=torch.float64),
                sampler_logps=torch.zeros(2, 5))
    args.update(change)
    return GrpoMicroBatch(**args)


@pytest.mark.parametrize("field,change", [
    ("student_tokens", dict(student_tokens=torch.zeros(2, 5, dtype=torch.int32))),
    ("scored", dict(scored=torch.zeros(2, 4, dtype=torch.bool))),
    ("scored", dict(scored=torch.ones(2, 5, dtype=torch.bool))),
    ("advantages", dict(advantages=torch.zeros(2))),
    ("advantages", dict(advantages=torch.zeros(3, dtype=torch.float64))),
    ("sampler_logps", dict(sampler_logps=torch.zeros(2, 5, dtype=torch.float64))),
    ("sampler_logps", dict(sampler_logps=torch.zeros(2, 4))),
    ("num_items", dict(num_items=3)),
])
def test_microbatch_validation_names_the_field(field, change):
    with pytest.raises(ValueError) as err:
        _mb(**change)
    message = str(err.value)
    assert message.startswith(f"{field}:") and "\n" not in message


def test_microbatch_counts_and_indices():
    mb = _mb(sampler_logps=None)
    assert (mb.batch_size, mb.num_tokens) == (2, 4)
    assert mb.score_index.tolist() == [1, 2, 6, 7]  # the logits row predicting each scored token
    moved = mb.to("cpu")
    assert moved.num_tokens == 4 and moved.sampler_logps is None


def test_packed_microbatch_grid_is_per_sample():
    """Packed: one activation row, the scored tokens and the sampler's log-probs placed in it, and each scored
    token's place on the per-sample grid (``grid_positions``) the padded micro-batch's own."""
    from phf_megatron.parallel.grpo_step import GrpoMicroBatch

    padded = _mb(student_tokens=torch.arange(10).reshape(2, 5), sampler_logps=torch.arange(10.0).reshape(2, 5))
    lengths = torch.tensor([4, 5])
    packed = GrpoMicroBatch.packed(padded.student_tokens, padded.scored, padded.advantages, lengths,
                                   padded.sampler_logps, pad_multiple=4)
    assert (packed.batch_size, packed.num_sequences, packed.num_tokens) == (1, 2, 4)
    assert packed.student_tokens.tolist() == [[0, 1, 2, 3, 5, 6, 7, 8, 9, 0, 0, 0]]
    assert packed.score_index.tolist() == [1, 2, 5, 6]
    assert packed.score_tokens.tolist() == padded.score_tokens.tolist() == [2, 3, 7, 8]
    assert packed.sampler_logps.reshape(-1)[packed.score_index + 1].tolist() == [2.0, 3.0, 7.0, 8.0]
    assert packed.grid_shape == (2, 5) and packed.grid_positions.tolist() == padded.grid_positions.tolist()
    assert padded.grid_positions.tolist() == (padded.score_index + 1).tolist()
    assert packed.to("cpu").layout.packed


def test_step_settings_errors():
    from types import SimpleNamespace

    from phf_megatron.objectives.config import GrpoConfig
    from phf_megatron.parallel.grpo_step import GrpoStep

    config = SimpleNamespace(sequence_parallel=False, calculate_per_token_loss=True)
    for kwargs, field in ((dict(temperature=0.0, max_completion_length=8), "temperature"),
                          (dict(temperature=1.0, max_completion_length=0), "max_completion_length")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            GrpoStep(config, GrpoConfig(loss_type="dr_grpo"), tp_group=None, dp_group=None, **kwargs)
