"""The sync probe in 16 bits: its tolerance follows the dtype and the logprob spread; a miss names the token."""

import copy

import pytest
import torch

from phf_megatron.rollout import SyncProbe, SyncVerificationError, build_engine, EngineConfig, sync_weights
from phf_megatron.rollout.sync import hf_reference_logprobs, probe_token_ids, probe_tolerance
from phf_megatron.tokenizer import QWEN3_TOKENIZER_SIZE

from ..helpers.tiny_qwen3 import build_tiny_qwen3, perturb_


def test_tolerance_by_dtype_and_spread():
    assert probe_tolerance("float32", [-40.0]) == 1e-4
    assert probe_tolerance("bfloat16", [-3.0, -5.0]) == 0.1                       # the floor
    assert probe_tolerance("bfloat16", [-3.0, -20.0]) == pytest.approx(2 * 2 ** -7 * 20)
    assert probe_tolerance("float16", [-20.0]) == 0.05
    assert probe_tolerance("float16", [-40.0]) == pytest.approx(2 * 2 ** -10 * 40)
    with pytest.raises(ValueError, match="dtype: 'int8'"):
        probe_tolerance("int8", [-1.0])


@pytest.fixture(scope="module")
def sharp_model():
    """The tiny Qwen3 with weights large enough that its probe logprobs reach ~ -20 (as a trained
    model's do on random tokens), in float64: the exact reference."""
    model = build_tiny_qwen3().double()
    perturb_(model, seed=1, scale=0.5)
    return model


def test_a_correct_bf16_engine_passes_and_a_stale_tensor_fails(sharp_model):
    prompt, completion = probe_token_ids(QWEN3_TOKENIZER_SIZE)
    exact = hf_reference_logprobs(sharp_model, prompt, completion)
    bf16 = hf_reference_logprobs(copy.deepcopy(sharp_model).to(torch.bfloat16), prompt, completion)
    gap = max(abs(a - b) for a, b in zip(exact, bf16))
    atol = probe_tolerance("bfloat16", exact)
    assert 0.1 < gap <= atol                      # the old fixed 0.1 failed a correct bf16 model here
    stale = copy.deepcopy(sharp_model)
    with torch.no_grad():
        stale.model.layers[1].mlp.down_proj.weight.zero_()               # one tensor never loaded
    stale_bf16 = hf_reference_logprobs(stale.to(torch.bfloat16), prompt, completion)
    assert max(abs(a - b) for a, b in zip(exact, stale_bf16)) > 10 * atol


def test_a_probe_miss_names_the_token_and_both_values(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    prompt, completion = probe_token_ids(QWEN3_TOKENIZER_SIZE)
    expected = hf_reference_logprobs(model, prompt, completion)
    wrong = list(expected)
    wrong[5] -= 1.0                                                       # the trainer says otherwise at token 5
    engine = build_engine(EngineConfig(model_dir=tiny_dir, backend="hf", dtype="float32"))
    try:
        with pytest.raises(SyncVerificationError) as info:
            sync_weights(engine, model.state_dict().items(), probe=SyncProbe(prompt, completion, wrong, atol=1e-3))
    finally:
        engine.close()
    msg = str(info.value)
    got = float(msg.split("engine ")[-1].split(",")[0])
    assert f"at probe completion token 5 (id {completion[5]}): engine " in msg
    assert f"trainer {wrong[5]:.6g}" in msg and got == pytest.approx(expected[5], abs=1e-4)
