"""One training row of an OPSD-format math set, and its validation.

The official OPSD collator reads two fields, ``problem`` and ``solution`` (the privileged
reference); ``answer`` is optional (used by graders and evals, never by the prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import UserError


class BadRowError(UserError):
    """A row that fails validation; the message names its origin (``file:line`` or ``name row N``)."""


@dataclass(frozen=True)
class MathRow:
    """A validated row. ``origin`` says where it came from, e.g. ``train.jsonl:17`` (1-based)."""

    problem: str
    solution: str
    answer: str | None = None
    origin: str = ""


@dataclass(frozen=True)
class FieldNames:
    """Which record keys hold the three fields (the official set uses these defaults)."""

    problem: str = "problem"
    solution: str = "solution"
    answer: str | None = "answer"

    def __post_init__(self):
        for name in ("problem", "solution", "answer"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name}: a field name must be a non-empty string, got {value!r}")
        if self.problem == self.solution:
            raise ValueError(f"solution: the field name {self.solution!r} is also the problem field")


def _required_text(record: dict, key: str) -> str:
    if key not in record:
        raise ValueError(f"missing field {key!r} (fields present: {sorted(record)})")
    value = record[key]
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"field {key!r} is empty")
    return value


def _optional_answer(record: dict, key: str | None) -> str | None:
    if key is None or record.get(key) is None:
        return None
    value = record[key]
    if isinstance(value, bool):  # bool is an int subclass: reject it explicitly
        raise ValueError(f"field {key!r} must be a string or a number, got bool")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"field {key!r} is not finite: {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value.strip() or None
    raise ValueError(f"field {key!r} must be a string or a number, got {type(value).__name__}")


def validate_row(record: Any, origin: str, fields: FieldNames = FieldNames()) -> MathRow:
    """Check one record and return it as a :class:`MathRow`.

    Raises:
        BadRowError: ``"<origin>: <reason>"`` when the record is not an object, a required
            field is missing, not a string or blank, or ``answer`` is neither text nor a number.
    """
    try:
        if not isinstance(record, dict):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        problem = _required_text(record, fields.problem)
        solution = _required_text(record, fields.solution)
        answer = _optional_answer(record, fields.answer)
    except ValueError as err:
        raise BadRowError(f"{origin}: {err}") from None
    return MathRow(problem=problem, solution=solution, answer=answer, origin=origin)
