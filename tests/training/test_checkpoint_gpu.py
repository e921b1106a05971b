"""The CUDA-only paths of the checkpoint code (skipped without a GPU).

One process on one GPU with an NCCL group: the CUDA generator and Megatron's CUDA RNG tracker
round-trip through a checkpoint, and the ranks' agreement all-reduce runs on a CUDA tensor.

    pytest -m gpu tests/training/test_checkpoint_gpu.py
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..helpers.spawn import free_port

pytestmark = pytest.mark.gpu


def _draws() -> torch.Tensor:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    outside = torch.randn(4, device="cuda")
    with get_cuda_rng_tracker().fork():
        inside = torch.randn(4, device="cuda")
    return torch.cat([outside.cpu(), inside.cpu(), torch.rand(2)])


def _worker(rank: int, port: int, root: str) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from phf_megatron.training import checkpoint as ckpt
    from phf_megatron.training.checkpoint_parts import RankLayout, Scope, rng_part, tensors_part

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
        model_parallel_cuda_manual_seed(123)
        weights = {"w": torch.randn(3, 3, device="cuda")}
        layout = RankLayout.from_parallel_state()
        parts = {"weights": tensors_part(weights, Scope.MODEL_PARALLEL), "rng": rng_part()}
        ckpt.save_checkpoint(root, 1, parts, layout)
        expected, expected_w = _draws(), weights["w"].clone()
        weights["w"].zero_()
        model_parallel_cuda_manual_seed(999)
        torch.manual_seed(5)
        ckpt.load_checkpoint(root, parts, layout)
        assert torch.equal(_draws(), expected)
        assert torch.equal(weights["w"], expected_w) and weights["w"].is_cuda
        ps.destroy_model_parallel()
    finally:
        dist.destroy_process_group()


def test_cuda_rng_and_nccl_agreement_round_trip(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=1, join=True)
