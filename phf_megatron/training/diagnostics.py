"""Layer-energy diagnostics of the hidden flow (paper Section 4, "All-layer spread").

The energy of layer l is its flow value e_l >= 0 for the step: the per-layer term the variant
averages over depth (``objectives.flow.layer_loss``: L_layer(l) for phf/local, L_dir, L_geo or
L_mse), averaged over the samples that have a transition. With p_l = e_l / sum_k e_k:

* ``max_share``    = max_l p_l                (paper at step 100: 6.5% / 5.1% / 4.8% for 1.7B/4B/8B)
* ``entropy``      = -sum_l p_l log p_l, nats (paper: 3.17 / 3.38 / 3.40; at most log L)
* ``entropy_norm`` = entropy / log L, in [0, 1] (1: energy spread evenly over the L layers)

When sum_k e_k = 0 (no flow, or no sample with two window positions) p is undefined and the
three values are NaN (the metrics writer stores them as null). With pipeline parallelism each
stage holds only its layers' values: gather the full ``[L]`` vector (and average over
data-parallel ranks) before calling these.
"""

from __future__ import annotations

import math

import torch

from phf_megatron.objectives.flow import FlowTerms, layer_loss

from .metrics import FLOW_ENERGY


def _check_energy(energy: torch.Tensor) -> torch.Tensor:
    if energy.dim() != 1 or energy.numel() == 0:
        raise ValueError(f"energy: expected a non-empty [L] vector, got shape {tuple(energy.shape)}")
    energy = energy.detach().to(torch.float64)
    if bool((energy < 0).any()) or not bool(torch.isfinite(energy).all()):
        raise ValueError(f"energy: must be finite and >= 0, got {energy.tolist()}")
    return energy


def layer_energy(terms: FlowTerms, variant: str) -> torch.Tensor:
    """``[n_layers]`` e_l: the variant's per-layer value, averaged over samples with a transition.

    Clamped at 0: rounding can leave ``1 - cos`` a hair below zero for identical directions.
    """
    values = layer_loss(terms, variant).detach()  # [n_layers, B]
    weights = terms.sample_mask.to(values.dtype)
    return ((values * weights).sum(-1) / weights.sum().clamp(min=1)).clamp(min=0)


def energy_shares(energy: torch.Tensor) -> torch.Tensor:
    """p_l = e_l / sum_k e_k, float64 (NaN everywhere when the sum is 0)."""
    energy = _check_energy(energy)
    total = energy.sum()
    if total == 0:
        return torch.full_like(energy, math.nan)
    return energy / total


def max_share(energy: torch.Tensor) -> float:
    """max_l p_l, the share of the most energetic layer."""
    return float(energy_shares(energy).max())


def energy_entropy(energy: torch.Tensor) -> float:
    """H(p) in nats, with 0 log 0 = 0."""
    p = energy_shares(energy)
    if bool(torch.isnan(p).any()):
        return math.nan
    return float(-(torch.special.xlogy(p, p)).sum())


def normalized_entropy(energy: torch.Tensor) -> float:
    """H(p) / log L in [0, 1]; 1.0 for a single layer with energy (log 1 = 0: nothing to spread)."""
    h = energy_entropy(energy)
    if math.isnan(h):
        return h
    n = energy.numel()
    return 1.0 if n == 1 else h / math.log(n)


def layer_energy_metrics(energy: torch.Tensor, prefix: str = FLOW_ENERGY) -> dict[str, object]:
    """The logged fields: the per-layer vector and its spread statistics."""
    shares = energy_shares(energy)
    undefined = bool(torch.isnan(shares).any())
    return {
        f"{prefix}": _check_energy(energy).tolist(),
        f"{prefix}_max_share": max_share(energy),
        f"{prefix}_argmax": None if undefined else int(shares.argmax()),
        f"{prefix}_entropy": energy_entropy(energy),
        f"{prefix}_entropy_norm": normalized_entropy(energy),
    }
