"""The official grader against a transcription of official OPSD's, and the extended grader beside it.

Transcribed from official OPSD at 7448751 (read in louieworth/OPSD), ``eval/evaluate_math.py``:
``extract_boxed_answer`` lines 15-51 and ``grade_answer`` lines 54-86 (called at line 397 on the
vLLM output text).
"""

import json

import math_verify
import pytest

from phf_megatron.eval import grading
from phf_megatron.eval.grading import grade, is_correct, is_correct_official, official_boxed_answer
from tests.helpers import GRADER_CASES


def transcribed_extract(text):
    """evaluate_math.py lines 15-51."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        return None
    depth, right = 0, None
    for i in range(idx, len(text)):
        if text[i] == "{":
            depth += 1
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                right = i
                break
    if right is None:
        return None
    boxed = text[idx:right + 1]
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[7:-1].strip()
    return None


def transcribed_grade(predicted, ground_truth):
    """evaluate_math.py lines 54-86 (math_verify called through the module, so a test can patch it)."""
    if predicted is None:
        return False
    try:
        if "$" not in predicted:
            predicted = f"${predicted}$"
        if "$" not in ground_truth:
            ground_truth = f"${ground_truth}$"
        pred = math_verify.parse(predicted, fallback_mode="no_fallback")
        gold = math_verify.parse(ground_truth, fallback_mode="no_fallback")
        return math_verify.verify(gold, pred, timeout_seconds=5)
    except Exception:
        return (predicted.replace("$", "").replace(" ", "").lower().strip()
                == ground_truth.replace("$", "").replace(" ", "").lower().strip())


def official(output, gold):
    return bool(transcribed_grade(transcribed_extract(output), gold))


def _cases():
    with open(GRADER_CASES, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_identical_verdicts_on_every_grader_case():
    rows = _cases()
    assert len(rows) == 119
    for r in rows:
        out, gold = r["model_output_text"], r["gold_answer"]
        assert official_boxed_answer(out) == transcribed_extract(out), r["id"]
        assert is_correct_official(out, gold) == official(out, gold), r["id"]


def test_extended_accepts_8_cases_the_official_rejects_never_the_reverse():
    """The official grader rejects 23 rows labelled correct (and accepts none labelled wrong); the
    extended grader, as the eval tool runs it (require_boxed), recovers 8 of them, all boxed."""
    rows = _cases()
    verdicts = [(r, grade(r["model_output_text"], r["gold_answer"], require_boxed=True)) for r in rows]
    assert not any(v["official"] and not v["extended"] for _, v in verdicts)
    recovered = [r for r, v in verdicts if v["extended"] and not v["official"]]
    assert len(recovered) == 8 and all(r["is_correct"] and "\\boxed" in r["model_output_text"] for r in recovered)
    assert sum(v["official"] != r["is_correct"] for r, v in verdicts) == 23
    assert sum(v["official"] and not r["is_correct"] for r, v in verdicts) == 0
    unboxed_too = [r for r in rows if is_correct(r["model_output_text"], r["gold_answer"])
                   and not is_correct_official(r["model_output_text"], r["gold_answer"])]
    assert len(unboxed_too) == 23                          # require_boxed=False also grades bare snippets


ADVERSARIAL = [
    # (output, gold, official answer, official verdict)
    ("so \\boxed{\\frac{1}{2}} and done", "\\frac12", "\\frac{1}{2}", True),           # nested braces
    ("\\boxed{\\left\\{1,2\\right\\}}", "\\{1,2\\}", "\\left\\{1,2\\right\\}", True),  # escaped braces inside
    ("\\fbox{5}", "5", None, False),                                                  # \fbox is no answer
    ("\\boxed{4} then \\fbox{5}", "4", "4", True),                                    # ... nor does it hide a \boxed
    ("\\boxed 7", "7", None, False),                                                  # no braces
    ("\\boxed 7 with {x} later", "7", None, False),                                   # a later brace pair is not the box
    ("the answer is 204", "204", None, False),                                        # no box
    ("\\boxed{3} first, then \\boxed{204}", "204", "204", True),                      # several boxes: the last
    ("\\boxed{204} first, then \\boxed{3}", "204", "3", False),
    ("\\boxed{}", "5", "", False),                                                    # empty box
    ("\\boxed{  }", "5", "", False),
    ("\\boxed{12", "12", None, False),                                                # unbalanced
    ("\\boxed{12}} extra", "12", "12", True),
    ("\\boxed}{12}", "12", None, False),                                              # closing brace first
    ("\\boxed{5} and a bare \\boxed", "5", None, False),                              # the last \boxed has no braces
    ("\\boxed{\\boxed{9}}", "9", "9", True),                                           # a box in a box: the inner one
    ("\\boxed{$\\frac{3}{4}$}", "0.75", "$\\frac{3}{4}$", True),                      # a $ in the answer: not wrapped
    ("\\boxed{x = 5}", "5", "x = 5", True),
    ("\\boxed{B}", "b", "B", True),                                                  # math-verify ignores case here
    ("\\boxed{B}", "C", "B", False),
    ("<think>\\boxed{1}</think>\\boxed{2}", "2", "2", True),
]


@pytest.mark.parametrize("output, gold, answer, verdict", ADVERSARIAL)
def test_adversarial_outputs(output, gold, answer, verdict):
    assert transcribed_extract(output) == answer                   # the expectations are the official code's
    assert official(output, gold) == verdict
    assert official_boxed_answer(output) == answer
    assert is_correct_official(output, gold) == verdict
    both = grade(output, gold)
    assert both["official"] == verdict and (both["extended"] or not verdict)


def test_extended_reads_what_the_official_does_not():
    for output, gold in (("\\fbox{5}", "5"), ("\\boxed 7", "7"), ("\\boxed{1}, \\boxed{2}", "1, 2")):
        assert grade(output, gold) == {"official": False, "extended": True}


@pytest.mark.parametrize("output, gold", [
    ("\\boxed{ 1/2 }", "$1/2$"), ("\\boxed{A}", "a"), ("\\boxed{B}", "a"), ("\\boxed{$x$}", "x"), ("\\fbox{x}", "x"),
])
def test_when_math_verify_raises_both_compare_normalized_strings(monkeypatch, output, gold):
    def broken(*args, **kwargs):
        raise RuntimeError("math-verify failed")
    monkeypatch.setattr(math_verify, "parse", broken)
    monkeypatch.setattr(grading, "parse", broken)
    assert is_correct_official(output, gold) == official(output, gold)
    expected = output in ("\\boxed{ 1/2 }", "\\boxed{A}", "\\boxed{$x$}")
    assert is_correct_official(output, gold) == expected
