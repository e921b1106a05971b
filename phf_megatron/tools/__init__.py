"""The command lines, each a ``main(argv=None) -> exit code`` (``[project.scripts]`` in pyproject.toml).

| command (pip installs it) | module | also runs as |
|---|---|---|
| ``phf-train`` | ``phf_megatron.train`` | ``python -m phf_megatron.train`` |
| ``phf-hf-to-mcore`` | ``tools.hf_to_mcore`` | ``python tools/convert/hf_to_mcore.py`` |
| ``phf-mcore-to-hf`` | ``tools.mcore_to_hf`` | ``python tools/convert/mcore_to_hf.py`` |
| ``phf-eval`` | ``tools.eval_avg_at_k`` | ``python tools/eval_avg_at_k.py`` |
| ``phf-plot-run`` | ``tools.plot_run`` | ``python tools/plot_run.py`` |
| ``phf-paper-table`` | ``tools.paper_table`` | ``python tools/paper_table.py`` |

Each parses its command line with ``phf_megatron.cli``: flags and ``--help`` from a config
dataclass and its field docstrings, a user error as one line with exit code 2. The scripts under
the repository's ``tools/`` are thin wrappers around these functions.
"""
