"""What several test packages share, in one place.

* here: ``REPO`` (the repository), ``EXAMPLE_MATH`` and ``GRADER_CASES`` (data files kept in it), and
  ``run_python`` / ``python_env``: a command run as a user runs it, from the repository root with
  this checkout first on the import path;
* ``tiny_qwen3``: tiny random HF Qwen3 models (conversion shapes; real-vocabulary ones for the
  engines, the evaluator and the trainer) and their directories with the real tokenizer;
* ``spawn``: a function on N gloo ranks with Megatron-Core on CPU (``run_ranks``), Megatron's
  model-parallel layout (``megatron_layout``), ``free_port``;
* ``forward``: full-vocabulary logits of a TP/PP-sharded Megatron model through its schedule;
* ``mounts``: a full disk (a small tmpfs) and a read-only directory;
* ``tiny_run``: the trainer's command on the tiny CPU preset, its metrics, a log's warning lines.

Imports nothing heavy itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence

from phf_megatron.runtime.process_group import standalone_environ

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The small OPSD-format training set (problem, solution, answer; ``examples/data/README.md``).
EXAMPLE_MATH = os.path.join(REPO, "examples", "data", "train_math_small.jsonl")
#: Labelled model outputs for the graders (``tests/data/README.md``).
GRADER_CASES = os.path.join(REPO, "tests", "data", "grader_cases.jsonl")


def python_env(**env: str) -> dict[str, str]:
    """This process's environment with the checkout first on ``PYTHONPATH``, one OpenMP thread
    (unless given) and ``env``, without this process's rendezvous variables."""
    path = os.pathsep.join([REPO] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return {**standalone_environ(), "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **env}


def run_python(args: Sequence[str], *, timeout: float = 300, cwd: str | None = REPO,
               **env: str) -> subprocess.CompletedProcess:
    """``python ARGS`` (a script, ``-m module`` or ``-c code``) with ``python_env(**env)``, output captured."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=python_env(**env), capture_output=True, text=True,
                          timeout=timeout)
