"""Capture the window rows of every transformer layer's output during the ordinary forward.

How it works (one forward, no second pass, works with activation recomputation):

* ``WindowCapture`` puts a forward hook on each ``TransformerLayer`` of the model. While a
  ``CaptureSession`` is active, the hook copies this rank's window rows of the layer output
  into the session's stack (one ``index_select`` per layer, ``[B, m, H]``, detached). With
  autograd on (the student) it also passes the output through ``_CaptureRows``, an identity
  whose backward adds the flow loss's gradient for those rows into the layer-output gradient
  (one ``index_add``); without autograd (the teacher) the output is left untouched.
* The flow loss is evaluated on the session's rows once the stage's forward is done
  (``stage_flow.attach_stage_flow``). Its gradient with respect to the rows is computed in the
  backward of a node placed after the last layer, hence before any layer's backward runs.
* Under full recomputation Megatron's ``CheckpointFunction`` runs the layers without autograd,
  then re-runs them inside the backward. The re-run goes through the same hook, so the re-built
  graph contains ``_CaptureRows`` again and its backward injects the gradient; the rows were
  already stored, so the re-run stores nothing. The flow node's backward re-activates the
  micro-batch's session first, because with pipelining another micro-batch's forward may have
  activated its own session in between.

Memory: a finished session holds ``len(stage.captured) * B * m * H`` elements (the window rows
of its layers), never a full hidden state. The teacher's forward runs without autograd and keeps
exactly that; the student's keeps the same plus, until its backward, the flow gradient.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch
import torch.distributed as dist

from .collectives import all_reduce_
from .stage_plan import StagePlan
from .timing import region
from .window_rows import WindowIndex, check_positions, local_seq_range


class CaptureSession:
    """The window rows of one micro-batch on one pipeline stage (model chunk).

    Args:
        stage: the stage's share of the layer plan (which layers to capture).
        positions: ``[B, m]`` long, global sequence positions of the window per sample.
        seq_len: the full sequence length of this micro-batch (for the range check).
        tp_group, sequence_parallel: how activations are split over tensor parallelism.
        check: check the positions' range (one host sync for device tensors; ``PhfMicroBatch``
            has checked them already).
        columns: ``[B]`` long, each sample's activation row (``SequenceLayout.column``); default
            ``arange(B)``: sample b in row b (right-padded). Packed: every sample in row 0, its
            positions into that row.

    The first stored layer fixes the row index (``WindowIndex``) and allocates the stack
    ``rows [len(stage.captured), B, m, H]`` (``B`` samples, whatever the activation's batch); each layer then costs one ``index_select`` into
    its slot (no per-layer allocation, no stack at the end).
    """

    def __init__(self, stage: StagePlan, positions: torch.Tensor, seq_len: int,
                 tp_group: dist.ProcessGroup | None, sequence_parallel: bool, check: bool = True,
                 columns: torch.Tensor | None = None):
        if check:
            check_positions("positions", positions, seq_len)
        self.stage = stage
        self.layers = frozenset(stage.own_layers)  # the hooks' layers (the boundary enters by capture_input)
        self.positions = positions
        self.columns = columns
        self.tp_group = tp_group
        self.sequence_parallel = sequence_parallel
        self.where: WindowIndex | None = None
        self.rows: torch.Tensor | None = None
        self._slot = {layer: k for k, layer in enumerate(stage.captured)}
        self._stored: set[int] = set()
        self.grads: dict[int, torch.Tensor] = {}
        self.sealed = False

    def _allocate(self, hidden: torch.Tensor) -> None:
        s_local, b_act, h = hidden.shape
        b, m = self.positions.shape
        if self.columns is None:
            if b_act != b:
                raise ValueError(f"positions: {b} samples, but the activation has batch {b_act}")
            columns = torch.arange(b, device=self.positions.device)
        else:
            columns = self.columns.to(self.positions.device)
        start, _ = local_seq_range(s_local, self.tp_group, self.sequence_parallel)
        self.where = WindowIndex.of_entries(self.positions.reshape(-1), columns[:, None].expand(b, m).reshape(-1), b_act,
                                           start, s_local, sharded=self.sequence_parallel)
        self.rows = hidden.new_empty(len(self.stage.captured), b, m, h)

    def store(self, layer: int, hidden: torch.Tensor) -> None:
        """Keep this rank's share of layer ``layer``'s window rows (``hidden``: ``[s_local, B, H]``)."""
        with region("capture"), torch.no_grad():
            if self.rows is None:
                self._allocate(hidden)
            self.where.take(hidden.detach(), out=self.rows[self._slot[layer]].view(-1, hidden.shape[-1]))
        self._stored.add(layer)

    def capture(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """Store the rows of ``hidden`` and return what replaces it in the forward.

        Without autograd (the teacher, or the first forward under recomputation) that is
        ``hidden`` itself; with autograd an identity node that adds the flow gradient of the
        rows in the backward (and stores nothing once the session is sealed: recomputation).
        """
        if not torch.is_grad_enabled():
            if not self.sealed:
                self.store(layer, hidden)
            return hidden
        return _CaptureRows.apply(hidden, self, layer)

    def finish(self) -> torch.Tensor:
        """Complete the stack over TP (``stage.captured`` order); afterwards the session stores nothing.

        Returns ``rows [len(captured), B, m, H]``.
        """
        if not self.sealed:
            missing = [l for l in self.stage.captured if l not in self._stored]
            if missing:
                raise RuntimeError(
                    f"capture: no rows for layers {missing}; is WindowCapture installed on this model chunk "
                    f"(global layers [{self.stage.first}, {self.stage.stop}))?"
                )
            if self.sequence_parallel:
                n, b, m, h = self.rows.shape
                self.rows = all_reduce_(self.where.mask(self.rows.view(n, b * m, h)).view(n, b, m, h), self.tp_group)
            self.sealed = True
        return self.rows

    def set_grads(self, grad_rows: torch.Tensor) -> None:
        """The flow gradient ``[len(captured), B, m, H]`` of the rows, for the layers' backward."""
        n, b, m, h = grad_rows.shape
        grads = self.where.mask(grad_rows.reshape(n, b * m, h)).to(self.rows.dtype)
        self.grads = dict(zip(self.stage.captured, grads.unbind(0)))

    def pop_grad(self, layer: int) -> torch.Tensor | None:
        return self.grads.pop(layer, None)


class _CaptureRows(torch.autograd.Function):
    """Identity on a layer output that stores its window rows and adds their flow gradient."""

    @staticmethod
    def forward(ctx, hidden, session, layer):
        if not session.sealed:  # a recomputation re-runs the layer: the rows are already stored
            session.store(layer, hidden)
        ctx.session, ctx.layer = session, layer
        return hidden

    @staticmethod
    def backward(ctx, grad_hidden):
        grad_rows = ctx.session.pop_grad(ctx.layer)
        if grad_rows is None:
            return grad_hidden, None, None
        with region("capture_bwd"):
            return ctx.session.where.add_grad(grad_hidden, grad_rows), None, None


def transformer_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The ``TransformerLayer`` modules of a (possibly wrapped) Megatron model chunk."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    return [m for m in model.modules() if isinstance(m, TransformerLayer)]


def chunk_layer_range(model: torch.nn.Module) -> tuple[int, int]:
    """Global ``[first, stop)`` layers of a model chunk (Megatron's ``layer_number`` is 1-based, global)."""
    numbers = sorted(m.layer_number - 1 for m in transformer_layers(model))
    if not numbers:
        raise ValueError("model: no TransformerLayer found in this model chunk")
    if numbers != list(range(numbers[0], numbers[-1] + 1)):
        raise ValueError(f"model: the chunk's layers are not contiguous: {numbers}")
    return numbers[0], numbers[-1] + 1


class WindowCapture:
    """Forward hooks that feed the active ``CaptureSession`` from every TransformerLayer.

    Install once per model (all chunks of an interleaved pipeline); activate a session per
    micro-batch forward with ``activate``. Without an active session the hooks do nothing, so the
    same model serves plain OPSD steps and evaluation unchanged.
    """

    def __init__(self, model: torch.nn.Module | Iterable[torch.nn.Module]):
        chunks = [model] if isinstance(model, torch.nn.Module) else list(model)
        self.active: CaptureSession | None = None
        self._handles = [layer.register_forward_hook(self._hook) for c in chunks for layer in transformer_layers(c)]

    def _hook(self, module, args, output):
        session = self.active
        if session is None:
            return None
        layer = module.layer_number - 1
        if layer not in session.layers:
            return None
        hidden = output[0] if isinstance(output, tuple) else output
        captured = session.capture(layer, hidden)
        if captured is hidden:
            return None  # no autograd: nothing replaces the output
        return (captured, *output[1:]) if isinstance(output, tuple) else captured

    def activate(self, session: CaptureSession | None) -> None:
        """Make ``session`` receive the rows of the following layer forwards (None: stop)."""
        self.active = session

    @contextlib.contextmanager
    def activated(self, session: CaptureSession):
        self.activate(session)
        try:
            yield session
        finally:
            self.activate(None)

    def capture_input(self, hidden: torch.Tensor, session: CaptureSession) -> torch.Tensor:
        """Capture the stage input as the boundary layer (the previous stage's last layer output)."""
        if session.stage.boundary is None:
            return hidden
        return session.capture(session.stage.boundary, hidden)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.active = None
