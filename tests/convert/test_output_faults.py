"""The converters on a full disk, a read-only output directory and inputs they cannot use: one
line (``error: ...``), exit code 2, no traceback, and nothing left under the output's name (nor
its ``.tmp``).

The full disk is real: a 64 KiB tmpfs (the tiny checkpoints need ~200 KiB), so the failure is
whatever the libraries make of ENOSPC (torch's zip writer says "unexpected pos 704 vs 598",
safetensors "os error 28"); the line must say "No space left on device".
"""

from __future__ import annotations

import json
import os
import re

import pytest

from ..helpers import REPO, run_python
from ..helpers.mounts import read_only_dir, small_tmpfs
from ..helpers.tiny_qwen3 import save_tiny_hf, tiny_hf_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A HF dir with a tokenizer, one without, and the first one's dist checkpoint."""
    from phf_megatron.convert.checkpoints import convert_hf_to_mcore

    root = tmp_path_factory.mktemp("faults")
    model = tiny_hf_model("gqa")
    hf = save_tiny_hf(model, str(root / "hf"))
    bare = save_tiny_hf(model, str(root / "bare"), with_tokenizer=False)
    mcore = str(root / "mcore")
    convert_hf_to_mcore(hf, mcore, progress=False)
    return dict(hf=hf, bare=bare, mcore=mcore)


def _one_line(tool: str, argv: list[str]) -> str:
    """The tool's command line as a user runs it (quiet start): its one line besides the progress bars."""
    proc = run_python([os.path.join(REPO, "tools", "convert", f"{tool}.py"), *argv], CUDA_VISIBLE_DEVICES="")
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines()   # (the bars, the phases' lines)
             if line.strip() and not re.search(r"\d+%\||^(hf->mcore save|mcore->hf load): ", line)]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def _nothing_left(out: str) -> None:
    assert not os.path.lexists(out) and not os.path.lexists(out + ".tmp")


def test_hf_to_mcore_on_a_full_disk(tmp_path, dirs):
    with small_tmpfs(str(tmp_path / "full")) as full:
        out = os.path.join(full, "mcore")
        line = _one_line("hf_to_mcore", ["--hf_dir", dirs["hf"], "--out_dir", out])
        assert line.startswith(f"error: {out}.tmp: cannot write: No space left on device")
        _nothing_left(out)
        assert os.listdir(full) == []             # the partial checkpoint is gone: the space is back


def test_mcore_to_hf_on_a_full_disk(tmp_path, dirs):
    with small_tmpfs(str(tmp_path / "full")) as full:
        out = os.path.join(full, "hf")
        line = _one_line("mcore_to_hf", ["--mcore_dir", dirs["mcore"], "--out_dir", out])
        assert line.startswith(f"error: {out}.tmp: cannot write: No space left on device")
        _nothing_left(out)
        assert os.listdir(full) == []


@pytest.mark.parametrize("tool", ["hf_to_mcore", "mcore_to_hf"])
def test_converters_into_a_read_only_directory(tmp_path, dirs, tool):
    with read_only_dir(str(tmp_path / "ro")) as ro:
        out = os.path.join(ro, "out")
        argv = ["--hf_dir", dirs["hf"]] if tool == "hf_to_mcore" else ["--mcore_dir", dirs["mcore"]]
        line = _one_line(tool, [*argv, "--out_dir", out])
        why = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
        assert line == f"error: {out}.tmp: cannot write: {why}"
        _nothing_left(out)


@pytest.mark.parametrize("extra", [
    [],   # was "--mcore_dir: no phf_megatron.json in ... (not written by hf_to_mcore; pass --hf_config to export it)"
    ["--hf_config", "{hf}/config.json"],   # was "--mcore_dir: no tokenizer found (looked in [...]); pass --tokenizer_dir"
    ["--hf_config", "{hf}/config.json", "--tokenizer_dir", "{hf}"],
])
def test_mcore_to_hf_on_a_directory_that_is_not_a_dist_checkpoint(tmp_path, dirs, extra):
    """A HF model given as --mcore_dir is named as no dist checkpoint, whatever else is given: the lines it got
    before sent the user on to --hf_config, then to --tokenizer_dir, neither of which could load it."""
    out = str(tmp_path / "out")
    line = _one_line("mcore_to_hf", ["--mcore_dir", dirs["hf"], *[a.format(hf=dirs["hf"]) for a in extra],
                                     "--out_dir", out])
    assert line == f"error: {dirs['hf']}: not a Megatron-Core dist checkpoint (no metadata.json)"
    _nothing_left(out)


@pytest.mark.parametrize("tool, argv, line", [
    ("hf_to_mcore", ["--hf_dir", "{hf}", "--out_dir", "{mcore}"],
     "error: --out_dir: {mcore} already exists (remove it or choose another)"),
    ("mcore_to_hf", ["--mcore_dir", "{mcore}", "--out_dir", "{hf}"],
     "error: --out_dir: {hf} already exists (remove it or choose another)"),
    ("mcore_to_hf", ["--mcore_dir", "{mcore}", "--tokenizer_dir", "{bare}", "--out_dir", "{out}"],
     "error: --tokenizer_dir: no tokenizer files in {bare}"),
    # a mistyped or file --tokenizer_dir was "--mcore_dir: no tokenizer found (looked in [...]); pass --tokenizer_dir"
    ("mcore_to_hf", ["--mcore_dir", "{mcore}", "--tokenizer_dir", "{bare}x", "--out_dir", "{out}"],
     "error: --tokenizer_dir: {bare}x does not exist"),
    ("mcore_to_hf", ["--mcore_dir", "{mcore}", "--tokenizer_dir", "{bare}/config.json", "--out_dir", "{out}"],
     "error: --tokenizer_dir: {bare}/config.json is not a directory"),
])
def test_converter_errors_name_the_flag(tmp_path, dirs, tool, argv, line):
    paths = dict(dirs, out=str(tmp_path / "out"))
    before = {name: sorted(os.listdir(path)) for name, path in dirs.items()}
    assert _one_line(tool, [a.format(**paths) for a in argv]) == line.format(**paths)
    _nothing_left(paths["out"])
    assert {name: sorted(os.listdir(path)) for name, path in dirs.items()} == before   # nothing overwritten


def test_hf_to_mcore_refuses_a_dir_without_tokenizer_unless_told(tmp_path, dirs):
    out = str(tmp_path / "out")
    line = _one_line("hf_to_mcore", ["--hf_dir", dirs["bare"], "--out_dir", out])
    assert line.startswith(f"error: {dirs['bare']}: no tokenizer files (tokenizer.json, or vocab.json and merges.txt)")
    assert "--require_tokenizer=false" in line
    _nothing_left(out)
    proc = run_python([os.path.join(REPO, "tools", "convert", "hf_to_mcore.py"), "--hf_dir", dirs["bare"],
                       "--out_dir", out, "--require_tokenizer=false"], CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.isfile(os.path.join(out, "phf_megatron.json"))


def test_a_wrong_hf_config_is_one_line_naming_it(tmp_path, dirs):
    """mcore_to_hf --hf_config: a JSON list was a TypeError traceback, the config of another model (a layer
    more) Megatron's CheckpointingException traceback, and a config missing a key was named 'hf_config', not its file."""
    config = json.load(open(os.path.join(dirs["hf"], "config.json")))
    lines = {"list.json": [config], "deeper.json": {**config, "num_hidden_layers": config["num_hidden_layers"] + 1},
             "partial.json": {k: v for k, v in config.items() if k != "num_attention_heads"}}
    for name, content in lines.items():
        (tmp_path / name).write_text(json.dumps(content))
    out = str(tmp_path / "out")
    argv = ["--mcore_dir", dirs["mcore"], "--out_dir", out, "--hf_config"]
    assert _one_line("mcore_to_hf", [*argv, str(tmp_path / "list.json")]) == (
        f"error: {tmp_path / 'list.json'}: expected a JSON object (a HF config.json)")
    line = _one_line("mcore_to_hf", [*argv, str(tmp_path / "deeper.json")])
    assert line.startswith(f"error: {tmp_path / 'deeper.json'}: not the model of {dirs['mcore']}: its tensors have "
                           "other shapes (Global shape mismatch for loaded "), line
    assert _one_line("mcore_to_hf", [*argv, str(tmp_path / "partial.json")]).startswith(
        f"error: {tmp_path / 'partial.json'}: num_attention_heads: missing from the config")
    _nothing_left(out)
