"""An in-process vLLM engine that fails to start drops vLLM's distributed state (``forget_failed_start``);
when that cleanup fails too, the start's own one-line ``VLLMStartError`` is still what the user sees (it was
the cleanup's traceback, the start's error lost in its context). The engine is real vLLM refused for want of KV
cache; only its ``destroy_model_parallel`` is made to raise."""

from __future__ import annotations

import pytest

from phf_megatron.rollout.errors import VLLMStartError


def test_a_failed_cleanup_after_a_failed_start_leaves_the_starts_one_line(tiny_dir, monkeypatch):
    pytest.importorskip("vllm")
    import torch.distributed as dist
    from vllm.distributed import parallel_state

    from phf_megatron.rollout.vllm_engine import VLLMEngine

    had_group, called = dist.is_initialized(), []
    destroy_groups, destroy_environment = (parallel_state.destroy_model_parallel,
                                           parallel_state.destroy_distributed_environment)

    def destroy_model_parallel():
        called.append("destroy_model_parallel")
        destroy_groups()   # (done: a later engine in this process starts afresh), then it raises
        raise RuntimeError("cleanup broke")

    def environment():
        called.append("environment")
        destroy_environment()

    monkeypatch.setattr(parallel_state, "destroy_model_parallel", destroy_model_parallel)
    monkeypatch.setattr(parallel_state, "destroy_distributed_environment", environment)
    with pytest.warns(UserWarning, match=r"^vLLM's state after its failed start was not dropped \(RuntimeError: "
                                         r"cleanup broke\)"):
        with pytest.raises(VLLMStartError) as err:
            VLLMEngine(tiny_dir, dtype="float32", kv_cache_bytes=1)   # no room for one cache block
    assert "\n" not in str(err.value) and "cleanup broke" not in str(err.value), str(err.value)
    assert called == ["destroy_model_parallel", "environment"]   # the rest of the cleanup still ran
    assert dist.is_initialized() == had_group   # ... and dropped the default group vLLM had made
