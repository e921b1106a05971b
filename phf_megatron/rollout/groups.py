"""Engine groups: which trainer ranks share a rollout engine and which rank hosts it (``rollout.num_engines``).

The data-parallel replicas are split into ``num_engines`` equal blocks of consecutive
data-parallel indices; a group is every rank of its block (all TP/PP ranks of its replicas).
With ``pipeline_model_parallel_size = 1`` (Megatron's rank order puts TP innermost, PP
outermost) a group is a contiguous range of global ranks. The group's lowest rank hosts the
engine: it starts it on its own node (on GPU with ``rollout.tensor_parallel_size`` devices from
its own on), samples the prompts of the group's data-parallel ranks and sends the completions to
the group's ranks only. After each optimizer step the host receives the merged weights from the
group's first replica (its TP/PP shards), so no model crosses nodes when that replica's ranks lie
on the host's node (``EngineGroups.local_sync``).

Rules, each broken one a one-line error naming the field:

* ``rollout.num_engines`` divides the data-parallel size (whole replicas per group) and the
  prompts of a step (whole prompts per group, so no prompt's ``rollout.n`` samples straddle two);
* a group lies within one node or holds whole nodes (no node is split between a group that
  spans several nodes and another);
* ``rollout.tensor_parallel_size``: the engine's devices, local ranks ``host .. host + tp - 1`` of
  the host's node, belong to the host's group (two engines never share a device).

``auto`` is one engine per node; a node is a torchrun agent (``GROUP_RANK``), so two agents on
one machine count as two nodes (the CI's 2-node launch on loopback).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..commands import launcher_int
from ..config_errors import fail

#: ``rollout.num_engines`` value for one engine per node.
AUTO = "auto"


@dataclass(frozen=True)
class RankPlace:
    """Where one trainer rank sits."""

    rank: int
    """global rank."""
    dp_rank: int
    """its data-parallel index (model replica)."""
    node: int
    """its node (torchrun's ``GROUP_RANK``)."""
    local_rank: int
    """its index on the node (torchrun's ``LOCAL_RANK``; its GPU on GPU machines)."""


def this_node(environ=os.environ) -> int:
    """This process's node index: torchrun's ``GROUP_RANK`` (0 outside torchrun)."""
    return launcher_int("GROUP_RANK", environ)


def span(ranks) -> str:
    """``[0, 1, 2, 3]`` -> ``"0-3"``; other sets comma-separated."""
    ranks = sorted(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


@dataclass(frozen=True)
class EngineGroups:
    """The engine groups of a run (``plan_engine_groups``)."""

    ranks: tuple[tuple[int, ...], ...]
    """global ranks of each group, ascending; the first one hosts the engine."""
    dp_size: int
    """data-parallel size of the run."""
    nodes: tuple[int, ...]
    """node of each group's host."""
    local_sync: tuple[bool, ...]
    """whether each group's first replica (the source of its weight sync) lies on its host's node."""

    @property
    def num_engines(self) -> int:
        return len(self.ranks)

    def host(self, engine: int) -> int:
        """The global rank that hosts ``engine``."""
        return self.ranks[engine][0]

    def group_of(self, rank: int) -> int:
        """The engine group of a global rank."""
        return next(g for g, ranks in enumerate(self.ranks) if rank in ranks)

    def dp_ranks(self, engine: int) -> range:
        """The data-parallel indices of ``engine``'s group; the first one is its weight source."""
        per = self.dp_size // self.num_engines
        return range(engine * per, (engine + 1) * per)

    def prompts(self, engine: int, num_prompts: int) -> range:
        """Indices of the step's prompts ``engine`` samples (a contiguous block, as the
        data-parallel ranks take contiguous blocks of the samples: ``training.batches``)."""
        per = num_prompts // self.num_engines
        return range(engine * per, (engine + 1) * per)

    def describe(self) -> str:
        """One line for the start-up message."""
        hosts = ", ".join(str(self.host(g)) for g in range(self.num_engines))
        where = "node-local" if all(self.local_sync) else "crossing nodes for some engines"
        return f"{self.num_engines} engines (host ranks {hosts}; weight sync {where})"


def plan_engine_groups(num_engines: int | str, places: list[RankPlace], *, prompts_per_step: int,
                       engine_tp: int = 1) -> EngineGroups:
    """Split the ranks of ``places`` (one per global rank) into engine groups; raise naming the field
    if the layout breaks a rule of the module docstring."""
    places = sorted(places, key=lambda p: p.rank)
    dp_size = len({p.dp_rank for p in places})
    nodes = sorted({p.node for p in places})
    if num_engines == AUTO:
        count, why = len(nodes), f"auto: one per node, {len(nodes)} nodes"
    else:
        count, why = int(num_engines), str(num_engines)
    if count < 1 or dp_size % count:
        raise fail("rollout.num_engines", f"{why} engine(s) do not split the {dp_size} data-parallel ranks (model "
                   "replicas) into equal groups; use a divisor of the data-parallel size")
    if prompts_per_step % count:
        raise fail("rollout.num_engines", f"{why} engine(s) do not split the {prompts_per_step} prompts of a step "
                   "(training.global_batch_size / rollout.n) into equal shares")
    per = dp_size // count
    groups = [tuple(p.rank for p in places if p.dp_rank // per == g) for g in range(count)]
    by_rank = {p.rank: p for p in places}
    for g, ranks in enumerate(groups):
        _check_nodes(g, ranks, places, by_rank)
        _check_engine_devices(g, ranks, places, by_rank, engine_tp)
    hosts = [by_rank[r[0]] for r in groups]
    local = tuple(all(p.node == hosts[g].node for p in places if p.dp_rank == g * per) for g in range(count))
    return EngineGroups(ranks=tuple(groups), dp_size=dp_size, nodes=tuple(h.node for h in hosts), local_sync=local)


def _check_nodes(g: int, ranks: tuple[int, ...], places: list[RankPlace], by_rank: dict) -> None:
    """A group spanning several nodes must hold each of them whole."""
    nodes = {by_rank[r].node for r in ranks}
    if len(nodes) == 1:
        return
    for node in sorted(nodes):
        outside = [p.rank for p in places if p.node == node and p.rank not in ranks]
        if outside:
            raise fail("rollout.num_engines", f"engine group {g} (ranks {span(ranks)}) spans several nodes but holds "
                       f"only part of node {node} (ranks {span(outside)} belong to other groups); choose a number of "
                       "engines whose groups lie within one node or hold whole nodes (auto: one per node)")


def _check_engine_devices(g: int, ranks: tuple[int, ...], places: list[RankPlace], by_rank: dict, tp: int) -> None:
    """The engine's devices (local ranks host .. host + tp - 1 of the host's node) belong to its group."""
    host = by_rank[ranks[0]]
    on_node = {p.local_rank: p.rank for p in places if p.node == host.node}
    wanted = range(host.local_rank, host.local_rank + tp)
    foreign = [lr for lr in wanted if on_node.get(lr) not in ranks]
    if foreign:
        raise fail("rollout.tensor_parallel_size", f"engine {g} (host rank {host.rank}) would take {tp} devices from "
                   f"local rank {host.local_rank} of node {host.node} on, but local rank(s) {span(foreign)} are "
                   "missing or belong to another engine group; use a smaller tensor_parallel_size or fewer engines")
