"""GRPO's reward (``eval.rewards``) against a transcription of official OPSD's ``reward_correctness``.

Transcribed from ``louieworth/OPSD`` at ``e1cf202968f55e9b4f941f09e135d83a8c807582`` (the fork's
newest commit), ``grpo_train.py`` lines 57-122: ``extract_boxed_answer`` (57-82),
``_preprocess_for_parse`` (85-92), ``reward_correctness`` (95-122); the same lines at upstream
``7448751`` and ``shx2005/OPSD`` ``50c6085``. math-verify is called through the module, as there.
"""

import json
import re

import math_verify
import pytest

from phf_megatron.data.rows import BadRowError, FieldNames
from phf_megatron.data.sources import load_math_dataset
from phf_megatron.eval.rewards import gold_answer, grpo_boxed_answer, ratio_as_fraction, reward_correctness
from tests.helpers import EXAMPLE_MATH, GRADER_CASES


def extract_boxed_answer(text):
    """grpo_train.py lines 57-82."""
    think_end = text.rfind("</think>")
    search_text = text[think_end + len("</think>"):] if think_end != -1 else text

    idx = search_text.find(r"\boxed{")
    if idx == -1:
        return None
    start = idx + len(r"\boxed{")
    depth = 1
    i = start
    while i < len(search_text) and depth > 0:
        if search_text[i] == "{":
            depth += 1
        elif search_text[i] == "}":
            depth -= 1
        i += 1
    if depth == 0:
        return search_text[start: i - 1].strip()
    return None


def _preprocess_for_parse(answer):
    """grpo_train.py lines 85-92."""
    if answer is None:
        return None
    ratio_match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*:\s*(-?\d+(?:\.\d+)?)\s*", answer)
    if ratio_match:
        return rf"\frac{{{ratio_match.group(1)}}}{{{ratio_match.group(2)}}}"
    return answer


def official_reward_correctness(completions, Answer, **kwargs):  # noqa: N803 (the official signature)
    """grpo_train.py lines 95-122."""
    rewards = []
    for i, (completion, ground_truth) in enumerate(zip(completions, Answer)):
        pred_answer = extract_boxed_answer(completion)
        reward = 0.0
        gold_parsed = math_verify.parse(ground_truth)
        pred_parsed = math_verify.parse(_preprocess_for_parse(pred_answer))
        if gold_parsed is not None and pred_parsed is not None:
            try:
                reward = 1.0 if math_verify.verify(gold_parsed, pred_parsed) else 0.0
            except Exception:
                pass
        if reward == 0.0:
            pred_norm = re.sub(r"\s+", "", pred_answer or "").lower()
            gt_norm = re.sub(r"\s+", "", ground_truth or "").lower()
            if pred_norm and pred_norm == gt_norm:
                reward = 1.0
        rewards.append(reward)
    return rewards


def _grader_cases():
    with open(GRADER_CASES, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _in_solution(gold):
    """What the official script passes as the gold: the row's whole solution, which ends in the answer's box
    (its only one: math-verify reads several boxes of a text as one set)."""
    return f"Since $x = 4$, the answer is \\boxed{{{gold}}}."


def _string_equal(completion, gold):
    pred = extract_boxed_answer(completion)
    return float(bool(pred) and re.sub(r"\s+", "", pred).lower() == re.sub(r"\s+", "", gold).lower())


def test_equal_to_official_on_every_grader_case():
    """Each of the 119 labelled outputs, as it is and after a ``<think>`` block holding a decoy box,
    against the official rule given what the official script gives it, a solution ending in the
    gold's box. Ours also takes an answer equal as a string to that box (step 3; the official
    compares with the whole solution). The rule is strict (math-verify on the bare answer, no
    ``$``, the first box): 53 of the 89 outputs labelled correct (the eval tool's official grader:
    66), none labelled wrong."""
    rows = _grader_cases()
    assert len(rows) == 119
    for think in ("", "<think>so \\boxed{-12345} maybe</think>\n"):
        outputs = [think + r["model_output_text"] for r in rows]
        golds = [r["gold_answer"] for r in rows]
        theirs = official_reward_correctness(outputs, [_in_solution(g) for g in golds])
        ours = [reward_correctness(o, g) for o, g in zip(outputs, golds)]
        assert [grpo_boxed_answer(o) for o in outputs] == [extract_boxed_answer(o) for o in outputs]
        assert ours == [max(t, _string_equal(o, g)) for t, o, g in zip(theirs, outputs, golds)]
    assert sum(ours) == 53 and not any(v and not r["is_correct"] for v, r in zip(ours, rows))


@pytest.mark.parametrize("gold, pred, want", [
    ("25\\pi", "25", 0.0), ("5-12i", "5", 0.0), ("2\\sqrt{3}", "2", 0.0), ("(3, -1)", "-1", 0.0),
    ("\\dfrac{3}{50}", "\\frac{3}{50}", 1.0), ("50,\\!625", "50625", 1.0), ("\\$65", "65", 1.0)])
def test_the_gold_reads_as_the_official_reads_the_solutions_box(gold, pred, want):
    """math-verify reads a bare gold only up to what it recognises (``25\\pi`` as 25, ``\\dfrac`` not at
    all); the official reads the solution's box whole. A bare parse rewarded 25 for 25 pi."""
    completion = f"<think>x</think> \\boxed{{{pred}}}"
    assert official_reward_correctness([completion], [_in_solution(gold)]) == [want]
    assert reward_correctness(completion, gold) == want


ADVERSARIAL = [
    ("no think tag \\boxed{42}", "42"),                          # no </think>: the whole text is searched
    ("<think>\\boxed{41}</think> so \\boxed{42}", "42"),          # the box inside the thinking is ignored
    ("<think>\\boxed{42}</think> no box after", "42"),           # only a box inside the thinking: 0
    ("</think>a</think> \\boxed{7} </think> \\boxed{8}", "8"),   # the LAST </think>
    ("</think> \\boxed{1} then \\boxed{2}", "2"),                 # several boxes: the FIRST one
    ("</think> \\boxed{1} then \\boxed{2}", "1"),
    ("</think> \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}"),  # nested braces
    ("</think> \\boxed{\\frac{1}{2}", "\\frac{1}{2}"),            # unbalanced: no answer
    ("</think> \\boxed 5", "5"),                                  # \boxed without braces: no answer
    ("</think> \\boxed {5}", "5"),                                # a space before the brace: no answer
    ("</think> \\fbox{5}", "5"),
    ("</think> \\boxed{3:4}", "\\frac{3}{4}"),                    # a:b ratio
    ("</think> \\boxed{ -1.5 : 2 }", "-3/4"),
    ("</think> \\boxed{3:4}", "3:4"),
    ("</think> \\boxed{1:2:3}", "1:2:3"),                         # not a ratio of two: string compare
    ("</think> \\boxed{}", ""),                                   # empty box, empty gold
    ("</think> \\boxed{}", "0"),
    ("</think> \\boxed{  }", "  "),
    ("</think> \\boxed{ E }", "e"),                               # case and whitespace insensitive
    ("</think> \\boxed{\\text{(B) } 5}", "(b)5"),
    ("</think> \\boxed{(B) 5}", "(b)5"),                           # whitespace inside the answer
    ("</think> \\boxed{E F}", "ef"),
    ("</think> \\boxed{\\text{odd} \\text{ prime}}", "\\text{odd}\\text{prime}"),
    ("</think> \\boxed{x \\in [0, 1)}", "[0,1)"),
    ("</think> \\boxed{1,2}", "2,1"),
    ("</think> \\boxed{\\{1,2\\}}", "\\{2, 1\\}"),
    ("</think> \\boxed{10^{3}}", "1000"),
    ("</think> \\boxed{0.5}", "\\frac12"),
    ("</think> \\boxed{50\\%}", "0.5"),
    ("</think> \\boxed{x = 3}", "3"),
    ("", "3"),
    ("\\boxed{", "3"),
    ("}}}</think>{{\\boxed{{2}}}", "2"),
]


@pytest.mark.parametrize("completion, gold", ADVERSARIAL)
def test_equal_to_official_on_adversarial_strings(completion, gold):
    assert grpo_boxed_answer(completion) == extract_boxed_answer(completion)
    theirs = official_reward_correctness([completion], [_in_solution(gold)])[0]
    assert reward_correctness(completion, gold) == max(theirs, _string_equal(completion, gold))


def test_the_adversarial_strings_reach_both_verdicts():
    verdicts = [reward_correctness(c, g) for c, g in ADVERSARIAL]
    assert set(verdicts) == {0.0, 1.0} and 8 <= sum(verdicts) <= len(verdicts) - 8


def test_ratio_rewrite():
    assert ratio_as_fraction(" -1.5 : 2 ") == "\\frac{-1.5}{2}"
    assert ratio_as_fraction("1:2:3") == "1:2:3" and ratio_as_fraction("a:b") == "a:b"


# ----------------------------------------------------------------------------- gold answers


def test_gold_is_the_answer_field_else_the_solutions_last_box():
    rows = load_math_dataset(EXAMPLE_MATH).rows
    assert len(rows) == 399 and all(gold_answer(r) == r.answer for r in rows)
    without = load_math_dataset(EXAMPLE_MATH, fields=FieldNames(answer=None)).rows
    golds = [gold_answer(r) for r in without]
    # the solution's last box is the same answer as the field, for the reward, on every row
    assert all(reward_correctness(f"</think> \\boxed{{{g}}}", r.answer) == 1.0 for g, r in zip(golds, rows))
    assert gold_answer(without[0].__class__(problem="p", solution="\\boxed{1} then \\boxed{\\frac{a}{b}}",
                                            origin="x")) == "\\frac{a}{b}"


def test_a_row_without_gold_is_one_error_naming_it(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"problem": "p", "solution": "\\boxed{2}", "answer": "2"}) + "\n"
                    + json.dumps({"problem": "q", "solution": "the answer is two"}) + "\n")
    rows = load_math_dataset(str(path)).rows
    assert gold_answer(rows[0]) == "2"
    with pytest.raises(BadRowError) as err:
        gold_answer(rows[1])
    assert str(err.value) == (f"{path}:2: no gold answer for the GRPO reward: no 'answer' field and no "
                              "\\boxed{...} in the solution")
    assert "\n" not in err.value.line
