"""The embedded toy task: deterministic splits, correct references, the grader, the sub-vocabulary."""

import json

import pytest

from phf_megatron.data import (
    PromptConfig,
    SubVocab,
    build_prompt_pair,
    extract_boxed,
    grade_toy,
    make_toy_split,
    toy_row,
    toy_sub_vocab,
    validate_row,
)
from phf_megatron.data.toy import TOY_PROMPT_CONFIG, cell_of, toy_response


def test_split_is_deterministic_in_the_seed():
    a, b, c = make_toy_split(0), make_toy_split(0), make_toy_split(1)
    assert a == b
    assert a.seen_cells != c.seen_cells and a.train != c.train


def test_split_partitions_all_problems_and_cells():
    split = make_toy_split(3, num_seen_cells=40, heldout_per_cell=2)
    assert len(split.seen_cells) == 40 and split.seen_cells <= set(range(100))
    train, heldout = set(split.train), set(split.heldout)
    assert len(train) == len(split.train) and not train & heldout
    assert train | heldout == {(a, b) for a in range(10, 100) for b in range(10, 100)}
    assert sorted(cell_of(*p) for p in heldout) == sorted(list(range(100)) * 2)  # 2 per cell
    assert all(split.is_seen(*p) for p in split.warmup_pairs())
    assert len(split.warmup_pairs()) == 40 * 79
    assert len(split.heldout_by_cell(True)) == 80 and len(split.heldout_by_cell(False)) == 120


@pytest.mark.parametrize("a, b", [(37, 48), (10, 10), (99, 99), (42, 17)])
def test_rows_are_valid_and_the_reference_holds_the_answer(a, b):
    row = toy_row(a, b)
    assert row.answer == str((a + b) % 10)
    assert validate_row({"problem": row.problem, "solution": row.solution, "answer": row.answer}, "x") is not None
    assert row.solution.endswith(toy_response(a, b)) and grade_toy(row.solution, row.answer)
    assert row.problem == f"What is the last digit of {a} + {b}?"
    assert toy_response(37, 48) == "7+8=15 \\boxed{5}" and toy_response(42, 17) == "2+7=09 \\boxed{9}"
    with pytest.raises(ValueError, match="two-digit"):
        toy_row(5, 48)


@pytest.mark.parametrize("config, teacher_length", [(TOY_PROMPT_CONFIG, 99), (PromptConfig(), 153)])
def test_toy_prompts_have_a_fixed_token_layout(qwen3_tokenizer, config, teacher_length):
    split = make_toy_split(0)
    lengths = set()
    for a, b in split.heldout[::37]:
        row = toy_row(a, b)
        pair = build_prompt_pair(qwen3_tokenizer, row.problem, row.solution, config)
        response = qwen3_tokenizer(toy_response(a, b), add_special_tokens=False)["input_ids"]
        lengths.add((len(pair.student_ids), len(pair.teacher_ids), len(response)))
    assert lengths == {(43, teacher_length, 11)}


def test_the_toy_run_config_renders_the_toy_prompts():
    from phf_megatron.training.config_io import load_config
    from tests.helpers import REPO

    data = load_config(f"{REPO}/configs/toy_cpu.yaml").data
    assert PromptConfig(data.student_enable_thinking, data.teacher_enable_thinking, data.align_generation_prompt,
                        data.teacher_prompt) == TOY_PROMPT_CONFIG


@pytest.mark.parametrize("text, expected", [
    ("7+8=15 \\boxed{5}", "5"),
    ("\\boxed{3} then \\boxed{ 4 }", "4"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{5", None),
    ("no box", None),
])
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_grade_toy():
    assert grade_toy("7+8=15 \\boxed{5}", "5") and grade_toy("\\boxed{5}", 5)
    assert not grade_toy("7+8=15 \\boxed{15}", "5")
    assert not grade_toy("the answer is 5", "5")
    assert not grade_toy("\\boxed{5} \\boxed{6}", "5")  # the last box counts


def test_sub_vocab_round_trips_every_toy_prompt(qwen3_tokenizer):
    split = make_toy_split(0)
    probe = [build_prompt_pair(qwen3_tokenizer, r.problem, r.solution, TOY_PROMPT_CONFIG)
             for r in split.rows(split.heldout[:2])]
    vocab = toy_sub_vocab(qwen3_tokenizer, [p.student_ids for p in probe] + [p.teacher_ids for p in probe])
    assert len(vocab) < 100
    for row in split.rows(split.train[::500]):
        pair = build_prompt_pair(qwen3_tokenizer, row.problem, row.solution, TOY_PROMPT_CONFIG)
        for ids in (pair.student_ids, pair.teacher_ids):
            compact = vocab.encode(ids)
            assert max(compact) < len(vocab) and vocab.decode(compact) == ids


def test_sub_vocab_errors_name_the_id():
    vocab = SubVocab([7, 3, 3, 151_668])
    assert vocab.qwen_ids == [3, 7, 151_668] and vocab.encode([151_668, 3]) == [2, 0]
    with pytest.raises(ValueError, match="token id 5 is not in this sub-vocabulary"):
        vocab.encode([3, 5])
    with pytest.raises(ValueError, match=r"compact_ids: 3 outside \[0, 3\)"):
        vocab.decode([3])
    with pytest.raises(ValueError, match="empty"):
        SubVocab([])


def test_the_held_out_evaluation_reads_an_answer_in_the_reference_solutions_layout(qwen3_tokenizer):
    """SFT learns to write the reference solution, longer than the response: the evaluation's greedy
    budget must reach its ``\\boxed{}`` and the end token (with 14 it did not: SFT scored 0)."""
    from phf_megatron.toy.evaluate import EVAL_MAX_NEW_TOKENS

    longest = max(len(qwen3_tokenizer(toy_row(a, b).solution, add_special_tokens=False)["input_ids"])
                  for a, b in make_toy_split(0).heldout)
    assert EVAL_MAX_NEW_TOKENS >= longest + 1


@pytest.mark.parametrize("argv, line", [
    (["evaluate", "--hf-dir", "{tmp}/nope"], "error: --hf-dir: {tmp}/nope does not exist"),
    (["evaluate", "--hf-dir", "{tmp}", "--adapter", "{tmp}/file"], "error: --adapter: {tmp}/file is not a directory"),
    (["prepare", "--out", "{tmp}/file"], "error: --out: {tmp}/file is not a directory"),
    (["evaluate", "--hf-dir", "{tmp}"], "error: --hf-dir: {tmp}: no config.json (expected a HF model directory)"),
    (["evaluate", "--hf-dir", "{tmp}/hf", "--adapter", "{tmp}"],
     "error: --adapter: {tmp} has no adapter_config.json (not a PEFT adapter directory)"),
    (["evaluate", "--hf-dir", "{tmp}/hf", "--adapter", "{tmp}/cut"],   # was PEFT's JSONDecodeError traceback
     "error: {tmp}/cut/adapter_config.json: not valid JSON: Expecting property name enclosed in double quotes at "
     "line 1 column 2"),
    # a prepared toy given again: was warmed up anew and replaced in silence (its mcore/ conversion left stale)
    (["prepare", "--out", "{tmp}"], "error: --out: {tmp}/hf already exists (a prepared toy: remove it or choose "
                                    "another)"),
    # argparse's own errors: were the usage, then "python -m phf_megatron.toy prepare: error: ..."
    (["prepare", "--out", "{tmp}/new", "--seed", "abc"], "error: --seed: invalid int value: 'abc'"),
    (["evaluate"], "error: the following arguments are required: --hf-dir/--hf_dir"),
    (["evaluate", "--hf_dir", "{tmp}/nope"], "error: --hf-dir: {tmp}/nope does not exist"),   # _ for -, as elsewhere
])
def test_toy_command_line_path_errors_name_the_flag(tmp_path, capsys, argv, line):
    """``python -m phf_megatron.toy``: a wrong path was "usage: ...\\n...: error: <path>: not a directory" for
    --hf-dir and --adapter alike (a missing one too), and a FileExistsError traceback for --out; a directory
    without a model, or without an adapter (or with a damaged one), was transformers' or PEFT's traceback."""
    import torch
    from safetensors.torch import save_file

    from phf_megatron.toy.__main__ import main

    (tmp_path / "file").write_text("x")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({   # tiny: a check that lets one through loads it
        "model_type": "qwen3", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8}))
    save_file({"w": torch.zeros(1)}, str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "adapter_config.json").write_text("{")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert capsys.readouterr().err.splitlines() == [line.format(tmp=tmp_path)]


def test_the_toy_commands_show_no_transformers_progress_bars(tmp_path, capfd):
    """prepare and evaluate printed transformers' "Loading weights" and "Writing model shards" bars
    between their own lines (the main job's log); their own lines stay, and a library user's setting
    (bars on) is back after each command."""
    from transformers.utils import logging as hf_logging

    from phf_megatron.toy.__main__ import main

    hf_logging.enable_progress_bar()
    assert main(["prepare", "--out", str(tmp_path / "toy"), "--warmup-steps", "1"]) == 0
    assert hf_logging.is_progress_bar_enabled()
    assert main(["evaluate", "--hf-dir", str(tmp_path / "toy" / "hf")]) == 0
    assert hf_logging.is_progress_bar_enabled()
    out, err = capfd.readouterr()
    assert '{"phase": "warmup", "step": 1, "of": 1, ' in out and "held-out greedy accuracy:  noref_seen " in out, out
    assert "Loading weights" not in err and "model shards" not in err and "it/s]" not in err, err[-2000:]
    # evaluate's own bar instead (about 20 s of silence before), over its four held-out sets
    assert [line.split("|")[-1].split()[0] for line in err.splitlines() if line.startswith("toy eval:")][-1] == "4/4"
