"""The names a config may choose for the model's layers (no Megatron import: the command line
checks them before anything heavy loads)."""

#: Layer implementations (``models.spec``, ``model.transformer_impl``): "auto" (Transformer Engine
#: when it imports, else local), "te" (Transformer Engine's spec), "local" (Megatron's local spec
#: with our SDPA attention and SP-safe RMSNorm).
TRANSFORMER_IMPLS = ("auto", "te", "local")

#: Attention of packed sequences in the local spec (``model.packed_attention``, ``models.attention``): "sdpa" (one
#: causal SDPA call per sequence), "varlen" (one call per layer of PyTorch's varlen flash attention, CUDA only).
PACKED_ATTENTIONS = ("sdpa", "varlen")

#: The parameter dtypes a setting names (``model.dtype``, the eval's and the converters' ``--dtype``), as torch
#: names them; ``DTYPE_ALIASES``: the short spellings (the converters' ``--dtype bf16``) every such setting takes too,
#: read as the torch name (one name per dtype in a run's config.yaml, an eval's summary, a resume fingerprint).
DTYPES = ("bfloat16", "float16", "float32")
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: Every spelling a dtype setting takes (the converters' ``--dtype`` choices).
DTYPE_SPELLINGS = (*DTYPE_ALIASES, *DTYPES)


def dtype_name(value: str) -> str:
    """``value`` as the torch name of its dtype (``bf16`` -> ``bfloat16``); another value as given, for the
    setting's own check to refuse."""
    return DTYPE_ALIASES.get(value, value)


def as_dtype(value):
    """The ``torch.dtype`` a setting names (either spelling; a ``torch.dtype`` as given): the one map from a dtype's
    name to torch's (torch imported here, not at module import, so the command line's checks stay light)."""
    import torch

    if isinstance(value, torch.dtype):
        return value
    name = dtype_name(value) if isinstance(value, str) else value
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPE_SPELLINGS} or a torch.dtype, got {value!r}")
    return getattr(torch, name)
