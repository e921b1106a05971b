"""The eval's run directory under another name, after a failed start, and models it cannot run.

* the same directory named relatively, absolutely and through a symlink (and the model named
  relatively and absolutely) resumes: nothing is regenerated (it was refused: "holds samples
  generated with other settings {model_dir: ...}"); a resume's bar counts from the samples written;
* a start that failed before any sample (a model that is not a Qwen3: one line naming its
  ``config.json`` and its own model_type, 'mistral', not what transformers makes of it) leaves no
  ``run_config.json`` that blocks the corrected rerun;
* a PEFT adapter of another shape, a damaged or missing adapter file and a truncated
  --megatron_checkpoint are one line naming the file (the spawned conversion prints no traceback either);
* a prompt longer than the engine's context (the README's eval command on the toy's 512-position model:
  a 1,359-token AIME prompt was vLLM's 40-line traceback) is one line naming the problem and both lengths,
  before any engine starts or any sample is written;
* ``--engine_kwargs '{vllm_kwargs: ...}'`` with ``--backend auto`` where vLLM does not import: one line before
  any work (was build_engine's ValueError traceback once the model was ready);
* a full disk (a real 8 KiB tmpfs) and a read-only output directory: one line naming the file
  and the cause ("No space left on device").

Tiny data made here (two problems), the tiny Qwen3 on the transformers backend, 4 new tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from phf_megatron.errors import UserError
from phf_megatron.eval import EvalConfig, run_eval
from tests.helpers import run_python, REPO

from ..helpers.mounts import read_only_dir, small_tmpfs


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bench") / "two.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in (1, 2)))
    return str(path)


def _config(out_dir: str, model: str | None, problems: str, n: int = 1, **kw) -> EvalConfig:
    return EvalConfig(out_dir=out_dir, model=model, benchmarks=(problems,), n=n, max_new_tokens=4, backend="hf",
                      dtype="float32", batch_size=2, pass_ks=(1,), **kw)


def test_the_run_directory_resumes_under_any_name(tmp_path, tiny_dir, problems, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_dir, "model")
    assert run_eval(_config("run", "model", problems)).generated == 2          # relative names
    os.symlink(tmp_path / "run", tmp_path / "link")
    for out_dir, model in ((str(tmp_path / "run"), str(tmp_path / "model")), (str(tmp_path / "link"), "model"),
                           ("./run/", "./model")):
        assert run_eval(_config(out_dir, model, problems)).generated == 0, (out_dir, model)
    with open(tmp_path / "run" / "run_config.json") as f:
        assert json.load(f)["model_dir"] == str(tmp_path / "model")          # resolved, as written


def test_a_resumed_runs_bar_counts_the_samples_written_before(tmp_path, tiny_dir, problems, capsys):
    """Two problems x 2 samples, 2 written before: the bar goes 2/4 -> 4/4 (it said 0/2 -> 2/2)."""
    out_dir = str(tmp_path / "run")
    assert run_eval(_config(out_dir, tiny_dir, problems)).generated == 2
    capsys.readouterr()
    assert run_eval(_config(out_dir, tiny_dir, problems, n=2)).generated == 2
    bar = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval:")]
    assert [line.split("|")[2].split()[0] for line in bar] == ["2/4", "4/4"], bar


def test_a_failed_start_does_not_block_the_corrected_rerun(tmp_path, tiny_dir, problems):
    mistral = shutil.copytree(tiny_dir, str(tmp_path / "mistral"))
    path = os.path.join(mistral, "config.json")
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, "model_type": "mistral", "architectures": ["MistralForCausalLM"]}, f)
    out_dir = str(tmp_path / "run")
    with pytest.raises(UserError, match=rf"{path}: model_type 'mistral' is not a Qwen3 model"):
        run_eval(_config(out_dir, mistral, problems))
    os.makedirs(out_dir, exist_ok=True)   # what an older failed start left: settings, no sample
    with open(os.path.join(out_dir, "run_config.json"), "w") as f:
        json.dump({"model_dir": mistral, "temperature": 0.3}, f)
    assert run_eval(_config(out_dir, tiny_dir, problems)).generated == 2


def _error_line(tiny_dir: str, problems: str, out_dir: str) -> str:
    """The command line's one ``error:`` line (exit 2, no traceback)."""
    proc = run_python([os.path.join(REPO, "tools", "eval_avg_at_k.py"), "--model", tiny_dir, "--benchmarks",
                       problems, "--out_dir", out_dir, "--n", "40", "--max_new_tokens", "4", "--backend", "hf",
                       "--dtype", "float32", "--pass_ks", "1"])
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-4000:]
    return lines[0]


def test_a_prompt_longer_than_the_context_is_one_line(tmp_path, tiny_dir, problems):
    out_dir = str(tmp_path / "run")
    proc = run_python([os.path.join(REPO, "tools", "eval_avg_at_k.py"), "--model", tiny_dir, "--benchmarks",
                       problems, "--out_dir", out_dir, "--n", "1", "--max_new_tokens", "4", "--backend", "hf",
                       "--dtype", "float32", "--max_model_len", "8"])
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-4000:]
    assert lines[0].startswith("error: --max_model_len: 2 of 2 prompts do not fit the engine's context of 8 "
                               "tokens (the longest, two problem p1, is "), lines[0]
    # the model allows more than the 8 asked for: the line says so first
    assert lines[0].endswith("): --max_model_len up to the model's 1024, a model with a longer context, or other "
                             "--benchmarks"), lines[0]
    assert not os.path.exists(os.path.join(out_dir, "samples.rank0.jsonl"))


def test_full_disk_is_one_line(tmp_path, tiny_dir, problems):
    with small_tmpfs(str(tmp_path / "full"), size="8k") as full:
        out_dir = os.path.join(full, "run")
        assert _error_line(tiny_dir, problems, out_dir) == \
            f"error: {os.path.join(out_dir, 'samples.rank0.jsonl')}: cannot write: No space left on device"


def test_read_only_output_directory_is_one_line(tmp_path, tiny_dir, problems):
    with read_only_dir(str(tmp_path / "ro")) as ro:
        out_dir = os.path.join(ro, "run")
        why = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
        assert _error_line(tiny_dir, problems, out_dir) == f"error: {out_dir}: cannot write: {why}"


def test_an_adapter_of_another_shape_is_one_line(tmp_path, tiny_dir, problems):
    peft = pytest.importorskip("peft")
    from ..helpers.tiny_qwen3 import build_tiny_qwen3

    other = build_tiny_qwen3(hidden_size=32, head_dim=16)     # the tiny Qwen3 has hidden 64
    peft.get_peft_model(other, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])).save_pretrained(
        str(tmp_path / "adapter"))
    config = _config(str(tmp_path / "run"), tiny_dir, problems, adapter=str(tmp_path / "adapter"))
    with pytest.raises(UserError, match=rf"{tmp_path / 'adapter'}: does not fit the base model {tiny_dir}: "
                                        r"size mismatch for .*q_proj.lora_A"):
        run_eval(config)


@pytest.mark.parametrize("damage, culprit, detail", [
    (lambda d: _cut(d / "adapter_config.json", 40), "adapter_config.json", "not valid JSON: "),
    (lambda d: (d / "adapter_config.json").write_text("[]"), "adapter_config.json", "expected a JSON object"),
    (lambda d: _cut(d / "adapter_model.safetensors", -100), "adapter_model.safetensors",
     "not a readable safetensors file, truncated or corrupt"),
    (lambda d: (d / "adapter_model.safetensors").unlink(), "", "no adapter_model.safetensors or adapter_model.bin"),
])
def test_a_damaged_adapter_file_is_named(tmp_path, tiny_dir, problems, damage, culprit, detail):
    """peft's own errors were tracebacks naming no file: JSONDecodeError, SafetensorError ("invalid header
    length"), a TypeError for a list, and for missing weights an HFValidationError about a Hub repo id."""
    peft = pytest.importorskip("peft")
    from ..helpers.tiny_qwen3 import build_tiny_qwen3

    adapter = tmp_path / "adapter"
    peft.get_peft_model(build_tiny_qwen3(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])) \
        .save_pretrained(str(adapter))
    damage(adapter)
    with pytest.raises((UserError, FileNotFoundError)) as err:   # the command line's one line (run_command)
        run_eval(_config(str(tmp_path / "run"), tiny_dir, problems, adapter=str(adapter)))
    assert str(err.value).startswith(f"{os.path.join(adapter, culprit) if culprit else adapter}: {detail}"), err.value
    assert not os.path.exists(tmp_path / "run" / "merged_model")


def test_a_damaged_marker_of_the_merged_model_remerges(tmp_path, tiny_dir):
    """merged_model/phf_source.json (what the merge was made from) damaged: merged again, not a traceback."""
    peft = pytest.importorskip("peft")
    from phf_megatron.eval.models import MARKER, merge_adapter

    from ..helpers.tiny_qwen3 import build_tiny_qwen3

    adapter = str(tmp_path / "adapter")
    peft.get_peft_model(build_tiny_qwen3(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])) \
        .save_pretrained(adapter)
    merged = merge_adapter(tiny_dir, adapter, str(tmp_path / "run"), dtype="float32")
    marker = os.path.join(merged, MARKER)
    first = open(marker).read()
    _cut(marker, 10)
    assert merge_adapter(tiny_dir, adapter, str(tmp_path / "run"), dtype="float32") == merged
    assert open(marker).read() == first


def _cut(path, size: int) -> None:
    """Truncate ``path`` to ``size`` bytes (negative: that many fewer)."""
    with open(path, "r+b") as f:
        f.truncate(size if size >= 0 else os.path.getsize(path) + size)


def test_a_truncated_megatron_checkpoint_is_named_without_a_traceback(tmp_path, tiny_dir, problems, capfd,
                                                                       monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # an earlier test's group
        monkeypatch.delenv(var, raising=False)     # (the spawned conversion would take its port)
    mcore = str(tmp_path / "mcore")
    run_python([os.path.join(REPO, "tools", "convert", "hf_to_mcore.py"), "--hf_dir", tiny_dir, "--out_dir", mcore,
                "--dtype", "fp32"]).check_returncode()
    shard = sorted(f for f in os.listdir(mcore) if f.endswith(".distcp"))[0]
    with open(os.path.join(mcore, shard), "r+b") as f:
        f.truncate(100)
    config = _config(str(tmp_path / "run"), None, problems, megatron_checkpoint=mcore)
    capfd.readouterr()
    with pytest.raises(UserError, match=rf"{os.path.join(mcore, shard)}: truncated"):
        run_eval(config)
    assert "Traceback" not in capfd.readouterr().err            # nor from the spawned conversion


def test_samples_of_another_problem_text_under_the_same_ids_are_refused(tmp_path, tiny_dir):
    """A benchmark file edited (or another --data_dir) between two runs into one directory: its ids were the
    same, so the first run's outputs were kept without a word (0 generated) and graded against the new
    answers. It is one line naming the directory and a problem; a problem added to the file resumes."""
    path, out_dir = tmp_path / "mine.jsonl", str(tmp_path / "run")

    def write(*texts):
        path.write_text("".join(json.dumps({"problem": t, "answer": "1"}) + "\n" for t in texts))

    write("What is 0 + 1?", "What is 1 * 1?")
    assert run_eval(_config(out_dir, tiny_dir, str(path))).generated == 2
    write("What is 0 + 1?", "What is 5 - 4?")
    with pytest.raises(UserError, match=rf"^{out_dir}: holds samples of other problems under the same ids \(mine "
                                        r"'mine-2': the benchmark's file or --data_dir changed\); use another --out_dir$"):
        run_eval(_config(out_dir, tiny_dir, str(path)))
    write("What is 0 + 1?", "What is 1 * 1?", "What is 2 - 1?")
    assert run_eval(_config(out_dir, tiny_dir, str(path))).generated == 1


def test_vllm_kwargs_for_an_auto_backend_without_vllm_is_one_line_before_any_work(tmp_path, tiny_dir, problems,
                                                                                 monkeypatch):
    import phf_megatron.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    config = dataclasses.replace(_config(str(tmp_path / "run"), tiny_dir, problems), backend="auto",
                                 engine_kwargs={"vllm_kwargs": {"max_num_seqs": 3}})
    with pytest.raises(UserError) as err:
        run_eval(config)
    assert err.value.line == ("--engine_kwargs: vllm_kwargs: only for a vLLM engine, and --backend=auto runs "
                              "transformers here (vLLM does not import): install vLLM or leave them out")
    assert not (tmp_path / "run").exists()
