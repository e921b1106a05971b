"""``RolloutEngine.generate(on_done=...)``: told as completions finish, within one call (the eval's bar).

With ``ignore_eos`` each completion has exactly ``max_tokens`` tokens, so what each call of ``on_done``
must say is known: vLLM one call per finished request (a spawned engine may hand two steps' requests over in
one, in either order), transformers one per batch; the calls sum to the completions returned and their tokens.
"""

import threading

import pytest

from phf_megatron.rollout import SamplingParams

from .conftest import start_engine

PROMPTS = [[151644, 872, 198, 6023 + i, 151645, 198] for i in range(5)]
#: a request of each length: vLLM finishes them at five different steps of one batch
LENGTHS = [5, 1, 4, 2, 3]


def _params(lengths=LENGTHS):
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in lengths]


def _told(engine, prompts=PROMPTS, params=None):
    calls = []
    outs = engine.generate(prompts, params or _params(), on_done=lambda *c: calls.append(c))
    assert [len(c.token_ids) for (c,) in outs] == [p.max_tokens for p in (params or _params())]
    assert tuple(map(sum, zip(*calls))) == (len(outs), sum(len(c.token_ids) for (c,) in outs))
    return calls


@pytest.mark.vllm
@pytest.mark.parametrize("separate_process", [False, True], ids=["in_process", "spawned"])
def test_vllm_tells_each_request_as_it_finishes(tiny_dir, separate_process):
    engine = start_engine("vllm", tiny_dir, separate_process=separate_process)
    try:
        assert sorted(_told(engine)) == [(1, m) for m in sorted(LENGTHS)]
        outs = engine.generate(PROMPTS, _params())            # nobody asks: the same completions
        assert [len(c.token_ids) for (c,) in outs] == LENGTHS
    finally:
        engine.close()


def test_transformers_tells_each_batch(tiny_dir):
    engine = start_engine("hf", tiny_dir, max_batch_size=2)
    try:
        assert _told(engine, params=_params([3] * 5)) == [(2, 6), (2, 6), (1, 3)]
    finally:
        engine.close()


def test_what_a_backend_did_not_tell_comes_at_the_end(tiny_dir, monkeypatch):
    """A backend that tells nothing (or less than it returns: greedy n > 1 is sampled once) still sums right."""
    engine = start_engine("hf", tiny_dir)
    try:
        generate = engine._generate
        monkeypatch.setattr(engine, "_generate", lambda prompts, params, on_done: generate(prompts, params, None))
        params = SamplingParams(n=2, temperature=0.0, max_tokens=3, ignore_eos=True)
        calls = []
        engine.generate(PROMPTS[:2], params, on_done=lambda *c: calls.append(c))
        assert calls == [(4, 12)]
    finally:
        engine.close()


def test_an_abandoned_call_tells_nothing_after_it_timed_out(tiny_dir, monkeypatch):
    """After a timeout the call may run on in its thread: its completions are not told to a bar already closed."""
    from phf_megatron.rollout import GenerationTimeoutError

    engine = start_engine("hf", tiny_dir)
    release, calls = threading.Event(), []

    def slow(prompts, params, on_done):
        release.wait(30)
        on_done(1, 1)
        return [[]]
    monkeypatch.setattr(engine, "_generate", slow)
    try:
        with pytest.raises(GenerationTimeoutError):
            engine.generate(PROMPTS[:1], _params([1]), timeout_s=0.5, on_done=lambda *c: calls.append(c))
        release.set()
        engine._inflight.result(timeout=30)
        assert calls == []
    finally:
        engine.close()
