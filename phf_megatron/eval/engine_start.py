"""The eval's engine start, its failures told as the trainer's are (``training/engine_start.py``), in the eval's
flags: a ``--engine_kwargs`` vLLM keyword vLLM refused is one line naming the flag (exit code 2); the engine's own
failure (no memory, its process died) one line, the samples written so far kept (exit code 1), as is a data-parallel
worker a signal killed (the OOM killer's SIGKILL): named with its GPUs; any other error (a bug) keeps its
traceback. The eval's engine is alone on its GPU, and its flags are ``--engine_kwargs gpu_memory_utilization`` and
``--max_model_len``: vLLM's refusals for want of memory are said in them here
(``gpu_memory.explain_start_failure`` says the trainer's, with its model and optimizer on the GPU)."""

from __future__ import annotations

import dataclasses
import signal

from phf_megatron.rollout import EngineConfig, RolloutEngine, build_engine
from phf_megatron.rollout.errors import RolloutEngineError, VLLMStartError, one_line
from phf_megatron.rollout.gpu_memory import VLLM_FREE_MEMORY_MESSAGE, VLLM_KV_CACHE_MESSAGES, VLLM_SPAWNED_START_FAILURE
from phf_megatron.rollout.start_errors import engine_bug, refused_keyword
from phf_megatron.rollout.vllm_start_log import described, drop_unsaid_logs, kept_logs
from phf_megatron.rollout.vllm_worker import arch_fields

from ..errors import ConfigError, RunStopped, UserError, as_config_error
from .config import ENGINE_FIELDS_SET

#: The ``EngineConfig`` fields ``--engine_kwargs`` gives: an engine's ``ValueError("field: ...")`` as it starts
#: (``device``: a GPU the process does not see) is that flag's.
ENGINE_KWARGS_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineConfig)) - ENGINE_FIELDS_SET.keys()


def samples_kept(out_dir: str) -> str:
    """The end of the line of an eval stopped by a failure outside the user's input: what is kept, how to go on."""
    return f"the samples written before are kept in {out_dir}; rerun the same command to resume"


def start_engine(out_dir: str, engine_config: EngineConfig) -> RolloutEngine:
    """``build_engine``, its failures one line (see the module docstring); ``out_dir`` keeps the samples written."""
    try:
        return build_engine(engine_config)
    except Exception as err:
        said = refused_keyword(err, engine_config.vllm_kwargs)
        if said is not None:
            told = ConfigError("engine_kwargs", f"vllm_kwargs: {said}")
        elif type(err) is ValueError and (setting := as_config_error(err, ENGINE_KWARGS_FIELDS)) is not None:
            told = ConfigError("engine_kwargs", f"{setting.key}: {setting.detail}")
        elif isinstance(err, RolloutEngineError) and not engine_bug(err):
            why = vllm_start_failure(err, engine_config) if isinstance(err, VLLMStartError) else one_line(err)
            told = RunStopped(f"the engine did not start: {why}; {samples_kept(out_dir)}")
        else:
            raise
        drop_unsaid_logs(kept_logs(err), str(told))
        raise told from err


def push_model_weights(engine: RolloutEngine, model_dir: str, dtype: str) -> None:
    """``--backend vllm_server``: the server generates with whatever it loaded (a base model, another run's); the
    weights of ``model_dir`` (the ``--model``, merged or converted model the eval names) go in before any sample, by
    the trainer's weight push, into a server that runs the same architecture in ``dtype`` (``check_served_model``). A
    server that cannot take them (no dev mode, no worker extension, another model) stops the eval in one line."""
    from phf_megatron.convert.hf_checkpoint import HFCheckpoint

    checkpoint = HFCheckpoint(model_dir)
    device = "cuda" if getattr(engine, "weight_transport", None) == "nccl" else "cpu"   # NCCL sends CUDA tensors
    try:
        check_served_model(engine.served_config(), checkpoint.config, model_dir, dtype)
        engine.update_weights((name, checkpoint.get(name).to(device)) for name in checkpoint.names())
    except RolloutEngineError as err:
        raise UserError(f"--backend vllm_server: the server did not take the weights of {model_dir} (its samples "
                        f"would be of the model it serves): {one_line(err)}") from err


def check_served_model(served: dict, config: dict, model_dir: str, dtype: str) -> None:
    """The server's model (``VLLMServerEngine.served_config``) has ``config``'s architecture (each field both name)
    and computes in ``dtype``: pushed weights make it that model; else one line naming both."""
    ours = arch_fields(config)   # (RoPE theta in either layout, on either side)
    differ = {k: (v, ours[k]) for k, v in served["config"].items() if k in ours and v != ours[k]}
    if differ:
        said = ", ".join(f"{k} {old} (the model's: {new})" for k, (old, new) in differ.items())
        raise UserError(f"--backend vllm_server: the server serves another architecture than {model_dir}: {said}; "
                        f"serve {model_dir} (vllm serve {model_dir}), or use --backend vllm")
    if served["dtype"] != dtype:
        raise UserError(f"--dtype: {dtype}, and the vLLM server computes in {served['dtype']}: give --dtype "
                        f"{served['dtype']}, or restart the server with --dtype {dtype}")


def vllm_start_failure(err: VLLMStartError, engine_config: EngineConfig) -> str:
    """``vllm.LLM(...)``'s failure (``err.__cause__``) in the eval's flags, with no trainer beside it on the GPU."""
    text = described(err.engine_error or err.__cause__)   # a spawned engine's own error: vLLM's parent says none
    model_dir, free_bytes = engine_config.model_dir, err.free_bytes
    flag = f"--engine_kwargs gpu_memory_utilization ({engine_config.gpu_memory_utilization:g} x the GPU's memory"
    free = f"; {free_bytes / 2**30:.1f} GiB free)" if free_bytes is not None else ")"
    if VLLM_FREE_MEMORY_MESSAGE in text:
        said = (f"{flag}{free} is more than is free when vLLM starts (another process holds part of the GPU): lower "
                f"it, or free the GPU. vLLM said: {text}")
    elif free_bytes is not None and any(m in text for m in VLLM_KV_CACHE_MESSAGES):
        said = (f"{flag}{free} leaves too little KV cache beside the weights for one request of the engine's "
                f"context: raise it, or lower --max_model_len. vLLM said: {text}")
    elif err.engine_error is not None:
        said = f"vLLM's engine process could not start on {model_dir!r}: {text}"
    elif VLLM_SPAWNED_START_FAILURE in text:
        said = (f"vLLM's engine process could not start on {model_dir!r}: its own error is in the log above. "
                f"vLLM said: {text}")
    else:
        said = f"vLLM could not start on {model_dir!r}: {text}"
    return one_line(said + (f" (engine process: {err.process})" if err.process else ""))


def worker_failure(err: Exception) -> tuple | None:
    """A data-parallel worker's one-line error as it crosses to the parent (picklable: a ``ConfigError`` does not
    unpickle), or None for a bug (its traceback stays the worker's)."""
    if isinstance(err, ConfigError):
        return ("setting", err.key, err.detail)
    if isinstance(err, UserError):
        return ("user", err.line)
    if isinstance(err, RunStopped):
        return ("stopped", str(err))
    return None


def worker_name(rank: int) -> str:
    """The name of data-parallel worker ``rank``'s process (``run_data_parallel``)."""
    return f"eval-dp{rank}"


def gpu_names(gpus: list[str]) -> str:
    """``GPU 1``, ``GPUs 2,3`` for indices; UUIDs and MIG ids (``GPU-8f2e...``, ``MIG-...``) as they name themselves."""
    if all(gpu.isdigit() for gpu in gpus):
        return f"GPU{'s' if len(gpus) > 1 else ''} {','.join(gpus)}"
    return ",".join(gpus)


def named_worker(rank: int, gpus: list[str] | None, also: str = "") -> str:
    """``data-parallel worker eval-dp1 (GPU 1)``, ``also`` said in the parentheses after its GPUs."""
    return f"data-parallel worker {worker_name(rank)} ({gpu_names(gpus) if gpus else 'no GPU'}{also})"


def killed_worker(rank: int, signum: int, gpus: list[str] | None) -> str:
    """``data-parallel worker eval-dp1 (GPU 1) was killed by SIGKILL (out of memory? ...)``: a worker a signal ended
    (it sent no line: no Python ran)."""
    name = signal.Signals(signum).name if signum in signal.valid_signals() else f"signal {signum}"
    return (f"{named_worker(rank, gpus)} was killed by {name}"
            + (" (out of memory? the kernel's OOM killer sends it)" if signum == signal.SIGKILL else ""))


def workers_failed(said: dict[int, tuple], exit_codes: dict[int, int], gpus: list[list[str] | None],
                   out_dir: str) -> Exception:
    """What the parent raises when data-parallel workers exited non-zero (``exit_codes``, by rank; ``gpus``: each
    rank's), ``said``: the one lines they sent, by rank: the single-worker eval's line (a setting's before another
    user error's before the engines' own failure, the lowest rank's; the engines' own failure names its worker and
    how many others failed: the other workers' lines, and the engine logs they name, are not said), a
    ``RuntimeError`` when a worker failed
    without one (a bug: the worker printed its traceback), a ``RunStopped`` naming the workers a signal killed
    (the OOM killer's SIGKILL: no line, no traceback) before the engines' own failure when there is one, the samples
    in ``out_dir`` kept, unless another worker said a setting's or a user error's line (that one: the rerun its line
    asks for would stop on it)."""
    silent = {rank: code for rank, code in exit_codes.items() if rank not in said}
    if any(code > 0 for code in silent.values()):
        codes = {worker_name(rank): code for rank, code in exit_codes.items()}
        return RuntimeError(f"data-parallel workers failed (exit codes {codes}); rerun to resume")
    kinds = {"setting": ConfigError, "user": UserError, "stopped": RunStopped}
    killed = "".join(f"{killed_worker(rank, -code, gpus[rank])}; " for rank, code in sorted(silent.items()))
    if not said:
        return RunStopped(f"{killed}{samples_kept(out_dir)}")
    rank, (kind, *args) = min(said.items(), key=lambda rank_said: (list(kinds).index(rank_said[1][0]), rank_said[0]))
    if kind == "stopped":   # (a setting's or a user error's line is every worker's)
        others = len(said) - 1   # (the killed workers are named before it)
        also = f"; {others} other worker{'s' if others > 1 else ''} failed too" if others else ""
        return RunStopped(f"{killed}{named_worker(rank, gpus[rank], also)}: {args[0]}")
    return kinds[kind](*args)
