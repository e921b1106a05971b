"""HF Qwen3 <-> Megatron-Core conversion: pure mapping functions, TP/PP sharding, checkpoint I/O."""
