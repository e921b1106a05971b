"""SFT's sequences: ``chat(problem) ; solution + EOS`` with the real Qwen3 tokenizer, cut as TRL cuts
(keep the start), scored on the solution or, with ``sft.loss_on_prompt``, on every token but the first."""

from types import SimpleNamespace

import pytest

from phf_megatron.data import PromptConfig
from phf_megatron.data.prompts import encode_prompt, render_student_prompt
from phf_megatron.data.toy import toy_row
from phf_megatron.data.rows import MathRow
from phf_megatron.objectives.config import SftConfig
from phf_megatron.tokenizer import load_qwen3_tokenizer
from phf_megatron.training.batches import build_microbatches
from phf_megatron.training.config import TrainConfig
from phf_megatron.training.config_sections import TrainingConfig
from phf_megatron.training.methods.sft import SftMethod, truncate_sequence
from phf_megatron.training.step_plan import StepPlan


def test_truncation_keeps_the_start():
    assert truncate_sequence([1, 2], [3, 4], 4) == ([1, 2], [3, 4], False)
    assert truncate_sequence([1, 2], [3, 4, 5], 4) == ([1, 2], [3, 4], True)
    assert truncate_sequence([1, 2, 3], [4], 2) == ([1, 2], [], True)


@pytest.fixture(scope="module")
def tok():
    return load_qwen3_tokenizer()


def _step(tok, loss_on_prompt, max_length=16000, packing=False, micro_batch_size=1, rows=None):
    cfg = TrainConfig(method="sft", sft=SftConfig(max_length=max_length, loss_on_prompt=loss_on_prompt),
                      training=TrainingConfig(packing=packing, global_batch_size=2, micro_batch_size=micro_batch_size))
    method = SftMethod(cfg)
    rows = rows or [toy_row(12, 19), toy_row(31, 40)]
    pairs = [method.row_inputs(tok, r, PromptConfig()) for r in rows]
    plan = StepPlan(0, [0, 1], rows, pairs, requests=None)
    pairs, completions = method.training_samples(SimpleNamespace(tokenizer=tok), plan, None, range(2))
    mbs = build_microbatches(pairs, completions, pad_id=tok.pad_token_id, micro_batch_size=micro_batch_size,
                             dp_rank=0, dp_size=1,
                             pad_multiple=1, make=method.microbatches)
    return rows, method, mbs


def test_sequences_are_the_student_prompt_then_the_solution_and_eos(tok):
    rows, method, mbs = _step(tok, loss_on_prompt=False)
    for row, mb in zip(rows, mbs):
        prompt = encode_prompt(tok, render_student_prompt(tok, row.problem, PromptConfig()))
        solution = encode_prompt(tok, row.solution) + [tok.eos_token_id]
        assert mb.student_tokens[0].tolist() == prompt + solution
        assert mb.score_tokens.tolist() == solution
        assert tok.convert_ids_to_tokens(solution[-1]) == "<|im_end|>"
    assert method.step_metrics() == {"sft_truncated": 0}


def test_prompt_tokens_are_scored_with_loss_on_prompt(tok):
    _, _, mbs = _step(tok, loss_on_prompt=True)
    for mb in mbs:
        assert mb.score_tokens.tolist() == mb.student_tokens[0, 1:].tolist()


def test_a_long_sequence_is_cut_and_counted(tok):
    rows, method, mbs = _step(tok, loss_on_prompt=False, max_length=50)
    prompt_len = len(encode_prompt(tok, render_student_prompt(tok, rows[0].problem, PromptConfig())))
    assert prompt_len < 50
    for mb in mbs:
        assert mb.student_tokens.shape[1] == 50 and mb.num_tokens == 50 - prompt_len
    assert method.step_metrics() == {"sft_truncated": 2}


@pytest.mark.parametrize("loss_on_prompt", [False, True])
def test_packed_microbatches_score_what_the_padded_ones_score(tok, loss_on_prompt):
    """``training.packing``: the one builder packs both sequences into one row of their summed length (no
    padding), and the packed micro-batch scores the same tokens as the padded ones; each sequence's first token
    is never scored (nothing of its own sequence predicts it)."""
    rows = [toy_row(12, 19), MathRow(problem="Name the digit.", solution="Seven.", answer="7", origin="short")]
    _, _, padded = _step(tok, loss_on_prompt, rows=rows)  # both right-padded to the longer one
    _, _, [packed] = _step(tok, loss_on_prompt, packing=True, micro_batch_size=2, rows=rows)
    lengths = packed.layout.lengths.tolist()
    assert lengths[0] == padded[0].student_tokens.shape[1] > lengths[1]
    assert set(padded[1].student_tokens[0, lengths[1]:].tolist()) == {tok.pad_token_id}
    assert packed.student_tokens.shape == (1, sum(lengths)) and packed.batch_size == 1
    rows_alone = [t for mb, n in zip(padded, lengths) for t in mb.student_tokens[0, :n].tolist()]
    assert packed.student_tokens[0].tolist() == rows_alone
    assert packed.score_tokens.tolist() == [t for mb in padded for t in mb.score_tokens.tolist()]
    assert packed.num_sequences == 2 and packed.layout.cu_seqlens.tolist() == [0, lengths[0], sum(lengths)]
    assert not bool(packed.scored[0, lengths[0]])
