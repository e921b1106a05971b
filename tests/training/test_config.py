"""The run config: paper defaults, presets, YAML + overrides, ablation switches, clear errors."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest
import yaml

from phf_megatron.errors import ConfigError
from phf_megatron.training.config import ABLATIONS, ModelConfig, TrainConfig
from phf_megatron.training.config_io import (
    config_from_argv, config_hash, dump_config, field_types, flatten, load_config, resolve_key, resume_fingerprint,
    save_run_config, to_dict,
)

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
PRESETS = ("phf_qwen3_1p7b", "phf_qwen3_4b", "phf_qwen3_8b", "tiny_cpu")

#: The paper's appendix table (Hyperparameters) as config keys.
PAPER_TABLE = {
    "lora.r": 64,                                    # LoRA rank / alpha: 64 / 128
    "lora.alpha": 128,
    "lora.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "optimizer.lr": 5e-6,                            # 5e-6 (cosine)
    "optimizer.lr_decay_style": "cosine",
    "optimizer.clip_grad": 0.1,                      # grad clip
    "training.global_batch_size": 32,                # effective batch
    "training.train_iters": 100,                     # optimizer steps
    "rollout.max_tokens": 1024,                      # rollout length
    "rollout.temperature": 1.1,                      # rollout temp / top-p / top-k
    "rollout.top_p": 0.95,
    "rollout.top_k": 20,
    "objective.jsd_clip": 0.05,                      # JSD token clip (1.7B/4B)
    "objective.flow_alpha": 0.05,                    # flow coefficient
    "objective.ema_decay": 0.999,                    # EMA decay
    "objective.flow_window": 128,                    # hidden window |W|
    "objective.flow_layers": None,                   # all layers ...
    "objective.flow_variant": "phf",                 # ... with neighbouring layer pairs
    # Section 3.1 and the appendix text: the output loss is the Jensen-Shannon divergence (the mixture at 1/2)
    "objective.jsd_beta": 0.5,
    "data.path": "siyanzhao/Openthoughts_math_30k_opsd",  # the official OPSD math set (29,434 rows)
    # appendix "Context rows": SFT on the reference solutions up to 16,000 tokens; GRPO with beta 0 and the
    # rewards normalized within each group (its 8 completions per prompt: tests/tools/test_paper_table.py)
    "sft.max_length": 16000,
    "sft.loss_on_prompt": False,
    "grpo.beta": 0.0,
    "grpo.scale_rewards": "group",
    # appendix text and the official launch script
    "optimizer.num_train_epochs": 30.0,
    "optimizer.lr_warmup_iters": 0,
    "training.micro_batch_size": 4,                  # per-device batch 4 x 8 GPUs
    "teacher.mode": "ema",
    "lora.enabled": True,
    "lora.dropout": 0.05,
}

QWEN3_SHAPES = {  # num_layers, num_attention_heads, num_key_value_heads
    "phf_qwen3_1p7b": (28, 16, 8), "phf_qwen3_4b": (36, 32, 8), "phf_qwen3_8b": (36, 32, 8),
}

#: What a paper-scale preset may change: where things run, not what is optimized.
LAYOUT_KEYS = ("run_dir", "model.", "rollout.backend", "rollout.gpu_memory_utilization", "rollout.tensor_parallel_size",
               "rollout.enable_sleep_mode", "training.micro_batch_size", "logging.tensorboard")


def preset(name: str) -> str:
    return os.path.join(CONFIGS, f"{name}.yaml")


#: The same table's evaluation rows (and appendix "Evaluation Protocol": thinking mode) as EvalConfig fields.
PAPER_EVAL_TABLE = {"n": 12, "temperature": 1.0, "sampling_top_p": 0.95, "top_k": -1, "max_new_tokens": 38_912,
                    "thinking": True, "grader": "official"}


def test_defaults_are_the_paper_table():
    from phf_megatron.eval.config import EvalConfig

    flat = flatten(to_dict(TrainConfig()))
    assert {k: flat[k] for k in PAPER_TABLE} == PAPER_TABLE
    evaluation = EvalConfig(out_dir="o", model="m")
    assert {k: getattr(evaluation, k) for k in PAPER_EVAL_TABLE} == PAPER_EVAL_TABLE


@pytest.mark.parametrize("name", PRESETS[:3])
def test_scale_presets_keep_the_recipe_and_fit_the_model(name):
    cfg = load_config(preset(name))
    default, got = flatten(to_dict(TrainConfig())), flatten(to_dict(cfg))
    changed = {k for k in got if got[k] != default[k]}
    allowed = {k for k in changed if any(k == p or (p.endswith(".") and k.startswith(p)) for p in LAYOUT_KEYS)}
    expected_extra = {"objective.jsd_clip"} if name == "phf_qwen3_8b" else set()
    assert changed - allowed == expected_extra
    assert cfg.objective.jsd_clip == (0.06 if name == "phf_qwen3_8b" else 0.05)  # the paper's per-scale difference
    cfg.model.check_model_shape(*QWEN3_SHAPES[name])
    assert cfg.num_microbatches(world_size=8) * cfg.training.micro_batch_size * cfg.data_parallel_size(8) == 32
    if cfg.rollout.colocate:  # one vLLM engine per model-parallel group of the same GPUs
        assert cfg.rollout.tensor_parallel_size == cfg.model.tensor_model_parallel_size


def test_tiny_cpu_preset_builds(tmp_path):
    cfg = load_config(preset("tiny_cpu"), [f"--model.hf_dir={tmp_path}"])
    cfg.require_inputs()
    assert cfg.num_microbatches(world_size=1) == 2 and cfg.model_format == "per_rank"


def test_overrides_dotted_flat_spaced_and_typed():
    cfg = load_config(preset("phf_qwen3_8b"), [
        "--lr", "1e-5", "--objective.flow_variant=local", "--tensor_model_parallel_size=4",
        "--lora.enabled", "--objective.flow_layers=3,4,5", "--objective.jsd_clip", "none",
        "--rollout.top_k=-1", "--checkpoint.keep_last", "3", "--logging.progress_bar=false",
    ])
    assert cfg.optimizer.lr == 1e-5 and isinstance(cfg.optimizer.lr, float)
    assert cfg.objective.flow_variant == "local"
    assert cfg.model.tensor_model_parallel_size == 4
    assert cfg.lora.enabled is True
    assert cfg.objective.flow_layers == (3, 4, 5)
    assert cfg.objective.jsd_clip is None
    assert cfg.rollout.top_k == -1 and cfg.checkpoint.keep_last == 3 and cfg.logging.progress_bar is False
    assert load_config(argv=["--objective.flow_layers=[0, 2]"]).objective.flow_layers == (0, 2)


def test_yaml_float_without_dot_is_a_float(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  lr: 5e-6\n  min_lr: 0\n")  # PyYAML reads 5e-6 as a string
    cfg = load_config(str(path))
    assert cfg.optimizer.lr == 5e-6 and cfg.optimizer.min_lr == 0.0


@pytest.mark.parametrize("argv, match", [
    (["--objective.flow_varient=local"], r"--objective.flow_varient: unknown setting; did you mean objective.flow_variant"),
    (["--lrr", "1e-5"], r"--lrr: unknown setting; did you mean .*\blr\b"),
    (["--optimizer.lr", "abc"], r"optimizer.lr: expected float, got 'abc'"),
    (["--lora.enabled=maybe"], r"lora.enabled: expected true/false"),
    (["--training.train_iters"], r"--training.train_iters: missing a value"),
    (["lr=1e-5"], r"unexpected argument 'lr=1e-5'"),
])
def test_bad_overrides_name_the_key(argv, match):
    with pytest.raises(ValueError, match=match):
        load_config(argv=argv)


def test_ambiguous_bare_key_lists_owners():
    types_ = {"rollout.temperature": float, "objective.temperature": float}
    with pytest.raises(ValueError, match=r"--temperature: ambiguous, it names rollout.temperature, objective.temperature"):
        resolve_key("temperature", types_)
    leaves = [k.rsplit(".", 1)[-1] for k in field_types()]
    assert len(leaves) == len(set(leaves)), "every bare field name is unique today"


def test_unknown_yaml_key_names_file_and_close_match(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  temprature: 1.0\n")
    with pytest.raises(ValueError, match=r"bad.yaml: unknown key 'rollout.temprature'; did you mean rollout.temperature"):
        load_config(str(path))
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("override, key", [
    ("--training.global_batch_size=30", "training.global_batch_size"),
    ("--objective.flow_variant=foo", "objective.flow_variant"),
    ("--objective.flow_window=1", "objective.flow_window"),
    ("--lora.target_modules=q_proj,qkv", "lora.target_modules"),
    ("--lora.r=0", "lora.r"),
    ("--teacher.mode=frozen", "teacher.mode"),
    ("--rollout.top_p=1.5", "rollout.top_p"),
    ("--rollout.backend=sglang", "rollout.backend"),
    ("--optimizer.min_lr=1e-3", "optimizer.min_lr"),
    ("--optimizer.lr_decay_style=wsd", "optimizer.lr_decay_style"),
    ("--model.recompute_method=none", "model.recompute_method"),
    ("--model.virtual_pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size"),
    ("--checkpoint.model_format=zip", "checkpoint.model_format"),
    ("--logging.log_interval=0", "logging.log_interval"),
    ("--data.max_prompt_length=0", "data.max_prompt_length"),
    ("--objective.top_k_loss=0", "objective.top_k_loss"),
    ("--objective.use_tinker_loss=true", "objective.jsd_clip"),
    ("--rollout.lmbda=1.5", "rollout.lmbda"),
    ("--data.reason_first_max_tokens=0", "data.reason_first_max_tokens"),
    ("--teacher.ema_start=later", "teacher.ema_start"),
    ("--logging.loss_tokens_interval=-1", "logging.loss_tokens_interval"),
])
def test_invalid_values_name_field_and_flag(override, key):
    with pytest.raises(ValueError) as err:
        load_config(argv=[override])
    assert str(err.value).startswith(f"{key}:") and f"--{key}=" in str(err.value)


def test_cross_section_rules():
    with pytest.raises(ValueError, match=r"teacher.mode: 'fixed' .* --lora.enabled=true"):
        load_config(argv=["--teacher.mode=fixed", "--lora.enabled=false"])
    with pytest.raises(ValueError, match=r"training.global_batch_size: 32 rollouts do not split .* rollout.n = 3"):
        load_config(argv=["--rollout.n=3"])
    assert load_config(argv=["--teacher.mode=dynamic", "--lora.enabled=false"]).model_format == "torch_dist"
    # the trainer saves LoRA per_rank and full fine-tuning torch_dist, whatever the setting said (it was ignored)
    with pytest.raises(ValueError, match=r"^checkpoint.model_format: torch_dist: the trainer saves LoRA adapters as "
                                         r"per_rank only; leave it at auto"):
        load_config(argv=["--checkpoint.model_format=torch_dist"])
    with pytest.raises(ValueError, match=r"^checkpoint.model_format: per_rank: the trainer saves the full model as "
                                         r"torch_dist only"):
        load_config(argv=["--checkpoint.model_format=per_rank", "--teacher.mode=dynamic", "--lora.enabled=false"])
    assert load_config(argv=["--tensor_model_parallel_size=1", "--sequence_parallel"]).model.sequence_parallel is False
    with pytest.raises(ValueError, match=r"teacher.ema_start: 'after_first_step' applies to the EMA teacher only"):
        load_config(argv=["--teacher.mode=dynamic", "--teacher.ema_start=after_first_step"])
    with pytest.raises(ValueError, match=r"checkpoint.save_interval: 3 is not a multiple of rollout.sync_interval = 2"):
        load_config(argv=["--rollout.sync_interval=2", "--checkpoint.save_interval=3"])
    with pytest.raises(ValueError, match=r"training.train_iters: 5 is not a multiple of rollout.sync_interval = 2"):
        load_config(argv=["--rollout.sync_interval=2", "--checkpoint.save_interval=4", "--training.train_iters=5"])
    assert load_config(argv=["--rollout.sync_interval=2", "--checkpoint.save_interval=4"]).checkpoint.save_interval == 4
    assert load_config(argv=[]).training.packing is True  # the default: exact, and faster (BENCHMARKS.md)
    assert load_config(argv=["--method=grpo", "--rollout.n=2", "--rollout.top_k=0", "--rollout.top_p=1.0",
                              "--training.packing=false"]).training.packing is False
    assert load_config(argv=["--method=phf", "--training.packing", "--training.max_tokens_per_microbatch=8192"]
                       ).training.max_tokens_per_microbatch == 8192
    grpo = ["--method=grpo", "--rollout.n=2", "--rollout.top_k=0", "--rollout.top_p=1.0", "--training.packing",
            "--training.max_tokens_per_microbatch=8192"]
    for loss_type in ("grpo", "dr_grpo", "dapo"):   # normalized by the step's counts: any grouping, one update
        assert load_config(argv=grpo + [f"--grpo.loss_type={loss_type}"]).training.max_tokens_per_microbatch == 8192
    with pytest.raises(ValueError, match=r"training.max_tokens_per_microbatch: not with grpo.loss_type=bnpo"):
        load_config(argv=grpo + ["--grpo.loss_type=bnpo"])
    budget = ["--method=sft", "--rollout.n=1", "--training.packing", "--training.max_tokens_per_microbatch=4096"]
    assert load_config(argv=budget).training.max_tokens_per_microbatch == 4096
    with pytest.raises(ValueError, match=r"training.max_tokens_per_microbatch: not yet with "
                                         r"model.virtual_pipeline_model_parallel_size"):
        load_config(argv=budget + ["--pipeline_model_parallel_size=2", "--virtual_pipeline_model_parallel_size=2"])


def test_parallel_layout_checks_name_the_flag():
    cfg = load_config(argv=["--tensor_model_parallel_size=2", "--pipeline_model_parallel_size=2"])
    with pytest.raises(ValueError, match=r"model.tensor_model_parallel_size: world size 6 .* = 4"):
        cfg.data_parallel_size(6)
    with pytest.raises(ValueError, match=r"training.global_batch_size: 32 is not a multiple of micro_batch_size x "
                                         r"data-parallel size = 4 x 16"):
        cfg.num_microbatches(64)
    with pytest.raises(ValueError, match=r"model.tensor_model_parallel_size: 3 does not divide the model's "
                                         r"num_key_value_heads \(8\)"):
        ModelConfig(tensor_model_parallel_size=3).check_model_shape(36, 24, 8)
    with pytest.raises(ValueError, match=r"model.pipeline_model_parallel_size: 28 layers .* = 3"):
        ModelConfig(pipeline_model_parallel_size=3).check_model_shape(28, 16, 8)
    with pytest.raises(ValueError, match=r"model.hf_dir: is required.*--model.hf_dir="):
        TrainConfig().require_inputs()


@pytest.mark.parametrize("field,value", [("vocab_size", 151669), ("intermediate_size", 6145)])
def test_a_vocabulary_or_ffn_that_tp_does_not_split_is_named_before_the_model_is_built(field, value):
    """Qwen3-1.7B's shape with a vocabulary resized to the tokenizer (151,669) or an odd FFN: at TP=2 the
    trainer stops with one line naming the flag (it was a traceback from the model builder); the vocabulary
    is never padded, so nothing padded can reach an export, the loss or the sampler."""
    from transformers import Qwen3Config

    from phf_megatron.training.model_setup import check_settings_fit_model

    hf = Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
    cfg = load_config(argv=["--tensor_model_parallel_size=2"])
    check_settings_fit_model(cfg, hf)  # the real shape fits
    setattr(hf, field, value)
    with pytest.raises(ValueError, match=rf"^model.tensor_model_parallel_size: 2 does not divide the model's "
                                         rf"{field} \({value}\)"):
        check_settings_fit_model(cfg, hf)


def test_model_dependent_settings_are_checked_against_the_hf_config(tmp_path):
    from transformers import Qwen3Config

    from phf_megatron.training.model_setup import check_settings_fit_model, read_hf_config

    Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=1024).save_pretrained(tmp_path)
    base = [f"--model.hf_dir={tmp_path}", "--rollout.max_tokens=24"]

    def check(argv):
        cfg = load_config(argv=argv)
        check_settings_fit_model(cfg, hf := read_hf_config(cfg))
        return hf

    with pytest.raises(ValueError, match=r"data.max_prompt_length \+ rollout.max_tokens = 20000 \+ 24 = 20024 "
                                         r"exceeds the model's max_position_embeddings \(1024\)"):
        check(base)
    assert check([*base, "--data.max_prompt_length=1000"]).max_position_embeddings == 1024
    with pytest.raises(ValueError, match=r"objective.flow_layers: .*needs at least one pair of neighbouring layers"):
        check([*base, "--data.max_prompt_length=1000", "--ablation=selected_layers", "--objective.flow_layers=1"])
    with pytest.raises(ValueError, match=r"objective.flow_layers: "):
        check([*base, "--data.max_prompt_length=1000", "--ablation=selected_layers",
               "--objective.flow_layers=0,5"])   # the model has 2 layers
    with pytest.raises(ValueError, match=r"data.reason_first_max_tokens: the reason-first teacher sequence"):
        check([*base, "--data.max_prompt_length=900", "--data.reason_first=true", "--data.reason_first_max_tokens=128"])
    with pytest.raises(ValueError, match=r"objective.top_k_loss: 129 exceeds the model's vocabulary \(128\)"):
        check([*base, "--data.max_prompt_length=1000", "--objective.top_k_loss=129"])
    with pytest.raises(ConfigError, match=r"^rollout.max_tokens: .* = 1000 \+ 5000 = 6000 exceeds .*; lower "
                                          r"rollout.max_tokens"):   # was: blamed data.max_prompt_length
        check([*base, "--data.max_prompt_length=1000", "--rollout.max_tokens=5000"])
    grpo = ["--method=grpo", "--rollout.n=2", "--rollout.top_k=0", "--rollout.top_p=1.0", "--training.train_iters=2"]
    with pytest.raises(ConfigError, match=r"^data.max_prompt_length: .* = 1000 \+ 100 = 1100 exceeds"):  # GRPO rolls
        check([*base, *grpo, "--data.max_prompt_length=1000", "--rollout.max_tokens=100"])  # out too: was unchecked
    assert check([*base, *grpo, "--data.max_prompt_length=1000"]).max_position_embeddings == 1024


def test_hf_dir_without_weights_names_the_flag(tmp_path):
    """The trainer met it as the converter's "hf_dir: neither ...", a flag it does not have."""
    from phf_megatron.training.model_setup import _load_base_weights
    from tests.helpers.tiny_qwen3 import tiny_qwen3_config

    tiny_qwen3_config().save_pretrained(tmp_path)
    cfg = load_config(argv=[f"--model.hf_dir={tmp_path}"])
    with pytest.raises(ConfigError) as err:
        _load_base_weights(None, cfg, None)
    assert err.value.line == f"--model.hf_dir: neither model.safetensors.index.json nor model.safetensors in {tmp_path}"


@pytest.mark.parametrize("name, variant", [
    ("opsd_only", "none"), ("local_only", "local"), ("direction_only", "direction"),
    ("geometry_only", "geometry"), ("pointwise_mse", "pointwise_mse"),
])
def test_ablation_switches_set_the_objective(name, variant):
    cfg = load_config(preset("phf_qwen3_1p7b"), [f"--ablation={name}"])
    assert cfg.ablation == name and cfg.objective.flow_variant == variant
    assert cfg.objective.uses_flow == (name != "opsd_only")
    others = dataclasses.replace(cfg.objective, flow_variant="phf")
    assert dataclasses.asdict(others) == dataclasses.asdict(load_config(preset("phf_qwen3_1p7b")).objective)


def test_selected_layers_ablation_needs_the_subset():
    with pytest.raises(ValueError, match=r"objective.flow_layers: --ablation=selected_layers needs the layer subset"):
        load_config(argv=["--ablation=selected_layers"])
    cfg = load_config(argv=["--ablation", "selected_layers", "--objective.flow_layers=6,7,20,21"])
    assert cfg.objective.flow_variant == "phf" and cfg.objective.flow_layers == (6, 7, 20, 21)
    with pytest.raises(ValueError, match=r"objective.flow_variant: 'phf' contradicts --ablation=geometry_only"):
        load_config(argv=["--ablation=geometry_only", "--objective.flow_variant=phf"])
    with pytest.raises(ValueError, match=r"ablation: 'dir_only' is not one of"):
        load_config(argv=["--ablation=dir_only"])
    assert set(ABLATIONS) == {"opsd_only", "local_only", "direction_only", "geometry_only", "pointwise_mse",
                              "selected_layers"}


@pytest.mark.parametrize("name", PRESETS)
def test_dump_then_load_rebuilds_the_same_config(tmp_path, name):
    cfg = load_config(preset(name), ["--ablation=selected_layers", "--objective.flow_layers=1,2", "--lr=2e-6"])
    path = tmp_path / "run" / "config.yaml"
    dump_config(cfg, str(path))
    assert yaml.safe_load(path.read_text())["optimizer"]["lr"] == 2e-6
    assert load_config(str(path)) == cfg
    assert not [p for p in os.listdir(path.parent) if p.startswith(".tmp-")]


def test_resume_fingerprint_ignores_budget_paths_and_layout_only():
    base = load_config(preset("phf_qwen3_8b"))
    harmless = load_config(preset("phf_qwen3_8b"), [
        "--train_iters=200", "--checkpoint.save_interval=10", "--tensor_model_parallel_size=4",
        "--model.hf_dir=/elsewhere", "--logging.tensorboard=false", "--run_dir=/tmp/other"])
    assert resume_fingerprint(harmless) == resume_fingerprint(base) and config_hash(harmless) == config_hash(base)
    for override in ("--lr=1e-5", "--objective.flow_alpha=0.1", "--lora.r=32", "--rollout.temperature=1.0",
                     "--training.global_batch_size=64", "--data.shuffle_seed=1"):
        changed = load_config(preset("phf_qwen3_8b"), [override])
        assert config_hash(changed) != config_hash(base), override


def test_config_from_argv_and_run_dir_dump(tmp_path):
    argv = ["--lr=1e-5", "--config", preset("phf_qwen3_8b"), f"--run_dir={tmp_path / 'run'}"]
    cfg = config_from_argv(argv)
    assert cfg.objective.jsd_clip == 0.06 and cfg.optimizer.lr == 1e-5
    assert config_from_argv([f"--config={preset('phf_qwen3_8b')}", f"--run_dir={tmp_path / 'run'}", "--lr=1e-5"]) == cfg
    path = save_run_config(cfg)
    assert path == str(tmp_path / "run" / "config.yaml") and load_config(path) == cfg
    with pytest.raises(ValueError, match="--config: missing a file name"):
        config_from_argv(["--config"])


def test_colocate_false_is_refused_by_a_run_not_by_a_saved_config(tmp_path):
    """A run saved with ``rollout.colocate: false`` (accepted and ignored before 4d27446) still loads, so
    mcore_to_hf and the eval read its config.yaml; a run that would start with it is refused, one line."""
    from phf_megatron.errors import ConfigError
    from phf_megatron.training.config_io import load_config

    saved = tmp_path / "config.yaml"
    saved.write_text("model:\n  hf_dir: configs\nrollout:\n  colocate: false\n")
    cfg = load_config(str(saved))
    assert cfg.rollout.colocate is False
    with pytest.raises(ConfigError, match=r"^rollout\.colocate: false is not supported with rollout\.backend=auto"):
        cfg.require_inputs()


@pytest.mark.parametrize("name", ["phf_qwen3_8b", "tiny_cpu"])
def test_help_after_a_preset_shows_its_values_as_the_defaults(capsys, monkeypatch, name):
    """``train --config C --help`` listed the code's defaults (jsd_clip 0.05 for the 8B preset's 0.06): every
    setting's default now is the value --print-config resolves from C, marked where C changes the code's."""
    import re

    for var in ("RANK", "WORLD_SIZE"):   # left by an earlier test's world of one: --print-config would check the
        monkeypatch.delenv(var, raising=False)   # 8B preset's TP 2 against it (commands.launch_world)

    from phf_megatron.cli import _show
    from phf_megatron.train import train

    def shown(argv):
        assert train([*argv, "--help"]) == 0
        out = capsys.readouterr().out
        return out, {m[1]: m[2] for m in re.finditer(r"^  --(\S+)=<.*>  \(default: (.*)\)$", out, re.M)}

    path = os.path.join(CONFIGS, f"{name}.yaml")
    assert train(["--config", path, "--print-config"]) == 0
    resolved = flatten(yaml.safe_load(capsys.readouterr().out))
    code_out, code = shown([])
    out, defaults = shown(["--config", path])
    assert defaults.keys() == code.keys() == resolved.keys()
    for key, value in resolved.items():
        marked = defaults[key].endswith(f" from {path}")
        assert defaults[key].removesuffix(f" from {path}") == _show(value), key
        assert marked == (code[key] != _show(value)), key   # marked where the preset changes the code's
    assert f"The defaults shown are {path}'s" in " ".join(out.split()) and "The defaults shown" not in code_out
    assert any(defaults[k] != code[k] for k in code)


def test_help_after_a_preset_keeps_its_path_whole(tmp_path, capsys):
    """The help's note wrapped the preset's path at a hyphen (CI's /tmp/phf-ci.X/phf-megatron/...: 'phf-' and
    'megatron/...' on two lines), so the path shown could not be copied."""
    from phf_megatron.train import train

    path = tmp_path / ("a-directory-" * 6) / "my-preset.yaml"
    path.parent.mkdir()
    shutil.copy(os.path.join(CONFIGS, "tiny_cpu.yaml"), path)
    assert train(["--config", str(path), "--help"]) == 0
    assert f"The defaults shown are {path}'s" in " ".join(capsys.readouterr().out.split())
