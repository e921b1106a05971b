"""A run's ``config.yaml`` saved by an older trainer, read by today's: its conversion, its eval, its resume.

Before 509d1c6 ``checkpoint.model_format`` was read by nothing, and a layout error told LoRA users to set it to
torch_dist: such runs saved their adapters per rank anyway and recorded ``model_format: torch_dist``. Today's
settings check refuses that value as a flag; read from the run's own config.yaml it is what the run did (auto).
"""

from __future__ import annotations

import os

import pytest

from phf_megatron.errors import ConfigError

from ..helpers import run_python
from ..helpers.tiny_run import assert_ok, train


def test_an_old_lora_run_that_recorded_model_format_torch_dist_converts_and_resumes(tiny_inputs, tmp_path, capsys):
    from phf_megatron.train import train as train_main
    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.export import find_run_checkpoint

    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    assert_ok(train(hf, data, run, "--training.train_iters=1", "--checkpoint.save_interval=1"))
    path = os.path.join(run, "config.yaml")
    text = open(path).read()
    assert text.count("  model_format: auto\n") == 1
    with open(path, "w") as f:   # what the older trainer saved, the checkpoint being the same (it ignored the value)
        f.write(text.replace("  model_format: auto\n", "  model_format: torch_dist\n"))

    found = find_run_checkpoint(run)   # mcore_to_hf --mcore_dir RUN, the eval's --megatron_checkpoint RUN
    assert (found.iteration, found.cfg.model_format, found.cfg.checkpoint.model_format) == (1, "per_rank", "auto")
    assert train_main(["--config", path, "--help"]) == 0
    assert "error" not in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"^checkpoint.model_format: torch_dist: the trainer saves LoRA adapters as "
                                         r"per_rank only"):   # given as a flag: refused as before
        load_config(path, ["--checkpoint.model_format=torch_dist"])

    resumed = run_python(["-m", "phf_megatron.train", "--config", path, "--training.train_iters=2"], timeout=600)
    assert_ok(resumed)   # neither the settings check nor the fingerprint (strict_config) refuses it
    assert f"resuming from step 1 of 2 ({run}/checkpoints/iter_0000001)" in resumed.stdout, resumed.stdout
    assert "finished step 2 of 2" in resumed.stdout
    assert "model_format" not in resumed.stderr, resumed.stderr
    assert "  model_format: auto\n" in open(path).read()   # the run's config as it trains now


def test_a_setting_a_runs_config_yaml_refuses_is_named_in_that_file_not_as_a_flag(tmp_path):
    """mcore_to_hf said ``error: --objective.flow_layers: ...``: a flag it has not, and not which file."""
    from phf_megatron.training.config_io import config_from_argv, save_run_config

    from ..helpers import REPO
    from .test_run_config_paths import _checkpoint

    run = str(tmp_path / "run")
    path = save_run_config(config_from_argv([f"--run_dir={run}"]))
    _checkpoint(os.path.join(run, "checkpoints"), 1)
    text = open(path).read()
    with open(path, "w") as f:   # edited by hand
        f.write(text.replace("ablation: null\n", "ablation: selected_layers\n"))
    proc = run_python([os.path.join(REPO, "tools", "convert", "mcore_to_hf.py"), "--mcore_dir", run,
                       "--out_dir", str(tmp_path / "hf")])
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
        f"error: {path}: objective.flow_layers: --ablation=selected_layers needs the layer subset, "
        "e.g. --objective.flow_layers=6,7,20,21"), proc.stderr


@pytest.mark.parametrize("name", ["config.yaml", "lora_torch_dist.yaml"])
def test_a_preset_with_a_format_the_trainer_never_writes_is_refused_whatever_its_file_name(tmp_path, name):
    """A preset named config.yaml was read as a run's own config.yaml by its name alone (its torch_dist as auto),
    while a run's own is one with every top-level setting (``is_run_config``): refused as any preset is."""
    from phf_megatron.training.config_io import load_config

    preset = tmp_path / name
    preset.write_text("lora:\n  enabled: true\ncheckpoint:\n  model_format: torch_dist\n")
    with pytest.raises(ConfigError, match=r"^checkpoint.model_format: torch_dist: the trainer saves LoRA adapters as "
                                          r"per_rank only"):
        load_config(str(preset))


@pytest.mark.parametrize("older", [(), ("grpo",), ("method", "sft", "grpo")])
def test_a_runs_config_yaml_with_a_format_its_trainer_ignored_reads_as_auto(tmp_path, older):
    """Saved by today's trainer, and by one before the grpo section (97b5b9f) or method and sft (a13f4fd)."""
    import yaml

    from phf_megatron.training.config_io import config_from_argv, load_config, save_run_config

    path = save_run_config(config_from_argv([f"--run_dir={tmp_path}", "--lora.enabled=true"]))
    tree = yaml.safe_load(open(path))
    tree["checkpoint"]["model_format"] = "torch_dist"
    with open(path, "w") as f:
        yaml.safe_dump({k: v for k, v in tree.items() if k not in older}, f)
    cfg = load_config(path)
    assert (cfg.checkpoint.model_format, cfg.model_format, cfg.run_dir) == ("auto", "per_rank", str(tmp_path))
