"""The environment a vLLM engine starts under: set for the start only, so this process keeps its own.

Start-up environment (``engine_start_environ``): ``VLLM_ENABLE_V1_MULTIPROCESSING`` and the
spawn settings are set only while ``vllm.LLM`` starts (the spawned engine keeps them, this
process does not: a later engine in the same process chooses afresh). On CUDA without flashinfer
``VLLM_USE_FLASHINFER_SAMPLER=0`` is part of it (``sampler_environ``: vLLM 0.24's default sampler
imports flashinfer), and a spawned engine starts without torchrun's ``TORCHELASTIC_USE_AGENT_STORE``
(``engine_process_environ``: with it vLLM 0.24's engine core waits forever in its rendezvous).
``VLLM_ALLOW_INSECURE_SERIALIZATION`` (pickled IPC rebuild functions) stays set: vLLM's RPC
encoder reads it in this process at every call. A spawned engine on GPU
gets an explicit ``CUDA_VISIBLE_DEVICES`` starting at this process's device, and CUDA-IPC
handles carry the *physical* device, which each worker maps into its own numbering
(``vllm_worker.local_device_index``).

A spawned engine's ZMQ sockets (vLLM 0.32: seven ``ipc://<VLLM_RPC_BASE_PATH>/<uuid4>`` files, the base the temporary
directory by default) were left there after every start, failed or closed: they go in a directory of the engine's
own (``new_socket_dir``), dropped when the start fails or the engine closes, so that another process's sockets in
the temporary directory are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch

from .vllm_worker import visible_devices


#: the longest path a Unix socket may have (``sockaddr_un``: 108 bytes with the NUL); vLLM names its sockets
#: ``<VLLM_RPC_BASE_PATH>/<uuid4>`` (36 characters)
_SOCKET_PATH_MAX = 107


def new_socket_dir(environ=os.environ) -> str | None:
    """A fresh directory for a spawned engine's ZMQ sockets (``VLLM_RPC_BASE_PATH`` while it starts), or None: a
    ``VLLM_RPC_BASE_PATH`` the user set is kept. The directory is made in the temporary directory, or in /tmp where
    a socket's path there would pass a Unix socket's 107 bytes (a long ``TMPDIR``: vLLM's own default, that
    directory, could not bind and the engine did not start); None (vLLM's default) where neither can be made."""
    if environ.get("VLLM_RPC_BASE_PATH"):
        return None
    for parent in (None, "/tmp"):
        try:
            path = tempfile.mkdtemp(prefix="phf_vllm_ipc_", dir=parent)
        except OSError:
            continue
        if len(os.path.join(path, "0" * 36)) <= _SOCKET_PATH_MAX:
            return path
        drop_socket_dir(path)
    return None


def drop_socket_dir(path: str | None) -> None:
    """Drop ``new_socket_dir``'s directory (None: none was made) with the sockets the engine left in it."""
    if path:
        shutil.rmtree(path, ignore_errors=True)


def engine_visible_devices(current_device: int, tensor_parallel_size: int, environ=os.environ) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a spawned engine: ``tensor_parallel_size`` devices starting at this
    process's ``current_device``, so the engine's worker 0 shares the trainer's GPU (colocated)."""
    visible = visible_devices(environ)
    if visible is None:
        count = torch.cuda.device_count() if torch.cuda.is_available() else current_device + tensor_parallel_size
        visible = [str(i) for i in range(count)]
    chosen = visible[current_device:current_device + tensor_parallel_size]
    if len(chosen) < tensor_parallel_size:
        raise ValueError(f"rollout.tensor_parallel_size: {tensor_parallel_size} GPUs from device {current_device} "
                         f"are needed, but only {visible} are visible")
    return ",".join(chosen)


def sampler_environ(*, on_gpu: bool, flashinfer: bool | None = None, environ=os.environ) -> dict[str, str]:
    """``VLLM_USE_FLASHINFER_SAMPLER=0`` when vLLM runs on CUDA and flashinfer is not installed, else nothing.

    vLLM 0.24 turns the FlashInfer top-k/top-p sampler on by default on CUDA and, when it builds
    the sampler (after loading the weights), imports its FlashInfer attention backend, whose first
    line is ``from flashinfer import ...``: without flashinfer every engine start dies there
    (``ModuleNotFoundError``). With the variable at 0 vLLM samples with its own top-k/top-p (PyTorch,
    Triton) instead. ``flashinfer``: whether it imports (None: look it up); a value the user set for the
    variable is kept. The in-process engine, the spawned engine and the server all start under this.
    """
    if not on_gpu or "VLLM_USE_FLASHINFER_SAMPLER" in environ:
        return {}
    if flashinfer is None:
        import importlib.util
        flashinfer = importlib.util.find_spec("flashinfer") is not None
    return {} if flashinfer else {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


def engine_process_environ(environ=os.environ) -> dict[str, str | None]:
    """What an engine process started from a torchrun worker must not inherit (``None``: unset).

    torchrun sets ``TORCHELASTIC_USE_AGENT_STORE=True`` for its workers, and torch's ``tcp://``
    rendezvous then only connects to a store it expects torchrun's agent to host. vLLM 0.24's engine
    core joins a world of its own over ``tcp://<this host>:<free port>`` (0.32 uses a file store), so
    under torchrun it waited forever for a store nobody starts (seen on an H100: the spawned engine of
    ``examples/train_phf_qwen3_1p7b.sh`` hung at ``init_process_group``). The spawned engine, its
    workers and the server start without it."""
    return {"TORCHELASTIC_USE_AGENT_STORE": None} if "TORCHELASTIC_USE_AGENT_STORE" in environ else {}


def engine_start_environ(*, in_process: bool, on_gpu: bool, tensor_parallel_size: int,
                         current_device: int = 0, environ=os.environ,
                         flashinfer: bool | None = None) -> dict[str, str | None]:
    """The environment ``vllm.LLM`` must start under (set for the start only, see the module docstring;
    ``None``: unset); ``flashinfer``: see :func:`sampler_environ`."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
           **sampler_environ(on_gpu=on_gpu, flashinfer=flashinfer, environ=environ)}
    if not in_process:
        env.update(VLLM_WORKER_MULTIPROC_METHOD="spawn", **engine_process_environ(environ))
        if on_gpu:
            env["CUDA_VISIBLE_DEVICES"] = engine_visible_devices(current_device, tensor_parallel_size, environ)
    return env


@contextlib.contextmanager
def scoped_environ(values: dict[str, str | None]):
    """Set ``values`` in ``os.environ`` for the block (``None``: unset), then restore; vLLM's environment
    cache (which an in-process engine core turns on) is cleared on both sides so vLLM reads what is set now."""
    saved = {k: os.environ.get(k) for k in values}
    _clear_vllm_env_cache()
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _clear_vllm_env_cache()


def _clear_vllm_env_cache() -> None:
    try:
        from vllm import envs
    except Exception:
        return
    clear = getattr(envs, "disable_envs_cache", None)
    if callable(clear):
        clear()
