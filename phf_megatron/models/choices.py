"""The names a config may choose for the model's layers (no Megatron import: the command line
checks them before anything heavy loads)."""

#: Layer implementations (``models.spec``, ``model.transformer_impl``): "auto" (Transformer Engine
#: when it imports, else local), "te" (Transformer Engine's spec), "local" (Megatron's local spec
#: with our SDPA attention and SP-safe RMSNorm).
TRANSFORMER_IMPLS = ("auto", "te", "local")

#: Attention of packed sequences in the local spec (``model.packed_attention``, ``models.attention``): "sdpa" (one
#: causal SDPA call per sequence), "varlen" (one call per layer of PyTorch's varlen flash attention, CUDA only).
PACKED_ATTENTIONS = ("sdpa", "varlen")
