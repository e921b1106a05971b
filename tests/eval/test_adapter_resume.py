"""--adapter A --model BASE into an --out_dir that holds samples: the eval merges A into BASE in
<out_dir>/merged_model, and its resume check held only that merged path (and A's path as typed), the same for
every A and BASE. A retrained in place, or another --model, was merged again and its samples mixed with the old
model's into one Average@k in silence. The resume now compares what the merge was made from (``merge_inputs``:
``adapter_digest``, ``base_digest``); a directory written before it recorded them resumes as before and is
upgraded; paper_table's pre-check (``planned_resume_refusals``) agrees with the eval's own. A plain --model
retrained or overwritten in place resumed the same way on its path alone: its files are compared too
(``model_digest``).

Tiny data (two problems), the tiny Qwen3 with a rank-2 LoRA, the transformers backend, 4 new tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from phf_megatron.errors import InputFileError
from phf_megatron.eval import EvalConfig, run_eval
from phf_megatron.eval.resume import planned_resume_refusals


def _save_adapter(path, seed: int) -> None:
    """A LoRA of the tiny Qwen3 with random lora_B (``seed``): another seed, another (retrained) adapter."""
    peft = pytest.importorskip("peft")
    import torch

    from ..helpers.tiny_qwen3 import build_tiny_qwen3

    lora = peft.get_peft_model(build_tiny_qwen3(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    lora.save_pretrained(str(path))


@pytest.fixture
def problems(tmp_path) -> str:
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in (1, 2)))
    return str(path)


def _config(tmp_path, model, problems, n: int, adapter: bool = True) -> EvalConfig:
    return EvalConfig(out_dir=str(tmp_path / "eval"), model=str(model),
                      adapter=str(tmp_path / "adapter") if adapter else None,
                      benchmarks=(problems,), n=n, max_new_tokens=4, backend="hf", dtype="float32", batch_size=2,
                      pass_ks=(1,))


def _refused(config: EvalConfig, key: str) -> None:
    """The eval and paper_table's pre-check both refuse ``config``'s resume for ``key``, in one line naming the
    out_dir and the flag whose files changed; nothing written."""
    shard = os.path.join(config.out_dir, "samples.rank0.jsonl")
    samples = open(shard).read()
    assert key in planned_resume_refusals(config)[0]
    with pytest.raises(InputFileError) as err:
        run_eval(config)
    line = str(err.value)
    assert line.startswith(f"{config.out_dir}: holds samples generated with other settings {{'{key}': (")
    flag = "--adapter" if key == "adapter_digest" else "--model"
    assert line.endswith(f"(old, new); {flag}: not the files its samples were made with; use another --out_dir")
    assert "\n" not in line, line
    assert open(shard).read() == samples


def test_a_retrained_adapter_or_another_base_is_refused_the_same_resumes(tmp_path, tiny_dir, problems):
    _save_adapter(tmp_path / "adapter", seed=1)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=1)).generated == 2
    assert planned_resume_refusals(_config(tmp_path, tiny_dir, problems, n=2)) == ({}, None)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=2)).generated == 2   # the same adapter: resumed
    shutil.copytree(tiny_dir, tmp_path / "copy")                                  # the same base elsewhere: too
    assert run_eval(_config(tmp_path, tmp_path / "copy", problems, n=3)).generated == 2
    shutil.copytree(tmp_path / "adapter", tmp_path / "moved")     # the same adapter elsewhere (a moved run): too
    moved = dataclasses.replace(_config(tmp_path, tiny_dir, problems, n=4), adapter=str(tmp_path / "moved"))
    assert planned_resume_refusals(moved) == ({}, None)              # was {'adapter': (its old path, the new)}
    assert run_eval(moved).generated == 2
    other = tmp_path / "copy"                                         # another base model: its weights differ
    _perturb(other)
    _refused(_config(tmp_path, other, problems, n=5), "base_digest")
    _save_adapter(tmp_path / "adapter", seed=2)                     # retrained in place: same path, new weights
    _refused(_config(tmp_path, tiny_dir, problems, n=5), "adapter_digest")


def test_an_out_dir_from_before_the_record_resumes_and_is_upgraded(tmp_path, tiny_dir, problems):
    _save_adapter(tmp_path / "adapter", seed=1)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=1)).generated == 2
    path = tmp_path / "eval" / "run_config.json"
    recorded = json.loads(path.read_text())
    assert {"base_digest", "adapter_digest"} <= recorded.keys()
    legacy = {k: v for k, v in recorded.items() if k not in ("base_digest", "adapter_digest")}
    path.write_text(json.dumps(legacy))                              # as written before it recorded them
    assert planned_resume_refusals(_config(tmp_path, tiny_dir, problems, n=2)) == ({}, None)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=2)).generated == 2   # resumed as before
    assert json.loads(path.read_text()) == recorded                  # upgraded: the adapter's identity recorded
    _save_adapter(tmp_path / "adapter", seed=2)                      # from then on a retrained adapter is refused
    _refused(_config(tmp_path, tiny_dir, problems, n=3), "adapter_digest")


def _perturb(model_dir) -> None:
    """``model_dir``'s weights changed in place (a retrained or overwritten model under the same path)."""
    from safetensors.torch import load_file, save_file

    path = str(model_dir / "model.safetensors")
    save_file({k: v + 0.01 for k, v in load_file(path).items()}, path, metadata={"format": "pt"})


def test_a_plain_model_overwritten_in_place_is_refused_an_old_out_dir_upgraded(tmp_path, tiny_dir, problems):
    """--model DIR without an adapter: its path was all run_config.json held, so DIR retrained or overwritten in
    place resumed in the same --out_dir and its samples were mixed with the old model's into one Average@k."""
    shutil.copytree(tiny_dir, tmp_path / "model")

    def config(n: int) -> EvalConfig:
        return _config(tmp_path, tmp_path / "model", problems, n, adapter=False)

    assert run_eval(config(1)).generated == 2
    path = tmp_path / "eval" / "run_config.json"
    recorded = json.loads(path.read_text())
    assert "model_digest" in recorded
    path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "model_digest"}))   # as written before
    assert planned_resume_refusals(config(2)) == ({}, None)
    assert run_eval(config(2)).generated == 2                        # resumed as before
    assert json.loads(path.read_text()) == recorded                  # upgraded: the model's identity recorded
    shutil.copytree(tmp_path / "model", tmp_path / "moved")          # the same files elsewhere: resumed (was refused:
    moved = dataclasses.replace(config(3), model=str(tmp_path / "moved"))   # {'model_dir': (its old path, the new)})
    assert planned_resume_refusals(moved) == ({}, None)
    assert run_eval(moved).generated == 2
    _perturb(tmp_path / "model")                                     # overwritten in place: same path, new weights
    _refused(config(4), "model_digest")


def test_a_refused_resume_keeps_the_merged_model_of_its_samples(tmp_path, tiny_dir, problems):
    """A retrained adapter was merged (minutes at 8B) into <out_dir>/merged_model over the one the samples were
    made with, then refused: the kept model no longer was its samples'. Now refused before any merge."""
    from phf_megatron.eval.models import MARKER

    _save_adapter(tmp_path / "adapter", seed=1)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=1)).generated == 2
    marker = tmp_path / "eval" / "merged_model" / MARKER
    merged = marker.read_text()
    _save_adapter(tmp_path / "adapter", seed=2)                     # retrained in place
    _refused(_config(tmp_path, tiny_dir, problems, n=2), "adapter_digest")
    assert marker.read_text() == merged                              # still the samples' model, not merged again


def test_a_resume_reads_what_the_merge_is_made_from_once(tmp_path, tiny_dir, problems, monkeypatch):
    """The resume's check before the merge and the merge's own marker share one ``merge_inputs`` (the adapter read
    whole, the base's sampled chunks), which was read twice; the fingerprint recorded is the same."""
    from phf_megatron.eval import models, resume

    _save_adapter(tmp_path / "adapter", seed=1)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=1)).generated == 2
    recorded = (tmp_path / "eval" / "run_config.json").read_text()
    calls, read = [], models.merge_inputs

    def counted(*args):
        calls.append(args)
        return read(*args)

    monkeypatch.setattr(resume, "merge_inputs", counted)
    monkeypatch.setattr(models, "merge_inputs", counted)   # (models' own name, read by merge_adapter)
    shutil.rmtree(tmp_path / "eval" / "merged_model")      # merged again, from the inputs read for the check
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=2)).generated == 2
    assert len(calls) == 1
    assert (tmp_path / "eval" / "run_config.json").read_text() == recorded


def test_a_base_without_config_json_is_one_line_on_a_resume_too(tmp_path, tiny_dir, problems):
    """A wrong --model (a directory, not a model's: no config.json) into an --out_dir with samples: the check before
    any merge read its config.json, a FileNotFoundError traceback; now merge_adapter's line, as on a first run."""
    from phf_megatron.errors import ConfigError

    _save_adapter(tmp_path / "adapter", seed=1)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=1)).generated == 2
    (tmp_path / "models").mkdir()
    with pytest.raises(ConfigError) as err:
        run_eval(_config(tmp_path, tmp_path / "models", problems, n=2))
    assert err.value.line == f"--model: {tmp_path / 'models'} has no config.json (not a HF base model directory)"


@pytest.mark.parametrize("with_model", [True, False], ids=["model", "no-model"])
def test_an_adapter_with_a_megatron_checkpoint_is_one_line_on_a_resume_too(tmp_path, tiny_dir, problems, with_model):
    """--adapter with --megatron_checkpoint (not supported: resolve_model_dir's line) into an --out_dir with samples:
    the resume check before a merge (planned_fingerprint, not for a megatron_checkpoint) ran first, read --model's
    files, and without --model was a TypeError traceback; now the same line as on a first run, nothing merged."""
    from phf_megatron.errors import ConfigError

    _save_adapter(tmp_path / "adapter", seed=1)
    assert run_eval(_config(tmp_path, tiny_dir, problems, n=1)).generated == 2
    config = dataclasses.replace(_config(tmp_path, tiny_dir, problems, n=2), megatron_checkpoint=str(tmp_path / "run"),
                                 model=str(tiny_dir) if with_model else None)
    with pytest.raises(ConfigError) as err:
        run_eval(config)
    assert err.value.line == "--adapter: not supported with megatron_checkpoint (merge LoRA before saving)"
