"""Run an Average@k evaluation: plan the missing samples, generate them, grade, write, resume.

    summary = run_eval(EvalConfig(model="/models/Qwen3-1.7B", data_dir="data", out_dir="runs/eval"))

Resumption: the run directory keeps every finished sample (records.py). A rerun loads them,
generates only the missing ``(benchmark, problem, sample_index)`` triples and never touches a
finished one. Each sample has its own seed (``config.sample_seed``), so a resumed run samples
what an uninterrupted one would have (same backend; batched kernels may differ in the last bits).
What a resume refuses to mix in (other settings, another model's files, other problem texts): ``resume.py``.
Data parallelism starts one engine per GPU in a spawned process; worker r takes every r-th
missing sample and writes its own shard.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import time

from phf_megatron.rollout import EngineConfig, SamplingParams, resolve_backend
from phf_megatron.rollout.factory import vllm_kwargs_dropped
from phf_megatron.rollout.vllm_start_log import drop_unsaid_logs, kept_logs
from phf_megatron.tokenizer import load_qwen3_tokenizer

from ..errors import ConfigError, InputFileError
from ..input_files import missing_dir, read_json
from ..output_files import remove
from ..runtime.children import Reaper
from .benchmarks import Problem, load_problems
from .config import EvalConfig, sample_seed
from .engine_start import push_model_weights, start_engine, worker_failure, worker_name, workers_failed
from .models import converted_checkpoint, merged_inputs, model_context_limit, model_digest, resolve_model_dir
from .progress import SampleProgress, ShardProgress, SharedTally
from .prompts import eval_prompt_ids
from .records import SampleWriter, grade_record, load_records, problem_digest, shard_path
from .report import Summary, summarize
from .resume import (
    MERGE_KEYS, _check_fingerprint, _converted_before, _upgrade_typed_checkpoint, other_problem_samples,
    other_settings, planned_fingerprint, resume_differences,
)


@dataclasses.dataclass(frozen=True)
class WorkItem:
    problem: Problem
    sample_index: int


def pending_work(problems: dict[str, list[Problem]], n: int, done: set) -> list[WorkItem]:
    return [WorkItem(p, i) for ps in problems.values() for p in ps for i in range(n)
            if (p.benchmark, p.id, i) not in done]


def check_max_model_len(config: EvalConfig, model_dir: str, model_limit: int | None) -> None:
    """``--max_model_len`` above the model's ``max_position_embeddings``: one line before an engine starts (was
    vLLM's ValidationError traceback from its engine)."""
    if (config.max_model_len is not None and model_limit is not None and config.max_model_len > model_limit
            and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1"):
        raise ConfigError("max_model_len", f"{config.max_model_len} is above the model's context, max_position_"
                          f"embeddings {model_limit} in {os.path.join(model_dir, 'config.json')}: give at most "
                          f"{model_limit}, or leave it out (the official length capped at the model's)")


def check_prompts_fit(config: EvalConfig, model_dir: str, items: list[WorkItem], model_limit: int | None) -> None:
    """Every pending prompt leaves room for a new token in the engine's context: one line naming the
    longest, before an engine starts (it was vLLM's or the HF engine's traceback after loading)."""
    if not items:
        return
    tok = load_qwen3_tokenizer(model_dir)
    context = config.engine_max_model_len(model_limit)
    problems = {(it.problem.benchmark, it.problem.id): it.problem.problem for it in items}   # once each, not n times
    lengths = {key: len(eval_prompt_ids(tok, text, thinking=config.thinking)) for key, text in problems.items()}
    over = {key: n for key, n in lengths.items() if n >= context}
    if over:
        (bench, pid), n = max(over.items(), key=lambda kv: kv[1])
        room = (f"--max_model_len up to the model's {model_limit}, " if model_limit and model_limit > context else
                "")   # the official cap (32,768 without thinking) is below Qwen3's 40,960
        limit = "none in its config" if model_limit is None else model_limit
        raise ConfigError("max_model_len", f"{len(over)} of {len(lengths)} prompts do not fit the engine's context "
                                           f"of {context} tokens (the longest, {bench} problem {pid}, is {n} "
                                           f"tokens; the model's max_position_embeddings: {limit}): "
                                           f"{room}a model with a longer context, or other --benchmarks")


def generate_samples(config: EvalConfig, model_dir: str, backend: str, items: list[WorkItem], rank: int,
                     show_progress: bool = True, done: int = 0, tally=None) -> None:
    """Generate, grade and append ``items`` to shard ``rank`` (one engine in this process); the bar
    counts from ``done``, the samples a resume found written (``tally``: a data-parallel worker's, for its
    parent's bar: ``SharedTally``)."""
    if not items:
        return
    tok = load_qwen3_tokenizer(model_dir)
    engine_kwargs = {"gpu_memory_utilization": 0.9, **config.engine_kwargs}     # eval owns the GPU
    if backend == "vllm_server":   # one push of model_dir (push_model_weights): no NCCL rendezvous to set up
        engine_kwargs.setdefault("server_weight_transport", "rpc")
    max_model_len = config.engine_max_model_len(model_context_limit(model_dir))
    engine = start_engine(config.out_dir, EngineConfig(model_dir=model_dir, backend=backend, dtype=config.dtype,
                                                       seed=config.seed, max_model_len=max_model_len, **engine_kwargs))
    if backend == "vllm_server":   # its samples are of model_dir's weights, not of what the server loaded
        try:
            push_model_weights(engine, model_dir, config.dtype)
        except BaseException:
            engine.close()
            raise
    prompt_cache: dict[tuple[str, str], list[int]] = {}
    bar = SampleProgress(done + len(items), done=done, enabled=show_progress) if tally is None else \
        SharedTally(tally, rank)
    try:
        with SampleWriter(shard_path(config.out_dir, rank)) as writer:
            for start in range(0, len(items), config.batch_size):
                chunk = items[start:start + config.batch_size]
                prompts, params = [], []
                for it in chunk:
                    key = (it.problem.benchmark, it.problem.id)
                    if key not in prompt_cache:
                        prompt_cache[key] = eval_prompt_ids(tok, it.problem.problem, thinking=config.thinking)
                    prompts.append(prompt_cache[key])
                    params.append(SamplingParams(
                        n=1, temperature=config.temperature, top_p=config.sampling_top_p, top_k=config.top_k,
                        max_tokens=config.max_new_tokens,
                        seed=sample_seed(config.seed, it.problem.benchmark, it.problem.id, it.sample_index)))
                outs = engine.generate(prompts, params, on_done=bar.update)   # moves as samples finish
                writer.write([_record(tok, it, prompt, p.seed, comps[0], config.require_boxed)
                              for it, prompt, p, comps in zip(chunk, prompts, params, outs)])
    finally:
        bar.close()
        engine.close()


def _record(tok, item: WorkItem, prompt: list[int], seed: int, completion, require_boxed: bool) -> dict:
    return grade_record({
        "benchmark": item.problem.benchmark, "problem_id": item.problem.id, "sample_index": item.sample_index,
        "problem_sha256": problem_digest(item.problem.problem),
        "seed": seed, "gold": item.problem.answer, "finish_reason": completion.finish_reason,
        "prompt_tokens": len(prompt), "completion_tokens": len(completion.token_ids),
        "output": tok.decode(completion.token_ids, skip_special_tokens=True),
    }, require_boxed)


def _worker(config: EvalConfig, model_dir: str, backend: str, items: list[WorkItem], rank: int,
            gpus: list[str] | None, failures, tally) -> None:
    if gpus is not None:                      # before any CUDA call in this (spawned) process
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    try:
        generate_samples(config, model_dir, backend, items, rank, tally=tally)
    except Exception as err:
        if (failure := worker_failure(err)) is None:
            raise                              # a bug: its traceback, here
        failures.put((rank, failure, kept_logs(err)))   # one line, said by the parent (``workers_failed``)
        sys.exit(2 if failure[0] != "stopped" else 1)


def _replica_gpus(config: EvalConfig, environ=os.environ) -> list[list[str]] | None:
    """GPUs of each engine replica (tensor_parallel_size each) as ``CUDA_VISIBLE_DEVICES`` names them: slices
    of this process's own ``CUDA_VISIBLE_DEVICES`` when it is set (else indices), or None on a CPU machine and for
    ``--backend vllm_server`` (one client, whatever GPUs it has, pushes the model once: ``push_model_weights``)."""
    import torch

    from phf_megatron.rollout.vllm_worker import visible_devices
    if resolve_backend(config.backend) == "vllm_server":   # the server's GPUs serve every sample: one client, one push
        return None   # (--data_parallel > 1 refused: EvalConfig)
    gpus = torch.cuda.device_count()
    per = int(config.engine_kwargs.get("tensor_parallel_size", 1))
    size = config.data_parallel or max(gpus // per, 1)
    if not gpus:
        return None if size == 1 else [None] * size
    if size * per > gpus:
        raise ConfigError("data_parallel", f"{size} replicas x tensor_parallel_size {per} needs {size * per} GPUs, "
                                           f"{gpus} are visible")
    visible = (visible_devices(environ) or [str(i) for i in range(gpus)])[:gpus]
    return [visible[r * per:(r + 1) * per] for r in range(size)]


def run_data_parallel(config: EvalConfig, model_dir: str, backend: str, items: list[WorkItem],
                      replicas: list[list[str] | None], done: int = 0) -> None:
    """One spawned engine per replica; the parent shows one bar by tailing the shards."""
    ctx = mp.get_context("spawn")
    size = len(replicas)
    failures, said, logs = ctx.SimpleQueue(), {}, []
    tally = ctx.Array("q", 2 * size)   # each worker's samples and tokens told so far: the bar moves within a call
    procs = [ctx.Process(target=_worker, name=worker_name(r),
                         args=(config, model_dir, backend, items[r::size], r, replicas[r], failures, tally))
             for r in range(size)]
    for p in procs:
        p.start()
    reaper = Reaper([p.pid for p in procs])   # a SIGKILLed evaluator takes its replicas (and their GPUs) along
    watch = ShardProgress(config.out_dir, total=done + len(items), ranks=range(size), done=done, tally=tally)
    try:
        while any(p.is_alive() for p in procs):
            watch.poll()
            _drain(failures, said, logs)
            time.sleep(1.0)
        watch.poll()
    finally:
        watch.close()
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
        reaper.close()
    _drain(failures, said, logs)
    failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
    if failed:
        told = workers_failed(said, failed, replicas, config.out_dir)
        drop_unsaid_logs(logs, str(told))   # the engine logs of the workers whose lines are not said
        raise told


def _drain(failures, said: dict, logs: list) -> None:
    """The workers' one-line errors sent so far, into ``said`` by rank, and the engine logs kept for them into
    ``logs`` (read as they come: a full pipe blocks them)."""
    while not failures.empty():
        rank, failure, kept = failures.get()
        said[rank] = failure
        logs.extend(kept)


def _check_qwen3(model_dir: str) -> None:
    """The model is a Qwen3 (the prompts and the tokenizer are Qwen3's), named from its own
    ``config.json`` before an engine loads it."""
    from ..models.qwen3_arch import SUPPORTED_MODEL_TYPES

    path = os.path.join(model_dir, "config.json")
    model_type = read_json(path).get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise InputFileError(path, f"model_type {model_type!r} is not a Qwen3 model (expected one of "
                                   f"{SUPPORTED_MODEL_TYPES}); the evaluator runs Qwen3 models")


def run_eval(config: EvalConfig) -> Summary:
    """Evaluate (or finish evaluating) ``config``; returns the summary also written to disk."""
    # --backend auto without vLLM: build_engine refuses them too, but after the model is merged or converted
    if dropped := vllm_kwargs_dropped(config.engine_kwargs.get("vllm_kwargs"), config.backend, "--backend"):
        raise ConfigError("engine_kwargs", f"vllm_kwargs: {dropped}")
    problems, sources = load_problems(config)
    before = _converted_before(config.out_dir) if config.megatron_checkpoint is not None else None
    done, _ = load_records(config.out_dir)
    planned = None   # with samples to resume and an adapter: checked before a merge of minutes that would replace
    if done and config.adapter and config.megatron_checkpoint is None and not missing_dir(config.adapter):   # the
        planned, planned_limit = planned_fingerprint(config)   # kept one (its samples' model); a --model that is no
        # model's: merge_adapter's line, said here; an adapter with a megatron_checkpoint: resolve_model_dir's
        if diff := resume_differences(config.out_dir, planned, planned_limit):
            raise other_settings(config.out_dir, diff)
    model_dir = resolve_model_dir(model=config.model, adapter=config.adapter,   # a wrong path: nothing written
                                  megatron_checkpoint=config.megatron_checkpoint, run_dir=config.out_dir,
                                  dtype=config.dtype, merged_from=planned and {k: planned[k] for k in MERGE_KEYS})
    os.makedirs(config.out_dir, exist_ok=True)
    _check_qwen3(model_dir)
    backend = resolve_backend(config.backend)
    limit = model_context_limit(model_dir)
    check_max_model_len(config, model_dir, limit)
    fingerprint = planned or config.generation_fingerprint(model_dir, backend, limit)
    if config.megatron_checkpoint is not None:   # the iteration converted, not the run as typed: a resume after the
        fingerprint["megatron_checkpoint"] = converted_checkpoint(model_dir)   # run saved a later one mixed the two
        _upgrade_typed_checkpoint(config.out_dir, fingerprint, config.megatron_checkpoint, before)
    if config.adapter is not None and planned is None:   # the merged path alone: a retrained adapter or another
        fingerprint.update(merged_inputs(model_dir))     # --model mixed in silence
    if config.adapter is None and config.megatron_checkpoint is None:   # the path alone: a --model retrained or
        fingerprint["model_digest"] = model_digest(model_dir)            # overwritten in place mixed in silence
    _check_fingerprint(config.out_dir, fingerprint, limit, has_samples=bool(done))
    if other := other_problem_samples(done, problems):   # were kept, graded against the new answers: other outputs
        raise InputFileError(config.out_dir, f"holds samples of other problems under the same ids ({other}: the "
                                             "benchmark's file or --data_dir changed); use another --out_dir")
    items = pending_work(problems, config.n, set(done))
    written = sum(map(len, problems.values())) * config.n - len(items)   # a resume's bar starts there
    check_prompts_fit(config, model_dir, items, limit)
    t0 = time.perf_counter()
    if items:
        replicas = _replica_gpus(config)
        if replicas is None or len(replicas) == 1:
            generate_samples(config, model_dir, backend, items, rank=0, done=written)
        else:
            run_data_parallel(config, model_dir, backend, items, replicas, done=written)
    records, duplicates = load_records(config.out_dir)
    if not config.keep_model and (config.adapter or config.megatron_checkpoint):   # model_dir: the run's own
        remove(model_dir)                                # --no-keep_model: the merged / converted copy goes
    return summarize(config, problems, records, duplicates=duplicates, generated=len(items),
                     seconds=time.perf_counter() - t0, model_dir=model_dir, backend=backend, data_sources=sources)
