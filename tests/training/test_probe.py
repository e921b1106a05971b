"""The weight-sync probe (``training.probe.megatron_logprobs``) runs under an interleaved pipeline: Megatron's
interleaved schedule refuses one micro-batch, so before, every run with
``model.virtual_pipeline_model_parallel_size`` > 1 stopped at its first weight push (``rollout.verify_sync``)."""

from types import SimpleNamespace

import torch

from ..helpers.spawn import run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model
from ..parallel.harness import Layout, build_chunks, init_layout


def _probe_at(rank, world_size):
    from phf_megatron.training.probe import megatron_logprobs

    out = []
    for layout in (Layout(pp=2), Layout(pp=2, vpp=2, overrides={"batch_p2p_comm": False})):
        init_layout(layout)
        chunks = build_chunks(tiny_hf_model("gqa", seed=0), layout, ddp=False)
        out.append(megatron_logprobs(SimpleNamespace(chunks=chunks, config=chunks[0].config), [1, 2, 3], [4, 5, 6]))
    return out


def test_the_probe_under_vpp_equals_the_plain_pipelines():
    plain, interleaved = run_ranks(_probe_at, 2)[0]
    assert len(plain) == 3
    torch.testing.assert_close(torch.tensor(interleaved), torch.tensor(plain), rtol=0, atol=1e-6)
