"""From a trained run to what users want: the run's end names its outputs, a rerun of a finished run
does nothing (exit 0), a resume names its step; ``mcore_to_hf.py`` turns a run (or one of its
checkpoints) into a merged HF model and a PEFT adapter whose logits in transformers (+ peft) are the
trainer's final student's."""

from __future__ import annotations

import os
import re
import shutil
import stat

import pytest
import torch
import yaml
from safetensors.torch import load_file

from phf_megatron.output_files import output_mode

from ..helpers import REPO, run_python
from ..helpers.tiny_qwen3 import make_tiny_hf
from ..helpers.tiny_run import assert_ok, make_toy_jsonl, train, train_recording_logits

MCORE_TO_HF = os.path.join(REPO, "tools", "convert", "mcore_to_hf.py")
IDS = [[151644, 872, 198, 3838, 374, 220, 17, 10, 18, 30, 151645, 198], [785, 4226, 374, 220, 20, 13, 151643,
                                                                         151643, 151643, 151643, 151643, 151643]]
COMMON = ("--lr=1e-3", "--checkpoint.save_interval=1")  # lr: one step visibly moves the adapters


@pytest.fixture(scope="module")
def trained(tiny_inputs, tmp_path_factory):
    """A run of 1 step, resumed to 2 with the final student's logits recorded, then rerun finished:
    ``(hf_dir, run_dir, logits, first, resumed, rerun)`` (the processes)."""
    hf, data = tiny_inputs
    root = tmp_path_factory.mktemp("export")
    run, logits = str(root / "run"), str(root / "student_logits.pt")
    first = train(hf, data, run, "--training.train_iters=1", *COMMON)
    assert_ok(first)
    resumed = train_recording_logits(hf, data, run, logits, IDS, "--training.train_iters=2", *COMMON)
    assert_ok(resumed)
    metrics = open(os.path.join(run, "metrics.jsonl")).read()
    rerun = train(hf, data, run, "--training.train_iters=2", *COMMON)
    assert open(os.path.join(run, "metrics.jsonl")).read() == metrics   # nothing retrained
    return hf, run, torch.load(logits), first, resumed, rerun


def test_the_run_says_where_its_outputs_are_and_a_rerun_that_it_is_finished(trained):
    _, run, _, first, resumed, rerun = trained
    assert "finished step 1 of 1" in first.stdout and "resuming" not in first.stdout
    ckpt = os.path.join(run, "checkpoints", "iter_0000001")
    assert f"resuming from step 1 of 2 ({ckpt})" in resumed.stdout, resumed.stdout
    assert "finished step 2 of 2" in resumed.stdout
    for line in (f"checkpoints   {run}/checkpoints (latest: {run}/checkpoints/iter_0000002)",
                 f"metrics       {run}/metrics.jsonl", f"PEFT adapter  {run}/export/peft_adapter",
                 f"merged model  python tools/convert/mcore_to_hf.py --mcore_dir {run} --out_dir",
                 f"plots         python tools/plot_run.py {run}"):
        assert line in resumed.stdout, (line, resumed.stdout)
    assert rerun.returncode == 0 and rerun.stderr == "", rerun.stderr
    assert f"{run} is finished (step 2 of 2): nothing to train" in rerun.stdout
    assert f"PEFT adapter  {run}/export/peft_adapter" in rerun.stdout
    # model.pretrained_checkpoint unset: the base weights are read from hf_dir, nothing converted (its --help)
    assert not os.path.exists(os.path.join(run, "base"))
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == [
        "iter_0000001", "iter_0000002", "latest_checkpointed_iteration.txt"]


def test_a_finished_run_with_other_settings_is_refused_as_its_resume_would_be(tmp_path):
    """Another run pointed at a finished run's directory (the tiny preset left at runs/phf_tiny, the main
    job's) said "runs/phf_tiny is finished (step 100 of 4): nothing to train" and listed the other run's
    adapter as its own, exit 0: the finished-run shortcut skipped the settings check of a resume."""
    import json

    from phf_megatron.errors import InputFileError
    from phf_megatron.training.config_io import load_config, resume_fingerprint
    from phf_megatron.training.export import export_dir, finished_step

    def config(*flags):
        return load_config(os.path.join(REPO, "configs", "tiny_cpu.yaml"),
                           [f"--run_dir={tmp_path}", f"--model.hf_dir={tmp_path}", *flags])

    saved = config("--lora.r=32", "--training.train_iters=2")
    ckpt = tmp_path / "checkpoints" / "iter_0000002"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"fingerprint": resume_fingerprint(saved)}, default=str))
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    os.makedirs(export_dir(saved))
    assert finished_step(saved) == 2
    assert finished_step(config("--lora.r=32", "--training.train_iters=1")) == 2   # a budget is not the math
    with pytest.raises(InputFileError) as err:
        finished_step(config("--lora.r=8", "--training.train_iters=2"))
    assert err.value.path == str(ckpt) and err.value.detail.startswith(
        "the run's settings differ from the checkpoint's: lora.r: 32 -> 8. Use a new --checkpoint.save directory")
    assert finished_step(config("--lora.r=8", "--training.train_iters=2", "--checkpoint.strict_config=false")) == 2
    (ckpt / "meta.json").write_text("[2]")   # damaged, though JSON: named (was an AttributeError traceback)
    with pytest.raises(InputFileError) as err:
        finished_step(saved)
    assert err.value.line == f"{ckpt / 'meta.json'}: expected a JSON object"


def test_the_outputs_name_the_config_and_loss_tokens_and_a_merge_into_a_free_directory(tmp_path):
    """The end of a run suggested ``--out_dir <run>/merged`` once that existed (the converter refuses it: the
    suggested command failed), and left out config.yaml and loss_tokens.jsonl."""
    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.export import outputs_message

    run = str(tmp_path)
    cfg = load_config(os.path.join(REPO, "configs", "tiny_cpu.yaml"), [f"--run_dir={run}", f"--model.hf_dir={run}"])
    assert cfg.lora.enabled
    command = f"python tools/convert/mcore_to_hf.py --mcore_dir {run} --out_dir"
    lines = outputs_message(cfg, 2).splitlines()
    assert f"  merged model  {command} {run}/merged" in lines, lines
    assert not any(line.split()[0] in ("config", "loss") for line in lines)   # not written (yet)
    for name in ("config.yaml", "loss_tokens.jsonl"):
        (tmp_path / name).write_text("")
    os.makedirs(tmp_path / "merged")
    os.makedirs(tmp_path / "merged_2")
    lines = outputs_message(cfg, 2).splitlines()
    assert f"  merged model  {run}/merged exists; another: {command} {run}/merged_3" in lines, lines
    assert f"  config        {run}/config.yaml" in lines and f"  loss tokens   {run}/loss_tokens.jsonl" in lines


def _modes(directory: str) -> set[int]:
    return {stat.S_IMODE(os.stat(os.path.join(directory, f)).st_mode) for f in os.listdir(directory)}


def test_mcore_to_hf_writes_the_merged_model_and_the_adapter_of_the_trainers_student(trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    hf, run, student, *_ = trained
    merged, adapter = str(tmp_path / "merged"), str(tmp_path / "adapter")
    proc = run_python([MCORE_TO_HF, "--mcore_dir", run, "--out_dir", merged], timeout=300)
    assert_ok(proc)
    assert f"the HF model (LoRA merged) of {run}/checkpoints/iter_0000002 (step 2)" in proc.stdout
    bar = [line for line in proc.stderr.splitlines() if line.startswith("export:")]   # minutes at 8B: a bar
    assert len(bar) == 2 and re.search(r"\| (\d+)/\1 \[.*tensor/s\]$", bar[-1]), proc.stderr
    cfg = yaml.safe_load(open(os.path.join(run, "config.yaml")))["model"]   # and the load before it (was silent)
    assert [line for line in proc.stderr.splitlines() if line.startswith("export load:")] == [
        f"export load: the base model {cfg['pretrained_checkpoint'] or cfg['hf_dir']}, then its LoRA adapters from "
        f"{run}/checkpoints/iter_0000002 (step 2)"], proc.stderr
    proc = run_python([MCORE_TO_HF, "--mcore_dir", os.path.join(run, "checkpoints", "iter_0000002"),
                       "--out_dir", adapter, "--adapter_only"], timeout=300)
    assert_ok(proc)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        merged_logits = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        base_logits = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, adapter).eval()(ids).logits
    assert student.shape == merged_logits.shape
    torch.testing.assert_close(merged_logits, student, atol=1e-4, rtol=0)
    torch.testing.assert_close(peft_logits, student, atol=1e-4, rtol=0)
    # the trained adapter differs from the base: the comparison can fail
    assert (merged_logits - base_logits).abs().max() > 1e-3
    # the adapter is the one the trainer exported at its end, bit for bit
    own = load_file(os.path.join(run, "export", "peft_adapter", "adapter_model.safetensors"))
    converted = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    assert own.keys() == converted.keys() and all(torch.equal(own[k], converted[k]) for k in own)
    assert _modes(merged) == _modes(adapter) == {output_mode()}   # weight files as readable as config.json
    # --dtype applies to the adapter too (the fp32 run's adapter, rounded to bf16)
    proc = run_python([MCORE_TO_HF, "--mcore_dir", run, "--out_dir", adapter + "_bf16", "--adapter_only",
                       "--dtype", "bf16"], timeout=300)
    assert_ok(proc)
    bf16 = load_file(os.path.join(adapter + "_bf16", "adapter_model.safetensors"))
    assert bf16.keys() == own.keys() and all(bf16[k].dtype == torch.bfloat16 for k in bf16)
    assert all(torch.equal(bf16[k], own[k].to(torch.bfloat16)) for k in own)


@pytest.mark.slow  # ~60 s: a torchrun run and its conversion on 2 cores
def test_an_interleaved_pipeline_run_converts_under_the_torchrun_its_end_names(tmp_path):
    """PP 2 x VPP 2 (4 layers), as a user runs it: the step's sync probe runs through the interleaved
    schedule; the run's end names the torchrun that converts its TP x PP checkpoint, which writes the
    merged model once (rank 0 says so) with the logits of the base model + the run's PEFT adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    hf = make_tiny_hf(str(tmp_path / "hf"), num_layers=4)
    run, merged = str(tmp_path / "run"), str(tmp_path / "run" / "merged")
    proc = train(hf, make_toy_jsonl(str(tmp_path / "toy.jsonl")), run, "--model.pipeline_model_parallel_size=2",
                 "--model.virtual_pipeline_model_parallel_size=2", "--training.train_iters=1", *COMMON, nproc=2)
    assert_ok(proc)
    line = f"merged model  torchrun --nproc-per-node 2 tools/convert/mcore_to_hf.py --mcore_dir {run} --out_dir {merged}"
    assert line in proc.stdout, proc.stdout
    conv = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", MCORE_TO_HF,
                       "--mcore_dir", run, "--out_dir", merged], OMP_NUM_THREADS="1")
    assert conv.returncode == 0, conv.stderr[-3000:]
    assert conv.stdout.count("wrote ") == 1, conv.stdout
    ids = torch.tensor(IDS)
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(merged).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(hf).eval()
        want = PeftModel.from_pretrained(base, os.path.join(run, "export", "peft_adapter")).eval()(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_mcore_to_hf_errors_on_a_run_are_one_line(trained, tmp_path):
    hf, run, *_ = trained
    no_weights = tmp_path / "base_without_weights"   # its config.json, not its safetensors
    no_weights.mkdir()
    (no_weights / "config.json").write_text(open(os.path.join(hf, "config.json")).read())
    no_tokenizer = shutil.copytree(hf, tmp_path / "base_without_tokenizer", ignore=shutil.ignore_patterns(
        "tokenizer*", "vocab.json", "merges.txt"))   # the merged model was written without one, silently
    no_steps = tmp_path / "run_without_steps"   # a run that has written its config, no checkpoint yet
    no_steps.mkdir()
    (no_steps / "config.yaml").write_text(open(os.path.join(run, "config.yaml")).read())
    for args, line in [
        ([run, "--base_model", str(tmp_path / "nowhere")],
         f"error: --base_model: {tmp_path / 'nowhere'} does not exist here"),   # was "is not a HF model directory"
        ([run, "--base_model", str(tmp_path)], f"error: --base_model: {tmp_path} is not a HF model directory here"),
        ([run, "--base_model", str(no_weights)],   # was "hf_dir: neither ...", a flag the tool does not have
         f"error: --base_model: neither model.safetensors.index.json nor model.safetensors in {no_weights}"),
        ([run, "--base_model", str(no_tokenizer)], f"error: --base_model: {no_tokenizer} holds no tokenizer files"),
        ([str(no_steps)], "no checkpoint of the run yet (latest_checkpointed_iteration.txt missing)"),
        ([run, "--adapter_only", "--out_dir", run], "already exists"),
    ]:
        out = [] if "--out_dir" in args else ["--out_dir", str(tmp_path / "out")]
        proc = run_python([MCORE_TO_HF, "--mcore_dir", *args, *out], timeout=120)
        assert proc.returncode == 2 and line in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not os.path.exists(tmp_path / "out")


def test_a_full_fine_tuning_run_converts_to_the_trainers_own_hf_export(tiny_inputs, tmp_path):
    """lora.enabled=false: the checkpoint holds the model as a dist checkpoint; mcore_to_hf writes
    the weights the trainer exported at its end, bit for bit (and refuses --adapter_only)."""
    hf, data = tiny_inputs
    run = str(tmp_path / "full")
    assert_ok(train(hf, data, run, "--training.train_iters=1", "--lora.enabled=false", "--teacher.mode=ema",
                    "--lr=1e-4"))
    out = str(tmp_path / "hf")
    assert_ok(run_python([MCORE_TO_HF, "--mcore_dir", run, "--out_dir", out], timeout=300))
    own_dir = os.path.join(run, "export", "hf")

    def weights(directory):
        return {k: v for f in sorted(os.listdir(directory)) if f.endswith(".safetensors")
                for k, v in load_file(os.path.join(directory, f)).items()}

    own, converted = weights(own_dir), weights(out)
    base = weights(hf)
    assert own.keys() == converted.keys() and all(torch.equal(own[k], converted[k]) for k in own)
    assert any(not torch.equal(own[k], base[k]) for k in own if k in base)   # the step moved the weights
    proc = run_python([MCORE_TO_HF, "--mcore_dir", run, "--out_dir", str(tmp_path / "a"), "--adapter_only"])
    assert proc.returncode == 2 and "error: --adapter_only: the run trained every weight" in proc.stderr


def test_the_eval_takes_the_runs_checkpoint_as_its_help_says(trained, tmp_path, capsys):
    """``eval_avg_at_k.py --megatron_checkpoint runs/x/checkpoints/iter_N --model BASE``: the student,
    LoRA merged, in <out>/converted_model (the trainer's logits); it lists its outputs, and
    --no-keep_model leaves only the samples and the summary."""
    pytest.importorskip("math_verify")
    from transformers import AutoModelForCausalLM

    from phf_megatron.tools.eval_avg_at_k import main

    hf, run, student, *_ = trained
    bench = tmp_path / "sums.jsonl"
    bench.write_text('{"problem": "What is 2+3?", "answer": "5"}\n')
    out = tmp_path / "eval"
    argv = ["--megatron_checkpoint", os.path.join(run, "checkpoints", "iter_0000002"), "--model", hf,
            "--benchmarks", str(bench), "--n", "1", "--max_new_tokens", "4", "--backend", "hf", "--dtype", "float32",
            "--out_dir", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Avg@1 (official) %" in printed and "pass@1 %" in printed
    assert (f"outputs in {out}: converted_model/, run_config.json, samples.rank0.jsonl, summary.json"
            in printed), printed
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(str(out / "converted_model"), dtype=torch.float32)(
            torch.tensor(IDS)).logits
    torch.testing.assert_close(logits, student, atol=1e-4, rtol=0)
    assert main([*argv, "--no-keep_model"]) == 0   # resumes: nothing to generate, the model goes
    assert sorted(os.listdir(out)) == ["run_config.json", "samples.rank0.jsonl", "summary.json"]


def _documented_metrics() -> set[str]:
    """The keys of docs/metrics.md's tables (first column, in backquotes)."""
    with open(os.path.join(REPO, "docs", "metrics.md")) as f:
        return {m.group(1) for m in re.finditer(r"^\| `([a-z_]+)` \|", f.read(), re.M)}


def test_every_metric_the_trainer_writes_is_described_in_docs_metrics_md(trained):
    """docs/metrics.md is the one place that says what each metrics.jsonl key means: a real run's
    keys are all there, and every key there is one the trainer's code names."""
    import json

    _, run, *_ = trained
    with open(os.path.join(run, "metrics.jsonl")) as f:
        written = {k for line in f for k in json.loads(line)}
    documented = _documented_metrics()
    assert written - documented == set(), f"undocumented in docs/metrics.md: {sorted(written - documented)}"
    source = ""
    for directory, _, files in os.walk(os.path.join(REPO, "phf_megatron")):
        source += "".join(open(os.path.join(directory, f)).read() for f in files if f.endswith(".py"))
    stale = {k for k in documented if k not in source and k.removeprefix("flow_energy") not in source}
    assert stale == set(), f"docs/metrics.md describes keys no code writes: {sorted(stale)}"
    assert len(written) >= 30


def test_the_outputs_commands_read_a_run_directory_with_a_space_as_one_path(tmp_path):
    """The merged-model and plots commands printed at the end of a run named ``runs/my run`` unquoted: pasted into a
    shell, ``--mcore_dir runs/my run`` was two words (``mcore_to_hf: unrecognized arguments``)."""
    import shlex

    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.export import outputs_message

    run = str(tmp_path / "my run")
    cfg = load_config(os.path.join(REPO, "configs", "tiny_cpu.yaml"), [f"--run_dir={run}", f"--model.hf_dir={run}"])
    lines = {line[2:16].strip(): line[16:] for line in outputs_message(cfg, 2).splitlines()}
    merge = shlex.split(lines["merged model"])
    assert merge[merge.index("--mcore_dir") + 1] == run and merge[merge.index("--out_dir") + 1] == f"{run}/merged"
    assert shlex.split(lines["plots"].split("  (writes")[0]) == ["python", "tools/plot_run.py", run]
