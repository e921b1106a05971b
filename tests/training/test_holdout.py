"""``data.holdout_fraction``: the official SFT / GRPO baselines train on the ``train`` part of
``datasets``' ``train_test_split(test_size, seed=42)``; the trainer keeps the same rows in the same order."""

import pytest

from phf_megatron.data.holdout import holdout_train_indices
from phf_megatron.errors import ConfigError
from phf_megatron.training.config_io import load_config, resume_fingerprint, saved_as_run
from phf_megatron.training.loop import _load_dataset

from ..helpers.tiny_run import make_toy_jsonl


@pytest.mark.parametrize("rows,fraction,seed", [(29434, 0.01, 42), (29434, 0.007, 42), (16, 0.01, 42),
                                                (1000, 0.25, 7), (3, 0.5, 0)])
def test_the_train_part_of_datasets_train_test_split(rows, fraction, seed):
    datasets = pytest.importorskip("datasets")
    split = datasets.Dataset.from_dict({"i": list(range(rows))}).train_test_split(test_size=fraction, seed=seed)
    assert holdout_train_indices(rows, fraction, seed) == split["train"]["i"]


def test_none_held_out_is_every_row_in_file_order_and_none_left_is_an_error():
    assert holdout_train_indices(5, 0.0, 42) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="holds out 1 of 1 row"):
        holdout_train_indices(1, 0.01, 42)


@pytest.mark.parametrize("method,official", [("phf", 0.0), ("sft", 0.01), ("grpo", 0.007)])
def test_unset_is_the_methods_official_script_and_the_resume_fingerprint_says_so(method, official):
    flags = [f"--method={method}", *(["--rollout.n=8", "--rollout.top_k=0", "--rollout.top_p=1.0"] if method == "grpo" else [])]
    cfg = load_config(None, flags)
    assert cfg.data.holdout_fraction is None and cfg.holdout_fraction == official
    assert resume_fingerprint(cfg)["data.holdout_fraction"] == official
    assert load_config(None, [*flags, "--data.holdout_fraction=0"]).holdout_fraction == 0.0
    old = {k: v for k, v in resume_fingerprint(load_config(None, [*flags, "--data.holdout_fraction=0"])).items()
           if not k.startswith("data.holdout")}  # a checkpoint saved before the switch trained every row
    assert saved_as_run(old) == resume_fingerprint(load_config(None, [*flags, "--data.holdout_fraction=0"]))


def test_the_trainer_reads_the_train_part_and_a_bad_fraction_is_one_line(tmp_path):
    data = make_toy_jsonl(str(tmp_path / "toy.jsonl"), rows=16)
    every = _load_dataset(load_config(None, ["--method=phf", f"--data.path={data}"])).rows
    sft = _load_dataset(load_config(None, ["--method=sft", f"--data.path={data}"])).rows
    assert [r.origin for r in sft] == [every[i].origin for i in holdout_train_indices(16, 0.01, 42)]
    assert len(sft) == 15
    with pytest.raises(ConfigError, match=r"^data\.holdout_fraction: 1\.0: must be in \[0, 1\)"):
        load_config(None, ["--data.holdout_fraction=1"])
    one = make_toy_jsonl(str(tmp_path / "one.jsonl"), rows=1)
    with pytest.raises(ConfigError, match=r"^data\.holdout_fraction: 0\.01 \(--method=sft\) holds out 1 of 1 row"):
        _load_dataset(load_config(None, ["--method=sft", f"--data.path={one}"]))
