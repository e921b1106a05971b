"""Each real command line (phf-train, the converters, phf-eval, the installed scripts): its --help lists every
setting with its docstring, without importing torch, and its setting errors are one line with exit code 2.
The machinery they share (phf_megatron/cli.py, commands.py): test_cli.py."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import typing

import pytest
import yaml

from phf_megatron.cli import Settings
from tests.helpers import REPO, python_env, run_python

TOOLS = os.path.join(REPO, "tools")


def _sections(cls) -> dict[str, type]:
    """A config's sections: field name -> its dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


def _leaf_fields(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from (f"{f.name}.{g}" for g in _leaf_fields(hints[f.name]))
        else:
            yield f.name


def test_trainer_help_lists_every_setting_without_importing_torch():
    from phf_megatron.training.config import TrainConfig

    proc = run_python(["-c", "import sys; from phf_megatron.train import main; rc = main(['--help']); "
                       "heavy = [m for m in ('torch', 'megatron', 'vllm', 'transformers') if m in sys.modules]; "
                       "print('HEAVY', heavy); sys.exit(rc)"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "HEAVY []"
    lines = proc.stdout.splitlines()
    for key in _leaf_fields(TrainConfig):
        assert any(line.startswith(f"  --{key}=<") for line in lines), key
    for heading in ("model: The policy model", "objective: What one PHF update optimizes", "logging: "):
        assert any(line.startswith(heading) for line in lines), heading
    assert "  --optimizer.lr=<float>  (default: 5e-06)" in lines
    assert "      Peak learning rate (paper: 5e-6)." in lines
    assert "--print-config" in proc.stdout and "--config FILE" in proc.stdout
    for cls in [TrainConfig, *_sections(TrainConfig).values()]:   # the help names their files (lora's was missing)
        assert cls.__module__.removeprefix("phf_megatron.").replace(".", "/") + ".py" in proc.stdout, cls
    assert "a field no other section has may go alone (--hf_dir for --model.hf_dir)" in " ".join(proc.stdout.split())
    from phf_megatron.training.config_io import SETTINGS

    assert SETTINGS.resolve("hf_dir") == "model.hf_dir"   # what the help says holds


@pytest.mark.parametrize("argv, line", [
    (["--optimizer.lr=abc"], "error: --optimizer.lr: expected float, got 'abc'"),
    (["--lrr", "1e-5"], "error: --lrr: unknown setting; did you mean lora.r, lr?"),
    # the trainer's own options are close matches too: both were "unknown setting" alone (or "strict_config")
    (["--confg", "configs/tiny_cpu.yaml"], "error: --confg: unknown setting; did you mean config?"),
    (["--print-confg"], "error: --print_confg: unknown setting; did you mean print_config, strict_config?"),
    # given a value: was "unknown setting; did you mean print_config, ...", the flag itself
    (["--print-config=true"], "error: --print_config: takes no value (the command's own switch: give it alone)"),
    (["--rollout.top_p=1.5"], "error: --rollout.top_p: must lie in (0, 1], got 1.5"),
    # was "is not one of ('bfloat16', 'float16', 'float32')": the short spellings it takes were left out
    (["--model.dtype=bf8"], "error: --model.dtype: 'bf8' is not one of ('bf16', 'fp16', 'fp32', 'bfloat16', 'float16', "
                            "'float32')"),
    (["--checkpoint.exit_signal=SIGKILL"],
     "error: --checkpoint.exit_signal: 'SIGKILL' is not one of ('SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGUSR2')"),
    (["--config", "configs/nope.yaml"], "error: config file 'configs/nope.yaml' does not exist"),
    (["--config", "configs/tiny_cpu.yaml", "--lr=1e-4", "--config=my.yaml"],
     "error: --config: given twice (configs/tiny_cpu.yaml, then my.yaml): one preset per run; override its settings "
     "with --section.field=value"),
    ([], "error: --model.hf_dir: is required: the HF Qwen3 checkpoint directory"),
    (["--model.hf_dir=/nonexistent/hf"], "error: --model.hf_dir: /nonexistent/hf does not exist"),
    (["--model.hf_dir=README.md"], "error: --model.hf_dir: README.md is not a directory"),
    (["--model.hf_dir=configs", "--model.pretrained_checkpoint=/nonexistent/mcore"],
     "error: --model.pretrained_checkpoint: /nonexistent/mcore does not exist"),
    (["--model.hf_dir=configs", "--run_dir=README.md"], "error: --run_dir: README.md is not a directory"),
    (["--config", "configs"], "error: config file 'configs' is not a file"),
    (["--optimizer.lr=nan"], "error: --optimizer.lr: expected a finite number, got nan"),
    (["--data.shuffle_seed=-1"], "error: --data.shuffle_seed: must be >= 0, got -1"),   # was a traceback, late
    # was accepted and ignored: the vllm / hf engines always run on the trainer's GPUs
    (["--rollout.colocate=false"], "error: --rollout.colocate: false is not supported with rollout.backend=auto: its "
     "engines run on the trainer's GPUs; for an engine elsewhere start a vLLM server and use "
     "--rollout.backend=vllm_server --rollout.server_url=..."),
])
def test_trainer_setting_errors_are_one_line_with_exit_code_2(argv, line):
    proc = run_python(["-m", "phf_megatron.train", *argv])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [line] and proc.stdout == ""


@pytest.mark.parametrize("path", ["/nonexistent/train.jsonl", "runs/x/train.jsnl", "./mine"])
def test_a_data_path_that_is_not_there_is_refused_before_torch_loads(path):
    """A mistyped local --data.path (DATA= in the launchers) was said after torch, Megatron and the model had loaded
    (~6 s on a CPU machine; under a launcher, after the base model's conversion); a Hub name (owner/name) is left to
    the loader."""
    code = ("import sys; from phf_megatron.train import main; rc = main(sys.argv[1:]); "
            "print('HEAVY', [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules]); sys.exit(rc)")
    proc = run_python(["-c", code, "--model.hf_dir=configs", f"--data.path={path}"])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"error: --data.path: {path!r} does not exist"])
    assert proc.stdout.splitlines()[-1] == "HEAVY []"
    from phf_megatron.data.sources import missing_source

    assert missing_source("siyanzhao/Openthoughts_math_30k_opsd") is None and missing_source("configs") is None


def test_print_config_prints_the_resolved_yaml(tmp_path):
    from phf_megatron.training.config_io import load_config, to_dict

    proc = run_python(["-m", "phf_megatron.train", "--config", "configs/phf_qwen3_8b.yaml", "--lr", "1e-5",
                 "--no-lora.enabled", "--teacher.mode=dynamic", "--print-config"])
    assert proc.returncode == 0, proc.stderr
    expected = load_config("configs/phf_qwen3_8b.yaml", ["--lr=1e-5", "--lora.enabled=false", "--teacher.mode=dynamic"])
    assert yaml.safe_load(proc.stdout) == to_dict(expected)


def test_print_config_in_either_spelling():
    """``-`` and ``_`` are one in every flag: ``--print_config`` was "unknown setting; did you mean
    checkpoint.strict_config, strict_config?"."""
    from phf_megatron.training.config_io import split_argv

    for flag in ("--print-config", "--print_config"):
        assert split_argv(["--config", "c.yaml", flag, "--lr=1"]) == ("c.yaml", True, ["--lr=1"])
    assert split_argv(["--lr=1"]) == (None, False, ["--lr=1"])


def test_setting_error_under_torchrun_is_printed_once_by_rank0():
    proc = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "phf_megatron.train",
                 "--rollout.n=3"], timeout=300, OMP_NUM_THREADS="1")
    out = proc.stdout + proc.stderr
    line = "error: --training.global_batch_size: 32 rollouts do not split into prompts of rollout.n = 3 completions"
    assert proc.returncode != 0 and out.count(line) == 1, out[-4000:]
    assert "[rank0]" not in out and "[rank1]" not in out and "config_io.py" not in out  # no traceback of ours


def test_eval_cli_flags_come_from_eval_config():
    from phf_megatron.eval.config import EvalConfig

    proc = run_python([os.path.join(TOOLS, "eval_avg_at_k.py"), "--help"])
    assert proc.returncode == 0, proc.stderr
    for f in dataclasses.fields(EvalConfig):   # whatever fields EvalConfig has
        assert f"  --{f.name}=<" in proc.stdout, f.name
    from phf_megatron.rollout.choices import BACKENDS

    backend_doc = proc.stdout.split("  --backend=<str>")[1].split("\n  --")[0]
    assert all(name in backend_doc.split() for name in BACKENDS), backend_doc   # vllm_server was left out
    for argv, line in [(["--model", "m"], "error: --out_dir: is required"),
                       (["--model", "m", "--out-dir", "o", "--n", "0"], "error: --n: must be >= 1, got 0"),
                       # pass@16 of 12 samples: was left out of the scores in silence, after the whole run
                       (["--model", "m", "--out-dir", "o", "--pass_ks", "1,16"],
                        "error: --pass_ks: each must lie in [1, n=12] (pass@k of n samples), got 16"),
                       (["--model", "m", "--out_dir", "README.md"], "error: --out_dir: README.md is not a directory"),
                       (["--out_dir=o", "--temprature=1"], "error: --temprature: unknown setting; did you mean temperature?")]:
        proc = run_python([os.path.join(TOOLS, "eval_avg_at_k.py"), *argv])
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [line])


@pytest.mark.parametrize("tool, fields", [("hf_to_mcore.py", ("hf_dir", "out_dir", "tp", "pp", "dtype")),
                                          ("mcore_to_hf.py", ("mcore_dir", "out_dir", "tokenizer_dir", "hf_config",
                                                              "dtype", "max_shard_size_gb", "tp", "pp"))])
def test_converter_help_and_errors(tmp_path, tool, fields):
    path = os.path.join(TOOLS, "convert", tool)
    proc = run_python([path, "--help"])
    assert proc.returncode == 0 and all(f"  --{f}=<" in proc.stdout for f in fields), proc.stdout + proc.stderr
    assert "Transformer Engine" not in proc.stderr and proc.stderr == ""
    proc = run_python([path, f"--{fields[0]}", str(tmp_path), "--out_dir", str(tmp_path / "o"), "--dtype", "bf8"])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, ["error: --dtype: 'bf8' is not one of ('bf16', 'fp16', "
                                                              "'fp32', 'bfloat16', 'float16', 'float32')"])


@pytest.mark.parametrize("tool", ["hf_to_mcore", "mcore_to_hf"])
def test_converters_take_the_dtype_as_the_trainer_and_the_eval_spell_it(tool):
    """--dtype bfloat16 (--model.dtype's and the eval's --dtype spelling) was refused by the converters: "'bfloat16'
    is not one of ('bf16', 'fp16', 'fp32')"; both spellings name the same torch dtype."""
    import importlib

    from phf_megatron.cli import Settings
    from phf_megatron.models.config import as_dtype

    module = importlib.import_module(f"phf_megatron.tools.{tool}")
    cls = module.HfToMcore if tool == "hf_to_mcore" else module.McoreToHf
    paths = ("--hf_dir=h" if tool == "hf_to_mcore" else "--mcore_dir=m", "--out_dir=o")
    for short, long in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")):
        built = Settings(cls).build(Settings(cls).parse([*paths, f"--dtype={long}"]))
        assert as_dtype(built.dtype) == as_dtype(short)


def test_one_map_from_a_dtype_setting_to_torch():
    """model_setup, the HF rollout engine and the converters each kept a name -> torch.dtype map of their own (three
    things called DTYPES); ``choices.as_dtype`` is the one, and takes every spelling a setting takes."""
    import torch

    from phf_megatron.models import choices

    for short, long in choices.DTYPE_ALIASES.items():
        assert choices.as_dtype(short) is choices.as_dtype(long) is getattr(torch, long)
    assert choices.as_dtype(torch.float16) is torch.float16
    assert set(choices.DTYPE_SPELLINGS) == {*choices.DTYPES, *choices.DTYPE_ALIASES}
    with pytest.raises(ValueError, match=r"^dtype: expected one of \('bf16', .*'float32'\) or a torch.dtype, "
                                         r"got 'bf8'$"):
        choices.as_dtype("bf8")


def test_the_trainer_and_the_eval_take_the_converters_dtype_spellings(tmp_path):
    """--dtype bf16 (the converters', the README's) was refused by the eval ("'bf16' is not one of float32, bfloat16,
    float16") and --model.dtype=bf16 by the trainer; each short spelling is read as its torch name, the one a run's
    config.yaml, an eval's summary and their resume fingerprints hold."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.training.config_io import load_config

    for short, long in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")):
        assert load_config(argv=[f"--model.dtype={short}"]).model.dtype == long
        settings = Settings(EvalConfig)
        built = settings.build(settings.parse(["--model=m", f"--out_dir={tmp_path / 'o'}", "--dtype", short]))
        assert built.dtype == long


@pytest.mark.parametrize("tool, argv, line", [
    ("hf_to_mcore.py", ["--hf_dir", "/nonexistent/hf"], "error: --hf_dir: /nonexistent/hf does not exist"),
    ("hf_to_mcore.py", ["--hf_dir", "{tmp}"], "error: --hf_dir: no config.json in {tmp}"),
    ("mcore_to_hf.py", ["--mcore_dir", "/nonexistent/mcore"], "error: --mcore_dir: /nonexistent/mcore does not exist"),
    ("mcore_to_hf.py", ["--mcore_dir", "{tmp}"], "error: {tmp}: not a Megatron-Core dist checkpoint (no metadata.json)"),
    ("mcore_to_hf.py", ["--mcore_dir", "{tmp}/dist"], "error: --mcore_dir: no phf_megatron.json in {tmp}/dist (not "
                                                     "written by hf_to_mcore; pass --hf_config to export it)"),
])
def test_converter_input_errors_name_the_flag(tmp_path, tool, argv, line):
    """The converters' library says which argument is wrong (``hf_dir: ...``); the command names its flag."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "metadata.json").write_text("{}")   # a dist checkpoint that hf_to_mcore did not write
    proc = run_python([os.path.join(TOOLS, "convert", tool), *argv, "--out_dir", str(tmp_path / "o")],
                      CUDA_VISIBLE_DEVICES="")
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line.format(tmp=tmp_path)]), proc.stderr[-3000:]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("tool, argv, line", [
    ("hf_to_mcore", ["--hf_dir", "{tmp}", "--out_dir", "{tmp}/taken"],
     "error: --out_dir: {tmp}/taken already exists (remove it or choose another)"),
    ("hf_to_mcore", ["--hf_dir", "{tmp}", "--out_dir", "{tmp}/file"],
     "error: --out_dir: {tmp}/file already exists (remove it or choose another)"),
    ("hf_to_mcore", ["--hf_dir", "{tmp}", "--out_dir", "{tmp}/no/out"], "error: --out_dir: parent directory {tmp}/no does "
                                                                        "not exist"),
    ("hf_to_mcore", ["--hf_dir", "{tmp}/none", "--out_dir", "{tmp}/out"], "error: --hf_dir: {tmp}/none does not exist"),
    ("hf_to_mcore", ["--hf_dir", "{tmp}/taken", "--out_dir", "{tmp}/out"], "error: --hf_dir: no config.json in {tmp}/taken"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}/none", "--out_dir", "{tmp}/out"],
     "error: --mcore_dir: {tmp}/none does not exist"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/taken"],
     "error: --out_dir: {tmp}/taken already exists (remove it or choose another)"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/file"],
     "error: --out_dir: {tmp}/file already exists (remove it or choose another)"),
    # mistyped optional inputs: ignored for a training run (its export exit 0), else an errno line without the flag
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--tokenizer_dir", "{tmp}/none"],
     "error: --tokenizer_dir: {tmp}/none does not exist"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--hf_config", "{tmp}/none.json"],
     "error: --hf_config: {tmp}/none.json does not exist"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--run_config", "{tmp}/taken"],
     "error: --run_config: {tmp}/taken is not a file"),
    # a run's --base_model that is not there: the export's line, after torch, Megatron and the run's config (~5.5 s)
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--base_model", "{tmp}/none"],
     "error: --base_model: {tmp}/none does not exist here; give the base model the run was trained from"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--base_model", "{tmp}/taken"],
     "error: --base_model: {tmp}/taken is not a HF model directory here; give the base model the run was trained from"),
    # --tp 0 / --pp -1 were accepted (and ignored in one process); hf_to_mcore refused them after torch loaded
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--tp", "0"], "error: --tp: must be > 0, got 0"),
    ("mcore_to_hf", ["--mcore_dir", "{tmp}", "--out_dir", "{tmp}/out", "--pp", "-1"], "error: --pp: must be > 0, got -1"),
])
def test_converters_refuse_their_paths_before_loading_torch(tmp_path, tool, argv, line):
    """A taken --out_dir (a non-empty directory, a file), one without its parent, or a --hf_dir that does not exist
    was refused only after torch, Megatron and transformers had loaded (6-11 s on a CPU machine); so were a --hf_dir
    without config.json and a --mcore_dir that does not exist (~5 s)."""
    (tmp_path / "config.json").write_text("{}")   # {tmp} as --hf_dir passes the first look
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    (tmp_path / "file").write_text("")
    code = (f"import sys; from phf_megatron.tools.{tool} import main; rc = main(sys.argv[1:]); "
            "print('HEAVY', [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules]); sys.exit(rc)")
    proc = run_python(["-c", code, *[a.format(tmp=tmp_path) for a in argv]])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line.format(tmp=tmp_path)]), proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


@pytest.mark.parametrize("argv, line", [
    (["--tp", "3"], "error: --tp: tensor-parallel size 3 does not divide num_attention_heads=4"),
    (["--pp", "3"], "error: --pp: pipeline-parallel size 3 does not divide num_hidden_layers=2"),
    (["--tp", "0"], "error: --tp: expected a positive integer, got 0"),
])
def test_hf_to_mcore_checks_the_layout_before_loading_torch(tmp_path, argv, line):
    """--tp / --pp that do not split the model were refused after torch, Megatron and transformers had loaded and
    the checkpoint's files had been read (~5 s on a CPU machine); config.json alone says."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rope_theta": 10000.0}))
    code = ("import sys; from phf_megatron.tools.hf_to_mcore import main; rc = main(sys.argv[1:]); "
            "print('HEAVY', [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules]); sys.exit(rc)")
    proc = run_python(["-c", code, "--hf_dir", str(tmp_path), "--out_dir", str(tmp_path / "o"), *argv])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


@pytest.mark.parametrize("flag, line", [
    # was "is not one of float32, bfloat16, float16": bf16, fp16, fp32 are taken too (as by the converters)
    ("--dtype=bf8", "error: --dtype: 'bf8' is not one of ('bf16', 'fp16', 'fp32', 'bfloat16', 'float16', 'float32')"),
    ("--temperature=-1", "error: --temperature: must be >= 0 (0 = greedy), got -1.0"),
    ("--engine_kwargs={gpu_memory_utilization: 2}",
     "error: --engine_kwargs: gpu_memory_utilization: must lie in (0, 1], got 2"),
    # an unknown field was "EngineConfig.__init__() got an unexpected keyword argument 'foo'": which fields are there?
    ("--engine_kwargs={tensor_parallel: 2}",
     "error: --engine_kwargs: 'tensor_parallel' is not an EngineConfig field; did you mean tensor_parallel_size?"),
    ("--engine_kwargs={foo: 1}", "error: --engine_kwargs: 'foo' is not an EngineConfig field (its fields: {fields})"),
    ("--engine_kwargs={vllm_kwargs: {dtype: float32}}",
     "error: --engine_kwargs: vllm_kwargs: dtype is set by the eval from --dtype: use that setting instead"),
    ("--engine_kwargs={vllm_kwargs: {gpu_memory_utilization: 0.5}}", "error: --engine_kwargs: vllm_kwargs: "
     "gpu_memory_utilization is set by the eval from --engine_kwargs gpu_memory_utilization: use that setting instead"),
    # the eval passes them itself: accepted here, they were a TypeError traceback when the engine started
    ("--engine_kwargs={seed: 1}", "error: --engine_kwargs: seed is set by the eval from --seed: give it there"),
    ("--engine_kwargs={max_model_len: 64}",
     "error: --engine_kwargs: max_model_len is set by the eval from --max_model_len: give it there"),
])
def test_eval_settings_the_engine_checks_are_one_line_before_any_work(tmp_path, capsys, flag, line):
    """Values the sampler or the engine would refuse only once the model is loaded are refused
    while the command line is parsed, naming the flag, and nothing is written."""
    from phf_megatron.tools.eval_avg_at_k import main

    from phf_megatron.eval.config import ENGINE_FIELDS_SET
    from phf_megatron.rollout.factory import EngineConfig

    assert main(["--model", "m", "--out_dir", str(tmp_path / "o"), flag]) == 2
    fields = ", ".join(f.name for f in dataclasses.fields(EngineConfig) if f.name not in ENGINE_FIELDS_SET)
    assert capsys.readouterr().err.splitlines() == [line.format(fields=fields)]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, line", [
    (["--model", "/nonexistent/m"], "error: --model: /nonexistent/m does not exist"),
    (["--model", "{tmp}", "--adapter", "/nonexistent/a"], "error: --adapter: /nonexistent/a does not exist"),
    (["--megatron_checkpoint", "/nonexistent/c", "--model", "{tmp}"],
     "error: --megatron_checkpoint: /nonexistent/c does not exist"),
])
def test_eval_model_paths_that_are_not_there_are_refused_before_the_runner_loads(tmp_path, argv, line):
    """A mistyped --model, --adapter or --megatron_checkpoint was said after the runner had loaded transformers and
    the rest (~4 s on a CPU machine), then after the settings' own checks had loaded torch and math-verify (~1.9 s);
    now before any of them (~0.06 s), as the converters say theirs."""
    code = ("import sys; from phf_megatron.tools.eval_avg_at_k import main; rc = main(sys.argv[1:]); "
            "print('HEAVY', [m for m in ('torch', 'math_verify', 'transformers', 'vllm', 'phf_megatron.eval.runner') "
            "if m in sys.modules]); sys.exit(rc)")
    proc = run_python(["-c", code, *[a.format(tmp=tmp_path) for a in argv], "--out_dir", str(tmp_path / "o")])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "HEAVY []" and not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, line", [
    (["--model", "/nonexistent/m"], "error: --model: /nonexistent/m does not exist"),
    (["--model", "{tmp}/file"], "error: --model: {tmp}/file is not a directory"),
    (["--model", "{tmp}"], "error: --model: {tmp} has no config.json (not a HF model directory)"),
    (["--model", "{tmp}", "--adapter", "{tmp}"], "error: --model: {tmp} has no config.json (not a HF base model "
                                                 "directory)"),
    (["--model", "{tmp}/hf", "--adapter", "/nonexistent/a"], "error: --adapter: /nonexistent/a does not exist"),
    (["--model", "{tmp}/hf", "--adapter", "{tmp}"], "error: --adapter: {tmp} has no adapter_config.json (not a PEFT "
                                                    "adapter directory)"),
    (["--megatron_checkpoint", "/nonexistent/iter_0000100"],
     "error: --megatron_checkpoint: /nonexistent/iter_0000100 does not exist"),
    # a training run or one of its checkpoints given as the adapter: the line says which directory was meant
    (["--model", "{tmp}/hf", "--adapter", "{tmp}/run"], "error: --adapter: {tmp}/run has no adapter_config.json (not a "
                                                        "PEFT adapter directory; a training run: did you mean "
                                                        "{tmp}/run/export/peft_adapter?)"),
    (["--model", "{tmp}/hf", "--adapter", "{tmp}/run/checkpoints/iter_0000002"],
     "error: --adapter: {tmp}/run/checkpoints/iter_0000002 has no adapter_config.json (not a PEFT adapter directory; "
     "a training checkpoint: give it as --megatron_checkpoint)"),
    (["--model", "{tmp}/hf", "--adapter", "{tmp}/run/checkpoints"],    # which --megatron_checkpoint takes too
     "error: --adapter: {tmp}/run/checkpoints has no adapter_config.json (not a PEFT adapter directory; "
     "a training checkpoint: give it as --megatron_checkpoint)"),
    # and as the model: was only "has no config.json (not a HF model directory)"
    (["--model", "{tmp}/run"], "error: --model: {tmp}/run has no config.json (not a HF model directory; a training "
                               "run: give it as --megatron_checkpoint)"),
    (["--model", "{tmp}/run/checkpoints/iter_0000002"], "error: --model: {tmp}/run/checkpoints/iter_0000002 has no "
     "config.json (not a HF model directory; a training run: give it as --megatron_checkpoint)"),
])
def test_eval_model_path_errors_name_the_flag_and_write_nothing(tmp_path, capsys, argv, line):
    """A mistyped --model, --adapter or --megatron_checkpoint was "model directory '...' does not exist" (also
    for a file), "<dir>: no adapter_config.json" or "Megatron checkpoint directory '...'", without the flag,
    after the output directory had been made."""
    from safetensors.torch import save_file

    import torch
    from phf_megatron.tools.eval_avg_at_k import main

    (tmp_path / "file").write_text("x")
    os.makedirs(tmp_path / "run" / "export" / "peft_adapter")
    os.makedirs(tmp_path / "run" / "checkpoints" / "iter_0000002")
    (tmp_path / "run" / "checkpoints" / "iter_0000002" / "meta.json").write_text("{}")
    (tmp_path / "run" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "qwen3"}')
    save_file({"w": torch.zeros(1)}, str(tmp_path / "hf" / "model.safetensors"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main([*argv, "--benchmarks", "aime24", "--out_dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.splitlines() == [line.format(tmp=tmp_path)]
    assert not (tmp_path / "o").exists()


def test_toy_command_help_describes_every_flag_and_its_default():
    """python -m phf_megatron.toy prepare --help listed --out, --seed and --warmup-steps bare: no word on what
    they are, nor their defaults (0, 300)."""
    import argparse

    from phf_megatron.toy.__main__ import _parser

    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {"prepare", "evaluate"}
    for name, sub in commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.option_strings)
            if action.default is not None:
                assert "%(default)s" in action.help, (name, action.option_strings)
    proc = run_python(["-m", "phf_megatron.toy", "prepare", "--help"])
    assert proc.returncode == 0 and "(default: 300)" in " ".join(proc.stdout.split()), proc.stderr


# ----------------------------------------------------------------------------- the installed commands


def _console_scripts() -> dict[str, str]:
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_every_console_script_is_a_command_that_answers_help(capsys):
    """``[project.scripts]``: each target imports, is callable and answers ``--help`` (in this
    process: the scripts pip generates call exactly this function)."""
    import importlib

    scripts = _console_scripts()
    assert set(scripts) == {"phf-train", "phf-hf-to-mcore", "phf-mcore-to-hf", "phf-eval", "phf-plot-run",
                            "phf-paper-table"}
    for name, target in scripts.items():
        module, _, function = target.partition(":")
        main = getattr(importlib.import_module(module), function)
        assert callable(main) and main(["--help"]) == 0, name
        assert "settings (--" in capsys.readouterr().out, name


@pytest.mark.skipif(shutil.which("phf-eval") is None, reason="phf-eval is not installed here (pip install -e . puts "
                                                               "it on PATH, as CI does)")
def test_the_installed_eval_command_answers_help():
    proc = subprocess.run(["phf-eval", "--help"], capture_output=True, text=True, timeout=120, env=python_env())
    assert proc.returncode == 0 and "  --out_dir=<str>  (required)" in proc.stdout, proc.stderr


@pytest.mark.parametrize("config", ["TrainConfig", "EvalConfig", "HfToMcore", "McoreToHf", "PlotRun", "PaperTable"])
def test_every_setting_of_every_command_has_its_docstring(config):
    """``--help`` documents every flag from the docstring under its field."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.tools.hf_to_mcore import HfToMcore
    from phf_megatron.tools.mcore_to_hf import McoreToHf
    from phf_megatron.tools.paper_table import PaperTable
    from phf_megatron.tools.plot_run import PlotRun
    from phf_megatron.training.config import TrainConfig

    cls = locals()[config]
    assert [s.key for s in Settings(cls).settings.values() if not s.doc] == []


# ----------------------------------------------------------------------------- what the docs say


def test_the_base_model_settings_say_what_the_trainer_does_with_them():
    """--model.hf_dir is read for the config, tokenizer, engines and export; --model.pretrained_checkpoint
    only replaces where the base weights come from (nothing is converted into the run)."""
    from phf_megatron.training.config import TrainConfig

    docs = {s.key: s.doc for s in Settings(TrainConfig).settings.values()}
    assert "Required to run" in docs["model.hf_dir"] and "rollout engines' starting weights" in docs["model.hf_dir"]
    assert "base weights under any TP/PP" in docs["model.pretrained_checkpoint"]
    assert "nothing is converted" in docs["model.pretrained_checkpoint"] and "<run_dir>/base" not in docs[
        "model.pretrained_checkpoint"]


def _tool_command_lines():
    """``(where, tool, flags)`` for each command line of a tool the docs give: README.md, BENCHMARKS.md, docs/*.md,
    the launchers and the GPU scripts, and each tool's own ``--help`` text (its module docstring); a line ending in
    ``\\`` goes on in the next. A tool's flags run to the end of its code span or command: a `` |``, ``;``,
    ``&&``, ``#``, another tool, or ``--`` (paper_table's trainer overrides); a quoted value (``--eval_args="--limit
    5"``) is not one of its flags."""
    import glob
    import re

    tool = re.compile(r"(?:tools/(?:convert/)?|phf_megatron\.tools\.)(hf_to_mcore|mcore_to_hf|eval_avg_at_k|paper_table|"
                      r"plot_run)\b(?:\.py)?|\bphf-(hf-to-mcore|mcore-to-hf|eval|paper-table|plot-run)\b")
    docs = [os.path.join(REPO, "README.md"), os.path.join(REPO, "BENCHMARKS.md")]
    for pattern in ("docs/*.md", "examples/*.sh", "examples/slurm/*.sbatch", "benchmarks/gpu/*.sh",
                    "benchmarks/gpu/*.md", "phf_megatron/tools/*.py"):
        docs += sorted(glob.glob(os.path.join(REPO, pattern)))
    for doc in docs:
        text = open(doc, encoding="utf-8").read()
        if doc.endswith(".py"):   # the tool's --help text
            text = text.split('"""')[1] if text.startswith('"""') else ""
        for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
            matches = list(tool.finditer(line))
            for m, following in zip(matches, [*matches[1:], None]):
                rest = line[m.end():following.start() if following else None]
                rest = re.split(r"`|\s\||;|&&|#|\s--(?:\s|$)", re.sub(r"\"[^\"]*\"|'[^']*'", "", rest))[0]
                name = m.group(1) or {"eval": "eval_avg_at_k"}.get(m.group(2), m.group(2).replace("-", "_"))
                yield f"{os.path.relpath(doc, REPO)}:{number}", name, re.findall(r"(?<![\w-])--([a-z][\w-]*)", rest)


def test_every_tool_flag_the_docs_name_exists():
    """Each flag of a tool command the docs give (``tools/*.py ...``, ``phf-eval ...``) is a setting of that tool,
    so a renamed flag cannot leave a documented command that stops at 'unknown setting' (README's "After training"
    block was the only one checked)."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.errors import UserError
    from phf_megatron.tools.hf_to_mcore import HfToMcore
    from phf_megatron.tools.mcore_to_hf import McoreToHf
    from phf_megatron.tools.paper_table import PaperTable
    from phf_megatron.tools.plot_run import PlotRun

    tools = {"hf_to_mcore": HfToMcore, "mcore_to_hf": McoreToHf, "eval_avg_at_k": EvalConfig,
             "paper_table": PaperTable, "plot_run": PlotRun}
    checked, unknown = 0, []
    for where, name, flags in _tool_command_lines():
        settings = Settings(tools[name])
        for flag in flags:
            if flag in ("help", "verbose"):   # every command's own options
                continue
            try:
                settings.resolve(flag.replace("-", "_").removeprefix("no_"))
                checked += 1
            except UserError:
                unknown.append(f"{where}: {name} --{flag}")
    assert checked >= 100 and unknown == [], unknown


def test_the_benchmark_commands_the_docs_give_run_from_the_repository_root():
    """``python benchmarks/x.py`` (no ``-m``, no ``PYTHONPATH=.``) puts benchmarks/ first on the path, not the
    repository: a script that imports ``benchmarks.*`` without putting the repository on ``sys.path`` itself then
    stops with ModuleNotFoundError (docs/scaling.md and BENCHMARKS.md gave rollout_sync.py so); such a script must
    be given as ``python -m benchmarks.x``."""
    import glob
    import re

    docs = [os.path.join(REPO, "README.md"), os.path.join(REPO, "BENCHMARKS.md"),
            *sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
            *sorted(glob.glob(os.path.join(REPO, "benchmarks", "*.md")))]
    given, broken = 0, []
    for doc in docs:
        for number, line in enumerate(open(doc, encoding="utf-8"), 1):
            for prefix, name in re.findall(r"(PYTHONPATH=\S+\s+(?:\w+=\S+\s+)*)?python benchmarks/(\w+)\.py", line):
                given += 1
                source = open(os.path.join(REPO, "benchmarks", f"{name}.py")).read()
                puts_repo_on_path = "sys.path.insert(0, os.path.dirname(os.path.dirname(" in source   # as scaling.py
                if not prefix and not puts_repo_on_path and re.search(r"^\s*(from|import) benchmarks\b", source, re.M):
                    broken.append(f"{os.path.relpath(doc, REPO)}:{number}: python benchmarks/{name}.py")
    assert given >= 5 and broken == [], broken


def test_every_test_the_docs_name_exists():
    """The docs prove their guarantees by naming tests (``tests/x.py::test_y``, then ``::test_z`` in the same
    file): each named test is defined in the file named before it, so a renamed or moved test cannot leave a
    guarantee pointing at nothing."""
    import glob
    import re

    docs = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
            os.path.join(REPO, "benchmarks", "gpu", "README.md")]
    named, missing = 0, []
    for doc in docs:
        with open(doc, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                path = None
                for file, test in re.findall(r"(tests/[\w/]+\.py)?::(test_\w+)", line):
                    path = file or path
                    if path is None:
                        continue
                    named += 1
                    source = os.path.join(REPO, path)
                    if not os.path.isfile(source) or not re.search(rf"^(async )?def {test}\(", open(source).read(), re.M):
                        missing.append(f"{os.path.relpath(doc, REPO)}:{number}: {path}::{test}")
    assert named > 30 and not missing, missing


def test_every_trainer_setting_the_docs_name_exists():
    """Each ``--section.field[=value]`` (or ```section.field``` alone) in README.md, BENCHMARKS.md, docs/*.md and
    the presets' and launchers' comments is a TrainConfig setting or section property (``x_*``: prefixes one),
    so a renamed setting cannot leave a command that stops at 'unknown setting'."""
    import glob
    import re

    from phf_megatron.training.config import TrainConfig
    from phf_megatron.training.config_io import SETTINGS

    docs = [os.path.join(REPO, "README.md"), os.path.join(REPO, "BENCHMARKS.md")]
    for pattern in ("docs/*.md", "configs/*.yaml", "examples/*.sh", "examples/slurm/*.sbatch"):
        docs += sorted(glob.glob(os.path.join(REPO, pattern)))
    sections, named, unknown = _sections(TrainConfig), 0, []
    for doc in docs:
        for number, line in enumerate(open(doc, encoding="utf-8"), 1):
            if doc.endswith((".yaml", ".sh", ".sbatch")) and not line.startswith("#"):
                continue   # the presets' and launchers' comments
            found = re.findall(r"(?<![\w.-])--([a-z]+)\.(\w+\*?)", line)
            quoted = (re.fullmatch(r"([a-z]+)\.(\w+\*?)(=\S*)?", q) for q in re.findall(r"`([^`\s]+)`", line))
            for section, field in found + [m.groups()[:2] for m in quoted if m]:
                if section not in sections:
                    continue   # another tool's flag
                key, package = f"{section}.{field}", os.path.join(REPO, "phf_megatron", section)
                if (key in SETTINGS.types or isinstance(getattr(sections[section], field, None), property)
                        or field.endswith("*") and any(k.startswith(key[:-1]) for k in SETTINGS.types)):
                    named += 1
                elif not (field in ("py", "md", "yaml", "json") or os.path.exists(os.path.join(package, f"{field}.py"))
                          or any(re.search(rf"^(def|class) {field}\b", open(f).read(), re.M)
                                 for f in glob.glob(os.path.join(package, "*.py")))):
                    unknown.append(f"{os.path.relpath(doc, REPO)}:{number}: {key}")   # nor a module or function
    assert named > 150 and unknown == [], unknown
