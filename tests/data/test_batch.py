"""The distillation batch: the rollout lines up in the student and teacher sequences.

Checked with the real Qwen3 tokenizer in all four student/teacher thinking combinations, and
against an independent reference: a tiny random Qwen3 run on each unpadded prefix alone.
"""

import itertools

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from phf_megatron.data import PromptConfig, build_distill_batch, build_prompt_pair, generation_prompt
from phf_megatron.objectives import select_window

PROBLEMS = [("What is 2+3?", "2+3=5, so \\boxed{5}."),
            ("Find the remainder of $17$ divided by $5$.", "17 = 3*5 + 2. The remainder is \\boxed{2}."),
            ("Compute $\\frac{6}{3}$.", "\\boxed{2}")]
# Rollouts as the engine returns them: ids sampled after the student prompt. The first starts
# with "\n", which would merge with the prompt's trailing "\n\n" if text were re-tokenized.
ROLLOUT_TEXTS = ["\nThe answer is \\boxed{5}.<|im_end|>", "<think>\nOk.\n</think>\n\n\\boxed{2}<|im_end|>", ""]
COMBOS = list(itertools.product([False, True], repeat=2))


def tokenized(tokenizer, config):
    pairs = [build_prompt_pair(tokenizer, p, s, config) for p, s in PROBLEMS]
    rollouts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ROLLOUT_TEXTS]
    return pairs, rollouts


def batch_for(tokenizer, config, **kwargs):
    pairs, rollouts = tokenized(tokenizer, config)
    batch = build_distill_batch([p.student_ids for p in pairs], [p.teacher_ids for p in pairs], rollouts,
                                pad_id=tokenizer.pad_token_id, **kwargs)
    return pairs, rollouts, batch


@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("student_thinking, teacher_thinking", COMBOS)
def test_rollout_ids_identical_and_right_after_each_prompt(qwen3_tokenizer, student_thinking, teacher_thinking, align):
    config = PromptConfig(student_thinking, teacher_thinking, align)
    pairs, rollouts, batch = batch_for(qwen3_tokenizer, config)
    for b, (pair, y) in enumerate(zip(pairs, rollouts)):
        for side, prompt in (("student", pair.student_ids), ("teacher", pair.teacher_ids)):
            ids, start = batch.input_ids(side)[b], int(batch.response_start(side)[b])
            assert start == len(prompt) and ids[:start].tolist() == prompt
            assert ids[start:start + len(y)].tolist() == y
            assert batch.attention_mask(side)[b].tolist() == [True] * (start + len(y)) + [False] * (len(ids) - start - len(y))
        assert batch.response_ids[b, :len(y)].tolist() == y and int(batch.response_lengths[b]) == len(y)
    if align:  # both prompts end in the student's generation prompt, token for token
        tail = qwen3_tokenizer(generation_prompt(qwen3_tokenizer, student_thinking), add_special_tokens=False)["input_ids"]
        for pair in pairs:
            assert pair.student_ids[-len(tail):] == tail and pair.teacher_ids[-len(tail):] == tail


def test_ids_are_concatenated_never_retokenized(qwen3_tokenizer):
    pairs, rollouts, batch = batch_for(qwen3_tokenizer, PromptConfig(student_enable_thinking=False))
    prompt, y = pairs[0].student_ids, rollouts[0]
    assert qwen3_tokenizer.convert_ids_to_tokens(prompt[-1:] + y[:1]) == ["ĊĊ", "Ċ"]
    assert batch.student_input_ids[0, : len(prompt) + len(y)].tolist() == prompt + y
    # Re-tokenizing the text would merge "\n\n" + "\n" into one token and shift every position.
    retokenized = qwen3_tokenizer(qwen3_tokenizer.decode(prompt + y), add_special_tokens=False)["input_ids"]
    assert retokenized != prompt + y and len(retokenized) == len(prompt) + len(y) - 1


def tiny_qwen3(tie: bool) -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151_669, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # GQA, head_dim != 32/4
                      max_position_embeddings=512, tie_word_embeddings=tie, attn_implementation="eager")
    return Qwen3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("student_thinking, teacher_thinking", [(False, True), (True, False)])
def test_gathered_logits_predict_the_rollout_token_on_both_sides(qwen3_tokenizer, tie, student_thinking, teacher_thinking):
    """``gather_response(logits)[b, t]`` equals the model's last logits on ``[prompt ; y_<t]``
    run alone, unpadded: both sides' rows predict the same ``y_t``, padding changes nothing."""
    model = tiny_qwen3(tie)
    pairs, rollouts, batch = batch_for(qwen3_tokenizer, PromptConfig(student_thinking, teacher_thinking),
                                       pad_to_multiple_of=8)
    with torch.no_grad():
        for side in ("student", "teacher"):
            logits = model(batch.input_ids(side), attention_mask=batch.attention_mask(side).long()).logits
            gathered = batch.gather_response(logits, side)  # [B, T, V]
            for b, (pair, y) in enumerate(zip(pairs, rollouts)):
                prompt = pair.student_ids if side == "student" else pair.teacher_ids
                for t in range(len(y)):
                    alone = model(torch.tensor([prompt + y[:t]]), logits_to_keep=1).logits[0, -1]
                    torch.testing.assert_close(gathered[b, t], alone, rtol=1e-5, atol=1e-5)


def test_shifted_labels_give_the_rollout_negative_log_likelihood(qwen3_tokenizer):
    model = tiny_qwen3(tie=True)
    pairs, rollouts, batch = batch_for(qwen3_tokenizer, PromptConfig())
    with torch.no_grad():
        for side in ("student", "teacher"):
            logits = model(batch.input_ids(side), attention_mask=batch.attention_mask(side).long()).logits
            nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.shifted_labels(side).flatten(),
                                                    ignore_index=-100, reduction="sum")
            lp = torch.log_softmax(batch.gather_response(logits, side), -1)
            expected = -lp.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)[batch.response_mask].sum()
            torch.testing.assert_close(nll, expected)
            assert int((batch.shifted_labels(side) != -100).sum()) == sum(map(len, rollouts))


@pytest.mark.parametrize("budget", [1, 3, 128])
def test_window_maps_to_the_same_rollout_tokens_on_both_sides(qwen3_tokenizer, budget):
    _, rollouts, batch = batch_for(qwen3_tokenizer, PromptConfig())
    window, valid = select_window(batch.response_mask, budget)
    for side in ("student", "teacher"):
        token_pos = batch.to_absolute(window, side, "token")
        at_window = batch.input_ids(side).gather(1, token_pos)
        assert torch.equal(at_window[valid], batch.response_ids.gather(1, window)[valid])
        assert torch.equal(batch.to_absolute(window, side, "logit"), token_pos - 1)
        assert (token_pos < batch.attention_mask(side).sum(1, keepdim=True)).all()  # real tokens only
    assert not valid[2].any()  # the empty rollout has no window


def test_pad_to_multiple_of_and_max_length(qwen3_tokenizer):
    _, _, batch = batch_for(qwen3_tokenizer, PromptConfig(), pad_to_multiple_of=16)
    assert batch.student_input_ids.shape[1] % 16 == 0 and batch.teacher_input_ids.shape[1] % 16 == 0
    assert (batch.student_input_ids[~batch.student_attention_mask] == qwen3_tokenizer.pad_token_id).all()
    with pytest.raises(ValueError, match=r"teacher_prompts\[1\]: prompt 154 \+ rollout 12 tokens exceeds max_length=160"):
        batch_for(qwen3_tokenizer, PromptConfig(), max_length=160)


@pytest.mark.parametrize("args, message", [
    (([[1]], [[1], [2]], [[3]]), r"teacher_prompts: 2 prompts for 1 rollouts"),
    (([[]], [[1]], [[3]]), r"student_prompts\[0\]: empty prompt"),
    (([[1]], [[1]], [[3, 10]]), r"rollouts\[0\]: token id 10 outside \[0, 10\)"),
    (([[1]], [[1.5]], [[3]]), r"teacher_prompts\[0\]: token ids must be ints"),
    (([], [], []), r"rollouts: empty batch"),
])
def test_bad_batches_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        build_distill_batch(*args, pad_id=0, vocab_size=10)


def test_bad_side_and_kind_are_named():
    batch = build_distill_batch([[1, 2]], [[1, 2, 3]], [[4, 5]], pad_id=0)
    with pytest.raises(ValueError, match="side"):
        batch.input_ids("teachers")
    with pytest.raises(ValueError, match="kind"):
        batch.to_absolute(torch.zeros(1, 1, dtype=torch.long), "student", "hidden")
    with pytest.raises(ValueError, match="rollout_index"):
        batch.to_absolute(torch.zeros(2, 1, dtype=torch.long), "student")
    with pytest.raises(ValueError, match="per_position"):
        batch.gather_response(torch.zeros(1, 3, 5), "teacher")


def test_to_moves_every_tensor():
    batch = build_distill_batch([[1, 2]], [[1, 2, 3]], [[4, 5]], pad_id=0)
    moved = batch.to("meta")
    assert all(getattr(moved, f).device.type == "meta" and getattr(moved, f).shape == getattr(batch, f).shape
               for f in batch.__dataclass_fields__)


def official_scored_positions(prompt_ids, rollout_ids, pad_id):
    """Transcription of the official label rule (OPSD 7448751 opsd_trainer.py lines 1411-1417):
    labels = the full ids, the prompt set to -100, then every pad-id token set to -100."""
    labels = list(prompt_ids) + list(rollout_ids)
    labels[:len(prompt_ids)] = [-100] * len(prompt_ids)
    labels = [-100 if x == pad_id else x for x in labels]
    return [i for i, x in enumerate(labels) if x != -100]


def test_pad_id_tokens_are_not_scored_as_in_the_official_trainer(qwen3_tokenizer):
    tok = qwen3_tokenizer
    pad, im_end = tok.pad_token_id, tok.convert_tokens_to_ids("<|im_end|>")
    assert (tok.pad_token, pad, im_end) == ("<|endoftext|>", 151643, 151645)
    pairs, _ = tokenized(tok, PromptConfig())
    text = tok("The answer is \\boxed{5}.", add_special_tokens=False)["input_ids"]
    rollouts = [text + [pad],                      # stopped on <|endoftext|>: not scored
                text + [im_end],                   # stopped on <|im_end|>: scored
                text[:3] + [pad] + text[3:]]       # a pad id inside (ignore_eos): not scored, the rest is
    batch = build_distill_batch([p.student_ids for p in pairs], [p.teacher_ids for p in pairs], rollouts,
                                pad_id=pad, pad_to_multiple_of=8)
    assert batch.response_lengths.tolist() == [len(y) for y in rollouts]
    assert batch.response_mask.sum(1).tolist() == [len(text), len(text) + 1, len(text)]
    for side in ("student", "teacher"):
        scored = batch.scored_positions(side)
        labels = batch.shifted_labels(side)
        for b, (pair, y) in enumerate(zip(pairs, rollouts)):
            prompt = pair.student_ids if side == "student" else pair.teacher_ids
            want = official_scored_positions(prompt, y, pad)
            assert scored[b].nonzero().flatten().tolist() == want
            assert (labels[b] != -100).nonzero().flatten().tolist() == [p - 1 for p in want]
            assert batch.input_ids(side)[b, len(prompt):len(prompt) + len(y)].tolist() == y   # kept in the sequence
    # the rollout index still maps to the right token after an unscored one
    t = torch.arange(len(rollouts[2])).unsqueeze(0).expand(3, -1)
    at = batch.input_ids("student").gather(1, batch.to_absolute(t, "student"))
    assert at[2].tolist() == rollouts[2]


def test_without_a_pad_token_every_rollout_token_is_scored():
    batch = build_distill_batch([[1, 2], [1]], [[1, 2, 3], [4]], [[0, 5, 0], [6]], pad_id=None)
    assert batch.response_mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.student_input_ids[1].tolist() == [1, 6, 0, 0, 0]     # padded with 0, not scored
    assert batch.response_lengths.tolist() == [3, 1]


def test_micro_batches_score_what_the_batch_scores(qwen3_tokenizer):
    from phf_megatron.training.batches import build_microbatches
    tok = qwen3_tokenizer
    pairs, _ = tokenized(tok, PromptConfig())
    rollouts = [[11, 12, tok.pad_token_id], [13, tok.convert_tokens_to_ids("<|im_end|>")], [14]]
    mbs = build_microbatches(pairs, rollouts, pad_id=tok.pad_token_id, micro_batch_size=1, dp_rank=0, dp_size=1,
                             pad_multiple=1, window_budget=128)
    assert [mb.num_tokens for mb in mbs] == [2, 2, 1]
    assert mbs[0].student_tokens[mbs[0].student_response].tolist() == [11, 12]
    assert int(mbs[0].student_window[0, int(mbs[0].window_valid[0].sum()) - 1]) == len(pairs[0].student_ids) + 1
