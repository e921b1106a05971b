"""An in-process vLLM engine that fails to start drops vLLM's distributed state (``forget_failed_start``);
when that cleanup fails too, the start's own one-line ``VLLMStartError`` is still what the user sees (it was
the cleanup's traceback, the start's error lost in its context). vLLM is faked: its ``LLM`` and
``parallel_state`` both raise."""

from __future__ import annotations

import sys
import types

import pytest

from phf_megatron.rollout.errors import VLLMStartError


@pytest.fixture
def failing_vllm(monkeypatch):
    """A ``vllm`` whose ``LLM(...)`` raises "no room for the KV cache" and whose ``destroy_model_parallel``
    raises too; the names of the destroy functions called, in order."""
    called = []

    def llm(**_):
        raise ValueError("No available memory for the cache blocks")

    def destroy_model_parallel():
        called.append("destroy_model_parallel")
        raise RuntimeError("cleanup broke")

    parallel_state = types.SimpleNamespace(destroy_model_parallel=destroy_model_parallel,
                                           destroy_distributed_environment=lambda: called.append("environment"))
    modules = {"vllm": types.SimpleNamespace(LLM=llm), "vllm.distributed": types.SimpleNamespace(
        parallel_state=parallel_state), "vllm.distributed.parallel_state": parallel_state}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return called


def test_a_failed_cleanup_after_a_failed_start_leaves_the_starts_one_line(tiny_dir, failing_vllm):
    from phf_megatron.rollout.vllm_engine import VLLMEngine

    with pytest.warns(UserWarning, match=r"^vLLM's state after its failed start was not dropped \(RuntimeError: "
                                         r"cleanup broke\)"):
        with pytest.raises(VLLMStartError) as err:
            VLLMEngine(tiny_dir, dtype="float32")
    assert "\n" not in str(err.value) and "cleanup broke" not in str(err.value), str(err.value)
    assert failing_vllm == ["destroy_model_parallel", "environment"]   # the rest of the cleanup still ran
