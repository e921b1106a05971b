"""GRPO's reward: official OPSD's ``reward_correctness``, and the gold answer of a training row.

``reward_correctness`` is official OPSD's GRPO baseline reward, ``grpo_train.py`` lines 57-122 at
``louieworth/OPSD`` ``e1cf202968f55e9b4f941f09e135d83a8c807582`` (the fork's newest commit; the
same lines, unchanged, at upstream ``7448751`` and ``shx2005/OPSD`` ``50c6085``). 1.0 or 0.0, no
format reward:

1. the answer is the FIRST ``\\boxed{...}`` after the LAST ``</think>`` (the whole completion when
   there is no ``</think>``), its braces matched, stripped; ``\\boxed`` not followed directly by
   ``{``, or unbalanced braces: no answer (reward 0);
2. an answer that is exactly a ratio ``a:b`` of two (signed, decimal) numbers becomes
   ``\\frac{a}{b}``; math-verify parses the answer bare with its default extraction (no ``$``
   wrapping, unlike the eval grader) and the gold as ``\\boxed{gold}``, and ``verify(gold,
   answer)`` decides (an exception: no);
3. otherwise 1 if both, lower-cased with all whitespace removed, are equal and non-empty.

math-verify's timeouts use ``signal.alarm``, main thread only: elsewhere no timeout is passed (as
``eval.grading``). Gold answers (:func:`gold_answer`): the row's ``answer`` field, else the last
``\\boxed{...}`` of its solution. The official script passes the data set's ``Answer`` column
(upstream) or the whole ``solution`` text (the fork, which math-verify then searches for its
last boxed expression); a row with neither is an error naming the row. The gold is parsed boxed
because math-verify reads a bare LaTeX string only up to what it recognises (``25\\pi`` as 25,
``5-12i`` as 5, ``\\dfrac{3}{50}`` as nothing: 93 of the 399 rows of ``examples/data``), while
the solution's box is read whole: parsed boxed, the gold reads as the official one on every row.
Step 3 compares with the gold, not the whole solution (which the official compare never equals).
"""

from __future__ import annotations

import re

from math_verify import parse, verify

from ..data.rows import BadRowError, MathRow
from .grading import _braced, _timeout

_THINK_END = "</think>"
_BOXED = "\\boxed{"
_RATIO = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*:\s*(-?\d+(?:\.\d+)?)\s*")


def _boxed_at(text: str, idx: int) -> str | None:
    """The stripped content of the ``\\boxed{`` at ``idx``, braces matched (None if unbalanced)."""
    close = _braced(text, idx + len(_BOXED) - 1)
    return None if close is None else text[idx + len(_BOXED):close].strip()


def grpo_boxed_answer(completion: str) -> str | None:
    """The first ``\\boxed{...}`` after the last ``</think>`` (step 1 of the module docstring)."""
    think_end = completion.rfind(_THINK_END)
    search = completion[think_end + len(_THINK_END):] if think_end != -1 else completion
    idx = search.find(_BOXED)
    return None if idx == -1 else _boxed_at(search, idx)


def ratio_as_fraction(answer: str) -> str:
    """``a:b`` (the whole answer, spaces allowed) -> ``\\frac{a}{b}``; anything else unchanged."""
    m = _RATIO.fullmatch(answer)
    return rf"\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else answer


def reward_correctness(completion: str, gold: str) -> float:
    """1.0 if the completion's answer equals ``gold`` under the official GRPO rule, else 0.0."""
    pred = grpo_boxed_answer(completion)
    if pred is None:
        return 0.0
    try:
        gold_parsed = parse(_BOXED + gold + "}", parsing_timeout=_timeout())
        if verify(gold_parsed, parse(ratio_as_fraction(pred), parsing_timeout=_timeout()), timeout_seconds=_timeout()):
            return 1.0
    except Exception:
        pass
    squash = lambda s: re.sub(r"\s+", "", s).lower()  # noqa: E731
    return 1.0 if squash(pred) and squash(pred) == squash(gold) else 0.0


def gold_answer(row: MathRow) -> str:
    """The reference answer GRPO's reward compares with: ``answer``, else the solution's last ``\\boxed{...}``.

    Raises:
        BadRowError: ``"<origin>: ..."`` when the row has neither (or the last box is unbalanced or empty).
    """
    if row.answer is not None:
        return row.answer
    idx = row.solution.rfind(_BOXED)
    boxed = None if idx == -1 else _boxed_at(row.solution, idx)
    if not boxed:
        raise BadRowError(f"{row.origin}: no gold answer for the GRPO reward: no 'answer' field and no "
                          f"\\boxed{{...}} in the solution")
    return boxed
