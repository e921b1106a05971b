"""The embedded toy task end to end: compact-vocabulary tiny Qwen3, warm-up, evaluation.

``python -m phf_megatron.toy prepare --out DIR`` and ``python -m phf_megatron.toy evaluate``;
see ``docs/toy_task.md`` for the design and the measured learning curve.
"""
