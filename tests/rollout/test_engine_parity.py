"""Both backends after a weight sync: tokens and logprobs equal transformers' on the same weights.

The trainer stand-in is a HF Qwen3 in float32 (the Megatron TP=2 trainer feeds the same sync
once the converters land). Every test starts from its own full sync, so tests do not depend
on each other's engine state. Tolerance: 1e-4 on float32 logprobs (measured: ~6e-6 for vLLM-CPU,
exact for the fallback, which runs the same transformers model).
"""

import copy

import pytest
import torch

from phf_megatron.rollout import (
    EngineUnusableError,
    SamplingParams,
    SyncVerificationError,
    WeightMismatchError,
    hf_reference_logprobs,
    make_probe,
    sync_weights,
)
from phf_megatron.tokenizer import QWEN3_TOKENIZER_SIZE, chat_prompt_ids, load_qwen3_tokenizer

from .conftest import BACKEND_PARAMS, start_engine
from ..helpers.tiny_qwen3 import build_tiny_qwen3, perturb_

ATOL = 1e-4


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def engine(request, tiny_dir):
    eng = start_engine(request.param, tiny_dir)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts():
    tok = load_qwen3_tokenizer()
    return [chat_prompt_ids(tok, "What is 7 times 6?"),
            chat_prompt_ids(tok, "Compute $\\frac{3}{4} + 1$.", enable_thinking=False),
            tok("The answer is", add_special_tokens=False)["input_ids"]]


def _trainer(seed: int):
    """The trainer's model after `seed` optimizer steps (seeded perturbations of the init)."""
    model = build_tiny_qwen3()
    for s in range(1, seed + 1):
        perturb_(model, seed=s)
    return model


def _probe(model, atol=ATOL):
    return make_probe(lambda p, c: hf_reference_logprobs(model, p, c), vocab_size=QWEN3_TOKENIZER_SIZE, atol=atol)


def _assert_greedy_matches(engine, model, prompts, max_tokens=12):
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=True,
                                                   ignore_eos=True))
    for p, (c,) in zip(prompts, outs):
        want = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                              attention_mask=torch.ones(1, len(p), dtype=torch.long))[0, len(p):].tolist()
        assert c.token_ids == want
        assert c.finish_reason == "length"
        ref = torch.tensor(hf_reference_logprobs(model, p, c.token_ids))
        torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(torch.tensor(engine.score(p, c.token_ids)), ref, atol=ATOL, rtol=0)


def test_greedy_tokens_and_logprobs_equal_transformers_after_sync(engine, prompts):
    model = _trainer(1)
    report = sync_weights(engine, model.state_dict().items(), probe=_probe(model))
    assert report.update.tensors == len(engine.spec.shapes) and report.probe_max_abs_diff <= ATOL
    _assert_greedy_matches(engine, model, prompts)


def test_repeated_syncs_stay_correct(engine, prompts):
    model = _trainer(1)
    versions = []
    for step in range(2, 5):
        perturb_(model, seed=step)
        versions.append(sync_weights(engine, model.state_dict().items(), probe=_probe(model),
                                     bucket_bytes=1 << 20).update.weight_version)
    assert versions == sorted(versions) and len(set(versions)) == 3
    _assert_greedy_matches(engine, model, prompts[:1])


def test_partial_update_changes_only_what_was_pushed(engine, prompts):
    model = _trainer(1)
    sync_weights(engine, model.state_dict().items(), probe=_probe(model))
    names = [f"model.layers.1.mlp.{p}_proj.weight" for p in ("gate", "up", "down")] + [
        "model.layers.0.self_attn.q_norm.weight", "model.norm.weight"]
    perturb_(model, seed=99, scale=0.5, names=names)
    sd = model.state_dict()
    report = sync_weights(engine, [(n, sd[n]) for n in names], probe=_probe(model))
    assert report.update.tensors == len(names)
    _assert_greedy_matches(engine, model, prompts[1:2])


def test_lora_merged_into_base_syncs_correctly(engine, prompts):
    peft = pytest.importorskip("peft")
    base = _trainer(1)
    sync_weights(engine, base.state_dict().items(), probe=_probe(base))
    lora = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    with torch.no_grad():                         # a "trained" adapter: B != 0
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn_like(p) * 0.3)
    lora.eval()
    merged = copy.deepcopy(lora).merge_and_unload()
    # the probe's reference comes from the unmerged adapter model: merging must not change outputs
    sync_weights(engine, merged.state_dict().items(), probe=_probe(lora))
    _assert_greedy_matches(engine, merged, prompts[:1])


def test_sync_that_changes_nothing_is_caught_and_named(engine):
    old = _trainer(1)
    sync_weights(engine, old.state_dict().items(), probe=_probe(old))
    new = _trainer(2)
    for stream in ([], old.state_dict().items()):      # forgot to push; pushed the stale copy
        with pytest.raises(SyncVerificationError, match="had no effect") as err:
            sync_weights(engine, stream, probe=_probe(new))
        assert err.value.no_effect and err.value.max_abs_diff > ATOL
    # a push that changed the engine, but not to the trainer's weights, is not "no effect"
    with pytest.raises(SyncVerificationError, match="moved by") as err:
        sync_weights(engine, _trainer(3).state_dict().items(), probe=_probe(new))
    assert not err.value.no_effect


def test_name_or_shape_mismatch_is_named_and_leaves_the_engine_usable(engine, prompts):
    model = _trainer(1)
    sync_weights(engine, model.state_dict().items(), probe=_probe(model))
    sd = model.state_dict()
    with pytest.raises(WeightMismatchError, match="model.layers.0.mlp.down_proj.weight: shape"):
        engine.update_weights([("model.layers.0.mlp.down_proj.weight", sd["model.layers.0.mlp.down_proj.weight"].T)])
    with pytest.raises(WeightMismatchError, match="model.layers.7.mlp.down_proj.weight: no such tensor"):
        engine.update_weights([("model.layers.7.mlp.down_proj.weight", sd["model.layers.0.mlp.down_proj.weight"])])
    with pytest.raises(WeightMismatchError, match="fused group incomplete"):
        engine.update_weights([("model.layers.0.self_attn.k_proj.weight", sd["model.layers.0.self_attn.k_proj.weight"])])
    _assert_greedy_matches(engine, model, prompts[:1], max_tokens=4)   # nothing went in: still usable


def test_failure_mid_sync_blocks_generation_until_a_full_sync(engine, prompts):
    model = _trainer(1)
    items = list(model.state_dict().items())
    bad = items[:5] + [("model.layers.0.mlp.up_proj.weight", torch.zeros(3, 3))] + items[5:]
    with pytest.raises(WeightMismatchError):
        engine.update_weights(iter(bad), bucket_bytes=1)     # one tensor per bucket: some went in
    with pytest.raises(EngineUnusableError, match="weight update failed after"):
        engine.generate(prompts[:1], SamplingParams(max_tokens=2))
    sync_weights(engine, items, probe=_probe(model))
    _assert_greedy_matches(engine, model, prompts[:1], max_tokens=4)


def test_n_seed_stop_and_length(engine, prompts):
    model = _trainer(1)
    sync_weights(engine, model.state_dict().items(), probe=_probe(model))
    params = SamplingParams(n=3, temperature=1.0, top_p=0.95, max_tokens=8, seed=123, logprobs=True)
    first = engine.generate(prompts[:2], params)
    again = engine.generate(prompts[1:2], params)          # seeded: independent of the batch
    assert [len(c) for c in first] == [3, 3]
    assert [c.token_ids for c in first[1]] == [c.token_ids for c in again[0]]
    assert len({tuple(c.token_ids) for c in first[0]}) > 1   # the 3 samples differ
    for p, comps in zip(prompts, first):
        for c in comps:
            assert len(c.logprobs) == len(c.token_ids) <= 8
            ref = hf_reference_logprobs(model, p, c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(ref), atol=ATOL, rtol=0)
    # stop at a token the greedy path emits: kept as the last token, finish_reason "stop"
    twice = engine.generate(prompts[:1], SamplingParams(n=2, temperature=0.0, max_tokens=6, ignore_eos=True))[0]
    greedy = twice[0]
    assert len(twice) == 2 and twice[1].token_ids == greedy.token_ids
    stop = greedy.token_ids[2]
    cut = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=(stop,)))[0][0]
    assert cut.token_ids == greedy.token_ids[:greedy.token_ids.index(stop) + 1] and cut.finish_reason == "stop"
