"""Separate-server mode against a running vLLM server (opt-in: starting one takes ~1 min on CPU).

    python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32 --port 18765 \\
        --kv-cache-memory-bytes 268435456 --max-model-len 1024 --enforce-eager &
    PHF_VLLM_SERVER_URL=http://127.0.0.1:18765 PHF_VLLM_SERVER_MODEL_DIR=DIR pytest tests/rollout/test_server_engine.py

DIR must be an fp32 tiny Qwen3 (tests/rollout/tiny_qwen3.save_tiny_qwen3). Only generate and
score are checked; the NCCL weight push needs GPUs on both sides.
"""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from phf_megatron.rollout import EngineStartError, SamplingParams, hf_reference_logprobs
from phf_megatron.rollout.server_engine import VLLMServerEngine

URL = os.environ.get("PHF_VLLM_SERVER_URL")
MODEL_DIR = os.environ.get("PHF_VLLM_SERVER_MODEL_DIR")
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not (URL and MODEL_DIR),
                                                   reason="set PHF_VLLM_SERVER_URL and PHF_VLLM_SERVER_MODEL_DIR")]


def test_server_greedy_tokens_logprobs_and_score_equal_transformers():
    engine = VLLMServerEngine(URL, model_dir=MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    prompts = [[151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198], [1, 2, 3]]
    outs = engine.generate(prompts, SamplingParams(n=2, temperature=0.0, max_tokens=8, logprobs=True, ignore_eos=True))
    for p, comps in zip(prompts, outs):
        assert len(comps) == 2 and comps[0].token_ids == comps[1].token_ids
        want = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=8, min_new_tokens=8)[0, len(p):]
        assert comps[0].token_ids == want.tolist()
        ref = torch.tensor(hf_reference_logprobs(model, p, comps[0].token_ids))
        torch.testing.assert_close(torch.tensor(comps[0].logprobs), ref, atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.tensor(engine.score(p, comps[0].token_ids)), ref, atol=1e-4, rtol=0)
    sampled = engine.generate(prompts[:1], SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=5))
    assert len(sampled[0]) == 3
    engine.close()


def test_unreachable_server_is_a_start_error():
    with pytest.raises(EngineStartError, match="not reachable"):
        VLLMServerEngine("http://127.0.0.1:9", model_dir=MODEL_DIR)
