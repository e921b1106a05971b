"""Which flow terms a pipeline stage owns, and which layers it must capture for them.

A stage (a pipeline rank, or one model chunk of an interleaved pipeline) holds the contiguous
global layers ``[first, stop)``. Of the global ``LayerPlan`` it owns

* the local terms (L_dir, L_geo, L_mse) of the plan layers it holds, and
* every adjacent pair ``(l, l+1)`` whose *upper* layer it holds.

The pair ``(first-1, first)`` crosses the stage boundary. Its lower layer is the previous
stage's last layer, whose output is exactly the activation this stage receives from the
pipeline. So the stage captures the window rows of its *input* as the "boundary" layer
``first-1``: no extra communication, and the pair's gradient with respect to the previous
stage's rows flows back through Megatron's own p2p as part of the activation gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..objectives.flow import LayerPlan


@dataclass(frozen=True)
class StagePlan:
    """The share of a global ``LayerPlan`` that one pipeline stage computes.

    ``captured`` lists the global layers whose window rows the stage keeps, in order: the
    boundary layer (if a pair crosses into the stage) then the stage's own plan layers.
    ``layer_slots``/``pair_slots`` are the positions of the owned layers/pairs in the global
    plan (where their values go in the per-layer logs): contiguous runs, since a stage holds
    contiguous layers and the plan is sorted.
    """

    first: int
    stop: int
    own_layers: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]
    boundary: int | None
    layer_slots: tuple[int, ...]
    pair_slots: tuple[int, ...]

    @staticmethod
    def build(plan: LayerPlan, first: int, stop: int) -> "StagePlan":
        if not 0 <= first < stop:
            raise ValueError(f"first/stop: a stage holds layers [first, stop) with 0 <= first < stop, got [{first}, {stop})")
        own = tuple(l for l in plan.layers if first <= l < stop)
        pairs = tuple(p for p in plan.pairs if first <= p[1] < stop)
        crossing = [a for a, _ in pairs if a < first]
        return StagePlan(
            first=first,
            stop=stop,
            own_layers=own,
            pairs=pairs,
            boundary=crossing[0] if crossing else None,
            layer_slots=tuple(plan.layers.index(l) for l in own),
            pair_slots=tuple(plan.pairs.index(p) for p in pairs),
        )

    @property
    def captured(self) -> tuple[int, ...]:
        return ((self.boundary,) if self.boundary is not None else ()) + self.own_layers

    @property
    def has_flow(self) -> bool:
        return bool(self.own_layers)

    def pair_runs(self) -> list[tuple[int, int]]:
        """The owned pairs as runs ``[a, b)`` of lower indices into the captured stack.

        Pair ``(captured[k], captured[k+1])`` for every k in a run (a pair's layers are
        neighbours in the stack); all-layer plans give one run, selections with gaps several.
        """
        return self.stack_plan.pair_runs()

    @cached_property
    def stack_plan(self) -> LayerPlan:
        """The stage's terms as a plan over the captured stack's indices (what the terms function runs on).

        Layers: every captured index (the boundary's local terms are computed and dropped);
        pairs: the owned pairs as neighbouring stack indices, in ``pairs`` order.
        """
        index = {layer: k for k, layer in enumerate(self.captured)}
        return LayerPlan(tuple(range(len(self.captured))), tuple((index[a], index[b]) for a, b in self.pairs))
