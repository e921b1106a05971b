"""The SFT baseline through the whole trainer on the tiny CPU preset (``--method=sft``): resume is exact,
the official baseline's switches change what is scored, truncation is counted, bad settings are one line."""

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from ..helpers import run_python
from ..helpers.tiny_run import assert_ok, assert_same_steps, read_metrics, train
from .test_run_export import _documented_metrics

SFT = ("--method=sft", "--lr=1e-3")


def _adapters(run_dir):
    return load_file(os.path.join(run_dir, "export", "peft_adapter", "adapter_model.safetensors"))


def test_sft_resume_reproduces_the_straight_run(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    common = (*SFT, "--training.train_iters=4", "--checkpoint.save_interval=2")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert_ok(train(hf, data, straight, *common))
    assert_ok(train(hf, data, resumed, *SFT, "--training.train_iters=2", "--checkpoint.save_interval=2"))
    assert_ok(train(hf, data, resumed, *common))  # resumes from iter 2 of the same run dir
    assert_same_steps(straight, resumed, ("loss", "grad_norm", "lr", "num_tokens", "rollout_digest"), 4)
    s = read_metrics(straight)
    assert all(a["grad_norm"] > 0 and a["num_tokens"] > 0 and a["sft_truncated"] == 0 for a in s)
    assert s[-1]["loss"] < s[0]["loss"]  # lr 1e-3 on the same small set: the cross-entropy falls
    for k, v in _adapters(straight).items():
        torch.testing.assert_close(_adapters(resumed)[k], v, rtol=0, atol=0)
    with open(os.path.join(straight, "checkpoints", "iter_0000004", "meta.json")) as f:
        parts = json.load(f)["parts"]
    assert "teacher" not in parts and "adapters" in parts  # no teacher, no EMA state
    written = {k for m in s for k in m}
    assert written <= _documented_metrics(), sorted(written - _documented_metrics())
    assert not written & {"loss_opsd", "loss_flow", "time_teacher_s", "sync_probe_diff"}


def test_an_sft_resume_with_lora_dropout_draws_the_straight_runs_masks(tiny_inputs, tmp_path):
    """SFT trains with LoRA dropout by default (the tiny preset turns it off): the checkpoint's RNG state gives
    the resumed steps the uninterrupted run's masks, so its losses and gradient norms are equal (with
    --checkpoint.no_load_rng=true steps 3 and 4 differ)."""
    hf, data = tiny_inputs
    sft = (*SFT, "--model.disable_dropout=null")
    common = (*sft, "--training.train_iters=4", "--checkpoint.save_interval=2")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert_ok(train(hf, data, straight, *common))
    assert_ok(train(hf, data, resumed, *sft, "--training.train_iters=2", "--checkpoint.save_interval=2"))
    assert_ok(train(hf, data, resumed, *common))
    assert_same_steps(straight, resumed, ("loss", "grad_norm", "lr", "num_tokens"), 4)


@pytest.mark.slow  # ~115 s: torchrun worlds of 2 ranks on 2 cores
def test_distributed_optimizer_resume_restores_each_ranks_shards(tiny_inputs, tmp_path):
    """``--optimizer.use_distributed_optimizer`` at DP 2: each rank saves its shard of the main parameters
    and Adam moments (Megatron's ``state_dict`` leaves them out), so 2 steps + resume + 2 steps equal 4 straight
    steps bit for bit; resuming with the setting switched, or with another learning-rate schedule past the settings
    check, is one line naming it."""
    hf, data = tiny_inputs
    dist_opt = (*SFT, "--optimizer.use_distributed_optimizer=true", "--checkpoint.save_interval=2")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert_ok(train(hf, data, straight, *dist_opt, "--training.train_iters=4", nproc=2))
    assert_ok(train(hf, data, resumed, *dist_opt, "--training.train_iters=2", nproc=2))
    assert_ok(train(hf, data, resumed, *dist_opt, "--training.train_iters=4", nproc=2))
    assert_same_steps(straight, resumed, ("loss", "grad_norm", "lr", "num_tokens"), 4)
    for k, v in _adapters(straight).items():
        torch.testing.assert_close(_adapters(resumed)[k], v, rtol=0, atol=0)
    for dp_rank in (0, 1):  # a shard per data-parallel rank: the moments of its slice of the adapters
        saved = torch.load(os.path.join(resumed, "checkpoints", "iter_0000004", f"rank_tp00_pp000_dp{dp_rank:03d}.pt"),
                           weights_only=True)["optimizer"]
        [buckets] = saved["shards"][0][0].values()  # buffer 0, its one (param, grad) dtype pair
        entries = [e for bucket in buckets for e in bucket]
        assert entries and all(e["exp_avg_sq"].abs().sum() > 0 for e in entries if e["exp_avg_sq"].numel())
    for flags, message in (
            (("--optimizer.use_distributed_optimizer=false",),
             "part 'optimizer' was saved with scope 'rank', the run asks for 'model_parallel': resume with "
             "--optimizer.use_distributed_optimizer=true (the checkpoint's), or skip it (--checkpoint.no_load_optim)"),
            (("--lr=2e-3", "--checkpoint.strict_config=false"),  # past the settings check: the schedule's own
             "the learning-rate schedule differs from the checkpoint's (optimizer.* settings, training.global_batch_size, "
             "rollout.n, or the dataset's row count): max_lr: checkpoint 0.001, now 0.002")):
        proc = train(hf, data, resumed, *dist_opt, "--training.train_iters=6", *flags, nproc=2)
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")]
        assert proc.returncode != 0 and errors, proc.stderr[-3000:]  # not a setting: each rank that read it says so
        assert all(line.endswith(message) for line in errors), errors


def test_a_bf16_resume_without_the_optimizer_goes_on_from_the_saved_weights(tiny_inputs, tmp_path):
    """``--checkpoint.no_load_optim`` in bf16: the optimizer's fp32 main parameters are refreshed from the
    loaded adapters (Megatron's reload_model_params); before, the first resumed update was written over
    the initial adapters. Adam's first step moves each weight by at most lr, so step 7 lies within lr of
    step 6, which lies several lr away from the start."""
    hf, data = tiny_inputs
    lr = 1e-2
    run = str(tmp_path / "run")
    common = ("--method=sft", f"--lr={lr}", "--model.dtype=bfloat16", "--checkpoint.save_interval=0")
    assert_ok(train(hf, data, run, *common, "--training.train_iters=6"))
    saved = {k: v.float() for k, v in _adapters(run).items()}
    assert_ok(train(hf, data, run, *common, "--training.train_iters=7", "--checkpoint.no_load_optim"))
    resumed = {k: v.float() for k, v in _adapters(run).items()}
    b = [k for k in saved if "lora_B" in k]
    assert max(saved[k].abs().max().item() for k in b) > 3 * lr  # B starts at 0: six steps moved it
    for k in saved:
        assert (resumed[k] - saved[k]).abs().max().item() <= 1.1 * lr, k


def test_prompt_tokens_and_truncation(tiny_inputs, tmp_path):
    """``sft.loss_on_prompt`` scores more tokens of the same sequences; ``sft.max_length`` cuts and counts."""
    hf, data = tiny_inputs
    common = (*SFT, "--training.train_iters=1", "--checkpoint.save_interval=0")
    runs = {}
    for name, extra in (("solution", ()), ("prompt", ("--sft.loss_on_prompt",)),
                        ("cut", ("--sft.max_length=55",))):
        assert_ok(train(hf, data, str(tmp_path / name), *common, *extra))
        [runs[name]] = read_metrics(str(tmp_path / name))
    solution, prompt, cut = runs["solution"], runs["prompt"], runs["cut"]
    assert solution["sft_truncated"] == prompt["sft_truncated"] == 0
    assert prompt["num_tokens"] > solution["num_tokens"] and prompt["loss"] != solution["loss"]
    # every toy sequence (a ~45-token prompt, a ~19-token solution) is longer than 55: each keeps part of its solution
    assert cut["sft_truncated"] == cut["sequences"] == solution["sequences"]
    assert 0 < cut["num_tokens"] < solution["num_tokens"]


@pytest.mark.parametrize("flags,expected", [
    (("--rollout.n=2",), "error: --rollout.n: 2: --method=sft trains each row's solution once; set --rollout.n=1"),
    (("--data.reason_first",), "error: --data.reason_first: is a PHF teacher option; --method=sft has no teacher"),
    (("--teacher.mode=fixed",), "error: --teacher.mode: fixed: --method=sft has no teacher; leave the teacher "
                                "settings out"),
    (("--rollout.async_steps=1",), "error: --rollout.async_steps: --method=sft has no rollouts to overlap"),
    (("--rollout.lmbda=0.5",), "error: --rollout.lmbda: 0.5: --method=sft trains on the rows' solutions only"),
    (("--ablation=local_only",), "error: --ablation: local_only is an ablation of PHF's loss; --method=sft has no"),
    (("--sft.max_length=1",), "error: --sft.max_length: needs at least 2 tokens"),
    (("--training.packing=false", "--training.max_tokens_per_microbatch=512"),
     "error: --training.max_tokens_per_microbatch: counts packed tokens: it needs --training.packing"),
    (("--training.packing", "--training.max_tokens_per_microbatch=0"),
     "error: --training.max_tokens_per_microbatch: must be > 0, got 0"),
])
def test_bad_sft_settings_are_one_line(flags, expected):
    proc = run_python(["-m", "phf_megatron.train", "--method=sft", "--training.global_batch_size=4",
                       "--training.micro_batch_size=2", *flags], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().startswith(expected) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_maximum_length_past_the_model_is_one_line(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    proc = train(hf, data, str(tmp_path / "long"), "--method=sft", "--sft.max_length=2000")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == ("error: --sft.max_length: 2000 exceeds the model's "
                                                    "max_position_embeddings (1024)")


@pytest.mark.parametrize("loss_on_prompt", [False, True])
def test_first_step_loss_equals_hf_cross_entropy_on_the_steps_rows(tiny_inputs, tmp_path, loss_on_prompt):
    """The trainer's step-1 loss (LoRA's B = 0: the base model) equals HF transformers' causal-LM loss on the
    step's rows, built here from the data file: ``chat(problem) ; solution ; <|im_end|>``, scored on the
    solution (or every token but the first); float64 HF against the float32 trainer."""
    from phf_megatron.data import PromptConfig, load_math_dataset
    from phf_megatron.data.prompts import encode_prompt, render_student_prompt
    from phf_megatron.data.holdout import without_holdout
    from phf_megatron.data.sampler import EpochSampler
    from phf_megatron.tokenizer import load_qwen3_tokenizer
    from transformers import AutoModelForCausalLM

    hf, data = tiny_inputs
    run = str(tmp_path / "one")
    extra = ("--sft.loss_on_prompt",) if loss_on_prompt else ()
    assert_ok(train(hf, data, run, *SFT, "--training.train_iters=1", "--checkpoint.save_interval=0", *extra))
    [m] = read_metrics(run)
    tok = load_qwen3_tokenizer(hf)
    rows = without_holdout(load_math_dataset(data), 0.01, 42).rows  # the official split's train part
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float64)
    total, count = 0.0, 0
    for i in EpochSampler(len(rows), seed=42, shuffle=True).take(4):  # data.shuffle_seed 42, global batch 4
        prompt = encode_prompt(tok, render_student_prompt(tok, rows[i].problem, PromptConfig()))
        ids = torch.tensor([prompt + encode_prompt(tok, rows[i].solution) + [tok.convert_tokens_to_ids("<|im_end|>")]])
        labels = ids.clone()
        if not loss_on_prompt:
            labels[0, : len(prompt)] = -100
        n = int((labels[0, 1:] != -100).sum())
        with torch.no_grad():
            total += float(model(input_ids=ids, labels=labels).loss) * n
        count += n
    assert m["num_tokens"] == count
    assert m["loss"] == pytest.approx(total / count, rel=1e-5)


def test_packing_and_a_token_budget_give_the_padded_update(tiny_inputs, tmp_path):
    """``--training.packing``: two SFT steps (micro-batches of 2 sequences packed into one row each) give the
    padded run's loss, token count and gradient norm at every step, to float32 precision; so does
    ``--training.max_tokens_per_microbatch`` (the tiny rows are ~64 tokens: a budget of 200 groups the step's 4
    sequences by tokens, up to 3 in one, not 2 + 2). The start line names the packed attention."""
    hf, data = tiny_inputs
    common = (*SFT, "--training.train_iters=2", "--checkpoint.save_interval=0", "--training.micro_batch_size=2")
    runs, procs = {}, {}
    for name, extra in (("padded", ("--training.packing=false",)), ("packed", ("--training.packing",)),
                        ("budget", ("--training.packing", "--training.max_tokens_per_microbatch=200"))):
        procs[name] = train(hf, data, str(tmp_path / name), *common, *extra)
        assert_ok(procs[name])
        runs[name] = read_metrics(str(tmp_path / name))
    for name in ("packed", "budget"):
        assert len(runs[name]) == 2
        for a, b in zip(runs["padded"], runs[name]):
            assert b["num_tokens"] == a["num_tokens"] and b["sequences"] == a["sequences"]
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    line = "packed sequences: SDPA per sequence, causal (flash kernel on CPU)"
    assert line in procs["budget"].stdout + procs["budget"].stderr
    assert "packed sequences" not in procs["padded"].stdout + procs["padded"].stderr


def test_a_sample_over_the_token_budget_is_one_line_naming_its_row(tiny_inputs, tmp_path):
    """Every toy row's ``prompt ; solution + EOS`` is over a budget of 30 alone: one line at load (before any
    step) naming the longest and the smallest budget, and sft.max_length as the setting to lower."""
    hf, data = tiny_inputs
    proc = train(hf, data, str(tmp_path / "over"), *SFT, "--training.train_iters=1", "--checkpoint.save_interval=0",
                 "--training.packing", "--training.max_tokens_per_microbatch=30", "--data.holdout_fraction=0")
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"error: --training\.max_tokens_per_microbatch: 16 row\(s\) make a sequence over the budget "
                        r"of 30 tokens alone, which would stop the run when its step came: \S+\.jsonl:\d+ makes \d+ "
                        r"prompt \+ \d+ completion tokens \(sft\.max_length\) = (\d+); also .* and 10 more; the "
                        r"smallest budget every row fits is \1: raise it to that, lower sft\.max_length, or remove "
                        r"the row\(s\)", last), last
    assert not os.path.exists(os.path.join(tmp_path, "over", "metrics.jsonl"))


def test_the_start_line_names_the_attention_kernel_of_this_rank():
    # PyTorch's own choice for this rank's heads and dtype (tests/models: it is the kernel the profiler sees run)
    from phf_megatron.models.config import qwen3_transformer_config
    from phf_megatron.training.model_setup import packed_attention, sdpa_kernel_in_use

    from ..helpers.tiny_qwen3 import tiny_config

    assert packed_attention(te=True, kernel="") == "Transformer Engine THD (cu_seqlens)"
    config = qwen3_transformer_config(tiny_config("gqa", num_layers=2), dtype=torch.bfloat16)
    assert sdpa_kernel_in_use(config, cuda=False) == "flash kernel on CPU"
    config = qwen3_transformer_config(tiny_config("gqa", num_layers=2), dtype=torch.bfloat16, attention_dropout=0.1)
    assert sdpa_kernel_in_use(config, cuda=False) == "math kernel on CPU"   # its attention dropout: no CPU flash
    assert packed_attention(te=False, kernel="flash kernel") == "SDPA per sequence, causal (flash kernel)"
    assert packed_attention(te=False, kernel="flash kernel", choice="varlen") == \
        "varlen flash, causal (torch.nn.attention.varlen.varlen_attn, one call per layer)"
    assert packed_attention(te=True, kernel="", choice="varlen") == "Transformer Engine THD (cu_seqlens)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_varlen_attention_without_cuda_stops_the_start_in_one_line(tiny_inputs, tmp_path):
    """PyTorch's varlen attention runs on CUDA only: named at start-up, before the model is built or a step runs."""
    hf, data = tiny_inputs
    proc = train(hf, data, str(tmp_path / "varlen"), *SFT, "--training.train_iters=1", "--training.packing",
                 "--model.packed_attention=varlen")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --model.packed_attention: 'varlen' runs on CUDA only (PyTorch's varlen_attn) and no CUDA device is "
        "visible: use 'sdpa'")
    assert not os.path.exists(os.path.join(tmp_path, "varlen", "metrics.jsonl"))


def test_varlen_without_packing_trains_on_a_cpu_and_the_start_line_does_not_claim_it(tiny_inputs, tmp_path):
    """Padded micro-batches never reach the packed attention: 'varlen' is ignored there, even where it cannot run."""
    hf, data = tiny_inputs
    proc = train(hf, data, str(tmp_path / "padded"), *SFT, "--training.train_iters=1", "--checkpoint.save_interval=0",
                 "--training.packing=false", "--model.packed_attention=varlen")
    assert_ok(proc)
    assert len(read_metrics(str(tmp_path / "padded"))) == 1
    start = [line for line in (proc.stdout + proc.stderr).splitlines() if "phf_megatron.train: attention " in line]
    assert len(start) == 1 and "SDPA (Megatron local spec, " in start[0], start
    assert "varlen" not in start[0] and "packed sequences" not in start[0], start[0]


def test_a_token_budget_with_a_per_micro_batch_loss_is_one_line():
    proc = run_python(["-m", "phf_megatron.train", "--method=grpo", "--rollout.n=2", "--training.packing",
                       "--grpo.loss_type=bnpo", "--training.max_tokens_per_microbatch=512"], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    expected = "error: --training.max_tokens_per_microbatch: not with grpo.loss_type=bnpo: its loss is each micro-batch"
    assert proc.stderr.strip().startswith(expected) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_help_lists_packing():
    proc = run_python(["-m", "phf_megatron.train", "--help"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "--training.packing" in proc.stdout and "--training.max_tokens_per_microbatch" in proc.stdout
