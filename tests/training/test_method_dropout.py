"""Dropout per method, as each official trainer: OPSD/PHF's GOLDConfig zeroes every dropout
(``disable_dropout=True``); TRL 0.26's SFTTrainer has no such switch and GRPOConfig defaults it to
False, so the official SFT and GRPO baselines (``sft_train.py``, ``grpo_train.py`` with
``get_peft_config``) train with ModelConfig's LoRA dropout 0.05."""

import pytest
import torch

from phf_megatron.training.config_io import config_from_argv
from phf_megatron.training.model_setup import _config_overrides, student_lora

from ..helpers.tiny_run import assert_ok, read_metrics, train

METHOD_FLAGS = {"phf": (), "sft": ("--method=sft",),
                "grpo": ("--method=grpo", "--rollout.n=8", "--rollout.top_k=0", "--rollout.top_p=1.0")}
#: the official trainer's LoRA dropout at train time (TRL ModelConfig.lora_dropout = 0.05, unless zeroed)
OFFICIAL_LORA_DROPOUT = {"phf": 0.0, "sft": 0.05, "grpo": 0.05}


@pytest.mark.parametrize("method", list(METHOD_FLAGS))
def test_the_default_dropout_is_the_official_trainers(method):
    cfg = config_from_argv(METHOD_FLAGS[method])
    assert cfg.model.disable_dropout is None
    assert student_lora(cfg).dropout == OFFICIAL_LORA_DROPOUT[method]
    zeroed = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    assert (zeroed.items() <= _config_overrides(cfg).items()) == (method == "phf")


@pytest.mark.parametrize("method", list(METHOD_FLAGS))
@pytest.mark.parametrize("disable", [True, False])
def test_an_explicit_setting_wins_for_every_method(method, disable):
    cfg = config_from_argv((*METHOD_FLAGS[method], f"--model.disable_dropout={str(disable).lower()}"))
    assert cfg.dropout_disabled is disable
    assert student_lora(cfg).dropout == (0.0 if disable else 0.05)


def test_an_sft_step_trains_with_lora_dropout_by_default(tiny_inputs, tmp_path):
    """The tiny preset turns dropout off (its tests compare layouts exactly); back at the default the same
    first SFT step (same weights, same rows) has the same loss (LoRA's B starts at 0) and another gradient:
    the adapters' inputs are dropped."""
    hf, data = tiny_inputs
    common = ("--method=sft", "--training.train_iters=1", "--checkpoint.save_interval=0")
    off, default = str(tmp_path / "off"), str(tmp_path / "default")
    assert_ok(train(hf, data, off, *common))
    assert_ok(train(hf, data, default, *common, "--model.disable_dropout=null"))
    (a,), (b,) = read_metrics(off), read_metrics(default)
    assert a["num_tokens"] == b["num_tokens"] and a["loss"] == b["loss"]
    assert a["grad_norm"] != b["grad_norm"], a["grad_norm"]


@pytest.mark.parametrize("method", list(METHOD_FLAGS))
def test_a_checkpoint_saved_when_dropout_defaulted_to_off_resumes_where_the_run_is_the_same(method):
    """Before the per-method default (None) every run saved ``model.disable_dropout: true``: resumed at today's
    default a phf run does the same and resumes; an sft/grpo run now trains with dropout: one line naming it."""
    from phf_megatron.training.checkpoint import SettingsDiffer, check_fingerprint
    from phf_megatron.training.config_io import resume_fingerprint

    saved = {"fingerprint": resume_fingerprint(config_from_argv((*METHOD_FLAGS[method], "--model.disable_dropout=true")))}
    now = resume_fingerprint(config_from_argv(METHOD_FLAGS[method]))
    if method == "phf":
        check_fingerprint(saved, now, "ckpt")
    else:
        with pytest.raises(SettingsDiffer, match="model.disable_dropout: True -> False"):
            check_fingerprint(saved, now, "ckpt")


@pytest.mark.parametrize("method", list(METHOD_FLAGS))
def test_a_checkpoint_saved_with_the_per_method_default_as_none_resumes(method):
    """Between 731af8c and 96a718c a checkpoint's fingerprint held ``model.disable_dropout: null`` (as set: the
    method's default); the run did what today's default does, so it resumes (was 'None -> True' / 'None -> False')."""
    from phf_megatron.training.checkpoint import SettingsDiffer, check_fingerprint
    from phf_megatron.training.config_io import resume_fingerprint

    now = resume_fingerprint(config_from_argv(METHOD_FLAGS[method]))
    check_fingerprint({"fingerprint": {**now, "model.disable_dropout": None}}, now, "ckpt")
    other = not now["model.disable_dropout"]   # the other choice, set explicitly: still another run
    explicit = resume_fingerprint(config_from_argv((*METHOD_FLAGS[method], f"--model.disable_dropout={other}")))
    with pytest.raises(SettingsDiffer, match=f"model.disable_dropout: {not other} -> {other}"):
        check_fingerprint({"fingerprint": {**now, "model.disable_dropout": None}}, explicit, "ckpt")


def _draws_after_init(rank, world_size):
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from phf_megatron.training.distributed import init_distributed

    init_distributed(config_from_argv(("--model.pipeline_model_parallel_size=2", "--training.global_batch_size=4",
                                       "--training.micro_batch_size=1", "--rollout.n=4")))
    with get_cuda_rng_tracker().fork():
        tracker = torch.rand(8)
    return torch.rand(8), tracker


def test_each_pipeline_stage_draws_its_own_dropout_masks():
    """Dropout draws from torch's default generator (column-parallel adapters) and Megatron's tracker (row-parallel
    ones at TP > 1): seeded alike on every pipeline stage, layer i of stage 0 and layer i of stage 1 (equal shapes,
    the same schedule) were dropped with one mask. Stage 1's generators differ from stage 0's (Megatron's seed + 100 x stage)."""
    from ..helpers.spawn import run_ranks

    (default0, tracker0), (default1, tracker1) = run_ranks(_draws_after_init, 2)
    assert not torch.equal(default0, default1) and not torch.equal(tracker0, tracker1)
