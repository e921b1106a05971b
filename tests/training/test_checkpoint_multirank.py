"""Checkpoints on 2 gloo ranks with Megatron-Core's own layers, DDP, optimizer and dist-checkpointing.

Scenario ``tp2``: TP=2 (ColumnParallelLinear -> dropout in the tracker's fork -> RowParallelLinear),
model and optimizer through ``dist_checkpointing`` (DIST), the EMA per TP rank, RNG per rank.
Scenario ``dp2``: DP=2, LoRA-style per-rank format (weights and the Megatron optimizer's plain
``state_dict`` written once per model-parallel rank), RNG per rank, and a writer that fails on
rank 1 only. Both check "4 steps straight == 2 steps + save + resume + 2 steps" bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from phf_megatron.training import checkpoint as ckpt
from phf_megatron.training.checkpoint_parts import (
    Part, RankLayout, Scope, dist_model_part, dist_optimizer_part, rng_part, stateful_part, tensors_part,
)
from phf_megatron.training.config import ModelConfig, OptimizerConfig, TrainConfig, TrainingConfig
from phf_megatron.training.distributed import seed_everything
from phf_megatron.training.schedule import build_scheduler, load_scheduler_state, megatron_optimizer_config

from ..helpers.spawn import run_ranks
from .toy_run import ToySampler, ema_step, noisy_batch

DIM, HIDDEN, BATCH = 6, 16, 4


def _build(seed: int, dp_rank: int, scenario: str):
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, get_cuda_rng_tracker
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

    seed_everything(seed)  # replicas start equal: Megatron's DDP does not broadcast weights
    model_parallel_cuda_manual_seed(seed)
    cfg = TransformerConfig(num_layers=1, hidden_size=DIM, num_attention_heads=2, use_cpu_initialization=True,
                            params_dtype=torch.float32)

    class Toy(MegatronModule):
        def __init__(self):
            super().__init__(cfg)
            self.fc1 = ColumnParallelLinear(DIM, HIDDEN, config=cfg, init_method=torch.nn.init.normal_,
                                            bias=True, gather_output=False)
            self.fc2 = RowParallelLinear(HIDDEN, 1, config=cfg, init_method=torch.nn.init.normal_, bias=True,
                                         input_is_parallel=True, skip_bias_add=False)

        def forward(self, x):
            h, _ = self.fc1(x)
            with get_cuda_rng_tracker().fork():  # per-TP-rank dropout stream: the tracker's state
                h = torch.nn.functional.dropout(h, 0.2, training=True)
            y, _ = self.fc2(torch.tanh(h))
            return y

        def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
            metadata = {"dp_cp_group": ps.get_data_parallel_group(with_context_parallel=True)}
            out = self.fc1.sharded_state_dict(f"{prefix}fc1.", sharded_offsets, metadata)
            out.update(self.fc2.sharded_state_dict(f"{prefix}fc2.", sharded_offsets, metadata))
            return out

    module = Toy()
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(), module)
    run_cfg = TrainConfig(
        model=ModelConfig(dtype="float32"),
        # clip_grad=0: Megatron's clip asserts CUDA tensors (the trainer's CPU path needs a shim for it).
        optimizer=OptimizerConfig(lr=1e-2, lr_decay_iters=6, weight_decay=0.01, clip_grad=0.0),
        training=TrainingConfig(micro_batch_size=2, global_batch_size=BATCH))
    opt = get_megatron_optimizer(megatron_optimizer_config(run_cfg), [ddp])
    sched = build_scheduler(opt, run_cfg.optimizer, run_cfg.prompts_per_step, 40)
    sampler = ToySampler(num_rows=10, seed=3)
    ema = {n: p.detach().clone() for n, p in module.named_parameters()}
    if scenario == "dp2":
        seed_everything(seed + 100 + dp_rank)  # each data-parallel rank draws its own noise
    return module, ddp, opt, sched, sampler, ema


def _step(run, dp_rank: int, dp_size: int) -> float:
    module, ddp, opt, sched, sampler, ema = run
    indices = sampler.take(BATCH)[dp_rank::dp_size]
    x, y = noisy_batch(indices, DIM)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    ddp.finish_grad_sync()
    opt.step()
    sched.step(1)
    ema_step(ema, dict(module.named_parameters()), decay=0.9)
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item()


def _parts(run, scenario: str) -> dict[str, Part]:
    module, _, opt, sched, sampler, ema = run
    if scenario == "tp2":
        weights = {"model": dist_model_part(module), "optimizer": dist_optimizer_part(opt, module)}
    else:
        weights = {"model": tensors_part(dict(module.named_parameters())),
                   "optimizer": stateful_part(opt, Scope.MODEL_PARALLEL)}
    return {**weights,
            "ema": tensors_part(ema),
            "scheduler": Part(Scope.GLOBAL, sched.state_dict, lambda s: load_scheduler_state(sched, s)),
            "data": stateful_part(sampler, Scope.GLOBAL),
            "rng": rng_part()}


def _snapshot(run) -> dict[str, torch.Tensor]:
    module, _, opt, _, _, ema = run
    out = {f"p.{n}": p.detach().clone() for n, p in module.named_parameters()}
    out.update({f"ema.{n}": t.clone() for n, t in ema.items()})
    params = [p for group in opt.optimizer.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        out.update({f"opt.{i}.{k}": torch.as_tensor(v).clone() for k, v in opt.optimizer.state[p].items()})
    out["next_torch"] = torch.rand(3)
    return out


def _check_resume(scenario: str, root: str) -> None:
    from megatron.core import parallel_state as ps

    layout = RankLayout.from_parallel_state()
    dp_rank, dp_size = layout.dp_rank, layout.dp_size
    straight = _build(0, dp_rank, scenario)
    expected_losses = [_step(straight, dp_rank, dp_size) for _ in range(4)]
    expected = _snapshot(straight)

    first = _build(0, dp_rank, scenario)
    losses = [_step(first, dp_rank, dp_size) for _ in range(2)]
    save_dir = os.path.join(root, scenario)
    ckpt.save_checkpoint(save_dir, 2, _parts(first, scenario), layout, fingerprint={"scenario": scenario})
    resumed = _build(7, dp_rank, scenario)  # different init and generators
    info = ckpt.load_checkpoint(save_dir, _parts(resumed, scenario), layout, fingerprint={"scenario": scenario})
    assert info.iteration == 2
    losses += [_step(resumed, dp_rank, dp_size) for _ in range(2)]
    assert losses == expected_losses, (losses, expected_losses)
    got = _snapshot(resumed)
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), (scenario, dist.get_rank(), key)

    files = sorted(os.listdir(os.path.join(save_dir, "iter_0000002")))
    if scenario == "tp2":
        assert files == ["dist", "global.pt", "meta.json", "model_parallel_tp00_pp000.pt",
                         "model_parallel_tp01_pp000.pt", "rank_tp00_pp000_dp000.pt", "rank_tp01_pp000_dp000.pt"]
    else:
        assert files == ["global.pt", "meta.json", "model_parallel_tp00_pp000.pt",
                         "rank_tp00_pp000_dp000.pt", "rank_tp00_pp000_dp001.pt"]
        _check_crash_on_rank1(resumed, save_dir, layout)
    ps.destroy_model_parallel()


def _check_crash_on_rank1(run, save_dir: str, layout: RankLayout) -> None:
    real = ckpt._write_torch
    if dist.get_rank() == 1:
        def failing(obj, path):
            with open(path, "wb") as f:
                f.write(b"half")
            raise OSError("simulated crash in rank 1's writer")
        ckpt._write_torch = failing
    try:
        with pytest.raises(ckpt.CheckpointSaveError, match=r"rank\(s\) \[1\]"):
            ckpt.save_checkpoint(save_dir, 4, _parts(run, "dp2"), layout)
    finally:
        ckpt._write_torch = real
    dist.barrier()
    assert ckpt.read_latest(save_dir) == 2
    assert sorted(os.listdir(save_dir)) == ["iter_0000002", ckpt.LATEST_FILE]


def _both_scenarios(rank: int, world: int, root: str) -> None:
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    _check_resume("tp2", root)
    ps.initialize_model_parallel(tensor_model_parallel_size=1)
    _check_resume("dp2", root)


@pytest.mark.slow  # ~30-40 s on 2 cores: two spawned processes import Megatron-Core
def test_two_ranks_resume_bit_exact_and_survive_a_rank_crash(tmp_path):
    run_ranks(_both_scenarios, 2, str(tmp_path))
