"""Faults the trainer must see as clear errors: start failure, hung generate, use after close.

Also the tied-embedding model (lm_head shares embed_tokens) through the same sync. The module's
engine is broken on purpose by the last test (a timeout), so keep that test last.
"""

import pytest
import torch

from phf_megatron.rollout import (
    EngineStartError,
    EngineUnusableError,
    GenerationTimeoutError,
    RolloutEngineError,
    SamplingParams,
    hf_reference_logprobs,
    make_probe,
    sync_weights,
)
from phf_megatron.tokenizer import QWEN3_TOKENIZER_SIZE

from .conftest import BACKEND_PARAMS, start_engine
from ..helpers.tiny_qwen3 import build_tiny_qwen3, perturb_


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def tied_engine(request, tiny_tied_dir):
    eng = start_engine(request.param, tiny_tied_dir)
    yield eng
    eng.close()


def test_tied_embeddings_sync_with_or_without_the_lm_head_alias(tied_engine):
    model = build_tiny_qwen3(tied=True)
    perturb_(model, seed=5)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    probe = make_probe(lambda p, c: hf_reference_logprobs(model, p, c), vocab_size=QWEN3_TOKENIZER_SIZE)
    sd = model.state_dict()
    assert "lm_head.weight" in sd
    sync_weights(tied_engine, sd.items(), probe=probe)                    # alias accepted and dropped
    perturb_(model, seed=6)
    probe = make_probe(lambda p, c: hf_reference_logprobs(model, p, c), vocab_size=QWEN3_TOKENIZER_SIZE)
    sync_weights(tied_engine, [(n, t) for n, t in model.state_dict().items() if n != "lm_head.weight"], probe=probe)
    (c,), = tied_engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=6, logprobs=True))
    torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(hf_reference_logprobs(model, [1, 2, 3], c.token_ids)),
                               atol=1e-4, rtol=0)


def test_sleep_and_wake_keep_the_weights(tied_engine):
    (before,), = tied_engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4))
    tied_engine.sleep()          # a no-op on CPU; frees GPU memory with vLLM sleep mode
    tied_engine.wake()
    (after,), = tied_engine.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4))
    assert before.token_ids == after.token_ids


def test_hung_generate_times_out_and_the_engine_refuses_further_calls(tied_engine):
    """Keep last: it leaves this module's engine unusable."""
    params = SamplingParams(temperature=1.0, max_tokens=300, ignore_eos=True)
    with pytest.raises(GenerationTimeoutError, match="did not finish within 0.01 s"):
        tied_engine.generate([[1, 2, 3]] * 8, params, timeout_s=0.01)
    for call in (lambda: tied_engine.generate([[1]], SamplingParams(max_tokens=1)),
                 lambda: tied_engine.score([1], [2]),
                 lambda: tied_engine.update_weights([])):
        with pytest.raises(EngineUnusableError, match="generate timed out after 0.01 s"):
            call()


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_start_failure_is_an_engine_start_error_naming_the_model(backend, tmp_path, tiny_dir):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(EngineStartError, match="no_such_model"):
        start_engine(backend, missing)
    if backend == "vllm":       # a real vLLM start-up failure: a KV cache larger than the machine
        with pytest.raises(EngineStartError, match="vLLM could not start.*memory"):
            start_engine(backend, tiny_dir, kv_cache_bytes=1 << 50)
    assert issubclass(EngineStartError, RolloutEngineError)


def test_closed_engine_refuses_calls(tiny_dir):
    eng = start_engine("hf", tiny_dir)
    eng.close()
    with pytest.raises(EngineUnusableError, match="closed"):
        eng.generate([[1]], SamplingParams(max_tokens=1))


def test_an_engine_answering_with_no_tokens_is_an_error_not_an_empty_rollout(tiny_dir, monkeypatch):
    """A backend (a broken server, a proxy) that answers with empty completions, or too few: before, the
    trainer trained on nothing (loss 0, num_tokens 0, no warning) to the end of the run."""
    from phf_megatron.rollout.types import Completion

    eng = start_engine("hf", tiny_dir)
    try:
        params = SamplingParams(n=2, temperature=1.0, max_tokens=3, seed=1)
        assert all(len(c) == 2 and all(x.token_ids for x in c) for c in eng.generate([[1, 2], [3]], params))
        monkeypatch.setattr(eng, "_generate", lambda prompts, ps, on_done: [[Completion([], "stop")] * p.n for p in ps])
        with pytest.raises(RolloutEngineError, match=r"^HFEngine returned an empty completion .* for prompt 0 of 2"):
            eng.generate([[1, 2], [3]], params)
        monkeypatch.setattr(eng, "_generate", lambda prompts, ps, on_done: [[Completion([5], "stop")] for p in ps])
        with pytest.raises(RolloutEngineError, match=r"^HFEngine returned 1 completions for prompt 0, asked for 2"):
            eng.generate([[1, 2], [3]], params)
    finally:
        eng.close()
