"""LoRA on a sharded Megatron Qwen3: PEFT export reproduces the student in HF transformers.

A random adapter set (non-zero B) is loaded into the Megatron model at TP=2 (with SP) and at
TP=2 x PP=2; Megatron's logits, the logits of ``PeftModel.from_pretrained`` on the exported
directory, and the logits of the HF model with the merged deltas added must all agree (fp32); with the
adapters switched off (``lora.adapters_off``) Megatron's logits are the base HF model's.
"""

import os

import pytest
import torch

from ..helpers.forward import megatron_logits
from ..helpers.spawn import megatron_layout, run_ranks
from ..helpers.tiny_qwen3 import tiny_hf_model

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _random_adapters(hf_model, rank, seed=3):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, module in hf_model.named_modules():
        if name.split(".")[-1] in TARGETS:
            out[name] = (0.1 * torch.randn(rank, module.in_features, generator=g),
                         0.1 * torch.randn(module.out_features, rank, generator=g))
    return out


def _probe_weights(shape, seed=11):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _adapter_grads(model, ids):
    """Gradients of sum(logits * R) w.r.t. every adapter tensor, gathered to full HF-layout tensors."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.lora.export import full_adapters

    b, s = ids.shape
    tp, tp_rank = parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()

    def step(data_iterator, chunk):
        out = chunk(ids, torch.arange(s)[None].expand(b, -1), attention_mask=None)

        def loss(logits):
            r = _probe_weights((b, s, logits.shape[-1] * tp))[..., tp_rank * logits.shape[-1]:(tp_rank + 1) * logits.shape[-1]]
            return (logits.float() * r).sum(), {}

        return out, loss

    model.train()
    get_forward_backward_func()(forward_step_func=step, data_iterator=iter([None]), model=[model], num_microbatches=1,
                                seq_length=s, micro_batch_size=b, forward_only=False)
    return full_adapters([model], select=lambda p: p.grad)


def _merged_deltas(model_chunks, scaling):
    """``{hf weight name: scaling * B @ A}``: what LoRA adds to each base weight (the oracle for the merge)."""
    from phf_megatron.lora.export import full_adapters

    return {f"{name}.weight": scaling * (b.float() @ a.float())
            for name, (a, b) in full_adapters(model_chunks).items()}


def _megatron_side(rank, world_size, name, tp, pp, out_dir):
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.lora import LoraConfig, apply_lora
    from phf_megatron.lora.export import export_peft_adapter, load_full_adapters
    from phf_megatron.models import build_qwen3_model

    megatron_layout(tp, pp)
    hf = tiny_hf_model(name)
    cfg = LoraConfig(r=4, alpha=8.0, dropout=0.0)
    model = build_qwen3_model(hf.config, sp=tp > 1, dtype=torch.float32)
    load_hf_weights(model, hf.state_dict().__getitem__, Qwen3Arch.from_hf(hf.config))
    apply_lora(model, cfg)
    assert all(("adapters" in n) == p.requires_grad for n, p in model.named_parameters())
    load_full_adapters([model], _random_adapters(hf, cfg.r))
    ids = torch.randint(0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
    logits = megatron_logits(model, ids)
    from phf_megatron.lora import adapters_off, lora_modules

    with adapters_off([model]):  # the GRPO KL reference and the fixed LoRA teacher: the base model
        base = megatron_logits(model, ids)
    assert all(module.enabled for _, module in lora_modules(model))  # on again after the block
    grads = _adapter_grads(model, ids)
    export_peft_adapter([model], out_dir, cfg, base_model_name_or_path="tiny")
    deltas = _merged_deltas([model], cfg.scaling)
    # the rollout sync's path: merged weights gathered tensor by tensor under HF names
    from megatron.core import parallel_state

    from phf_megatron.lora import merged_weight_selector
    from phf_megatron.convert.live_model import iter_hf_weights

    merged = dict(iter_hf_weights(model, Qwen3Arch.from_hf(hf.config), select=merged_weight_selector([model]),
                                  pp_group=parallel_state.get_pipeline_model_parallel_group()))
    return {"logits": logits, "base": base, "deltas": deltas, "ids": ids, "merged": merged if rank == 0 else None, "grads": grads}


@pytest.mark.parametrize("name,tp,pp", [("gqa", 1, 1), ("gqa", 2, 1), ("tied", 2, 2)],
                         ids=["gqa-tp1-two-groups-per-rank", "gqa-tp2-sp", "tied-tp2xpp2"])
def test_peft_export_and_merged_deltas_reproduce_megatron_logits(tmp_path, name, tp, pp):
    from peft import PeftModel

    out_dir = str(tmp_path / "adapter")
    results = run_ranks(_megatron_side, tp * pp, name, tp, pp, out_dir)
    megatron = next(r["logits"] for r in results if r["logits"] is not None)
    ids = results[0]["ids"]
    assert sorted(os.listdir(out_dir)) == ["adapter_config.json", "adapter_model.safetensors"]

    peft_model = PeftModel.from_pretrained(tiny_hf_model(name), out_dir).eval()
    with torch.no_grad():
        peft_logits = peft_model(ids).logits
    torch.testing.assert_close(megatron, peft_logits, atol=1e-4, rtol=0)

    merged = tiny_hf_model(name)
    deltas = {}
    for r in results:
        deltas.update(r["deltas"])  # each pipeline stage holds its own layers' deltas
    assert len(deltas) == 7 * merged.config.num_hidden_layers
    with torch.no_grad():
        params = dict(merged.named_parameters())
        for weight_name, delta in deltas.items():
            params[weight_name].add_(delta)
        torch.testing.assert_close(megatron, merged(ids).logits, atol=1e-4, rtol=0)
    # the merged HF state dict from iter_hf_weights(select=merged_weight_selector) is the same model
    synced = tiny_hf_model(name)
    missing, unexpected = synced.load_state_dict(results[0]["merged"], strict=False)
    assert not unexpected and all("lm_head" in k for k in missing)  # tied models have no separate head
    with torch.no_grad():
        torch.testing.assert_close(megatron, synced(ids).logits, atol=1e-4, rtol=0)
    # adapter gradients equal PEFT's (the same loss, sum(logits * R), in HF transformers)
    grads = {}
    for r in results:
        grads.update(r["grads"])
    trainable = PeftModel.from_pretrained(tiny_hf_model(name), out_dir, is_trainable=True)
    (trainable(ids).logits * _probe_weights(peft_logits.shape)).sum().backward()
    modules = dict(trainable.named_modules())
    assert len(grads) == 7 * merged.config.num_hidden_layers
    for module_name, (g_a, g_b) in grads.items():
        module = modules[f"base_model.model.{module_name}"]
        for got, ref in ((g_a, module.lora_A["default"].weight.grad), (g_b, module.lora_B["default"].weight.grad)):
            err, scale = (got - ref).abs().max().item(), ref.abs().max().item()
            assert err <= 1e-5 * scale + 1e-6, (module_name, err, scale)  # fp32, summation order only
    # and the adapters matter: without them the logits differ; with them switched off (adapters_off) Megatron
    # is the base HF model
    with torch.no_grad():
        base_hf = tiny_hf_model(name)(ids).logits
    assert (base_hf - megatron).abs().max() > 1e-2
    torch.testing.assert_close(next(r["base"] for r in results if r["base"] is not None), base_hf, atol=1e-4, rtol=0)


def _merged_weights_are_not_kept(rank, world_size):
    import gc
    import weakref

    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.lora import LoraConfig, apply_lora, lora_modules, merged_weight_selector
    from phf_megatron.lora.export import load_full_adapters
    from phf_megatron.models import build_qwen3_model
    from phf_megatron.models.qwen3_arch import Qwen3Arch

    megatron_layout(1, 1)
    hf = tiny_hf_model("gqa")
    cfg = LoraConfig(r=4, alpha=8.0, dropout=0.0)
    model = build_qwen3_model(hf.config, dtype=torch.float32)
    load_hf_weights(model, hf.state_dict().__getitem__, Qwen3Arch.from_hf(hf.config))
    apply_lora(model, cfg)
    load_full_adapters([model], _random_adapters(hf, cfg.r))
    select = merged_weight_selector([model])
    alive = []
    for _, module in lora_modules(model):
        merged = select(module.base.weight)
        assert not torch.equal(merged, module.base.weight) and not merged.requires_grad
        alive.append(weakref.ref(merged))
        del merged
    gc.collect()
    return sum(ref() is not None for ref in alive), len(alive)


def test_the_merge_for_the_weight_sync_holds_no_copy_of_the_model():
    """The rollout sync streams merged weights tensor by tensor (peak about one bucket): the selector
    computes each when asked and keeps none (it held every merged weight of the rank before: a second
    copy of all q/k/v/o/gate/up/down weights, about 7 GB per GPU for Qwen3-8B at TP=2 in bf16, during every sync)."""
    kept, total = run_ranks(_merged_weights_are_not_kept, 1)[0]
    assert total == 4 * 4 and kept == 0, (kept, total)  # 4 layers x (qkv, o, fc1, fc2)
