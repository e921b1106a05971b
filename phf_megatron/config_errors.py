"""Config-error helpers shared by every config dataclass: errors name the field and its flag."""

from __future__ import annotations

from .errors import ConfigError


def fail(where: str, message: str) -> ConfigError:
    """A config error that names the field (``section.field``) and the flag that changes it."""
    return ConfigError(where, message)


def check_choice(where: str, value, choices) -> None:
    if value not in choices:
        raise fail(where, f"{value!r} is not one of {tuple(choices)}")


def check_positive(where: str, value, allow_zero: bool = False) -> None:
    if value is None or (value < 0 if allow_zero else value <= 0):
        raise fail(where, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


