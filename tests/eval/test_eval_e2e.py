"""The evaluator end to end on CPU: a tiny Qwen3 with the real tokenizer on AIME 2024 problems.

Checks the records against an independent regrading and recount, resumption (rerun, more
samples, a SIGKILL mid-run), data parallelism, the PEFT path and bad input through the CLI.
The random tiny model never answers correctly; the metric arithmetic is tested in test_metrics.
"""

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from phf_megatron.errors import ConfigError
from phf_megatron.eval import EvalConfig, grade, run_eval, sample_seed
from phf_megatron.eval.metrics import score_benchmark
from phf_megatron.eval.records import load_records, shard_path
from tests.helpers import REPO, python_env, run_python
from tests.helpers.processes import assert_no_survivor, session_members

TOOL = os.path.join(REPO, "tools", "eval_avg_at_k.py")


def _config(tmp_path, model, data, name="run", **kw):
    base = dict(out_dir=str(tmp_path / name), model=model, benchmarks=("aime24",), data_dir=data, n=2, limit=3,
                max_new_tokens=16, backend="hf", dtype="float32", batch_size=1, pass_ks=(1, 2))
    base.update(kw)
    return EvalConfig(**base)


def _lines(run_dir):
    out = []
    for r in sorted(f for f in os.listdir(run_dir) if f.startswith("samples.rank")):
        with open(os.path.join(run_dir, r)) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def _check_run(config, summary):
    """Independent recount of a finished run; returns {(problem, sample): output text}."""
    records, dups = load_records(config.out_dir)
    lines = _lines(config.out_dir)
    assert dups == 0 and len(lines) == len(records) == 3 * config.n         # nothing lost, nothing twice
    per = {}
    for r in lines:
        assert r["seed"] == sample_seed(config.seed, r["benchmark"], r["problem_id"], r["sample_index"])
        assert r["correct"] == grade(r["output"], r["gold"], require_boxed=True)
        assert 0 < r["completion_tokens"] <= config.max_new_tokens
        per.setdefault(r["problem_id"], []).append(r)
    assert sorted(per) == ["aime24-I-01", "aime24-I-02", "aime24-I-03"]
    want = score_benchmark("aime24", per, config.n, config.pass_ks)
    with open(summary.summary_path) as f:
        got = json.load(f)
    assert got["benchmarks"]["aime24"] == want.to_json()
    assert got["suite_average_at_k"] == want.average_at_k and got["grader"] == "official"
    return {(r["problem_id"], r["sample_index"]): r["output"] for r in lines}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_dir, eval_sets):
    """One uninterrupted single-process run (n=2, 3 problems): (config, summary, outputs)."""
    config = _config(tmp_path_factory.mktemp("reference"), tiny_dir, eval_sets, plot=True)
    summary = run_eval(config)
    return config, summary, _check_run(config, summary)


def test_transformers_backend_end_to_end_and_resume(tmp_path, reference):
    config, summary, outputs = reference
    assert summary.generated == 6 and os.path.isfile(summary.plot_path)
    assert "Avg@2 (official)" in summary.table() and "Avg@2 (extended)" in summary.table()
    assert "suite average" in summary.table()
    config = dataclasses.replace(config, out_dir=str(tmp_path / "copy"), plot=False)
    shutil.copytree(reference[0].out_dir, config.out_dir)
    # rerun: nothing regenerated; more samples: only the new ones, the old ones untouched
    assert run_eval(config).generated == 0
    more = dataclasses.replace(config, n=3)
    assert run_eval(more).generated == 3
    assert {k: v for k, v in _check_run(more, run_eval(more)).items() if k[1] < 2} == outputs
    # the other grading rule regrades the stored outputs; it generates nothing
    assert run_eval(dataclasses.replace(config, require_boxed=False)).generated == 0
    # a run directory written before the official context default (None = the model's own, 1,024 here) resumes
    fingerprint_path = os.path.join(config.out_dir, "run_config.json")
    with open(fingerprint_path) as f:
        fingerprint = json.load(f)
    assert (fingerprint["top_p"], fingerprint["max_model_len"]) == (0.95, 1024)
    with open(fingerprint_path, "w") as f:
        json.dump({**fingerprint, "max_model_len": None}, f)
    assert run_eval(config).generated == 0
    # other generation settings may not be mixed into the same run
    with pytest.raises(ValueError, match="other settings.*temperature"):
        run_eval(dataclasses.replace(config, temperature=0.6))


@pytest.mark.vllm
def test_vllm_backend_end_to_end_matches_transformers_greedy(tmp_path, tiny_dir, eval_sets):
    pytest.importorskip("vllm")
    config = _config(tmp_path, tiny_dir, eval_sets, name="vllm", backend="vllm", temperature=0.0, batch_size=8)
    vllm_out = _check_run(config, run_eval(config))
    hf = _config(tmp_path, tiny_dir, eval_sets, name="hf", temperature=0.0, batch_size=8)
    assert _check_run(hf, run_eval(hf)) == vllm_out          # greedy: same text from both backends


def test_kill_and_resume_loses_nothing_and_repeats_nothing(tmp_path, tiny_dir, eval_sets, reference):
    run_dir = str(tmp_path / "killed")
    cmd = [sys.executable, TOOL, "--model", tiny_dir, "--data-dir", eval_sets, "--benchmarks", "aime24",
           "--limit", "3", "--n", "2", "--max-new-tokens", "16", "--backend", "hf", "--dtype", "float32",
           "--batch-size", "1", "--out-dir", run_dir]
    proc = subprocess.Popen(cmd, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shard = shard_path(run_dir, 0)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if os.path.isfile(shard) and open(shard).read().count("\n") >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with open(shard) as f:
        before = f.read()
    kept = before[:before.rfind("\n") + 1]
    assert 2 <= kept.count("\n") < 6, "the run was not killed mid-way; lengthen the generation"
    config = _config(tmp_path, tiny_dir, eval_sets, name="killed")
    summary = run_eval(config)
    assert summary.generated == 6 - kept.count("\n")
    with open(shard) as f:
        assert f.read().startswith(kept)                       # finished samples untouched
    assert _check_run(config, summary) == reference[2]           # same samples as an uninterrupted run


def test_data_parallel_replicas_split_the_work(tmp_path, tiny_dir, eval_sets, reference):
    config = _config(tmp_path, tiny_dir, eval_sets, name="dp", data_parallel=2)
    assert _check_run(config, run_eval(config)) == reference[2]
    assert all(os.path.getsize(shard_path(config.out_dir, r)) > 0 for r in (0, 1))


def test_peft_adapter_is_merged_into_the_base(tmp_path, tiny_dir, eval_sets, capsys):
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    lora = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    lora.save_pretrained(str(tmp_path / "adapter"))
    want = lora.merge_and_unload().state_dict()
    config = _config(tmp_path, tiny_dir, eval_sets, name="peft", adapter=str(tmp_path / "adapter"),
                     n=1, max_new_tokens=2, pass_ks=(1,))
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()   # as a fresh process has them: the merge printed their bars in the main job's log
    capsys.readouterr()
    run_eval(config)
    err = capsys.readouterr().err
    assert (f"eval: merging {tmp_path / 'adapter'} into {tiny_dir} in {config.out_dir}/merged_model (a rerun "
            "reuses it)") in err.splitlines()   # minutes at 8B: said, not silent
    # our line, not transformers' bars (the one "Loading weights" left is the hf engine loading the merged model)
    assert "model shards" not in err and err.count("Loading weights: 100%") == 1, err[-2000:]
    assert hf_logging.is_progress_bar_enabled()   # a library caller's setting is back
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(config.out_dir, "merged_model"), dtype=torch.float32)
    for name, t in merged.state_dict().items():
        torch.testing.assert_close(t, want[name], rtol=0, atol=1e-6)


def test_megatron_checkpoint_is_converted_on_the_fly(tmp_path, tiny_dir, eval_sets, monkeypatch, capfd):
    """HF -> Megatron (the converter tool) -> eval with --megatron-checkpoint: the same greedy
    samples as evaluating the HF directory (the conversion round trip is bit-exact). The evaluator
    runs as in a process that holds a one-process group of its own (its rendezvous variables set,
    their port taken): the converter's process forms its own group, not the parent's. The conversion
    (minutes at 8B) says so, and shows its bar (it was silent)."""
    pytest.importorskip("phf_megatron.convert.checkpoints")
    mcore = str(tmp_path / "mcore")
    run_python([os.path.join(REPO, "tools", "convert", "hf_to_mcore.py"), "--hf-dir", tiny_dir, "--out-dir",
                mcore, "--dtype", "fp32"]).check_returncode()
    kw = dict(n=1, max_new_tokens=6, temperature=0.0, batch_size=8, pass_ks=(1,))
    from_mcore = _config(tmp_path, None, eval_sets, name="from_mcore", megatron_checkpoint=mcore, **kw)
    from_hf = _config(tmp_path, tiny_dir, eval_sets, name="from_hf", **kw)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(held.getsockname()[1])).items():
            monkeypatch.setenv(name, value)
        capfd.readouterr()
        converted = run_eval(from_mcore)
    err = capfd.readouterr().err.splitlines()
    assert f"eval: converting {mcore} to HF into {from_mcore.out_dir}/converted_model (minutes at 8B; a rerun " \
           "reuses it)" in err, err
    bar = [line for line in err if line.startswith("mcore->hf:")]
    assert len(bar) == 2 and re.search(r"\| (\d+)/\1 \[", bar[-1]), err
    assert _check_run(from_mcore, converted) == _check_run(from_hf, run_eval(from_hf))
    (tmp_path / "not_mcore" / "checkpoints").mkdir(parents=True)   # a run directory: named, not as the converter's
    with pytest.raises(ConfigError) as err:                       # "mcore_dir: ... pass --hf_config"
        run_eval(_config(tmp_path, None, eval_sets, name="bad", megatron_checkpoint=str(tmp_path / "not_mcore"),
                         **kw))
    assert err.value.line == (f"--megatron_checkpoint: {tmp_path / 'not_mcore'} is neither hf_to_mcore's output (no "
                              f"phf_megatron.json) nor a training checkpoint (a run: give "
                              f"{tmp_path / 'not_mcore' / 'checkpoints'}/iter_N)")
    training_ckpt = tmp_path / "run" / "checkpoints" / "iter_0000002"    # what phf_megatron.train writes
    training_ckpt.mkdir(parents=True)
    (training_ckpt / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=r"a training checkpoint; tools/convert/mcore_to_hf.py says: .*no config.yaml"):
        run_eval(_config(tmp_path, None, eval_sets, name="train_ckpt", megatron_checkpoint=str(training_ckpt), **kw))


def test_cli_prints_both_columns_and_uses_the_official_non_thinking_settings(tmp_path, tiny_dir, eval_sets,
                                                                           capsys):
    """--no-thinking: top-p 0.8 and a 32,768 context (here capped at the tiny model's 1,024), as
    official OPSD's evaluate_math.py picks them; the table shows both graders' Avg@k."""
    out = tmp_path / "nothink"
    rc = _cli()(["--model", tiny_dir, "--data-dir", eval_sets, "--out-dir", str(out), "--benchmarks", "aime24",
                 "--limit", "1", "--n", "1", "--max-new-tokens", "2", "--backend", "hf", "--dtype", "float32",
                 "--no-thinking"])
    printed = capsys.readouterr().out
    assert rc == 0 and "Avg@1 (official)" in printed and "Avg@1 (extended)" in printed
    with open(out / "run_config.json") as f:
        fingerprint = json.load(f)
    assert (fingerprint["thinking"], fingerprint["top_p"], fingerprint["max_model_len"]) == (False, 0.8, 1024)
    thinking = EvalConfig(out_dir="x", model="m")
    assert (thinking.sampling_top_p, thinking.engine_max_model_len(40_960), thinking.engine_max_model_len(None)) == \
        (0.95, 40_960, 40_960)
    plain = EvalConfig(out_dir="x", model="m", thinking=False)
    assert (plain.sampling_top_p, plain.engine_max_model_len(40_960)) == (0.8, 32_768)
    explicit = EvalConfig(out_dir="x", model="m", thinking=False, top_p=0.95, max_model_len=40_960)
    assert (explicit.sampling_top_p, explicit.engine_max_model_len(1024)) == (0.95, 40_960)


def _cli():
    from phf_megatron.tools.eval_avg_at_k import main

    return main


@pytest.mark.parametrize("bench,message", [
    ("aime23", "unknown benchmark 'aime23'"),
    ("{tmp}/empty.jsonl", "empty.jsonl: empty file"),
    ("{tmp}/bad.jsonl", "bad.jsonl:2: row has no answer"),
])
def test_cli_bad_input_is_a_clear_error_before_any_model_loads(tmp_path, tiny_dir, eval_sets, capsys,
                                                               bench, message):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"problem": "1+1", "answer": 2}\n{"problem": "2+2"}\n')
    rc = _cli()(["--model", tiny_dir, "--data-dir", eval_sets, "--out-dir", str(tmp_path / "o"),
                 "--benchmarks", bench.format(tmp=tmp_path), "--backend", "hf"])
    assert rc == 2 and message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o" / "run_config.json")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_data_parallel_eval_leaves_no_replica_behind(tmp_path, tiny_dir, eval_sets):
    """The replicas are spawned processes (each holds a GPU on a GPU machine): a SIGKILLed evaluator
    must take them along, or they go on writing the shards a rerun resumes."""
    run_dir = str(tmp_path / "dp_killed")
    cmd = [sys.executable, TOOL, "--model", tiny_dir, "--data-dir", eval_sets, "--benchmarks", "aime24",
           "--n", "4", "--max-new-tokens", "64", "--backend", "hf", "--dtype", "float32", "--batch-size", "1",
           "--data-parallel", "2", "--out-dir", run_dir]
    proc = subprocess.Popen(cmd, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not all(
            os.path.isfile(shard_path(run_dir, r)) and os.path.getsize(shard_path(run_dir, r)) for r in (0, 1)):
        time.sleep(0.05)
    assert proc.poll() is None, "the evaluator ended before both replicas wrote a sample"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert_no_survivor(proc.pid, "the killed evaluator (its replicas)")


def _holder(pids: list[int], path: str) -> int | None:
    """The process of ``pids`` that holds ``path`` open (a data-parallel worker its shard)."""
    for pid in pids:
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == path for fd in os.listdir(f"/proc/{pid}/fd")):
                return pid
        except OSError:   # gone meanwhile
            continue
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_data_parallel_worker_killed_by_a_signal_is_one_line_naming_it(tmp_path, tiny_dir, eval_sets):
    """A replica the OOM killer SIGKILLs (the test sends it) ended the eval in a RuntimeError traceback ("data-parallel
    workers failed (exit codes {'eval-dp1': -9})"): one line naming the worker, its GPUs and the signal, exit code 1."""
    run_dir = str(tmp_path / "dp_oom")
    cmd = [sys.executable, TOOL, "--model", tiny_dir, "--data-dir", eval_sets, "--benchmarks", "aime24", "--limit", "4",
           "--n", "4", "--max-new-tokens", "64", "--backend", "hf", "--dtype", "float32", "--batch-size", "1",
           "--data-parallel", "2", "--out-dir", run_dir]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(cmd, env=python_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    shard, worker, deadline = os.path.abspath(shard_path(run_dir, 1)), None, time.time() + 240
    while worker is None and time.time() < deadline and proc.poll() is None:
        if os.path.isfile(shard) and os.path.getsize(shard):   # a sample written: the worker is well under way
            worker = _holder(session_members(proc.pid), shard)
        time.sleep(0.01)
    assert worker is not None, "eval-dp1 ended before it could be killed"
    os.kill(worker, signal.SIGKILL)
    assert proc.wait(timeout=240) == 1
    stderr = (tmp_path / "stderr").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert stderr.splitlines()[-1] == (
        "error: data-parallel worker eval-dp1 (no GPU) was killed by SIGKILL (out of memory? the kernel's OOM killer "
        f"sends it); the samples written before are kept in {run_dir}; rerun the same command to resume"), stderr[-3000:]
