"""The evaluator's data-parallel replicas run on the GPUs this process was given.

Each replica is a spawned process that sets ``CUDA_VISIBLE_DEVICES`` to its share before any CUDA call.
Under a parent ``CUDA_VISIBLE_DEVICES=4,6`` (a shared node, a scheduler's choice) its share must be
physical GPU 4 or 6: the parent's local indices 0 and 1 named other jobs' GPUs.
"""

from __future__ import annotations

import os

import pytest
import torch

from phf_megatron.eval import runner
from phf_megatron.eval.config import EvalConfig


def _replicas_see(monkeypatch, tmp_path, parent: dict, gpus: int, **config) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` each replica's worker sets, the parent's environment being ``parent``."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for key, value in parent.items():
        monkeypatch.setenv(key, value)
    seen = []
    monkeypatch.setattr(runner, "generate_samples",
                        lambda *a, **k: seen.append(os.environ.get("CUDA_VISIBLE_DEVICES")))
    cfg = EvalConfig(out_dir=str(tmp_path), model="m", **config)
    replicas = runner._replica_gpus(cfg)
    for rank, gpus_of_replica in enumerate(replicas):
        with monkeypatch.context() as m:   # each worker is a process of its own: its setting goes with it
            m.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
            runner._worker(cfg, "m", "hf", [], rank, gpus_of_replica, None, None)   # (no error, no tally)
    return seen


@pytest.mark.parametrize("parent, gpus, config, want", [
    ({"CUDA_VISIBLE_DEVICES": "4,6"}, 2, {}, ["4", "6"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}, 4, {"engine_kwargs": {"tensor_parallel_size": 2}},
     ["GPU-a,GPU-b", "GPU-c,GPU-d"]),
    ({}, 2, {}, ["0", "1"]),                                    # nothing set: the indices are the GPUs
], ids=["indices", "uuids-tp2", "unset"])
def test_each_replica_gets_the_parents_visible_gpus(monkeypatch, tmp_path, parent, gpus, config, want):
    assert _replicas_see(monkeypatch, tmp_path, parent, gpus, **config) == want


def test_a_vllm_server_eval_is_one_client_whatever_gpus_it_has(monkeypatch, tmp_path):
    """--backend vllm_server: the server generates every sample; one replica per local GPU would push the model
    into it once each (8 pushes of the whole model on an 8-GPU node) and split nothing."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    server = {"engine_kwargs": {"server_url": "http://127.0.0.1:1"}, "backend": "vllm_server"}
    assert runner._replica_gpus(EvalConfig(out_dir=str(tmp_path), model="m", **server)) is None
    assert len(runner._replica_gpus(EvalConfig(out_dir=str(tmp_path), model="m", backend="vllm"))) == 8
    with pytest.raises(ValueError, match=r"^data_parallel: 2 replicas, and --backend vllm_server has the server "
                                         r"generate every sample on its own GPUs: leave it out$"):
        EvalConfig(out_dir=str(tmp_path), model="m", data_parallel=2, **server)   # before any merge or convert
