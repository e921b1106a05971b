"""The trainer's side of the rollout engines: each samples its group's prompts; weights pushed after each step.

Engines (``rollout.num_engines``, ``rollout/groups.py``): the data-parallel replicas are split
into groups; the first rank of each group hosts an engine (vLLM where installed, else
transformers). Every rank builds the step's requests (``StepRequests``: the sampler is
deterministic and identical on all ranks); each host samples the prompts of its group's
data-parallel ranks (``sample``: engine calls only, so it may run in a background thread:
``rollout_async.py``), then ``share`` — a collective on the main thread — tells every rank
whether every engine succeeded and sends each group's completions from its host to the group's
ranks only. Every completion has its own seed (``rollout/seeds.py``), so the rollouts do not
depend on the number of engines.

After each optimizer step (``sync``) the student's weights (LoRA merged into the base) are
gathered tensor by tensor from the TP/PP shards of each group's first replica, renamed to HF
names and pushed into that group's engine: the host is a rank of that replica, so the weights
stay on the host's node whenever the replica's ranks do. Every engine is verified
(``rollout.verify_sync``): per-tensor fingerprints (``rollout.fingerprint_projections``), then a
probe sequence scored by the engine against the trainer's logprobs.

A failure on a host (engine start, a hung or dead engine, a failed sync) reaches every rank in
the next collective, so all ranks raise ``RolloutFailure`` together, naming the engine and its
host rank (an engine that does not start: one line, ``engine_start``), and the loop saves a checkpoint (at a weight push: ``Trainer.at_push``) before exiting. These collectives run over gloo
groups of their own (:func:`control_group`) with a timeout long enough for an engine start and
a generate call: the other ranks wait in them while the hosts work, and NCCL's watchdog would
abort a collective that waits past its 10 minutes.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..convert.live_model import iter_hf_weights
from ..lora import merged_weight_selector
from ..rollout import EngineConfig, SamplingParams, SyncProbe, build_engine, probe_token_ids, sync_weights
from ..rollout.sync import probe_tolerance
from ..rollout.gpu_memory import release_cached_memory
from ..rollout.groups import EngineGroups, RankPlace, plan_engine_groups, this_node
from ..rollout.config import RolloutConfig
from ..runtime.process_group import local_rank
from ..rollout.seeds import sample_seed
from ..rollout.vllm_start_log import drop_unsaid_logs, kept_logs
from .config import TrainConfig
from .engine_start import classify, start_failed
from .model_setup import StudentModel
from .probe import megatron_logprobs

#: the ``rollout`` section's fields (a start error "tensor_parallel_size: ..." names ``--rollout.tensor_parallel_size``)
_ROLLOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(RolloutConfig))


class RolloutFailure(RuntimeError):
    """A rollout engine failed; raised on every rank, naming the engine and its host rank."""


def control_group(timeout_s: float, ranks: list[int] | None = None):
    """A gloo group (every rank, or ``ranks``) for the hosts' status and completions (a collective:
    call on every rank). Its timeout covers an engine start plus a generate call (``2 x
    rollout.timeout_s``, at least 30 min). None in a world of one (nothing to wait for)."""
    if dist.get_world_size() == 1:
        return None
    timeout = datetime.timedelta(seconds=max(2 * timeout_s, 1800.0))
    return dist.new_group(ranks=ranks, backend="gloo", timeout=timeout)


@dataclass
class StepRequests:
    """What the engines sample for one step (identical on every rank)."""

    step: int
    """0-based optimizer step the samples are for (part of every seed)."""
    prompts: list[list[int]]
    """the student's prompt ids of each of the step's prompts, in global order."""
    on_policy: list[bool]
    """per sample (``rollout.n`` per prompt): sample a rollout (False: the row's solution, ``rollout.lmbda``)."""
    analysis_prompts: list[list[int]] | None = None
    """``data.reason_first``: the teacher's analysis prompt of each prompt."""


@dataclass
class StepSamples:
    """One group's share of a step, as its engine sampled it."""

    step: int
    policy_version: int
    """optimizer steps in the weights that sampled it (the trainer's step count at the last sync)."""
    completions: dict[int, list[int]] = field(default_factory=dict)
    """sample index (prompt x rollout.n + j) -> completion ids, for the group's on-policy samples."""
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    """sample index -> the engine's processed log-prob of each completion token (``EngineConfig.logprobs_mode``
    ``"processed"``: after temperature, top-k and top-p, as TRL's vLLM correction reads them); only
    when the driver was built with ``sampler_logprobs``."""
    analyses: dict[int, list[int]] = field(default_factory=dict)
    """prompt index -> the teacher's analysis ids (``data.reason_first``)."""
    seconds: float = 0.0
    """the engine's wall time for it."""


class RolloutDriver:
    """Owns this rank's engine (hosts) and the collective protocol around the engines (all ranks)."""

    def __init__(self, cfg: TrainConfig, student: StudentModel, engine_model_dir: str, eos_token_ids: tuple[int, ...],
                 sampler_logprobs: bool = False):
        """``sampler_logprobs``: the rollouts also bring the engine's processed log-prob of each token
        (``StepSamples.logprobs``; GRPO's vLLM importance-sampling correction)."""
        from megatron.core import parallel_state as ps

        self.cfg = cfg
        self.sampler_logprobs = sampler_logprobs
        self.student = student
        self.eos_token_ids = eos_token_ids
        self.engine = None
        self.policy_version: int | None = None
        self.last_sync: list[dict] = []
        """per engine after the last sync: seconds, probe_diff, fingerprint_diff, fingerprints_checked."""
        self.last_engine_s: list[float] = []
        """per engine: wall time of its share of the last shared step."""
        self.control = control_group(cfg.rollout.timeout_s)
        rank = dist.get_rank()
        # every rank, before the hosts start their engines (the gather below orders it): an engine's
        # TP workers run on other ranks' GPUs, and vLLM checks the free memory on each of them
        release_cached_memory()
        places = self.gather(RankPlace(rank, ps.get_data_parallel_rank(), this_node(),
                                        local_rank()))
        self.groups: EngineGroups = plan_engine_groups(cfg.rollout.num_engines, places,
                                                       prompts_per_step=cfg.prompts_per_step,
                                                       engine_tp=cfg.rollout.tensor_parallel_size)
        self.engine_index = self.groups.group_of(rank)
        self.host_rank = self.groups.host(self.engine_index)
        self.is_host = rank == self.host_rank
        self.name = f"rollout engine {self.engine_index} (host rank {self.host_rank})"
        self.group = self._group_process_group()
        failure = cause = None
        if self.is_host:
            try:
                self.engine = build_engine(self._engine_config(engine_model_dir))
            except Exception as err:  # noqa: BLE001 - reported to every rank (``engine_start``)
                failure, cause = classify(err, cfg.rollout.vllm_kwargs, _ROLLOUT_FIELDS), err
        failures = [r for r in self.gather((self.name, failure) if failure else None) if r is not None]
        if failures:   # a setting or the engine's own failure: one line; a bug: the host's traceback
            told = start_failed(failures, cfg.save_dir) or RolloutFailure(
                "; ".join(f"{name}: failed to start {f.text}" for name, f in failures))
            if cause is not None:
                drop_unsaid_logs(kept_logs(cause), str(told))
            raise told from cause

    def _engine_config(self, model_dir: str) -> EngineConfig:
        cfg, r = self.cfg, self.cfg.rollout
        return EngineConfig(
            model_dir=model_dir, backend=r.backend, server_url=r.server_url,
            server_weight_transport=r.server_weight_transport, server_nccl_address=r.server_nccl_address,
            server_nccl_port=r.server_nccl_port, dtype=cfg.model.dtype, seed=cfg.training.seed,
            timeout_s=r.timeout_s, tensor_parallel_size=r.tensor_parallel_size,
            gpu_memory_utilization=r.gpu_memory_utilization, enable_sleep_mode=r.enable_sleep_mode,
            enforce_eager=r.enforce_eager, vllm_kwargs=dict(r.vllm_kwargs),
            logprobs_mode="processed" if self.sampler_logprobs else "raw",
            separate_process=bool(r.async_steps),
            max_model_len=cfg.data.max_prompt_length + max(
                r.max_tokens, cfg.data.reason_first_max_tokens if cfg.data.reason_first else 0))

    def _group_process_group(self):
        """The gloo group of this rank's engine group (every rank creates every group, in order)."""
        if self.groups.num_engines == 1:
            return self.control
        mine = None
        for g, ranks in enumerate(self.groups.ranks):
            pg = control_group(self.cfg.rollout.timeout_s, list(ranks))
            if g == self.engine_index:
                mine = pg
        return mine if len(self.groups.ranks[self.engine_index]) > 1 else None

    # ----------------------------------------------------------------- collectives

    def gather(self, obj) -> list:
        """``obj`` of every rank, by rank (gloo; a world of one needs no collective)."""
        if self.control is None:
            return [obj]
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def _agree(self, error: str | None, payload=None) -> list:
        """Every rank learns every host's error (then all raise ``RolloutFailure``) and payload
        (returned per engine, in engine order)."""
        report = (f"{self.name}: {error}" if error else None, payload) if self.is_host else None
        hosts = [r for r in self.gather(report) if r is not None]  # ascending ranks: engine order
        errors = [e for e, _ in hosts if e]
        if errors:
            raise RolloutFailure("; ".join(errors))
        return [p for _, p in hosts]

    # ----------------------------------------------------------------- sampling

    def rollout_params(self, step: int, prompt: int, sample: int) -> SamplingParams:
        """One completion of the step's ``prompt`` (its own seed, ``rollout/seeds.py``)."""
        r = self.cfg.rollout
        return SamplingParams(n=1, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                              seed=sample_seed(self.cfg.training.seed, step, prompt, sample),
                              stop_token_ids=self.eos_token_ids,
                              logprobs=self.sampler_logprobs)

    def analysis_params(self, step: int, prompt: int) -> SamplingParams:
        """The teacher's reason-first analysis (``data.reason_first``): one sample per prompt at the
        rollout's temperature / top-p / top-k, at most ``data.reason_first_max_tokens`` tokens
        (official ``opsd_trainer.py`` lines 257-266, 1091-1097), its own seed stream."""
        r = self.cfg.rollout
        return SamplingParams(n=1, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                              max_tokens=self.cfg.data.reason_first_max_tokens,
                              seed=sample_seed(self.cfg.training.seed, step, prompt, stream="analysis"),
                              stop_token_ids=self.eos_token_ids)

    def sample(self, requests: StepRequests) -> StepSamples:
        """This host's share of a step: its group's analyses and on-policy rollouts (engine calls
        only, no collective: safe in a background thread). Raises what the engine raises."""
        t0 = time.perf_counter()
        n = self.cfg.rollout.n
        rows = self.groups.prompts(self.engine_index, len(requests.prompts))
        out = StepSamples(requests.step, self.policy_version)
        if requests.analysis_prompts is not None:
            done = self._generate([requests.analysis_prompts[i] for i in rows],
                                  [self.analysis_params(requests.step, i) for i in rows])
            out.analyses = {i: list(c.token_ids) for i, c in zip(rows, done)}
        wanted = [i for i in range(rows.start * n, rows.stop * n) if requests.on_policy[i]]
        done = self._generate([requests.prompts[i // n] for i in wanted],
                              [self.rollout_params(requests.step, i // n, i % n) for i in wanted])
        out.completions = {i: list(c.token_ids) for i, c in zip(wanted, done)}
        if self.sampler_logprobs:
            out.logprobs = {i: [float(v) for v in c.logprobs] for i, c in zip(wanted, done)}
        out.seconds = time.perf_counter() - t0
        return out

    def _generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list:
        """One ``Completion`` per prompt."""
        if not prompts:
            return []
        self._wake()
        outs = self.engine.generate(prompts, params)
        self._sleep()
        return [c for (c,) in outs]

    def share(self, local: StepSamples | BaseException | None, step: int) -> StepSamples:
        """Collective: every host's outcome reaches every rank (a failed one raises ``RolloutFailure``
        everywhere); each group's samples go from its host to the group's ranks. ``local``: the host's
        ``sample`` result or the exception it raised; ignored elsewhere."""
        error = None
        if self.is_host and isinstance(local, BaseException):
            error = f"sampling failed at step {step} ({type(local).__name__}): {local}"
        self.last_engine_s = self._agree(error, local.seconds if isinstance(local, StepSamples) else None)
        if self.group is None:
            return local
        box = [local if self.is_host else None]
        dist.broadcast_object_list(box, src=self.host_rank, group=self.group)
        return box[0]

    def generate(self, requests: StepRequests) -> StepSamples:
        """``sample`` on the hosts, then ``share`` (collective: every rank calls it)."""
        local = None
        if self.is_host:
            try:
                local = self.sample(requests)
            except Exception as err:  # noqa: BLE001 - reported to every rank
                local = err
        return self.share(local, requests.step)

    # ----------------------------------------------------------------- weight sync

    def _named_tensors(self):
        """HF-named merged weights of the whole model (every rank of the replica iterates)."""
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
        atol = self.cfg.rollout.probe_atol or probe_tolerance(self.cfg.model.dtype, logprobs)
        return SyncProbe(prompt, completion, logprobs, atol=atol)

    def sync(self, version: int) -> None:
        """Push the student's current weights (``version`` optimizer steps) into every engine from its
        group's first replica, and verify each (collective over all ranks)."""
        from megatron.core import parallel_state as ps

        probe = self._probe()  # every rank takes part in the probe forward
        error = stats = None
        if ps.get_data_parallel_rank() == self.groups.dp_ranks(self.engine_index).start:
            stream = self._named_tensors()
            if self.is_host:
                try:
                    self._wake()
                    r = self.cfg.rollout
                    report = sync_weights(self.engine, stream, probe=probe,
                                          fingerprint_projections=r.fingerprint_projections if r.verify_sync else 0,
                                          fingerprint_seed=self.cfg.training.seed)
                    self._sleep()
                    stats = dict(seconds=report.seconds, probe_diff=report.probe_max_abs_diff,
                                 fingerprint_diff=report.fingerprint_max_rel_diff,
                                 fingerprints_checked=report.fingerprints_checked)
                except Exception as err:  # noqa: BLE001
                    error = f"weight sync to version {version} failed ({type(err).__name__}): {err}"
            for _ in stream:  # the rest of the replica's gathers (all of them off the host)
                pass
        self.last_sync = self._agree(error, stats)
        self.policy_version = version

    def sync_metrics(self) -> dict:
        """The last sync over all engines: the worst probe and fingerprint deviation, the fewest
        fingerprints checked, the slowest engine's push + verification (``time_engine_sync_s``);
        with several engines each one's probe deviation too."""
        diffs = [s["probe_diff"] for s in self.last_sync]
        fps = [s["fingerprint_diff"] for s in self.last_sync if s["fingerprint_diff"] is not None]
        out = dict(sync_probe_diff=None if None in diffs or not diffs else max(diffs),
                   sync_fingerprint_diff=max(fps) if fps else None,
                   sync_fingerprints_checked=min((s["fingerprints_checked"] for s in self.last_sync), default=0),
                   time_engine_sync_s=max((s["seconds"] for s in self.last_sync), default=None))
        if len(self.last_sync) > 1:
            out["sync_probe_diff_by_engine"] = diffs
        return out

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
