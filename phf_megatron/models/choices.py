"""The names a config may choose for the model's layers (no Megatron import: the command line
checks them before anything heavy loads)."""

#: Layer implementations (``models.spec``, ``model.transformer_impl``): "auto" (Transformer Engine
#: when it imports, else local), "te" (Transformer Engine's spec), "local" (Megatron's local spec
#: with our SDPA attention and SP-safe RMSNorm).
TRANSFORMER_IMPLS = ("auto", "te", "local")
