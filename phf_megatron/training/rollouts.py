"""The trainer's side of the rollout engine: sample for the whole step, push weights after it.

One engine runs on global rank 0 (vLLM where installed, else transformers). Every rank knows
the step's prompts (the sampler is deterministic and identical on all ranks); rank 0 samples
completions for all of them and broadcasts the token ids, and each rank keeps its data-parallel
slice. After each optimizer step the student's weights (LoRA merged into the base) are gathered
tensor by tensor from the TP/PP shards of data-parallel replica 0, renamed to HF names by the
conversion mapping and pushed into the running engine; a probe sequence scored by both sides
verifies the push (``rollout.verify_sync``): per-tensor fingerprints of what was pushed and
what the engine holds (``rollout.fingerprint_projections``), then the probe's logprobs.

Failures on rank 0 (engine start, a hung generate, a failed sync) are broadcast, so every rank
raises ``RolloutFailure`` together and the loop can save a checkpoint before exiting. These
broadcasts go over a gloo group of their own (:func:`control_group`) with a timeout long
enough for an engine start and a generate call: the other ranks wait in them while rank 0
works, and NCCL's watchdog would abort a collective that waits past its 10 minutes.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from ..convert.live_model import iter_hf_weights
from ..lora import merged_weight_selector
from ..rollout import EngineConfig, SamplingParams, SyncProbe, build_engine, probe_token_ids, sync_weights
from .config import TrainConfig
from .model_setup import StudentModel
from .probe import megatron_logprobs

#: probe tolerance per engine dtype: fp32 engines match to ~1e-6, bf16 engines to a few 1e-2.
PROBE_ATOL = {"float32": 1e-4, "bfloat16": 0.1, "float16": 0.05}


class RolloutFailure(RuntimeError):
    """The rollout engine failed on rank 0; raised on every rank."""


def control_group(timeout_s: float):
    """A gloo group over every rank for rank 0's status broadcasts (a collective: call on every rank).

    Its timeout covers an engine start plus a generate call (``2 x rollout.timeout_s``, at least
    30 min). None in a world of one (nothing to wait for).
    """
    if dist.get_world_size() == 1:
        return None
    timeout = datetime.timedelta(seconds=max(2 * timeout_s, 1800.0))
    return dist.new_group(backend="gloo", timeout=timeout)


def _broadcast(obj, src: int = 0, group=None):
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


class RolloutDriver:
    """Owns the engine (rank 0) and the collective protocol around it (all ranks)."""

    def __init__(self, cfg: TrainConfig, student: StudentModel, engine_model_dir: str, eos_token_ids: tuple[int, ...]):
        self.cfg = cfg
        self.student = student
        self.engine = None
        self.eos_token_ids = eos_token_ids
        self.last_sync_s: float | None = None
        self.last_probe_diff: float | None = None
        self.last_fingerprint_diff: float | None = None
        self.last_fingerprints_checked = 0
        self.group = control_group(cfg.rollout.timeout_s)
        error = None
        if dist.get_rank() == 0:
            try:
                r = cfg.rollout
                self.engine = build_engine(EngineConfig(
                    model_dir=engine_model_dir, backend=r.backend, server_url=r.server_url,
                    server_weight_transport=r.server_weight_transport, server_nccl_address=r.server_nccl_address,
                    server_nccl_port=r.server_nccl_port,
                    dtype=cfg.model.dtype, seed=cfg.training.seed,
                    timeout_s=r.timeout_s, tensor_parallel_size=r.tensor_parallel_size,
                    gpu_memory_utilization=r.gpu_memory_utilization, enable_sleep_mode=r.enable_sleep_mode,
                    max_model_len=cfg.data.max_prompt_length + max(
                        r.max_tokens, cfg.data.reason_first_max_tokens if cfg.data.reason_first else 0)))
            except Exception as err:  # noqa: BLE001 - reported to every rank
                error = f"rollout engine failed to start ({type(err).__name__}): {err}"
        error = _broadcast(error, group=self.group)
        if error:
            raise RolloutFailure(error)

    # ----------------------------------------------------------------- sampling

    def sampling_params(self, step: int) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                              seed=self.cfg.training.seed * 1_000_003 + step, stop_token_ids=self.eos_token_ids)

    def analysis_params(self, step: int) -> SamplingParams:
        """The teacher's reason-first analysis (``data.reason_first``): one sample per prompt at the
        rollout's temperature / top-p / top-k, at most ``data.reason_first_max_tokens`` tokens
        (official ``opsd_trainer.py`` lines 257-266, 1091-1097), its own seed stream."""
        return SamplingParams(n=1, temperature=self.cfg.rollout.temperature, top_p=self.cfg.rollout.top_p,
                              top_k=self.cfg.rollout.top_k, max_tokens=self.cfg.data.reason_first_max_tokens,
                              seed=(self.cfg.training.seed * 1_000_003 + step) * 2 + 1,
                              stop_token_ids=self.eos_token_ids)

    def generate(self, prompts: list[list[int]], step: int, params: SamplingParams | None = None) -> list[list[int]]:
        """Completion token ids for every prompt of the step (``params.n`` per prompt, flattened;
        default: the rollout's ``sampling_params``). Collective: every rank calls it with the same prompts."""
        result = None
        if self.engine is not None:
            try:
                self._wake()
                outs = self.engine.generate(prompts, params or self.sampling_params(step))
                self._sleep()
                result = [list(c.token_ids) for per_prompt in outs for c in per_prompt]
            except Exception as err:  # noqa: BLE001
                result = RolloutFailure(f"rollout generation failed at step {step} ({type(err).__name__}): {err}")
        result = _broadcast(result, group=self.group)
        if isinstance(result, RolloutFailure):
            raise result
        return result

    # ----------------------------------------------------------------- weight sync

    def _named_tensors(self):
        """HF-named merged weights of the whole model (every rank of data-parallel replica 0 iterates)."""
        from megatron.core import parallel_state as ps

        pp_group = ps.get_pipeline_model_parallel_group()
        select = merged_weight_selector(self.student.chunks)
        for chunk in self.student.chunks:
            yield from iter_hf_weights(chunk, self.student.arch, pp_group=pp_group, select=select,
                                       dtype=torch.float32 if self.cfg.model.dtype == "float32" else None)

    def _probe(self) -> SyncProbe | None:
        if not self.cfg.rollout.verify_sync:
            return None
        prompt, completion = probe_token_ids(self.student.arch.vocab_size)
        logprobs = megatron_logprobs(self.student, prompt, completion)
        if logprobs is None:
            return None
        atol = self.cfg.rollout.probe_atol or PROBE_ATOL[self.cfg.model.dtype]
        return SyncProbe(prompt, completion, logprobs, atol=atol)

    def sync(self) -> None:
        """Push the student's current weights into the engine (collective over all ranks)."""
        from megatron.core import parallel_state as ps

        probe = self._probe()  # every rank takes part in the probe forward; rank 0 gets the values
        error = None
        if ps.get_data_parallel_rank() == 0:
            stream = self._named_tensors()
            if self.engine is not None:
                try:
                    self._wake()
                    r = self.cfg.rollout
                    report = sync_weights(self.engine, stream, probe=probe,
                                          fingerprint_projections=r.fingerprint_projections if r.verify_sync else 0,
                                          fingerprint_seed=self.cfg.training.seed)
                    self._sleep()
                    self.last_sync_s, self.last_probe_diff = report.seconds, report.probe_max_abs_diff
                    self.last_fingerprint_diff = report.fingerprint_max_rel_diff
                    self.last_fingerprints_checked = report.fingerprints_checked
                except Exception as err:  # noqa: BLE001
                    error = f"weight sync failed ({type(err).__name__}): {err}"
                    for _ in stream:  # keep the other ranks' collectives in step
                        pass
            else:
                for _ in stream:
                    pass
        error = _broadcast(error, group=self.group)
        if error:
            raise RolloutFailure(error)

    def _wake(self) -> None:
        if self.cfg.rollout.enable_sleep_mode:
            self.engine.wake()

    def _sleep(self) -> None:
        if self.cfg.rollout.enable_sleep_mode:
            self.engine.sleep()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
