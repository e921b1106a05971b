"""``data.holdout_fraction``: the official SFT / GRPO baselines train on the ``train`` part of
``datasets``' ``train_test_split(test_size, seed=42)``; the trainer keeps the same rows in the same order."""

import pytest

from phf_megatron.data.holdout import holdout_train_indices
from phf_megatron.errors import ConfigError
from phf_megatron.training.config import HOLDOUT
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


@pytest.mark.parametrize("method,flags", [("sft", ("--method=sft",)),
                                          ("grpo", ("--method=grpo", "--rollout.n=4", "--rollout.top_k=0",
                                                   "--rollout.top_p=1.0"))])
def test_a_run_saved_before_the_holdout_resumes_on_its_rows_unless_another_fraction_is_given(
        tmp_path, tiny_inputs, capsys, method, flags):
    """Resuming an sft / grpo run whose checkpoint was saved before data.holdout_fraction (every row trained) was
    refused, 'data.holdout_fraction: 0.0 -> 0.01', until --data.holdout_fraction=0 was given. Unset (the method's
    default), it is the checkpoint's, with one note line; a value given that differs is refused as before. The run
    is a finished one (its latest checkpoint at train_iters, its export written): the rerun checks the settings as
    a resume does and stops there, with nothing built."""
    import json
    import os

    from phf_megatron.errors import SettingsDiffer
    from phf_megatron.train import train
    from phf_megatron.training.export import export_dir

    from ..helpers import REPO

    hf, data = tiny_inputs
    argv = ["--config", os.path.join(REPO, "configs", "tiny_cpu.yaml"), f"--run_dir={tmp_path}",
            f"--model.hf_dir={hf}", f"--data.path={data}", "--training.train_iters=2", *flags]
    saved = load_config(argv[1], [*argv[2:], "--data.holdout_fraction=0"])
    ckpt = tmp_path / "checkpoints" / "iter_0000002"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"fingerprint": {   # what the trainer saved before the holdout
        k: v for k, v in resume_fingerprint(saved).items() if not k.startswith("data.holdout")}}, default=str))
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    os.makedirs(export_dir(saved))

    assert train(argv, quiet=False) == 0
    out, err = capsys.readouterr()
    assert f"phf_megatron.train: {tmp_path} is finished (step 2 of 2)" in out
    assert err == (f"note: data.holdout_fraction unset: 0.0, the checkpoint's ({ckpt}; saved before the holdout, "
                   f"its run trained on every row), not --method={method}'s default {HOLDOUT[method]}: the resumed run "
                   "trains on the same rows\n")
    assert train([*argv, "--print-config"]) == 0   # what the rerun trains with, the note too
    out, printed = capsys.readouterr()
    assert "  holdout_fraction: 0.0\n" in out and printed == err
    assert train([*argv, "--data.holdout_fraction=0"], quiet=False) == 0   # given as the checkpoint's: no note
    assert capsys.readouterr().err == ""
    with pytest.raises(SettingsDiffer, match=rf"data\.holdout_fraction: 0\.0 -> {HOLDOUT[method]}"):
        train([*argv, f"--data.holdout_fraction={HOLDOUT[method]}"], quiet=False)   # given: refused as before
    (ckpt / "meta.json").write_text(json.dumps({"fingerprint": resume_fingerprint(load_config(argv[1], argv[2:]))},
                                               default=str))   # saved with the holdout, at the default
    assert train(argv, quiet=False) == 0 and capsys.readouterr().err == ""


def test_an_sft_run_saved_before_the_holdout_resumes_on_every_row(tmp_path, tiny_inputs):
    """The resume itself (the trainer's fingerprint check, its data) on the adopted fraction; the run's config.yaml
    then records it, so that the next resume reads it as given."""
    import json
    import os

    from ..helpers.tiny_run import assert_ok, train

    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    flags = ("--method=sft", "--checkpoint.save_interval=1")
    assert_ok(train(hf, data, run, *flags, "--training.train_iters=1", "--data.holdout_fraction=0"))
    meta = os.path.join(run, "checkpoints", "iter_0000001", "meta.json")
    saved = json.load(open(meta))
    saved["fingerprint"] = {k: v for k, v in saved["fingerprint"].items() if not k.startswith("data.holdout")}
    with open(meta, "w") as f:   # as the trainer saved it before the holdout
        json.dump(saved, f)
    resumed = train(hf, data, run, *flags, "--training.train_iters=2")
    assert_ok(resumed)
    assert f"resuming from step 1 of 2 ({run}/checkpoints/iter_0000001)" in resumed.stdout, resumed.stdout
    assert "note: data.holdout_fraction unset: 0.0, the checkpoint's" in resumed.stderr, resumed.stderr
    assert load_config(os.path.join(run, "config.yaml")).data.holdout_fraction == 0.0


def test_the_seed_is_no_setting_of_a_resume_where_nothing_is_held_out():
    from phf_megatron.training.checkpoint import SettingsDiffer, check_fingerprint

    now = resume_fingerprint(load_config(None, ["--method=phf", "--data.holdout_seed=7"]))
    assert "data.holdout_seed" not in now  # phf holds out 0: the seed draws nothing
    saved = {**now, "data.holdout_seed": 42}  # as saved before the seed was left out
    check_fingerprint({"fingerprint": saved}, now, "ckpt")
    check_fingerprint({"fingerprint": now}, resume_fingerprint(load_config(None, ["--method=phf"])), "ckpt")
    sft = resume_fingerprint(load_config(None, ["--method=sft"]))
    with pytest.raises(SettingsDiffer, match=r"data\.holdout_seed: 42 -> 7"):
        check_fingerprint({"fingerprint": sft}, resume_fingerprint(load_config(None, ["--method=sft", "--data.holdout_seed=7"])), "ckpt")
