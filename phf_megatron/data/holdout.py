"""The rows the official SFT and GRPO baselines train on: ``datasets``' ``train_test_split`` without its test part.

OPSD 7448751's ``sft_train.py`` (line 136) and ``grpo_train.py`` (line 280) split the set with
``train_dataset.train_test_split(test_size=0.01 / 0.007, seed=42)`` and train on the ``train`` part; the
``test`` part goes to the trainer as ``eval_dataset``, which neither script ever evaluates (their runs leave
``eval_strategy`` at "no"), so those rows are simply never trained on. ``datasets`` (3.6.0 in the official
environment, the same code today) holds out ``ceil(fraction * n)`` rows: the first ones of
``numpy.random.default_rng(seed).permutation(n)``, the rest, in that order, being the ``train`` part.
``opsd_train.py`` splits nothing (``data.holdout_fraction`` 0 for phf).
"""

from __future__ import annotations

import math


def holdout_train_indices(num_rows: int, fraction: float, seed: int) -> list[int]:
    """The indices of the ``train`` part of ``train_test_split(test_size=fraction, seed=seed)`` over ``num_rows``
    rows, in its order; ``fraction`` 0: every row in file order. ValueError when no row would be left."""
    if fraction == 0:
        return list(range(num_rows))
    import numpy as np

    test = math.ceil(fraction * num_rows)
    if num_rows - test <= 0:
        raise ValueError(f"holds out {test} of {num_rows} row(s): none would be left to train on")
    return np.random.default_rng(seed).permutation(num_rows)[test:].tolist()


def without_holdout(dataset, fraction: float, seed: int):
    """``dataset`` (a ``MathDataset``) with only its ``train`` part's rows, in that part's order."""
    dataset.rows = [dataset.rows[i] for i in holdout_train_indices(len(dataset.rows), fraction, seed)]
    return dataset
