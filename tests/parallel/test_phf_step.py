"""One PHF step on Megatron-Core equals the single-process reference at every parallel layout.

Reference: ``objectives.phf_objective(opsd_loss, hidden_flow_loss)`` on HF transformers Qwen3
(float64) hidden states and logits of the same weights (``reference.hf_reference``). Under test:
``PhfStep`` driving Megatron's own schedules on the converted model (float32, gloo, CPU):

* TP=2 with sequence parallelism, 2 micro-batches, per-token loss convention (and once with
  Megatron's output layer over every position instead of the scored rows only);
* PP=2 with tied embeddings, full recomputation, 2 micro-batches, the (loss, logs) convention,
  Megatron's deallocation of sent pipeline outputs;
* interleaved PP=2 x VPP=2 (one layer per virtual stage), 4 micro-batches;
* DP=2 under both loss conventions;
* TP=2 x PP=2 (4 ranks) with SP and recomputation; TP=2 x DP=2 without SP, tied embeddings;

each for the variants phf, local, direction, geometry and selected layers (1, 2), which cross
the pipeline boundary; and packed (``PhfMicroBatch.packed``: each side's sequences in one row, the
window and the scored rows through its layout; windows end at a sample's last token, beside the next
sample's first; one sample has a one-token rollout) at TP=2 + SP, PP=2 with recomputation, VPP,
TP=2 x PP=2, and under token-budget micro-batches (``token_budget_plan``) at DP=2 and PP=2 x DP=2, whose
ranks run unequal micro-batch counts (2 and 1; 3 and 2: the DP collectives and the global normalization hold),
for PHF and OPSD (no flow): the same reference, since it is layout-free. Compared: the loss and its parts, the per-layer flow values, and the
gradient of every student parameter, per tensor ``max|g - g_ref| <= 1e-5 * max|g_ref|`` (float32
against a float64 oracle; observed ~3e-6). One spawn per world size runs all its layouts.

Interleaved pipelines use ``batch_p2p_comm=False`` here: on gloo with PP=2 (next rank ==
previous rank) Megatron's batched p2p of the interleaved schedule pairs the forward and backward
messages wrongly even without PHF (plain logits differ); separate send/recv are correct.
"""

import functools

import pytest

from ..helpers.spawn import run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model
from . import reference
from .harness import Layout, assert_grads_close
from .phf_ranks import STUDENT_SEED, TEACHER_SEED, VARIANTS, VOCAB, run_layouts

ALL = [v for v in VARIANTS if v != "opsd"]
TWO_RANKS = [
    ("tp2_sp", Layout(tp=2, sp=True, num_micro=2), "gqa", ALL),
    ("tp2_sp_full_logits", Layout(tp=2, sp=True, num_micro=2, step_options={"score_rows_only": False}), "gqa",
     ["phf"]),
    ("pp2_tied_recompute", Layout(pp=2, num_micro=2, recompute=True, per_token_loss=False,
                                  overrides={"deallocate_pipeline_outputs": True}), "tied", ALL),
    ("pp2_vpp2", Layout(pp=2, vpp=2, num_micro=4, overrides={"batch_p2p_comm": False}), "gqa", ["phf", "selected"]),
    ("dp2", Layout(num_micro=2), "gqa", ALL),
    ("dp2_legacy_loss", Layout(num_micro=2, per_token_loss=False), "gqa", ["phf", "selected"]),
    ("tp2_sp_packed", Layout(tp=2, sp=True, num_micro=2, packed=True), "gqa", ["phf", "opsd", "local"]),
    ("pp2_packed_recompute", Layout(pp=2, num_micro=2, recompute=True, packed=True), "tied", ["phf", "opsd", "selected"]),
    ("pp2_vpp2_packed", Layout(pp=2, vpp=2, num_micro=4, packed=True, overrides={"batch_p2p_comm": False}), "gqa",
     ["phf"]),
    ("dp2_packed_budget", Layout(packed=True, max_tokens=52), "gqa", ["phf", "opsd"]),  # 2 + 1 micro-batches
]
FOUR_RANKS = [
    ("tp2_pp2_sp_recompute", Layout(tp=2, pp=2, sp=True, num_micro=2, recompute=True), "gqa", ALL),
    ("tp2_dp2_no_sp", Layout(tp=2, num_micro=2), "tied", ["phf", "selected"]),
    ("tp2_pp2_sp_packed", Layout(tp=2, pp=2, sp=True, num_micro=2, recompute=True, packed=True), "gqa", ["phf"]),
    ("pp2_dp2_packed_budget", Layout(pp=2, packed=True, max_tokens=28), "gqa", ["phf"]),  # 3 + 2
]
MODEL_OF = {name: model for name, _, model, _ in TWO_RANKS + FOUR_RANKS}
FOUR = {name for name, *_ in FOUR_RANKS}
CASES = [(name, v) for name, _, _, variants in TWO_RANKS + FOUR_RANKS for v in variants]
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def two_rank_results():
    per_rank = run_ranks(run_layouts, 2, TWO_RANKS, True)
    return {"collectives": [r.pop("collectives") for r in per_rank], **_merge(per_rank)}


@pytest.fixture(scope="module")
def four_rank_results():
    return _merge(run_ranks(run_layouts, 4, FOUR_RANKS))


def _merge(per_rank):
    """Metrics from the last stage, gradients from every stage (each rank reports its own)."""
    merged = {}
    for rank_out in per_rank:
        for key, res in rank_out.items():
            m = merged.setdefault(key, dict(metrics=None, grads={}, capture_shapes={}, layer_calls={}))
            m["metrics"] = m["metrics"] or res["metrics"]
            m["grads"].update(res["grads"])
            m["capture_shapes"].update(res["capture_shapes"])
            m["window"] = res["window"]
            m["layer_calls"][len(m["layer_calls"])] = res["layer_calls"]
    return merged


@functools.lru_cache(maxsize=None)
def _reference(model_name, variant):
    student = tiny_hf_model(model_name, seed=STUDENT_SEED).double()
    teacher = tiny_hf_model(model_name, seed=TEACHER_SEED).double()
    return reference.hf_reference(student, teacher, reference.microbatches(VOCAB), VARIANTS[variant],
                                  student.config.num_hidden_layers)


@pytest.mark.parametrize("layout,variant", CASES)
def test_loss_and_gradients_equal_the_reference(layout, variant, request):
    results = request.getfixturevalue("four_rank_results" if layout in FOUR else "two_rank_results")
    got, ref = results[(layout, variant)], _reference(MODEL_OF[layout], variant)
    metrics = got["metrics"]
    for key in ("loss", "loss_opsd", "loss_flow"):
        assert metrics[key] == pytest.approx(ref[key], rel=REL_TOL, abs=1e-7), key
    for key in ("layer_flow", "pair_flow"):
        if key in ref:
            assert metrics[key] == pytest.approx(ref[key], rel=REL_TOL, abs=1e-7), key
    assert_grads_close(got["grads"], ref["grads"], REL_TOL)


def _expected_captured(first, stop, variant):
    """Layers a stage keeps for the variant (4 layers): own plan layers + the crossing pair's lower layer."""
    if not VARIANTS[variant].uses_flow:
        return 0
    layers = (1, 2) if variant == "selected" else (0, 1, 2, 3)
    own = [l for l in layers if first <= l < stop]
    crossing = VARIANTS[variant].flow_variant == "phf" and first - 1 in layers and first in layers
    return len(own) + int(crossing and bool(own))


@pytest.mark.parametrize("layout,variant", CASES)
def test_teacher_capture_holds_only_the_window_rows_of_its_layers(layout, variant, request):
    """Exactly ``L_stage * B * m * H`` elements per stage (L_stage: its captured layers)."""
    results = request.getfixturevalue("four_rank_results" if layout in FOUR else "two_rank_results")
    got = results[(layout, variant)]
    hidden = 64
    for (first, stop), shapes in got["capture_shapes"].items():
        n_layers = _expected_captured(first, stop, variant)
        for shape, (b, m) in zip(shapes, got["window"]):
            assert shape == ((n_layers, b, m, hidden) if n_layers else None), (first, stop)


def test_recomputation_really_reran_the_layers(two_rank_results, four_rank_results):
    """Under full recomputation every student layer runs twice per micro-batch (forward + backward)."""
    per_rank_layers, micro = 2, 2  # 4 layers over PP=2, 2 micro-batches
    for results, layout in ((two_rank_results, "pp2_tied_recompute"), (four_rank_results, "tp2_pp2_sp_recompute")):
        calls = set(results[(layout, "phf")]["layer_calls"].values())
        assert calls == {2 * per_rank_layers * micro}, calls
    assert set(two_rank_results[("dp2", "phf")]["layer_calls"].values()) == {4 * 2}


def test_tensor_parallel_collectives_equal_single_device(two_rank_results):
    """TP=2: vocabulary-parallel JSD (3 beta/clip cases) and SP window rows, values and gradients."""
    for rank_errors in two_rank_results["collectives"]:
        assert all(e < 1e-12 for e in rank_errors.values()), rank_errors
