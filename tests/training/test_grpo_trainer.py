"""The GRPO baseline through the whole trainer on the tiny CPU preset (``--method=grpo``, the HF engine).

The tiny random model never writes a ``\\boxed{}``, so the official reward would be 0 everywhere
(every advantage 0, nothing to learn). These runs swap in a reward that is a deterministic function
of the decoded completion (``_REWARD``), so groups differ and the policy gradient is not zero; the
official reward itself is tested on real strings in ``test_grpo_method.py``.
"""

import os

import pytest
import torch
from safetensors.torch import load_file

from ..helpers import run_python
from ..helpers.tiny_run import assert_ok, assert_same_steps, read_metrics, train_command
from .test_run_export import _documented_metrics

#: the tiny preset's GRPO samples are 55 student tokens (prompt + 16-token completion): 3 fit, 4 do not
BUDGET_3_PLUS_1 = 170
#: G = 2 completions of 2 prompts per step; each rollout batch trains 2 optimizer steps
GRPO = ("--method=grpo", "--rollout.n=2", "--grpo.num_iterations=2", "--lr=1e-3",
        "--grpo.vllm_importance_sampling_correction=false")
REWARD_KEYS = ("reward", "accuracy", "reward_std", "frac_reward_zero_std", "grpo_truncated")

_REWARD = """
import sys
from phf_megatron.training.methods import grpo
grpo.reward_correctness = lambda text, gold: (sum(map(ord, text)) % 101) / 100.0
from phf_megatron.train import main
sys.exit(main(sys.argv[1:]))
"""


def _reward(text: str) -> float:
    return (sum(map(ord, text)) % 101) / 100.0


def _train(hf, data, run_dir, *overrides):
    argv, _ = train_command(hf, data, run_dir, *overrides)
    return run_python(["-c", _REWARD, *argv[3:]], timeout=600)


def _adapters(run_dir):
    return load_file(os.path.join(run_dir, "export", "peft_adapter", "adapter_model.safetensors"))


def test_grpo_resume_reproduces_the_straight_run(tiny_inputs, tmp_path):
    """Two rollout batches of two steps each: straight, and interrupted after the first batch (a
    checkpoint at step 2) then resumed: equal metrics and adapters, bit for bit."""
    hf, data = tiny_inputs
    common = (*GRPO, "--training.train_iters=4", "--checkpoint.save_interval=2")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert_ok(_train(hf, data, straight, *common))
    assert_ok(_train(hf, data, resumed, *GRPO, "--training.train_iters=2", "--checkpoint.save_interval=2"))
    assert_ok(_train(hf, data, resumed, *common))
    assert_same_steps(straight, resumed, ("loss", "grad_norm", "lr", "num_tokens", "rollout_digest", *REWARD_KEYS), 4)
    s = read_metrics(straight)
    for k, v in _adapters(straight).items():
        torch.testing.assert_close(_adapters(resumed)[k], v, rtol=0, atol=0)
    # a rollout batch feeds two steps: the same rollouts and rewards, the old log-probs computed once
    assert s[0]["rollout_digest"] == s[1]["rollout_digest"] != s[2]["rollout_digest"] == s[3]["rollout_digest"]
    assert [m["rollout_staleness"] for m in s] == [0, 1, 0, 1]
    assert "time_old_logps_s" in s[0] and "time_old_logps_s" not in s[1]
    assert any(m["grad_norm"] > 0 for m in s)  # rewards differ within a group: a policy gradient
    assert s[0]["frac_reward_zero_std"] < 1
    written = {k for m in s for k in m}
    assert set(REWARD_KEYS) <= written
    assert written <= _documented_metrics(), sorted(written - _documented_metrics())
    assert not written & {"loss_opsd", "loss_flow", "time_teacher_s"}


def test_first_rollout_batch_rewards_and_advantages_from_its_rollouts(tiny_inputs, tmp_path):
    """The step's rollouts sampled again here by the HF engine from the base model (LoRA's B = 0) with
    the trainer's seeds: the same rollouts (``rollout_digest``), and the metrics' rewards, group stds
    and mean advantage equal those recomputed from them; the first step's loss equals the float64
    transcription (``objectives.grpo.grpo_loss``, ratio 1) on HF float64 log-probs."""
    from phf_megatron.data import PromptConfig, load_math_dataset
    from phf_megatron.data.prompts import encode_prompt, render_student_prompt
    from phf_megatron.data.holdout import without_holdout
    from phf_megatron.data.sampler import EpochSampler
    from phf_megatron.objectives.grpo import group_advantages, grpo_loss
    from phf_megatron.rollout import SamplingParams
    from phf_megatron.rollout.hf_engine import HFEngine
    from phf_megatron.rollout.seeds import sample_seed
    from phf_megatron.tokenizer import eos_token_ids, load_qwen3_tokenizer
    from phf_megatron.training.step_plan import local_rollout_record, rollout_stats
    from transformers import AutoModelForCausalLM

    hf, data = tiny_inputs
    run = str(tmp_path / "one")
    assert_ok(_train(hf, data, run, *GRPO, "--training.train_iters=2", "--checkpoint.save_interval=0"))
    first = read_metrics(run)[0]
    tok = load_qwen3_tokenizer(hf)
    rows = without_holdout(load_math_dataset(data), 0.007, 42).rows  # the official split's train part
    prompts = [encode_prompt(tok, render_student_prompt(tok, rows[i].problem, PromptConfig()))
               for i in EpochSampler(len(rows), seed=42, shuffle=True).take(2)]  # 4 completions / G = 2 prompts
    engine = HFEngine(hf, dtype="float32", device="cpu")
    params = [SamplingParams(temperature=1.1, top_p=0.95, top_k=20, max_tokens=12, stop_token_ids=eos_token_ids(tok),
                             seed=sample_seed(1234, 0, i // 2, i % 2)) for i in range(4)]
    completions = [list(c.token_ids) for (c,) in engine.generate([prompts[i // 2] for i in range(4)], params)]
    engine.close()
    assert rollout_stats([local_rollout_record(completions, 0, 1)])["rollout_digest"] == first["rollout_digest"]
    rewards = torch.tensor([_reward(tok.decode(c, skip_special_tokens=True)) for c in completions], dtype=torch.float64)
    advantages = group_advantages(rewards, 2, "group")
    assert first["reward"] == pytest.approx(float(rewards.mean()), abs=1e-12)
    assert first["reward_std"] == pytest.approx(float(rewards.view(2, 2).std(dim=1).mean()), abs=1e-12)
    assert first["grpo_advantage"] == pytest.approx(float(advantages.mean()), abs=1e-9)

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float64)
    total = 0.0
    for b in range(0, 4, 2):  # micro-batches of 2, as the trainer's (grpo: each one's share, over GA = 2)
        width = max(len(prompts[i // 2]) + len(completions[i]) for i in range(b, b + 2))
        ids = torch.full((2, width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros(2, width, dtype=torch.bool)
        for r, i in enumerate(range(b, b + 2)):
            seq = prompts[i // 2] + completions[i]
            ids[r, : len(seq)] = torch.tensor(seq)
            mask[r, len(prompts[i // 2]): len(seq)] = True  # every sampled token, a final pad id too (TRL)
        with torch.no_grad():
            logits = model(input_ids=ids).logits / 1.1
        logps = torch.zeros(2, width, dtype=torch.float64)
        logps[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        total += float(grpo_loss(logps, logps, advantages[b: b + 2], mask, loss_type="grpo", grad_accum_steps=2))
    assert first["loss"] == pytest.approx(total, abs=1e-6)


def test_vllm_correction_reads_the_engines_processed_logprobs(tiny_inputs, tmp_path):
    """With the correction on (unfiltered sampling, as TRL's defaults) the engine's processed log-probs
    reach the loss: at the batch's first step they equal the trainer's old log-probs (float32 both)."""
    hf, data = tiny_inputs
    run = str(tmp_path / "is")
    assert_ok(_train(hf, data, run, *GRPO[:-1], "--grpo.vllm_importance_sampling_correction=true",
                     "--rollout.top_k=0", "--rollout.top_p=1.0", "--training.train_iters=2",
                     "--checkpoint.save_interval=0"))
    first = read_metrics(run)[0]
    assert first["grpo_sampler_logp_diff"] < 1e-4
    assert first["grpo_is_ratio"] == pytest.approx(1.0, abs=1e-3) and first["grpo_is_capped"] == 0


def test_packing_and_a_token_budget_give_the_padded_update(tiny_inputs, tmp_path):
    """``--training.packing`` (micro-batches of 2 completions packed into one row each), with the correction and
    the sequence level on (per-sequence reductions on the per-sample grid): one rollout batch of two steps gives
    the padded run's rollouts, loss, token count, statistics and gradient norm, to float32 precision. So does a
    token budget that groups the step's 4 completions 3 + 1 instead of 2 + 2 (the ``grpo`` loss is normalized
    by the step's sequence count, not per micro-batch; the advantages follow the plan's samples)."""
    hf, data = tiny_inputs
    common = (*GRPO[:-1], "--grpo.vllm_importance_sampling_correction=true", "--rollout.top_k=0",
              "--rollout.top_p=1.0", "--grpo.importance_sampling_level=sequence", "--training.micro_batch_size=2",
              "--training.train_iters=2", "--checkpoint.save_interval=0")
    runs = {}
    budget = ("--training.packing", f"--training.max_tokens_per_microbatch={BUDGET_3_PLUS_1}", "--logging.verbose=true")
    for name, extra in (("padded", ("--training.packing=false",)), ("packed", ("--training.packing",)),
                        ("budget", budget)):
        proc = _train(hf, data, str(tmp_path / name), *common, *extra)
        assert_ok(proc)
        runs[name] = read_metrics(str(tmp_path / name))
    assert len(runs["packed"]) == len(runs["budget"]) == 2
    for a, b in [*zip(runs["padded"], runs["packed"]), *zip(runs["padded"], runs["budget"])]:
        for key in ("num_tokens", "sequences", "rollout_digest", "reward", "grpo_is_capped", "grpo_clip_region"):
            assert b[key] == a[key], key
        # the loss: a near-cancelling sum (zero-sum advantages; ratio 1 at the batch's first step), float32 noise
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
        for key in ("grpo_is_ratio", "grpo_sampler_logp_diff"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert any(m["grad_norm"] > 0 for m in runs["packed"])
