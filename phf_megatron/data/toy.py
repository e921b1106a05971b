"""An embedded toy math set where privileged self-distillation visibly teaches a tiny model.

The task: "What is the last digit of 37 + 48?" → ``\\boxed{5}``. Only the operands' last
digits ``(a0, b0)`` matter, so the skill is a 100-cell table (``cells``: ``(a0, b0)`` pairs)
applied to 8,100 distinct problems (two-digit ``a``, ``b``). A correct response is one short
step of work and the boxed answer, ``7+8=15 \\boxed{5}``, with the sum always written with two
digits (``7+2=09 \\boxed{9}``) so every problem, solution and response has a fixed token layout
under the real Qwen3 tokenizer (digits are single tokens): a 2-layer model can copy by position.

The reference solution ends with that exact response, so "using a reference in context" is
copying it. The cells are split by a seed into ``seen`` and ``unseen`` halves:

1. a short supervised warm-up on problems from ``seen`` cells only, in both prompt formats
   (OPSD student prompt → response; privileged teacher prompt with the reference → response),
   teaches (a) to copy the reference — a skill that transfers to ``unseen`` cells — and (b) to
   compute the ``seen`` half of the table;
2. OPSD (+ PHF) on problems from all cells: the privileged teacher answers ``unseen`` cells by
   copying, the student cannot, and distillation carries those table entries into the plain
   student. The measurement is greedy no-reference accuracy on held-out problems of ``unseen``
   cells (none of them trained on): near chance after the warm-up, it rises only if the
   teacher's signal reaches the student correctly (a wrong sign, mask or one-token shift in
   the alignment makes it fall instead). ``seen``-cell accuracy must stay high.

``SubVocab`` maps the few Qwen3 ids this task uses (about a hundred) to a compact range, so a
tiny model's embedding and output layer stay small on CPU; ids still come from the real
tokenizer and map back exactly.

Measured with ``examples/toy_opsd_prototype.py`` (plain transformers, 2-layer hidden-64 Qwen3,
random init, 2 CPU cores, under 2.5 minutes in all): no-reference accuracy on held-out
``unseen`` problems goes 0.14 / 0.405 / 0.045 → 0.92 / 0.82 / 0.615 after 100 OPSD + PHF steps
(seeds 0 / 1 / 2); with a teacher that does not see the reference it stays at 0.14; with the
teacher logits shifted by one token it falls to 0. Details and caveats: ``docs/toy_task.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from .prompts import PromptConfig
from .rows import MathRow
from .sampler import epoch_permutation

OPERANDS = range(10, 100)
NUM_CELLS = 100
#: The toy's prompts: the defaults but the shorter teacher wording of before the official
#: 2026-03-18 rewrite (teacher prompt 99 tokens instead of 153). With the official text the
#: 300-step warm-up teaches the 2-layer model to copy the reference on only 76.5% of held-out
#: unseen-cell problems (1.00 with this one; seed 0, measured 2026-11-24), below the learning
#: test's 0.9 precondition. The wording is only text to the trainer; its official form is
#: tested token for token in tests/data/test_prompts_official.py.
TOY_PROMPT_CONFIG = PromptConfig(teacher_prompt="opsd_2026_03")


def cell_of(a: int, b: int) -> int:
    """The table cell of a problem: ``10 * (a mod 10) + (b mod 10)``."""
    return 10 * (a % 10) + b % 10


def toy_response(a: int, b: int) -> str:
    """The correct response: one step of work and the boxed answer, fixed layout."""
    a0, b0 = a % 10, b % 10
    return f"{a0}+{b0}={a0 + b0:02d} \\boxed{{{(a0 + b0) % 10}}}"


def toy_row(a: int, b: int) -> MathRow:
    """One problem with its reference solution (ending in the correct response) and answer."""
    if a not in OPERANDS or b not in OPERANDS:
        raise ValueError(f"a, b: operands must be two-digit numbers, got {a}, {b}")
    return MathRow(
        problem=f"What is the last digit of {a} + {b}?",
        solution=f"Only the last digits matter: {toy_response(a, b)}",
        answer=str((a + b) % 10),
        origin=f"toy:{a}+{b}",
    )


@dataclass(frozen=True)
class ToySplit:
    """Which cells the warm-up sees, and disjoint train / held-out problems ``(a, b)``."""

    seen_cells: frozenset[int]
    train: tuple[tuple[int, int], ...]
    heldout: tuple[tuple[int, int], ...]

    def is_seen(self, a: int, b: int) -> bool:
        return cell_of(a, b) in self.seen_cells

    def rows(self, pairs: Iterable[tuple[int, int]]) -> list[MathRow]:
        return [toy_row(a, b) for a, b in pairs]

    def warmup_pairs(self) -> list[tuple[int, int]]:
        """Training problems of ``seen`` cells (the supervised warm-up's data)."""
        return [p for p in self.train if self.is_seen(*p)]

    def heldout_by_cell(self, seen: bool) -> list[tuple[int, int]]:
        return [p for p in self.heldout if self.is_seen(*p) == seen]


def make_toy_split(seed: int = 0, num_seen_cells: int = 50, heldout_per_cell: int = 4) -> ToySplit:
    """Deterministic in ``seed``: the seen cells, and per cell ``heldout_per_cell`` held-out
    problems (the rest of the cell's 81 problems are training problems)."""
    if not 0 < num_seen_cells < NUM_CELLS:
        raise ValueError(f"num_seen_cells: must lie in (0, {NUM_CELLS}), got {num_seen_cells}")
    if not 0 < heldout_per_cell < 81:
        raise ValueError(f"heldout_per_cell: must lie in (0, 81), got {heldout_per_cell}")
    seen = frozenset(epoch_permutation(NUM_CELLS, seed, 0)[:num_seen_cells])
    by_cell: dict[int, list[tuple[int, int]]] = {c: [] for c in range(NUM_CELLS)}
    for a in OPERANDS:
        for b in OPERANDS:
            by_cell[cell_of(a, b)].append((a, b))
    train, heldout = [], []
    for cell, pairs in by_cell.items():
        order = epoch_permutation(len(pairs), seed, 1 + cell)
        heldout += [pairs[i] for i in order[:heldout_per_cell]]
        train += [pairs[i] for i in order[heldout_per_cell:]]
    shuffle = epoch_permutation(len(train), seed, NUM_CELLS + 1)
    return ToySplit(seen, tuple(train[i] for i in shuffle), tuple(sorted(heldout)))


_BOXED = re.compile(r"\\boxed\{")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces matched), stripped; None if absent."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def grade_toy(response: str, answer: str) -> bool:
    """True iff the last boxed answer of ``response`` is exactly ``answer`` (one digit)."""
    return extract_boxed(response) == str(answer).strip()


class SubVocab:
    """A compact id range ``[0, K)`` over the Qwen3 ids a task uses; exact in both directions.

    ``encode`` raises on an id outside the set (naming it), so a compact model is never fed an
    id it has no embedding for.
    """

    def __init__(self, qwen_ids: Iterable[int]):
        self.qwen_ids: list[int] = sorted(set(int(i) for i in qwen_ids))
        if not self.qwen_ids:
            raise ValueError("qwen_ids: empty")
        self._compact = {q: c for c, q in enumerate(self.qwen_ids)}

    def __len__(self) -> int:
        return len(self.qwen_ids)

    def encode(self, qwen_ids: Sequence[int]) -> list[int]:
        try:
            return [self._compact[int(q)] for q in qwen_ids]
        except KeyError as err:
            raise ValueError(f"qwen_ids: token id {err.args[0]} is not in this sub-vocabulary") from None

    def decode(self, compact_ids: Sequence[int]) -> list[int]:
        out = []
        for c in compact_ids:
            if not 0 <= int(c) < len(self.qwen_ids):
                raise ValueError(f"compact_ids: {c} outside [0, {len(self.qwen_ids)})")
            out.append(self.qwen_ids[int(c)])
        return out


def toy_sub_vocab(tokenizer, prompt_ids: Iterable[Sequence[int]] = ()) -> SubVocab:
    """Every id of the toy task: the given prompts, all responses, digits, and the chat /
    think / end-of-text special tokens."""
    texts = [toy_response(a, b) for a in range(10, 20) for b in range(10, 20)]
    texts += [str(d) for d in range(10)]
    ids = {i for t in texts for i in tokenizer(t, add_special_tokens=False)["input_ids"]}
    for special in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"):
        ids.add(tokenizer.convert_tokens_to_ids(special))
    for seq in prompt_ids:
        ids.update(int(i) for i in seq)
    return SubVocab(ids)
