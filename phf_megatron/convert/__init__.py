"""HF Qwen3 <-> Megatron-Core conversion.

Pure functions (torch only, no process group):
* ``qwen3_arch.Qwen3Arch.from_hf(config | dict | dir)``: the shapes, with checks;
* ``qwen3_mapping``: one literal name map; ``hf_sources``, ``hf_to_mcore``, ``mcore_to_hf``,
  ``canonical_name`` / ``spec_name`` (local vs Transformer Engine norm names), ``hf_shapes``;
* ``sharding``: ``tp_shard`` / ``tp_merge`` (column, GLU, row, replicated), PP layer ranges.

Live, sharded models (collective over TP, and PP when asked):
* ``live_model.load_hf_weights(model, get_hf, arch)``: HF tensors into this rank's shard;
* ``live_model.iter_hf_weights(model, arch, tp_group=, pp_group=, dtype=, select=)``: yields
  ``(hf_name, full tensor)`` gathering TP shards one tensor at a time — the weight-sync stream
  for the rollout engine (every TP rank iterates; with ``pp_group`` every PP rank gets all).

Checkpoints: ``hf_checkpoint.HFCheckpoint`` (lazy, validated reader), ``mcore_checkpoint``
(dist-checkpoint save/load + metadata), ``hf_writer`` (streaming safetensors writer),
``checkpoints.convert_hf_to_mcore`` / ``convert_mcore_to_hf`` (what ``tools/convert`` runs).
"""
