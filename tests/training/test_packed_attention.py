"""``--model.packed_attention`` (sdpa | varlen: ``models/varlen.py``): listed by ``--help``, checked as a choice,
refused at start-up where it cannot run (each refusal one line naming the setting), handed to the model's config,
and, as a kernel choice, free to change on a resume."""

from __future__ import annotations

import dataclasses

import pytest

from phf_megatron.errors import ConfigError
from phf_megatron.training.config import ModelConfig, TrainConfig
from phf_megatron.training.config_io import resume_fingerprint
from phf_megatron.training.model_setup import _config_overrides, check_packed_attention


def _with(packed: str, packing: bool = True, **model) -> TrainConfig:
    cfg = TrainConfig()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, packed_attention=packed, **model),
                               training=dataclasses.replace(cfg.training, packing=packing))


def test_help_lists_the_setting_with_its_default(capsys):
    from phf_megatron.train import train

    assert train(["--help"]) == 0
    out = capsys.readouterr().out
    assert "  --model.packed_attention=<str>  (default: sdpa)\n" in out
    assert "varlen (one call per layer of PyTorch's varlen flash attention" in " ".join(out.split())


def test_an_unknown_choice_is_one_line():
    with pytest.raises(ConfigError) as err:
        ModelConfig(packed_attention="flash")
    assert err.value.line == "--model.packed_attention: 'flash' is not one of ('sdpa', 'varlen')"


def test_varlen_with_transformer_engine_is_refused(monkeypatch):
    from phf_megatron.models import spec

    monkeypatch.setattr(spec, "resolve_backend", lambda backend: "te")
    with pytest.raises(ConfigError) as err:
        check_packed_attention(_with("varlen", transformer_impl="auto"))
    assert err.value.line == ("--model.packed_attention: 'varlen' is the local spec's attention; "
                              "model.transformer_impl='auto' runs Transformer Engine here, whose THD attention takes "
                              "packed sequences: set model.transformer_impl=local, or leave this at 'sdpa'")
    check_packed_attention(_with("sdpa", transformer_impl="auto"))   # the default: nothing to check


def test_where_varlen_cannot_run_the_reason_is_the_line(monkeypatch):
    from phf_megatron.models import varlen

    monkeypatch.setattr(varlen, "varlen_unavailable", lambda: "packed_attention: 'varlen' runs on CUDA only (why)")
    with pytest.raises(ConfigError) as err:
        check_packed_attention(_with("varlen", transformer_impl="local"))
    assert err.value.line == "--model.packed_attention: 'varlen' runs on CUDA only (why)"
    monkeypatch.setattr(varlen, "varlen_unavailable", lambda: None)
    check_packed_attention(_with("varlen", transformer_impl="local"))


def test_varlen_in_float32_is_refused_where_varlen_could_run(monkeypatch):
    from phf_megatron.models import varlen

    monkeypatch.setattr(varlen, "varlen_unavailable", lambda: None)
    with pytest.raises(ConfigError) as err:
        check_packed_attention(_with("varlen", transformer_impl="local", dtype="float32"))
    assert err.value.line == ("--model.packed_attention: 'varlen' runs PyTorch's flash attention, which takes "
                              "bfloat16 or float16, and the model's dtype is float32: use bfloat16, or 'sdpa'")
    check_packed_attention(_with("varlen", transformer_impl="local", dtype="float16"))


def test_without_packing_varlen_has_no_effect_so_it_is_neither_refused_nor_built(monkeypatch):
    """A run of padded micro-batches never reaches the packed attention: 'varlen' (a GPU config, or a future
    default) must not stop it where varlen cannot run, and its model is built without it (no varlen_call)."""
    from phf_megatron.models import spec, varlen

    monkeypatch.setattr(varlen, "varlen_unavailable", lambda: "packed_attention: 'varlen' runs on CUDA only (why)")
    monkeypatch.setattr(spec, "resolve_backend", lambda backend: "te")
    cfg = _with("varlen", packing=False, transformer_impl="auto", dtype="float32")
    check_packed_attention(cfg)
    assert _config_overrides(cfg)["packed_attention"] == "sdpa"
    with pytest.raises(ConfigError):   # the same settings with packing: refused
        check_packed_attention(_with("varlen", transformer_impl="auto", dtype="float32"))


def test_the_choice_reaches_the_models_config_and_a_resume_may_change_it():
    assert _config_overrides(_with("varlen"))["packed_attention"] == "varlen"
    assert _config_overrides(_with("sdpa"))["packed_attention"] == "sdpa"
    assert resume_fingerprint(_with("varlen")) == resume_fingerprint(_with("sdpa"))


def test_an_export_builds_its_model_without_the_training_kernel_choice():
    """A run trained with 'varlen' (a GPU) exports where there is no CUDA or no varlen_attn: the export's model
    never runs packed micro-batches, and 'varlen' is refused where it cannot run."""
    from phf_megatron.training.export import export_model_config

    cfg = export_model_config(_with("varlen", tensor_model_parallel_size=1), tp=2, pp=2)
    assert cfg.model.packed_attention == "sdpa"
    assert (cfg.model.tensor_model_parallel_size, cfg.model.pipeline_model_parallel_size) == (2, 2)
    assert _config_overrides(cfg)["packed_attention"] == "sdpa"
