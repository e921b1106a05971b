"""Build the student (Megatron Qwen3, base weights loaded, LoRA or full fine-tuning), its DDP
wrapper, Megatron's optimizer and the LR schedule, for this rank.

The privileged teacher is the same network (``teacher.PrivilegedTeacher`` swaps the trainable
tensors around its forward), so there is one model per rank, not two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..models.choices import as_dtype
from ..models.qwen3_arch import Qwen3Arch
from ..lora import apply_lora
from ..config_errors import fail
from ..errors import as_config_error
from ..input_files import check_hf_model_dir, missing_hf_config, read_json
from .config import TrainConfig
from .schedule import build_scheduler, megatron_optimizer_config

@dataclass
class StudentModel:
    """This rank's model chunks (DDP-wrapped), what they were built from, and their optimizer."""

    chunks: list
    arch: Qwen3Arch
    hf_config: object
    optimizer: object
    scheduler: object

    @property
    def config(self):
        return self.chunks[0].config


def read_hf_config(cfg: TrainConfig):
    """The HF ``Qwen3Config`` of the run's base model (``model.hf_dir``, or a converted checkpoint's)."""
    from transformers import AutoConfig, Qwen3Config

    if cfg.model.hf_dir:
        if why := missing_hf_config(cfg.model.hf_dir):
            raise fail("model.hf_dir", why)
        check_hf_model_dir(cfg.model.hf_dir)  # a damaged config.json or safetensors file is named here
        # the file's own model_type: transformers may load it as a relative ('mistral' as 'ministral')
        model_type = read_json(os.path.join(cfg.model.hf_dir, "config.json")).get("model_type")
        if model_type != "qwen3":
            raise fail("model.hf_dir", f"model_type {model_type!r} is not 'qwen3'")
        hf_config = AutoConfig.from_pretrained(cfg.model.hf_dir)
    elif cfg.model.pretrained_checkpoint:
        from ..convert.mcore_checkpoint import read_metadata

        hf_config = Qwen3Config(**read_metadata(cfg.model.pretrained_checkpoint)["hf_config"])
    else:
        raise fail("model.hf_dir", "set it (or model.pretrained_checkpoint) to the base model to train")
    if getattr(hf_config, "model_type", None) != "qwen3":
        raise fail("model.hf_dir", f"model_type {getattr(hf_config, 'model_type', None)!r} is not 'qwen3'")
    return hf_config


def check_settings_fit_model(cfg: TrainConfig, hf_config) -> None:
    """Settings that depend on the model, checked before anything is built (errors name the flag)."""
    cfg.model.check_model_shape(hf_config.num_hidden_layers, hf_config.num_attention_heads,
                                hf_config.num_key_value_heads, intermediate_size=hf_config.intermediate_size,
                                vocab_size=hf_config.vocab_size)
    if cfg.objective.uses_flow:
        from ..objectives.flow import LayerPlan
        try:
            LayerPlan.build(hf_config.num_hidden_layers, cfg.objective.flow_variant, cfg.objective.flow_layers)
        except ValueError as exc:
            raise fail("objective.flow_layers", str(exc)) from exc
    if cfg.method == "sft" and cfg.sft.max_length > hf_config.max_position_embeddings:
        raise fail("sft.max_length", f"{cfg.sft.max_length} exceeds the model's max_position_embeddings "
                   f"({hf_config.max_position_embeddings})")
    longest = cfg.data.max_prompt_length + cfg.rollout.max_tokens
    if cfg.method != "sft" and longest > hf_config.max_position_embeddings:   # vLLM refuses it; the trainer would extrapolate RoPE
        culprit = "rollout.max_tokens" if cfg.rollout.max_tokens >= hf_config.max_position_embeddings else \
            "data.max_prompt_length"
        raise fail(culprit, f"data.max_prompt_length + rollout.max_tokens = "
                   f"{cfg.data.max_prompt_length} + {cfg.rollout.max_tokens} = {longest} exceeds the model's "
                   f"max_position_embeddings ({hf_config.max_position_embeddings}); lower {culprit}")
    if cfg.data.reason_first and longest + cfg.data.reason_first_max_tokens > hf_config.max_position_embeddings:
        raise fail("data.reason_first_max_tokens", f"the reason-first teacher sequence (prompt "
                   f"{cfg.data.max_prompt_length} + analysis {cfg.data.reason_first_max_tokens} + rollout "
                   f"{cfg.rollout.max_tokens}) exceeds the model's max_position_embeddings "
                   f"({hf_config.max_position_embeddings})")
    if cfg.objective.top_k_loss is not None and cfg.objective.top_k_loss > hf_config.vocab_size:
        raise fail("objective.top_k_loss", f"{cfg.objective.top_k_loss} exceeds the model's vocabulary "
                   f"({hf_config.vocab_size})")


def _on_gloo() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_backend() == "gloo"


def _config_overrides(cfg: TrainConfig) -> dict:
    m = cfg.model
    out = dict(calculate_per_token_loss=True)
    if m.virtual_pipeline_model_parallel_size:
        out["virtual_pipeline_model_parallel_size"] = m.virtual_pipeline_model_parallel_size
        if _on_gloo():  # its batched p2p pairs the interleaved schedule's messages wrongly (next rank == previous)
            out["batch_p2p_comm"] = False
    if m.recompute_granularity:
        out.update(recompute_granularity=m.recompute_granularity)
        if m.recompute_granularity == "full":
            out.update(recompute_method=m.recompute_method, recompute_num_layers=m.recompute_num_layers)
    if cfg.dropout_disabled:
        out.update(hidden_dropout=0.0, attention_dropout=0.0)
    if m.compile_layers:
        out["compile_layers"] = True
    out["packed_attention"] = packed_attention_in_use(cfg)
    return out


def packed_attention_in_use(cfg: TrainConfig) -> str:
    """``model.packed_attention``, or ``'sdpa'`` without ``training.packing``: no micro-batch is packed then, and
    the choice has no effect (``'varlen'`` is neither checked, nor built into the model, nor said)."""
    return cfg.model.packed_attention if cfg.training.packing else "sdpa"


def check_packed_attention(cfg: TrainConfig) -> None:
    """``model.packed_attention='varlen'`` where it cannot run, refused in one line before anything is built: with
    Transformer Engine's spec (its own THD attention runs packed sequences), a torch without ``varlen_attn``, no CUDA
    device, ``model.dtype=float32`` (``models/varlen.py`` owns these limits of the kernel). What the model refuses
    (attention dropout, a softmax scale) is named as it is built. Without ``training.packing``: nothing to check."""
    if packed_attention_in_use(cfg) != "varlen":
        return
    from ..models.spec import resolve_backend
    from ..models.varlen import varlen_dtype_refused, varlen_unavailable

    if resolve_backend(cfg.model.transformer_impl) == "te":
        raise fail("model.packed_attention", "'varlen' is the local spec's attention; model.transformer_impl="
                   f"{cfg.model.transformer_impl!r} runs Transformer Engine here, whose THD attention takes packed "
                   "sequences: set model.transformer_impl=local, or leave this at 'sdpa'")
    # CUDA before the dtype: on a CPU that is what to change
    reason = varlen_unavailable() or varlen_dtype_refused(as_dtype(cfg.model.dtype))
    if reason:
        raise fail("model.packed_attention", reason.removeprefix("packed_attention: "))


def _load_base_weights(chunk, cfg: TrainConfig, arch: Qwen3Arch) -> None:
    """Base weights into this rank's shard: a converted Megatron checkpoint, else the HF files."""
    if cfg.model.pretrained_checkpoint:
        from ..convert.mcore_checkpoint import load_checkpoint

        load_checkpoint(chunk, cfg.model.pretrained_checkpoint)
        return
    from ..convert.hf_checkpoint import HFCheckpoint
    from ..convert.live_model import load_hf_weights

    try:
        checkpoint = HFCheckpoint(cfg.model.hf_dir)
    except FileNotFoundError as err:   # "hf_dir: neither model.safetensors.index.json nor ..."
        raise as_config_error(err, ("hf_dir",), "model") or err from None
    load_hf_weights(chunk, checkpoint.get, arch)


def _let_recompute_reach_the_adapters(model) -> None:
    """Make the embedding's output require grad when the embedding is frozen (LoRA).

    Megatron's full recompute wraps layers in a reentrant checkpoint Function: when none of its
    tensor inputs requires grad, its output does not either, and backward never enters it. With a
    frozen base the first stage's layer input is such a tensor, so every adapter would get a zero
    gradient (found by running the 1.7B example config on CPU: grad norm 0.0). Later pipeline
    stages receive inputs that require grad already.
    """
    embedding = getattr(model, "embedding", None)
    if embedding is None or any(p.requires_grad for p in embedding.parameters()):
        return

    def require_grad(module, inputs, output):
        if torch.is_grad_enabled() and not output.requires_grad:
            output.requires_grad_(True)
        return output

    embedding.register_forward_hook(require_grad)


def student_lora(cfg: TrainConfig):
    """``cfg.lora`` as the student is built with it: its dropout zeroed where ``cfg.dropout_disabled``."""
    lora = cfg.lora
    if lora.enabled and cfg.dropout_disabled:
        lora = type(lora)(**{**lora.__dict__, "dropout": 0.0})
    return lora


def build_model_chunks(cfg: TrainConfig, hf_config, arch: Qwen3Arch) -> list:
    """This rank's model chunks (one per virtual pipeline stage) with the base weights loaded and,
    with LoRA, fresh adapters (seeded by ``training.seed``): the student before any wrapper. The
    trainer trains them; ``training.export`` loads a checkpoint's weights into them."""
    from ..models import build_qwen3_model

    dtype = as_dtype(cfg.model.dtype)
    fused = cfg.model.fused_kernels and torch.cuda.is_available()
    lora = student_lora(cfg)
    chunks = []
    vpp = cfg.model.virtual_pipeline_model_parallel_size
    for vp_stage in range(vpp or 1):
        try:
            model = build_qwen3_model(hf_config, sp=cfg.model.sequence_parallel, dtype=dtype, fused=fused,
                                      backend=cfg.model.transformer_impl, vp_stage=vp_stage if vpp else None,
                                      **_config_overrides(cfg))
        except ValueError as err:   # "packed_attention: ..." (models/varlen.py)
            raise as_config_error(err, ("packed_attention",), "model") or err from None
        _load_base_weights(model, cfg, arch)
        if lora.enabled:
            apply_lora(model, lora, seed=cfg.training.seed)
        chunks.append(model)
    return chunks


def build_student(cfg: TrainConfig, num_rows: int) -> StudentModel:
    """The student of this rank, ready to train (a collective over the model-parallel group).

    ``num_rows``: the training set's size, which sets the cosine schedule's length (epochs x rows).
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer

    hf_config = read_hf_config(cfg)
    check_settings_fit_model(cfg, hf_config)
    check_packed_attention(cfg)
    arch = Qwen3Arch.from_hf(hf_config)
    chunks = []
    for model in build_model_chunks(cfg, hf_config, arch):
        if cfg.model.recompute_granularity == "full":
            _let_recompute_reach_the_adapters(model)
        if torch.cuda.is_available():
            model.cuda()
        model.config.finalize_model_grads_func = finalize_model_grads
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                   use_distributed_optimizer=cfg.optimizer.use_distributed_optimizer)
        chunks.append(DistributedDataParallel(model.config, ddp_config, model))
    if not any(p.requires_grad for c in chunks for p in c.parameters()):
        raise fail("lora.target_modules", "nothing to train on this rank (no adapter and no trainable weight)")
    optimizer = get_megatron_optimizer(megatron_optimizer_config(cfg), chunks)
    config = chunks[0].config
    config.no_sync_func = [c.no_sync for c in chunks] if len(chunks) > 1 else chunks[0].no_sync
    config.grad_scale_func = optimizer.scale_loss
    scheduler = build_scheduler(optimizer, cfg.optimizer, cfg.prompts_per_step, num_rows, cfg.iterations)
    return StudentModel(chunks, arch, hf_config, optimizer, scheduler)


def implementations(cfg: TrainConfig, student: StudentModel, engine, loss_parts: list[str]) -> str:
    """One line saying which implementation runs each piece (what Megatron's Transformer Engine /
    Apex fallback warnings would say, shown instead of them): attention, norm, fused kernels, the
    method's loss kernels (``loss_parts``, ``Method.implementations``), the optimizer and the rollout
    engine (``engine``: rank 0's, or None: the method has none)."""
    from ..models.spec import have_transformer_engine, resolve_backend

    cuda = torch.cuda.is_available()
    te = resolve_backend(cfg.model.transformer_impl) == "te"
    no_te = "" if te else (" (Transformer Engine not installed)" if not have_transformer_engine() else "")
    kernel = "" if te else sdpa_kernel_in_use(student.config, cuda)
    packed = f", packed sequences: {packed_attention(te, kernel, cfg.model.packed_attention)}" \
        if cfg.training.packing else ""
    parts = [f"attention {'Transformer Engine' if te else f'SDPA (Megatron local spec, {kernel})'}{no_te}{packed}",
             f"norm {'Transformer Engine RMSNorm' if te else 'RMSNorm (phf_megatron.models.norm)'}"]
    fused = cfg.model.fused_kernels and cuda
    parts.append("fused RMSNorm/RoPE/SwiGLU " + ("on" if fused else "off" + ("" if cuda else " (no CUDA)")))
    parts.extend(loss_parts)
    inner = getattr(student.optimizer, "optimizer", student.optimizer)
    parts.append(f"optimizer {type(inner).__module__.split('.')[0]}.{type(inner).__name__}")
    parts.append(f"rollout {describe_engine(engine)}" if engine is not None else "no rollout engine")
    return "; ".join(parts)


def packed_attention(te: bool, kernel: str, choice: str = "sdpa") -> str:
    """The attention that runs packed sequences (``training.packing``, THD with ``cu_seqlens``): Transformer
    Engine's THD path; else ``models.attention.SDPACoreAttention`` as ``choice`` (``model.packed_attention``) says:
    one causal SDPA call per packed sequence (block-diagonal causal attention without a ``[S, S]`` mask) on
    ``kernel`` (``sdpa_kernel_in_use``), or ``'varlen'``: PyTorch's varlen flash attention, one call per layer."""
    if te:
        return "Transformer Engine THD (cu_seqlens)"
    if choice == "varlen":
        return "varlen flash, causal (torch.nn.attention.varlen.varlen_attn, one call per layer)"
    return f"SDPA per sequence, causal ({kernel})"


def sdpa_kernel_in_use(config, cuda: bool) -> str:
    """The SDPA kernel PyTorch takes for this rank's attention (Megatron ``TransformerConfig``: heads and query groups
    per tensor-parallel rank, head size, parameter dtype, attention dropout), e.g. ``"flash kernel"``,
    ``"math kernel on CPU"``."""
    from ..models.attention import kernel_in_use

    tp = config.tensor_model_parallel_size
    name = kernel_in_use(config.num_attention_heads // tp, config.num_query_groups // tp, config.kv_channels,
                         config.params_dtype, torch.device("cuda" if cuda else "cpu"), config.attention_dropout)
    return f"{name} kernel" + ("" if cuda else " on CPU")


def loss_kernels(cfg: TrainConfig) -> list[str]:
    """PHF's loss kernels in a few words: the flow's (when on) and the JSD's."""
    cuda = torch.cuda.is_available()
    parts = []
    if cfg.objective.uses_flow:
        from ..kernels import loader

        flow_kernel = cuda and loader.available()
        parts.append("flow loss " + ("fused CUDA kernel" if flow_kernel else
                                     "PyTorch" + ("" if cuda else " (no CUDA)")))
    from ..parallel import jsd_triton

    parts.append("JSD " + ("Triton" if cuda and jsd_triton.triton is not None else "PyTorch"))
    return parts


def describe_engine(engine) -> str:
    """The rollout engine in a few words (``VLLMEngine`` -> ``vLLM 0.32.0 (in process)``)."""
    name = type(engine).__name__
    if name == "VLLMEngine":
        import vllm

        return f"vLLM {vllm.__version__} ({'in process' if engine.in_process else 'own process'})"
    if name == "VLLMServerEngine":
        return f"vLLM server at {engine.base_url}"
    if name == "HFEngine":
        return "transformers generate"
    return name
