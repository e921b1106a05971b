"""An in-process vLLM engine that fails to start drops vLLM's distributed state (``forget_failed_start``);
when that cleanup fails too, the start's own one-line ``VLLMStartError`` is still what the user sees (it was
the cleanup's traceback, the start's error lost in its context). The engine is real vLLM refused for want of KV
cache; only its ``destroy_model_parallel`` is made to raise."""

from __future__ import annotations

import contextlib
import copy

import pytest

from phf_megatron.rollout.errors import VLLMStartError

from .conftest import another_process_s_socket, unix_sockets


def test_a_failed_cleanup_after_a_failed_start_leaves_the_starts_one_line(tiny_dir, monkeypatch):
    pytest.importorskip("vllm")
    import torch.distributed as dist
    from vllm.distributed import parallel_state

    from phf_megatron.rollout.vllm_engine import VLLMEngine

    had_group, called = dist.is_initialized(), []
    destroy_groups, destroy_environment = (parallel_state.destroy_model_parallel,
                                           parallel_state.destroy_distributed_environment)

    def destroy_model_parallel():
        called.append("destroy_model_parallel")
        destroy_groups()   # (done: a later engine in this process starts afresh), then it raises
        raise RuntimeError("cleanup broke")

    def environment():
        called.append("environment")
        destroy_environment()

    monkeypatch.setattr(parallel_state, "destroy_model_parallel", destroy_model_parallel)
    monkeypatch.setattr(parallel_state, "destroy_distributed_environment", environment)
    with pytest.warns(UserWarning, match=r"^vLLM's state after its failed start was not dropped \(RuntimeError: "
                                         r"cleanup broke\)"):
        with pytest.raises(VLLMStartError) as err:
            VLLMEngine(tiny_dir, dtype="float32", kv_cache_bytes=1)   # no room for one cache block
    assert "\n" not in str(err.value) and "cleanup broke" not in str(err.value), str(err.value)
    assert called == ["destroy_model_parallel", "environment"]   # the rest of the cleanup still ran
    assert dist.is_initialized() == had_group   # ... and dropped the default group vLLM had made


@pytest.mark.vllm
@pytest.mark.parametrize("quiet, level", [(True, None), (False, None), (True, "CRITICAL")])
def test_a_spawned_engine_s_failed_start_says_its_own_error_and_keeps_its_log(tiny_dir, short_tmp, monkeypatch, capfd,
                                                                              quiet, level):
    """vLLM's parent of a spawned engine process only raises "Engine core initialization failed"; the cause (here
    no room for one KV cache block) was in the process's log alone. The line now says it and names the file that
    keeps the process's errors with their tracebacks, the one start directory kept (and none of vLLM's sockets,
another process's kept). A quiet run (the commands'
    default) prints no traceback of the engine's processes (vLLM's log of the error on stdout, multiprocessing's
    copy on stderr: both were printed); a verbose one prints them as vLLM does. ``VLLM_LOGGING_LEVEL=CRITICAL``
    (vLLM's configuration built under it) dropped the failed start's ERROR record before the file and the quiet
    filter saw it: multiprocessing's traceback printed, and the line said the error was "in the log above"."""
    pytest.importorskip("vllm")
    import re
    import tempfile

    import vllm.logger

    from phf_megatron.rollout.vllm_engine import VLLMEngine
    from phf_megatron.startup import QUIET_ENV

    if level is not None:   # as vllm.logger builds it when VLLM_LOGGING_LEVEL is set before vLLM is imported
        config = copy.deepcopy(vllm.logger.DEFAULT_LOGGING_CONFIG)
        config["handlers"]["vllm"]["level"] = config["loggers"]["vllm"]["level"] = level
        monkeypatch.setattr(vllm.logger, "DEFAULT_LOGGING_CONFIG", config)
        monkeypatch.setenv("VLLM_LOGGING_LEVEL", level)
    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    monkeypatch.setenv("TMPDIR", str(short_tmp))   # (the engine's processes' temporary directory)
    other = another_process_s_socket(short_tmp)
    if quiet:
        monkeypatch.setenv(QUIET_ENV, "1")
    else:
        monkeypatch.delenv(QUIET_ENV, raising=False)
    with pytest.raises(VLLMStartError) as err:
        VLLMEngine(tiny_dir, dtype="float32", kv_cache_bytes=1, separate_process=True)
    printed = capfd.readouterr()
    assert ("Traceback" in printed.out + printed.err) != quiet, printed.out[-3000:] + printed.err[-3000:]
    line = str(err.value)
    assert line.startswith(f"vLLM's engine process could not start on {tiny_dir!r}: ValueError: No available memory "
                           "for the cache blocks."), line
    assert "\n" not in line and "Engine core initialization failed" not in line, line
    log = re.search(r"its errors: (\S+)/engine_errors\.log\)$", line)
    assert log and err.value.log_dir == log.group(1), line
    assert [str(p) for p in short_tmp.glob("phf_vllm_start_*")] == [log.group(1)]
    with open(f"{log.group(1)}/engine_errors.log") as f:
        assert "Traceback" in f.read()
    assert unix_sockets(short_tmp) == [other]   # vLLM's 7 ZMQ sockets were left; another process's stays


def test_a_spawned_engine_s_start_interrupted_leaves_no_log_directory(tiny_dir, tmp_path, monkeypatch):
    """Ctrl-C while a spawned engine starts: the directory made for its log was left in the temporary directory
    (only an ``Exception`` dropped it)."""
    vllm = pytest.importorskip("vllm")
    import tempfile

    from phf_megatron.rollout.vllm_engine import VLLMEngine

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(vllm, "LLM", interrupted)
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")   # (a spawned engine sets it for good)
    with pytest.raises(KeyboardInterrupt):
        VLLMEngine(tiny_dir, dtype="float32", separate_process=True)
    assert not list(tmp_path.glob("phf_vllm_start_*"))


def test_a_user_s_own_vllm_logging_is_kept(tmp_path):
    """The engine's error log is vLLM's default logging plus a file: a user's own configuration (or none) stays, and
    the line then says, as before, that the error is in the log above."""
    from phf_megatron.rollout.vllm_start_log import start_log_environ

    assert start_log_environ(str(tmp_path), environ={"VLLM_LOGGING_CONFIG_PATH": "mine.json"}) == {}
    assert start_log_environ(str(tmp_path), environ={"VLLM_CONFIGURE_LOGGING": "0"}) == {}



@contextlib.contextmanager
def _engine_error_logger(log_dir):
    """A logger with the engine's error-file handler, as vLLM's ``dictConfig`` builds it from ``start_log_environ``."""
    import json
    import logging
    import logging.config

    from phf_megatron.rollout.vllm_start_log import start_log_environ

    with open(start_log_environ(str(log_dir), environ={})["VLLM_LOGGING_CONFIG_PATH"]) as f:
        configurator = logging.config.DictConfigurator(json.load(f))
    formatters = configurator.config["formatters"]
    formatters["phf_engine_errors"] = configurator.configure_formatter(formatters["phf_engine_errors"])
    handler = configurator.configure_handler(configurator.config["handlers"]["phf_engine_errors"])
    logger = logging.getLogger("phf_test.engine_errors")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield logger
    finally:
        logger.removeHandler(handler)
        handler.close()


def test_an_engine_s_later_error_after_its_log_directory_was_dropped_is_no_error(tmp_path):
    """A started engine's log directory is dropped, but its processes (and on vLLM 0.32 the trainer: ``LLM`` applies
    the configuration in the parent too) keep the file handler: a vLLM error logged later raised FileNotFoundError
    from the logging call itself (the handler opens its file at the first error)."""
    pytest.importorskip("vllm")
    from phf_megatron.rollout.vllm_start_log import drop_log_dir

    log_dir = tmp_path / "start"
    log_dir.mkdir()
    with _engine_error_logger(log_dir) as logger:
        drop_log_dir(str(log_dir))
        logger.error("a request failed")   # raised FileNotFoundError before
        assert not log_dir.exists()


def _log_exception(logger, err: Exception, message: str) -> None:
    try:
        raise err
    except type(err):
        logger.exception(message)


def test_an_error_the_engine_logged_and_went_past_is_not_its_failed_start_s_cause(tmp_path):
    """vLLM logs some errors with their traceback and goes on (0.32's parent, whose log the file gets too: "Error
    saving model info cache." when VLLM_CACHE_ROOT is not writable; on a GPU without NVLink "NVLink detection
    failed."): the line said that first error (NotADirectoryError: ... modelinfos) instead of the failed start's
    own (no room for the KV cache). Now the error logged as the failed start is the one read; without one, the
    first logged still is."""
    pytest.importorskip("vllm")
    from phf_megatron.rollout.vllm_start_log import engine_error

    with _engine_error_logger(tmp_path) as logger:
        _log_exception(logger, NotADirectoryError("Not a directory: 'cache/modelinfos'"), "Error saving model info cache.")
        assert repr(engine_error(str(tmp_path))) == repr(NotADirectoryError("Not a directory: 'cache/modelinfos'"))
        _log_exception(logger, ValueError("No available memory for the cache blocks."), "EngineCore failed to start.")
        _log_exception(logger, RuntimeError("Worker proc died"), "EngineCore failed to start.")
    assert repr(engine_error(str(tmp_path))) == repr(ValueError("No available memory for the cache blocks."))
