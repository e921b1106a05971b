"""Bad converter input fails with a clear error before any output exists."""

import json
import os
import shutil

import pytest

from phf_megatron.convert.checkpoints import convert_hf_to_mcore, convert_mcore_to_hf
from phf_megatron.models.qwen3_arch import Qwen3Arch

from ..helpers.tiny_qwen3 import save_tiny_hf, tiny_config, tiny_hf_model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_tiny_hf(tiny_hf_model("gqa"), str(tmp_path_factory.mktemp("hf")), with_tokenizer=False)


def _copy(src, dst):
    os.makedirs(dst)
    for f in os.listdir(src):
        with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
            b.write(a.read())
    return dst


def _edit_config(path, **changes):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)


def _expect_no_output(tmp_path, hf, exc, match, **kw):
    out = str(tmp_path / "out")
    with pytest.raises(exc, match=match):
        convert_hf_to_mcore(hf, out, progress=False, **kw)
    assert not os.path.exists(out) and not os.path.exists(out + ".tmp")


def test_non_qwen3_architecture(tmp_path, hf_dir):
    bad = _copy(hf_dir, str(tmp_path / "llama"))
    _edit_config(bad, model_type="llama", architectures=["LlamaForCausalLM"])
    _expect_no_output(tmp_path, bad, ValueError, "model_type.*qwen3.*llama")


def test_missing_shard_file(tmp_path, hf_dir):
    bad = _copy(hf_dir, str(tmp_path / "missing"))
    shard = sorted(f for f in os.listdir(bad) if f.endswith(".safetensors"))[3]
    os.remove(os.path.join(bad, shard))
    _expect_no_output(tmp_path, bad, FileNotFoundError, shard)


def test_partial_shards_missing_tensor(tmp_path, hf_dir):
    bad = _copy(hf_dir, str(tmp_path / "partial"))
    index_path = os.path.join(bad, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    del index["weight_map"]["model.layers.2.mlp.up_proj.weight"]
    with open(index_path, "w") as f:
        json.dump(index, f)
    _expect_no_output(tmp_path, bad, ValueError, "model.layers.2.mlp.up_proj.weight")


@pytest.mark.parametrize("tp, what", [(3, "num_attention_heads"), (4, "query groups")])
def test_tp_must_divide_heads_and_groups(tmp_path, hf_dir, tp, what):
    _expect_no_output(tmp_path, hf_dir, ValueError, f"tp.*{what}", tp=tp)


def test_pp_must_divide_layers(tmp_path, hf_dir):
    _expect_no_output(tmp_path, hf_dir, ValueError, "pp.*num_hidden_layers", pp=3)


@pytest.mark.parametrize("changes, match", [
    (dict(num_hidden_layers=3), "not implied by config.json"),
    (dict(intermediate_size=80), r"mlp\.\w+_proj\.weight has shape \(\d+, \d+\), config.json implies"),
    (dict(num_key_value_heads=4), r"[kv]_proj.weight has shape"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings=true but lm_head.weight differs"),
])
def test_config_contradicting_the_weights(tmp_path, hf_dir, changes, match):
    bad = _copy(hf_dir, str(tmp_path / "contradict"))
    _edit_config(bad, **changes)
    _expect_no_output(tmp_path, bad, ValueError, match)


def test_existing_output_directory(tmp_path, hf_dir):
    out = tmp_path / "exists"
    out.mkdir()
    with pytest.raises(FileExistsError, match="exists"):
        convert_hf_to_mcore(hf_dir, str(out), progress=False)
    assert os.listdir(out) == []


def test_mcore_dir_without_metadata(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError, match=r"not a Megatron-Core dist checkpoint \(no metadata.json\)"):
        convert_mcore_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"), progress=False)
    (tmp_path / "ckpt" / "metadata.json").write_text("{}")   # a dist checkpoint hf_to_mcore did not write
    with pytest.raises(FileNotFoundError, match="phf_megatron.json .* pass --hf_config"):
        convert_mcore_to_hf(str(tmp_path / "ckpt"), str(tmp_path / "out"), progress=False)
    assert not os.path.exists(tmp_path / "out")
    training = tmp_path / "run" / "checkpoints" / "iter_0000004"   # phf_megatron.train's checkpoint
    training.mkdir(parents=True)
    (training / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=r"training checkpoint .* --adapter .*run/export/peft_adapter"):
        convert_mcore_to_hf(str(training), str(tmp_path / "out"), progress=False)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("changes, match", [
    (dict(attention_bias=True), "attention_bias"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "rope"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
])
def test_unsupported_configs(changes, match):
    raw = {**tiny_config("gqa").to_dict(), **changes}
    with pytest.raises(ValueError, match=match):
        Qwen3Arch.from_hf(raw)


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads"])
def test_a_config_missing_a_size_is_one_line(tmp_path, capsys, key):
    """A config.json without one of the model's sizes (a hand-written or truncated-by-editor config) was a
    KeyError traceback in Qwen3Arch.from_hf; it is a ValueError naming the key, which the converters name
    with the file."""
    from phf_megatron.tools.hf_to_mcore import main

    raw = {k: v for k, v in tiny_config("gqa").to_dict().items() if k != key}
    with pytest.raises(ValueError, match=rf"^{key}: missing from the config$"):
        Qwen3Arch.from_hf(raw)
    model = tmp_path / "hf"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(raw))
    assert main(["--hf_dir", str(model), "--out_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {model / 'config.json'}: {key}: missing from the config"


def _training_checkpoints(save_dir, iterations, latest=None):
    """What phf_megatron.train leaves: iter_N directories (meta.json) and the latest file naming one."""
    for i in iterations:
        os.makedirs(save_dir / f"iter_{i:07d}")
        (save_dir / f"iter_{i:07d}" / "meta.json").write_text(json.dumps({"iteration": i}))
    if latest is not None:
        (save_dir / "latest_checkpointed_iteration.txt").write_text(str(latest))


@pytest.mark.parametrize("given, latest, line", [
    # a checkpoints directory without its latest file: was "no phf_megatron.json in ... pass --hf_config"
    ("{ckpts}", None, "--mcore_dir: {ckpts} has no latest_checkpointed_iteration.txt: give one of its checkpoints "
                      "(iter_0000002, iter_0000004)"),
    ("{run}", None, "--mcore_dir: {ckpts} has no latest_checkpointed_iteration.txt: give one of its checkpoints "
                    "(iter_0000002, iter_0000004)"),   # was "no checkpoint of the run yet"
    ("{ckpts}/iter_0000003", 4, "--mcore_dir: {ckpts}/iter_0000003 does not exist (checkpoints there: "
                                "iter_0000002, iter_0000004)"),
    ("{run}", 6, "{ckpts}/latest_checkpointed_iteration.txt: names iteration 6, but {ckpts}/iter_0000006 does not "
                 "exist (checkpoints there: iter_0000002, iter_0000004)"),   # was "[Errno 2] ... meta.json"
])
def test_mcore_to_hf_names_the_checkpoints_it_found(tmp_path, capsys, given, latest, line):
    """A checkpoints directory that names no iteration, or a wrong iteration: the one line lists the
    iter_N directories there, for the user to pick one."""
    from phf_megatron.tools.mcore_to_hf import main

    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    _training_checkpoints(ckpts, (2, 4), latest)
    (run / "config.yaml").write_text("run_dir: run\n")
    assert main(["--mcore_dir", given.format(run=run, ckpts=ckpts), "--out_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: " + line.format(run=run, ckpts=ckpts)]
    assert not (tmp_path / "out").exists()


def test_a_long_list_of_checkpoints_shows_its_first_and_last(tmp_path):
    from phf_megatron.input_files import checkpoint_names

    _training_checkpoints(tmp_path, range(1, 13))
    os.makedirs(tmp_path / "tmp-iter_0000013")   # an unfinished save: not one to pick
    assert checkpoint_names(str(tmp_path)) == "iter_0000001, ..., iter_0000010, iter_0000011, iter_0000012 (12 in all)"
    assert checkpoint_names(str(tmp_path / "nowhere")) == "none"


def test_a_tokenizer_config_alone_is_no_tokenizer(tmp_path, hf_dir):
    """hf_to_mcore counted tokenizer_config.json alone as a tokenizer: a --hf_dir whose vocabulary files
    were gone converted, and mcore_to_hf exported a model without them (transformers loads 26 tokens)."""
    from phf_megatron.errors import InputFileError
    from phf_megatron.tokenizer import shipped_tokenizer_dir

    hf = _copy(hf_dir, str(tmp_path / "hf"))
    for name in ("tokenizer_config.json", "vocab.json"):   # merges.txt lost
        shutil.copy(os.path.join(shipped_tokenizer_dir(), name), hf)
    _expect_no_output(tmp_path, hf, InputFileError,
                      rf"^{hf}: no tokenizer files \(tokenizer.json, or vocab.json and merges.txt\)",
                      require_tokenizer=True)


def test_a_damaged_tokenizer_file_is_named_not_copied_on(tmp_path, hf_dir):
    """Both converters copied a cut tokenizer.json on without reading it: the exported model then failed
    to load far from the culprit (its copy named, or a JSONDecodeError traceback from transformers)."""
    from phf_megatron.errors import InputFileError

    from ..helpers.tiny_qwen3 import copy_tokenizer

    hf = copy_tokenizer(_copy(hf_dir, str(tmp_path / "hf")))
    mcore = str(tmp_path / "mcore")
    convert_hf_to_mcore(hf, mcore, progress=False, require_tokenizer=True)
    with open(os.path.join(hf, "tokenizer.json"), "r+b") as f:
        f.truncate(1000)
    _expect_no_output(tmp_path, hf, InputFileError, rf"^{hf}/tokenizer.json: not a valid tokenizer file \(")
    stored = os.path.join(mcore, "hf_tokenizer", "tokenizer_config.json")
    with open(stored, "r+b") as f:
        f.truncate(100)
    with pytest.raises(InputFileError, match=rf"^{stored}: not a valid tokenizer file \("):
        convert_mcore_to_hf(mcore, str(tmp_path / "out"), progress=False)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("tool", ["hf_to_mcore", "mcore_to_hf"])
def test_a_launch_of_ranks_that_do_not_fit_tp_x_pp_is_one_line(tmp_path, capsys, monkeypatch, hf_dir, tool):
    """``torchrun --nproc-per-node 3`` (RANK and WORLD_SIZE set) for a converter whose --tp x --pp is 2: was a
    ValueError traceback, exit code 1; now one line naming WORLD_SIZE and the flags, exit code 2, no output."""
    import importlib

    from ..helpers.tiny_qwen3 import copy_tokenizer

    main = importlib.import_module(f"phf_megatron.tools.{tool}").main
    hf = copy_tokenizer(_copy(hf_dir, str(tmp_path / "hf")))
    if tool == "hf_to_mcore":
        argv = ["--hf_dir", hf]
    else:
        convert_hf_to_mcore(hf, str(tmp_path / "mcore"), progress=False)
        argv = ["--mcore_dir", str(tmp_path / "mcore")]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main([*argv, "--out_dir", str(tmp_path / "out"), "--tp", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: WORLD_SIZE=3: launched with 3 ranks; expected 1 or tp x pp = 2 (--tp 2 --pp 1)"]
    assert not (tmp_path / "out").exists()
