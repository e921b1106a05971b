"""Forward-step functions for Megatron's ``forward_backward_func``: the teacher pass, the student pass.

One PHF step on Megatron-Core (any TP/SP/PP/VPP/DP layout, micro-batches, recomputation)::

    step = PhfStep(objective, model_config, tp_group=..., dp_group=..., student_capture=WindowCapture(student),
                   teacher_capture=WindowCapture(teacher))
    step.prepare(microbatches)                           # global counts: one all-reduce over DP
    fb(forward_step_func=step.teacher_forward_step, data_iterator=iter(microbatches), model=teacher,
       num_microbatches=n, seq_length=Tt, micro_batch_size=b, forward_only=True)  # no autograd inside
    logs = fb(forward_step_func=step.student_forward_step, data_iterator=iter(microbatches), model=student,
              num_microbatches=n, seq_length=step.student_seq_length(Ts), micro_batch_size=b)
    metrics = step.reduce_logs(logs)                     # last stage: loss, opsd, flow, per-layer flow
    step.finish()

(With an interleaved pipeline pass one iterator over the same micro-batches per model chunk.)
The teacher pass stores its results on the micro-batch objects (``mb.teacher_out``), so the
student pass must see the same objects in the same order. The student pass computes on each
stage the flow terms of that stage's layers (``stage_flow``), sends the running flow share down
the pipeline inside the activation tensor (``pipeline_stats``), and the last stage's loss
function adds the vocabulary-parallel OPSD loss (``loss``).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from ..kernels import check_backend
from ..objectives.config import ObjectiveConfig
from ..objectives.flow import LayerPlan
from .batch import PhfMicroBatch, StepNormalizers, step_normalizers
from .capture import CaptureSession, WindowCapture, chunk_layer_range
from .collectives import group_size
from .logit_rows import scored_logits
from .loss import LossConventions, phf_microbatch_loss, reduce_logs
from .pipeline_stats import pack_stats, pipeline_seq_length, split_received, stats_rows, unpack_stats
from .stage_flow import FlowSpec, attach_stage_flow
from .stage_plan import StagePlan
from .timing import region
from .vocab_parallel_jsd import DEFAULT_CHUNK_ELEMENTS, JSD_BACKENDS, resolve_backend


def final_hidden_states(model, tokens, position_ids, attention_mask, packed_seq_params=None):
    from ..models.lm_head import final_hidden_states as hidden_after_final_norm  # Megatron: on first use

    if packed_seq_params is None:
        return hidden_after_final_norm(model, tokens, position_ids, attention_mask)
    return hidden_after_final_norm(model, tokens, position_ids, attention_mask, packed_seq_params=packed_seq_params)


class PhfStep:
    """The teacher and student forward-step functions of one PHF update, and their bookkeeping.

    Args:
        objective: the loss (variant, alpha, JSD options, selected layers).
        config: the student's Megatron ``TransformerConfig`` (layers, hidden size, SP, pipeline
            dtype, ``calculate_per_token_loss``).
        tp_group, dp_group: tensor- and data-parallel groups (None: size 1).
        student_capture, teacher_capture: ``WindowCapture`` hooks on the student / teacher model
            (the same object when one model serves both); unused when the flow is off.
        chunk_elements: the vocabulary-parallel JSD's temporary size (float32 elements, eager backend).
        flow_backend: ``"auto"`` (the fused CUDA flow kernels when the extension is built or
            JIT-builds, see ``phf_megatron.kernels``), ``"torch"`` or ``"cuda"``.
        jsd_backend: ``"auto"`` (Triton kernels on CUDA), ``"torch"`` or ``"triton"``
            (``vocab_parallel_jsd``).
        score_rows_only: the last stage stops at the final norm and projects only the scored
            positions (``logit_rows``; default); False: Megatron's output layer over every position.

    ``backends_used`` records what the last student pass ran: ``{"flow": ..., "jsd": ...}`` (jsd:
    "torch", "triton", "top_k" for ``objective.top_k_loss``, or "sampled_token" for
    ``objective.use_tinker_loss``). Set ``collect_loss_tokens`` before a step to have its metrics
    carry the loss by rollout token id (``loss.LOSS_TOKENS``).
    """

    def __init__(self, objective: ObjectiveConfig, config, *, tp_group: dist.ProcessGroup | None,
                 dp_group: dist.ProcessGroup | None, student_capture: WindowCapture | None = None,
                 teacher_capture: WindowCapture | None = None, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
                 flow_backend: str = "auto", jsd_backend: str = "auto", score_rows_only: bool = True):
        check_backend(flow_backend)
        if jsd_backend not in JSD_BACKENDS:
            raise ValueError(f"jsd_backend: expected one of {JSD_BACKENDS}, got {jsd_backend!r}")
        if jsd_backend == "triton" and objective.top_k_loss is not None:
            raise ValueError("jsd_backend: 'triton' has no top-k kernel (objective.top_k_loss); use 'auto' or 'torch'")
        if getattr(config, "context_parallel_size", 1) > 1:
            raise ValueError("config: context parallelism is not supported by the PHF capture (context_parallel_size > 1)")
        self.objective = objective
        self.config = config
        self.tp_group, self.dp_group = tp_group, dp_group
        self.sequence_parallel = bool(config.sequence_parallel)
        self.chunk_elements = chunk_elements
        self.jsd_backend = jsd_backend
        self.score_rows_only = score_rows_only
        self.backends_used: dict[str, str] = {}
        self.collect_loss_tokens = False
        self.plan = None
        if objective.uses_flow:
            if student_capture is None or teacher_capture is None:
                raise ValueError("student_capture/teacher_capture: the flow objective needs WindowCapture hooks on both models")
            plan = LayerPlan.build(config.num_layers, objective.flow_variant, objective.flow_layers)
            # Only phf has an adjacent term: other variants must not capture boundary layers.
            self.plan = plan if objective.flow_variant == "phf" else LayerPlan(plan.layers, ())
            self.spec = FlowSpec(objective.flow_variant, objective.flow_eps, len(self.plan.layers), len(self.plan.pairs),
                                 flow_backend)
            self.num_values = 1 + len(self.plan.layers) + len(self.plan.pairs)
            self._stats_dtype = config.pipeline_dtype or config.params_dtype
        # the stats rows the student pass's p2p activations carry (pipeline_stats): sized by prepare()
        self.num_stats_rows: int | None = None if self.plan is not None else 0
        self.student_capture, self.teacher_capture = student_capture, teacher_capture
        self.normalizers: StepNormalizers | None = None
        self.conventions: LossConventions | None = None
        self._stages: dict[int, StagePlan] = {}

    # ------------------------------------------------------------------ step bookkeeping

    def prepare(self, microbatches: list[PhfMicroBatch]) -> StepNormalizers:
        """Global counts of the step (every rank, before the passes): one all-reduce over DP."""
        self.normalizers = step_normalizers(microbatches, self.dp_group)
        if self.plan is not None:  # one size for every micro-batch: the schedule's p2p buffers are fixed
            self.num_stats_rows = max(stats_rows(self.num_values, self.config.hidden_size, self._stats_dtype,
                                                 mb.num_sequences, mb.batch_size) for mb in microbatches)
        self.conventions = LossConventions(bool(self.config.calculate_per_token_loss), len(microbatches),
                                           group_size(self.dp_group))
        return self.normalizers

    def student_seq_length(self, seq_len: int) -> int:
        """``seq_length`` for the student pass's ``forward_backward_func`` (room for the stats rows)."""
        if self.num_stats_rows is None:
            raise RuntimeError("PhfStep.prepare(microbatches) must run before student_seq_length (it sizes the "
                               "flow statistics the pipeline carries)")
        return pipeline_seq_length(seq_len, self.num_stats_rows, group_size(self.tp_group), self.sequence_parallel)

    def reduce_logs(self, logs: list[dict]) -> dict | None:
        """Step metrics on the last pipeline stage (see ``loss.reduce_logs``); None elsewhere."""
        num_layers = len(self.plan.layers) if self.plan is not None else 0
        return reduce_logs(logs, self.objective, num_layers, self.dp_group)

    def finish(self) -> None:
        """Detach the hooks from this step's sessions (call after the student pass)."""
        for capture in (self.student_capture, self.teacher_capture):
            if capture is not None:
                capture.activate(None)

    def _stage(self, chunk) -> StagePlan:
        key = id(chunk)
        if key not in self._stages:
            first, stop = chunk_layer_range(chunk)
            self._stages[key] = StagePlan.build(self.plan, first, stop)
        return self._stages[key]

    def _seq_local(self, seq_len: int) -> int:
        return seq_len // group_size(self.tp_group) if self.sequence_parallel else seq_len

    # ------------------------------------------------------------------ teacher pass

    @torch.no_grad()
    def teacher_forward_step(self, data_iterator, model):
        """Teacher forward without autograd: keeps the window rows and the scored logit rows."""
        from ..models.provider import unwrap  # Megatron: on first use

        mb: PhfMicroBatch = next(data_iterator)
        chunk = unwrap(model)
        tokens, layout = mb.teacher_tokens, mb.teacher_layout
        session = self._begin_capture(chunk, self.teacher_capture, mb.teacher_window, layout)
        if session is not None and not chunk.pre_process:
            chunk.decoder.input_tensor = self.teacher_capture.capture_input(chunk.decoder.input_tensor, session)
        output = self._forward(model, chunk, layout, self.teacher_capture, session)
        if session is not None:
            mb.teacher_out[session.stage.first] = session.finish()
        if chunk.post_process:
            with region("teacher_rows"):
                logits, index = self._scored_logits(model, output, mb.teacher_score_index, tokens.shape[1])
                if not self.score_rows_only:
                    logits = logits.reshape(-1, logits.shape[-1]).index_select(0, index)
                mb.teacher_out["logits"] = logits
        return output, _no_loss

    # ------------------------------------------------------------------ student pass

    def student_forward_step(self, data_iterator, model):
        """Student forward with capture; the flow share of this stage; the loss on the last stage."""
        from ..models.provider import unwrap  # Megatron: on first use

        mb: PhfMicroBatch = next(data_iterator)
        if self.normalizers is None:
            raise RuntimeError("PhfStep.prepare(microbatches) must run before the student pass")
        chunk = unwrap(model)
        tokens, layout = mb.student_tokens, mb.student_layout
        if chunk.post_process and "logits" not in mb.teacher_out:
            raise RuntimeError("teacher logits: missing for this micro-batch; run the teacher pass first")
        if self.plan is None:
            output = self._forward(model, chunk, layout, None, None)
            return output, partial(self._loss, mb, None, None, model)

        session = self._begin_capture(chunk, self.student_capture, mb.student_window, layout)
        b, dev = mb.num_sequences, tokens.device
        share, values = torch.zeros(b, device=dev), torch.zeros(b, self.num_values, device=dev)
        if not chunk.pre_process:
            hidden, stats = split_received(chunk.decoder.input_tensor, self._seq_local(tokens.shape[1]), self.num_stats_rows)
            share, values = unpack_stats(stats, self.num_values, b)
            if session is not None:
                hidden = self.student_capture.capture_input(hidden, session)
            chunk.decoder.input_tensor = hidden
        output = self._forward(model, chunk, layout, self.student_capture, session)
        if session is not None:
            output, share, values = self._add_stage_flow(output, session, mb, share, values)
        if not chunk.post_process:
            stats_out = pack_stats(share, values, output.shape[-1], output.dtype, mb.batch_size, self.num_stats_rows)
            return torch.cat([output, stats_out], dim=0), _no_loss
        return output, partial(self._loss, mb, share, values, model)

    def _begin_capture(self, chunk, capture, window, layout) -> CaptureSession | None:
        """A session for the chunk's captured layers (None if the flow is off or it owns no term)."""
        if self.plan is None:
            return None
        stage = self._stage(chunk)
        if not stage.has_flow:
            return None
        return CaptureSession(stage, window, layout.seq_len, self.tp_group, self.sequence_parallel, check=False,
                              columns=layout.column)

    def _forward(self, model, chunk, layout, capture, session):
        """The chunk's forward (capture active); the last stage stops at the final norm if rows only."""
        if session is not None:
            capture.activate(session)
        kwargs = layout.forward_kwargs()
        try:
            if self.score_rows_only and chunk.post_process:
                return final_hidden_states(model, layout.tokens, **kwargs)
            return model(input_ids=layout.tokens, **kwargs)
        finally:
            if session is not None:
                capture.activate(None)

    def _scored_logits(self, model, output, score_index, seq_len):
        """``(logits rows [N, V/tp], their row of each scored token)`` from the last stage's output."""
        score_index = score_index.to(output.device)
        if self.score_rows_only:
            logits = scored_logits(model, output, score_index, seq_len, self.tp_group, self.sequence_parallel)
            return logits, torch.arange(score_index.numel(), device=output.device)
        return output, score_index

    def _add_stage_flow(self, output, session, mb, share, values):
        """This stage's flow share and per-layer values, added to what earlier stages sent."""
        stage = session.stage
        if stage.first not in mb.teacher_out:
            raise RuntimeError(
                f"teacher capture: no window rows for layers [{stage.first}, {stage.stop}) of this micro-batch; run the "
                "teacher pass (teacher_forward_step) over the same micro-batch objects, with the same pipeline layout"
            )
        teacher_rows = mb.teacher_out[stage.first]
        output, own = attach_stage_flow(output, session, self.student_capture, teacher_rows,
                                        mb.window_valid.to(output.device), self.spec)
        self.backends_used["flow"] = session.values.backend
        # The stage's layers and pairs are contiguous runs of the plan's: slices, no index tensors.
        layer_at = 1 + stage.layer_slots[0]
        values = values.clone()
        values[:, 0] += own.detach()
        values[:, layer_at: layer_at + len(stage.layer_slots)] += session.values.layer_loss.T
        if stage.pair_slots:
            pair_at = 1 + len(self.plan.layers) + stage.pair_slots[0]
            values[:, pair_at: pair_at + len(stage.pair_slots)] += session.values.pair_values.T
        return output, share + own, values

    def _loss(self, mb, share, values, model, output):
        logits, index = self._scored_logits(model, output, mb.student_score_index, mb.student_tokens.shape[1])
        # The one decision of the output loss's path; the loss runs it and the metrics report it.
        path = "sampled_token" if self.objective.use_tinker_loss else resolve_backend(
            self.jsd_backend, logits, mb.teacher_out["logits"], self.objective.top_k_loss)
        self.backends_used["jsd"] = path
        return phf_microbatch_loss(logits, index, mb, share, values, self.objective, self.normalizers, self.conventions,
                                   self.tp_group, self.chunk_elements, path, self.collect_loss_tokens)


def _no_loss(output):
    """Loss function of a forward-only pass: nothing to reduce (the schedule still calls it)."""
    return output.new_zeros(()), {}
