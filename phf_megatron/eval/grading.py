"""Is a model's final answer right? Two graders: the official OPSD one, and ours beside it.

``official`` (:func:`is_correct_official`) is official OPSD's ``eval/evaluate_math.py`` at
7448751 (lines 15-86), the grader behind the paper's numbers:

1. the answer is the content of the last ``\\boxed{...}``: the last ``\\boxed`` of the output,
   its braces matched from there, kept only if ``\\boxed`` is followed directly by ``{``
   (``\\fbox{5}`` and ``\\boxed 5`` are no answer), stripped; none: wrong;
2. prediction and gold are wrapped in ``$...$`` unless they hold a ``$``, parsed by math-verify
   with ``fallback_mode="no_fallback"``, and ``verify(gold, pred, timeout_seconds=5)`` decides;
3. if math-verify raises, the two wrapped strings are compared with ``$`` and spaces removed,
   lower-cased.

The official environment pins math-verify 0.8.0; we run what is installed (0.9.0 in
``requirements/cpu-ci.txt``; the eval summary records it). math-verify's timeouts use
``signal.alarm``, which works only in the main thread: elsewhere we pass no timeout (a
pathological expression can then take long). The official code, run in a thread, would raise
there and fall back to the string compare for every answer; we do not reproduce that accident.

``extended`` (:func:`is_correct`) accepts what the official grader accepts and, when it says
no, tries in order:

1. **The official check on a wider extraction**: the last ``\\boxed{...}`` or ``\\fbox{...}`` or
   ``\\boxed x``, wrapped in ``$...$``, parsed and verified as in the official step 2.
2. **math-verify on the answer line**: math-verify's own extraction (boxed first, then the
   last LaTeX / plain expression) on the output from the line holding the last ``\\boxed``,
   against the gold parsed the same way. This catches answers split over several boxes
   (``\\boxed{1}, \\boxed{2}``), a gold that carries its own ``\\boxed``/``$``, and sets.
3. **Normalized string compare**: both sides lower-cased with ``$``, spaces, ``\\left``/
   ``\\right``, ``\\text{}``-style wrappers, ``\\dfrac``, thousands separators, degree and
   percent signs, ``\\$`` and trailing unit words removed; multiple-choice answers reduced to
   their letter; comma lists compared as sets when both sides are braced sets.

An output with no ``\\boxed`` is wrong under the official rule. With ``require_boxed=False``
(the default, as in math-verify and lighteval) the extended steps 2-3 run on the whole output
instead, which grades answer snippets such as ``$E$``; ``tools/eval_avg_at_k.py`` passes
``require_boxed=True`` unless ``--require_boxed=false`` is given.
"""

from __future__ import annotations

import re
import threading

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

#: Seconds math-verify may spend on one parse or verify (official OPSD: 5).
TIMEOUT_S = 5
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NATIVE_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _braced(text: str, start: int) -> int | None:
    """Counting braces from ``start`` on, the index of the first ``}`` that brings the depth back
    to 0: the ``}`` matching the ``{`` at ``start`` (None if unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed_span(text: str) -> tuple[int, str] | None:
    """(start index, content) of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x``."""
    starts = [(text.rfind(cmd), cmd) for cmd in _BOX_COMMANDS]
    idx, cmd = max(starts)
    if idx < 0:
        return None
    after = idx + len(cmd)
    if after < len(text) and text[after] == "{":
        close = _braced(text, after)
        return None if close is None else (idx, text[after + 1:close].strip())
    m = re.match(r"\s+([^\s$]+)", text[after:])            # "\boxed 5" (no braces)
    return (idx, m.group(1)) if m else None


def last_boxed(text: str) -> str | None:
    """Content of the last brace-matched ``\\boxed{}`` (None if there is none)."""
    span = last_boxed_span(text)
    return None if span is None else span[1]


def official_boxed_answer(text: str) -> str | None:
    """The official answer extraction: the content of the last ``\\boxed{...}`` (module docstring, step 1)."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        return None
    close = _braced(text, idx)          # the official code counts braces from the backslash on
    if close is None or not text.startswith("\\boxed{", idx):
        return None
    return text[idx + len("\\boxed{"):close].strip()


def _dollar_wrapped(answer: str) -> str:
    return answer if "$" in answer else f"${answer}$"


def _no_fallback_verify(pred: str, gold: str) -> bool:
    """math-verify on ``$``-wrapped answers, no fallback (official step 2); raises what it raises."""
    return bool(verify(parse(_dollar_wrapped(gold), fallback_mode="no_fallback", parsing_timeout=_timeout()),
                       parse(_dollar_wrapped(pred), fallback_mode="no_fallback", parsing_timeout=_timeout()),
                       timeout_seconds=_timeout()))


def official_answer_matches(pred: str | None, gold: str) -> bool:
    """The official verdict on an extracted answer (steps 2-3; None: no answer, wrong)."""
    if pred is None:
        return False
    try:
        return _no_fallback_verify(pred, gold)
    except Exception:
        squash = lambda s: _dollar_wrapped(s).replace("$", "").replace(" ", "").lower().strip()  # noqa: E731
        return squash(pred) == squash(gold)


def is_correct_official(model_output: str, gold: str) -> bool:
    """The official OPSD grader (``eval/evaluate_math.py`` at 7448751; module docstring)."""
    _check_inputs(model_output, gold)
    return official_answer_matches(official_boxed_answer(model_output), gold)


def _official_verify(pred: str, gold: str) -> bool:
    try:
        return _no_fallback_verify(pred, gold)
    except Exception:
        return False


def _native_verify(output_part: str, gold: str) -> bool:
    gold_text = gold if ("$" in gold or "\\boxed" in gold or "\\(" in gold) else f"${gold}$"
    try:
        g = parse(gold_text, list(_NATIVE_CONFIG), parsing_timeout=_timeout())
        p = parse(output_part, list(_NATIVE_CONFIG), parsing_timeout=_timeout())
        return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=_timeout()))
    except Exception:
        return False


_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_UNIT_TAIL = re.compile(r"^(-?[\d.]+(?:/[\d.]+)?)\s*([a-z][a-z .]*)$")
_CHOICE = re.compile(r"^\(?([a-e])\)?(?:[.:)]|$)")


def normalize_answer(text: str) -> str:
    """A canonical string for the final-resort comparison (see the module docstring)."""
    s = text.strip()
    span = last_boxed_span(s)
    if span is not None and span[0] == 0:
        s = span[1]
    for _ in range(3):                                               # nested wrappers
        s = _WRAPPERS.sub(r"\1", s)
    for a, b in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
                 ("{,}", ""), ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\ ", ""), ("~", ""),
                 ("\\$", ""), ("$", ""), ("\\%", ""), ("%", ""), ("^\\circ", ""), ("^{\\circ}", ""),
                 ("°", ""), ("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", ""), ("\\displaystyle", "")):
        s = s.replace(a, b)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)                 # 12,345 -> 12345
    s = s.lower().strip().rstrip(".").strip()
    m = _UNIT_TAIL.match(s)
    if m:                                                           # "0.06 yuan" -> "0.06"
        s = m.group(1)
    s = re.sub(r"\s+", "", s)
    m = _CHOICE.match(s)
    if m and len(s) <= 4:                                           # "(b)", "b)", "b." -> "b"
        s = m.group(1)
    return s


def _strings_match(pred: str, gold: str) -> bool:
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p or not g:
        return False
    if p == g:
        return True
    set_p, set_g = re.fullmatch(r"\\\{(.*)\\\}", p), re.fullmatch(r"\\\{(.*)\\\}", g)
    if set_p and set_g:
        return sorted(set_p.group(1).split(",")) == sorted(set_g.group(1).split(","))
    return False


def _check_inputs(model_output: str, gold: str) -> None:
    if not isinstance(model_output, str) or not isinstance(gold, str):
        raise TypeError("is_correct: model_output and gold must be str")
    if not gold.strip():
        raise ValueError("gold: empty reference answer")


def is_correct(model_output: str, gold: str, *, require_boxed: bool = False) -> bool:
    """The extended grader: the official verdict, or else our fallbacks (module docstring).

    Args:
        model_output: the model's full completion (thinking included or not).
        gold: the reference answer, LaTeX or plain (``204``, ``\\frac{1}{2}``, ``$\\{1,2\\}$``).
        require_boxed: True = an output without ``\\boxed`` is wrong (official OPSD rule).
    """
    return is_correct_official(model_output, gold) or _extended_fallbacks(model_output, gold, require_boxed)


def _extended_fallbacks(model_output: str, gold: str, require_boxed: bool) -> bool:
    """The extended grader's steps after the official check (module docstring)."""
    span = last_boxed_span(model_output)
    if span is None:
        if require_boxed:
            return False
        return _native_verify(model_output, gold) or _strings_match(model_output, gold)
    start, pred = span
    if _official_verify(pred, gold):
        return True
    line_start = model_output.rfind("\n", 0, start) + 1
    return _native_verify(model_output[line_start:], gold) or _strings_match(pred, gold)


def grade(model_output: str, gold: str, *, require_boxed: bool = True) -> dict[str, bool]:
    """Both verdicts, ``{"official": ..., "extended": ...}`` (``require_boxed``: the extended grader's)."""
    official = is_correct_official(model_output, gold)
    return {"official": official,
            "extended": official or _extended_fallbacks(model_output, gold, require_boxed)}
