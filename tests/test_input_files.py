"""Damaged input files are errors that name the file (phf_megatron/input_files.py), and the
command lines print them as one line: truncated / corrupt safetensors, a config.json that is not
JSON, truncated torch and dist checkpoint files, a bad JSONL line."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch
from safetensors.torch import save_file

from phf_megatron.errors import InputFileError
from phf_megatron.convert.dist_files import _damaged_dist_file, reading_dist_checkpoint
from phf_megatron.input_files import check_hf_model_dir, load_torch_file, open_safetensors, read_json
from tests.helpers import run_python


def _truncate(path, keep: float = 0.5) -> None:
    with open(path, "r+b") as f:
        f.truncate(int(os.path.getsize(path) * keep))


@pytest.mark.parametrize("content, detail", [
    ("", "not valid JSON (the file is empty)"),
    ('{"model_type": "qwen3",', "not valid JSON: Expecting property name enclosed in double quotes at line 1"),
    (b'{"a": "\xff"}', "not valid JSON (not UTF-8 text at byte 7)"),
    ('{"model_type": "qw', "not valid JSON: Unterminated string starting at line 1 column 16"),   # was "at at"
])
def test_bad_json_names_the_file(tmp_path, content, detail):
    path = tmp_path / "config.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputFileError) as err:
        read_json(str(path))
    assert err.value.path == str(path) and err.value.detail.startswith(detail), err.value.detail


@pytest.mark.parametrize("keep", [0.5, 0.002, 0.0])
def test_truncated_safetensors_names_the_file(tmp_path, keep):
    path = str(tmp_path / "model.safetensors")
    save_file({"a": torch.zeros(1000), "b": torch.ones(10)}, path)
    with open_safetensors(path) as f:
        assert sorted(f.keys()) == ["a", "b"]
    _truncate(path, keep)
    with pytest.raises(InputFileError, match=r"model.safetensors: not a readable safetensors file, truncated or "
                                             r"corrupt \(Error while deserializing header"):
        open_safetensors(path)


def test_truncated_torch_file_names_the_file(tmp_path):
    path = str(tmp_path / "rank_tp00_pp000_dp000.pt")
    torch.save({"w": torch.arange(1000.0)}, path)
    assert torch.equal(load_torch_file(path, weights_only=True)["w"], torch.arange(1000.0))
    _truncate(path)
    with pytest.raises(InputFileError, match=r"rank_tp00_pp000_dp000.pt: not a readable torch file, truncated or "
                                             r"corrupt \(PytorchStreamReader failed"):
        load_torch_file(path, weights_only=True)


def test_hf_model_dir_check_names_the_damaged_file(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    save_file({"w": torch.zeros(64)}, str(hf / "model.safetensors"))
    check_hf_model_dir(str(hf), weights=True)
    _truncate(hf / "model.safetensors")
    with pytest.raises(InputFileError, match=r"/hf/model.safetensors: not a readable safetensors file"):
        check_hf_model_dir(str(hf))
    (hf / "config.json").write_text("{")
    with pytest.raises(InputFileError, match=r"/hf/config.json: not valid JSON"):
        check_hf_model_dir(str(hf))
    (hf / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (hf / "generation_config.json").write_text('{"eos_token_id": [1')   # transformers, vLLM: skipped in silence
    with pytest.raises(InputFileError, match=r"/hf/generation_config.json: not valid JSON"):
        check_hf_model_dir(str(hf))
    os.remove(hf / "generation_config.json")
    os.remove(hf / "model.safetensors")   # the eval's engine raised EngineStartError with its traceback
    check_hf_model_dir(str(hf))
    with pytest.raises(FileNotFoundError, match=r"/hf: no model.safetensors or model.safetensors.index.json"):
        check_hf_model_dir(str(hf), weights=True)
    torch.save({"w": torch.zeros(4)}, hf / "pytorch_model.bin")   # PyTorch weights: vLLM and transformers load them
    check_hf_model_dir(str(hf), weights=True)
    # a shard its index lists is missing (a download cut short): the engine's EngineStartError traceback
    save_file({"w": torch.zeros(4)}, str(hf / "model-00001-of-00002.safetensors"))
    index = hf / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError) as err:
        check_hf_model_dir(str(hf), weights=True)
    assert str(err.value) == f"{hf / 'model-00002-of-00002.safetensors'}: missing (listed in {index})"
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(InputFileError, match=r"index.json: expected a JSON object with a 'weight_map' object"):
        check_hf_model_dir(str(hf), weights=True)


@pytest.mark.parametrize("content, detail", [
    (b"lora:\n  r: \x80\x81\n", "not valid YAML (unacceptable character #x0080"),   # was a UnicodeDecodeError traceback
    (b"- lora\n", "expected a mapping of sections, got list"),
    (b"lora: 8\n", "section 'lora': expected a mapping of its fields, got 8"),   # was "unknown key 'lora'"
    (b"lora:\n", "section 'lora': expected a mapping of its fields, got None"),
    (b"lora: {rank: 8}\n", "unknown key 'lora.rank'"),
    # a YAML file takes only dotted keys: the suggestions were "lr, r" and "model.hf_dir, hf_dir" (bare flag names)
    (b"lr: 1.0e-5\n", "unknown key 'lr'; did you mean optimizer.lr, lora.r?"),
    (b"model:\n  hf_dirr: x\n", "unknown key 'model.hf_dirr'; did you mean model.hf_dir?"),
    # a bad value is the file's: it was "--optimizer.lr: expected float, got 'abc'", a flag nobody gave
    (b"optimizer:\n  lr: abc\n", "optimizer.lr: expected float, got 'abc'"),
    (b"training:\n  train_iters: 1.5\n", "training.train_iters: expected int, got 1.5"),
])
def test_bad_config_yaml_names_the_file(tmp_path, content, detail):
    from phf_megatron.training.config_io import read_yaml

    path = tmp_path / "preset.yaml"
    path.write_bytes(content)
    with pytest.raises(InputFileError) as err:
        read_yaml(str(path))
    assert err.value.path == str(path) and err.value.detail.startswith(detail), err.value.detail


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_damaged_tokenizer_file_is_named(tmp_path, name):
    """A cut tokenizer file was a JSONDecodeError traceback from transformers (trainer and eval)."""
    from phf_megatron.tokenizer import load_qwen3_tokenizer
    from tests.helpers.tiny_qwen3 import copy_tokenizer

    (tmp_path / "tok").mkdir()
    tok = copy_tokenizer(str(tmp_path / "tok"))
    assert load_qwen3_tokenizer(tok).chat_template
    _truncate(os.path.join(tok, name))
    with pytest.raises(InputFileError) as err:
        load_qwen3_tokenizer(tok)
    assert err.value.path == os.path.join(tok, name) and err.value.detail.startswith("not a valid tokenizer file")


def test_damaged_config_json_beside_the_tokenizer_is_named(tmp_path):
    """The trainer loads --model.hf_dir's tokenizer first, and AutoTokenizer reads config.json too: a cut one was
    transformers' OSError traceback (exit code 1), not the README's one line naming the file."""
    from phf_megatron.tokenizer import load_qwen3_tokenizer
    from tests.helpers.tiny_qwen3 import copy_tokenizer

    (tmp_path / "hf").mkdir()
    hf = copy_tokenizer(str(tmp_path / "hf"))
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "qwen3",')
    with pytest.raises(InputFileError) as err:
        load_qwen3_tokenizer(hf)
    assert err.value.path == os.path.join(hf, "config.json") and err.value.detail.startswith("not a valid JSON file")


def test_training_checkpoint_files_are_named(tmp_path):
    from phf_megatron.training import checkpoint as ckpt
    from phf_megatron.training.checkpoint_parts import RankLayout, tensors_part

    weights = {"w": torch.arange(4096.0)}
    path = ckpt.save_checkpoint(str(tmp_path), 3, {"adapters": tensors_part(weights)}, RankLayout())
    [tensor_file] = [f for f in os.listdir(path) if f.endswith(".pt")]
    _truncate(os.path.join(path, tensor_file))
    with pytest.raises(InputFileError, match=rf"iter_0000003/{tensor_file}: not a readable torch file"):
        ckpt.load_checkpoint(str(tmp_path), {"adapters": tensors_part(weights)}, RankLayout())
    with open(os.path.join(path, "meta.json"), "w") as f:
        f.write('{"format_version": ')
    with pytest.raises(InputFileError, match=r"iter_0000003/meta.json: not valid JSON"):
        ckpt.load_checkpoint(str(tmp_path), {"adapters": tensors_part(weights)}, RankLayout())
    (tmp_path / ckpt.LATEST_FILE).write_text("3x\n")
    with pytest.raises(InputFileError, match=r"latest_checkpointed_iteration.txt: expected an iteration number"):
        ckpt.read_latest(str(tmp_path))


@pytest.mark.parametrize("damage, culprit, detail", [
    ("__0_0.distcp", "__0_0.distcp", "truncated: "),
    (".metadata", ".metadata", "unreadable, truncated or corrupt (UnpicklingError"),
])
def test_dist_checkpoint_names_the_damaged_file(tmp_path, damage, culprit, detail):
    """A torch_dist checkpoint (what Megatron's dist_checkpointing writes): the reader's error
    ("EOFError", "pickle data was truncated") becomes one naming the file, found from .metadata."""
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.arange(50_000.0), "b": torch.ones(3)}
    dcp.save(state, checkpoint_id=str(tmp_path))
    assert _damaged_dist_file(str(tmp_path)) is None
    _truncate(tmp_path / damage)
    target = {"w": torch.zeros(50_000), "b": torch.zeros(3)}
    with pytest.raises(InputFileError) as err:
        with reading_dist_checkpoint(str(tmp_path)):
            dcp.load(target, checkpoint_id=str(tmp_path))
    assert err.value.path == str(tmp_path / culprit) and err.value.detail.startswith(detail), err.value


@pytest.mark.parametrize("gone", ["metadata.json", "common.pt", ".metadata"])
def test_a_megatron_dist_checkpoint_without_one_of_its_files_names_it(tmp_path, gone):
    """Megatron's loader raised its CheckpointingException ("... is not a distributed checkpoint") or, without
    common.pt, "AttributeError: 'str' object has no attribute 'iterdir'": tracebacks naming no file."""
    from torch.distributed.checkpoint.metadata import Metadata

    from phf_megatron.convert.dist_files import load_dist_checkpoint

    for name in {"metadata.json", "common.pt", ".metadata"} - {gone}:
        (tmp_path / name).write_bytes(pickle.dumps(Metadata({})) if name == ".metadata" else b"{}")
    with pytest.raises(InputFileError) as err:
        load_dist_checkpoint({}, str(tmp_path))
    assert err.value.line == f"{tmp_path / gone}: missing (not a complete torch_dist checkpoint)"


@pytest.mark.parametrize("damage, said", [
    ("cut", "unreadable, truncated or corrupt (UnpicklingError"),
    ("list", "unreadable, truncated or corrupt (a pickled list, not torch.distributed.checkpoint's Metadata)"),
    ("no module", "unreadable, truncated or corrupt (ModuleNotFoundError"),
])
def test_a_damaged_metadata_without_common_pt_is_one_line_naming_it(tmp_path, damage, said):
    """Without common.pt the loader reads .metadata for Megatron-Core 0.19's common state: a second reading that
    caught fewer errors than the damage check's, so a .metadata naming a class of no module was a
    ModuleNotFoundError traceback, and a cut one or a pickled list was blamed on common.pt ('missing')."""
    import torch.distributed.checkpoint as dcp

    from phf_megatron.convert.dist_files import load_dist_checkpoint

    dcp.save({"w": torch.ones(3), "b": torch.ones(2)}, checkpoint_id=str(tmp_path))
    (tmp_path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    metadata = tmp_path / ".metadata"
    if damage == "cut":
        metadata.write_bytes(metadata.read_bytes()[:40])
    else:
        metadata.write_bytes(pickle.dumps([1, 2]) if damage == "list" else b"cno_such_module\nThing\n.")
    with pytest.raises(InputFileError) as err:
        load_dist_checkpoint({}, str(tmp_path))
    assert err.value.path == str(metadata) and err.value.detail.startswith(said), err.value


def test_a_megatron_0_19_dist_checkpoint_without_common_pt_is_read(tmp_path, monkeypatch):
    """Megatron-Core 0.19 (the GPU image's 0.19.2) saves no common.pt: the common state is a DCP object,
    'common_state/shard_0_1' in .metadata. Every such checkpoint (a full fine-tuning's, hf_to_mcore's, read by
    --model.pretrained_checkpoint, mcore_to_hf and a resume) was refused as 'common.pt: missing'. Written here as
    0.19 writes it (torch's DCP, the installed Megatron's loader standing in for 0.19's, which reads it)."""
    import io

    import torch.distributed.checkpoint as dcp
    from megatron.core import dist_checkpointing

    from phf_megatron.convert.dist_files import load_dist_checkpoint

    dcp.save({"w": torch.ones(3), "common_state/shard_0_1": io.BytesIO(b"common")}, checkpoint_id=str(tmp_path))
    (tmp_path / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    monkeypatch.setattr(dist_checkpointing, "load", lambda state, ckpt_dir: {"read": ckpt_dir})
    assert load_dist_checkpoint({}, str(tmp_path)) == {"read": str(tmp_path)}
    dcp.save({"w": torch.ones(3)}, checkpoint_id=str(tmp_path))   # an older one's common.pt is still required
    with pytest.raises(InputFileError, match="common.pt: missing"):
        load_dist_checkpoint({}, str(tmp_path))


# ----------------------------------------------------------------------------- through the command lines




def test_converter_reports_a_truncated_shard_as_one_line(tmp_path):
    from .helpers.tiny_qwen3 import save_tiny_hf, tiny_hf_model

    hf = save_tiny_hf(tiny_hf_model("gqa"), str(tmp_path / "hf"), with_tokenizer=False)
    shard = sorted(f for f in os.listdir(hf) if f.endswith(".safetensors"))[1]
    _truncate(os.path.join(hf, shard))
    proc = run_python(["tools/convert/hf_to_mcore.py", "--hf_dir", hf, "--out_dir", str(tmp_path / "out")])
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: {os.path.join(hf, shard)}: not a readable safetensors file, truncated or corrupt")
    assert not (tmp_path / "out").exists()


def test_trainer_reports_a_bad_jsonl_line_as_one_line(tmp_path):
    from .helpers.tiny_qwen3 import make_tiny_hf
    from .helpers.tiny_run import make_toy_jsonl

    hf, data = make_tiny_hf(str(tmp_path / "hf")), make_toy_jsonl(str(tmp_path / "toy.jsonl"), rows=4)
    with open(data, "a") as f:
        f.write('{"problem": "1+1", "solution": \n')
    proc = run_python(["-m", "phf_megatron.train", "--config", "configs/tiny_cpu.yaml", f"--model.hf_dir={hf}",
                 f"--data.path={data}", f"--run_dir={tmp_path / 'run'}", "--rollout.backend=hf"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith(f"error: {data}:5: invalid JSON"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
