"""What goes into a checkpoint: named parts, each with a scope that says who writes and reads it.

The trainer hands ``checkpoint.save_checkpoint`` a ``dict[str, Part]``; a part is a pair of
callables (``state()`` to save, ``load(state)`` to restore) and a ``Scope``:

* ``DIST``: a Megatron sharded state dict, written collectively with
  ``megatron.core.dist_checkpointing`` (reshardable: a resumed run may change TP/PP/DP).
  Model weights of full fine-tuning, Megatron optimizer ``sharded_state_dict``.
* ``RANK``: one file per (tp, pp, dp) rank. RNG states, a distributed optimizer's shards.
* ``MODEL_PARALLEL``: one file per (tp, pp) rank, written by data-parallel rank 0 and read by
  every data-parallel replica. LoRA adapters, the EMA teacher's adapters, a non-distributed
  optimizer's state (all replicated over DP).
* ``GLOBAL``: one file, written by global rank 0, read by all. Data position, LR scheduler.

Non-DIST scopes are tied to the layout they were saved with; ``checkpoint.load_checkpoint``
refuses a changed layout with an error that says which part and which sizes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from .rng_state import capture_rng_state, restore_rng_state


class Scope(str, enum.Enum):
    DIST = "dist"
    RANK = "rank"
    MODEL_PARALLEL = "model_parallel"
    GLOBAL = "global"


class PartMismatch(ValueError):
    """A saved part that does not fit the run's state (other names, shapes or counts: another model, LoRA
    rank or target set); ``checkpoint.load_checkpoint`` names the file (one line). Raised before any copy."""


@dataclass
class Part:
    """One named piece of a checkpoint."""

    scope: Scope
    state: Callable[[], Any]
    """Returns what to save (for DIST: a sharded state dict). Plain values: tensors, numbers,
    strings, bools, None, and lists / tuples / dicts of them (loaded with weights_only=True)."""
    load: Callable[[Any], None]
    """Restores from what ``state()`` returned."""
    template: Callable[[], Any] | None = None
    """DIST only: the sharded state dict to load into (default: ``state()``)."""


@dataclass(frozen=True)
class RankLayout:
    """This rank's coordinates in the (tp, pp, dp) grid, and the grid's sizes."""

    rank: int = 0
    world_size: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size * self.pp_size * self.dp_size != self.world_size:
            raise ValueError(f"layout: tp_size x pp_size x dp_size = {self.tp_size} x {self.pp_size} x "
                             f"{self.dp_size} does not equal world_size {self.world_size}")

    @staticmethod
    def from_parallel_state() -> "RankLayout":
        """From Megatron's initialized ``parallel_state`` (context parallelism is not supported)."""
        from megatron.core import parallel_state as ps

        if ps.get_context_parallel_world_size() != 1:
            raise ValueError("layout: context parallelism is not supported by the checkpoint layout")
        return RankLayout(
            rank=dist.get_rank(), world_size=dist.get_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(), pp_rank=ps.get_pipeline_model_parallel_rank(),
            dp_rank=ps.get_data_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
            pp_size=ps.get_pipeline_model_parallel_world_size(), dp_size=ps.get_data_parallel_world_size(),
        )

    def sizes(self) -> dict[str, int]:
        return {"tp_size": self.tp_size, "pp_size": self.pp_size, "dp_size": self.dp_size, "world_size": self.world_size}

    def file_name(self, scope: Scope) -> str | None:
        """The file this rank reads for ``scope`` (None for DIST)."""
        if scope is Scope.RANK:
            return f"rank_tp{self.tp_rank:02d}_pp{self.pp_rank:03d}_dp{self.dp_rank:03d}.pt"
        if scope is Scope.MODEL_PARALLEL:
            return f"model_parallel_tp{self.tp_rank:02d}_pp{self.pp_rank:03d}.pt"
        if scope is Scope.GLOBAL:
            return "global.pt"
        return None

    def writes(self, scope: Scope) -> bool:
        """Whether this rank writes ``scope``'s file (DIST: every rank takes part)."""
        if scope is Scope.MODEL_PARALLEL:
            return self.dp_rank == 0
        if scope is Scope.GLOBAL:
            return self.rank == 0
        return True


#: Which saved sizes a resumed run must match, per scope.
SCOPE_LAYOUT_KEYS = {
    Scope.DIST: (),
    Scope.GLOBAL: (),
    Scope.MODEL_PARALLEL: ("tp_size", "pp_size"),
    Scope.RANK: ("tp_size", "pp_size", "dp_size"),
}


# ----------------------------------------------------------------------------- builders


def stateful_part(obj: Any, scope: Scope) -> Part:
    """A part for anything with ``state_dict()`` / ``load_state_dict()`` (sampler, scheduler,
    a Megatron optimizer's non-sharded state)."""
    return Part(scope, obj.state_dict, obj.load_state_dict)


def _without_static_scaler(state, optimizer):
    """A Megatron optimizer's state without a static loss scale's (empty) grad-scaler state unless ``optimizer``
    has a static scaler too (``optimizer.loss_scale`` may change on resume): a dynamic scaler cannot load it
    (``KeyError: 'scale'``; the dynamic scale then starts at ``optimizer.initial_loss_scale``), and where there is
    none (bfloat16 without a loss scale) Megatron logs "fould the grad scaler in the checkpoint but it is None".
    A static scaler loads it (it holds nothing): kept, as without it Megatron logs "found an old checkpoint, will
    not load grad scaler"."""
    from megatron.core.optimizer.grad_scaler import ConstantGradScaler

    from .nonfinite import grad_scaler

    if isinstance(grad_scaler(optimizer), ConstantGradScaler):
        return state
    for s in state if isinstance(state, list) else [state]:
        if isinstance(s, dict) and s.get("grad_scaler") == {}:
            del s["grad_scaler"]
    return state


def optimizer_part(optimizer) -> Part:
    """A Megatron optimizer's state in the per-rank formats (no dist-checkpointing).

    A plain optimizer is replicated over data-parallel ranks: its ``state_dict`` once per
    model-parallel rank. A distributed optimizer's ``state_dict`` leaves out the main parameters
    and Adam moments, which each data-parallel rank holds a shard of: every rank saves its own
    shards beside the common state (Megatron's "dp_reshardable" form, read back into the same layout).
    """
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    if not any(hasattr(o, "get_parameter_state_dp_reshardable") for o in inner):
        return Part(Scope.MODEL_PARALLEL, optimizer.state_dict,
                    lambda saved: optimizer.load_state_dict(_without_static_scaler(saved, optimizer)))

    def entries(shards: dict) -> Iterator[dict]:
        """One entry per parameter: buffer index -> dtype -> buckets -> entries (and sizes under str keys)."""
        buffers = (v for k, v in shards.items() if isinstance(k, int))
        return (e for buffer in buffers for buckets in buffer.values() for b in buckets for e in b)

    def state() -> dict[str, Any]:
        shards = [o.get_parameter_state_dp_reshardable() for o in inner]
        for entry in (e for s in shards for e in entries(s)):  # an fp32 main parameter is a view of the
            entry["param"] = entry["param"].clone()            # model's buffer: saved alone, not the buffer
        return {"common": optimizer.state_dict(), "shards": shards}

    def load(saved: dict[str, Any]) -> None:
        optimizer.load_state_dict(_without_static_scaler(saved["common"], optimizer))  # allocates the moments, uninitialised
        for o, shards in zip(inner, saved["shards"], strict=True):
            for entry in entries(shards):
                entry["padding"] = False  # the loader expects the sharded form's flag
            with torch.no_grad():  # the main parameters may be views of the model's leaves
                o.load_parameter_state_from_dp_reshardable(shards)
            for param_state in o.optimizer.state.values():  # Megatron (torch Adam) gives every parameter one
                if "step" in param_state:                    # shared step tensor, which Adam's in-place
                    param_state["step"] = param_state["step"].clone()  # increment then counts once per parameter

    return Part(Scope.RANK, state, load)


def tensors_part(tensors: dict[str, torch.Tensor], scope: Scope = Scope.MODEL_PARALLEL) -> Part:
    """A part for named tensors restored in place (LoRA adapters, the EMA teacher's copy).

    Loading checks names and shapes and copies bit for bit into the live tensors.
    """

    def state() -> dict[str, torch.Tensor]:
        return {name: t.detach().to("cpu", copy=True) for name, t in tensors.items()}

    def load(saved: dict[str, torch.Tensor]) -> None:
        missing, unexpected = sorted(set(tensors) - set(saved)), sorted(set(saved) - set(tensors))
        if missing or unexpected:
            raise PartMismatch(f"checkpoint tensors: missing {missing[:8]}, unexpected {unexpected[:8]} "
                               "(a different LoRA target set, layer split or model?)")
        for name, t in tensors.items():
            if saved[name].shape != t.shape:
                raise PartMismatch(f"checkpoint tensor {name}: shape {tuple(saved[name].shape)} in the checkpoint, "
                                   f"{tuple(t.shape)} in the model")
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(saved[name])

    return Part(scope, state, load)


def rng_part() -> Part:
    """This rank's Python / NumPy / torch / CUDA / Megatron-tracker generator states."""
    def load(state: dict[str, Any]) -> None:
        try:
            restore_rng_state(state)
        except ValueError as err:   # saved for other CUDA devices, or entries missing: load_checkpoint names the file
            raise PartMismatch(str(err)) from err

    return Part(Scope.RANK, capture_rng_state, load)


def dist_model_part(model: torch.nn.Module) -> Part:
    """The model's Megatron sharded state dict (all weights: full fine-tuning)."""
    return Part(Scope.DIST, model.sharded_state_dict, model.load_state_dict)


def dist_optimizer_part(optimizer, model: torch.nn.Module) -> Part:
    """A Megatron optimizer's sharded state (reshardable across layouts)."""
    return Part(
        Scope.DIST,
        state=lambda: optimizer.sharded_state_dict(model.sharded_state_dict()),
        load=optimizer.load_state_dict,
        template=lambda: optimizer.sharded_state_dict(model.sharded_state_dict(), is_loading=True),
    )
